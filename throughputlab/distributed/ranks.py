"""One rank's life under ``torch.distributed.run``: joining the process group, the few
collectives the ranks use to agree, and leaving cleanly.

Leaving: a plain ``destroy_process_group()`` followed by interpreter shutdown can abort in C++
static destructors ("terminate called without an active exception") on some machines. A rank
therefore meets the others at a barrier, destroys the group, flushes its streams and logs, and
ends with ``os._exit``, which skips those destructors; its exit code is then always its own.
"""

from __future__ import annotations

import ctypes
import datetime
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from throughputlab.errors import UserError

log = logging.getLogger(__name__)


class AgreedUserError(UserError):
    """A mistake every rank raises together (rank 0 found it and shared it): they leave together."""

_PR_SET_PDEATHSIG = 1


class CollectiveFailed(BaseException):
    """A collective of the ranks' own failed: a peer is gone or the group timed out. Not an
    ``Exception``: the sweep must not record it as one failed point and carry on with a group
    that no longer works; the rank stops instead."""


def _collective(fn):
    def wrapped(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (RuntimeError, ValueError) as e:  # DistError and gloo/NCCL errors are RuntimeErrors
            raise CollectiveFailed(f"{fn.__name__}: {_gist(e)}") from e
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


def _gist(e: BaseException) -> str:
    """The first sentence of a backend error, without gloo's source location."""
    text = (str(e).strip().splitlines() or [repr(e)])[0].strip("'\" ")
    text = re.sub(r"^\[[^\]]*\]\s*", "", text)
    return text.split(". ")[0][:200]


@dataclass
class RankContext:
    rank: int
    world_size: int
    local_rank: int
    nodes: int
    device: str  # "cpu" or "cuda:<local rank>"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def comm_device(self) -> str:
        """Where the small agreement tensors live: the device for NCCL, the CPU for gloo."""
        return self.device


def die_with_parent() -> None:
    """Linux: this process gets SIGKILL when the launcher's agent that started it dies, so a
    killed ``torch.distributed.run`` never leaves ranks behind."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        log.debug("prctl(PR_SET_PDEATHSIG) unavailable")


def _sigterm_to_exit(signum, frame) -> None:
    # SystemExit is no Exception: the sweep does not record it as a failed point and goes on
    raise SystemExit(128 + signum)


def init_ranks(device: str, *, threads: Optional[int], timeout_s: float) -> RankContext:
    """Join the process group torchrun describes in the environment: gloo on CPU, NCCL on CUDA.

    On CPU each rank gets ``threads`` OpenMP threads (default 1): ranks sharing cores with
    more threads slow each other 5-10x.
    """
    die_with_parent()
    signal.signal(signal.SIGTERM, _sigterm_to_exit)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.startswith("cuda"):
        if threads is not None:
            torch.set_num_threads(threads)
        dev = f"cuda:{local_rank}"
        torch.cuda.set_device(dev)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device(dev))
    else:
        torch.set_num_threads(threads or 1)
        dev = "cpu"
        dist.init_process_group("gloo", timeout=timeout)
    nodes = max(1, world // max(local_world, 1))
    return RankContext(rank=dist.get_rank(), world_size=dist.get_world_size(), local_rank=local_rank, nodes=nodes,
                       device=dev)


@_collective
def agree_max(ctx: RankContext, code: int) -> int:
    """The largest ``code`` over the ranks (0: all well)."""
    t = torch.tensor([code], dtype=torch.int64, device=ctx.comm_device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


@_collective
def gather_floats(ctx: RankContext, values: list[float]) -> list[list[float]]:
    """Every rank's ``values`` (same length on each), in rank order."""
    mine = torch.tensor(values, dtype=torch.float64, device=ctx.comm_device)
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [t.tolist() for t in out]


@_collective
def gather_objects(ctx: RankContext, obj: Any) -> list[Any]:
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


@_collective
def broadcast_object(ctx: RankContext, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    box = [obj if ctx.is_main else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def leave(code: int, *, clean: bool) -> None:
    """End this rank with ``code``. ``clean``: the others are alive and leaving too (barrier,
    destroy the group); otherwise go without touching the group, which may be broken."""
    if clean and dist.is_initialized():
        try:
            dist.barrier()
            dist.destroy_process_group()
        except Exception as e:  # a peer gone at the very end: the rank's own result stands
            log.warning("leaving the process group: %s", e)
            code = code or 1
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def rank_main(argv: Optional[list[str]], worker: str, body: Callable[[Any], None]) -> None:
    """The entry point of one rank of ``worker``: read the job file named in ``argv``
    (a :class:`~throughputlab.records.distributed.RankJob`), run ``body(job)``, and end the process
    with a code saying how it went (0: done, 2: a user mistake, 130: interrupted, 1: anything else),
    leaving the process group cleanly only when the other ranks are leaving too."""
    from throughputlab.records.distributed import RankJob

    argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.INFO,
                        format=f"[rank {os.environ.get('RANK', '?')}] %(levelname)s %(name)s: %(message)s")
    code, clean = 0, True
    try:
        if len(argv) != 1:
            raise UserError(f"usage: python -m torch.distributed.run ... -m {worker} JOB.json")
        body(RankJob.model_validate_json(Path(argv[0]).read_text()))
    except AgreedUserError as e:  # the same on every rank: leave together
        log.error("%s", e)
        code = 2
    except UserError as e:  # this rank's alone: the others may be inside a collective
        log.error("%s", e)
        code, clean = 2, not dist.is_initialized()
    except CollectiveFailed as e:
        log.error("the ranks can no longer communicate (%s): stopping", e)
        code, clean = 1, False
    except SystemExit as e:  # SIGTERM from the launcher's agent
        code, clean = (e.code if isinstance(e.code, int) and e.code else 1), False
    except KeyboardInterrupt:
        code, clean = 130, False
    except BaseException:
        log.exception("rank failed")
        code, clean = 1, False
    leave(code, clean=clean)
