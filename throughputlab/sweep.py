"""The sweep runner: measurement hygiene (the spec's :class:`~throughputlab.spec.Measurement`), written once.

Sweeps are generators: the runner sends each finished point back and the sweep decides the
next value, so "double until tokens/s stops growing", "stop after an OOM" and "bisect to
the largest micro-batch that fits" live in one place (:func:`plan`). The runner warms up,
repeats, re-measures noisy points, classifies failures (`oom`, `error`), attaches telemetry
and host profiles, and saves the profile after every point.

With ``rounds > 1`` the sweep passes over its points several times and each visit adds
``repeats`` samples: a slow spell of the machine (a noisy neighbour, a clock change) then
lands on one sample of many points instead of on every sample of a few, and the medians a
point reports shrug it off. While a point is still noisy after the last round, the sweep runs
another whole round (at most ``max_remeasure``), so every point keeps the same exposure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Generator, Iterable, Optional, Union

from throughputlab.errors import first_line, stop_requested
from throughputlab.records.layout import ParallelLayout
from throughputlab.records.profile import GenPoint, Profile, TrainPoint
from throughputlab.records.settings import Measurement

log = logging.getLogger(__name__)

Point = Union[GenPoint, TrainPoint]
Plan = Generator[int, Optional[Point], None]


# ---------------------------------------------------------------- progress hook


class Hooks:
    """Progress callbacks; the library never prints. The CLI passes a rich progress bar."""

    def sweep_started(self, kind: str, total: Optional[int]) -> None: ...

    def point_started(self, kind: str, x: int) -> None: ...

    def point_finished(self, point: Point, resumed: bool = False) -> None: ...

    def sweep_finished(self, kind: str) -> None: ...


# ---------------------------------------------------------------- what to measure next


def plan(values: Optional[Iterable[int]], *, auto_cap: int = 1024, min_gain: float = 0.05,
         bisect_steps: int = 3) -> Plan:
    """Yield the x values (concurrency or micro-batch) to measure; receives each finished point.

    ``values`` is an explicit increasing list, or None for ``auto``: 1, 2, 4, ... until
    tokens/s grows by less than ``min_gain``, a point fails, or ``auto_cap``. After the
    first OOM, larger values are skipped and the gap between the largest value that fit and
    the smallest that did not is bisected (``bisect_steps`` at most) to find the largest
    that fits.
    """
    explicit = sorted(set(values)) if values is not None else None
    best_tps: Optional[float] = None
    largest_ok = 0
    i = 0
    x = explicit[0] if explicit else 1
    while True:
        point = yield x
        if point is None:
            return
        if point.status == "oom":
            yield from _bisect(largest_ok, x, bisect_steps)
            return
        if point.status == "ok":
            largest_ok = max(largest_ok, x)
        if explicit is not None:
            i += 1
            if i >= len(explicit):
                return
            x = explicit[i]
            continue
        # auto: stop when throughput stops growing, or at the cap
        tps = point.tokens_per_s if point.status == "ok" else None
        if tps is None or (best_tps is not None and tps < best_tps * (1 + min_gain)):
            return
        if x * 2 > auto_cap:
            log.warning("the auto sweep stopped at %d, the cap (--auto-cap %d), with tokens/s still growing: "
                        "raise --auto-cap to measure further", x, auto_cap)
            return
        best_tps = tps
        x *= 2


def _bisect(lo_ok: int, hi_oom: int, steps: int) -> Plan:
    for _ in range(steps):
        if hi_oom - lo_ok <= 1:
            return
        mid = (lo_ok + hi_oom) // 2
        point = yield mid
        if point is None:
            return
        if point.status == "ok":
            lo_ok = mid
        elif point.status == "oom":
            hi_oom = mid
        else:
            return


def largest_fitting(points: Iterable[Point]) -> Optional[int]:
    """Largest x measured `ok` below the smallest x that ran out of memory (None: no OOM seen)."""
    pts = list(points)
    ooms = [_x(p) for p in pts if p.status == "oom"]
    if not ooms:
        return None
    limit = min(ooms)
    oks = [_x(p) for p in pts if p.status == "ok" and _x(p) < limit]
    return max(oks) if oks else 0


def _x(p: Point) -> int:
    return p.concurrency if isinstance(p, GenPoint) else p.micro_batch


# ---------------------------------------------------------------- one point


@dataclass
class Extras:
    """Optional per-point instruments (issue: telemetry and py-spy)."""

    telemetry: Optional[Callable[[Callable[[], list[int]]], object]] = None  # pids -> sampler with start/stop
    pyspy: Optional[object] = None  # recorder with start(label, pids) / stop()
    pyspy_points: set[int] = field(default_factory=set)  # x values to profile; empty = all


def measure_point(make: Callable[[], Point], run_once: Callable[[], object], backend, hygiene: Measurement,
                  x: int, kind: str, extras: Optional[Extras] = None) -> Point:
    """Warm up, repeat, re-measure while noisy; failures become a point with a status."""
    point = make()
    extras = extras or Extras()
    sampler = recorder = None
    try:
        backend.reset_peak_memory()
        for _ in range(hygiene.warmup):
            run_once()
        point.warmup_runs = hygiene.warmup
        if extras.telemetry is not None:
            started = extras.telemetry(backend.pids)
            started.start()
            sampler = started  # only a started sampler is stopped (Ctrl-C may land inside start)
        if extras.pyspy is not None and (not extras.pyspy_points or x in extras.pyspy_points):
            recorder = extras.pyspy
            recorder.start(f"{kind}-{x}", backend.pids())
        for _ in range(hygiene.repeats):
            point.samples.append(run_once())
        # with several rounds, noisy points get their extra samples after the last round instead
        while hygiene.rounds == 1 and (point.cv or 0.0) > hygiene.max_cv and point.remeasured < hygiene.max_remeasure:
            point.remeasured += 1
            log.info("%s %d: spread %.1f%% above %.0f%%, measuring again", kind, x, 100 * point.cv,
                     100 * hygiene.max_cv)
            for _ in range(hygiene.repeats):
                point.samples.append(run_once())
        point.status = "ok"
    except KeyboardInterrupt:
        raise
    except Exception as e:  # failures are data: an OOM at batch 256 is a finding
        if stop_requested():  # the engine's own error for the Ctrl-C that stopped its processes too
            raise KeyboardInterrupt from e
        point.samples = []
        point.status = "oom" if backend.is_oom(e) else "error"
        point.error = f"{type(e).__name__}: {first_line(e)}"
        if point.status == "error":
            log.warning("%s %d failed: %s", kind, x, point.error, exc_info=log.isEnabledFor(logging.DEBUG))
        release = getattr(backend, "release", None)
        if release:
            release()
    finally:  # an instrument that fails to stop must not hide why the point ended (Ctrl-C, OOM)
        if sampler is not None:
            try:
                point.telemetry = sampler.stop()
            except Exception as e:
                log.warning("telemetry of %s %d lost: %s", kind, x, first_line(e))
        if recorder is not None:
            try:
                point.host_profile = recorder.stop()
            except Exception as e:
                log.warning("py-spy recording of %s %d lost: %s", kind, x, first_line(e))
    point.peak_mem_bytes = backend.peak_memory_bytes()
    return point


def revisit_point(point: Point, run_once: Callable[[], object], backend, hygiene: Measurement, x: int, kind: str,
                  extras: Optional[Extras] = None, *, remeasure: bool = False, warmup: int = 0) -> None:
    """A later visit of a measured point: ``warmup`` untimed runs, then ``hygiene.repeats`` more
    samples; telemetry merged into the point's. The peak memory stays the first visit's: a later
    visit starts with whatever larger points left in the allocator (the process RSS on CPU). A
    failure keeps every sample already taken and is noted in ``point.error``."""
    extras = extras or Extras()
    sampler = None
    try:
        for _ in range(warmup):
            run_once()
        point.warmup_runs += warmup
        if extras.telemetry is not None:
            started = extras.telemetry(backend.pids)
            started.start()
            sampler = started
        for _ in range(hygiene.repeats):
            point.samples.append(run_once())
        if remeasure:
            point.remeasured += 1
        else:
            point.rounds += 1
    except KeyboardInterrupt:
        raise
    except Exception as e:
        if stop_requested():
            raise KeyboardInterrupt from e
        point.error = f"visit {point.rounds + 1} failed, earlier samples kept: {type(e).__name__}: {first_line(e)}"
        log.warning("%s %d: %s", kind, x, point.error, exc_info=log.isEnabledFor(logging.DEBUG))
        release = getattr(backend, "release", None)
        if release:
            release()
    finally:
        if sampler is not None:
            try:
                summary = sampler.stop()
                point.telemetry = point.telemetry.combined(summary) if point.telemetry and summary else summary
            except Exception as e:
                log.warning("telemetry of %s %d (later visit) lost: %s", kind, x, first_line(e))


# ---------------------------------------------------------------- sweeps


def run_generation(profile: Profile, path: Path, backend, values: Optional[list[int]], *, prompt_len: int,
                   output_len: int, hygiene: Measurement, hooks: Hooks = Hooks(),
                   extras: Optional[Extras] = None, layout: Optional[ParallelLayout] = None) -> None:
    """The generation sweep; every point it measures records ``layout`` (the engine's devices)."""
    name = backend.name
    _sweep(profile, path, "generation", values, hooks, hygiene,
           key=lambda c: ("generation", name, c, prompt_len, output_len),
           measure=lambda c: measure_point(
               lambda: GenPoint(backend=name, concurrency=c, prompt_len=prompt_len, output_len=output_len,
                                status="error", layout=layout),
               lambda: backend.run(c, prompt_len, output_len), backend, hygiene, c, "generation", extras),
           revisit=lambda p, again, cold=False: revisit_point(
               p, lambda: backend.run(p.concurrency, prompt_len, output_len), backend, hygiene, p.concurrency,
               "generation", extras, remeasure=again, warmup=hygiene.warmup if cold else 0))


def run_training(profile: Profile, path: Path, backend, values: Optional[list[int]], *, seq_len: int,
                 hygiene: Measurement, hooks: Hooks = Hooks(), extras: Optional[Extras] = None,
                 layout: Optional[ParallelLayout] = None, warm_each_visit: bool = True) -> None:
    """The training sweep; every point it measures records ``layout`` (ranks, FSDP, checkpointing).
    ``warm_each_visit``: later visits also start with ``hygiene.warmup`` untimed steps (an
    allocator that returns memory: :func:`~throughputlab.allocator.returns_memory`)."""
    name = backend.name

    def measure(b: int) -> TrainPoint:
        point = measure_point(lambda: TrainPoint(backend=name, micro_batch=b, seq_len=seq_len, status="error",
                                                 layout=layout),
                              lambda: backend.run(b, seq_len), backend, hygiene, b, "training", extras)
        if point.status == "ok" and getattr(backend, "last_effective_lr", None):
            point.effective_lr = backend.last_effective_lr
        return point

    _sweep(profile, path, "training", values, hooks, hygiene,
           key=lambda b: ("training", name, b, seq_len), measure=measure,
           # a trainer repeats one micro-batch size: each visit first brings the allocator to this size
           revisit=lambda p, again, cold=False: revisit_point(
               p, lambda: backend.run(p.micro_batch, seq_len), backend, hygiene, p.micro_batch, "training", extras,
               remeasure=again, warmup=hygiene.warmup if warm_each_visit or cold else 0))


def _sweep(profile: Profile, path: Path, kind: str, values: Optional[list[int]], hooks: Hooks,
           hygiene: Measurement, key: Callable[[int], tuple], measure: Callable[[int], Point],
           revisit: Callable[..., None]) -> None:
    rounds = max(hygiene.rounds, 1)
    hooks.sweep_started(kind, len(values) * rounds if values is not None else None)
    gen = plan(values, auto_cap=hygiene.auto_cap)
    x = next(gen)
    visited: list[Point] = []  # this sweep's points, in the order of the first round
    warm = False  # whether the backend has run a point in this process (not so when every point is resumed)
    while True:
        done = profile.find(key(x))
        if done is not None and done.status in ("ok", "oom"):  # --resume: never re-measure a finished point
            point, resumed = done, True
        else:
            hooks.point_started(kind, x)
            point, resumed, warm = measure(x), False, True
            profile.add_point(point)
            profile.save(path)
        hooks.point_finished(point, resumed)
        if point.status == "ok":
            visited.append(point)
        try:
            x = gen.send(point)
        except StopIteration:
            break
    _later_rounds(profile, path, kind, visited, rounds, hygiene, hooks, revisit, warm)
    if values is not None:  # values past an OOM were not measured: say so in the profile
        measured = {_x(p) for p in (profile.generation if kind == "generation" else profile.training)}
        oom_at = largest_fitting(profile.generation if kind == "generation" else profile.training)
        for v in values:
            if v not in measured and oom_at is not None:
                skipped = _skipped(kind, key(v), v)
                profile.add_point(skipped)
                hooks.point_finished(skipped)
        profile.save(path)
    hooks.sweep_finished(kind)


def _later_rounds(profile: Profile, path: Path, kind: str, visited: list[Point], rounds: int, hygiene: Measurement,
                  hooks: Hooks, revisit: Callable[..., None], warm: bool = True) -> None:
    """Rounds 2.. over the points of the first round (a resumed point only gets the rounds it
    lacks: `--resume --rounds N` adds rounds), then whole extra rounds while some point's spread
    is still above ``max_cv``. ``warm``: the backend already ran a point; if not, the first visit
    starts with the warm-up runs a first measurement has."""
    for r in range(2, rounds + 1):
        for point in visited:
            if point.rounds >= r:
                hooks.point_finished(point, True)
                continue
            hooks.point_started(kind, _x(point))
            revisit(point, False, cold=not warm)
            warm = True
            profile.save(path)
            hooks.point_finished(point)
    if rounds == 1:
        return  # a single round re-measures noisy points on the spot (measure_point)
    # Still noisy after the last round: another whole round, not just the noisy points. A slow
    # spell that outlasts a round would otherwise add slow samples to the re-measured points only
    # and move their medians against their neighbours'.
    for extra in range(hygiene.max_remeasure):
        noisy = [p for p in visited if (p.cv or 0.0) > hygiene.max_cv]
        if not noisy:
            return
        log.info("%s: spread above %.0f%% at %s after %d rounds, one more round", kind, 100 * hygiene.max_cv,
                 ", ".join(str(_x(p)) for p in noisy), rounds + extra)
        for point in visited:
            if point.remeasured > extra:  # a resumed point that already has this extra round
                continue
            hooks.point_started(kind, _x(point))
            revisit(point, True)
            profile.save(path)


def _skipped(kind: str, key: tuple, x: int) -> Point:
    why = "not run: larger than a value that ran out of memory"
    if kind == "generation":
        _, backend, c, p, o = key
        return GenPoint(backend=backend, concurrency=c, prompt_len=p, output_len=o, status="skipped", error=why)
    _, backend, b, s = key
    return TrainPoint(backend=backend, micro_batch=b, seq_len=s, status="skipped", error=why)
