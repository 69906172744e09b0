"""Scratch folders that a killed run does not leave behind for good.

A folder made here holds an owner file (the pid and the process's start time). The run removes
it when it ends; a run that was killed (``kill -9``, a lost session) cannot, so every new folder
of the same prefix first removes the ones whose owner is gone. The start time tells a dead owner
from a new process that got its pid.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator, Optional

OWNER = ".throughputlab-owner"


def _start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux), else None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]  # field 22; the name in parentheses may hold spaces


def _alive(pid: int, start: str) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid
        pass
    now = _start_time(pid)
    return now is None or start == "-" or now == start


def sweep(prefix: str, root: Optional[str] = None) -> list[Path]:
    """Remove the folders ``root/prefix*`` whose owner process is gone; the removed ones.
    Folders without an owner file (not made here, or being made) are left alone."""
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(prefix + "*"):
        try:
            pid, start = (path / OWNER).read_text().split()
            owner = int(pid)
        except (OSError, ValueError):
            continue
        if owner != os.getpid() and not _alive(owner, start):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make(prefix: str, root: Optional[str] = None) -> str:
    """A new private folder ``root/prefix*`` owned by this process (after :func:`sweep`)."""
    sweep(prefix, root)
    path = tempfile.mkdtemp(prefix=prefix, dir=root)
    Path(path, OWNER).write_text(f"{os.getpid()} {_start_time(os.getpid()) or '-'}\n")
    return path


@contextlib.contextmanager
def folder(prefix: str, root: Optional[str] = None) -> Iterator[str]:
    """:func:`make`, removed again on the way out (as ``tempfile.TemporaryDirectory``)."""
    path = make(prefix, root)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
