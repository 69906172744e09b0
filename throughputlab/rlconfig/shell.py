"""Launch commands in shell scripts or text files: the command that starts a trainer, its arguments.

A script is read, never run: backslash line continuations are joined, comments dropped, the
script's own plain variable assignments (``NAME=value``, ``export NAME=...``, ``${NAME:-default}``),
its arrays (``ARGS=( ... )`` used as ``${ARGS[@]}``) and integer ``$((...))`` arithmetic are substituted, then each command is split with ``shlex``.
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
_ARRAY_START = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=\((.*)$", re.S)
_ARRAY_USE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\[[@*]\]\}$")
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
                    out.append(cur)
                cur = []
            else:
                cur.append(tok)
        if cur:
            out.append(cur)
    return [shlex.join(x) if isinstance(x, list) else x for x in _arrays_joined(out) if x]


def _arrays_joined(lines: list) -> list:
    """An array assignment over several lines (``ARGS=(`` ... ``)``, comments already dropped) as one line."""
    out: list = []
    open_array = False
    for x in lines:
        if open_array and isinstance(x, list):
            out[-1].extend(x)
            open_array = not (x and x[-1].endswith(")"))
            continue
        out.append(x)
        open_array = isinstance(x, list) and bool(_ARRAY_START.match(x[0])) and not x[-1].endswith(")")
    return out


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


_PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(:?[-=+?])?(.*)$", re.S)


def _closing(text: str, start: int) -> int:
    """The index of the ``}`` that closes the ``${`` at ``start``; -1 if none."""
    depth = 0
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _parameter(body: str, env: dict[str, str]) -> Optional[str]:
    """``${body}`` as the shell expands it: ``NAME``, ``NAME:-word`` / ``NAME-word`` (a default), ``NAME:=word``
    (a default, assigned), ``NAME:+word`` (an alternative); None where it stays as written (a variable the
    script does not set, without a default). Positional parameters (``${1:-vllm}``) are unset: the script is
    read as run without arguments."""
    m = _PARAM.match(body)
    if not m:
        return None
    name, op, word = m.groups()
    value = env.get(name)
    if op is None:
        return value if not word else None
    unset = value is None or (op.startswith(":") and value == "")
    kind = op[-1]
    if kind in "-=":
        if not unset:
            return value
        out = _substitute(word, env)
        if kind == "=":
            env[name] = out
        return out
    if kind == "+":
        return "" if unset else _substitute(word, env)
    return value


def _substitute(text: str, env: dict[str, str]) -> str:
    """One pass of parameter expansion over ``text``: ``$NAME`` and ``${...}``, nested defaults included."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text.startswith("${", i):
            end = _closing(text, i)
            if end < 0:
                out.append(text[i:])
                break
            got = _parameter(text[i + 2:end], env)
            out.append(text[i:end + 1] if got is None else got)
            i = end + 1
            continue
        m = re.match(r"\$([A-Za-z_][A-Za-z0-9_]*)", text[i:])
        if m:
            out.append(env.get(m.group(1), m.group(0)))
            i += m.end()
            continue
        out.append(text[i])
        i += 1
    return "".join(out)


def expand(text: str, env: dict[str, str]) -> str:
    """``$NAME``, ``${NAME}``, ``${NAME:-default}`` (defaults that hold other expansions too) and ``$((a * b))``
    with the script's variables."""
    for _ in range(4):  # values that name other variables
        new = _substitute(text, env)
        new = _ARITH.sub(lambda m: _arith_in(m, env), new)
        if new == text:
            break
        text = new
    return text


def commands(text: str, env: Optional[dict[str, str]] = None,
             arrays: Optional[dict[str, list[str]]] = None) -> list[list[str]]:
    """Each command of the script as its words, variables substituted; assignments are remembered,
    not returned."""
    env = {} if env is None else env
    arrays = {} if arrays is None else arrays
    out = []
    for line in logical_lines(text):
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        if not words:
            continue
        arr = _ARRAY_START.match(words[0])
        if arr and words[-1].endswith(")"):  # NAME=( a b c ): its words, expanded, for "${NAME[@]}"
            items = [arr.group(2), *words[1:]]
            items[-1] = items[-1][:-1]
            arrays[arr.group(1)] = [expand(w, env) for w in items if w]
            continue
        single = len(words) == 1 or (len(words) == 2 and words[0] in ("export", "local", "declare"))
        m = _ASSIGN.match(" ".join(words)) if single else None
        if m:
            value = words[-1].split("=", 1)[1] if "=" in words[-1] else ""
            env[m.group(1)] = expand(value, env)
            continue
        cmd: list[str] = []
        for w in words:
            use = _ARRAY_USE.match(w)
            if use and use.group(1) in arrays:
                cmd.extend(arrays[use.group(1)])
            else:
                cmd.append(expand(w, env))
        out.append(cmd)
        for k, w in enumerate(cmd[1:-1], 1):  # bash -c "...": the string is a script of its own (srun ... bash -c)
            if w == "-c" and cmd[k - 1].rsplit("/", 1)[-1] in ("bash", "sh"):
                out.extend(commands(cmd[k + 1], env, arrays))
    return out


_CUT = re.compile(r"\\[ \t]+#")  # a backslash, blanks, then a comment: "key=value \  # note"


def _no_comment_after_continuation(text: str, src: str) -> None:
    """A comment inside a continued command ends the command there, in bash as here: after a line's closing
    backslash (which then escapes the blank, not the newline) or on a line of its own between continued lines.
    The indented lines after it run as commands of their own, so the command would silently lose its later
    arguments: refused, naming the line."""
    lines = text.split("\n")
    for n, line in enumerate(lines[:-1], 1):
        nxt = lines[n]
        if not (nxt[:1] in (" ", "\t") and nxt.strip() and not nxt.lstrip().startswith("#")):
            continue
        if _CUT.search(line):
            where = "a comment follows the line's closing backslash"
        elif line.lstrip().startswith("#") and n >= 2 and lines[n - 2].rstrip().endswith("\\"):
            where = "a comment line inside the continued command"
        else:
            continue
        raise UserError(f"{src}: line {n}: {where}, so the command ends there (bash ends it there too) and the "
                        "lines after it are not its arguments; move the comment above the command")


def find_command(text: str, markers: tuple[str, ...], src: str, what: str) -> tuple[list[str], list[str]]:
    """The launcher words up to the trainer (``ray job submit ... -- python3 -m X``) and the trainer's
    own arguments, for the first command that names one of ``markers``."""
    _no_comment_after_continuation(text, src)
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
