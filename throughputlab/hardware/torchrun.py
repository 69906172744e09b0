"""PyTorch's launcher (``torch.distributed.run``) as a child process that leaves nothing behind,
and its failure summary in one line.

Every launch goes through :func:`run_launcher`: the collective benchmark
(:mod:`throughputlab.hardware.collectives`), the training ranks and the generation replicas
(:mod:`throughputlab.distributed.launch`). The launcher starts each rank in a session of its
own, so killing the launcher's process group does not reach the ranks: :class:`ProcessTree`
remembers every descendant it has seen while it waits (once the launcher is dead its orphans
are no longer its children) and, on the way out, stops the launcher with SIGTERM (which it
passes on to its ranks), then SIGKILLs what is left: the launcher's group, each rank's own
group and every process seen.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Callable, Optional

log = logging.getLogger(__name__)


def run_launcher(cmd: list[str], env: dict[str, str], log_path: Path, *, timeout_s: Optional[float] = None,
                 poll: Optional[Callable[[], None]] = None, poll_s: float = 0.05, grace_s: float = 5.0,
                 append: bool = False) -> tuple[int, bool]:
    """Run ``cmd`` (the launcher) in its own session with its output written (``append``: appended)
    to ``log_path``, calling ``poll()`` every ``poll_s`` while it runs and once after; stop it past
    ``timeout_s``. Returns (exit code, timed out). On any way out of here (a return, the timeout,
    Ctrl-C, an error in ``poll``) none of its processes is left alive."""
    with open(log_path, "ab" if append else "wb") as logf:
        log.info("starting %s", " ".join(cmd))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        tree = ProcessTree(proc)
        timed_out = False
        try:
            started = time.monotonic()
            while proc.poll() is None:
                tree.snapshot()
                if poll is not None:
                    poll()
                if timeout_s is not None and time.monotonic() - started > timeout_s:
                    timed_out = True
                    break
                time.sleep(poll_s)
        finally:
            tree.stop(grace_s)
    if poll is not None:
        poll()
    return proc.returncode, timed_out


class ProcessTree:
    """The launcher's child and every descendant seen while it ran: once the launcher is dead its
    orphans are no longer its children, and each rank leads a session of its own, so neither the
    child's process group nor its children at the end reach them all."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.seen: dict = {}  # pid -> psutil.Process (its identity checked by start time)

    def snapshot(self) -> None:
        """Remember every descendant of the launcher, and of every process seen (born since the last look)."""
        import psutil

        for root in [self.proc.pid, *self.seen]:
            try:
                for p in psutil.Process(root).children(recursive=True):
                    self.seen.setdefault(p.pid, p)
            except psutil.Error:
                pass

    def alive(self) -> list:
        import psutil

        out = []
        for p in list(self.seen.values()):
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(p)
            except psutil.Error:
                pass
        return out

    def stop(self, grace_s: float) -> None:
        """SIGTERM to the launcher's group (the launcher passes it on to its ranks), ``grace_s`` for it
        to end, then SIGKILL to the group, to each rank's own group and to every process seen. A
        second Ctrl-C during the grace period goes straight to SIGKILL."""
        import psutil

        try:
            self.snapshot()
            if self.proc.poll() is None:
                _signal_group(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:
            pass
        finally:
            self.snapshot()
            if self.proc.poll() is None:  # not reaped yet, so its pid (its group's id) cannot have been reused
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.kill()
            left = self.alive()
            for p in left:
                try:
                    if os.getpgid(p.pid) == p.pid:  # a rank leads its own group (start_new_session)
                        _signal_group(p.pid, signal.SIGKILL)
                    p.kill()
                except (psutil.Error, OSError):
                    pass
            self.proc.wait()
            psutil.wait_procs(left, timeout=10)
            still = self.alive()
            if still:
                log.warning("processes still alive after SIGKILL: %s", [p.pid for p in still])


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
