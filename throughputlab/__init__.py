"""throughputlab: RL rollout and training throughput, measured, modelled and decided."""

__version__ = "0.1.0"
