"""OmegaConf ``${...}`` interpolations in Hydra and NeMo-RL configs, resolved without OmegaConf.

Supported: absolute (``${policy.max_total_sequence_length}``) and relative (``${.x}``, ``${..x}``)
references, and the resolvers these configs use for sizes: ``mul``, ``div``, ``add``, ``max``,
``min`` (NeMo-RL registers them), ``oc.select`` (a key or its default) and ``oc.env`` (its default
only: the launch machine's environment is not this one's). Anything else is left as written; a
reader that needs such a value says so with the key's name.
"""

from __future__ import annotations

import math
from typing import Any

from throughputlab.rlconfig.common import parse_scalar

_DEPTH = 32


class _Unresolved(Exception):
    pass


def resolve_tree(tree: dict) -> dict:
    """``tree`` with every interpolation that can be resolved replaced by its value."""
    return _resolve_node(tree, tree, "", 0)


def _resolve_node(node: Any, root: dict, path: str, depth: int) -> Any:
    if isinstance(node, dict):
        return {k: _resolve_node(v, root, f"{path}.{k}" if path else str(k), depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve_node(v, root, path, depth) for v in node]
    if isinstance(node, str) and "${" in node:
        try:
            return _resolve_str(node, root, path, depth)
        except (_Unresolved, RecursionError, ValueError, TypeError, ZeroDivisionError):
            return node
    return node


def _lookup(ref: str, root: dict, path: str, depth: int) -> Any:
    ref = ref.strip()
    if ref.startswith("."):
        # Relative to the key's own mapping: one dot is that mapping, each more goes one level up.
        dots = len(ref) - len(ref.lstrip("."))
        base = path.split(".")[:-1]
        base = base[: len(base) - (dots - 1)] if dots > 1 else base
        parts = base + [p for p in ref[dots:].split(".") if p]
    else:
        parts = [p for p in ref.split(".") if p]
    node: Any = root
    for p in parts:
        if isinstance(node, dict) and p in node:
            node = node[p]
        elif isinstance(node, list) and p.isdigit() and int(p) < len(node):
            node = node[int(p)]
        else:
            raise _Unresolved(ref)
    if depth > _DEPTH:
        raise _Unresolved(ref)
    if isinstance(node, str) and "${" in node:
        return _resolve_str(node, root, ".".join(parts), depth + 1)
    return node


def _resolve_str(text: str, root: dict, path: str, depth: int) -> Any:
    pieces, i = [], 0
    while i < len(text):
        j = text.find("${", i)
        if j < 0:
            pieces.append(text[i:])
            break
        pieces.append(text[i:j])
        body, end = _body(text, j + 2)
        pieces.append(_evaluate(body, root, path, depth))
        i = end
    pieces = [p for p in pieces if not (isinstance(p, str) and p == "")]
    if len(pieces) == 1:
        return pieces[0]  # a whole-value interpolation keeps its type
    return "".join(str(p) for p in pieces)


def _body(text: str, start: int) -> tuple[str, int]:
    """The text inside ``${ ... }`` starting at ``start``, and the index after its closing brace."""
    depth, i = 1, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start:i], i + 1
        i += 1
    raise _Unresolved(text)


def _split_args(text: str) -> list[str]:
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        depth += ch == "{"
        depth -= ch == "}"
        cur += ch
    args.append(cur)
    return [a.strip() for a in args]


def _arg(text: str, root: dict, path: str, depth: int) -> Any:
    if "${" in text:
        return _resolve_str(text, root, path, depth + 1)
    return parse_scalar(text.strip("'\""))


def _evaluate(body: str, root: dict, path: str, depth: int) -> Any:
    name, colon, rest = body.partition(":")
    if not colon or "${" in name or "." in name and not name.startswith("oc."):
        return _lookup(body, root, path, depth)
    name = name.strip()
    if name == "oc.select":
        key, *default = _split_args(rest)
        try:
            return _lookup(key, root, path, depth)
        except _Unresolved:
            if default:
                return _arg(default[0], root, path, depth)
            raise
    if name == "oc.env":
        _var, *default = _split_args(rest)
        if default:
            return _arg(default[0], root, path, depth)
        raise _Unresolved(body)
    args = [_arg(a, root, path, depth) for a in _split_args(rest)]
    if any(isinstance(a, bool) or not isinstance(a, (int, float)) for a in args):
        raise _Unresolved(body)
    if name == "mul":
        return math.prod(args)
    if name == "add":
        return sum(args)
    if name == "div" and len(args) == 2:
        q = args[0] / args[1]
        return int(q) if float(q).is_integer() and all(isinstance(a, int) for a in args) else q
    if name == "max":
        return max(args)
    if name == "min":
        return min(args)
    raise _Unresolved(body)
