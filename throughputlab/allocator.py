"""Run CPU benchmarks under a caching allocator (tcmalloc or jemalloc), as vLLM's and PyTorch's
CPU guides recommend.

glibc's allocator hands blocks above its mmap threshold (at most 32 MiB) back to the kernel
when they are freed and faults them in again at the next step. On the 2-core EPYC this project
was measured on, a training step of the demo model took 67k-221k minor page faults (b=1 to 8)
under glibc and under 3k with tcmalloc, which made the steps 15-25% faster and the step time
a cleaner function of the batch, at the same peak memory. The library has to be loaded when
the process starts (``LD_PRELOAD``), so ``bench`` re-executes itself once, before measuring.
"""

from __future__ import annotations

import ctypes.util
import os
import sys
from pathlib import Path
from typing import Optional

CANDIDATES = ("tcmalloc_minimal", "tcmalloc", "jemalloc")
MARK = "THROUGHPUTLAB_ALLOCATOR"  # set in the re-executed process: never loop


def find_library() -> Optional[str]:
    """The first caching allocator the dynamic loader knows (``ldconfig``), else the mimalloc the
    ``cmeel-mimalloc`` package installs beside this environment's packages, else None."""
    for name in CANDIDATES:
        lib = ctypes.util.find_library(name)
        if lib:
            return lib
    return packaged_mimalloc()


def packaged_mimalloc() -> Optional[str]:
    """``libmimalloc.so`` from the cmeel-mimalloc wheel (a pip dependency on Linux), or None."""
    from importlib import metadata

    try:
        files = metadata.distribution("cmeel-mimalloc").files or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "libmimalloc.so":
            path = Path(str(f.locate()))
            if path.exists():
                return str(path.resolve())
    return None


def preloaded() -> Optional[str]:
    """A caching allocator already in ``LD_PRELOAD`` (the user's choice wins)."""
    for part in os.environ.get("LD_PRELOAD", "").replace(":", " ").split():
        if any(name in Path(part).name for name in ("tcmalloc", "jemalloc", "mimalloc")):
            return part
    return None


def returns_memory(device: str) -> bool:
    """Whether this process's allocator hands freed blocks back and faults them in again (glibc on
    the CPU). Then a step's time depends on which sizes ran before it, and a training sweep's later
    visits each warm up at their own size first; a caching allocator (tcmalloc, jemalloc, the CUDA
    one) keeps the blocks, and a step after another size measured the same as after its own."""
    return cpu_run(device) and preloaded() is None


def release_free_memory() -> bool:
    """Hand the allocator's free pages back to the kernel: tcmalloc keeps what the probe's
    micro-benchmarks freed (about 500 MiB on a 2-core CPU), and the next point's peak RSS would
    count it. tcmalloc's MallocExtension_ReleaseFreeMemory, jemalloc's purge of all arenas, or
    glibc's malloc_trim; False where none is there."""
    lib = ctypes.CDLL(None)
    try:
        if hasattr(lib, "MallocExtension_ReleaseFreeMemory"):
            lib.MallocExtension_ReleaseFreeMemory()
            return True
        if hasattr(lib, "mi_collect"):  # mimalloc: collect and return every free page
            lib.mi_collect(ctypes.c_bool(True))
            return True
        if hasattr(lib, "mallctl"):  # jemalloc: "arena.<MALLCTL_ARENAS_ALL>.purge"
            return lib.mallctl(b"arena.4096.purge", None, None, None, ctypes.c_size_t(0)) == 0
        if hasattr(lib, "malloc_trim"):
            return bool(lib.malloc_trim(ctypes.c_size_t(0)))
    except OSError:
        pass
    return False


def cpu_run(device: str) -> bool:
    """Whether the run will be on the CPU, without importing torch (the re-exec comes first)."""
    if device == "cpu":
        return True
    return device == "auto" and not any(os.path.exists(p) for p in ("/dev/nvidiactl", "/dev/kfd"))


def launched_as_cli() -> bool:
    """Only the ``throughputlab`` command re-executes itself, never a host process (tests, notebooks)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    return argv0 is not None and (argv0.name == "throughputlab" or argv0.parts[-2:] == ("throughputlab", "__main__.py"))


def preload_env(lib: str, env: Optional[dict] = None) -> dict:
    """``env`` (default: this process's) with ``lib`` preloaded. mimalloc hands free pages back to the
    kernel 10 ms after they are freed (its purge delay): 10 s instead, so a training step reuses the
    blocks the step before freed, as under tcmalloc, and :func:`release_free_memory` can still hand
    them back (with -1, never purge, mimalloc's forced collection keeps them); the user's own
    setting wins."""
    env = dict(os.environ if env is None else env)
    env["LD_PRELOAD"] = " ".join(p for p in (lib, env.get("LD_PRELOAD", "")) if p)
    if "mimalloc" in Path(lib).name:
        env.setdefault("MIMALLOC_PURGE_DELAY", "10000")
    return env


def reexec_with(lib: str) -> None:
    """Replace this process by the same command with ``lib`` preloaded (same pid: signals, Ctrl-C)."""
    env = preload_env(lib)
    env[MARK] = lib
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "throughputlab", *sys.argv[1:]], env)


def maybe_reexec(choice: str, device: str, in_process_only: bool) -> Optional[str]:
    """With ``--allocator auto`` on a CPU run of the in-process backends, come back under a
    caching allocator when the system has one. Engines (vllm, openai) keep their own setup.
    Returns the note a run under glibc prints with its header (the caller prints it once, on
    stdout, when the sweep really starts), else None."""
    if choice != "auto" or os.environ.get(MARK) or preloaded() or not in_process_only:
        return None
    if not cpu_run(device) or not launched_as_cli():
        return None
    lib = find_library()
    if lib:
        reexec_with(lib)
    return GLIBC_NOTE


GLIBC_NOTE = ("note: no caching allocator found (tcmalloc, jemalloc or the mimalloc of the cmeel-mimalloc package): "
              "this CPU run stays under glibc's allocator, which faults large blocks in again at every step; "
              "pip install cmeel-mimalloc or apt install libtcmalloc-minimal4 makes it faster, "
              "--allocator system keeps glibc without this note")
