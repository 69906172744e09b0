"""The decision calculator: does a larger RL batch reach the target reward sooner?

``rollout`` simulates the drain of one synchronous rollout under continuous batching,
``steptime`` composes a whole RL step, ``curves`` turns learning curves (or a parametric
form) into samples-to-target, ``calculator`` builds the table and the recommendation,
``report`` draws it, ``cli`` is the `throughputlab decide` command. No torch, no vllm.
"""
