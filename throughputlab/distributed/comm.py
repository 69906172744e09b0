"""Exposed communication time of a training micro-step, from a ``torch.profiler`` trace.

A few steps of a point run under the profiler (after a warm step); the trace gives, per rank:

- **communication**: on CUDA the NCCL kernels; on CPU the gloo collectives, which run on the
  process group's own threads;
- **compute**: on CUDA every other kernel; on CPU the innermost aten operators on the training
  thread (collective calls and waits excluded).

``comm_s`` is the length of the union of the communication spans per step, and
``exposed_comm_s`` the part of it that no compute span covers: the time the step spends only
communicating, the quantity Holistic Trace Analysis calls non-overlapped communication. CPU
time on the training thread outside aten operators (Python dispatch, FSDP's bookkeeping) is
not counted as compute, so on CPU this is an upper bound of what the collectives cost.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Callable, Iterable

Interval = tuple[float, float]

PHASE_PREFIX = "throughputlab::"  # record_function regions around the timed phases of a micro-step

_COMM_OP_PREFIXES = ("gloo:", "nccl:", "c10d::", "record_param_comms")
_CUDA_NON_COMPUTE = ("gpu_memcpy", "gpu_memset")


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping union of ``intervals`` (empty ones dropped)."""
    out: list[list[float]] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in merge(intervals))


def uncovered(spans: Iterable[Interval], cover: Iterable[Interval]) -> float:
    """Length of the union of ``spans`` outside the union of ``cover``."""
    s, c = merge(spans), merge(cover)
    total = 0.0
    j = 0
    for a, b in s:
        covered = 0.0
        while j < len(c) and c[j][1] <= a:
            j += 1
        k = j
        while k < len(c) and c[k][0] < b:
            covered += min(b, c[k][1]) - max(a, c[k][0])
            k += 1
        total += (b - a) - covered
    return total


def clip(spans: Iterable[Interval], windows: Iterable[Interval]) -> list[Interval]:
    """The parts of ``spans`` inside ``windows``."""
    w = merge(windows)
    out = []
    for a, b in merge(spans):
        for c, d in w:
            lo, hi = max(a, c), min(b, d)
            if hi > lo:
                out.append((lo, hi))
    return out


def innermost(events: list[dict]) -> list[dict]:
    """The events of one thread that contain no other event of that thread."""
    evs = sorted(events, key=lambda e: (e["ts"], -e["dur"]))
    leaves = []
    for i, e in enumerate(evs):
        end = e["ts"] + e["dur"]
        nxt = evs[i + 1] if i + 1 < len(evs) else None
        if nxt is None or nxt["ts"] >= end:
            leaves.append(e)
    return leaves


def _span(e: dict) -> Interval:
    return (float(e["ts"]) * 1e-6, float(e["ts"] + e["dur"]) * 1e-6)  # chrome traces are in microseconds


def split_trace(trace: dict, cuda: bool) -> tuple[list[Interval], list[Interval]]:
    """(communication spans, compute spans) in seconds from a chrome trace ``torch.profiler`` wrote,
    within the timed phases of the steps (the ``PHASE_PREFIX`` regions of the training thread):
    the ranks' own agreement collectives between phases are not the model's communication."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e and "ts" in e]
    phases = [e for e in events if e["name"].startswith(PHASE_PREFIX)]
    main_tid = phases[0]["tid"] if phases else None
    windows = [_span(e) for e in phases]
    if cuda:
        kernels = [e for e in events if e.get("cat") == "kernel"]
        comm = [_span(e) for e in kernels if "nccl" in e["name"].lower()]
        compute = [_span(e) for e in kernels if "nccl" not in e["name"].lower()]
    else:
        comm = [_span(e) for e in events if e["tid"] != main_tid and e["name"].startswith(("gloo:", "nccl:"))]
        main_ops = [e for e in events if e["tid"] == main_tid and e.get("cat") == "cpu_op"]
        compute = [_span(e) for e in innermost(main_ops)
                   if not e["name"].startswith(_COMM_OP_PREFIXES) and "wait" not in e["name"].lower()]
    return clip(comm, windows), clip(compute, windows)


def method(cuda: bool, steps: int) -> str:
    what = ("NCCL kernels against the other kernels" if cuda else
            "gloo collectives on the process group's threads against the innermost aten operators on the "
            "training thread")
    return (f"torch.profiler over {steps} micro-step(s) after a warm step: union of the collectives' spans, "
            f"and the part no compute covers ({what})")


def profile_steps(step: Callable[[], object], steps: int, cuda: bool) -> tuple[float, float]:
    """Run ``step`` 1 + ``steps`` times under the profiler (the first as its warm-up); returns
    (communication s, exposed communication s) per step."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fd, path = tempfile.mkstemp(prefix="throughputlab-trace-", suffix=".json")
    os.close(fd)
    try:
        with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
                     on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
            for _ in range(1 + steps):
                step()
                prof.step()
        with open(path) as f:
            trace = json.load(f)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    comm, compute = split_trace(trace, cuda)
    return length(comm) / steps, uncovered(comm, compute) / steps
