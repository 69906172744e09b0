"""The forms a launch config comes in, read into one tree of settings: a YAML or JSON file, a shell
script or text file holding the launch command (OpenRLHF flags, veRL Hydra overrides), or a veRL
log whose first lines hold the config the trainer printed (a Python dict, one Ray prefix a line).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from throughputlab.errors import UserError
from throughputlab.files import expect_mapping, parse_json, parse_yaml, read_text
from throughputlab.rlconfig import openrlhf
from throughputlab.rlconfig.common import apply_overrides
from throughputlab.rlconfig.shell import find_command

WHAT = "an RL launch config (veRL or NeMo-RL YAML, TRL GRPOConfig YAML/JSON, or a launch script)"
# A recipe's trainer is recipe.<name>.main_<x>, <x>_main or main (verl-recipe: main_ppo, grpo_main, main).
VERL_MARKERS = ("verl.trainer.main_ppo", "main_ppo", "main_dapo", "fully_async_main", "verl.trainer.", ".main",
                "_main", "main_gkd")
# veRL entry points that take Hydra overrides but run no RL step.
VERL_NOT_RL = {"main_generation": "offline generation", "main_eval": "evaluation", "sft_trainer": "SFT",
               "main_generation_server": "generation server", "main_gkd": "on-policy distillation (GKD)"}
SCRIPT_SUFFIXES = (".sh", ".bash")
YAML_SUFFIXES = (".yaml", ".yml", ".json")
_RAY_PREFIX = re.compile(r"^\([\w.-]+ pid=\d+(?:, ip=[\d.]+)?\) ", re.M)
_PRINTED = re.compile(r"\{\s*'actor_rollout_ref'\s*:")
_HYDRA_FLAGS = ("--config-path", "--config-name", "--config-dir", "-cp", "-cn", "-cd")


@dataclass
class Source:
    """A config read in: its ``tree``, the framework its form shows (None: decided by its keys), words
    that are not settings (``extra``: key, value, reason), and a version the file pins."""

    tree: dict
    form: Optional[str] = None
    extra: list = field(default_factory=list)
    version: Optional[str] = None
    ray: bool = True
    data: Optional[dict] = None  # the file's own mapping, before any defaults are merged


def read_source(path: Path, src: str) -> Source:
    text = read_text(path, WHAT, src)
    suffix = path.suffix.lower()
    if suffix not in YAML_SUFFIXES:
        if _PRINTED.search(text):
            return Source(tree=_printed_dict(text, src), form="verl")
        if openrlhf.looks_like(text):
            tree, extra, version, ray = openrlhf.parse(text, src)
            return Source(tree=tree, form="openrlhf", extra=extra, version=version, ray=ray)
        if any(m in text for m in VERL_MARKERS) and re.search(r"\b[\w.]+=\S", text):
            return _verl_script(text, src)
        if suffix in SCRIPT_SUFFIXES:
            raise UserError(f"{src}: no RL trainer command in this script (looked for veRL's main_ppo or a recipe's "
                            "trainer, recipe.<name>.main_* or *_main, and OpenRLHF's train_ppo_ray); give the script "
                            "that launches the training")
    if any("GRPOConfig(" in line and not line.lstrip().startswith("#") for line in text.splitlines()):
        raise UserError(f"{src}: a Python GRPOConfig(...) call; write its arguments as YAML or JSON (key: value), "
                        "the file `trl grpo --config` takes")
    data = parse_json(text, WHAT, src) if suffix == ".json" else parse_yaml(text, WHAT, src)
    if isinstance(data, str) and (openrlhf.looks_like(data) or any(m in data for m in VERL_MARKERS)):
        raise UserError(f"{src}: a launch command in a file named {path.name}; name it .sh or .txt so it is "
                        "read as a command, not as YAML")
    if isinstance(data, str) and data.lstrip().startswith("--"):
        raise UserError(f"{src}: command-line flags without their command; an OpenRLHF run is read from its "
                        "command line, e.g. python3 -m openrlhf.cli.train_ppo_ray --flag value ...: add the command")
    data = {} if data is None else expect_mapping(data, src, "a mapping of settings")
    return Source(tree=dict(data), data=data)


def _verl_script(text: str, src: str) -> Source:
    """A veRL launch script: the Hydra overrides of its ``python -m verl.trainer.main_ppo`` command."""
    launcher, args = find_command(text, VERL_MARKERS, src, "veRL main_ppo")
    module = launcher[-1].rsplit(".", 1)[-1].removesuffix(".py") if launcher else ""
    for name, what in VERL_NOT_RL.items():
        if module.endswith(name):
            raise UserError(f"{src}: its command runs {launcher[-1]}, veRL's {what}, not an RL trainer; give the "
                            "script that runs main_ppo (or a recipe's trainer)")
    extra = [("launcher", " ".join(launcher), "the command that starts the trainer: not a setting")]
    overrides, stray, i = [], [], 0
    while i < len(args):
        w = args[i]
        name = w.split("=", 1)[0]
        if name in _HYDRA_FLAGS:
            value = w.split("=", 1)[1] if "=" in w else (args[i + 1] if i + 1 < len(args) else "")
            extra.append((name, value, "where Hydra finds the trainer's YAML: its defaults are veRL's, not read here"))
            i += 1 if "=" in w else 2
            continue
        (overrides if "=" in w and not w.startswith("-") else stray).append(w)
        i += 1
    if stray:
        extra.append(("arguments", " ".join(stray), "words that are not key=value overrides: not read"))
    tree: dict = {}
    apply_overrides(tree, overrides, src)
    return Source(tree=tree, form="verl", extra=extra)


def _printed_dict(text: str, src: str) -> dict:
    """The dict veRL pretty-prints at start-up, from a log (Ray's ``(TaskRunner pid=N)`` prefixes removed)."""
    clean = _RAY_PREFIX.sub("", text)
    m = _PRINTED.search(clean)
    start = m.start()
    depth, quote, i = 0, "", start
    while i < len(clean):
        ch = clean[i]
        if quote:
            if ch == "\\":
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
            if depth == 0:
                break
        i += 1
    line = clean.count("\n", 0, start) + 1
    try:
        data = ast.literal_eval(clean[start: i + 1])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise UserError(f"{src}: the config printed at line {line} does not read as a Python dict (cut short?); "
                        "give the config as YAML instead") from None
    return expect_mapping(data, src)


def with_overrides(source: Source, overrides, src: str, form: str) -> set[str]:
    return apply_overrides(source.tree, overrides, src, flag_prefix="--" if form == "openrlhf" else "")
