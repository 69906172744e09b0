"""`throughputlab decide`: parse the spec file and the common flags, decide, print and save."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from throughputlab.errors import UserError

COLUMN_KEYS = ("run", "batch", "lr", "samples", "step", "metric")
ENGINE_KEYS = ("max_num_seqs", "max_model_len", "kv_cache_gib", "enforce_eager", "max_num_batched_tokens")


def _read_spec(path: Path) -> dict[str, Any]:
    """A decide spec, read as every command reads one: JSON by a .json suffix, else YAML."""
    from throughputlab.files import read_settings

    json_file = path.suffix.lower() == ".json"
    what = f"a {'JSON' if json_file else 'YAML'} decide spec"
    return read_settings(path, what, f"--spec {path}", yaml=not json_file)


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UserError(f"{option} takes comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{option} takes comma-separated positive integers, got {text!r}")
    return values


def _set(d: dict, path: str, value: Any) -> None:
    if value is None:
        return
    *parents, last = path.split(".")
    for p in parents:
        d = d.setdefault(p, {})
        if not isinstance(d, dict):
            raise UserError(f"--spec: {p} must be a mapping")
    d[last] = value


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def build_spec(spec_file: Optional[Path], base: Optional[dict] = None, **flags: Any):
    """The DecideSpec: ``base`` (a run's --config), the spec file over it, the flags over both."""
    from pydantic import ValidationError

    from throughputlab.decide.calculator import DecideSpec

    data = _merged(base or {}, _read_spec(spec_file) if spec_file else {})
    f = flags
    if f.get("response_lengths") and f.get("response_dist"):
        raise UserError("give one of --response-lengths FILE and --response-dist, not both")
    if f.get("curves") and f.get("nstar"):
        raise UserError("give one of --curves CSV and --nstar, not both")
    _set(data, "profile", f.get("profile"))
    _set(data, "prompts", _int_list(f["prompts"], "--prompts") if f.get("prompts") else None)
    _set(data, "group", f.get("group"))
    _set(data, "baseline", f.get("baseline"))
    _set(data, "shape.prompt_len", f.get("prompt_len"))
    _set(data, "shape.algo", f.get("algo"))
    _set(data, "shape.overlap", f.get("overlap"))
    _set(data, "shape.seed", f.get("seed"))
    if f.get("response_lengths"):
        data.setdefault("shape", {})["response"] = {"file": f["response_lengths"]}
    if f.get("response_dist"):
        data.setdefault("shape", {})["response"] = {"dist": f["response_dist"]}
    if f.get("curves"):
        samples = data.setdefault("samples", {})
        samples.pop("nstar", None)
        samples.setdefault("curves", {})
        if not isinstance(samples["curves"], dict):
            raise UserError("--spec: samples.curves must be a mapping")
        samples["curves"]["path"] = f["curves"]
    if f.get("nstar"):
        samples = data.setdefault("samples", {})
        samples.pop("curves", None)
        samples["nstar"] = f["nstar"]
    _set(data, "samples.target", f.get("target"))
    _set(data, "samples.direction", f.get("direction"))
    for item in f.get("columns") or ():
        key, eq, name = item.partition("=")
        if not eq or key not in COLUMN_KEYS or not name:
            raise UserError(f"--column {item!r}: use KEY=NAME with KEY one of {', '.join(COLUMN_KEYS)}")
        _set(data, f"samples.curves.columns.{key}", name)
    _set(data, "lr.ref", f.get("lr_ref"))
    _set(data, "lr.rule", f.get("lr_rule"))
    for key in ("gpus", "nodes", "placement", "gen_gpus", "engine_tp", "gpu_memory_utilization"):
        _set(data, f"cluster.{key}", f.get(key))
    if f.get("activation_checkpointing"):
        _set(data, "shape.train.activation_checkpointing", True)
    _set(data, "shape.partial_rollout", f.get("partial_rollout"))
    for key in ENGINE_KEYS:
        _set(data, f"shape.engine.{key}", f.get(key))
    try:
        return DecideSpec.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "the spec"
        raise UserError(f"spec setting {where}: {err['msg']} ({e.error_count()} problem(s) in all)") from None


@click.command(context_settings={"show_default": True})
@click.option("--spec", "spec_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="RL shape and decision settings (YAML or JSON); the flags below override it.")
@click.option("--config", "config_file", default=None, metavar="FILE",
              help="The RL run's own launch config: veRL's YAML (or the log that prints it), a NeMo-RL recipe, an "
                   "OpenRLHF command line, a TRL GRPOConfig. Its knobs become the settings below; the spec file and "
                   "the flags override them.")
@click.option("--config-set", "config_sets", multiple=True, metavar="KEY=VALUE",
              help="An override of the config, as the framework's command line takes it (repeatable).")
@click.option("--framework", type=click.Choice(["verl", "nemo-rl", "openrlhf", "trl"]), default=None,
              help="The config's framework. [default: from its content]")
@click.option("--profile", "-p", default=None, help="Profile JSON, measured (`bench`) or predicted (`predict`).")
@click.option("--prompts", default=None, help="Candidate prompts per step, e.g. 128,256,512,1024.")
@click.option("--group", type=int, default=None, help="Responses per prompt (group size). [spec default: 8]")
@click.option("--baseline", type=int, default=None, help="Baseline prompts per step. [default: the smallest]")
@click.option("--prompt-len", type=int, default=None, help="Prompt tokens per request. [spec default: 512]")
@click.option("--response-lengths", default=None, metavar="FILE", help="Observed response lengths (tokens), one per line.")
@click.option("--response-dist", default=None, metavar="FORM",
              help="lognormal:mean=..,sigma=..,max=.. | uniform:min=..,max=.. | fixed:len=..")
@click.option("--curves", default=None, metavar="CSV", help="Learning curves, one row per logged step.")
@click.option("--target", type=float, default=None, help="Metric value to reach (with --curves).")
@click.option("--direction", type=click.Choice(["max", "min"]), default=None, help="Whether the metric rises or falls to the target. [spec default: max]")
@click.option("--column", "columns", multiple=True, metavar="KEY=NAME",
              help="Curves column names, KEY in run, batch, lr, samples, step, metric (repeatable).")
@click.option("--nstar", default=None, metavar="FORM", help="flat[:N=..,lo=..,hi=..] | mcandlish:N_min=..,B_noise=..")
@click.option("--lr-ref", type=float, default=None, help="Learning rate tuned at the baseline batch.")
@click.option("--lr-rule", type=click.Choice(["sqrt", "linear", "none"]), default=None, help="Learning-rate retuning rule.")
@click.option("--algo", type=click.Choice(["grpo", "ppo"]), default=None, help="PPO adds a critic. [spec default: grpo]")
@click.option("--overlap", type=click.Choice(["colocated", "separate", "off-policy"]), default=None,
              help="Phases in sequence on shared or separate devices, or one-step off-policy overlap. [spec default: colocated]")
@click.option("--seed", type=int, default=None, help="Seed for the response lengths drawn per batch.")
@click.option("--gpus", type=int, default=None, help="Devices in the cluster. [default: the profile's]")
@click.option("--nodes", type=int, default=None, help="Machines the devices are spread over. [default: 1]")
@click.option("--placement", type=click.Choice(["colocated", "split", "search"]), default=None,
              help="colocated: every device generates, then every device trains (veRL's hybrid engine); split: "
                   "--gen-gpus generate while the rest train, one step off-policy; search: every placement and "
                   "engine size that fits, ranked by time-to-target. [default: colocated]")
@click.option("--gen-gpus", type=int, default=None, help="Split placement: devices that generate.")
@click.option("--engine-tp", type=int, default=None, help="Devices per generation engine. [default: the profile's]")
@click.option("--gpu-memory-utilization", type=float, default=None,
              help="The engines' share of device memory (KV cache = share - weights). [default: 0.5 colocated, "
                   "0.9 split]")
@click.option("--max-num-seqs", type=int, default=None,
              help="Sequences an engine runs at once (rollout.max_num_seqs). [default: 1024, veRL's]")
@click.option("--max-model-len", type=int, default=None,
              help="The engines' max_model_len (sizes vLLM's profile run). [default: the profile's engine's]")
@click.option("--max-num-batched-tokens", type=int, default=None,
              help="The chunked-prefill token budget per engine step. [default: the profile's engine's]")
@click.option("--kv-cache-gib", type=float, default=None,
              help="The KV-cache memory per GPU the engine logged, instead of the engine's rule.")
@click.option("--enforce-eager/--no-enforce-eager", default=None,
              help="Engines without CUDA graphs (rollout.enforce_eager): the launches of every layer in each decode "
                   "step. A predicted profile's engine only. [default: as the profile's engine]")
@click.option("--activation-checkpointing", is_flag=True, default=None,
              help="Training recomputes each block's forward (veRL's default): 4x instead of 3x forward FLOPs.")
@click.option("--against", default=None, metavar="LOG",
              help="RL run log (veRL JSONL, TRL trainer_state.json, CSV): per phase, its time beside the model's "
                   "for the same batch, response lengths and devices, and the ratio.")
@click.option("--calibrate-from", default=None, metavar="LOG",
              help="RL run log: fit per-phase factors (logged / predicted) and decide with the calibrated times.")
@click.option("--log-format", type=click.Choice(["verl", "trl", "csv"]), default=None,
              help="The run log's format. [default: from the file]")
@click.option("--log-column", "log_columns", multiple=True, metavar="NAME=KEY",
              help="Read phase NAME from the log's key or column KEY (repeatable), as in `import runlog --column`.")
@click.option("--log-prompts", type=int, default=None,
              help="Prompts per step of the logged run. [default: the single --prompts value]")
@click.option("--against-prompts", type=int, default=None,
              help="Prompts per step of the --against run when it differs from the --calibrate-from run's: a "
                   "calibration checked at another batch size.")
@click.option("--partial-rollout", type=float, default=None, metavar="OVER",
              help="Partial rollouts (APRIL): OVER more prompts in flight as a share of the batch (0.25: 25%), "
                   "generation ends when the batch is done, unfinished responses resume next step. [default: 0]")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the decision as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write an HTML report.")
def decide(spec_file: Optional[Path], json_out: Optional[Path], html_out: Optional[Path], config_file: Optional[str],
           config_sets: tuple[str, ...], framework: Optional[str], **flags) -> None:
    """Which RL batch size reaches the target reward soonest: T(B) = N*(B) / q(B).

    \b
    Example:
      throughputlab decide --profile prof.json --prompts 128,256,512,1024 --group 8 \\
        --prompt-len 512 --response-dist lognormal:mean=600,sigma=0.7,max=2048 \\
        --curves runs.csv --target 0.7 --lr-rule sqrt --html decide.html
    """
    from throughputlab.decide.against import LOG_FLAGS, LogChecks
    from throughputlab.decide.calculator import decide_from_spec
    from throughputlab.decide.report import decision_section, decision_text, placements_section, placements_text

    logs = {k: flags.pop(k) for k in LOG_FLAGS}
    base = None
    if config_file:
        from throughputlab.decide import runconfig

        base, lines = runconfig.read(config_file, config_sets, framework)
        click.echo("\n".join(lines) + "\n")
    elif config_sets or framework:
        raise UserError("--config-set and --framework go with --config FILE (the run's launch config)")
    spec = build_spec(spec_file, base, **flags)
    checks = LogChecks(spec, **logs) if any(logs.values()) else None
    if checks is not None:
        spec = checks.spec
        click.echo(checks.text())
        click.echo("")
    decisions = decide_from_spec(spec, adjust_step=checks.hook if checks else None)
    for d in decisions if checks else ():
        d.notes[:0] = checks.notes()
    if len(decisions) > 1:
        click.echo(placements_text(decisions))
        click.echo("")
        click.echo(f"best placement: {decisions[0].placement}")
    click.echo(decision_text(decisions[0]))
    if json_out:
        import json

        data = decisions[0].model_dump(mode="json")
        if len(decisions) > 1:
            data = {**data, "placements": [d.model_dump(mode="json") for d in decisions]}
        if checks is not None:
            data = {**data, **checks.json()}
        _write(json_out, json.dumps(data, indent=1), "--json")
        click.echo(f"wrote {json_out}")
    if html_out:
        from throughputlab.report.page import render_html

        sections = [decision_section(decisions[0])]
        if len(decisions) > 1:
            sections.insert(0, placements_section(decisions))
        page = render_html("throughputlab decide", sections, subtitle=f"profile {spec.profile}")
        _write(html_out, page, "--html")
        click.echo(f"wrote {html_out}")


def _write(path: Path, text: str, option: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
