"""decide's RL step model against published runs: predicted/published step time (a step rate's measured/
predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are
published, read by throughputlab.spread.rl_step_spread. Written by
`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in
benchmarks/data/rl_runs/."""

SOURCE = "benchmarks/data/rl_runs, 41 runs with published response lengths, throughputlab 0.1.0"

RL_STEPS: dict[tuple[str, str], list[float]] = {
    ('nemo-rl', 'colocated'): [0.431, 0.498, 0.532, 0.5613, 0.5803, 0.604, 0.6184, 0.6324, 0.6541, 0.6957, 0.7526, 0.7657, 0.7873, 0.7985, 0.7995, 0.8077, 0.86, 0.8761],
    ('nemo-rl', 'split'): [0.4854, 0.5756, 0.6075, 0.7048, 0.8353, 0.8362, 0.8652, 0.9249, 0.9475, 0.96, 0.9735, 1.0062, 1.0099, 1.0928],
    ('verl', 'colocated'): [0.4442, 0.5455, 0.5786, 0.6592, 0.8424, 0.8477, 1.0094, 1.0513, 1.1332],
}
