"""Host profiling with py-spy: where the Python processes spend a point's time.

``PySpyRecorder`` attaches ``py-spy record --subprocesses`` to the benchmark process and the
engine's processes while a point runs, writes one speedscope file per point next to the
profile (open it at https://www.speedscope.app or with ``speedscope FILE``), and summarises
it as the share of samples whose innermost frame is each of the top functions. A point whose
throughput is held back by the host (scheduling, tokenisation, Python overhead) shows Python
functions at the top instead of the model's forward pass.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from throughputlab import scratch
from throughputlab.errors import EngineMissing, UserError
from throughputlab.records.profile import HostProfile

log = logging.getLogger(__name__)

TOP_N = 10
MIN_RECORD_S = 1.0  # 100 samples at py-spy's default 100 Hz
_PTRACE_HINT = ("py-spy is not permitted to read other processes' memory (ptrace): run as root, or "
                "`sudo sysctl kernel.yama.ptrace_scope=0`, or in Docker add `--cap-add SYS_PTRACE`")


def find_pyspy() -> str:
    exe = shutil.which("py-spy")
    if exe is None:
        raise EngineMissing("--py-spy needs the py-spy program on PATH: pip install py-spy")
    return exe


def _denied(text: str) -> bool:
    t = text.lower()
    return "permission denied" in t or "operation not permitted" in t or "ptrace" in t


def check_permitted(exe: str, pid: int) -> None:
    """One `py-spy dump` of ``pid``: fails fast, with the fix, where ptrace is not allowed."""
    try:
        out = subprocess.run([exe, "dump", "--pid", str(pid), "--nonblocking"], capture_output=True, text=True,
                             timeout=30)
    except subprocess.TimeoutExpired:
        raise UserError(f"py-spy could not read process {pid} within 30 s; {_PTRACE_HINT}") from None
    if out.returncode != 0:
        err = (out.stderr or out.stdout).strip()
        if _denied(err):
            raise UserError(_PTRACE_HINT)
        first = err.splitlines()[0] if err else f"exit code {out.returncode}"
        raise UserError(f"py-spy cannot sample process {pid}: {first}")


def _roots(pids: list[int]) -> list[int]:
    """The pids that are not descendants of another listed pid (``--subprocesses`` covers those)."""
    import psutil

    wanted = list(dict.fromkeys(pids))
    listed = set(wanted)
    roots = []
    for pid in wanted:
        try:
            ancestors = {p.pid for p in psutil.Process(pid).parents()}
        except psutil.Error:
            continue
        if not ancestors & listed:
            roots.append(pid)
    return roots


def summarise_speedscope(data: dict, top_n: int = TOP_N) -> tuple[int, list[tuple[str, float]], list[tuple[str, float]]]:
    """(samples, top functions, processes), each with its share of the samples, over every profile.

    A function's share counts the samples whose innermost Python frame it is (self time);
    a process's share counts the samples taken in it. py-spy --subprocesses puts a
    ``process PID:"cmdline"`` frame for each process from the root down to the sampled one.
    """
    frames = data.get("shared", {}).get("frames", [])
    names = [_frame_name(f) for f in frames]
    by_function: Counter = Counter()
    by_process: Counter = Counter()
    total = 0.0
    n = 0
    for prof in data.get("profiles", []):
        if prof.get("type") != "sampled":
            continue
        samples = prof.get("samples", [])
        weights = prof.get("weights") or [1] * len(samples)
        default_process = _process_from_profile_name(prof.get("name", ""))
        for stack, w in zip(samples, weights):
            n += 1
            total += w
            if not stack:
                continue
            # nested: a worker's stack starts with its parent's process frames, then its own
            owner = default_process
            for i in stack:
                label = _process_label(frames[i])
                if label is None:
                    break
                owner = label
            by_process[owner] += w
            by_function["(no Python frame)" if _process_label(frames[stack[-1]]) else names[stack[-1]]] += w
    if total <= 0:
        return n, [], []
    share = lambda c, k: [(name, round(w / total, 4)) for name, w in c.most_common(k)]  # noqa: E731
    return n, share(by_function, top_n), share(by_process, top_n)


def _process_label(frame: dict) -> Optional[str]:
    """'process 123:"VLLM::EngineCore"' -> '123 VLLM::EngineCore' (None for an ordinary frame)."""
    name = frame.get("name", "")
    if frame.get("file") or not name.startswith("process "):
        return None
    pid, _, cmd = name[len("process "):].partition(":")
    cmd = cmd.strip('"')
    words = cmd.split()
    if len(words) > 1 and "python" in os.path.basename(words[0]):
        cmd = " ".join([os.path.basename(words[1]), *words[2:]])  # python /path/to/throughputlab bench ...
    return f"{pid} {cmd[:80]}".strip()


def _process_from_profile_name(name: str) -> str:
    m = re.match(r"Process (\d+)", name)
    return m.group(1) if m else "?"


def _frame_name(frame: dict) -> str:
    name = frame.get("name", "?")
    file = frame.get("file")
    return f"{name} ({_short(file)})" if file else name


def _short(path: str) -> str:
    """site-packages/vllm/v1/engine/core.py -> vllm/v1/engine/core.py"""
    p = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/", "/lib/python3"):
        i = p.rfind(marker)
        if i >= 0:
            p = p[i + len(marker):]
            if marker == "/lib/python3":
                p = p.split("/", 1)[-1]
            break
    return p


def merge_speedscope(files: list[Path]) -> dict:
    """One speedscope document holding the profiles of several py-spy runs."""
    frames: list = []
    profiles: list = []
    name = None
    for f in files:
        data = json.loads(f.read_text())
        offset = len(frames)
        frames.extend(data.get("shared", {}).get("frames", []))
        for prof in data.get("profiles", []):
            if prof.get("type") == "sampled":
                prof = dict(prof, samples=[[i + offset for i in s] for s in prof.get("samples", [])])
            profiles.append(prof)
        name = name or data.get("name")
    return {"$schema": "https://www.speedscope.app/file-format-schema.json", "shared": {"frames": frames},
            "profiles": profiles, "name": name or "py-spy", "activeProfileIndex": 0,
            "exporter": "throughputlab (py-spy speedscope)"}


class PySpyRecorder:
    """py-spy around one point at a time: ``start(label, pids)`` ... ``stop() -> HostProfile``."""

    def __init__(self, out_dir: Path, rate_hz: int = 100, nonblocking: bool = True):
        if rate_hz <= 0:
            raise UserError(f"py-spy rate must be a positive integer, got {rate_hz}")
        self.out_dir = Path(out_dir)
        self.rate_hz = int(rate_hz)
        # --nonblocking: py-spy reads memory without pausing the target, so the measured
        # tokens/s is not slowed by the profiler (at the price of an occasional torn stack).
        self.nonblocking = nonblocking
        self._exe: Optional[str] = None
        self._procs: list[tuple[int, subprocess.Popen, Path, object]] = []
        self._label: Optional[str] = None
        self._pids: list[int] = []
        self._tmp: Optional[str] = None
        self._since = 0.0

    def start(self, point_label: str, pids: list[int]) -> None:
        if self._procs:
            raise RuntimeError("PySpyRecorder.start() while a recording is running")
        if self._exe is None:
            exe = find_pyspy()
            check_permitted(exe, pids[0] if pids else os.getpid())
            self._exe = exe
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"cannot create the py-spy folder {self.out_dir}: {e.strerror or e}") from None
        self._label = re.sub(r"[^A-Za-z0-9_.-]+", "_", point_label) or "point"
        self._pids = list(dict.fromkeys(pids))
        self._tmp = scratch.make("throughputlab-pyspy-")
        for pid in _roots(self._pids):
            out = Path(self._tmp) / f"{pid}.speedscope.json"
            err = open(Path(self._tmp) / f"{pid}.log", "w")
            cmd = [self._exe, "record", "--pid", str(pid), "--rate", str(self.rate_hz), "--format", "speedscope",
                   "--output", str(out), "--subprocesses"]
            if self.nonblocking:
                cmd.append("--nonblocking")
            proc = subprocess.Popen(cmd, stdout=err, stderr=subprocess.STDOUT, start_new_session=True)
            self._procs.append((pid, proc, out, err))
        # Wait until each py-spy has attached and installed its Ctrl-C handler ("Sampling
        # process ..."): stopped before that, on a loaded machine, it would exit without output.
        deadline = time.monotonic() + 15
        waiting = list(self._procs)
        while waiting and time.monotonic() < deadline:
            waiting = [w for w in waiting if w[1].poll() is None and "Sampling process" not in _read(w[3])]
            if waiting:
                time.sleep(0.02)
        for pid, proc, _, err in self._procs:
            if proc.poll() is not None and proc.returncode != 0:
                text = _read(err)
                self.close()
                if _denied(text):
                    raise UserError(_PTRACE_HINT)
                raise UserError(f"py-spy could not record process {pid}: {_last_line(text)}")
        self._since = time.monotonic()

    def stop(self) -> HostProfile:
        if not self._procs:
            raise RuntimeError("PySpyRecorder.stop() before start()")
        errors = []
        files = []
        # A point shorter than the sampler's first samples (a few tokens at one request on a loaded machine) would
        # leave py-spy nothing to write: it records for MIN_RECORD_S at least, the point's work first.
        time.sleep(max(0.0, MIN_RECORD_S - (time.monotonic() - self._since)))
        for pid, proc, out, err in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                errors.append(f"py-spy for pid {pid} did not finish writing")
            if out.is_file() and out.stat().st_size > 0:
                files.append(out)
            else:
                errors.append(f"pid {pid}: {_last_line(_read(err)) or 'no samples written'}")
            err.close()
        self._procs = []
        result = HostProfile(pids=self._pids)
        try:
            if files:
                data = merge_speedscope(files)
                target = self.out_dir / f"{self._label}.speedscope.json"
                target.write_text(json.dumps(data))
                result.flamegraph = _relative(target, self.out_dir.parent)
                result.n_samples, result.top_functions, result.process_shares = summarise_speedscope(data)
        except (OSError, ValueError) as e:
            errors.append(f"cannot read the py-spy output: {e}")
        finally:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        if errors:
            result.error = "; ".join(errors)[:500]
        return result

    def close(self) -> None:
        """Stop any py-spy still running (after an error or Ctrl-C)."""
        for _, proc, _, err in self._procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            err.close()
        self._procs = []
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None


def format_summary(hp: HostProfile, top_n: int = 5) -> str:
    """A few readable lines: the flame graph file and the top functions by share of samples."""
    if hp.error and not hp.top_functions:
        return f"py-spy: {hp.error}"
    lines = [f"py-spy: {hp.n_samples} samples from pids {', '.join(map(str, hp.pids))} -> {hp.flamegraph}"]
    for name, share in hp.top_functions[:top_n]:
        lines.append(f"  {100 * share:5.1f}%  {name}")
    if hp.process_shares:
        lines.append("  by process: " + ", ".join(f"{name} {100 * share:.0f}%" for name, share in hp.process_shares))
    return "\n".join(lines)


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.resolve().relative_to(base.resolve()))
    except ValueError:
        return str(path)


def _read(f) -> str:
    """What py-spy has written so far to its log (read through a separate handle: the offset of
    ``f`` is shared with the child)."""
    try:
        with open(f.name, errors="replace") as g:
            return g.read()
    except (OSError, ValueError):
        return ""


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
