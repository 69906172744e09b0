"""The base of every stored record, its time stamps, and the atomic write of a saved file."""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict


class Record(BaseModel):
    """A stored record (a file's schema, a spec file's): an unknown key is an error, not silently dropped."""

    model_config = ConfigDict(extra="forbid")


class SettingsRecord(Record):
    """A settings tree (a spec file's, the flags'): a number must also be finite, inf and nan are refused."""

    model_config = ConfigDict(allow_inf_nan=False)


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def write_atomic(path: Path, text: str) -> None:
    """Temp file in the same folder, then a rename: readers never see half a file, and a crash
    leaves the previous one. The file gets the ordinary mode (0666 less the umask)."""
    directory = path.parent if str(path.parent) else Path(".")
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
