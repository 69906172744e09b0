"""The vllm backend on the real engine (vllm-cpu here, vllm on a GPU box), `tiny` model, one
engine start for the whole module (about 30 s on two cores). Also the sweep runner with
telemetry and py-spy around the engine, and a clean shutdown."""

from __future__ import annotations

import importlib.util
import os
import shutil
import statistics
import time
from pathlib import Path

import pytest

from throughputlab.errors import UserError
from throughputlab.models import resolve_model

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed"),
]

MAX_C = 8
PROMPT, OUT = 32, 16


@pytest.fixture(scope="module")
def engine():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default 2 is more than a test needs
    from throughputlab.backends.vllm.gen import VLLMGenerationBackend

    backend = VLLMGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0,
                                    max_concurrency=MAX_C, max_len=PROMPT + OUT,
                                    engine_args={"enforce_eager": True})  # skips the ~25 s compile warm-up
    backend.start()
    try:
        yield backend
    finally:
        backend.close()


def test_engine_reports_kv_capacity_and_settings(engine):
    info = engine.engine_info()
    assert info.name == "vllm" and info.version
    assert info.max_num_seqs >= MAX_C
    assert info.kv_cache_tokens and info.kv_cache_tokens > 10_000
    block = info.engine_args["block_size"]
    blocks_per_request = -(-(PROMPT + OUT) // block)
    assert info.max_concurrency == pytest.approx(info.engine_args["num_kv_blocks"] / blocks_per_request, rel=0.01)
    assert info.engine_args["enforce_eager"] is True  # --engine-arg reached the engine
    assert info.engine_args["load_format"] == "dummy"
    assert info.engine_args["max_model_len"] == PROMPT + OUT
    if os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU") == "0" and not any(
            k in os.environ for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
        # on CPU with every core for the model: the short OpenMP spin is recorded, and it was
        # set for the engine's processes only
        assert info.engine_args["GOMP_SPINCOUNT"] == "10000"
        assert "GOMP_SPINCOUNT" in info.engine_args["env_set_by_throughputlab"]


def test_run_exact_tokens_and_engine_timing(engine):
    engine.run(4, PROMPT, OUT)  # warm-up for this shape
    s = engine.run(4, PROMPT, OUT)
    assert s.output_tokens == 4 * OUT
    # split from vLLM's per-request timestamps: both parts present and inside the wall time
    assert s.prefill_s is not None and s.decode_s is not None
    assert 0 < s.prefill_s < s.total_s
    assert 0 < s.decode_s < s.total_s
    assert s.prefill_s + s.decode_s <= s.total_s * 1.05
    assert len(s.ttft_s) == 4 and all(0 < t <= s.total_s for t in s.ttft_s)


def test_two_length_difference_when_engine_has_no_timing(engine):
    engine.timing = "difference"
    try:
        s = engine.run(2, PROMPT, OUT)
    finally:
        engine.timing = "engine"
    assert s.output_tokens == 2 * OUT
    assert s.prefill_s > 0 and s.decode_s > 0
    assert s.prefill_s + s.decode_s == pytest.approx(s.total_s, rel=0.05)
    assert s.ttft_s == []


def test_tokens_per_s_matches_a_direct_generate_call(engine):
    """Our timing wraps llm.generate and nothing else. Back-to-back pairs in alternating order,
    median of the per-pair ratios: on a shared machine a burst of other work hits one run,
    and pairing keeps it from deciding the result."""
    import numpy as np

    from throughputlab.backends.vllm.gen import sampling_params, synthetic_prompts

    rng = np.random.default_rng(1)
    ratios = []
    engine.run(MAX_C, PROMPT, OUT)

    def direct() -> float:
        prompts = synthetic_prompts(rng, MAX_C, PROMPT, 4096)
        t = time.perf_counter()
        outs = engine.llm.generate(prompts, sampling_params(OUT), use_tqdm=False)
        dt = time.perf_counter() - t
        return sum(len(o.outputs[0].token_ids) for o in outs) / dt

    def ours() -> float:
        s = engine.run(MAX_C, PROMPT, OUT)
        return s.output_tokens / s.total_s

    for i in range(8):
        if i % 2:
            a = ours()
            b = direct()
        else:
            b = direct()
            a = ours()
        ratios.append(a / b)
    assert 0.7 < statistics.median(ratios) < 1.4, ratios


def test_sweep_runner_with_telemetry_and_pyspy(engine, tmp_path):
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed")
    from throughputlab.hostprof import PySpyRecorder
    from throughputlab.machine import environment
    from throughputlab.records.machine import Hardware
    from throughputlab.records.profile import Profile
    from throughputlab.records.settings import Measurement, SweepSettings
    from throughputlab.sweep import Extras, run_generation
    from throughputlab.telemetry import TelemetrySampler

    resolved = resolve_model("tiny")
    profile = Profile(model=resolved.spec, hardware=Hardware(device_type="cpu", device_name="cpu"),
                      environment=environment([]), settings=SweepSettings(dtype="float32", device="cpu",
                                                                          gen_backend="vllm", prompt_len=PROMPT,
                                                                          output_len=OUT))
    path = tmp_path / "p.json"
    extras = Extras(telemetry=lambda pids: TelemetrySampler(pids, hz=20), pyspy=PySpyRecorder(tmp_path / "p-pyspy"),
                    pyspy_points={MAX_C})
    run_generation(profile, path, engine, [1, MAX_C], prompt_len=PROMPT, output_len=OUT,
                   hygiene=Measurement(warmup=1, repeats=150, max_cv=10.0, max_remeasure=0, rounds=1), extras=extras)
    # 150 repeats: long enough for py-spy to attach to the engine's processes and sample them at 100 Hz even on a
    # fast host (40 took 1-2 s on a slow 2-core EPYC and gave py-spy only 5 samples on a faster one)
    extras.pyspy.close()

    from throughputlab.records.profile import Profile as P

    saved = P.load(path)
    assert [p.status for p in saved.generation] == ["ok", "ok"]
    for p in saved.generation:
        assert p.tokens_per_s > 0 and p.prefill_s > 0 and p.decode_step_s > 0
        t = p.telemetry
        assert t is not None and t.source in ("host", "nvml") and t.n_samples >= 1
        assert t.max["proc_count"] >= 3  # this process, the engine core and its worker
        assert t.max["proc_rss_gib"] > 0.1
    assert saved.generation[0].host_profile is None  # only the chosen point is profiled
    hp = saved.generation[1].host_profile
    assert hp is not None and hp.error is None, hp
    assert (tmp_path / hp.flamegraph).is_file()
    assert hp.n_samples > 10
    assert set(engine.pids()) <= set(hp.pids)
    assert 0 < sum(share for _, share in hp.top_functions) <= 1.0001
    assert hp.process_shares and any("EngineCore" in name or "Worker" in name for name, _ in hp.process_shares)


@pytest.mark.slow
def test_engine_arg_mistakes_are_user_errors():
    from throughputlab.backends.vllm.gen import VLLMGenerationBackend

    tiny = resolve_model("tiny")
    with pytest.raises(UserError, match="max_num_seqs=4 is below the largest --concurrency 8"):
        VLLMGenerationBackend(tiny, dtype="float32", device="cpu", max_concurrency=8, max_len=64,
                              engine_args={"max_num_seqs": 4})
    with pytest.raises(UserError, match="max_model_len=32 is shorter"):
        VLLMGenerationBackend(tiny, dtype="float32", device="cpu", max_concurrency=8, max_len=64,
                              engine_args={"max_model_len": 32})
    with pytest.raises(UserError, match="conflicts with --dtype"):
        VLLMGenerationBackend(tiny, dtype="float32", device="cpu", max_len=64, engine_args={"dtype": "bfloat16"})
    b = VLLMGenerationBackend(tiny, dtype="float32", device="cpu", max_len=64,
                              engine_args={"gpu_memory_utilisation": 0.5})
    with pytest.raises(UserError, match="did you mean gpu_memory_utilization"):
        b.start()  # rejected before any engine process starts
    assert b.pids() == [os.getpid()]


def test_cpu_engine_environment(monkeypatch):
    """No reserved core: a short libgomp spin for the engine's processes, unless the user chose
    an OpenMP wait setting or a reserved core (environment or --engine-arg NAME=VALUE)."""
    from throughputlab.backends.vllm.gen import VLLMGenerationBackend, engine_environment

    for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    assert engine_environment("cpu") == ({"GOMP_SPINCOUNT": "10000"}, ["GOMP_SPINCOUNT"])
    assert engine_environment("cuda:0") == ({}, [])
    assert engine_environment("cpu", {"GOMP_SPINCOUNT": 300000}) == ({"GOMP_SPINCOUNT": "300000"}, [])
    assert engine_environment("cpu", {"VLLM_CPU_NUM_OF_RESERVED_CPU": 1}) == ({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}, [])
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert engine_environment("cpu") == ({}, [])
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    assert engine_environment("cpu") == ({}, [])
    # --engine-arg NAME=VALUE in capitals is environment, not a (refused) engine argument
    b = VLLMGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu", max_len=64,
                              engine_args={"GOMP_SPINCOUNT": 1000, "enforce_eager": True})
    assert b.user_env == {"GOMP_SPINCOUNT": 1000} and b.user_engine_args == {"enforce_eager": True}


def test_close_leaves_no_process_or_socket(engine):
    """Runs last in this module: shuts the shared engine down and checks what is left."""
    import psutil

    procs = [psutil.Process(p) for p in engine.pids()[1:]]
    assert procs, "the engine runs in its own processes"
    workdir = Path(engine._tmpdir)
    assert (workdir / "rpc").is_dir() and any((workdir / "rpc").iterdir())  # vLLM's sockets live here
    engine.close()
    alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == []
    assert not workdir.exists()
    assert engine.pids() == [os.getpid()]
