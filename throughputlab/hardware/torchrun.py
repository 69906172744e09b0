"""PyTorch's launcher (``torch.distributed.run``) as a child process that leaves nothing behind,
and its failure summary in one line.

The launcher starts each rank in a session of its own, so killing the launcher's process
group does not reach the ranks: :func:`run_tree` remembers every descendant it has seen while
it waits (once the launcher is dead its orphans are no longer its children) and, on the way
out, stops the launcher with SIGTERM (which it passes on to its ranks), then SIGKILLs what is
left: the launcher's group, each rank's own group and every process seen.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

log = logging.getLogger(__name__)


class LauncherTimeout(Exception):
    """The launcher ran past its deadline; it and every process it started have been killed."""


def run_tree(cmd: list[str], env: dict[str, str], log_path: Path, timeout_s: float) -> int:
    """Run ``cmd`` (the launcher) in its own session with its output in ``log_path`` and return
    its exit code; raise LauncherTimeout past ``timeout_s``. On any way out of here (a return,
    the timeout, Ctrl-C) none of its processes is left alive."""
    import psutil

    tracked: dict[int, psutil.Process] = {}
    with open(log_path, "w") as logf:
        log.info("starting %s", " ".join(cmd))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            while proc.poll() is None:
                _track(proc.pid, tracked)
                if time.monotonic() > deadline:
                    raise LauncherTimeout(f"did not finish within {timeout_s:g} s")
                time.sleep(0.05)
            return proc.returncode
        finally:
            _stop(proc, tracked)


def _track(root: int, tracked: dict) -> None:
    """Remember every descendant seen: once the launcher dies, its orphans are no longer its children."""
    import psutil

    try:
        for p in psutil.Process(root).children(recursive=True):
            tracked.setdefault(p.pid, p)
    except psutil.Error:
        pass


def _stop(proc: subprocess.Popen, tracked: dict) -> None:
    import psutil

    try:
        if proc.poll() is None:
            _track(proc.pid, tracked)
            _signal_group(proc.pid, signal.SIGTERM)  # the launcher passes it on to its ranks
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
    except KeyboardInterrupt:  # a second Ctrl-C: straight to SIGKILL
        pass
    finally:
        if proc.poll() is None:  # not reaped yet, so its pid (its group's id) cannot have been reused
            _signal_group(proc.pid, signal.SIGKILL)
        for p in list(tracked.values()):  # children born since the last look
            try:
                for c in p.children(recursive=True):
                    tracked.setdefault(c.pid, c)
            except psutil.Error:
                pass
        for p in list(tracked.values()):
            try:
                if p.is_running():
                    if os.getpgid(p.pid) == p.pid:  # a worker leads its own group (start_new_session)
                        _signal_group(p.pid, signal.SIGKILL)
                    p.kill()
            except (psutil.Error, OSError):
                pass
        proc.wait()
        psutil.wait_procs(list(tracked.values()), timeout=5)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def read_log(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def failure_summary(text: str) -> str:
    """The launcher's account of a failure, first failure first ("rank 1: exit code -9 (SIGKILL)"),
    with the rank's error where it recorded one; else the log's last lines."""
    root = text.find("Root Cause")
    sections = [text[root:], text[:root]] if root >= 0 else [text]
    found = []
    for section in sections:
        for m in re.finditer(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)[^\n]*?(\(SIG\w+\))?\s*\n"
                             r"(?:.*\n)*?\s*traceback\s*:\s*([\s\S]*?)(?=\n-{5,}|\n={5,}|\n\[\d+\]:|\Z)", section):
            rank, code, sig, tb = m.groups()
            last = [ln.strip() for ln in tb.splitlines() if ln.strip()]
            plain = not last or last[-1].startswith("Signal ") or "To enable traceback" in last[-1]
            why = "" if plain else f": {last[-1]}"
            found.append(f"rank {rank} exit code {code}{' ' + sig if sig else ''}{why}")
    if found:
        return "; ".join(dict.fromkeys(found))[:1500]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "Warning" not in ln]
    return " | ".join(lines[-4:])[:1500] or "no output"
