"""`bench` as a library call: from a BenchSpec (what to measure) and RunOptions (where to write
it) to a saved Profile.

Order of work: validate (cheap) -> resolve model -> probe hardware -> generation sweep ->
training sweep. The profile is saved before the first point and after every point, so an
interrupted or failing run keeps what it measured and ``resume=True`` finishes it. The
profile stores the spec, so a run can be repeated exactly and a resumed run is checked
against it.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from throughputlab.allocator import returns_memory
from throughputlab.errors import UserError
from throughputlab.machine import environment
from throughputlab.models import ResolvedModel, resolve_model
from throughputlab.records.layout import ParallelLayout
from throughputlab.records.profile import GenPoint, Profile, TrainPoint
from throughputlab.records.settings import BenchSpec, SweepSettings
from throughputlab.spec import resume_differences
from throughputlab.sweep import Extras, Hooks, run_generation, run_training

log = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """What belongs to one run, not to what it measures: kept out of the spec."""

    output: Path = Path("profile.json")
    resume: bool = False
    force: bool = False
    command_line: Optional[list[str]] = None

    def check(self) -> None:
        if self.resume and self.force:
            raise UserError("--resume and --force contradict each other: choose one")
        if self.resume and not self.output.exists():
            raise _nothing_to_resume(self.output)
        if self.output.exists() and not (self.resume or self.force):
            raise UserError(f"{self.output} exists: pass --resume to continue it or --force to overwrite it")


def check_lengths(spec: BenchSpec, resolved: ResolvedModel) -> None:
    """A single length past the model's maximum is a mistake; on a length axis (--contexts,
    --seq-lens) the points past it are recorded `skipped`, unless no length fits."""
    limit = resolved.spec.context_limit
    gen, train = spec.generation, spec.training
    if not limit:
        return
    if spec.run_gen and gen.prompt_lens[0] + gen.output_len > limit:
        what = "the shortest --contexts value" if gen.contexts else "--prompt-len"
        raise UserError(f"{what} + --output-len = {gen.prompt_lens[0] + gen.output_len} exceeds the model's "
                        f"{resolved.spec.context_limit_name} {limit}")
    if spec.run_train and train.all_seq_lens[0] > limit:
        what = "the shortest --seq-lens value" if train.seq_lens else "--seq-len"
        raise UserError(f"{what} {train.all_seq_lens[0]} exceeds the model's {resolved.spec.context_limit_name} {limit}")


def split_lengths(lengths: list[int], extra: int, limit: Optional[int]) -> tuple[list[int], list[int]]:
    """(lengths that fit the model's maximum with ``extra`` tokens more, those that do not)."""
    if not limit:
        return list(lengths), []
    return [n for n in lengths if n + extra <= limit], [n for n in lengths if n + extra > limit]


def _skip(profile: Profile, path: Path, points: list) -> None:
    """Record points not run (past the KV cache or the model's length), keeping any measured one."""
    for p in points:
        done = profile.find(p.key)
        if done is None or done.status not in ("ok", "oom"):
            profile.add_point(p)
    if points:
        profile.save(path)


def skipped_generation(backend: str, concurrency: Optional[list[int]], prompt_len: int, output_len: int,
                       why: str, layout) -> list[GenPoint]:
    return [GenPoint(backend=backend, concurrency=c, prompt_len=prompt_len, output_len=output_len, status="skipped",
                     error=why, layout=layout) for c in (concurrency or [])]


def kv_limited(concurrency: Optional[list[int]], prompt_len: int, output_len: int,
               kv_tokens: Optional[int]) -> tuple[Optional[list[int]], list[int]]:
    """(concurrencies the engine can run, those it cannot). Past what its KV cache holds at once the
    engine queues the rest and tokens/s stops growing: an admission plateau, measured as it is (the fit
    takes the limit from the recorded KV cache); only a request longer than the whole cache cannot run."""
    if concurrency is None or not kv_tokens:
        return concurrency, []
    if prompt_len + output_len <= kv_tokens:
        return concurrency, []
    return [], list(concurrency)


# ---------------------------------------------------------------- --resume


def resume_base(path: Path) -> dict[str, Any]:
    """The settings a resumed run starts from, in place of the spec's defaults: the stored spec,
    or for a profile written before the spec existed, what its SweepSettings recorded."""
    if not Path(path).exists():
        raise _nothing_to_resume(path)
    profile = Profile.load(path)
    if profile.kind != "measured":
        raise _predicted()
    if profile.spec is not None:
        return profile.spec.model_dump(mode="json")
    s = profile.settings
    only = "gen" if s.gen_backend and not s.train_backend else "train" if s.train_backend and not s.gen_backend \
        else None
    base: dict[str, Any] = {
        "dtype": s.dtype, "device": s.device, "seed": s.seed, "only": only,
        "generation": {"prompt_len": s.prompt_len, "output_len": s.output_len},
        "training": {"seq_len": s.seq_len},
        "measurement": {"warmup": s.warmup, "repeats": s.repeats, "rounds": s.rounds, "max_cv": s.max_cv,
                        "max_remeasure": s.max_remeasure},
    }
    if s.gen_backend is not None:
        base["generation"]["backend"] = s.gen_backend
    if s.train_backend is not None:
        base["training"]["backend"] = s.train_backend
    if profile.model.source in ("preset", "hub"):  # a folder's path is not stored, only its name
        base["model"] = profile.model.name
    return base


def check_resumable(existing: Profile, spec: BenchSpec, model_name: str, dtype: str, device: str) -> None:
    """--resume only continues a profile measured with the same settings; instruments (py-spy)
    may change, and the measured axes may grow (every value measured kept, more added: the new
    points get every round, the old ones only what they lack). Profiles without a stored spec are
    checked on what their SweepSettings hold."""
    if existing.kind != "measured":
        raise _predicted()
    if existing.model.name != model_name:
        raise UserError(f"--resume: the existing profile measured {existing.model.name!r}, not {model_name!r}; "
                        "drop --model or choose another --output")
    old = existing.settings
    diffs: dict[str, tuple] = {}
    if existing.spec is not None:
        diffs, extended = resume_differences(existing.spec, spec)
        for key, added in extended.items():
            if added:
                log.info("--resume extends %s by %s", key, ", ".join(map(str, added)))
    else:
        new = SweepSettings.from_spec(spec, dtype, device)
        for key in ("gen_backend", "train_backend", "prompt_len", "output_len", "seq_len"):
            a, b = getattr(old, key), getattr(new, key)
            if a is not None and b is not None and a != b:
                diffs[key] = (a, b)
    for key, value in (("dtype", dtype), ("device", device)):  # as resolved: `auto` may mean another here
        if getattr(old, key) != value and key not in diffs:
            diffs[f"{key} (resolved)"] = (getattr(old, key), value)
    if diffs:
        was = ", ".join(f"{k}={a!r}" for k, (a, _) in diffs.items())
        asks = ", ".join(f"{k}={b!r}" for k, (_, b) in diffs.items())
        raise UserError(f"--resume: the existing profile was measured with {was}; this run asks {asks}: "
                        "drop those options (a bare --resume continues with the stored settings) "
                        "or choose another --output")


def _nothing_to_resume(path: Path) -> UserError:
    return UserError(f"--resume: {path} does not exist, there is nothing to resume; drop --resume to start a new sweep")


def _predicted() -> UserError:
    return UserError("--resume: the existing file is a predicted profile, not a measurement; choose another --output")


# ---------------------------------------------------------------- the run


def run_bench(spec: BenchSpec, run: RunOptions, hooks: Hooks = Hooks()) -> Profile:
    """Measure ``spec`` into ``run.output``. A new profile that fails or is interrupted before its
    first point is removed, so the corrected command runs again without --force."""
    try:
        return _run_bench(spec, run, hooks)
    except BaseException:
        if not run.resume and _no_points(run.output):
            run.output.unlink(missing_ok=True)
        raise


def _no_points(path: Path) -> bool:
    try:
        profile = Profile.load(path)
    except (UserError, OSError):
        return False  # not ours to judge: leave it
    return not profile.generation and not profile.training


def _run_bench(spec: BenchSpec, run: RunOptions, hooks: Hooks = Hooks()) -> Profile:
    from throughputlab.backends import load_backend_class

    spec.check()
    run.check()
    gen, train, m = spec.generation, spec.training, spec.measurement
    resolved = resolve_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    check_lengths(spec, resolved)
    gen_cls = load_backend_class("generation", gen.backend) if spec.run_gen else None
    train_cls = load_backend_class("training", train.backend) if spec.run_train else None

    from throughputlab.hardware.probe import probe, resolve_device, resolve_dtype

    device = "cpu" if gen.backend == "openai" and not spec.run_train else resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    if run.resume:
        profile = Profile.load(run.output)
        check_resumable(profile, spec, resolved.spec.name, dtype, device)
        profile.environment.command_line = run.command_line or profile.environment.command_line
        if profile.spec is not None:
            profile.spec = spec  # the same, apart from the instruments this run used
    else:
        hardware = probe(device, dtype, run_microbench=gen.backend != "openai" or spec.run_train)
        profile = Profile(model=resolved.spec, hardware=hardware, environment=environment(run.command_line),
                          settings=SweepSettings.from_spec(spec, dtype, device), spec=spec)
    profile.save(run.output)

    extras = _extras(spec, run.output)
    limit = resolved.spec.context_limit
    try:
        if gen_cls is not None:
            concurrency = _values(gen.concurrency)
            contexts, too_long = split_lengths(gen.prompt_lens, gen.output_len, limit)
            layout = ParallelLayout.generation(tp=gen.tensor_parallel)
            if gen.backend == "openai":
                backend = gen_cls(gen.url, model=gen.served_model or _served_name(resolved),
                                  vocab_size=resolved.spec.vocab_size)
            else:
                backend = gen_cls(resolved, dtype=dtype, device=device, seed=spec.seed,
                                  max_concurrency=max(concurrency) if concurrency else m.auto_cap,
                                  max_len=max(contexts) + gen.output_len, engine_args=engine_args(gen))
            try:
                backend.start()
                profile.engine = backend.engine_info()
                profile.save(run.output)
                kv_tokens = profile.engine.kv_cache_tokens if profile.engine is not None else None
                for ctx in contexts:
                    values, over = kv_limited(concurrency, ctx, gen.output_len, kv_tokens)
                    run_generation(profile, run.output, backend, values, prompt_len=ctx,
                                   output_len=gen.output_len, hygiene=m, hooks=hooks, extras=extras, layout=layout)
                    _skip(profile, run.output, skipped_generation(
                        backend.name, over, ctx, gen.output_len,
                        f"not run: one request of {ctx + gen.output_len} tokens is past the engine's KV cache of "
                        f"{kv_tokens} tokens", layout))
            finally:
                backend.close()
            for ctx in too_long:
                _skip(profile, run.output, skipped_generation(
                    backend.name, concurrency, ctx, gen.output_len,
                    f"not run: prompt {ctx} + output {gen.output_len} exceeds the model's {resolved.spec.context_limit_name} "
                    f"{limit}", layout))
        if train_cls is not None:
            seq_lens, too_long = split_lengths(train.all_seq_lens, 0, limit)
            backend = train_cls(resolved, dtype=dtype, device=device, seed=spec.seed,
                                track_effective_lr=train.effective_lr)
            try:
                backend.start()
                for seq in seq_lens:
                    run_training(profile, run.output, backend, _values(train.micro_batches), seq_len=seq,
                                 hygiene=m, hooks=hooks, extras=extras, layout=ParallelLayout.training(),
                                 warm_each_visit=returns_memory(device))
            finally:
                backend.close()
            micro = _values(train.micro_batches) or []
            _skip(profile, run.output, [
                TrainPoint(backend=backend.name, micro_batch=b, seq_len=seq, status="skipped",
                           error=f"not run: sequence length {seq} exceeds the model's {resolved.spec.context_limit_name} {limit}",
                           layout=ParallelLayout.training())
                for seq in too_long for b in micro])
    finally:
        if extras.pyspy is not None:
            close = getattr(extras.pyspy, "close", None)
            if close:
                close()
        torch = sys.modules.get("torch")  # the thread count the points ran with; no import for an HTTP-only run
        if torch is not None:
            profile.environment.torch_threads = torch.get_num_threads()
        profile.save(run.output)
    return profile


def _values(xs) -> Optional[list[int]]:
    """The sweep runner's form: None for `auto`."""
    return None if xs == "auto" else list(xs)


def engine_args(gen) -> dict:
    """The engine's arguments: the user's, with the tensor-parallel size and its executor."""
    args = dict(gen.engine_args)
    if gen.tensor_parallel > 1:
        if args.get("tensor_parallel_size", gen.tensor_parallel) != gen.tensor_parallel:
            raise UserError(f"--tensor-parallel {gen.tensor_parallel} and --engine-arg tensor_parallel_size="
                            f"{args['tensor_parallel_size']} disagree: give one")
        args["tensor_parallel_size"] = gen.tensor_parallel
        args.setdefault("distributed_executor_backend", "mp")
    return args


def _served_name(resolved: ResolvedModel) -> Optional[str]:
    return resolved.path if resolved.source in ("hub", "folder") else None


def _extras(spec: BenchSpec, output: Path) -> Extras:
    extras = Extras(pyspy_points=set(spec.py_spy.points))
    if spec.telemetry.enabled:
        try:
            from throughputlab.telemetry import TelemetrySampler
        except ImportError:
            log.info("telemetry unavailable")
        else:
            hz = spec.telemetry.hz
            extras.telemetry = lambda pids: TelemetrySampler(pids, hz=hz)
    if spec.py_spy.enabled:
        from throughputlab.hostprof import PySpyRecorder

        out_dir = output.parent / (output.stem + "-pyspy")
        extras.pyspy = PySpyRecorder(out_dir)
    return extras
