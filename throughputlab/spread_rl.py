"""decide's RL step model against published runs: predicted/published step time (a step rate's measured/
predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are
published, read by throughputlab.spread.rl_step_spread. Written by
`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in
benchmarks/data/rl_runs/."""

SOURCE = "benchmarks/data/rl_runs, 42 runs with published response lengths, throughputlab 0.1.0"

RL_STEPS: dict[tuple[str, str], list[float]] = {
    ('nemo-rl', 'colocated'): [0.4359, 0.4993, 0.5343, 0.5624, 0.5842, 0.6061, 0.6204, 0.6336, 0.6568, 0.6973, 0.7574, 0.7685, 0.769, 0.7911, 0.8021, 0.8021, 0.8108, 0.863, 0.8831],
    ('nemo-rl', 'split'): [0.4854, 0.5784, 0.6108, 0.7149, 0.8353, 0.8385, 0.8652, 0.9273, 0.9475, 0.96, 0.9777, 1.0062, 1.0099, 1.098],
    ('verl', 'colocated'): [0.4442, 0.5477, 0.5803, 0.6592, 0.8424, 0.8477, 1.0111, 1.0513, 1.1336],
}
