"""decide's RL step model against published runs: predicted/published step time (a step rate's measured/
predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are
published, read by throughputlab.spread.rl_step_spread. Written by
`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in
benchmarks/data/rl_runs/."""

SOURCE = "benchmarks/data/rl_runs, 41 runs with published response lengths, throughputlab 0.1.0"

RL_STEPS: dict[tuple[str, str], list[float]] = {
    ('nemo-rl', 'colocated'): [0.4428, 0.46, 0.5085, 0.531, 0.596, 0.5996, 0.604, 0.6054, 0.6146, 0.7223, 0.7238, 0.7605, 0.8146, 0.818, 0.83, 0.8945, 0.8984, 0.9222],
    ('nemo-rl', 'split'): [0.4854, 0.5571, 0.559, 0.6898, 0.7946, 0.8353, 0.8652, 0.8759, 0.9275, 0.9475, 0.96, 1.0062, 1.0099, 1.0292],
    ('verl', 'colocated'): [0.5447, 0.5456, 0.5787, 0.6592, 0.8424, 0.8477, 1.0094, 1.0513, 1.1333],
}
