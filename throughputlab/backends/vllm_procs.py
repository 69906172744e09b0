"""The vLLM engine's processes: finding the ones an engine start created, and making sure they exit.

The engine core and its workers are children of this process; the backend follows them for
telemetry (their pids) and, at shutdown, waits for them and kills any that outlive it.
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger(__name__)


def new_children(me, before: set[int], known: list) -> list:
    """Processes below ``me`` that were not there ``before`` and are not in ``known`` (psutil.Process)."""
    known_pids = {p.pid for p in known}
    out = []
    for p in me.children(recursive=True):
        if p.pid in before or p.pid in known_pids:
            continue
        try:
            if "resource_tracker" in " ".join(p.cmdline()):
                continue  # multiprocessing's tracker belongs to this process, not to the engine
        except Exception:
            pass
        out.append(p)
    return out


def stop_all(procs: list, timeout_s: float) -> None:
    """Wait up to ``timeout_s`` for the processes to exit after shutdown, then kill what is left."""
    alive = wait_gone(procs, timeout_s)
    for p in alive:
        log.warning("vLLM engine process %d still running after shutdown; killing it", p.pid)
        try:
            p.kill()
        except Exception:
            pass
    alive = wait_gone(alive, 5.0)
    if alive:
        log.error("vLLM engine processes %s did not exit", [p.pid for p in alive])


def wait_gone(procs: list, timeout_s: float) -> list:
    """Wait until the processes have exited (zombies count as exited); return those still alive."""
    import psutil

    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if is_alive(p)]
    while alive and time.monotonic() < deadline:
        for p in alive:
            try:
                p.wait(timeout=0.05)  # reaps our own children
            except (psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
                pass
        alive = [p for p in alive if is_alive(p)]
    return alive


def is_alive(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:
        return False
