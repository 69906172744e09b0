"""decide's RL step model against published runs: predicted/published step time (a step rate's measured/
predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are
published, read by throughputlab.spread.rl_step_spread. Written by
`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in
benchmarks/data/rl_runs/."""

SOURCE = "benchmarks/data/rl_runs, 41 runs with published response lengths, throughputlab 0.1.0"

RL_STEPS: dict[tuple[str, str], list[float]] = {
    ('nemo-rl', 'colocated'): [0.4293, 0.46, 0.5219, 0.5483, 0.5652, 0.5941, 0.6088, 0.6146, 0.6208, 0.6848, 0.7223, 0.7238, 0.7857, 0.7873, 0.7995, 0.8077, 0.8479, 0.8649],
    ('nemo-rl', 'split'): [0.4854, 0.5571, 0.559, 0.6898, 0.8183, 0.8353, 0.8652, 0.9039, 0.9475, 0.9537, 0.96, 1.0062, 1.0099, 1.0292],
    ('verl', 'colocated'): [0.4442, 0.5456, 0.5787, 0.6592, 0.8424, 0.8477, 1.0094, 1.0513, 1.1333],
}
