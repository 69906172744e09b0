"""What every framework's reader shares: the typed getters that fill ``RunConfig`` fields and
record each key read, the walk that files every other key of the config under ``ignored`` with a
reason (or stops at a likely typo), and ``key=value`` overrides.

Each reader names the keys it reads (``Ctx.int`` / ``.float`` / ``.bool`` / ``.str``), the keys it
skips for a reason found in the config itself (``Ctx.ignore``), and a table of rules (glob patterns
over dotted paths) for the keys that never matter to a step's time. A key that none of these cover
is a likely typo when it is close to a known key the file does not set (an error that suggests the
known one); otherwise it is an error that names it and how to drop it (``--config-set '~KEY'``): a key
this reader does not know may change the step, and frameworks add keys with every release (the
tables follow their examples at the versions docs/decide.md names).
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import re
from typing import Any, Iterable, Optional

from throughputlab.errors import UserError
from throughputlab.rlconfig.model import FRAMEWORK_NAMES, Knob

Rules = list[tuple[tuple[str, ...], str]]
_SHELL_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")  # ${HOME}: a shell variable, not a dotted config key
_MISSING = object()


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def parent_of(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def deep_merge(base: Any, over: Any) -> Any:
    """``over`` on top of ``base``: mappings merge key by key, anything else replaces (as OmegaConf)."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            out[k] = deep_merge(base[k], v) if k in base else v
        return out
    return over


def parse_scalar(text: str) -> Any:
    """A command-line value as YAML reads it (``8`` -> 8, ``true`` -> True, ``[a,b]`` -> a list)."""
    import yaml

    try:
        return yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text


def set_path(tree: dict, path: str, value: Any) -> None:
    node = tree
    parts = path.split(".")
    for p in parts[:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def del_path(tree: dict, path: str) -> None:
    node: Any = tree
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def apply_overrides(tree: dict, overrides: Iterable[str], src: str, flag_prefix: str = "") -> set[str]:
    """Hydra-style ``a.b.c=value`` (``+``/``++`` to add, ``~a.b`` to delete) on ``tree``; the keys set.
    ``flag_prefix`` (``--``) turns ``name=value`` into a command-line flag (OpenRLHF)."""
    done: set[str] = set()
    for o in overrides:
        text = str(o).strip()
        if text.startswith("~"):
            del_path(tree, flag_prefix + text[1:].split("=", 1)[0].strip())
            continue
        key, eq, value = text.lstrip("+").partition("=")
        key = key.strip()
        if flag_prefix:
            key = flag_prefix + key.lstrip("-")
        if not eq or not key.strip("-"):
            raise UserError(f"{src}: override {text!r} is not KEY=VALUE (e.g. actor_rollout_ref.rollout.n=8)")
        set_path(tree, key, parse_scalar(value))
        done.add(key)
    return done


class Ctx:
    """One reading of one config: the tree, the fields set so far, and the keys accounted for."""

    def __init__(self, framework: str, src: str, tree: dict, rules: Rules, overridden: Iterable[str] = ()):
        self.fw = FRAMEWORK_NAMES[framework]
        self.src = src
        self.tree = tree
        self.rules = rules
        self.fields: dict[str, Any] = {}
        self.read: list[Knob] = []
        self.ignored: list[Knob] = []
        self.overridden = set(overridden)
        self._done: dict[str, Optional[str]] = {}  # key -> None (read) or the reason it is skipped
        self._known: set[str] = {p for pats, _ in rules for p in pats if not any(c in p for c in "*?[")}

    # -- looking keys up --------------------------------------------------------------------------------
    def raw(self, key: str) -> Any:
        node: Any = self.tree
        for p in key.split("."):
            if not isinstance(node, dict) or p not in node:
                return _MISSING
            node = node[p]
        return node

    def has(self, key: str) -> bool:
        self._known.add(key)
        return self.raw(key) is not _MISSING

    def stated(self, key: str) -> bool:
        """``key`` is in the file with a value (not null)."""
        return self.raw(key) not in (_MISSING, None)

    def fail(self, key: str, problem: str) -> UserError:
        where = "the override" if key in self.overridden else "it in the file"
        return UserError(f"{self.src}: {key}: {problem}; fix {where}")

    # -- typed getters: each records the key as read ------------------------------------------------------
    def _get(self, key: str, kind: str, field: Optional[str], note: str, convert) -> Any:
        self._known.add(key)
        value = self.raw(key)
        if value is _MISSING:
            return None
        if isinstance(value, str) and "${" in value:
            shell = _SHELL_VAR.search(value)
            if shell and kind == "str":  # a path naming $HOME or $DATA_DIR: kept as written, the name is what counts
                self.note(key, value, f"kept as written: ${{{shell.group(1)}}} is not set in the config or script")
                if field is not None:
                    self.fields[field] = value
                return value
            if shell:
                what = "is" if shell.group(0) == value.strip() else f"holds ${{{shell.group(1)}}},"
                raise self.fail(key, f"{value!r} {what} a shell variable the script does not set; set it in the "
                                     "script or give the key as an override")
            raise self.fail(key, f"cannot resolve {value!r} (it names a key or resolver this config lacks)")
        if isinstance(value, str) and value.startswith("$") and kind != "str":
            raise self.fail(key, f"{value!r} is a shell variable the script does not set; set it in the script "
                                 "or give the key as an override")
        out = None if value is None else convert(key, value)
        if field is not None and out is not None:
            self.fields[field] = out
        what = f"{field} = {out!r}" if field is not None and out is not None else ""
        if value is None:
            text = "null: not set" + (f"; {note}" if note else "")
        else:
            text = "; ".join(x for x in (what, note) if x)
        self.note(key, value, text)
        return out

    def note(self, key: str, value: Any, text: str) -> None:
        """Record ``key`` as read with ``text`` saying what it set."""
        self._known.add(key)
        if key in self._done:
            self.read = [k for k in self.read if k.key != key]
        self._done[key] = None
        suffix = " (from an override)" if key in self.overridden else ""
        self.read.append(Knob(key=key, value=value, note=(text or "read") + suffix))

    def int(self, key: str, field: Optional[str] = None, note: str = "", minimum: int = 1) -> Optional[int]:
        def conv(k, v):
            if isinstance(v, bool) or not isinstance(v, (int, float, str)):
                raise self.fail(k, f"expected a whole number, got {v!r}")
            try:
                f = float(v)
            except ValueError:
                raise self.fail(k, f"expected a whole number, got {v!r}") from None
            if not f.is_integer():
                raise self.fail(k, f"expected a whole number, got {v!r}")
            if f < minimum:
                raise self.fail(k, f"must be at least {minimum}, got {v!r}")
            return int(f)

        return self._get(key, "int", field, note, conv)

    def float(self, key: str, field: Optional[str] = None, note: str = "", lo: float = 0.0,
              hi: Optional[float] = None) -> Optional[float]:
        def conv(k, v):
            try:
                if isinstance(v, bool):
                    raise ValueError
                f = float(v)
                if not math.isfinite(f):
                    raise ValueError
            except (TypeError, ValueError):
                raise self.fail(k, f"expected a number, got {v!r}") from None
            if f < lo or (hi is not None and f > hi):
                raise self.fail(k, f"must be between {lo} and {hi}, got {v!r}" if hi is not None
                                else f"must be at least {lo}, got {v!r}")
            return f

        return self._get(key, "float", field, note, conv)

    def bool(self, key: str, field: Optional[str] = None, note: str = "") -> Optional[bool]:
        def conv(k, v):
            if isinstance(v, bool):
                return v
            if isinstance(v, int) and v in (0, 1):
                return bool(v)
            if isinstance(v, str) and v.strip().lower() in ("true", "false", "yes", "no", "on", "off"):
                return v.strip().lower() in ("true", "yes", "on")
            raise self.fail(k, f"expected true or false, got {v!r}")

        return self._get(key, "bool", field, note, conv)

    def str(self, key: str, field: Optional[str] = None, note: str = "",
            choices: Optional[Iterable[str]] = None) -> Optional[str]:
        def conv(k, v):
            if isinstance(v, (dict, list)):
                raise self.fail(k, f"expected a single value, got {type(v).__name__} {v!r}"[:160])
            s = str(v)
            if choices is not None and s not in set(choices):
                near = difflib.get_close_matches(s, list(choices), n=1)
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                raise self.fail(k, f"{s!r} is not one of {', '.join(sorted(choices))}{hint}")
            return s

        return self._get(key, "str", field, note, conv)

    def set(self, field: str, value: Any, key: Optional[str] = None) -> None:
        """A field derived from keys already recorded (e.g. mini-batch prompts x responses); ``key``: the
        key whose read entry says so."""
        if value is None:
            return
        self.fields[field] = value
        for i, k in enumerate(self.read):
            if k.key == key:
                self.read[i] = Knob(key=k.key, value=k.value, note=f"{field} = {value!r}; {k.note}")

    def ignore(self, key: str, reason: str) -> None:
        """Skip ``key`` (and anything under it) for a reason this config gives, e.g. a disabled section."""
        self._known.add(key)
        if key not in self._done:
            self._done[key] = reason

    # -- accounting for every key -------------------------------------------------------------------------
    def finish(self) -> None:
        """File every key not read under ``ignored``, by the reader's reasons, then the rules; stop at a
        key that looks like a typo of a known one."""
        self._paths = set(self._known)
        for k in list(self._paths):
            while "." in k:
                k = parent_of(k)
                self._paths.add(k)
        for key, value in self.tree.items():
            self._walk(str(key), value)

    def _rule(self, path: str) -> tuple[Optional[str], bool]:
        """The reason of the first rule covering ``path`` (itself or a section above it), and whether
        it names ``path`` exactly (then ``path`` is a known key, not a possible typo)."""
        chain = [path]
        while "." in chain[-1]:
            chain.append(parent_of(chain[-1]))
        for pats, reason in self.rules:
            for pat in pats:
                if fnmatch.fnmatchcase(path, pat):
                    return reason, not any(c in pat.rsplit(".", 1)[-1] for c in "*?[")
                if any(fnmatch.fnmatchcase(p, pat) for p in chain[1:]):
                    return reason, False
        return None, False

    def _walk(self, path: str, value: Any) -> None:
        if path in self._done:
            reason = self._done[path]
            if reason is not None:
                self.ignored.append(Knob(key=path, value=value, note=reason))
            return
        if not any(k.startswith(path + ".") for k in self._done):
            reason, exact = self._rule(path)
            if reason is not None:
                if isinstance(value, dict):
                    for k, v in value.items():
                        self._scan(join(path, str(k)), v)
                elif not exact:
                    self._typo(path)
                self.ignored.append(Knob(key=path, value=value, note=reason))
                return
        if isinstance(value, dict) and value:
            for k, v in value.items():
                self._walk(join(path, str(k)), v)
            return
        self._typo(path)
        self._unknown(path)

    def _unknown(self, path: str) -> None:
        """A key no rule of the framework covers: an error naming it, the closest known key, and how to
        drop it where a newer version of the framework has it."""
        if any(k.startswith(path + ".") for k in self._paths):  # a known section holding a list or a scalar
            value = self.raw(path)
            raise self.fail(path, f"expected a section of keys, got {type(value).__name__} {value!r}"[:200])
        parent = parent_of(path) if "." in path else ""
        siblings = sorted({k.rsplit(".", 1)[-1] for k in self._paths if parent_of(k) == parent})
        near = difflib.get_close_matches(path.rsplit(".", 1)[-1], siblings, n=1, cutoff=0.6)
        hint = f" (did you mean {join(parent, near[0])!r}?)" if near else ""
        raise UserError(f"{self.src}: unknown {self.fw} key {path!r}{hint}: fix it, or where your {self.fw} version "
                        f"has it, drop it with --config-set '~{path}'")

    def _scan(self, path: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                self._scan(join(path, str(k)), v)
        else:
            self._typo(path)

    def _typo(self, path: str) -> None:
        """Stop at a key that is one or two letters off a known key the file does not set."""
        if path in self._paths:
            return
        parts = path.split(".")
        for i in range(len(parts)):
            prefix = ".".join(parts[: i + 1])
            if prefix in self._paths:
                continue
            parent = ".".join(parts[:i])
            present = self.raw(parent) if parent else self.tree
            siblings = {k.rsplit(".", 1)[-1] for k in self._paths if parent_of(k) == parent}
            absent = [s for s in siblings if not (isinstance(present, dict) and s in present)]
            near = difflib.get_close_matches(parts[i], absent, n=1, cutoff=0.9)
            if near:
                raise UserError(f"{self.src}: unknown {self.fw} key {prefix!r}: did you mean "
                                f"{join(parent, near[0])!r}? fix the key in the file")
            return
