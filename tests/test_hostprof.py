"""py-spy host profiles: real recordings of a real process tree, and the summary arithmetic."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from throughputlab.errors import EngineMissing, UserError
from throughputlab.hostprof import MIN_RECORD_S, PySpyRecorder, format_summary, merge_speedscope, summarise_speedscope

needs_pyspy = pytest.mark.skipif(shutil.which("py-spy") is None, reason="py-spy is not installed")

CHILD = """
import time
def spin_in_child(s):
    t = time.time()
    while time.time() - t < s:
        sum(i * i for i in range(500))
spin_in_child(8)
"""


@pytest.fixture
def child():
    """A Python process spinning in spin_in_child for 8 s, given half a second to start; killed after the test."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD])
    time.sleep(0.5)
    yield proc
    proc.kill()
    proc.wait()


def spin_in_parent(s):
    t = time.time()
    while time.time() - t < s:
        sum(i * i for i in range(500))


def test_summary_self_share_and_process_share():
    frames = [{"name": 'process 10:"python bench"', "file": "", "line": 0},
              {"name": 'process 11:"VLLM::Worker"', "file": "", "line": 0},
              {"name": "main", "file": "/x/site-packages/pkg/a.py", "line": 1},
              {"name": "forward", "file": "/x/site-packages/pkg/b.py", "line": 2}]
    data = {"shared": {"frames": frames}, "profiles": [
        {"type": "sampled", "name": "Process 10 Thread 10", "samples": [[0, 2], [0, 2, 3], [0, 2, 3]], "weights": [1, 1, 1]},
        {"type": "sampled", "name": "Process 11 Thread 11", "samples": [[0, 1, 3], [0, 1]], "weights": [1, 1]},
    ]}
    n, top, procs = summarise_speedscope(data)
    assert n == 5
    assert top == [("forward (pkg/b.py)", 0.6), ("main (pkg/a.py)", 0.2), ("(no Python frame)", 0.2)]
    assert procs == [("10 bench", 0.6), ("11 VLLM::Worker", 0.4)]


def test_merge_keeps_frame_indices_straight(tmp_path):
    a = {"shared": {"frames": [{"name": "f", "file": "a.py"}]},
         "profiles": [{"type": "sampled", "samples": [[0]], "weights": [1]}]}
    b = {"shared": {"frames": [{"name": "g", "file": "b.py"}]},
         "profiles": [{"type": "sampled", "samples": [[0], [0]], "weights": [1, 1]}]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    merged = merge_speedscope([tmp_path / "a.json", tmp_path / "b.json"])
    _, top, _ = summarise_speedscope(merged)
    assert dict(top) == {"g (b.py)": pytest.approx(2 / 3, abs=1e-3), "f (a.py)": pytest.approx(1 / 3, abs=1e-3)}


@pytest.mark.slow
@needs_pyspy
def test_records_this_process_and_its_children(tmp_path, child):
    rec = PySpyRecorder(tmp_path / "prof-pyspy", rate_hz=100)
    rec.start("generation-4", [os.getpid(), child.pid])
    spin_in_parent(1.5)
    hp = rec.stop()
    assert hp.error is None, hp.error
    assert hp.flamegraph == "prof-pyspy/generation-4.speedscope.json"
    data = json.loads((tmp_path / hp.flamegraph).read_text())
    assert data["profiles"] and data["shared"]["frames"]
    assert hp.n_samples > 50
    names = [name for name, _ in hp.top_functions]
    assert any("spin_in_parent" in n for n in names) and any("spin_in_child" in n for n in names)
    assert {p.split()[0] for p, _ in hp.process_shares} >= {str(os.getpid()), str(child.pid)}
    text = format_summary(hp)
    assert "generation-4.speedscope.json" in text and "%" in text


@pytest.mark.slow
@needs_pyspy
def test_a_point_shorter_than_the_first_samples_still_gets_a_flamegraph(tmp_path, child):
    rec = PySpyRecorder(tmp_path / "prof-pyspy", rate_hz=100)
    rec.start("generation-1", [child.pid])
    t = time.monotonic()
    hp = rec.stop()  # at once: the point's work took no time
    took = time.monotonic() - t
    assert hp.error is None, hp.error
    assert hp.flamegraph and (tmp_path / hp.flamegraph).is_file() and hp.n_samples >= 1
    assert any("spin_in_child" in name for name, _ in hp.top_functions)
    assert MIN_RECORD_S <= took < MIN_RECORD_S + 30


def test_missing_pyspy_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(EngineMissing, match="pip install py-spy"):
        PySpyRecorder(tmp_path).start("generation-1", [os.getpid()])


def test_ptrace_refusal_is_a_clear_error(monkeypatch, tmp_path):
    """A py-spy that is refused by the kernel: the message says how to allow it."""
    exe = tmp_path / "py-spy"
    exe.write_text("#!/bin/sh\necho 'Error: Permission Denied: Operation not permitted (os error 1)' >&2\nexit 1\n")
    exe.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(exe))
    with pytest.raises(UserError, match="ptrace_scope"):
        PySpyRecorder(tmp_path / "out").start("generation-1", [os.getpid()])


@needs_pyspy
def test_close_stops_a_running_recording(tmp_path):
    rec = PySpyRecorder(tmp_path)
    rec.start("generation-1", [os.getpid()])
    procs = [p for _, p, _, _ in rec._procs]
    rec.close()
    assert all(p.poll() is not None for p in procs)
