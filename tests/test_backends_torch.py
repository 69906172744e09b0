"""The real torch backends on a real (tiny, random-weight) transformers model on the CPU."""

import pytest
import torch

from throughputlab.backends.hf_gen import HFGenerationBackend, PackedLinear
from throughputlab.backends.torch_train import TorchTrainingBackend
from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.records.machine import Environment, Hardware
from throughputlab.records.profile import Profile
from throughputlab.records.settings import Measurement, SweepSettings
from throughputlab.sweep import largest_fitting, run_training


@pytest.fixture(scope="module")
def gen():
    b = HFGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0)
    b.start()
    yield b
    b.close()


def _weights(model) -> int:
    """Weights of a model whose linear layers may be packed (their sizes, not the packed layout's)."""
    packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
    return sum(p.numel() for p in model.parameters()) + sum(m.in_features * m.out_features for m in packed)


@pytest.mark.slow
def test_static_batch_emits_exactly_output_len_tokens(gen):
    s = gen.run(3, 8, 5)
    assert s.output_tokens == 15
    assert len(s.decode_step_s) == 4 and all(t > 0 for t in s.decode_step_s)
    assert s.prefill_s > 0 and s.total_s >= s.prefill_s + s.decode_s * 0.999
    assert gen.last_output_ids.shape == (3, 5)
    assert gen.cache_kind == "static"


@pytest.mark.slow
def test_decode_loop_matches_transformers_greedy_generate(gen):
    """The timed loop with its preallocated cache produces the same tokens as model.generate."""
    g = torch.Generator().manual_seed(123)
    gen._gen = g
    gen.run(2, 6, 7)
    ours = gen.last_output_ids
    gen._gen = torch.Generator().manual_seed(123)
    ids = torch.randint(4, gen.resolved.spec.vocab_size, (2, 6), generator=gen._gen)
    with torch.inference_mode():
        ref = gen.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=7, min_new_tokens=7,
                                 do_sample=False, pad_token_id=0)
    assert torch.equal(ours, ref[:, 6:])


@pytest.mark.slow
def test_overhead_probe_runs_the_same_requests_through_the_narrowed_network(gen):
    s = gen.run(2, 8, 5)
    assert len(s.probe_decode_step_s) == 4 and all(t > 0 for t in s.probe_decode_step_s)
    assert s.probe_prefill_s > 0
    info = gen.engine_info()
    assert info.overhead_probe == {"hidden_size": 64, "intermediate_size": 64}
    assert (info.engine_args["attn_prefill"], info.engine_args["attn_decode"]) == ("sdpa", "eager")  # CPU defaults
    cfg = gen.probe.config
    assert (cfg.hidden_size, cfg.intermediate_size) == (64, 64)
    # what the probe keeps: layers, heads, head size, vocabulary (so its KV cache and sampling are the model's)
    mc = gen.model.config
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == \
        (mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads, mc.head_dim, mc.vocab_size)
    n_model, n_probe = _weights(gen.model), _weights(gen.probe)
    assert n_probe < 0.4 * n_model


@pytest.mark.slow
def test_hf_engine_args_choose_attention_and_the_probe():
    b = HFGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu",
                            engine_args={"attn_implementation": "sdpa", "overhead_probe": False})
    b.start()
    try:
        assert b.model.config._attn_implementation == "sdpa"
        s = b.run(1, 4, 3)
        assert b.probe is None and s.probe_decode_step_s == [] and b.engine_info().overhead_probe is None
    finally:
        b.close()
    with pytest.raises(UserError, match="tensor_parallel_size does not apply to --backend hf"):
        HFGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu",
                            engine_args={"tensor_parallel_size": 2})


def test_peak_memory_is_reported_on_cpu(gen):
    gen.reset_peak_memory()
    gen.run(2, 8, 3)
    peak = gen.peak_memory_bytes()
    assert peak is not None and peak > 10 * 2**20


@pytest.mark.slow
def test_training_step_times_phases_and_learns():
    b = TorchTrainingBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0, lr=1e-3)
    b.start()
    try:
        s = b.run(2, 16)
        assert s.step_s == pytest.approx(s.forward_s + s.backward_s + s.optimizer_s, rel=1e-6)
        assert min(s.forward_s, s.backward_s, s.optimizer_s) > 0
        # the AdamW step really changes the weights
        w = next(b.model.parameters()).detach().clone()
        b.run(2, 16)
        assert not torch.equal(w, next(b.model.parameters()).detach())
    finally:
        b.close()


@pytest.mark.slow
def test_real_cpu_oom_is_recorded_and_largest_fit_found(tmp_path):
    """A micro-batch whose activations exceed RAM fails at once in the CPU allocator: recorded as oom."""
    b = TorchTrainingBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0)
    b.start()
    prof = Profile(model=b.resolved.spec, hardware=Hardware(device_type="cpu", device_name="cpu"),
                   environment=Environment(python="3", platform="x", hostname="h"),
                   settings=SweepSettings(dtype="float32", device="cpu"))
    huge = 2**21  # 2M x 128 tokens x 256 hidden x 4 bytes = 256 GiB for one activation
    try:
        run_training(prof, tmp_path / "p.json", b, [1, 2, huge], seq_len=128,
                     hygiene=Measurement(warmup=0, repeats=1, rounds=1))
    finally:
        b.close()
    status = {p.micro_batch: p.status for p in prof.training}
    assert status[1] == status[2] == "ok"
    assert status[huge] == "oom"
    assert "allocate" in next(p for p in prof.training if p.micro_batch == huge).error.lower()
    assert largest_fitting(prof.training) == 2
    assert sum(1 for s in status.values() if s == "oom") >= 2  # the bounded bisection ran


@pytest.mark.slow
def test_effective_lr_is_recorded_when_asked(tmp_path):
    b = TorchTrainingBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0, lr=1e-3,
                             track_effective_lr=True)
    b.start()
    try:
        b.run(1, 8)
        eff = b.last_effective_lr
    finally:
        b.close()
    assert eff and all(0 < v < 1 for v in eff.values())


@pytest.mark.slow
def test_packed_linears_give_the_plain_networks_tokens(gen):
    """On CPU in float32 every linear layer runs from oneDNN-packed weights (model and probe); the tokens are
    those of the same network through F.linear (prepack=false), and the profile says which ran."""
    plain = HFGenerationBackend(resolve_model("tiny"), dtype="float32", device="cpu", seed=0,
                                engine_args={"prepack": "false"})
    plain.start()
    try:
        n_linear = sum(isinstance(m, torch.nn.Linear) for m in plain.model.modules())
        assert n_linear > 0 and not any(isinstance(m, PackedLinear) for m in plain.model.modules())
        assert gen.packed_layers == n_linear and not any(type(m) is torch.nn.Linear for m in gen.model.modules())
        assert any(isinstance(m, PackedLinear) for m in gen.probe.modules())
        for b in (gen, plain):
            b._gen = torch.Generator().manual_seed(7)
            b.run(3, 6, 6)
        assert torch.equal(gen.last_output_ids, plain.last_output_ids)
        assert gen.engine_info().engine_args["linear"].startswith("oneDNN, packed")
        assert plain.engine_info().engine_args["linear"] == "torch F.linear"
    finally:
        plain.close()
    bf16 = HFGenerationBackend(resolve_model("tiny"), dtype="bfloat16", device="cpu")
    assert not bf16.prepack  # float32 only: other dtypes keep F.linear
