"""Published RL runs against `throughputlab decide`'s step model.

Reads every run folder of ``benchmarks/data/rl_runs/`` (format: that folder's README.md) and predicts
the run's step as a new user would: ``throughputlab predict --model M --gpu G --gpus N --nodes K --tp T``
for the run's model, device and GPUs, then ``throughputlab decide --profile P --config CONFIG`` at the
run's own batch, with the published mean prompt length as ``--prompt-len`` and the published response
lengths as ``--response-dist``: ``capped:mean=M,clip=C,max=L`` where the clip ratio is published, else
``capped:mean=M,sigma=0.6,max=L`` (the share at the cap implied by a lognormal cut there with mean M after
the cut, which is what a log's mean is); where nothing sits at the cap and the typical step's longest response is
published, sigma from it (``decide.lengths.sigma_for_longest``, as ``decide --against`` reads a log). Prints predicted/published
per published timer, mapped onto decide's phases per framework and placement, and a summary against
the targets.

    python3 benchmarks/rl_runs.py [--run SUBSTR ...] [-v] [--json FILE]

Every figure comes from the library's public functions (``predict_analytic``, ``runconfig.read``,
``build_spec``, ``decide_from_spec``); the harness only reads the data, maps timers and compares.
A run that cannot be predicted is listed with its reason. Exit 0; exit 2 with one line naming the
file and the key on a malformed data file.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path[:1]:
    sys.path.insert(0, str(ROOT))  # the working tree's library, not another installed copy

import throughputlab  # noqa: E402
from throughputlab import __version__  # noqa: E402
from throughputlab.decide import runconfig  # noqa: E402
from throughputlab.decide.calculator import decide_from_spec  # noqa: E402
from throughputlab.decide.cli import build_spec  # noqa: E402
from throughputlab.decide.lengths import parse_length_dist, sigma_for_longest  # noqa: E402
from throughputlab.errors import UserError  # noqa: E402
from throughputlab.predict import Layout, predict_analytic  # noqa: E402
from throughputlab.predict_engine import EngineOptions  # noqa: E402
from throughputlab.records.peaks import lookup  # noqa: E402
from throughputlab.rlconfig import read_run_config  # noqa: E402
from throughputlab.roofline import rl as rf_rl  # noqa: E402

DATA_DIR = ROOT / "benchmarks" / "data" / "rl_runs"
STEP_TOL, PHASE_TOL, FAR, SHARE = 0.15, 0.25, 2.0, 0.80  # the targets: step, phases, no phase off by 2x, 80% of runs
PHASES = ("gen_s", "logprob_s", "train_s", "critic_s", "offload_s", "sync_s", "step_s")
# the folder name's model -> (a preset or a config under published/models, note); None: cannot
MODELS = {
    "llama3.1-8b-instruct": ("llama3.1-8b", ""),
    "llama3.1-70b": ("llama3.1-70b", ""),
    "llama2-7b": ("llama2-7b", "the source says '7B' only; LLaMA-2 7B assumed"),
    "qwen2.5-0.5b-instruct": ("qwen2.5-0.5b", ""),
    "qwen2-7b-instruct": ("qwen2.5-7b", "Qwen2-7B-Instruct's config (printed in the log) has the preset's architecture"),
    "qwen2.5-7b-instruct-retool-sft": ("qwen2.5-7b", "an SFT of Qwen2.5-7B-Instruct: the preset's architecture"),
    "qwen2.5-math-7b": ("qwen2.5-math-7b", ""),
    "qwen3-30b-a3b": ("qwen3-30b-a3b", ""),
    "qwen3-30b-a3b-base": ("qwen3-30b-a3b", "the Base release has the preset's architecture"),
    "qwen3-32b": ("qwen3-32b", ""),
    "qwen3-235b-a22b": ("qwen3-235b-a22b", ""),
    "deepseek-v3": ("deepseek-v3", ""),
    "deepseek-v3-671b": ("deepseek-v3", ""),
    "deepseek-llm-7b-chat": ("deepseek-llm-7b", "deepseek-llm-7b-chat is initialized from deepseek-llm-7b-base (its "
                             "hub README): the preset's architecture"),
}
# published timers with no phase of the step model, and why
NOT_MODELLED = {
    "timing_s/reward": "reward scoring on the CPU: not priced for veRL's string-match scores (shape.reward prices math-verify; inside the published step)",
    "timing_s/adv": "advantage computation: not modelled (inside the published step)",
    "timing_s/testing": "validation: runs between steps",
    "validate": "validation: runs between steps",
    "timing_s/wait_prev_gen": "the trainer's exposed wait for the previous batch's generation: no phase of StepTime "
                              "(the model overlaps as max(gen, log-prob + train))",
}


def _load_published_harness():
    spec = importlib.util.spec_from_file_location("published_harness", ROOT / "benchmarks" / "published.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


_published = _load_published_harness()
resolve_spec = _published.resolve_spec  # a preset, else a config under benchmarks/data/published/models/
DataError = _published.DataError  # a malformed data file: the file, the key and what is wrong, as one line
_rel = _published._rel  # a path relative to the repository


# ---------------------------------------------------------------- data files


@dataclass
class Measurement:
    id: str
    step_s: float
    timer: str
    phases: dict[str, Optional[float]]  # published timer -> seconds (None: published as absent)
    mean_response: Optional[float] = None
    mean_prompt: Optional[float] = None
    clip: Optional[float] = None
    longest: Optional[float] = None  # the typical step's longest response (median of the per-step max)
    tokens_per_s_per_gpu: Optional[float] = None
    sequences: Optional[int] = None  # responses per step (NeMo-RL's G-GBS)


@dataclass
class Run:
    name: str
    path: Path
    framework: str  # the folder name's: verl, nemo-rl, openrlhf
    model: str  # the folder name's model
    config_files: list[str]
    config_complete: bool
    device: str
    gpus: int
    nodes: Optional[int]
    prompts: Optional[int]
    group: Optional[int]
    measurements: list[Measurement]
    v04_config: Optional[str] = None  # NeMo-RL: the recipe at v0.4.0, where the folder keeps it
    config_version: Optional[str] = None  # NeMo-RL: the tag the recipe was read at
    engine_version: Optional[str] = None  # the rollout's vLLM as the run's log shows it (rollout_engine_version)


def _figure(doc: dict, key: str, path: Path, where: str = "", kind: str = "num", required: bool = False) -> Any:
    """``doc[key]['value']``, checked: a number (``num``), a positive integer (``int``) or a string."""
    label = f"{where}{key}"
    node = doc.get(key)
    if node is None or (isinstance(node, dict) and node.get("value") is None):
        if required:
            raise DataError(path, label, "missing (a mapping with value, source and where)")
        return None
    if not isinstance(node, dict) or "value" not in node:
        raise DataError(path, label, f"must be a mapping with a value (and source, where), got {node!r}")
    v = node["value"]
    ok, what = {"num": (_published._is_num(v) and v >= 0, "a number >= 0"), "str": (isinstance(v, str), "a string"),
                "int": (isinstance(v, int) and not isinstance(v, bool) and v > 0, "a positive integer")}[kind]
    if not ok:
        raise DataError(path, f"{label}.value", f"must be {what}, got {v!r}")
    return v


def _phases(doc: dict, path: Path, where: str = "") -> dict[str, Optional[float]]:
    ph = doc.get("phases")
    if ph is None or isinstance(ph, str):
        return {}  # "not published"
    if not isinstance(ph, dict):
        raise DataError(path, f"{where}phases", "must be a mapping of timer -> {value, source, where} or a sentence")
    return {str(t): _figure(ph, t, path, f"{where}phases.") for t in ph}


def _measurement(doc: dict, path: Path, mid: str, where: str) -> Measurement:
    step = doc.get("step_time_s")
    return Measurement(id=mid, step_s=_figure(doc, "step_time_s", path, where, required=True),
                       timer=str(step.get("timer") or "step"), phases=_phases(doc, path, where),
                       mean_response=_figure(doc, "mean_response_length", path, where),
                       mean_prompt=_figure(doc, "mean_prompt_length", path, where),
                       clip=_figure(doc, "clip_ratio", path, where),
                       longest=_figure(doc, "longest_response", path, where),
                       tokens_per_s_per_gpu=_figure(doc, "tokens_per_s_per_gpu", path, where),
                       sequences=_figure(doc, "generation_batch_sequences", path, where, "int"))


def load_run(folder: Path) -> Run:
    """One run folder: its published.yaml checked, its config files present."""
    path = folder / "published.yaml"
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise DataError(path, "file", f"cannot be read ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        raise DataError(path, "YAML" + (f" line {mark.line + 1}" if mark else ""), "not valid YAML") from None
    if not isinstance(doc, dict):
        raise DataError(path, "top level", "must be a mapping")
    files = doc.get("config_files")
    if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
        raise DataError(path, "config_files", "missing or not a list of file names (the run's own config first)")
    v04 = doc.get("config_files_v0.4")
    for f in files + (v04 if isinstance(v04, list) else []):
        if not (folder / f).is_file():
            raise DataError(path, "config_files", f"names {f}, which is not in the folder")
    if not isinstance(doc.get("config_complete"), bool):
        raise DataError(path, "config_complete", "missing or not true/false")
    raw = doc.get("measurements")
    if raw is not None:
        if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) for m in raw):
            raise DataError(path, "measurements", "must be a non-empty list of mappings")
        for i, m in enumerate(raw):
            if not isinstance(m.get("id"), str):
                raise DataError(path, f"measurements[{i}].id", "missing or not a string")
        meas = [_measurement(m, path, m["id"], f"measurements[{m['id']}].") for m in raw]
    else:
        meas = [_measurement(doc, path, "published", "")]
    parts = folder.name.split("_")
    if len(parts) < 4:
        raise DataError(path, "folder name", "must read <framework>_<model>_<algo>_<gpus>gpu[_variant]")
    version = re.search(r"@ tag (v\d+\.\d+)", (folder / files[0]).read_text(encoding="utf-8")[:600])
    return Run(name=folder.name, path=folder, framework=parts[0], model=parts[1], config_files=files,
               config_complete=doc["config_complete"], device=_figure(doc, "device", path, kind="str", required=True),
               gpus=_figure(doc, "gpus", path, kind="int", required=True),
               nodes=_figure(doc, "nodes", path, kind="int"),
               prompts=_figure(doc, "prompts_per_step", path, kind="int"),
               group=_figure(doc, "responses_per_prompt", path, kind="int"), measurements=meas,
               v04_config=v04[0] if isinstance(v04, list) and v04 else None,
               config_version=version.group(1) if version else None,
               engine_version=_figure(doc, "rollout_engine_version", path, kind="str"))


def load_runs(data_dir: Path = DATA_DIR, select: tuple[str, ...] = ()) -> list[Run]:
    return [load_run(p) for p in sorted(Path(data_dir).iterdir()) if (p / "published.yaml").is_file()
            and (not select or any(s in p.name for s in select))]


# ---------------------------------------------------------------- a run -> predict's and decide's inputs


@dataclass
class Compared:
    timer: str
    published: float
    predicted: float
    model: str  # the StepTime phases summed, e.g. "gen+sync"
    ratio: float
    note: str = ""


@dataclass
class Row:
    run: str
    measurement: str
    framework: str
    placement: Optional[str]  # colocated, one-step-off, fully-async
    config_complete: bool
    primary: bool  # the measurement the run's config belongs to (the one the targets count)
    published_step: float
    predicted: bool = False
    reason: str = ""
    lengths_published: bool = False
    inputs: dict = field(default_factory=dict)
    step: dict = field(default_factory=dict)  # decide's StepTime phases, seconds
    compared: list[Compared] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config_lines: list[str] = field(default_factory=list)


def capped_form_available() -> bool:
    """Whether the library reads ``capped:mean=..,max=..`` (the form a run's log gives, the share at the cap
    given or implied)."""
    try:
        return parse_length_dist("capped:mean=100,max=200").kind == "capped"
    except UserError:
        return False


GROUP_CORR = 0.0  # --group-corr: a what-if; no published run gives its groups' length correlation


def response_dist(meas: Measurement, cap: int, capped: bool, responses: int) -> tuple[str, str]:
    """``--response-dist`` from the published mean (and clip ratio, or the typical step's longest response) and
    the cap, and what it says."""
    form, why = _response_dist(meas, cap, capped, responses)
    if GROUP_CORR > 0:
        return f"{form},group_corr={GROUP_CORR:g}", f"{why}; group_corr {GROUP_CORR:g} (--group-corr, a what-if)"
    return form, why


def _response_dist(meas: Measurement, cap: int, capped: bool, responses: int) -> tuple[str, str]:
    m = meas.mean_response
    if capped and not meas.clip and meas.longest and m < meas.longest < cap:
        # nothing at the cap: the spread from the step's longest, as `decide --against` reads a log's max
        sigma = sigma_for_longest(m, meas.longest, 1 / (responses + 1))
        clip, said = ("", "no published clip ratio") if meas.clip is None else \
            (f"clip={meas.clip:g},", f"a published clip ratio of {meas.clip:g}")
        return (f"capped:mean={m:g},{clip}max={cap},sigma={sigma:.3g}",
                f"published mean {m:g}, {said}, and the typical step's longest response {meas.longest:g} of "
                f"{responses:,}: sigma {sigma:.3g} (the batch's expected longest)")
    if capped and meas.clip is not None:
        return f"capped:mean={m:g},clip={meas.clip:g},max={cap}", f"published mean {m:g} and clip ratio {meas.clip:g}"
    if capped and m < cap:
        d = parse_length_dist(f"capped:mean={m:g},sigma={runconfig.RESPONSE_SIGMA:g},max={cap}")
        return (f"capped:mean={m:g},sigma={runconfig.RESPONSE_SIGMA:g},max={cap}",
                f"published mean {m:g} after the cut; no published clip ratio: {d.clip:.1%} at the cap implied by "
                f"a lognormal of sigma {runconfig.RESPONSE_SIGMA:g} cut there")
    why = "no published clip ratio" if meas.clip is None else "the capped form is not in the library yet"
    return (f"lognormal:mean={m:g},sigma={runconfig.RESPONSE_SIGMA:g},max={cap}",
            f"published mean {m:g} as a lognormal's (before the cut; {why})")


def prompt_len(meas: Measurement, gpus: int) -> tuple[Optional[int], str]:
    """The mean prompt: published, else derived from NeMo-RL's tokens/s/GPU (prompt + response tokens per
    sample, times the step, over G-GBS), else None (decide takes the config's prompt cap)."""
    if meas.mean_prompt:
        return round(meas.mean_prompt), "published mean"
    t, n, r = meas.tokens_per_s_per_gpu, meas.sequences, meas.mean_response
    if t and n and r:
        derived = t * meas.step_s * gpus / n - r
        if 0 < derived < r:
            return round(derived), "derived: tokens/s/GPU x step x GPUs / G-GBS - mean response"
    return None, "not published: decide's default from the config (the prompt cap)"


def _dtype(rc) -> tuple[str, str]:
    if rc.rollout_dtype == "fp8" and rc.train_dtype == "fp8":
        return "fp8", ""
    other = {rc.rollout_dtype, rc.train_dtype} - {None, "bf16"}
    return "bfloat16", f"dtype {'/'.join(sorted(other))} in the config predicted as bfloat16" if other else ""


def _config_for(run: Run, meas: Measurement) -> tuple[Path, list[str]]:
    notes = []
    name = run.config_files[0]
    version = meas.id.split("-")[0] if run.framework == "nemo-rl" else None
    if version == "v0.4" and run.v04_config:
        name = run.v04_config
    elif version and run.config_version and not run.config_version.startswith(version):
        notes.append(f"the {version} row predicted with the recipe at {run.config_version}")
    return run.path / name, notes


# The vLLM each NeMo-RL release pins (pyproject.toml `vllm==` at the tag: v0.3.0 0.9.0, v0.4.0 0.10.0, v0.5.0
# 0.11.2, v0.6.0 0.17.1, v0.7.0 0.20.0): before 0.14, no async scheduling unless asked, and NeMo-RL does not ask;
# from 0.14 on by default, except on the ray executor of its engines of several GPUs (before 0.21).
NEMO_RL_VLLM = {"v0.3": "0.9.0", "v0.4": "0.10.0", "v0.5": "0.11.2", "v0.6": "0.17.1", "v0.7": "0.20.0"}


def _profile(spec, device: str, dtype: str, layout: Layout, tmp: Path, vllm: Optional[str] = None) -> str:
    out = tmp / f"{spec.name}-{device}-{dtype}-{layout.gpus}-{layout.nodes}-{layout.tp}-{vllm}.json".replace(" ", "_")
    if not out.exists():
        predict_analytic(spec, device, dtype=dtype, layout=layout, engine=EngineOptions(engine_version=vllm)).save(out)
    return str(out)


def _stated(rc, field: str):
    """``rc``'s field where the config states it; None where it is the framework's default for a key the
    (partial) config leaves out: a published run's own figures are not the framework's defaults."""
    if any(k.note.startswith(f"{field} = ") and "not set" in k.note for k in rc.read):
        return None
    return getattr(rc, field)


def predict_row(run: Run, meas: Measurement, tmp: Path, capped: bool) -> Row:
    """Predict one published measurement; every failure becomes the row's reason."""
    primary = run.framework != "nemo-rl" or meas is _primary(run)
    row = Row(run=run.name, measurement=meas.id, framework=run.framework, placement=None,
              config_complete=run.config_complete, primary=primary, published_step=meas.step_s)
    cfg, row.notes = _config_for(run, meas)
    try:
        rc = read_run_config(cfg)
        base, row.config_lines, _ = runconfig.read(str(cfg))
        if not run.config_complete and _stated(rc, "reference") is None:
            # a partial config that leaves the KL keys out: the run's reference pass is unknown, not veRL's default
            base.get("shape", {}).get("train", {}).pop("ref_logprob", None)
    except UserError as e:
        row.reason = f"the config is not read: {e}"
        return row
    engine = base.get("shape", {}).get("engine", {})
    if meas.id.startswith("v0.4") and run.framework == "nemo-rl" and engine.get("in_process_logprobs") == "ids":
        engine["in_process_logprobs"] = "text"  # v0.4.0's vLLM worker kept the tokenizer whatever the config said
        row.notes.append("the v0.4 engine detokenizes (its worker forced skip_tokenizer_init false)")
    row.placement = "colocated" if rc.placement in (None, "colocated") else \
        "fully-async" if rc.streaming else "one-step-off"
    spec_name, note = MODELS.get(run.model, (None, f"no model config for {run.model!r}"))
    if spec_name is None:
        row.reason = note
        return row
    if note:
        row.notes.append(note)
    prompts = run.prompts or _stated(rc, "prompts_per_step")
    group = _stated(rc, "responses_per_prompt") or run.group
    missing = [what for what, v in (("prompts per step", prompts), ("responses per prompt", group)) if not v]
    if missing:
        row.reason = f"{' and '.join(missing)}: stated neither in the config nor in published.yaml"
        return row
    if run.prompts and rc.prompts_per_step and run.prompts != rc.prompts_per_step:
        row.notes.append(f"the published step covers {run.prompts} prompts; the config's batch is "
                         f"{rc.prompts_per_step}")
    ds = lookup(re.sub(r"\s*\(.*\)", "", run.device))
    if ds is None:
        row.reason = f"no datasheet row for the device {run.device!r}"
        return row
    nodes = run.nodes or rc.nodes or 1
    dtype, dnote = _dtype(rc)
    if dnote:
        row.notes.append(dnote)
    plen, plen_src = prompt_len(meas, run.gpus)
    flags: dict[str, Any] = {"prompts": str(prompts), "baseline": prompts, "group": group, "prompt_len": plen}
    if (rc.gpus, rc.nodes) != (run.gpus, nodes):
        flags.update(gpus=run.gpus, nodes=nodes)
        row.notes.append(f"GPUs/nodes {run.gpus}/{nodes} as published (the config says {rc.gpus}/{rc.nodes})")
    dist_src = "not published: decide's default from the config (a lognormal with half the cap as its mean)"
    cap = rc.response_tokens_max
    if meas.mean_response and cap:
        if rc.sequence_tokens_max and plen:
            cap = min(cap, rc.sequence_tokens_max - plen)  # the engine stops at prompt + response = the total cap
        flags["response_dist"], dist_src = response_dist(meas, cap, capped, prompts * group)
        row.lengths_published = True
    tp = rc.rollout_tp or 1
    row.inputs = {"model": spec_name, "device": ds.device, "gpus": run.gpus, "nodes": nodes, "tp": tp, "dtype": dtype,
                  "config": _rel(cfg), "prompts": prompts, "group": group, "prompt_len": plen,
                  "prompt_len_source": plen_src, "response_dist": flags.get("response_dist"),
                  "response_source": dist_src}
    try:
        spec = model_spec(spec_name)
        # predict's layout keeps TP within a node; decide takes the config's engine TP, across nodes too
        per_node = max(run.gpus // nodes, 1)
        vllm = run.engine_version or (NEMO_RL_VLLM.get(meas.id.split("-")[0]) if run.framework == "nemo-rl" else None)
        row.inputs["vllm"] = vllm
        profile = _profile(spec, ds.device, dtype,
                           Layout(gpus=run.gpus, nodes=nodes, tp=tp if tp <= per_node else per_node).check(), tmp, vllm)
        decision = decide_from_spec(build_spec(None, base, profile=profile, **flags))[0]
    except UserError as e:
        row.reason = f"the library refuses it: {e}"
        return row
    st = next(r.step for r in decision.rows if r.prompts == prompts)
    row.predicted = True
    row.step = {p: getattr(st, p) for p in PHASES}
    row.step.update(offload_split(base, row.step["offload_s"], 1 if dtype in ("fp8",) else 2))
    row.inputs["placement"] = decision.placement
    row.notes += [n for n in decision.notes if n.startswith(("response lengths", "prompt ", "weight sync"))]
    row.compared, row.not_compared = compare(run.framework, row.placement, meas, row.step)
    return row


def offload_split(base: dict, offload_s: float, param_bytes: int) -> dict[str, float]:
    """The step's host copies divided between veRL's log-prob and update timers, which hold them (its FSDP and
    Megatron workers load the parameters before each pass and offload them after, the optimizer around the
    update): half the parameter copies with the log-prob pass, the rest and the optimizer's and gradients' with
    the update, by bytes (roofline.rl.offload_bytes, shards of one parameter)."""
    tr = base.get("shape", {}).get("train", {})
    p, g, o = (float(tr.get(k) or 0.0) for k in ("offload_param_copies", "offload_grad_copies",
                                                  "offload_optimizer_copies"))
    around_logprob = rf_rl.offload_bytes(1.0, 1.0, param_bytes, p / 2, 0.0, 0.0)
    total = rf_rl.offload_bytes(1.0, 1.0, param_bytes, p, g, o)
    share = around_logprob / total if total > 0 else 0.0
    return {"offload_logprob_s": share * offload_s, "offload_train_s": (1.0 - share) * offload_s}


def model_spec(name: str):
    """A preset or a config under benchmarks/data/published/models/ (published.py's resolve_spec)."""
    return resolve_spec(name)


def _primary(run: Run) -> Measurement:
    """The measurement of the config's own version (NeMo-RL), else the first."""
    own = [m for m in run.measurements if run.config_version and m.id.startswith(run.config_version)]
    return (own or run.measurements)[0]


# ---------------------------------------------------------------- published timers -> decide's phases


def implied_generation_s(placement: Optional[str], published_step_s: float, step: dict) -> Optional[float]:
    """A colocated step is its phases in turn: the published step less every other predicted phase is the
    generation time the published step implies (None where that is not positive, or not colocated)."""
    if placement != "colocated" or not step.get("gen_s"):
        return None
    implied = published_step_s - (step["step_s"] - step["gen_s"])
    return implied if implied > 0 else None


def compare(framework: str, placement: str, meas: Measurement, step: dict) -> tuple[list[Compared], list[str]]:
    """Each published timer beside the StepTime phases it measures, honestly; the rest with the reason."""
    out: list[Compared] = []
    skipped: list[str] = []
    ph = {t: v for t, v in meas.phases.items() if v is not None}
    used: set[str] = set()

    def add(timers: tuple[str, ...], phases: tuple[str, ...], note: str = "") -> None:
        present = [t for t in timers if t in ph]
        if not present:
            return
        used.update(present)
        pub = sum(ph[t] for t in present)
        if pub <= 0:
            skipped.append(f"{' + '.join(present)} = {pub:g} s: published as zero (no such pass in the run)")
            return
        pred = sum(step[p] for p in phases)
        out.append(Compared(" + ".join(present), pub, pred, "+".join(p[:-2].split("_")[0] for p in phases), pred / pub, note))

    out.append(Compared(meas.timer, meas.step_s, step["step_s"], "step", step["step_s"] / meas.step_s,
                        {"fully-async": "the trainer's step: its local updates over the published step's prompts",
                         "one-step-off": "the trainer's step, generation overlapped"}.get(placement, "")))
    if framework == "nemo-rl":
        # NeMo-RL's GRPO timers (nemo_rl/algorithms/grpo.py): generation ends with vLLM's sleep; the log-prob
        # timer takes the reference swap; prepare_for_generation holds the refit (wake, weight transfer, the
        # policy's offload to host memory)
        add(("timing/train/generation",), ("gen_s",), "ends with the engines' sleep (in the model's sync)")
        add(("timing/train/policy_and_reference_logprobs",), ("logprob_s",),
            "the reference swap from host memory is in the model's offload")
        add(("timing/train/policy_training",), ("train_s",))
        add(("timing/train/prepare_for_generation",), ("sync_s", "offload_s"),
            "the refit: engines woken, weights transferred, the policy offloaded; the model's offload also holds "
            "the reloads and reference swap NeMo-RL times elsewhere")
        if not out[1:]:
            skipped.append("gen, logprob, train, sync: NeMo-RL publishes step totals only (this row)")
            implied = implied_generation_s(placement, meas.step_s, step)
            if implied is not None:
                skipped.append(f"generation implied by the published step (the step less every other predicted "
                               f"phase): {_n(implied)} s against {_n(step['gen_s'])} s predicted (pred/implied "
                               f"{step['gen_s'] / implied:.2f})")
        return out, skipped
    if placement == "colocated":
        add(("timing_s/gen",), ("gen_s", "sync_s"), "veRL's gen timer wraps the weight resharding into vLLM, its "
            "wake-up and sleep: compared with generation + weight sync")
        add(("timing_s/generate_sequences",), ("gen_s",), "the engine's own generate call")
    elif placement == "one-step-off":
        add(("timing_s/generate_sequences",), ("gen_s",), "on the rollout GPUs, overlapping training")
    else:
        for t in ("timing_s/gen", "timing_s/generate_sequences"):
            if t in ph:
                used.add(t)
                skipped.append(f"{t} {ph[t]:g} s: the trainer's wait for samples from the rollouter, not generation")
    inside = "with the {} offload's reload and offload, which veRL times inside"
    lp, up = step.get("offload_logprob_s"), step.get("offload_train_s")
    add(("timing_s/old_log_prob", "timing_s/ref"), ("logprob_s", "offload_logprob_s") if lp else ("logprob_s",),
        inside.format("parameter") if lp else "")
    add(("timing_s/update_actor",), ("train_s", "offload_train_s") if up else ("train_s",),
        inside.format("parameter and optimizer") if up else "")
    add(("timing_s/values", "timing_s/update_critic"), ("critic_s",), "value forward pass + critic update")
    for t, v in ph.items():
        if t not in used:
            skipped.append(f"{t} {v:g} s: " + NOT_MODELLED.get(t, "no phase of the step model"))
    if placement != "colocated":
        skipped.append(f"sync {step['sync_s']:.3g} s (model): the weight sync to the rollout GPUs is not published")
    return out, skipped


# ---------------------------------------------------------------- pairs: split against colocated


_PLACEMENT_TOKEN = re.compile(r"^(colocated|onestepoff|async\d*off|fullyasync\d*)$")
_PRECISION = frozenset({"fp8", "bf16", "fp16"})  # words of a variant that must match for a pair


def pair_key(name: str) -> Optional[tuple[str, bool, frozenset]]:
    """(framework_model_algo_Ngpu_device, colocated?, the variant's other words) from a folder name."""
    head, _, variant = name.rpartition("_")
    words = variant.split("-")
    kinds = [w for w in words if _PLACEMENT_TOKEN.match(w)]
    if len(kinds) != 1 or not head:
        return None
    rest = frozenset(w for w in words[1:] if w not in kinds and not w.isdigit())
    return f"{head}_{words[0]}", kinds[0] == "colocated", rest


def pairs(rows: list[Row]) -> list[dict]:
    """Each split run beside its colocated sibling (same model, GPUs and device; the other words of the variant
    equal, or else the only colocated sibling of the same precision), per common measurement; where the
    published split step is shorter, the predicted one must be too."""
    by_run: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_run.setdefault(r.run, {})[r.measurement] = r
    keys = {name: pair_key(name) for name in by_run}
    out = []
    for off, k in keys.items():
        if k is None or k[1]:
            continue
        cols = [c for c, kc in keys.items() if kc and kc[1] and kc[0] == k[0]]
        same = [c for c in cols if keys[c][2] == k[2]]
        alike = [c for c in cols if keys[c][2] & _PRECISION == k[2] & _PRECISION]
        col = same[0] if same else (alike[0] if len(alike) == 1 else None)
        if col is None:
            continue
        for mid, ro in by_run[off].items():
            rc_ = by_run[col].get(mid)
            if rc_ is None:
                continue
            pub_off, pub_col = ro.published_step, rc_.published_step
            p = {"split": off, "colocated": col, "measurement": mid, "published_split_s": pub_off,
                 "published_colocated_s": pub_col, "published_faster": pub_off < pub_col}
            if ro.predicted and rc_.predicted:
                p.update(predicted_split_s=ro.step["step_s"], predicted_colocated_s=rc_.step["step_s"])
                p["predicted_faster"] = p["predicted_split_s"] < p["predicted_colocated_s"]
                p["ok"] = p["predicted_faster"] if p["published_faster"] else None
            else:
                p.update(predicted_faster=None, ok=None)
            if ro.inputs and rc_.inputs and ro.inputs["group"] != rc_.inputs["group"]:
                p["note"] = f"responses per prompt differ: {ro.inputs.get('group')} vs {rc_.inputs.get('group')}"
            out.append(p)
    return out


# ---------------------------------------------------------------- summary and printing


def _worst(rows: list[Row], n: int) -> list[dict]:
    def off(ratio: float) -> float:  # a phase predicted at 0 (or not at all) is the worst of all
        return abs(math.log(ratio)) if ratio > 0 else math.inf

    pairs_ = sorted(((c, r) for r in rows for c in r.compared), key=lambda cr: -off(cr[0].ratio))[:n]
    return [{"run": r.run, "measurement": r.measurement, "timer": c.timer, "model": c.model, "ratio": c.ratio}
            for c, r in pairs_]


def summary(rows: list[Row]) -> dict:
    """The targets on the runs whose config is published in full (their config's own measurement), the worst
    phases and the split/colocated pairs."""
    primary = [r for r in rows if r.primary]
    done = [r for r in primary if r.predicted]
    per_run = []
    for r in (r for r in done if r.config_complete):
        step, phases = r.compared[0], r.compared[1:]
        per_run.append({"run": r.run, "measurement": r.measurement, "lengths_published": r.lengths_published,
                        "step_ok": abs(step.ratio - 1) <= STEP_TOL,
                        "phases_ok": all(abs(c.ratio - 1) <= PHASE_TOL for c in phases), "phases": len(phases),
                        "far": [c.timer for c in r.compared if c.ratio > FAR or c.ratio < 1 / FAR]})
    both = [p for p in per_run if p["step_ok"] and p["phases_ok"]]
    pr = pairs(rows)
    checked = [p for p in pr if p["ok"] is not None]
    return {
        "runs": len(primary), "predicted": len(done),
        "not_predicted": [(r.run, r.reason) for r in primary if not r.predicted], "per_run": per_run,
        "step_within": sum(p["step_ok"] for p in per_run), "phases_within": sum(p["phases_ok"] for p in per_run),
        "both_within": len(both), "far": [(p["run"], p["far"]) for p in per_run if p["far"]],
        "target_share_met": bool(per_run) and len(both) >= SHARE * len(per_run),
        "target_far_met": not any(p["far"] for p in per_run),
        "worst": _worst(done, 8), "worst_published_lengths": _worst([r for r in done if r.lengths_published], 6),
        "pairs": pr, "pairs_checked": len(checked),
        "pairs_ok": all(p["ok"] for p in checked) if checked else None,
    }


def placement_kind(placement: Optional[str]) -> str:
    """colocated, or split (one-step-off and fully asynchronous runs: generation on GPUs of its own)."""
    return "colocated" if placement in (None, "colocated") else "split"


def spread_ratios(rows: list[Row]) -> dict[tuple[str, str], list[float]]:
    """Predicted/published step time (a step rate's published/predicted) by (framework, placement), one per run (its
    config's own measurement) whose response lengths are published: what decide's step is worth on a run whose
    lengths the user gives."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r.primary and r.predicted and r.lengths_published and r.compared and r.compared[0].model == "step":
            out.setdefault((r.framework, placement_kind(r.placement)), []).append(round(r.compared[0].ratio, 4))
    return out


def write_spread(rows: list[Row], path: Path) -> int:
    """Write the library's table of published RL steps against decide's (throughputlab/spread_rl.py)."""
    return _published.write_table(
        path, "decide's RL step model against published runs: predicted/published step time (a step rate's measured/\n"
        "predicted: below 1 the model is fast) by (framework, placement), one per run whose response lengths are\n"
        "published, read by throughputlab.spread.rl_step_spread. Written by\n"
        "`python benchmarks/rl_runs.py --write-spread throughputlab/spread_rl.py`; the runs and their sources are in\n"
        "benchmarks/data/rl_runs/.",
        f"benchmarks/data/rl_runs, {{n}} runs with published response lengths, throughputlab {__version__}",
        "RL_STEPS", "tuple[str, str]", spread_ratios(rows))


def _n(v: float) -> str:
    return f"{v:,.3g}" if v < 100 else f"{v:,.0f}"


def _verdict(ok: Optional[bool]) -> str:
    return {True: "MET", False: "NOT MET", None: "nothing to check"}[ok]


def render_row(r: Row, verbose: bool) -> list[str]:
    tag = f"{r.framework} {r.placement or '?'}, config {'complete' if r.config_complete else 'partial'}"
    head = f"== {r.run}" + (f" [{r.measurement}]" if r.measurement != "published" else "") + f"  ({tag}"
    lines = [head + (")" if r.primary else "; another version's row, not in the targets)")]
    if not r.predicted:
        return lines + [f"   NOT PREDICTED: {r.reason}"]
    i = r.inputs
    lines += [f"   {i['model']} on {i['gpus']} x {i['device']} ({i['nodes']} node(s)), engines TP {i['tp']}, "
              f"{i['dtype']}; {i['prompts']} prompts x {i['group']}; {i['placement']}",
              f"   prompt: {i['prompt_len'] or 'the cap'} ({i['prompt_len_source']}); responses: "
              f"{i['response_dist'] or 'the config default'} ({i['response_source']})",
              "   model phases (s): " + ", ".join(f"{k[:-2]} {_n(v)}" for k, v in r.step.items() if v and k in PHASES),
              f"   {'timer':<44} {'published':>9} {'predicted':>9}  {'model':<10} {'pred/pub':>8}"]
    for c in r.compared:
        flag = "" if abs(c.ratio - 1) <= (STEP_TOL if c.model == "step" else PHASE_TOL) else "  *"
        flag += " >2x" if c.ratio > FAR or c.ratio < 1 / FAR else ""
        lines.append(f"   {c.timer:<44} {_n(c.published):>9} {_n(c.predicted):>9}  {c.model:<10} {c.ratio:>8.2f}{flag}")
        if verbose and c.note:
            lines.append(f"      ({c.note})")
    lines += [f"   not compared: {x}" for x in r.not_compared]
    if verbose:
        lines += [f"   note: {n}" for n in r.notes] + [f"   {c}" for c in r.config_lines]
    return lines


def render_summary(rows: list[Row], s: dict) -> list[str]:
    n = len(s["per_run"])
    lp = [p for p in s["per_run"] if p["lengths_published"]]
    by_run = {(r.run, r.measurement): r for r in rows}
    lines = [f"Summary: {s['runs']} runs, {s['predicted']} predicted, {s['runs'] - s['predicted']} not"]
    lines += [f"  not predicted: {run}: {why}" for run, why in s["not_predicted"]]
    lines += ["", f"  Runs with the config in full, predicted at their config's measurement: {n} ({len(lp)} with "
                  f"published response lengths L, {n - len(lp)} with decide's default lengths D)",
              f"  {'run':<66} {'len':<3} {'step':>5}  phases (pred/pub)"]
    for p in s["per_run"]:
        r = by_run[(p["run"], p["measurement"])]
        ph = ", ".join(f"{c.model} {c.ratio:.2f}" for c in r.compared[1:])
        lines.append(f"  {p['run'][:66]:<66} {'L' if p['lengths_published'] else 'D':<3} "
                     f"{r.compared[0].ratio:>5.2f}  {ph or '(step only)'}")
    timed = [p for p in s["per_run"] if p["phases"]]
    lines += ["", f"  step within 15%: {s['step_within']}/{n}; every published phase within 25%: "
                  f"{s['phases_within']}/{n} (runs that publish phases: {sum(p['phases_ok'] for p in timed)}/"
                  f"{len(timed)}); both: {s['both_within']}/{n} (L runs: "
                  f"{sum(p['step_ok'] and p['phases_ok'] for p in lp)}/{len(lp)})",
              f"  target, step within 15% and every phase within 25% on at least 80% of them: "
              f"{_verdict(s['target_share_met'] if n else None)} ({s['both_within']}/{n})",
              f"  target, no phase off by more than 2x: {_verdict(s['target_far_met'] if n else None)}"]
    lines += [f"    off by more than 2x: {run}: {', '.join(t)}" for run, t in s["far"]]
    for key, title in (("worst", "all predicted rows"), ("worst_published_lengths", "rows with published lengths")):
        lines.append(f"  worst phases, {title} (pred/pub):")
        lines += [f"    {w['ratio']:6.2f}  {w['timer']} ({w['model']})  {w['run']}"
                  + (f" [{w['measurement']}]" if w["measurement"] != "published" else "") for w in s[key]]
    lines.append(f"  target, split runs predicted faster than their colocated siblings where the published ones are: "
                 f"{_verdict(s['pairs_ok'])} ({s['pairs_checked']} pair rows checked)")
    for p in s["pairs"]:
        pred = (f"predicted {_n(p['predicted_split_s'])} vs {_n(p['predicted_colocated_s'])}"
                if p.get("predicted_split_s") is not None else "not predicted")
        verdict = {True: "ok", False: "WRONG", None: "not checked"}[p["ok"]]
        lines.append(f"    {verdict:<11} {p['split']} [{p['measurement']}] vs {p['colocated']}: published "
                     f"{_n(p['published_split_s'])} vs {_n(p['published_colocated_s'])}, {pred}"
                     + (f" ({p['note']})" if p.get("note") else ""))
    implied = [(r, implied_generation_s(r.placement, r.published_step, r.step)) for r in rows
               if r.primary and r.predicted and len(r.compared) == 1]
    implied = [(r, g) for r, g in implied if g is not None]
    if implied:
        lines.append("  colocated rows that publish the step alone: the generation their step implies (the published "
                     "step less every other predicted phase) against the predicted generation:")
        lines += [f"    pred/implied {r.step['gen_s'] / g:4.2f}  {_n(r.step['gen_s']):>5} s vs {_n(g):>5} s  "
                  f"{r.inputs['gpus']} x {r.inputs['device']}  {r.run}"
                  + (f" [{r.measurement}]" if r.measurement != "published" else "")
                  for r, g in sorted(implied, key=lambda x: x[0].step["gen_s"] / x[1])]
    return lines


def render(rows: list[Row], s: dict, capped: bool, verbose: bool) -> str:
    lib = Path(throughputlab.__file__).parent
    lines = [f"Published RL runs against `throughputlab decide` (analytic profiles; throughputlab {__version__} from "
             f"{_rel(lib)}/)",
             "response lengths: " + (f"capped:mean=M,clip=C,max=L where the clip ratio is published, else "
                                     f"capped:mean=M,sigma={runconfig.RESPONSE_SIGMA:g},max=L (M the published mean, "
                                     "after the cut; the share at the cap implied by a lognormal cut there)"
                                     if capped else "the capped form is not in parse_length_dist yet, so "
                                     f"lognormal:mean=M,sigma={runconfig.RESPONSE_SIGMA:g},max=L (M taken as the mean "
                                     "before the cut)"),
             "pred/pub flags: * outside the target (step 15%, phase 25%), >2x off by more than 2x", ""]
    for r in rows:
        lines += render_row(r, verbose) + [""]
    return "\n".join(lines + render_summary(rows, s)) + "\n"


def run_all(runs: list[Run]) -> list[Row]:
    capped = capped_form_available()
    with tempfile.TemporaryDirectory(prefix="rl_runs_") as tmp:
        return [predict_row(run, m, Path(tmp), capped) for run in runs for m in run.measurements]


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", default=[], metavar="SUBSTR",
                    help="only the run folders whose name contains SUBSTR (repeatable)")
    ap.add_argument("-v", "--verbose", action="store_true",
                    help="show the notes, the timer mapping and the config as decide read it, per run")
    ap.add_argument("--json", metavar="FILE", type=Path, help="also write every row and the summary here")
    ap.add_argument("--group-corr", metavar="R", type=float, default=0.0,
                    help="what if a prompt's responses share R (0 to 1) of their log-length spread "
                         "(--response-dist's group_corr; no published run gives it, so 0 by default); applied to the "
                         "runs with published lengths, the others keep decide's default from their config")
    ap.add_argument("--write-spread", metavar="FILE", type=Path,
                    help="also write the step ratios by framework and placement as the library's table "
                         "(throughputlab/spread_rl.py), which decide states its step times' band from")
    ap.add_argument("--data", metavar="DIR", type=Path, default=DATA_DIR, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write_spread and (args.run or args.group_corr):
        print("--write-spread takes every run as published: leave out --run and --group-corr", file=sys.stderr)
        return 2
    if not 0 <= args.group_corr < 1:
        print(f"--group-corr is a share from 0 up to but not including 1, got {args.group_corr}", file=sys.stderr)
        return 2
    global GROUP_CORR
    GROUP_CORR = args.group_corr
    try:
        runs = load_runs(args.data, tuple(args.run))
    except DataError as e:
        print(f"malformed data file: {e}", file=sys.stderr)
        return 2
    if not runs:
        print("no runs match the selection")
        return 0
    rows = run_all(runs)
    s = summary(rows)
    sys.stdout.write(render(rows, s, capped_form_available(), args.verbose))
    if args.write_spread:
        print(f"wrote {write_spread(rows, args.write_spread)} step ratios to {args.write_spread}")
    if args.json:
        report = {"throughputlab": __version__, "rows": [asdict(r) for r in rows], "summary": s}
        try:
            args.json.write_text(json.dumps(report, indent=1, default=str) + "\n", encoding="utf-8")
        except OSError as e:
            print(f"cannot write {args.json}: {e.strerror or e}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
