"""Scratch folders: what a killed run leaves is removed by the next run of the same kind."""

import os
import signal
import subprocess
import sys
import time

import pytest

from throughputlab import scratch

PREFIX = "throughputlab-test-"


def _owned_by(path, pid: int, start: str) -> None:
    path.mkdir()
    (path / scratch.OWNER).write_text(f"{pid} {start}\n")


@pytest.mark.slow
def test_a_killed_runs_folder_is_removed_by_the_next_one(tmp_path):
    code = ("import sys, time; from throughputlab import scratch\n"
            f"with scratch.folder({PREFIX!r}, {str(tmp_path)!r}) as d:\n"
            "    print(d, flush=True); time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        left = proc.stdout.readline().strip()
        assert os.path.isdir(left)
        assert scratch.sweep(PREFIX, str(tmp_path)) == []  # its owner is alive: kept
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    assert os.path.isdir(left)  # kill -9: nothing ran on the way out
    new = scratch.make(PREFIX, str(tmp_path))
    assert not os.path.exists(left) and os.path.isdir(new)
    with scratch.folder(PREFIX, str(tmp_path)) as inner:
        assert os.path.isdir(new) and os.path.isdir(inner)  # this process's own folders stay
    assert not os.path.exists(inner)


@pytest.mark.slow
def test_only_folders_of_a_gone_owner_are_removed(tmp_path):
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.2)
        me = scratch._start_time(os.getpid())
        _owned_by(tmp_path / f"{PREFIX}dead", done.pid, "1")
        _owned_by(tmp_path / f"{PREFIX}live", live.pid, scratch._start_time(live.pid))
        _owned_by(tmp_path / f"{PREFIX}reused", live.pid, str(int(scratch._start_time(live.pid)) - 1))
        (tmp_path / f"{PREFIX}foreign").mkdir()  # no owner file: not made here
        _owned_by(tmp_path / "another-prefix-dead", done.pid, "1")
        _owned_by(tmp_path / f"{PREFIX}mine", os.getpid(), me)
        removed = scratch.sweep(PREFIX, str(tmp_path))
    finally:
        live.kill()
        live.wait()
    assert sorted(p.name for p in removed) == [f"{PREFIX}dead", f"{PREFIX}reused"]
    assert sorted(p.name for p in tmp_path.iterdir()) == \
        ["another-prefix-dead", f"{PREFIX}foreign", f"{PREFIX}live", f"{PREFIX}mine"]
