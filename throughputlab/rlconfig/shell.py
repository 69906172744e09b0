"""Launch commands in shell scripts or text files: the command that starts a trainer, its arguments.

A script is read, never run: backslash line continuations are joined, comments dropped, the
script's own plain variable assignments (``NAME=value``, ``export NAME=...``, ``${NAME:-default}``)
and integer ``$((...))`` arithmetic are substituted, then each command is split with ``shlex``.
A variable the script does not set (the environment's, or ``$(command)``) stays as written, so
the reader can name it if a value it needs depends on it.
"""

from __future__ import annotations

import ast
import operator
import re
import shlex
from typing import Optional

from throughputlab.errors import UserError

_ASSIGN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)*)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
_ARITH = re.compile(r"\$\(\(([^()]*(?:\([^()]*\)[^()]*)*)\)\)")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
        ast.Div: operator.floordiv, ast.Mod: operator.mod}


def logical_lines(text: str) -> list[str]:
    """The script's commands, one per line: continuations joined, ``;`` and ``&&`` split."""
    joined = re.sub(r"\\[ \t]*\n", " ", text)
    # Spaces inside $((...)) would split it into words; arithmetic does not need them.
    joined = _ARITH.sub(lambda m: "$((" + re.sub(r"\s+", "", m.group(1)) + "))", joined)
    out = []
    for line in joined.split("\n"):
        try:
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lex.whitespace_split = True
            lex.commenters = "#"
            tokens = list(lex)
        except ValueError:
            tokens = None  # an unbalanced quote: keep the raw line, the command finder reports it
        if tokens is None:
            out.append(line.strip())
            continue
        cur: list[str] = []
        for tok in tokens:
            if tok in (";", "&&", "||", "&", "|"):
                if cur:
                    out.append(shlex.join(cur))
                cur = []
            else:
                cur.append(tok)
        if cur:
            out.append(shlex.join(cur))
    return [x for x in out if x]


def _arith(expr: str) -> Optional[int]:
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):
            return n.value
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            return _OPS[type(n.op)](ev(n.left), ev(n.right))
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -ev(n.operand)
        raise ValueError(expr)

    try:
        return int(ev(ast.parse(expr.strip(), mode="eval")))
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
        return None


def _arith_in(m: re.Match, env: dict[str, str]) -> str:
    # Inside $((...)) a variable needs no $: ``$((max_prompt_length + max_response_length))``.
    expr = re.sub(r"\b[A-Za-z_]\w*\b", lambda n: env.get(n.group(0), n.group(0)), m.group(1))
    v = _arith(expr)
    return str(v) if v is not None else m.group(0)


def expand(text: str, env: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``$((a * b))`` with the script's variables."""
    def var(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in env:
            return env[name]
        if m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    for _ in range(4):  # values that name other variables
        new = _VAR.sub(var, text)
        new = _ARITH.sub(lambda m: _arith_in(m, env), new)
        if new == text:
            break
        text = new
    return text


def commands(text: str) -> list[list[str]]:
    """Each command of the script as its words, variables substituted; assignments are remembered,
    not returned."""
    env: dict[str, str] = {}
    out = []
    for line in logical_lines(text):
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        if not words:
            continue
        single = len(words) == 1 or (len(words) == 2 and words[0] in ("export", "local", "declare"))
        m = _ASSIGN.match(" ".join(words)) if single else None
        if m:
            value = words[-1].split("=", 1)[1] if "=" in words[-1] else ""
            env[m.group(1)] = expand(value, env)
            continue
        out.append([expand(w, env) for w in words])
    return out


def find_command(text: str, markers: tuple[str, ...], src: str, what: str) -> tuple[list[str], list[str]]:
    """The launcher words up to the trainer (``ray job submit ... -- python3 -m X``) and the trainer's
    own arguments, for the first command that names one of ``markers``."""
    for words in commands(text):
        for i, w in enumerate(words):
            # the trainer itself: a module run with -m / --module, or a script; not a word in an echo
            runs = w.endswith(".py") or (i > 0 and words[i - 1] in ("-m", "--module"))
            if runs and any(mk in w for mk in markers):
                return words[: i + 1], words[i + 1:]
    raise UserError(f"{src}: no {what} command in it (looked for {', '.join(markers)}); give the script "
                    "or text file that holds the launch command")


def flags(args: list[str], src: str) -> tuple[dict[str, object], list[str]]:
    """``--name value`` / ``--name=value`` / bare ``--switch`` (True) as {``--name``: value}; a flag
    given twice keeps its last value, as argparse does. Also the words that are not flags."""
    from throughputlab.rlconfig.common import parse_scalar

    out: dict[str, object] = {}
    stray: list[str] = []
    i = 0
    while i < len(args):
        w = args[i]
        if not w.startswith("--") or w == "--":
            stray.append(w)
            i += 1
            continue
        name, eq, value = w.partition("=")
        if eq:
            out[name] = parse_scalar(value)
            i += 1
            continue
        values = []
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            values.append(args[j])
            j += 1
        if not values:
            out[name] = True
        elif len(values) == 1:
            out[name] = parse_scalar(values[0])
        else:
            out[name] = [parse_scalar(v) for v in values]
        i = j
    return out, stray
