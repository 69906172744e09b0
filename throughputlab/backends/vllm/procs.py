"""The vLLM engine's processes: finding the ones an engine start created, and making sure they exit.

The engine core and its workers are children of this process; the backend follows them for
telemetry (their pids) and, at shutdown, waits for them and kills any that outlive it.

vLLM's engine core does not notice its parent's death: after ``kill -9`` of the bench it ran on,
busy, with nothing to serve. So each engine start also starts a guard, ``python -m
throughputlab.backends.vllm.procs``, in a session of its own: should the bench die before it
shuts the engine down, the guard kills the engine's processes and removes the engine's temporary
folders, then exits. It exits too once the engine's processes are gone; ``close`` stops it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Optional

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


# ---------------------------------------------------------------- the guard


def start_guard(procs: list, dirs: list[str]) -> Optional[subprocess.Popen]:
    """Start the guard for these engine processes (psutil.Process) and temporary folders."""
    import psutil

    if not procs:
        return None
    me = psutil.Process()
    targets = [f"{p.pid}:{p.create_time()!r}" for p in procs if is_alive(p)]
    cmd = [sys.executable, "-m", "throughputlab.backends.vllm.procs", f"{me.pid}:{me.create_time()!r}",
           *targets, "--dirs", *dirs]
    return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def stop_guard(guard: Optional[subprocess.Popen]) -> None:
    if guard is not None and guard.poll() is None:
        guard.kill()
        guard.wait()


def _same(target: tuple[int, float]) -> bool:
    """Whether this pid is still the process it was (its start time guards against a reused pid)."""
    import psutil

    pid, created = target
    try:
        p = psutil.Process(pid)
        return p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _guard(argv: list[str], every_s: float = 0.5) -> int:
    split = argv.index("--dirs") if "--dirs" in argv else len(argv)
    pids = [(int(a.split(":")[0]), float(a.split(":")[1])) for a in argv[:split]]
    parent, engine, dirs = pids[0], pids[1:], argv[split + 1:]
    while True:
        time.sleep(every_s)
        if not _same(parent):
            for t in engine:
                if _same(t):
                    try:
                        os.kill(t[0], signal.SIGKILL)
                    except OSError:
                        pass
            for d in dirs:
                shutil.rmtree(d, ignore_errors=True)
            return 0
        if not any(_same(t) for t in engine):
            return 0


if __name__ == "__main__":
    raise SystemExit(_guard(sys.argv[1:]))
