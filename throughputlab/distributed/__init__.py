"""Training on several ranks under PyTorch's launcher (``torch.distributed.run``) with FSDP2.

- :mod:`.launch`: :func:`~throughputlab.distributed.launch.run_training_ranks`, the one call that
  starts the ranks, reports progress and cleans up;
- :mod:`.train_worker`: what each rank runs (the project's sweep runner on an FSDP2 backend);
- :mod:`.trainer`: one agreed FSDP2 micro-step; :mod:`.fsdp`: sharding and the bytes a rank holds;
- :mod:`.comm`: exposed communication time from a profiler trace; :mod:`.ranks`: process group
  setup, agreement collectives, clean exit;
- :mod:`throughputlab.records.distributed`: the settings and per-point records (no torch import);
- :mod:`.parity`: the check that N ranks take the same step as one process.

Importing this package imports no torch.
"""

from throughputlab.distributed.launch import RanksResult, run_training_ranks

__all__ = ["RanksResult", "run_training_ranks"]
