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
from throughputlab.records.base import Record


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
Device = Annotated[str, AfterValidator(_device)]


class _Section(Record):
    # strict: `prompt_len: "64"` or `rounds: true` in a file is a mistake to name, not to coerce
    model_config = ConfigDict(strict=True)


class GenerationSpec(_Section):
    """The generation sweep: concurrency c is c sequences decoded together."""

    backend: Literal["hf", "vllm", "openai"] = "hf"
    concurrency: XValues = [1, 2, 4, 8, 16, 32, 64]
    # The default run's shape (docs/bench.md, "What the default run measures, and why"): short prompts and 8 output
    # tokens keep it within two minutes on a slow 2-core CPU; 7 decode steps a run are each timed.
    prompt_len: PositiveInt = 16
    output_len: Annotated[int, Field(ge=2)] = 8  # one token from the prefill, at least one decode step
    engine_args: dict[str, Any] = {}
    tensor_parallel: PositiveInt = 1  # vllm: one engine over this many devices (tensor_parallel_size)
    data_parallel: PositiveInt = 1  # vllm: this many engine replicas on disjoint devices, measured together
    # the context axis: every concurrency at each of these prompt lengths (the KV context decode reads);
    # None: prompt_len alone
    contexts: Lengths = None

    @property
    def prompt_lens(self) -> list[int]:
        return list(self.contexts) if self.contexts else [self.prompt_len]
    url: Optional[str] = None  # openai backend
    served_model: Optional[str] = None  # openai backend: the name the server expects


class TrainingSpec(_Section):
    """The training sweep: a micro-batch of b sequences, forward, backward, AdamW."""

    backend: Literal["torch"] = "torch"
    micro_batches: XValues = [1, 2, 4, 8]
    seq_len: PositiveInt = 64
    seq_lens: Lengths = None  # every micro-batch at each of these sequence lengths; None: seq_len alone
    effective_lr: bool = False  # record ||dW||/||W|| per parameter group

    @property
    def all_seq_lens(self) -> list[int]:
        return list(self.seq_lens) if self.seq_lens else [self.seq_len]


class Measurement(_Section):
    """The sweep runner's hygiene: how each point is measured."""

    warmup: Annotated[int, Field(ge=0)] = 1  # untimed runs: first visit (training under glibc on the CPU: every visit)
    repeats: PositiveInt = 1  # timed runs per point and round
    rounds: PositiveInt = 2  # passes over the sweep, each adding `repeats` samples to every point
    max_cv: Annotated[float, Field(gt=0)] = 0.10  # tokens/s spread above which a point is measured again
    max_remeasure: Annotated[int, Field(ge=0)] = 1  # at most this many extra rounds (or re-measurements)
    auto_cap: PositiveInt = 1024  # largest value an `auto` sweep tries


class Telemetry(_Section):
    enabled: bool = True
    hz: Annotated[float, Field(gt=0)] = 20.0


class PySpy(_Section):
    """Flame graphs of the host processes: an instrument that may change between resumed runs."""

    enabled: bool = False
    points: list[PositiveInt] = []  # concurrencies/micro-batches to profile; empty: all


class Distributed(_Section):
    """Training on several ranks under PyTorch's launcher (torch.distributed.run) with FSDP2; in the
    tree so that a resumed run takes the ranks from the stored spec. The ranks' side file records
    the layout the points ran on, and the launcher compares a resumed run against it."""

    nproc_per_node: PositiveInt = 1  # ranks per machine; 1: the training sweep in this process
    nnodes: PositiveInt = 1
    node_rank: Annotated[int, Field(ge=0)] = 0  # this machine's rank: each machine gives its own
    rdzv_endpoint: Optional[str] = None  # HOST:PORT of node 0, where the machines meet (nnodes > 1)
    activation_checkpointing: bool = False  # recompute each decoder block's forward in the backward
    collectives: bool = True  # time the collectives on the ranks' devices before the sweep (one machine)
    world_sizes: Lengths = None  # the training sweep at each world size in turn, one profile each


T = TypeVar("T")
# an empty section in YAML (`generation:` with every key commented out) reads as null
Section = Annotated[T, BeforeValidator(lambda v: {} if v is None else v)]


class BenchSpec(_Section):
    model: str = "demo"  # preset, model folder or hub id
    only: Optional[Literal["gen", "train"]] = None  # None: both sweeps
    dtype: Literal["auto", "bfloat16", "float16", "float32", "bf16", "fp16", "fp32"] = "auto"
    device: Device = "auto"
    seed: int = 0
    random_weights: bool = False  # for a model folder or hub id (presets always use random weights)
    trust_remote_code: bool = False
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
