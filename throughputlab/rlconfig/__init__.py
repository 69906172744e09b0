"""An RL run's own launch config (veRL, NeMo-RL, OpenRLHF, TRL) read into a framework-neutral
``RunConfig``: what the step-time model needs, each key of the file either read (and into what) or
ignored (and why).

``read_run_config(path, overrides)`` tells the framework from the file's content (or takes the one
it is told), applies ``a.b.c=value`` overrides as the framework's command line would, and raises a
one-line ``UserError`` naming the file and the key for anything it cannot read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional, Union

from pydantic import ValidationError

from throughputlab.errors import UserError
from throughputlab.files import first_error
from throughputlab.rlconfig import hydra, interp, nemo_rl, openrlhf, trl, verl
from throughputlab.rlconfig.common import Ctx, deep_merge
from throughputlab.rlconfig.model import FRAMEWORK_NAMES, Knob, RunConfig
from throughputlab.rlconfig.nemo_rl_rules import RULES as NEMO_RL_RULES
from throughputlab.rlconfig.sources import Source, read_source, with_overrides
from throughputlab.rlconfig.verl_rules import RULES as VERL_RULES

__all__ = ["FRAMEWORKS", "Knob", "RunConfig", "detect", "read_run_config"]

FRAMEWORKS = tuple(FRAMEWORK_NAMES)
_ALIASES = {"verl": "verl", "nemo-rl": "nemo-rl", "nemo_rl": "nemo-rl", "nemorl": "nemo-rl", "nemo": "nemo-rl",
            "openrlhf": "openrlhf", "trl": "trl"}
_RULES = {"verl": VERL_RULES, "nemo-rl": NEMO_RL_RULES, "openrlhf": openrlhf.RULES, "trl": trl.RULES}


def detect(tree: dict) -> Optional[str]:
    """The framework a mapping of settings belongs to, from its keys; None if none fits."""
    if verl.looks_like(tree):
        return "verl"
    parents = tree.get("defaults")
    if nemo_rl.looks_like(tree) or isinstance(parents, str) or (
            isinstance(parents, list) and parents and all(isinstance(p, str) and p.endswith((".yaml", ".yml"))
                                                          for p in parents)):
        return "nemo-rl"
    if trl.looks_like(tree):
        return "trl"
    return None


def _evidence(tree: dict) -> str:
    keys = [str(k) for k in list(tree)[:4]]
    return ", ".join(keys) + (", ..." if len(tree) > 4 else "") if keys else "no settings"


def _framework(source: Source, forced: Optional[str], src: str) -> str:
    found = source.form or detect(source.tree)
    if forced is not None:
        want = _ALIASES.get(forced.strip().lower())
        if want is None:
            raise UserError(f"{src}: unknown framework {forced!r}; one of {', '.join(FRAMEWORKS)}")
        if found is not None and found != want:
            raise UserError(f"{src}: this is a {FRAMEWORK_NAMES[found]} config ({_evidence(source.tree)}), not a "
                            f"{FRAMEWORK_NAMES[want]} one; give the {FRAMEWORK_NAMES[want]} config or drop the "
                            "framework to read it as it is")
        return want
    if found is None:
        raise UserError(f"{src}: not a launch config of veRL, NeMo-RL, OpenRLHF or TRL (top-level keys: "
                        f"{_evidence(source.tree)}); give the run's config, or name its framework")
    return found


def read_run_config(path: Union[str, Path], overrides: Iterable[str] = (), framework: Optional[str] = None,
                    source: Optional[str] = None) -> RunConfig:
    """The launch config at ``path`` as a ``RunConfig``. ``overrides``: ``a.b.c=value`` on top of the file
    (OpenRLHF: ``flag=value``); ``framework``: read it as this framework's (an error if it is another's);
    ``source``: how messages name the file (default: the path)."""
    path = Path(path)
    src = source or str(path)
    got = read_source(path, src)
    fw = _framework(got, framework, src)
    if fw == "nemo-rl":
        got.tree = nemo_rl.load(path, got.tree, src)
    elif fw == "verl" and got.data is not None and hydra.has_defaults_list(got.tree):
        implied, notes = hydra.packaged_parents(path, got.tree)
        got.extra.extend(notes)
        got.tree = deep_merge(implied, hydra.compose(path, got.tree, src))
    overridden = with_overrides(got, overrides, src, fw)
    if fw in ("verl", "nemo-rl"):
        got.tree = interp.resolve_tree(got.tree)
    ctx = Ctx(fw, src, got.tree, _RULES[fw], overridden)
    if fw == "verl":
        verl.read(ctx)
    elif fw == "nemo-rl":
        nemo_rl.read(ctx)
    elif fw == "openrlhf":
        openrlhf.read(ctx, ray=got.ray)
    else:
        trl.read(ctx)
    ctx.finish()
    ignored = [Knob(key=k, value=v, note=why) for k, v, why in got.extra] + ctx.ignored
    try:
        return RunConfig(framework=fw, framework_version=got.version, source=src, **ctx.fields,
                         read=ctx.read, ignored=ignored)
    except ValidationError as e:
        raise UserError(f"{src}: {first_error(e)}") from None
