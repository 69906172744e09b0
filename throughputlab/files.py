"""Reading the files a user gives (spec files, profiles, logs, imports, CSVs, model configs).

Every problem is one UserError line that names the file (as the user gave it: ``source``),
what is wrong with it and what to do, raised before a command prints anything: a missing
file, a folder, an unreadable, binary (not UTF-8), empty or cut-short file, a parse error (with
its line and column), a top level of the wrong type, or a field that does not validate.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional, Union

from throughputlab.errors import UserError

PathLike = Union[str, os.PathLike]


def read_text(path: PathLike, what: str, source: Optional[str] = None) -> str:
    """The text of ``path`` (UTF-8); ``what`` is what the file should hold ("a YAML spec file"),
    ``source`` how the message names it (default: the path, e.g. ``--spec FILE``)."""
    path = Path(path)
    src = source or str(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"{src}: cannot read it: no such file (not found); check the path") from None
    except IsADirectoryError:
        raise UserError(f"{src}: is a folder, expected {what}; give the file itself") from None
    except PermissionError:
        raise UserError(f"{src}: cannot read it (permission denied); check its permissions") from None
    except OSError as e:
        raise UserError(f"{src}: cannot read it ({e.strerror or e}); check the path") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{src}: not a text file (byte {data[e.start]:#04x} at position {e.start} is not UTF-8 "
                        f"text), expected {what}; give the right file") from None
    if "\x00" in text:
        raise UserError(f"{src}: not a text file (it holds NUL bytes), expected {what}; give the right file")
    if not text.strip():
        raise UserError(f"{src}: empty file, expected {what}; give the right file or write it again")
    text = text[1:] if text.startswith("\ufeff") else text  # a byte-order mark is no part of the content
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as open() reads text


def parse_json(text: str, what: str, src: str) -> Any:
    """One JSON document; a syntax error names its line and column."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        cut = " (cut short?)" if e.pos >= len(text.rstrip()) else ""
        raise UserError(f"{src}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}{cut}; "
                        f"expected {what}, fix or replace the file") from None
    except RecursionError:
        raise UserError(f"{src}: not valid JSON (nested too deeply); expected {what}") from None


def parse_yaml(text: str, what: str, src: str) -> Any:
    """One YAML document (JSON is YAML too); a syntax error names its line and column."""
    try:
        import yaml
    except ImportError:
        raise UserError(f"{src}: reading YAML needs PyYAML (pip install pyyaml), or write it as JSON") from None
    try:
        return yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(e.problem or e.context or "").split())
        raise UserError(f"{src}: YAML syntax error{where}: {problem}; expected {what}, fix the file") from None
    except yaml.YAMLError as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"{src}: not valid YAML ({first}); expected {what}, fix the file") from None


def read_json(path: PathLike, what: str, source: Optional[str] = None) -> Any:
    src = source or str(path)
    return parse_json(read_text(path, what, src), what, src)


def read_yaml(path: PathLike, what: str, source: Optional[str] = None) -> Any:
    src = source or str(path)
    return parse_yaml(read_text(path, what, src), what, src)


def read_settings(path: PathLike, what: str, source: Optional[str] = None, *, yaml: bool) -> dict:
    """A spec file's settings: a mapping at the top level, YAML or JSON (``yaml``); a file of
    comments only (YAML null) holds no setting: ``{}``."""
    src = source or str(path)
    data = read_yaml(path, what, src) if yaml else read_json(path, what, src)
    return {} if data is None else expect_mapping(data, src)


def expect_mapping(data: Any, src: str, what: str = "a mapping of settings") -> dict:
    """``data`` if it is a mapping (a JSON object); else one line naming the type found."""
    if not isinstance(data, dict):
        raise UserError(f"{src}: expected {what} at the top level, got {_kind(data)}; "
                        "check that this is the right file")
    return data


def _kind(data: Any) -> str:
    if data is None:
        return "nothing"
    if isinstance(data, list):
        return f"a list of {len(data)} item(s)"
    return f"a {type(data).__name__} ({str(data)[:40]!r})" if isinstance(data, str) else f"a {type(data).__name__}"


def first_error(e) -> str:
    """A pydantic ValidationError in one line: the first wrong field, its problem and the count."""
    errors = e.errors()
    if not errors:
        return "does not validate"
    err = errors[0]
    where = ".".join(str(x) for x in err.get("loc", ())) or "the top level"
    msg = " ".join(str(err.get("msg", "")).split())
    return f"at {where}: {msg} ({e.error_count()} problem(s) in all)"


def read_csv(path: PathLike, what: str, source: Optional[str] = None):
    """A pandas frame of a CSV file; every parser error is one line."""
    import io

    import pandas as pd

    src = source or str(path)
    text = read_text(path, what, src)
    try:
        return pd.read_csv(io.StringIO(text))
    except pd.errors.EmptyDataError:
        raise UserError(f"{src}: no columns in it, expected {what}; write a header row first") from None
    except Exception as e:  # pandas raises several parser errors; all mean "not a table we can read"
        first = (" ".join(str(e).split()) or type(e).__name__)[:120]
        raise UserError(f"{src}: not a readable CSV ({first}); expected {what}") from None
