"""decide's RL step model against published runs: predicted/published step time (a step rate's measured/
predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are
published, read by throughputlab.spread.rl_step_spread. Written by
`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in
benchmarks/data/rl_runs/."""

SOURCE = "benchmarks/data/rl_runs, 41 runs with published response lengths, throughputlab 0.1.0"

RL_STEPS: dict[tuple[str, str], list[float]] = {
    ('nemo-rl', 'colocated'): [0.4299, 0.4782, 0.526, 0.5535, 0.57, 0.604, 0.6126, 0.6254, 0.6335, 0.6882, 0.7368, 0.7438, 0.7873, 0.7897, 0.7995, 0.8077, 0.8546, 0.8711],
    ('nemo-rl', 'split'): [0.4854, 0.5629, 0.5822, 0.6945, 0.8255, 0.8353, 0.8652, 0.9123, 0.9475, 0.96, 0.9617, 1.0062, 1.0099, 1.0596],
    ('verl', 'colocated'): [0.4442, 0.5455, 0.5786, 0.6592, 0.8424, 0.8477, 1.0094, 1.0513, 1.1332],
}
