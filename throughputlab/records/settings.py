"""The bench spec, one run's settings as a validated tree with one set of defaults
(:class:`BenchSpec`), and :class:`SweepSettings`, the resolved part of it a profile records
(dtype and device as resolved on the machine; the only record of the settings in profiles
written before the spec existed). A profile stores both; :class:`Measurement` is the sweep
runner's hygiene. Building a spec from its layers (defaults, a spec file, flags, ``--set``) is
throughputlab.spec's.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, TypeVar, Union

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field

from throughputlab.errors import UserError
from throughputlab.records.base import Record, SettingsRecord


def _x_values(value: Any) -> Any:
    """A concurrency or micro-batch list: ``auto``, a list, one integer, or ``"1,2,4"`` (a --set
    value YAML reads as text); sorted without duplicates. Checked here so that the error names
    the list, not one branch of the auto-or-list union."""
    if isinstance(value, str):
        if value.strip().lower() == "auto":
            return "auto"
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"takes auto or positive integers such as 1,2,4, got {value!r}")
        value = [int(p) for p in parts]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ValueError(f"takes auto or a non-empty list of positive integers, got {value!r}")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"values must be positive integers, got {value!r}")
    return sorted(set(value))


def _device(value: str) -> str:
    if value in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", value):
        return value
    raise ValueError(f"must be auto, cpu, cuda or cuda:N, got {value!r}")


def _lengths(value):
    """A list of positive token counts (``128,512,2048`` on the command line), sorted, unique."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.split(",")]
        if not all(p.isdigit() for p in parts):
            raise ValueError(f"takes positive integers such as 128,512,2048, got {value!r}")
        value = [int(p) for p in parts]
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value or \
            not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"takes a non-empty list of positive integers, got {value!r}")
    return sorted(set(value))


XValues = Annotated[Union[list[int], str], BeforeValidator(_x_values)]  # a list, or "auto" (checked above)
Lengths = Annotated[Optional[list[int]], BeforeValidator(_lengths)]
PositiveInt = Annotated[int, Field(gt=0)]


def check_endpoint(value: Optional[str]) -> None:
    """HOST:PORT (torch.distributed.run's --rdzv-endpoint), the port a number from 1 to 65535 (checked when a
    run starts, not when a stored profile is read)."""
    if value is None:
        return
    host, sep, port = str(value).rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UserError(f"--rdzv-endpoint: expected HOST:PORT of node 0 (e.g. 10.0.0.1:29500), got {value!r}")
Device = Annotated[str, AfterValidator(_device)]


class _Section(SettingsRecord):
    # strict: `prompt_len: "64"` or `rounds: true` in a file is a mistake to name, not to coerce
    model_config = ConfigDict(strict=True)


class GenerationSpec(_Section):
    """The generation sweep: concurrency c is c sequences decoded together."""

    backend: Literal["hf", "vllm", "openai"] = Field(
        "hf", description="Generation backend: hf (transformers loop), vllm (offline engine), openai (an endpoint).")
    concurrency: XValues = Field([1, 2, 4, 8, 16, 32, 64], description=(
        "Generation concurrencies (sequences decoded together), or `auto` (double until tokens/s stops growing)."))
    # The default run's shape (docs/bench.md, "What the default run measures, and why"): short prompts and 8 output
    # tokens keep it within two minutes on a slow 2-core CPU; 7 decode steps a run are each timed.
    prompt_len: PositiveInt = Field(16, description="Synthetic prompt tokens per sequence.")
    # at least 2: one token from the prefill, at least one decode step
    output_len: Annotated[int, Field(ge=2)] = Field(8, description="New tokens per sequence (EOS ignored).")
    engine_args: dict[str, Any] = Field({}, description=(
        "Pass an option to the engine, e.g. --engine-arg gpu_memory_utilization=0.8 (repeatable)."))
    tensor_parallel: PositiveInt = Field(1, description=(
        "vllm: one engine over N devices (vLLM's tensor_parallel_size, its mp executor; on CPU one core list per "
        "rank in VLLM_CPU_OMP_THREADS_BIND, e.g. 0|1). The fit treats the engine as one, up to N times one "
        "device's peak."))
    data_parallel: PositiveInt = Field(1, description=(
        "vllm: N engine replicas on disjoint devices (each of --tensor-parallel devices), one per rank under "
        "torch.distributed.run, every point run on all of them at once so their interference shows; concurrency "
        "is per replica, the profile records each replica's time and the aggregate tokens/s. Needs --only gen."))
    # the context axis; None: prompt_len alone
    contexts: Lengths = Field(None, description=(
        "The context axis: every concurrency at each of these prompt lengths, e.g. 128,512,2048 (decode then reads "
        "a KV cache of that many tokens and more; prefill is timed at each length). Replaces --prompt-len. A "
        "length past the model's, or one request past the engine's whole KV cache, is skipped."))

    @property
    def prompt_lens(self) -> list[int]:
        return list(self.contexts) if self.contexts else [self.prompt_len]
    url: Optional[str] = Field(None, description="Base URL of an OpenAI-compatible server, for --backend openai.")
    served_model: Optional[str] = Field(None, description="Model name the server expects (--backend openai).")


class TrainingSpec(_Section):
    """The training sweep: a micro-batch of b sequences, forward, backward, AdamW."""

    backend: Literal["torch"] = Field("torch", description="Training backend.")
    micro_batches: XValues = Field([1, 2, 4, 8], description=(
        "Training micro-batch sizes, or `auto` (double until tokens/s stops growing or memory runs out)."))
    seq_len: PositiveInt = Field(64, description="Tokens per training sequence.")
    seq_lens: Lengths = Field(None, description=(  # None: seq_len alone
        "Every training micro-batch at each of these sequence lengths, e.g. 128,512,1024 (replaces --seq-len); "
        "lengths past the model's maximum are skipped."))
    effective_lr: bool = Field(False, description="Record ||dW||/||W|| per parameter group in training points.")

    @property
    def all_seq_lens(self) -> list[int]:
        return list(self.seq_lens) if self.seq_lens else [self.seq_len]


class Measurement(_Section):
    """The sweep runner's hygiene: how each point is measured."""

    # warmup: at the first visit (training under glibc on the CPU: at every visit)
    warmup: Annotated[int, Field(ge=0)] = Field(1, description="Untimed runs before each point.")
    repeats: PositiveInt = Field(1, description="Timed runs per point in each round (every sample is kept).")
    rounds: PositiveInt = Field(3, description=(
        "Passes over the sweep, each adding --repeats timed runs to every point: a slow spell of the machine then "
        "costs one sample of many points, not every sample of a few, and the point's median of three ignores it. "
        "--rounds 1 --repeats 3 measures each point in one go."))
    max_cv: Annotated[float, Field(gt=0)] = Field(0.10, description=(
        "While some point's tokens/s spread (stdev/mean) is above this after the last round, run one more round "
        "over all points (with --rounds 1: measure that point again at once)."))
    max_remeasure: Annotated[int, Field(ge=0)] = Field(1, description=(
        "At most this many extra rounds (with --rounds 1: re-measurements of a noisy point)."))
    auto_cap: PositiveInt = Field(1024, description="Largest value an `auto` sweep tries.")


class Telemetry(_Section):
    enabled: bool = Field(True, description="Sample GPU (pynvml) or CPU/RSS telemetry during each point.")
    hz: Annotated[float, Field(gt=0)] = Field(20.0, description="Telemetry sampling rate.")


class PySpy(_Section):
    """Flame graphs of the host processes: an instrument that may change between resumed runs."""

    enabled: bool = Field(False, description="Record py-spy flame graphs of the host processes during points.")
    points: list[PositiveInt] = Field([], description=(  # empty: all
        "Only these concurrencies/micro-batches are profiled with --py-spy."))


class Distributed(_Section):
    """Training on several ranks under PyTorch's launcher (torch.distributed.run) with FSDP2; in the
    tree so that a resumed run takes the ranks from the stored spec. The ranks' side file records
    the layout the points ran on, and the launcher compares a resumed run against it."""

    nproc_per_node: PositiveInt = Field(1, description=(  # 1: the training sweep in this process
        "Training on N ranks per machine under PyTorch's launcher (torch.distributed.run) with FSDP2 (fully_shard "
        "per decoder block and the root; bf16 parameters, fp32 gradient reduction); NCCL on GPUs, gloo on CPU. "
        "Runs the training sweep only (--only train). A bare --resume takes the ranks from the profile."))
    nnodes: PositiveInt = Field(1, description=(
        "Machines of the training run; start the same command on each with its --node-rank."))
    node_rank: Annotated[int, Field(ge=0)] = Field(0, description="This machine's rank.")  # each machine its own
    rdzv_endpoint: Optional[str] = Field(None, description=(
        "Where the machines meet (node 0's address); needed with --nnodes above 1."))
    activation_checkpointing: bool = Field(False, description=(
        "With --nproc-per-node: recompute each decoder block's forward in the backward (non-reentrant)."))
    collectives: bool = Field(True, description=(
        "With --nproc-per-node on one machine: time all-reduce, all-gather and reduce-scatter on the ranks' "
        "devices first (as `throughputlab hardware --collectives N`); the profile's hardware keeps them and the "
        "fit uses their rates."))
    world_sizes: Lengths = Field(None, description=(  # one profile each
        "Training on this machine at each world size in turn, e.g. 1,2,4,8 (FSDP2 under torch.distributed.run, "
        "as --nproc-per-node), one profile each (OUTPUT.wsN.json); -b is then the micro-batch per rank, so every "
        "size trains the same per-rank batch (weak scaling), and the end prints tokens/s per device and the "
        "scaling efficiency against the smallest size."))


T = TypeVar("T")
# an empty section in YAML (`generation:` with every key commented out) reads as null
Section = Annotated[T, BeforeValidator(lambda v: {} if v is None else v)]


class BenchSpec(_Section):
    model: str = Field("demo", description=(
        "Preset name (see `throughputlab models`), a Hugging Face model folder, or a hub id (org/name)."))
    only: Optional[Literal["gen", "train"]] = Field(None, description=(  # None: both sweeps
        "Measure only generation or training."))
    dtype: Literal["auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32"] = Field("auto", description=(
        "auto (bfloat16 on GPU and on CPUs with native bf16, else float32), bfloat16, float16, float32."))
    device: Device = Field("auto", description="auto, cpu, cuda or cuda:N.")
    seed: int = Field(0, description="Seed for weights and synthetic tokens.")
    random_weights: bool = Field(False, description=(
        "Random weights for a model folder or hub id (presets always use them)."))
    trust_remote_code: bool = Field(False, description="Allow a model folder/hub id to run its own Python code.")
    generation: Section[GenerationSpec] = GenerationSpec()
    training: Section[TrainingSpec] = TrainingSpec()
    measurement: Section[Measurement] = Measurement()
    telemetry: Section[Telemetry] = Telemetry()
    py_spy: Section[PySpy] = PySpy()
    distributed: Section[Distributed] = Distributed()

    @property
    def run_gen(self) -> bool:
        return self.only in (None, "gen")

    @property
    def run_train(self) -> bool:
        return self.only in (None, "train")

    def check(self) -> None:
        """What one key cannot say alone."""
        if self.generation.backend == "openai" and not self.generation.url and self.run_gen:
            raise UserError("--backend openai needs --url (generation.url), e.g. --url http://127.0.0.1:8000/v1")
        if self.generation.backend != "openai" and self.run_gen:
            for flag, value in (("--url", self.generation.url), ("--served-model", self.generation.served_model)):
                if value:
                    raise UserError(f"{flag} goes with --backend openai (an endpoint to measure); the "
                                    f"{self.generation.backend} backend runs the model here: add --backend openai "
                                    f"or drop {flag}")
        if self.generation.tensor_parallel > 1 and self.generation.backend != "vllm" and self.run_gen:
            raise UserError(f"--tensor-parallel {self.generation.tensor_parallel} needs --backend vllm "
                            "(generation.tensor_parallel): the hf backend runs on one device")
        if self.generation.data_parallel > 1 and self.run_gen:
            if self.generation.backend != "vllm":
                raise UserError(f"--data-parallel {self.generation.data_parallel} needs --backend vllm "
                                "(generation.data_parallel): replicas are vLLM engines")
            if self.only != "gen":
                raise UserError("--data-parallel runs the generation sweep on engine replicas: add --only gen "
                                "(measure training in a run of its own)")


DEFAULTS = BenchSpec()
INSTRUMENTS = ("py_spy",)  # sections that do not change what is measured: may differ on --resume


class SweepSettings(Record):
    """What a profile records of its settings: the spec's measured part, dtype and device as
    resolved on the machine. Profiles written before the spec existed have only this."""

    dtype: str
    device: str
    gen_backend: Optional[str] = None
    train_backend: Optional[str] = None
    # what a profile without the key measured (the defaults then), as `rounds` below
    prompt_len: int = 64
    output_len: int = 32
    seq_len: int = 128
    warmup: int = DEFAULTS.measurement.warmup
    repeats: int = DEFAULTS.measurement.repeats
    max_cv: float = DEFAULTS.measurement.max_cv
    max_remeasure: int = 2
    # Not the spec's default: profiles written before rounds existed lack this key, and they
    # measured every point in one pass.
    rounds: int = 1
    seed: int = DEFAULTS.seed

    @classmethod
    def from_spec(cls, spec: BenchSpec, dtype: str, device: str) -> "SweepSettings":
        m = spec.measurement
        return cls(dtype=dtype, device=device, gen_backend=spec.generation.backend if spec.run_gen else None,
                   train_backend=spec.training.backend if spec.run_train else None,
                   prompt_len=spec.generation.prompt_len, output_len=spec.generation.output_len,
                   seq_len=spec.training.seq_len, warmup=m.warmup, repeats=m.repeats, max_cv=m.max_cv,
                   max_remeasure=m.max_remeasure, rounds=m.rounds, seed=spec.seed)
