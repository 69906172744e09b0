"""`bench` as a library call: from a BenchSpec to a saved Profile.

Order of work: validate (cheap) -> resolve model -> probe hardware -> generation sweep ->
training sweep. The profile is saved before the first point and after every point, so an
interrupted or failing run keeps what it measured and ``resume=True`` finishes it.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from throughputlab.errors import UserError
from throughputlab.models import ResolvedModel, resolve_model
from throughputlab.profile import Profile, SweepSettings
from throughputlab.sweep import Extras, Hooks, Hygiene, check_resumable, environment, run_generation, run_training

log = logging.getLogger(__name__)


@dataclass
class BenchSpec:
    model: str = "demo"
    output: Path = Path("profile.json")
    only: Optional[str] = None  # "gen", "train" or None for both
    gen_backend: str = "hf"
    train_backend: str = "torch"
    concurrency: Optional[list[int]] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32, 64, 128])  # None = auto
    batch_sizes: Optional[list[int]] = field(default_factory=lambda: [1, 2, 4, 8])  # None = auto
    prompt_len: int = 64
    output_len: int = 32
    seq_len: int = 128
    dtype: str = "auto"
    device: str = "auto"
    warmup: int = 1
    repeats: int = 1
    rounds: int = 3
    max_cv: float = 0.10
    max_remeasure: int = 2
    auto_cap: int = 1024
    seed: int = 0
    resume: bool = False
    force: bool = False
    random_weights: bool = False
    trust_remote_code: bool = False
    engine_args: dict = field(default_factory=dict)
    url: Optional[str] = None  # openai backend
    served_model: Optional[str] = None
    telemetry: bool = True
    telemetry_hz: float = 20.0
    py_spy: bool = False
    py_spy_points: list[int] = field(default_factory=list)
    track_effective_lr: bool = False
    command_line: Optional[list[str]] = None

    def validate(self) -> None:
        if self.only not in (None, "gen", "train"):
            raise UserError(f"--only must be gen or train, got {self.only!r}")
        for name in ("prompt_len", "output_len", "seq_len", "repeats", "rounds"):
            if getattr(self, name) <= 0:
                raise UserError(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(self, name)}")
        if self.output_len < 2:
            raise UserError("--output-len must be at least 2 (one prefill token and one decode step)")
        if self.warmup < 0 or self.max_remeasure < 0:
            raise UserError("--warmup and --max-remeasure must be zero or more")
        if not 0 < self.max_cv:
            raise UserError(f"--max-cv must be positive, got {self.max_cv}")
        if self.gen_backend == "openai" and not self.url and self.only != "train":
            raise UserError("--backend openai needs --url, e.g. --url http://127.0.0.1:8000/v1")
        if self.output.exists() and not (self.resume or self.force):
            raise UserError(f"{self.output} exists: pass --resume to continue it or --force to overwrite it")
        if self.resume and self.force:
            raise UserError("--resume and --force contradict each other: choose one")

    @property
    def run_gen(self) -> bool:
        return self.only in (None, "gen")

    @property
    def run_train(self) -> bool:
        return self.only in (None, "train")


def check_lengths(spec: BenchSpec, resolved: ResolvedModel) -> None:
    limit = resolved.spec.max_position_embeddings
    if limit:
        if spec.run_gen and spec.prompt_len + spec.output_len > limit:
            raise UserError(f"--prompt-len + --output-len = {spec.prompt_len + spec.output_len} exceeds the model's "
                            f"max_position_embeddings {limit}")
        if spec.run_train and spec.seq_len > limit:
            raise UserError(f"--seq-len {spec.seq_len} exceeds the model's max_position_embeddings {limit}")


def run_bench(spec: BenchSpec, hooks: Hooks = Hooks()) -> Profile:
    from throughputlab.backends import load_backend_class

    spec.validate()
    resolved = resolve_model(spec.model, random_weights=spec.random_weights, trust_remote_code=spec.trust_remote_code)
    check_lengths(spec, resolved)
    gen_cls = load_backend_class("generation", spec.gen_backend) if spec.run_gen else None
    train_cls = load_backend_class("training", spec.train_backend) if spec.run_train else None

    from throughputlab.hardware.probe import probe, resolve_device, resolve_dtype

    device = "cpu" if spec.gen_backend == "openai" and not spec.run_train else resolve_device(spec.device)
    dtype = resolve_dtype(spec.dtype, device)
    settings = SweepSettings(dtype=dtype, device=device, gen_backend=spec.gen_backend if spec.run_gen else None,
                             train_backend=spec.train_backend if spec.run_train else None,
                             prompt_len=spec.prompt_len, output_len=spec.output_len, seq_len=spec.seq_len,
                             warmup=spec.warmup, repeats=spec.repeats, max_cv=spec.max_cv,
                             max_remeasure=spec.max_remeasure, rounds=spec.rounds, seed=spec.seed)
    if spec.resume and spec.output.exists():
        profile = Profile.load(spec.output)
        check_resumable(profile, resolved.spec.name, {"dtype": dtype, "device": device})
        profile.environment.command_line = spec.command_line or profile.environment.command_line
    else:
        hardware = probe(device, dtype, run_microbench=spec.gen_backend != "openai" or spec.run_train)
        profile = Profile(model=resolved.spec, hardware=hardware, environment=environment(spec.command_line),
                          settings=settings)
    profile.save(spec.output)

    hygiene = Hygiene(warmup=spec.warmup, repeats=spec.repeats, max_cv=spec.max_cv, max_remeasure=spec.max_remeasure,
                      rounds=spec.rounds)
    extras = _extras(spec)
    try:
        if gen_cls is not None:
            max_c = max(spec.concurrency) if spec.concurrency else spec.auto_cap
            if spec.gen_backend == "openai":
                backend = gen_cls(spec.url, model=spec.served_model or _served_name(resolved), vocab_size=resolved.spec.vocab_size)
            else:
                backend = gen_cls(resolved, dtype=dtype, device=device, seed=spec.seed, max_concurrency=max_c,
                                  max_len=spec.prompt_len + spec.output_len, engine_args=spec.engine_args)
            try:
                backend.start()
                profile.engine = backend.engine_info()
                profile.save(spec.output)
                run_generation(profile, spec.output, backend, spec.concurrency, prompt_len=spec.prompt_len,
                               output_len=spec.output_len, hygiene=hygiene, hooks=hooks, extras=extras,
                               auto_cap=spec.auto_cap)
            finally:
                backend.close()
        if train_cls is not None:
            backend = train_cls(resolved, dtype=dtype, device=device, seed=spec.seed,
                                track_effective_lr=spec.track_effective_lr)
            try:
                backend.start()
                run_training(profile, spec.output, backend, spec.batch_sizes, seq_len=spec.seq_len, hygiene=hygiene,
                             hooks=hooks, extras=extras, auto_cap=spec.auto_cap)
            finally:
                backend.close()
    finally:
        if extras.pyspy is not None:
            close = getattr(extras.pyspy, "close", None)
            if close:
                close()
        torch = sys.modules.get("torch")  # the thread count the points ran with; no import for an HTTP-only run
        if torch is not None:
            profile.environment.torch_threads = torch.get_num_threads()
        profile.save(spec.output)
    return profile


def _served_name(resolved: ResolvedModel) -> Optional[str]:
    return resolved.path if resolved.source in ("hub", "folder") else None


def _extras(spec: BenchSpec) -> Extras:
    extras = Extras(pyspy_points=set(spec.py_spy_points))
    if spec.telemetry:
        try:
            from throughputlab.telemetry import TelemetrySampler
        except ImportError:
            log.info("telemetry unavailable")
        else:
            hz = spec.telemetry_hz
            extras.telemetry = lambda pids: TelemetrySampler(pids, hz=hz)
    if spec.py_spy:
        from throughputlab.hostprof import PySpyRecorder

        out_dir = spec.output.parent / (spec.output.stem + "-pyspy")
        extras.pyspy = PySpyRecorder(out_dir)
    return extras
