"""Hydra defaults lists (veRL's ``ppo_trainer.yaml`` since mid 2025) composed without Hydra.

A primary config names group configs by folder: ``- actor@actor_rollout_ref.actor: dp_actor`` is
``actor/dp_actor.yaml`` placed at ``actor_rollout_ref.actor``; in a group config, ``- actor`` is
another config of its own folder at its own place, and ``../optim@optim: fsdp`` a config of a
sibling folder under its own place. ``_self_`` marks where the file's own keys go (last when not
named); later entries override earlier ones. A missing file (unless ``optional``) or a cycle is an
error that names both files.
"""

from __future__ import annotations

import posixpath
from pathlib import Path

from throughputlab.errors import UserError
from throughputlab.files import read_settings
from throughputlab.rlconfig.common import deep_merge

WHAT = "a veRL Hydra config (YAML)"


# veRL's own trainer configs, which a recipe's defaults list names without shipping them (Hydra finds them in
# the installed package): their defaults are the ones the reader applies to any key a config leaves out; the
# Megatron one also sets the strategy.
PACKAGED = {"ppo_trainer": {}, "ppo_megatron_trainer": {"actor_rollout_ref": {"actor": {"strategy": "megatron"}}}}


def has_defaults_list(tree: dict) -> bool:
    return isinstance(tree.get("defaults"), list)


def packaged_parents(path: Path, data: dict) -> tuple[dict, list[tuple[str, str, str]]]:
    """Drop from ``data``'s defaults list the veRL trainer configs it names that are not beside it (Hydra takes
    them from the installed veRL); the settings they imply and a note for each."""
    implied: dict = {}
    notes = []
    defaults = data.get("defaults")
    if not isinstance(defaults, list):
        return implied, notes
    kept = []
    for entry in defaults:
        name = entry.removesuffix(".yaml") if isinstance(entry, str) else None
        if name in PACKAGED and not (path.parent / f"{name}.yaml").is_file():
            implied = deep_merge(implied, PACKAGED[name])
            notes.append(("defaults", name, "veRL's own trainer config (from the installed package): its defaults are "
                          "veRL's, as for any key the config leaves out"
                          + ("; the actor trains with Megatron" if PACKAGED[name] else "")))
            continue
        kept.append(entry)
    data["defaults"] = kept
    return implied, notes


def compose(path: Path, data: dict, src: str) -> dict:
    """The config of ``path`` (already read as ``data``) with its defaults list composed."""
    return _compose(path, dict(data), path.parent, "", "", (path.resolve(),), src)


def _place(data: dict, package: str) -> dict:
    for part in reversed([p for p in package.split(".") if p]):
        data = {part: data}
    return data


def _package(parent: str, pkg: str) -> str:
    if pkg in ("_here_", ""):
        return parent
    if pkg == "_global_":
        return ""
    return f"{parent}.{pkg}" if parent else pkg


def _compose(path: Path, data: dict, root: Path, group: str, package: str, chain: tuple, src: str) -> dict:
    defaults = data.pop("defaults", None)
    if defaults is None:
        return _place(data, package)
    here = src if len(chain) == 1 else str(path)
    if not isinstance(defaults, list):
        raise UserError(f"{here}: defaults: expected a list of group configs, got {defaults!r}"[:200])
    if "_self_" not in defaults:
        defaults = [*defaults, "_self_"]
    out: dict = {}
    for entry in defaults:
        if entry == "_self_":
            out = deep_merge(out, _place(data, package))
            continue
        optional = False
        if isinstance(entry, str):  # a config of this file's own folder, at this file's place or at @package
            option, _, pkg = entry.partition("@")
            child_group, child_pkg = group, _package(package, pkg) if pkg else package
        elif isinstance(entry, dict) and len(entry) == 1:
            (key, option), = entry.items()
            words = str(key).split()
            optional = "optional" in words[:-1]
            name, _, pkg = words[-1].partition("@")
            child_group = posixpath.normpath(posixpath.join(group, name)) if group else posixpath.normpath(name)
            child_pkg = _package(package, pkg if pkg else posixpath.basename(name))
            if option is None:
                continue
        else:
            raise UserError(f"{here}: defaults: cannot read the entry {entry!r}; "
                            "expected '- group@package: name'")
        file = root / child_group / f"{option}.yaml"
        if not file.is_file():
            if optional:
                continue
            raise UserError(f"{here}: defaults entry {entry!r} names {file}, which does not exist; keep the "
                            "config folder next to the file, or give the resolved config veRL prints")
        if file.resolve() in chain:
            raise UserError(f"{here}: defaults cycle: {file} is already being read ({' -> '.join(map(str, chain))})")
        child = read_settings(file, WHAT, str(file), yaml=True)
        sub_group = child_group if isinstance(entry, dict) else group
        out = deep_merge(out, _compose(file, child, root, sub_group, child_pkg, (*chain, file.resolve()), src))
    return out
