"""`throughputlab decide`: parse the spec file and the common flags, decide, print and save."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import click

from throughputlab.errors import UserError
from throughputlab.settings.options import layer_options

COLUMN_KEYS = ("run", "batch", "lr", "samples", "step", "metric")
ENGINE_KEYS = ("max_num_seqs", "max_model_len", "kv_cache_gib", "enforce_eager", "max_num_batched_tokens",
               "in_process_logprobs", "distributed_executor_backend")
# flag (click parameter name) -> the decide settings key it sets; the settings model holds the defaults
DECIDE_FLAGS = {
    "profile": "profile", "prompts": "prompts", "group": "group", "baseline": "baseline",
    "prompt_len": "shape.prompt_len", "algo": "shape.algo", "overlap": "shape.overlap", "seed": "shape.seed",
    "target": "samples.target", "direction": "samples.direction", "lr_ref": "lr.ref", "lr_rule": "lr.rule",
    **{k: f"cluster.{k}" for k in ("gpus", "nodes", "placement", "gen_gpus", "engine_tp", "gpu_memory_utilization",
                                  "sleep_level")},
    "activation_checkpointing": "shape.train.activation_checkpointing", "partial_rollout": "shape.partial_rollout",
    "off_policy_steps": "shape.off_policy_steps", "train_backend": "shape.train.backend",
    **{f"train_{k}": f"shape.train.{k}" for k in ("tp", "pp", "ep")}, "sequence_parallel": "shape.train.sequence_parallel",
    **{k: f"shape.engine.{k}" for k in ENGINE_KEYS},
}
# flags that set a section in their own way (they replace what the spec file gave there)
SHAPED_FLAGS = ("response_lengths", "response_dist", "curves", "nstar", "columns")


def settings():
    from throughputlab.decide.calculator import DecideSpec
    from throughputlab.settings import Settings

    return Settings(DecideSpec, "decide")


def decide_option(*decls: str, **kw):
    from throughputlab.decide.calculator import DecideSpec
    from throughputlab.settings.options import setting_option

    return setting_option(DecideSpec, DECIDE_FLAGS[decls[-1]], *decls, **kw)


def section_option(*decls: str, key: str, with_default: bool = False, shown: Optional[str] = None,
                   shown_key: Optional[str] = None, **kw):
    """A flag that sets a section in its own way (SHAPED_FLAGS), its help from the key's description."""
    from throughputlab.decide.calculator import DecideSpec
    from throughputlab.settings.options import described

    help = described(DecideSpec, key, shown=shown, with_default=with_default, shown_key=shown_key)
    return click.option(*decls, default=None, help=help, **kw)


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",")]
    except ValueError:
        raise UserError(f"{option} takes comma-separated positive integers, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise UserError(f"{option} takes comma-separated positive integers, got {text!r}")
    return values


def flag_layer(flags: dict[str, Any], names: Optional[dict[str, str]] = None):
    """The flags given (None: not given) as one settings layer; a flag that sets a whole section
    (--response-lengths, --curves, --nstar) replaces what the spec file holds there."""
    from throughputlab.settings import as_layer

    f = {k: v for k, v in flags.items() if v is not None and v != ()}
    unknown = sorted(set(f) - set(DECIDE_FLAGS) - set(SHAPED_FLAGS))
    if unknown:  # a caller's mistake, not a user's
        raise TypeError(f"build_spec: no such flag {', '.join(unknown)}")
    if f.get("response_lengths") and f.get("response_dist"):
        raise UserError("give one of --response-lengths FILE and --response-dist, not both")
    if f.get("curves") and f.get("nstar"):
        raise UserError("give one of --curves CSV and --nstar, not both")
    if f.get("activation_checkpointing") is False:  # the bare flag turns it on; absent, the spec decides
        del f["activation_checkpointing"]
    if "prompts" in f and isinstance(f["prompts"], str):
        f["prompts"] = _int_list(f["prompts"], "--prompts")
    flat = {DECIDE_FLAGS[k]: v for k, v in f.items() if k in DECIDE_FLAGS}
    drops: list[str] = []
    for flag, form in (("response_lengths", "file"), ("response_dist", "dist")):
        if f.get(flag):
            flat[f"shape.response.{form}"] = f[flag]
            drops.append("shape.response")
    if f.get("curves"):
        flat["samples.curves.path"] = f["curves"]
        drops.append("samples.nstar")
    if f.get("nstar"):
        flat["samples.nstar"] = f["nstar"]
        drops.append("samples.curves")
    for item in f.get("columns") or ():
        key, eq, name = item.partition("=")
        if not eq or key not in COLUMN_KEYS or not name:
            raise UserError(f"--column {item!r}: use KEY=NAME with KEY one of {', '.join(COLUMN_KEYS)}")
        flat[f"samples.curves.columns.{key}"] = name
    names = names or {k: "--" + k.replace("_", "-") for k in DECIDE_FLAGS}
    return as_layer("options", flat, {DECIDE_FLAGS[k]: names[k] for k in f if k in DECIDE_FLAGS}, tuple(drops))


def build_spec(spec_file: Optional[Path], base: Optional[dict] = None, set_items: tuple[str, ...] = (),
               names: Optional[dict[str, str]] = None, **flags: Any):
    """The DecideSpec, in layers: ``base`` (a run's --config) < the spec file < the flags < ``--set``."""
    from throughputlab.settings import parse_set, read_spec_file

    layers = [read_spec_file(spec_file, "decide")] if spec_file else []
    layers.append(flag_layer(flags, names))
    layers += [parse_set(item) for item in set_items]
    return settings().resolve(layers, base)


@click.command()
@layer_options("decide", "shape.engine.max_num_seqs=256, --set cluster.placement=search")
@click.option("--config", "config_file", default=None, metavar="FILE",
              help="The RL run's own launch config: veRL's YAML (or the log that prints it), a NeMo-RL recipe, an "
                   "OpenRLHF command line, a TRL GRPOConfig. Its knobs become the settings below; the spec file, "
                   "the flags and --set override them.")
@click.option("--config-set", "config_sets", multiple=True, metavar="KEY=VALUE",
              help="An override of the config, as the framework's command line takes it (repeatable).")
@click.option("--framework", type=click.Choice(["verl", "nemo-rl", "openrlhf", "trl"]), default=None,
              help="The config's framework. [default: from its content]")
@decide_option("--profile", "-p", "profile")
@decide_option("--prompts", "prompts", shown="the batch sizes in the curves")
@decide_option("--group", "group", type=int)
@decide_option("--baseline", "baseline", type=int, shown="the smallest")
@decide_option("--prompt-len", "prompt_len", type=int)
@section_option("--response-lengths", metavar="FILE", key="shape.response.file")
@section_option("--response-dist", metavar="FORM", key="shape.response.dist", with_default=True)
@section_option("--curves", metavar="CSV", key="samples.curves.path")
@decide_option("--target", "target", type=float)
@decide_option("--direction", "direction", type=click.Choice(["max", "min"]))
@section_option("--column", "columns", multiple=True, metavar="KEY=NAME", key="samples.curves.columns",
                shown_key="samples.curves.columns.KEY")
@section_option("--nstar", metavar="FORM", key="samples.nstar", with_default=True)
@decide_option("--lr-ref", "lr_ref", type=float, shown="the baseline's")
@decide_option("--lr-rule", "lr_rule", type=click.Choice(["sqrt", "linear", "none"]))
@decide_option("--algo", "algo", type=click.Choice(["grpo", "ppo"]))
@decide_option("--overlap", "overlap", type=click.Choice(["colocated", "separate", "off-policy"]))
@decide_option("--off-policy-steps", "off_policy_steps", type=int, metavar="K")
@decide_option("--seed", "seed", type=int)
@decide_option("--gpus", "gpus", type=int, shown="the profile's")
@decide_option("--nodes", "nodes", type=int)
@decide_option("--placement", "placement", type=click.Choice(["colocated", "split", "search"]))
@decide_option("--gen-gpus", "gen_gpus", type=int)
@decide_option("--engine-tp", "engine_tp", type=int, shown="the profile's")
@decide_option("--gpu-memory-utilization", "gpu_memory_utilization", type=float, shown="0.5 colocated, 0.9 split")
@decide_option("--sleep-level", "sleep_level", type=click.IntRange(1, 2))
@decide_option("--max-num-seqs", "max_num_seqs", type=int, shown="1024, veRL's")
@decide_option("--max-model-len", "max_model_len", type=int, shown="the profile's engine's")
@decide_option("--max-num-batched-tokens", "max_num_batched_tokens", type=int, shown="the profile's engine's")
@decide_option("--kv-cache-gib", "kv_cache_gib", type=float, shown="the engine's rule")
@decide_option("--enforce-eager/--no-enforce-eager", "enforce_eager", shown="as the profile's engine")
@decide_option("--in-process-logprobs", "in_process_logprobs", type=click.Choice(["off", "ids", "text"]),
               shown="as the profile's engine, or as --config's framework runs it")
@decide_option("--distributed-executor-backend", "distributed_executor_backend",
               type=click.Choice(["mp", "uni", "external_launcher", "ray"]),
               shown="as the profile's engine, or as --config's framework runs it")
@decide_option("--activation-checkpointing", "activation_checkpointing", is_flag=True)
@decide_option("--train-backend", "train_backend", type=click.Choice(["fsdp", "megatron"]))
@decide_option("--train-tp", "train_tp", type=int)
@decide_option("--train-pp", "train_pp", type=int)
@decide_option("--train-ep", "train_ep", type=int)
@decide_option("--sequence-parallel", "sequence_parallel", type=int, metavar="K")
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
@decide_option("--partial-rollout", "partial_rollout", type=float, metavar="OVER")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write the decision as JSON.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="Write an HTML report.")
@click.pass_context
def decide(ctx: click.Context, spec_file: Optional[Path], set_items: tuple[str, ...], print_spec: bool,
           json_out: Optional[Path], html_out: Optional[Path], config_file: Optional[str],
           config_sets: tuple[str, ...], framework: Optional[str], **flags) -> None:
    """Which RL batch size reaches the target reward soonest: T(B) = N*(B) / q(B).

    The settings are one tree (`--print-spec` shows it), built in this order, later winning: the
    defaults < --config FILE (the run's launch config) < --spec FILE < the flags below < --set
    KEY=VALUE. The run-log flags (--against, --calibrate-from, ...) are outside it.

    \b
    Example:
      throughputlab decide --profile prof.json --prompts 128,256,512,1024 --group 8 \\
        --prompt-len 512 --response-dist lognormal:mean=600,sigma=0.7,max=2048 \\
        --curves runs.csv --target 0.7 --lr-rule sqrt --html decide.html
    """
    from throughputlab.decide.against import LOG_FLAGS
    from throughputlab.decide.report import decision_section, decision_text, placements_section, placements_text
    from throughputlab.settings.options import flag_names, given
    from throughputlab.settings.options import print_spec as echo_spec

    logs = {k: flags.pop(k) for k in LOG_FLAGS}
    base, config_record, config_text, lengths_line = None, None, None, None
    if config_file:
        from throughputlab.decide import runconfig

        base, lines, config_record = runconfig.read(config_file, config_sets, framework)
        typed = given(ctx, flags)
        if "placement" in typed:  # the flag's placement replaces the config's, with its knobs
            runconfig.drop_placement(base, config_record)
            lines.append(f"  --placement {flags['placement']} replaces the config's placement and its GPU split")
        log_option = "--calibrate-from" if logs.get("calibrate_from") else "--against" if logs.get("against") else None
        lengths_line = runconfig.lengths_from_logs(base, log_option) if log_option else None
        if "group" in typed and config_record["framework"] == "verl":
            lines += [x for x in [runconfig.regroup(base, flags["group"])] if x]
        lines += runconfig.overridden_lines(base, {flag_names(ctx)[k]: (DECIDE_FLAGS[k], v) for k, v in typed.items()
                                                   if k in DECIDE_FLAGS and k != "placement"})
        config_text = "\n".join(lines) + "\n"
    elif config_sets or framework:
        raise UserError("--config-set and --framework go with --config FILE (the run's launch config)")
    try:
        spec = build_spec(spec_file, base, set_items, flag_names(ctx), **given(ctx, flags))
        decided = None if print_spec else _decide(spec, logs)
    except UserError as e:
        raise _with_config_keys(e, config_record, ctx) from None
    if config_text and lengths_line and "response" not in spec.shape.model_fields_set:
        config_text += lengths_line + "\n"
    if print_spec:
        if config_text:
            click.echo(config_text, err=True)  # stdout is the spec file
        echo_spec(spec)
        return
    decisions, checks = decided
    if config_text:
        click.echo(config_text)
    if checks is not None:
        click.echo(checks.text())
        click.echo("")
    for d in decisions if checks else ():
        d.notes[:0] = checks.notes()
    profile = _profile(spec.profile)
    if config_record and config_record["model"] and profile is not None:
        from throughputlab.decide.runconfig import model_mismatch

        warning = model_mismatch(config_record["model"], profile.model.name)
        if warning:
            click.echo(f"warning: {warning}\n")
            for d in decisions:
                d.notes.insert(0, warning)
    if not logs.get("calibrate_from") and profile is not None and profile.kind == "predicted":
        # a prediction's step, whose band the published RL runs give (a calibrated or measured step has its own error)
        from throughputlab.decide.notes import step_band

        own = not _default_lengths(spec, base) or bool(logs.get("against"))
        for d in decisions:
            note = step_band(d, config_record["framework"] if config_record else None)
            if note:
                d.notes.append(note + ("" if own else "; the band is for runs priced at their own response lengths, "
                                       "and these are decide's default: give --response-dist, or --against a log"))
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
        if config_record is not None:
            data = {**data, "config": config_record}
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


def _decide(spec, logs: dict):
    """The decisions and the log checks. Every refusal comes before anything is printed: the config's listing
    and the log checks follow the decision."""
    from throughputlab.decide.against import LogChecks
    from throughputlab.decide.calculator import decide_from_spec

    checks = LogChecks(spec, **logs) if any(logs.values()) else None
    if checks is not None:
        spec = checks.spec
    return decide_from_spec(spec, adjust_step=checks.hook if checks else None), checks


def _default_lengths(spec, base: Optional[dict]) -> bool:
    """Whether the response lengths are decide's default: the shape's own, or the half-cap mean a config's caps give."""
    from throughputlab.decide.shape import RLShape

    assumed = [RLShape().response]
    config_dist = ((base or {}).get("shape") or {}).get("response", {}).get("dist")
    if config_dist:
        assumed.append(RLShape().response.model_copy(update={"dist": config_dist}))
    return spec.shape.response in assumed


def _profile(path: Optional[str]):
    """The decision's profile, read once for the notes after the decision (None without one)."""
    from throughputlab.records.profile import Profile

    return Profile.load(path) if path else None


def _with_config_keys(e: UserError, record: Optional[dict], ctx: click.Context) -> UserError:
    """A refusal that rests on values the config set, with the file and those keys named."""
    if record is None:
        return e
    from throughputlab.decide.runconfig import config_keys_behind

    given_flags = {o for p in ctx.command.params if p.opts
                   and ctx.get_parameter_source(p.name) == click.core.ParameterSource.COMMANDLINE for o in p.opts}
    keys = config_keys_behind(str(e), record, given_flags)
    if not keys or str(record["file"]) in str(e):
        return e
    return UserError(f"{e} (from --config {record['file']}: {', '.join(keys)})")


def _write(path: Path, text: str, option: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as e:
        raise UserError(f"{option} {path}: cannot write it ({e.strerror or e})") from None
