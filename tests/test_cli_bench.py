"""`throughputlab bench/hardware/models/export` as a user runs them: real tiny model, real processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from conftest import assert_user_error, run_cli
from throughputlab.records.profile import Profile

REPORTS = Path(__file__).resolve().parent.parent / "reports"

FAST = ["--model", "tiny", "--prompt-len", "8", "--output-len", "4", "--seq-len", "16", "--repeats", "2", "--rounds", "1",
        "--warmup", "1", "--no-telemetry"]


@pytest.mark.slow
def test_help_is_fast_and_lists_commands():
    t = time.perf_counter()
    r = run_cli("--help")
    assert r.returncode == 0
    for cmd in ("bench", "hardware", "models", "export", "fit", "report", "decide", "lr"):
        assert cmd in r.stdout
    assert "unavailable" not in r.stdout
    assert time.perf_counter() - t < 15  # no torch/vllm import at start-up (generous on a loaded machine)


@pytest.mark.slow
def test_cli_imports_no_engine():
    code = ("import sys; from throughputlab.cli import cli, COMMANDS\n"
            "from click.testing import CliRunner\n"
            "r = CliRunner().invoke(cli, ['--help'])\n"
            "print(sorted(m for m in ('torch', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.mark.slow
def test_models_lists_presets():
    r = run_cli("models", "--json")
    rows = json.loads(r.stdout)
    names = {x["name"] for x in rows}
    assert {"tiny", "demo", "qwen2.5-7b", "qwen3-30b-a3b"} <= names
    moe = next(x for x in rows if x["name"] == "qwen3-30b-a3b")
    assert moe["params_active"] < moe["params_total"] / 5


@pytest.mark.slow
def test_hardware_describes_cpu_and_measures():
    r = run_cli("hardware", "--device", "cpu", "--json")
    assert r.returncode == 0, r.stderr
    hw = json.loads(r.stdout)
    assert hw["device_type"] == "cpu" and hw["datasheet"] is None
    mb = hw["microbench"]
    assert mb["copy_bandwidth_bytes_per_s"] > 1e8 and mb["matmul_flops_per_s"] > 1e8
    assert mb["gemv_bandwidth_bytes_per_s"] > 1e8 and mb["gemv_bytes"] >= 2**28  # beyond the caches


@pytest.mark.slow
@pytest.mark.parametrize("args,fragments", [
    (["bench", "--model", "/nonexistent/model"], ["no such model folder"]),
    (["bench", "--model", "qwen2.5-7"], ["unknown preset", "did you mean qwen2.5-7b"]),
    (["bench", "--concurrency", "0"], ["--concurrency values must be positive integers, got 0"]),
    (["bench", "--concurrency", "abc"], ["--concurrency", "'abc'"]),
    (["bench", "--batch-sizes", "2,-1"], ["--batch-sizes", "positive"]),
    (["bench", "-o", "/proc/version/x.json"], ["not writable"]),
    (["bench", "--only", "gen", "--backend", "openai", "--model", "tiny", "-o", "OUT"], ["--url"]),
    (["bench", "--contexts", "32,64", "--prompt-len", "100"], ["--contexts replaces --prompt-len", "add 100"]),
    (["bench", "--seq-lens", "64,128", "--seq-len", "32"], ["--seq-lens replaces --seq-len", "add 32"]),
    (["export", "/nonexistent.json"], ["does not exist"]),
    (["nosuchcommand"], ["no such command"]),
])
def test_bad_input_is_one_line_exit_2(args, fragments, tmp_path):
    args = [str(tmp_path / "o.json") if a == "OUT" else a for a in args]
    assert_user_error(run_cli(*args, cwd=tmp_path), *fragments)


@pytest.mark.slow
def test_a_phase_skipped_by_only_notes_its_unused_flags(tmp_path):
    r = run_cli("bench", "-m", "tiny", "--only", "gen", "-b", "1,2", "--seq-len", "32", "--print-spec", cwd=tmp_path)
    assert r.returncode == 0 and "note: --batch-sizes, --seq-len not used: --only gen skips the training sweep" \
        in r.stderr
    r = run_cli("bench", "-m", "tiny", "--contexts", "32,64", "--prompt-len", "64", "--print-spec", cwd=tmp_path)
    assert r.returncode == 0 and "note:" not in r.stderr and "contexts: [32, 64]" in r.stdout


@pytest.mark.slow
def test_missing_model_folder_weights(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64,
                                                           "num_hidden_layers": 1, "num_attention_heads": 2,
                                                           "vocab_size": 100, "intermediate_size": 128}))
    assert_user_error(run_cli("bench", "--model", str(tmp_path / "m"), cwd=tmp_path), "--random-weights")


@pytest.mark.slow
def test_broken_profiles_are_one_line_errors(tmp_path):
    trunc = tmp_path / "t.json"
    trunc.write_text('{"schema_version": 1, "kind": "meas')
    assert_user_error(run_cli("export", str(trunc)), "not valid JSON", "bench --force -o")
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"schema_version": 0}))
    assert_user_error(run_cli("export", str(old)), "schema_version 0")


@pytest.mark.slow
def test_bench_writes_profile_export_and_refuses_overwrite(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("bench", *FAST, "-c", "1,2,4", "-b", "1,2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert [(p.concurrency, p.status) for p in prof.generation] == [(1, "ok"), (2, "ok"), (4, "ok")]
    assert [(p.micro_batch, p.status) for p in prof.training] == [(1, "ok"), (2, "ok")]
    assert all(len(p.samples) >= 2 for p in prof.generation)
    env = prof.environment
    assert env.packages["torch"] and env.command_line[:2] == ["throughputlab", "bench"]
    assert prof.hardware.microbench.copy_bandwidth_bytes_per_s > 0
    # one answer: bench, fit and report state the same largest micro-batch, labelled
    from throughputlab.fit.schema import memory_statement
    from throughputlab.fit.training import fit_memory

    statement = memory_statement(fit_memory(prof))
    # (the tiny model's RSS may not grow from b=1 to 2: then the line gives no answer, and says so)
    assert statement.startswith("largest micro-batch that fits: ") and "measured: largest ok 2, no OOM" in statement
    assert statement in " ".join(r.stdout.split())
    f = run_cli("fit", str(out), "--bootstrap", "0")
    assert f.returncode == 0, f.stderr and statement in f.stdout
    rep = run_cli("report", str(out), "-o", str(tmp_path / "r.html"))
    assert rep.returncode == 0 and statement.replace("'", "&#x27;") in (tmp_path / "r.html").read_text()

    r = run_cli("export", str(out))
    assert r.returncode == 0, r.stderr
    gen = pd.read_csv(tmp_path / "p-generation.csv")
    assert list(gen.concurrency) == [1, 2, 4] and (gen.tokens_per_s > 0).all()
    samples = pd.read_csv(tmp_path / "p-samples.csv")
    assert len(samples) == sum(len(p.samples) for p in prof.generation + prof.training)

    assert_user_error(run_cli("bench", *FAST, "-o", str(out)), "exists", "--resume")


@pytest.mark.slow
def test_kill_9_keeps_points_and_resume_finishes_without_remeasuring(tmp_path):
    out = tmp_path / "k.json"
    args = [sys.executable, "-m", "throughputlab", "bench", *FAST, "--only", "gen", "--output-len", "24",
            "--repeats", "3", "-c", "1,2,3,4,5,6,7,8", "-o", str(out)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.time() + 240
        n = 0
        while time.time() < deadline:
            time.sleep(0.2)
            if out.exists():
                try:
                    n = len(Profile.load(out).generation)
                except Exception:
                    n = 0
            if n >= 2:
                break
        assert n >= 2, "the sweep did not get two points in time"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    before = Profile.load(out)  # a complete, valid file despite kill -9
    done = {p.concurrency: p.measured_at for p in before.generation}
    assert len(done) >= 2 and all(p.status == "ok" for p in before.generation)

    r = run_cli("bench", *FAST, "--only", "gen", "--output-len", "24", "--repeats", "3", "-c", "1,2,3,4,5,6,7,8",
                "-o", str(out), "--resume")
    assert r.returncode == 0, r.stderr
    after = Profile.load(out)
    assert sorted(p.concurrency for p in after.generation) == [1, 2, 3, 4, 5, 6, 7, 8]
    for p in after.generation:
        if p.concurrency in done:
            assert p.measured_at == done[p.concurrency]  # kept, not re-measured
    assert not list(tmp_path.glob(".k.json.*"))  # at most a stale temp file from the kill... none after resume


@pytest.mark.slow
def test_resume_refuses_a_different_model(tmp_path):
    out = tmp_path / "p.json"
    assert run_cli("bench", *FAST, "--only", "train", "-b", "1", "-o", str(out)).returncode == 0
    r = run_cli("bench", "--model", "demo", "--only", "train", "-b", "1", "-o", str(out), "--resume")
    assert_user_error(r, "tiny", "another --output")



@pytest.mark.slow
def test_a_run_that_fails_before_its_first_point_leaves_no_profile(tmp_path):
    """A mistake caught at the engine's start writes nothing, so the corrected command runs
    without --force; a profile being resumed is kept whatever happens."""
    out = tmp_path / "p.json"
    bad = ("bench", *FAST, "--only", "gen", "--engine-arg", "foo=1", "-o", str(out))
    assert_user_error(run_cli(*bad), "foo", "--backend hf")
    assert not out.exists()
    assert_user_error(run_cli(*bad), "foo")  # the same mistake again, not "exists: pass --resume"
    assert run_cli("bench", *FAST, "--only", "train", "-b", "1", "-o", str(out)).returncode == 0
    before = Profile.load(out)
    assert_user_error(run_cli("bench", "--resume", "--engine-arg", "foo=1", "-o", str(out)), "foo")
    assert len(Profile.load(out).training) == len(before.training) == 1


@pytest.mark.slow
def test_bench_rounds_revisit_every_point(tmp_path):
    out = tmp_path / "r.json"
    r = run_cli("bench", "--model", "tiny", "--prompt-len", "8", "--output-len", "4", "--seq-len", "16",
                "--no-telemetry", "-c", "1,2", "-b", "1,2", "--rounds", "2", "--repeats", "2", "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert prof.settings.rounds == 2 and prof.settings.repeats == 2
    for p in prof.generation + prof.training:
        assert p.status == "ok" and p.rounds == 2
        assert len(p.samples) == 4 + 2 * p.remeasured  # two visits of two runs, plus any re-measurement


@pytest.mark.slow
def test_cpu_bench_runs_under_a_caching_allocator_unless_told_not_to(tmp_path):
    from throughputlab import allocator

    lib = allocator.find_library()
    if lib is None or allocator.preloaded():
        pytest.skip("no tcmalloc/jemalloc here, or one is preloaded already")
    out = tmp_path / "a.json"
    # two visits exactly: a noisy point on a busy machine would otherwise get extra ones
    two = ["--only", "train", "-b", "1", "--rounds", "2", "--max-remeasure", "0"]
    r = run_cli("bench", *FAST, *two, "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    env = prof.environment
    assert env.env_vars["LD_PRELOAD"] == lib  # recorded by the process that measured
    assert env.command_line[:2] == ["throughputlab", "bench"] and "--allocator" not in env.command_line
    # the caching allocator keeps its blocks: the second visit needs no warm-up step of its own
    assert [(p.rounds, p.warmup_runs) for p in prof.training] == [(2, 1)]

    r = run_cli("bench", *FAST, *two, "--allocator", "system", "-o", str(out), "--force")
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert "LD_PRELOAD" not in prof.environment.env_vars
    assert [(p.rounds, p.warmup_runs) for p in prof.training] == [(2, 2)]  # glibc: every visit warms up


def test_only_an_allocator_that_returns_memory_needs_a_warm_up_at_every_visit(monkeypatch):
    from throughputlab import allocator

    monkeypatch.delenv("LD_PRELOAD", raising=False)
    assert allocator.returns_memory("cpu")
    assert not allocator.returns_memory("cuda") and not allocator.returns_memory("cuda:1")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
    assert not allocator.returns_memory("cpu")


def test_a_cpu_run_without_a_caching_allocator_says_so_once(monkeypatch):
    from throughputlab import allocator

    monkeypatch.setattr(allocator, "launched_as_cli", lambda: True)
    monkeypatch.setattr(allocator, "find_library", lambda: None)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(allocator.MARK, raising=False)
    assert allocator.maybe_reexec("system", "cpu", in_process_only=True) is None  # the user chose glibc
    assert allocator.maybe_reexec("auto", "cuda", in_process_only=True) is None
    assert allocator.maybe_reexec("auto", "cpu", in_process_only=False) is None  # engines keep their setup
    note = allocator.maybe_reexec("auto", "cpu", in_process_only=True)
    assert note.startswith("note: ") and "cmeel-mimalloc" in note and "\n" not in note


def test_allocator_reexec_only_for_the_cli_on_cpu_in_process_runs(monkeypatch):
    from throughputlab import allocator

    calls = []
    monkeypatch.setattr(allocator, "reexec_with", calls.append)
    monkeypatch.setattr(allocator, "find_library", lambda: "libtcmalloc_minimal.so.4")
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    monkeypatch.delenv(allocator.MARK, raising=False)
    assert not allocator.launched_as_cli()  # pytest is not the throughputlab command
    allocator.maybe_reexec("auto", "cpu", in_process_only=True)
    assert calls == []
    monkeypatch.setattr(allocator, "launched_as_cli", lambda: True)
    allocator.maybe_reexec("auto", "cuda", in_process_only=True)  # GPUs have their own caching allocator
    allocator.maybe_reexec("auto", "cpu", in_process_only=False)  # vllm/openai engines keep their setup
    allocator.maybe_reexec("system", "cpu", in_process_only=True)
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libjemalloc.so.2")  # the user's choice wins
    allocator.maybe_reexec("auto", "cpu", in_process_only=True)
    assert calls == []
    monkeypatch.delenv("LD_PRELOAD")
    allocator.maybe_reexec("auto", "cpu", in_process_only=True)
    assert calls == ["libtcmalloc_minimal.so.4"]
    monkeypatch.setenv(allocator.MARK, "libtcmalloc_minimal.so.4")  # the re-executed process: never again
    allocator.maybe_reexec("auto", "cpu", in_process_only=True)
    assert calls == ["libtcmalloc_minimal.so.4"]


# ---------------------------------------------------------------- the spec: --spec, --set, precedence, resume


SPEC_YAML = """\
model: tiny
only: gen
generation:
  concurrency: [1, 2]
  prompt_len: 8
  output_len: 4
measurement:
  repeats: 2
  rounds: 1
telemetry:
  enabled: false
"""


@pytest.mark.slow
def test_spec_file_drives_the_run_and_is_stored(tmp_path):
    spec = tmp_path / "sweep.yaml"
    spec.write_text(SPEC_YAML)
    out = tmp_path / "s.json"
    r = run_cli("bench", "--spec", str(spec), "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert prof.spec is not None and prof.spec.model == "tiny" and prof.spec.generation.concurrency == [1, 2]
    assert prof.spec.measurement.repeats == 2 and prof.spec.telemetry.enabled is False
    assert prof.spec.measurement.warmup == 1  # not in the file: the spec's default
    assert [(p.concurrency, p.prompt_len, p.output_len) for p in prof.generation] == [(1, 8, 4), (2, 8, 4)]
    assert prof.training == [] and prof.settings.prompt_len == 8 and prof.settings.train_backend is None
    assert all(p.telemetry is None for p in prof.generation)


@pytest.mark.slow
def test_precedence_defaults_file_flags_set(tmp_path):
    spec = tmp_path / "sweep.json"  # JSON by its suffix
    spec.write_text(json.dumps({"model": "tiny", "only": "gen", "telemetry": {"enabled": False},
                                "generation": {"concurrency": [1], "prompt_len": 16, "output_len": 4},
                                "measurement": {"repeats": 3, "rounds": 2}}))
    out = tmp_path / "p.json"
    r = run_cli("bench", "--spec", str(spec), "--prompt-len", "12", "--repeats", "2", "--rounds", "3",
                "--set", "generation.prompt_len=8", "--set", "measurement.rounds=1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    s = Profile.load(out).spec
    assert s.generation.output_len == 4  # file over default (8)
    assert s.measurement.repeats == 2  # flag over file (3)
    assert s.generation.prompt_len == 8 and s.measurement.rounds == 1  # --set over flag and file
    assert s.training.seq_len == 64  # nobody set it: the default
    point = Profile.load(out).generation[0]
    assert point.prompt_len == 8 and point.rounds == 1 and len(point.samples) == 2 + 2 * point.remeasured


@pytest.mark.slow
def test_set_with_dotted_keys_and_yaml_values(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("bench", *FAST, "--only", "train", "--set", "training.micro_batches=[2, 1]",
                "--set", "training.seq_len=8", "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert [(p.micro_batch, p.seq_len) for p in prof.training] == [(1, 8), (2, 8)]
    assert prof.spec.training.micro_batches == [1, 2]


@pytest.mark.slow
def test_resume_refuses_a_changed_prompt_length(tmp_path):
    out = tmp_path / "p.json"
    assert run_cli("bench", *FAST, "--only", "gen", "-c", "1", "-o", str(out)).returncode == 0
    before = out.read_text()
    r = run_cli("bench", *FAST, "--only", "gen", "-c", "1", "--prompt-len", "256", "-o", str(out), "--resume")
    assert_user_error(r, "prompt_len", "another --output")
    assert out.read_text() == before  # nothing added at another length


@pytest.mark.slow
def test_points_of_one_sample_are_noted(tmp_path):
    out = tmp_path / "p.json"
    r = run_cli("bench", *FAST, "--only", "train", "-b", "1", "--repeats", "1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "1 point(s) have one sample" in " ".join(r.stdout.split())
    r = run_cli("bench", *FAST, "--only", "train", "-b", "1", "-o", str(tmp_path / "two.json"))
    assert r.returncode == 0 and "one sample" not in r.stdout


@pytest.mark.slow
def test_resume_with_more_rounds_adds_samples_to_every_stored_point(tmp_path):
    """`--resume --rounds N` gives each stored point the rounds it lacks: its earlier samples are
    kept, and the first visit of a process that measured nothing new warms up first."""
    out = tmp_path / "p.json"
    one = ["--max-remeasure", "0"]  # no extra rounds for noisy tiny points: the counts are exact
    assert run_cli("bench", *FAST, "-c", "1,2", "-b", "1", *one, "-o", str(out)).returncode == 0
    first = Profile.load(out)
    r = run_cli("bench", "--resume", "--rounds", "3", "-o", str(out))
    assert r.returncode == 0, r.stderr
    grown = Profile.load(out)
    assert grown.spec.measurement.rounds == 3
    for before, after in zip(first.generation + first.training, grown.generation + grown.training):
        assert (before.rounds, after.rounds) == (1, 3)
        assert after.samples[:2] == before.samples and len(after.samples) == 6
    assert grown.generation[0].warmup_runs == first.generation[0].warmup_runs + 1  # the cold first visit
    assert grown.generation[1].warmup_runs == first.generation[1].warmup_runs
    assert_user_error(run_cli("bench", "--resume", "--rounds", "2", "-o", str(out)), "measurement.rounds")


@pytest.mark.slow
def test_resume_extends_the_measured_axes_without_measuring_again(tmp_path):
    """A -c, --contexts or -b list that keeps every stored value adds the others: the new points are
    measured, the stored ones keep their samples, and the spec lists the grown axes."""
    out = tmp_path / "p.json"
    assert run_cli("bench", *FAST, "-c", "1", "-b", "1", "-o", str(out)).returncode == 0
    first = Profile.load(out)
    kept = {("gen", p.concurrency, p.prompt_len): p.samples for p in first.generation}
    kept |= {("train", p.micro_batch, p.seq_len): p.samples for p in first.training}

    r = run_cli("bench", *FAST, "-c", "1,2", "--contexts", "8,12", "-b", "1,2", "-o", str(out), "--resume")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    prof = Profile.load(out)
    assert {(p.prompt_len, p.concurrency): p.status for p in prof.generation} == \
        {(8, 1): "ok", (8, 2): "ok", (12, 1): "ok", (12, 2): "ok"}
    assert {p.micro_batch: p.status for p in prof.training} == {1: "ok", 2: "ok"}
    now = {("gen", p.concurrency, p.prompt_len): p.samples for p in prof.generation}
    now |= {("train", p.micro_batch, p.seq_len): p.samples for p in prof.training}
    assert all(now[k] == v for k, v in kept.items())  # measured once, not again
    assert prof.spec.generation.concurrency == [1, 2] and prof.spec.generation.contexts == [8, 12]
    assert prof.spec.training.micro_batches == [1, 2]

    # the grown spec is the one stored: a bare --resume continues it; dropping a value is refused
    assert run_cli("bench", "--resume", "-o", str(out)).returncode == 0
    assert_user_error(run_cli("bench", "--resume", "-c", "2", "-o", str(out)), "generation.concurrency")
    assert Profile.load(out).generation == prof.generation


@pytest.mark.slow
def test_resume_of_an_old_profile_checks_its_settings(tmp_path):
    """Profiles written before the spec existed are checked on what their settings recorded."""
    old = tmp_path / "old.json"
    old.write_text((REPORTS / "cpu-amd-epyc-2026-11-29" / "demo-profile.json").read_text())
    assert Profile.load(old).spec is None
    r = run_cli("bench", "--prompt-len", "256", "-o", str(old), "--resume")
    assert_user_error(r, "prompt_len", "64", "256")


@pytest.mark.slow
def test_resume_of_a_missing_file_is_refused(tmp_path):
    out = tmp_path / "never.json"
    assert_user_error(run_cli("bench", *FAST, "-o", str(out), "--resume"), "nothing to resume", "drop --resume")
    assert not out.exists()


@pytest.mark.slow
def test_bare_resume_continues_with_the_stored_settings(tmp_path):
    out = tmp_path / "p.json"
    assert run_cli("bench", *FAST, "--only", "gen", "-c", "1,2,3", "-o", str(out)).returncode == 0
    raw = json.loads(out.read_text())  # what an interrupted run leaves: the last point missing
    raw["generation"] = [p for p in raw["generation"] if p["concurrency"] != 3]
    out.write_text(json.dumps(raw))
    kept = {p["concurrency"]: p["measured_at"] for p in raw["generation"]}

    r = run_cli("bench", "--resume", "-o", str(out))
    assert r.returncode == 0, r.stderr
    prof = Profile.load(out)
    assert [(p.concurrency, p.prompt_len, p.output_len, p.status) for p in prof.generation] == \
        [(1, 8, 4, "ok"), (2, 8, 4, "ok"), (3, 8, 4, "ok")]
    assert {c: p.measured_at for c, p in ((p.concurrency, p) for p in prof.generation) if c in kept} == kept
    assert prof.training == []  # --only gen came from the stored spec too
    assert len(prof.generation[2].samples) == 2 + 2 * prof.generation[2].remeasured  # the stored repeats


@pytest.mark.slow
@pytest.mark.parametrize("text,fragments", [
    ("generation:\n  promt_len: 8\n", ["unknown key generation.promt_len", "did you mean generation.prompt_len"]),
    ("measurement:\n  rounds: many\n", ["measurement.rounds", "integer", "'many'"]),
    ("generation:\n  concurrency: [1, 2\nmodel: tiny\n", ["YAML syntax error at line 3"]),
    ("- model\n- tiny\n", ["mapping"]),
])
def test_bad_spec_files_are_one_line_errors(tmp_path, text, fragments):
    spec = tmp_path / "bad.yaml"
    spec.write_text(text)
    assert_user_error(run_cli("bench", "--spec", str(spec), "-o", str(tmp_path / "o.json")), str(spec), *fragments)
    assert not (tmp_path / "o.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize("item,fragments", [
    ("generation.prompt_len", ["KEY=VALUE"]),
    ("prompt_len=8", ["unknown key prompt_len", "did you mean generation.prompt_len"]),
    ("generation.prompt_len=long", ["generation.prompt_len", "integer", "'long'"]),
    ("measurement.rounds=0", ["measurement.rounds", "greater than 0"]),
    ("generation.concurrency=[1, -2]", ["generation.concurrency", "positive"]),
])
def test_bad_set_is_a_one_line_error(tmp_path, item, fragments):
    assert_user_error(run_cli("bench", "--set", item, "-o", str(tmp_path / "o.json")), "--set", *fragments)


@pytest.mark.slow
def test_print_spec_is_a_valid_spec_file(tmp_path):
    r = run_cli("bench", "--print-spec", "-m", "tiny", "--set", "measurement.rounds=1")
    assert r.returncode == 0, r.stderr
    spec = tmp_path / "spec.yaml"
    spec.write_text(r.stdout)
    again = run_cli("bench", "--print-spec", "--spec", str(spec))
    assert again.returncode == 0 and again.stdout == r.stdout
    assert "model: tiny" in r.stdout and "rounds: 1" in r.stdout
    assert "concurrency: [1, 2, 4, 8, 16, 32, 64]" in r.stdout


@pytest.mark.slow
def test_context_and_sequence_length_axes_measure_every_pair_and_skip_what_cannot_run(tmp_path):
    """`bench --contexts 8,32,5000 --seq-lens 16,32`: each concurrency at each prompt length and each
    micro-batch at each sequence length; the context past the model's 2,048 positions is skipped."""
    out = tmp_path / "axes.json"
    fast = [a for a in FAST if a not in ("--prompt-len", "8", "--seq-len", "16")]
    r = run_cli("bench", *fast, "-c", "1,2", "-b", "1", "--contexts", "8,32,5000", "--seq-lens", "16,32,4096",
                "-o", str(out))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "skipped: not run: sequence length 4096 exceeds the model's max_position_embeddings 2048" in r.stdout
    prof = Profile.load(out)
    got = {(p.prompt_len, p.concurrency): p.status for p in prof.generation}
    assert got == {(8, 1): "ok", (8, 2): "ok", (32, 1): "ok", (32, 2): "ok", (5000, 1): "skipped",
                   (5000, 2): "skipped"}
    skipped = [p for p in prof.generation if p.status == "skipped"]
    assert all("max_position_embeddings 2048" in p.error for p in skipped)
    assert {(p.seq_len, p.micro_batch): p.status for p in prof.training} == {(16, 1): "ok", (32, 1): "ok",
                                                                             (4096, 1): "skipped"}
    # decode reads a longer KV cache at the longer context: its points say so in their own prompt length
    assert all(p.layout is not None and p.layout.world_size == 1 for p in prof.generation + prof.training)
    assert prof.spec.generation.contexts == [8, 32, 5000] and prof.spec.training.seq_lens == [16, 32, 4096]
    assert "prompts 8,32,5000" in " ".join(r.stdout.split())
    # a resumed run measures nothing again and refuses another context list
    again = run_cli("bench", "--resume", "-o", str(out))
    assert again.returncode == 0 and "(resumed)" in again.stdout, again.stderr[-2000:]
    assert_user_error(run_cli("bench", "--resume", "--contexts", "8,64", "-o", str(out)), "generation.contexts")
    assert_user_error(run_cli("bench", *fast, "--contexts", "8,x", "-o", str(tmp_path / "x.json")), "--contexts")
    assert_user_error(run_cli("bench", *fast, "--contexts", "4000", "-o", str(tmp_path / "y.json")),
                      "shortest --contexts value")


def test_kv_limited_concurrencies_are_split_off():
    from throughputlab.bench import kv_limited, split_lengths

    # past what the cache holds at once the engine queues: measured; one request past the whole cache: not
    assert kv_limited([1, 2, 4, 8], 100, 28, 512) == ([1, 2, 4, 8], [])
    assert kv_limited([1, 2], 100, 28, 100) == ([], [1, 2])
    assert kv_limited([1, 2], 100, 28, None) == ([1, 2], [])
    assert split_lengths([128, 512, 4096], 32, 2048) == ([128, 512], [4096])
