"""`throughputlab bench --backend vllm` as a user runs it, interrupted after its first point by
Ctrl-C (SIGINT to the whole process group, as a terminal sends it), by SIGTERM to the bench
process alone (`kill PID`), or by SIGKILL to the bench process alone (`kill -9 PID`, where the
engine's guard cleans up): the finished point is saved with its telemetry, and no engine
process, socket or temp folder is left behind. One engine start each (about 30 s on two cores)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["ctrl-c", "sigterm", "sigkill"])
def test_interrupt_after_first_point_leaves_nothing_running(tmp_path, stop):
    import psutil

    from throughputlab.records.profile import Profile

    out = tmp_path / "vllm.json"
    import tempfile

    # short: vLLM's unix sockets live under the temp folder, and socket paths hold 107 bytes
    tmpdir = tempfile.mkdtemp(prefix="tl-", dir="/tmp")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(tmpdir)}
    cmd = [sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", "tiny", "--only", "gen",
           "-c", "1,2,4,8,16,32,64", "--prompt-len", "16", "--output-len", "32", "--repeats", "3", "--rounds", "1",
           "--engine-arg", "enforce_eager=true", "--py-spy", "--py-spy-points", "1", "-o", str(out)]
    # Its own process group, as a terminal's foreground job: Ctrl-C reaches every process in it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    seen: dict[int, psutil.Process] = {}
    seen_names: set[str] = set()
    try:
        deadline = time.monotonic() + 400
        while True:
            assert proc.poll() is None, f"bench ended before the first point: {proc.stdout.read()[-3000:]}"
            try:
                for p in psutil.Process(proc.pid).children(recursive=True):
                    seen.setdefault(p.pid, p)
                    seen_names.add(p.name())  # engine processes retitle themselves after start
            except psutil.Error:
                pass
            if out.exists():
                try:
                    if any(p.status == "ok" for p in Profile.load(out).generation):
                        break
                except Exception:
                    pass  # written atomically, but the profile may not have points yet
            assert time.monotonic() < deadline, "no point measured within 400 s"
            time.sleep(0.2)
        if stop == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
        else:  # the bench process only: it (SIGTERM) or the engine's guard (SIGKILL) must stop the engine
            proc.send_signal(signal.SIGTERM if stop == "sigterm" else signal.SIGKILL)
        output, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if stop == "sigkill":
        assert proc.returncode == -signal.SIGKILL, output[-3000:]
    else:
        assert proc.returncode == (130 if stop == "ctrl-c" else 143), output[-3000:]  # 128 + SIGINT or SIGTERM
        assert "interrupted" in output and "--resume" in output

    assert any("EngineCore" in n for n in seen_names), seen_names  # the engine ran in its own processes
    names = {pid: p.name() for pid, p in seen.items() if _alive(p)}
    deadline = time.monotonic() + 15  # orphans are reaped by init a moment later
    while names and time.monotonic() < deadline:
        time.sleep(0.5)
        names = {pid: p.name() for pid, p in seen.items() if _alive(p)}
    assert names == {}, f"left running after Ctrl-C: {names}"
    left = os.listdir(tmpdir)
    os.rmdir(tmpdir) if not left else None
    assert not [f for f in left if f.startswith("throughputlab-")], left

    prof = Profile.load(out)
    assert prof.engine is not None and prof.engine.name == "vllm" and prof.engine.kv_cache_tokens
    assert prof.engine.engine_args["enforce_eager"] is True
    done = [p for p in prof.generation if p.status == "ok"]
    assert done and done[0].concurrency == 1
    assert done[0].telemetry is not None and done[0].telemetry.n_samples >= 1
    hp = done[0].host_profile
    assert hp is not None and hp.flamegraph and (out.parent / hp.flamegraph).is_file()


def _alive(p) -> bool:
    try:
        return p.is_running() and p.status() != "zombie"
    except Exception:
        return False


@pytest.mark.slow
def test_tensor_parallel_two_on_vllm_cpu_writes_ok_points_and_shuts_down(tmp_path):
    """`bench --backend vllm --tensor-parallel 2`: vLLM's own mp executor with one rank per core
    (VLLM_CPU_OMP_THREADS_BIND "0|1"); the profile records TP 2 and the engine leaves nothing."""
    import tempfile

    import psutil

    from throughputlab.fit.schema import engine_devices
    from throughputlab.records.profile import Profile

    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("tensor parallelism on CPU needs two cores")
    out = tmp_path / "tp2.json"
    tmpdir = tempfile.mkdtemp(prefix="tl-", dir="/tmp")
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(tmpdir)}
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    r = subprocess.run([sys.executable, "-m", "throughputlab", "bench", "--backend", "vllm", "--model", "tiny",
                        "--only", "gen", "--tensor-parallel", "2", "-c", "1,2", "--prompt-len", "16", "--output-len",
                        "8", "--repeats", "2", "--rounds", "1", "--engine-arg", "enforce_eager=true",
                        "--no-telemetry", "-o", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    prof = Profile.load(out)
    assert [(p.concurrency, p.status) for p in prof.generation] == [(1, "ok"), (2, "ok")]
    assert prof.engine.engine_args["tensor_parallel_size"] == 2 and engine_devices(prof) == 2
    assert prof.spec.generation.tensor_parallel == 2
    time.sleep(1)
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not left, left
