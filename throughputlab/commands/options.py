"""Option types and checks shared by the commands: validate at the boundary, name the option."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Optional

import click

from throughputlab.errors import UserError


class IntList(click.ParamType):
    """Comma-separated positive integers, e.g. ``1,2,4,8``; ``auto`` (returned as is) when allowed."""

    name = "LIST"

    def __init__(self, allow_auto: bool = False):
        self.allow_auto = allow_auto

    def convert(self, value, param, ctx):
        if isinstance(value, list) or value is None:
            return value
        opt = f"--{param.name.replace('_', '-')}" if param is not None else "value"
        text = str(value).strip()
        if self.allow_auto and text.lower() == "auto":
            return "auto"
        out = []
        for part in text.split(","):
            part = part.strip()
            try:
                n = int(part)
            except ValueError:
                self.fail(f"{opt} values must be positive integers{' or auto' if self.allow_auto else ''}, "
                          f"got {part!r}", param, ctx)
            if n <= 0:
                self.fail(f"{opt} values must be positive integers, got {n}", param, ctx)
            out.append(n)
        if not out:
            self.fail(f"{opt} needs at least one value", param, ctx)
        return sorted(set(out))


def parse_engine_args(items: tuple[str, ...]) -> dict:
    """``--engine-arg key=value`` pairs; values parsed as JSON when they look like it (numbers, bools)."""
    import json

    out = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--engine-arg expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        k = k.strip().replace("-", "_")
        if not k:
            raise UserError(f"--engine-arg expects key=value, got {item!r}")
        try:
            out[k] = json.loads(v)
        except ValueError:
            out[k] = v
    return out


def check_writable(path: Path, what: str = "--output") -> None:
    """Fail before a long sweep, not after it, when the output cannot be written."""
    directory = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise UserError(f"{what} {path} is a directory; give a file name such as {path / 'profile.json'}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".throughputlab-check-")
        os.close(fd)
        os.unlink(tmp)
    except OSError as e:
        raise UserError(f"{what} {path} is not writable ({e.strerror or e}); choose another path") from None


def default_profile_name(model: str, device: str) -> Path:
    import re
    import time

    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model.strip("/").split("/")[-1])
    return Path(f"profile-{safe}-{device.replace(':', '')}-{time.strftime('%Y%m%d-%H%M%S')}.json")


def optional_float(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:,.1f}"
