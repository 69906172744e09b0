"""The engine in `predict`: each engine's KV rule by hand, admission (tokens/s flat past the admitted
concurrency, the bound named), floor not round, fp8 KV, the 16-bit all-reduce payload, the engine
flags' bad values (one line, exit code 2) and the memory figures of the datasheet rows."""

from __future__ import annotations

import math

import pytest

from conftest import run_main
from throughputlab import roofline as rf
from throughputlab.fit import load_fit, load_model
from throughputlab.models import resolve_model
from throughputlab.predict import Layout, analytic_model, generation_table, predict_analytic
from throughputlab.predict_engine import EngineOptions
from throughputlab.records.peaks import lookup
from throughputlab.roofline import Costs

GIB, MIB = 2**30, 2**20
# a dense model small enough to do by hand: h = 1000, MLP width 4000, vocabulary 10,000
HAND = Costs(bytes_per_param=2, weight_bytes=1e9, kv_bytes_per_token=1e5, flops_per_token=1e9,
             attn_flops_per_ctx_token=1e4, total_weight_bytes=2e9, hidden_size=1000, num_layers=10, num_kv_heads=8,
             mlp_width=4000, vocab_size=10000)


def _cli(*args: str):
    return run_main("predict", *args)


# ---------------------------------------------------------------- the KV rules by hand


def test_vllm_rule_by_hand():
    # profile run: 100 tokens x (2*1000 + 3*4000) x 2 bytes, then the sampler on 50 rows x 10,000 x 12 bytes
    act = 100 * 14000 * 2 + 50 * 10000 * 12
    assert rf.profile_activation_bytes(HAND, 100, 50) == act == 8.8e6
    by_hand = 0.9 * (80e9 - 0.6 * GIB) - 2e9 - act - 0.25 * GIB - 0.5 * GIB  # weights, non-torch, CUDA graphs
    kv = rf.engine_kv_bytes("vllm", HAND, HAND, 1, 80e9, 0.9, 100, 50)
    assert kv == pytest.approx(by_hand)
    assert rf.engine_kv_bytes("vllm", HAND, HAND, 1, 80e9, 0.9, 100, 50, enforce_eager=True) == pytest.approx(
        by_hand + 0.5 * GIB)  # no CUDA graphs to hold
    tokens = rf.kv_cache_tokens_of(kv, HAND, 16)
    assert tokens == math.floor(by_hand / (1e5 * 16)) * 16 and tokens % 16 == 0


def test_sglang_and_trtllm_rules_by_hand():
    sg = rf.engine_kv_bytes("sglang", HAND, HAND, 1, 80e9, 0.88, 100, 50)
    assert sg == pytest.approx(0.88 * (80e9 - 0.6 * GIB) - 2e9 - 0.25 * GIB)  # activations live in the remainder
    trt = rf.engine_kv_bytes("trtllm", HAND, HAND, 1, 80e9, 0.9, 100, 50)
    act = 100 * 14000 * 2  # its profiling forward pass; a few requests' logits neglected
    assert trt == pytest.approx(0.9 * (80e9 - 0.6 * GIB - 2e9 - act - 0.25 * GIB))
    # on a TP rank: the shard's weights, the MLP's intermediates split TP ways
    shard = rf.tp_shard(HAND, 2)
    tp = rf.engine_kv_bytes("trtllm", HAND, shard, 2, 80e9, 0.9, 100, 50)
    assert tp == pytest.approx(0.9 * (80e9 - 0.6 * GIB - 1e9 - 100 * (2000 + 6000) * 2 - 0.25 * GIB))


def test_the_predicted_engine_uses_the_rule_and_prints_it():
    spec = resolve_model("qwen2.5-7b").spec
    m = load_model(predict_analytic(spec, "h100", concurrency=(1,)))
    costs, mem = m.costs, lookup("h100").memory_bytes
    act = rf.profile_activation_bytes(costs, 8192, 1024)  # vLLM's server defaults on an H100
    kv = 0.9 * (mem - rf.CUDA_UNEXPOSED_BYTES) - rf.all_weight_bytes(costs) - act - rf.NON_TORCH_BYTES - rf.CUDA_GRAPH_BYTES
    assert m.kv_cache_tokens == rf.kv_cache_tokens_of(kv, costs, 16)
    assert (m.engine.name, m.engine.max_num_seqs, m.engine.max_num_batched_tokens) == ("vllm", 1024, 8192)
    a100 = load_model(predict_analytic(spec, "a100 80gb", concurrency=(1,)))
    assert (a100.engine.max_num_seqs, a100.engine.max_num_batched_tokens) == (256, 2048)  # vLLM's A100 exception
    r = _cli("--model", "qwen2.5-7b", "--gpu", "h100", "-c", "1", "--prompt-len", "1000", "--output-len", "1000")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.strip().startswith("KV cache:"))
    seqs = m.kv_cache_tokens // 1600  # vLLM's cache holds requests at every stage: prompt + 0.6 x output, blocks of 16
    assert f"{m.kv_cache_tokens:,} tokens" in line and f"{kv / GIB:.2f} GiB per GPU" in line
    assert f"{seqs:,} sequences of prompt 1000 + output 1000" in line and "determine_available_memory" in line


def test_a_measured_kv_size_overrides_the_rule():
    spec = resolve_model("llama3.1-8b").spec  # k = 128 KiB a token at 16 bits
    m = load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(kv_cache_gib=1.25)))
    assert m.kv_cache_tokens == 10240 and "--kv-cache-gib" in m.engine.kv_rule


# ---------------------------------------------------------------- admission


def test_floor_not_round_and_whole_blocks():
    assert rf.kv_sequences(3 * 2048 - 16, 1024, 1024, 16) == 2  # 2.99 sequences hold 2
    assert rf.sequence_footprint_tokens(1025, 1025, 16) == 2064  # 2050 tokens take 129 blocks
    assert rf.kv_sequences(3 * 2064, 1025, 1025, 16) == 3 and rf.kv_sequences(3 * 2064 - 1, 1025, 1025, 16) == 2
    assert rf.kv_sequences(None, 1, 1) is None
    assert rf.admitted(100, 29, 256) == 29 and rf.admitted(10, 29, 256) == 10 and rf.admitted(500, None, 256) == 256
    assert rf.admission_bound(30, 29, 256) == "admission: KV cache"
    assert rf.admission_bound(300, 400, 256) == "admission: max_num_seqs" and rf.admission_bound(29, 29, 256) is None


def test_tokens_per_s_is_flat_past_the_kv_cache_and_the_bound_is_named():
    """Qwen2.5-32B on two 48 GB L40S at vLLM's defaults: its cache holds about 30 requests of 1024 + 1024 tokens
    whole, and vLLM, which admits on the prompt and preempts later, runs about 37 of them at once (the mean running
    request holds 1024 + 0.6 x 1024, in blocks of 16: 1648)."""
    spec = resolve_model("qwen2.5-32b").spec
    kw = dict(prompt_len=1024, output_len=1024, layout=Layout(gpus=2, tp=2))
    one = load_model(predict_analytic(spec, "l40s", concurrency=(1,), **kw))
    n = one.kv_sequences(1024, 1024)
    assert n == one.kv_cache_tokens // 1648 and 28 <= one.kv_cache_tokens // 2048 <= 34
    reserving = one.model_copy(update={"engine": one.engine.model_copy(update={"name": "trtllm"})})
    assert reserving.kv_sequences(1024, 1024) == one.kv_cache_tokens // 2048  # admitted only whole
    pred = predict_analytic(spec, "l40s", concurrency=(10, n, n + 1, 100), **kw)
    m = load_model(pred)
    tps = {g.concurrency: g.tokens_per_s for g in pred.generation}
    assert tps[n + 1] == pytest.approx(tps[n], rel=1e-9) and tps[100] == pytest.approx(tps[n], rel=1e-9)
    assert tps[10] < tps[n]
    table = generation_table(m, [10, n, n + 1, 100], 1024, 1024)
    assert list(table["running"]) == [10, n, n, n]
    assert list(table["bound"])[2:] == ["admission: KV cache"] * 2 and table["bound"][0] in ("memory", "compute")
    assert all(g.status == "ok" for g in pred.generation)


def test_max_num_seqs_caps_the_batch():
    spec = resolve_model("qwen2.5-7b").spec
    pred = predict_analytic(spec, "h100", concurrency=(4, 8, 16, 64), engine=EngineOptions(max_num_seqs=8))
    tps = [g.tokens_per_s for g in pred.generation]
    assert tps[1] == pytest.approx(tps[2]) == pytest.approx(tps[3]) and tps[0] < tps[1]
    table = generation_table(load_model(pred), [4, 8, 16, 64], 512, 512)
    assert list(table["bound"])[2:] == ["admission: max_num_seqs"] * 2


def test_a_kv_cache_that_holds_no_sequence_predicts_nothing():
    spec = resolve_model("llama3.1-70b").spec
    pred = predict_analytic(spec, "h100", dtype="fp8", concurrency=(1, 8))  # vLLM's 0.9 leaves no room on one H100
    m = load_model(pred)
    assert m.kv_cache_tokens == 0 and all(g.status == "skipped" for g in pred.generation)
    assert list(generation_table(m, [1], 128, 128)["tokens_per_s"]) == [0.0]


# ---------------------------------------------------------------- dtypes and tensor parallelism


def test_optimistic_admission_counts_the_mean_running_request_by_hand():
    # benchmarks/kv_admission.py's three runs of vLLM's CPU engine: a 4,096-token cache in blocks of 32
    for (p, o), measured, reserving in (((32, 480), 12.1, 8), ((256, 256), 9.8, 8), ((16, 1008), 5.9, 4)):
        assert rf.kv_sequences(4096, p, o, 32) == reserving  # the whole request, in whole blocks
        opt = rf.kv_sequences(4096, p, o, 32, optimistic=True)
        assert opt == 4096 // (-(-(p + -(-o * 6 // 10)) // 32) * 32)  # prompt + 0.6 x output, in whole blocks
        assert abs(opt - measured) <= 1 < abs(reserving - measured)
    assert rf.kv_sequences(None, 1, 1) is None and rf.kv_sequences(100, 10, 10, 1, True) == 6
    assert set(rf.OPTIMISTIC_ADMISSION_ENGINES) == {"vllm", "sglang"}  # TensorRT-LLM reserves (GUARANTEED_NO_EVICT)


def test_fp8_kv_halves_k_and_doubles_the_sequences():
    spec = resolve_model("llama3.1-8b").spec
    auto, fp8 = Costs.from_spec(spec, 2), Costs.from_spec(spec, 2, rf.kv_value_bytes(2, "fp8"))
    assert fp8.kv_bytes_per_token == auto.kv_bytes_per_token / 2
    assert Costs.from_spec(spec, 1).kv_bytes_per_token == auto.kv_bytes_per_token  # FP8 weights, 16-bit KV (auto)
    seqs = [load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(
        kv_cache_gib=1.25, kv_cache_dtype=d))).kv_sequences(512, 512) for d in ("auto", "fp8")]
    assert seqs == [12, 24]  # 10,240 and 20,480 tokens over 512 + 0.6 x 512, in blocks of 16: 832
    by_rule = [load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(kv_cache_dtype=d)))
               .kv_cache_tokens for d in ("auto", "fp8")]
    assert abs(by_rule[1] - 2 * by_rule[0]) <= 16


def test_fp8_weights_keep_the_embedding_and_lm_head_at_16_bits():
    spec = resolve_model("llama3.1-70b").spec
    c8, c16 = Costs.from_spec(spec, 1), Costs.from_spec(spec, 2)
    assert c8.weight_bytes == pytest.approx(c16.weight_bytes / 2 + spec.params_lm_head)
    assert c8.total_weight_bytes == spec.params_total + spec.params_embedding + spec.params_lm_head


def test_the_all_reduce_payload_is_16_bit_with_fp8_weights():
    spec = resolve_model("llama3.1-70b").spec
    c8, c16 = Costs.from_spec(spec, 1), Costs.from_spec(spec, 2)
    hand = 2 * 80 * (10e-6 + 64 * 8192 * 2 * (2 * 3 / 4) / 360e9)  # TP 4, 64 tokens, 2 bytes a value
    assert rf.tp_comm_s(c8, 64, 4, 360e9, 10e-6) == pytest.approx(hand) == rf.tp_comm_s(c16, 64, 4, 360e9, 10e-6)
    # two regimes: the small-tensor line (custom all-reduce) wins at decode sizes, NCCL's at prefill sizes
    small, large = rf.allreduce_s(1e5, 4, 200e9, 6e-6), rf.allreduce_s(1e5, 4, 360e9, 17e-6)
    assert rf.tp_allreduce_s(1e5, 4, 360e9, 17e-6, 6e-6, 200e9) == pytest.approx(min(small, large)) == small
    assert rf.tp_allreduce_s(1e8, 4, 360e9, 17e-6, 6e-6, 200e9) == pytest.approx(rf.allreduce_s(1e8, 4, 360e9, 17e-6))


def test_eager_mode_bounds_the_step_by_the_hosts_launches():
    spec = resolve_model("qwen2.5-0.5b").spec
    graphs = load_model(predict_analytic(spec, "h100", concurrency=(1,)))
    eager = load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(enforce_eager=True)))
    assert eager.decode.t0_s == graphs.decode.t0_s  # the device's fixed cost is the same
    per_layer = rf.LAYER_KERNELS_S + 4 * rf.GEMM_FLOOR_S
    assert graphs.decode.t0_s == pytest.approx(rf.GRAPH_STEP_S + spec.num_layers * per_layer)
    host = spec.num_layers * rf.EAGER_LAYER_S["vllm"]
    assert graphs.eager_host_s == 0.0 and eager.eager_host_s == pytest.approx(host)
    assert eager.decode_step_s(1, 100) == pytest.approx(host)  # host-bound: the launches set the step
    assert eager.decode_step_s(1, 100) > 3 * graphs.decode_step_s(1, 100)  # several-fold for a small model


def test_an_moe_layer_pays_the_fused_expert_paths_floor():
    """Each MoE layer adds MOE_LAYER_FLOOR_S to the decode step's fixed cost (the fused path's ~28 us against
    the dense MLP's 8 us of GEMM floors): Qwen3-30B-A3B's 48 MoE layers, 0.96 ms a step; a dense model none."""
    assert rf.decode_fixed_s(48, moe_layers=48) - rf.decode_fixed_s(48) == pytest.approx(48 * rf.MOE_LAYER_FLOOR_S)
    assert rf.decode_fixed_s(48, gemm_floors=False, moe_layers=48) == rf.GRAPH_STEP_S  # measured: already inside
    moe = resolve_model("qwen3-30b-a3b").spec
    m = load_model(predict_analytic(moe, "h100", concurrency=(1,)))
    assert moe.moe.moe_layers == 48 and m.decode.t0_s > rf.decode_fixed_s(moe.num_layers) + 0.9e-3


def test_the_fixed_cost_is_the_measured_one_at_32_layers_and_grows_per_layer():
    """SGLang PR #1401's Llama-3-8B (32 layers, H100, batch 1): 0.55 ms besides its weights and 128 GEMM floors,
    split into the step's own and each layer's small kernels; an 80-layer model pays the layer's part 80 times."""
    assert rf.decode_fixed_s(32) == pytest.approx(0.55e-3 + 32 * rf.GEMMS_PER_LAYER * rf.GEMM_FLOOR_S)
    assert rf.decode_fixed_s(80) - rf.decode_fixed_s(32) == pytest.approx(
        48 * (rf.LAYER_KERNELS_S + rf.GEMMS_PER_LAYER * rf.GEMM_FLOOR_S))
    assert rf.decode_fixed_s(80, step_s=2e-3, gemm_floors=False) == 2e-3  # a measured step holds its layers


def test_latent_attention_shared_experts_routers_and_qk_norms_pay_their_kernels():
    """DeepSeek-V3 decodes each layer through five attention GEMMs (MLA, three more than QKV and O) and two latent
    norms more, and each of its 58 MoE layers through a router's gate and a shared expert's two GEMMs beside the
    routed path; Qwen3-30B-A3B (grouped-query attention, no shared expert) through its routers and two per-head
    query/key norms a layer; Llama-3.1-8B through none of them."""
    ds = resolve_model("deepseek-v3").spec
    m = load_model(predict_analytic(ds, "h200", dtype="fp8", concurrency=(1,), layout=Layout(gpus=8, tp=8)))
    gemms = rf.MLA_EXTRA_GEMMS * 61 + (rf.SHARED_EXPERT_GEMMS + rf.ROUTER_GEMMS) * 58
    assert ds.moe.moe_layers == 58 and rf.extra_decode_gemms(61, True, 58, 58) == gemms == 357
    assert rf.extra_decode_kernels(61, mla=True) == rf.MLA_EXTRA_KERNELS * 61
    assert m.decode.t0_s == pytest.approx(rf.decode_fixed_s(61, moe_layers=58) + gemms * rf.GEMM_FLOOR_S
                                          + rf.MLA_EXTRA_KERNELS * 61 * rf.SMALL_KERNEL_S)
    moe = resolve_model("qwen3-30b-a3b").spec
    q = load_model(predict_analytic(moe, "h100", concurrency=(1,)))
    assert q.decode.t0_s == pytest.approx(rf.decode_fixed_s(48, moe_layers=48) + 48 * rf.ROUTER_GEMMS * rf.GEMM_FLOOR_S
                                          + 48 * rf.QK_NORM_KERNELS * rf.SMALL_KERNEL_S)
    dense = resolve_model("llama3.1-8b").spec
    assert load_model(predict_analytic(dense, "h100", concurrency=(1,))).decode.t0_s == pytest.approx(
        rf.decode_fixed_s(dense.num_layers))


def test_the_chunked_prefill_budget_splits_the_prefill():
    spec = resolve_model("qwen2.5-7b").spec
    big = load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(max_num_batched_tokens=65536)))
    small = load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(max_num_batched_tokens=512)))
    assert rf.prefill_chunks(64 * 512, 512) == 64 and rf.prefill_chunks(100, None) == 1
    d, p = small.prefill_rates(), 512
    by_hand = 64 * rf.prefill_tokens_s(512, 512 * p, small.device_costs, d.t0_s, d.bw_bytes_per_s, d.phi_flops_per_s)
    assert small.prefill_s(64, p) == pytest.approx(by_hand) and small.prefill_s(64, p) > big.prefill_s(64, p)


def test_the_engine_settings_are_stored_in_the_predicted_profile():
    spec = resolve_model("qwen2.5-7b").spec
    pred = predict_analytic(spec, "h200", concurrency=(1,), engine=EngineOptions(engine="sglang"))
    m = load_model(pred)
    assert pred.engine.name == "sglang" and pred.engine.kv_cache_tokens == m.kv_cache_tokens
    assert pred.engine.engine_args["memory_fraction"] == 0.88 == m.engine.memory_fraction
    assert m.engine.block_tokens == 1 and 2048 <= m.max_num_seqs <= 4096  # SGLang's request pool
    assert any("SGLang" in a and "mem_fraction_static" in a for a in load_fit(pred).assumptions)


def test_datasheet_memory_is_what_nvidia_smi_reports():
    assert lookup("NVIDIA H100 80GB HBM3").memory_bytes == 81559 * MIB
    assert lookup("NVIDIA H200").memory_bytes == 143771 * MIB
    assert lookup("NVIDIA A100-SXM4-80GB").memory_bytes == 80 * GIB


# ---------------------------------------------------------------- bad values: one line, exit code 2


@pytest.mark.parametrize("args, fragment", [
    (["--engine", "tgi"], "--engine tgi: use one of vllm, sglang, trtllm"),
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization must be a fraction in (0, 1]"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be a fraction in (0, 1]"),
    (["--max-num-seqs", "0"], "--max-num-seqs must be a positive integer"),
    (["--max-model-len", "0"], "--max-model-len must be a positive integer"),
    (["--max-model-len", "10000000"], "--max-model-len 10000000 is above qwen2.5-7b's max_position_embeddings"),
    (["--max-model-len", "512"], "exceed --max-model-len 512"),
    (["--kv-cache-gib", "0"], "--kv-cache-gib must be a positive size in GiB"),
    (["--kv-cache-gib", "-3"], "--kv-cache-gib must be a positive size in GiB"),
    (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype fp4: use auto"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be a positive integer"),
    (["--max-num-batched-tokens", "64", "--max-num-seqs", "128"], "--max-num-batched-tokens 64 is below --max-num-seqs"),
    (["--tp", "3", "--gpus", "3"], "--tp 3 does not divide qwen2.5-7b's 28 attention heads"),
    (["--gpus", "16"], "a H100 SXM node holds at most 8 GPUs; give --nodes 2"),
    (["--rope-scaling", "yarn"], "--rope-scaling yarn: give TYPE:FACTOR[:ORIGINAL]"),
    (["--rope-scaling", "ntk:2"], "--rope-scaling ntk:2: give TYPE:FACTOR[:ORIGINAL] with TYPE one of yarn"),
    (["--rope-scaling", "yarn:0.5"], "FACTOR 1 or more"),
    (["--rope-scaling", "yarn:4", "--max-model-len", "262144"],
     "--max-model-len 262144 is above qwen2.5-7b's context limit with yarn rope scaling (131072)"),
])
def test_bad_engine_flags_are_one_line_errors(args, fragment):
    r = _cli("--model", "qwen2.5-7b", "--gpu", "h100", "-c", "1", *args)
    assert r.exit_code == 2, r.output
    out = r.output.strip()
    assert len(out.splitlines()) == 1 and fragment in out and "Traceback" not in out, out


def test_engine_flags_go_with_an_analytic_prediction(tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text("{}")
    r = _cli("--profile", str(bad), "--enforce-eager")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and "engine flags go with --model" in r.output


def test_rope_scaling_stretches_the_context_limit_as_vllm_derives_it():
    from throughputlab.models import resolve_model

    spec = resolve_model("qwen2.5-7b").spec
    assert spec.context_limit == 32768 and spec.context_limit_name == "max_position_embeddings"
    assert spec.with_rope_scaling("yarn:4").context_limit == 131072  # original (32768) x 4
    assert spec.with_rope_scaling("yarn:4:16384").context_limit == 65536  # yarn counts from the original
    assert spec.with_rope_scaling("linear:2").context_limit == 65536
    llama = resolve_model("llama3.1-70b").spec  # llama3 rope scaling: max_position_embeddings already counts it
    assert llama.context_limit == llama.max_position_embeddings == 131072


def test_a_long_context_predicts_with_rope_scaling_and_is_refused_without():
    r = _cli("--model", "qwen2.5-7b", "--gpu", "a100 80gb sxm", "-c", "1", "--prompt-len", "63488",
             "--output-len", "2048", "--max-model-len", "65536")
    assert r.exit_code == 2 and "or give the engine's --rope-scaling" in r.output
    r = _cli("--model", "qwen2.5-7b", "--gpu", "a100 80gb sxm", "-c", "1", "--prompt-len", "63488",
             "--output-len", "2048", "--max-model-len", "65536", "--rope-scaling", "yarn:4")
    assert r.exit_code == 0, r.output
    from throughputlab.models import resolve_model
    from throughputlab.predict import predict_analytic
    from throughputlab.predict_engine import EngineOptions

    pred = predict_analytic(resolve_model("qwen2.5-7b").spec, "a100 80gb sxm", concurrency=(1,), prompt_len=63488,
                            output_len=2048, engine=EngineOptions(max_model_len=65536, rope_scaling="yarn:4"))
    assert pred.generation[0].status == "ok" and pred.model.context_limit == 131072  # the profile keeps the scaling


def test_vllm_without_async_scheduling_adds_host_time_per_running_sequence():
    """vLLM before 0.14 schedules while the GPU waits: a decode step grows by 13 us per running sequence (vLLM PR
    #23914's in-process A100 sweep); from 0.14, or asked for, or another engine: nothing added."""
    assert rf.sync_host_per_seq_s("vllm", "0.9.0") == rf.SYNC_HOST_PER_SEQ_S == 13e-6
    assert rf.sync_host_per_seq_s("vllm", "0.14.0") == rf.sync_host_per_seq_s("vllm", None) == 0.0
    assert rf.sync_host_per_seq_s("vllm", "0.9.0", async_scheduling=True) == 0.0
    assert rf.sync_host_per_seq_s("vllm", "0.20.1", async_scheduling=False) == 13e-6
    assert rf.sync_host_per_seq_s("sglang", "0.4.6") == rf.sync_host_per_seq_s("trtllm", "0.19.0") == 0.0
    spec = resolve_model("llama3.1-8b").spec
    steps = {}
    for label, opts in (("sync", EngineOptions(engine_version="0.9.0")),
                        ("async", EngineOptions(engine_version="0.9.0", async_scheduling=True))):
        model, _, _ = analytic_model(spec, "h100", engine=opts)
        steps[label] = [model.decode_step_s(c, 600) for c in (1, 64, 256)]
    for c, sync, asy in zip((1, 64, 256), steps["sync"], steps["async"]):
        assert sync - asy == pytest.approx(13e-6 * c, rel=1e-6)


def test_v0_over_several_gpus_pays_its_per_sequence_host_time():
    """vLLM's V0 engine at TP > 1 builds and broadcasts each running sequence's inputs every decode step:
    V0_TP_HOST_PER_SEQ_S a sequence (Argonne's TP-4 and dstack's TP-8 V0 sweeps); at TP 1 and on V1 the
    scheduling figure alone."""
    assert rf.sync_host_per_seq_s("vllm", "0.5.4", tp=4) == rf.V0_TP_HOST_PER_SEQ_S == 0.12e-3
    assert rf.sync_host_per_seq_s("vllm", "0.8.4+v0", tp=2) == rf.V0_TP_HOST_PER_SEQ_S
    assert rf.sync_host_per_seq_s("vllm", "0.5.4", tp=1) == rf.SYNC_HOST_PER_SEQ_S
    assert rf.sync_host_per_seq_s("vllm", "0.9.0", tp=4) == rf.SYNC_HOST_PER_SEQ_S  # V1: scheduling alone
    assert rf.sync_host_per_seq_s("vllm", "0.6.3", None, 8, tp=8) == pytest.approx(rf.V0_TP_HOST_PER_SEQ_S / 8)
    spec = resolve_model("llama3.1-70b").spec
    v0, _, _ = analytic_model(spec, "h100", layout=Layout(gpus=4, tp=4), engine=EngineOptions(engine_version="0.5.4"))
    v1, _, _ = analytic_model(spec, "h100", layout=Layout(gpus=4, tp=4), engine=EngineOptions(engine_version="0.9.0"))
    grow_v0 = v0.decode_step_s(64, 300) - v0.decode_step_s(16, 300)
    grow_v1 = v1.decode_step_s(64, 300) - v1.decode_step_s(16, 300)
    assert grow_v0 - grow_v1 == pytest.approx(48 * (rf.V0_TP_HOST_PER_SEQ_S - rf.SYNC_HOST_PER_SEQ_S), rel=1e-6)
    r = run_main("predict", "--model", "llama3.1-70b", "--gpu", "h100", "--tp", "4", "-c", "1",
                 "--engine-version", "0.5.4")
    assert r.exit_code == 0 and "+120 us of host time per running sequence" in r.output, r.output


def test_async_scheduling_is_a_predict_setting_and_a_bad_value_is_one_line():
    from conftest import refused

    r = run_main("predict", "--model", "llama3.1-8b", "--gpu", "h100", "-c", "1", "--engine-version", "0.9.0")
    assert r.exit_code == 0 and "+13 us of host time per running sequence" in r.output
    assert "SYNC_HOST_PER_SEQ_S: no async scheduling" in r.output
    r = run_main("predict", "--model", "llama3.1-8b", "--gpu", "h100", "-c", "1", "--engine-version", "0.9.0",
                 "--async-scheduling")
    assert r.exit_code == 0 and "; async scheduling" in r.output
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--set", "engine.async_scheduling=maybe",
            fragments=("engine.async_scheduling",))


def test_multi_step_scheduling_pays_the_v0_host_time_once_per_n_steps():
    """vLLM 0.6-0.7's --num-scheduler-steps N: the V0 engine's host round (and its per-sequence part) once per N
    decode steps (RFC vllm-project/vllm#6854); refused where there is no V0 engine or N is not positive."""
    from conftest import refused

    assert rf.engine_version_step_s("vllm", "0.6.0", 8) == pytest.approx(rf.V0_STEP_HOST_S / 8)
    assert rf.engine_version_step_s("vllm", "0.8.0", 8) == 0.0
    assert rf.sync_host_per_seq_s("vllm", "0.6.0", None, 8) == pytest.approx(rf.SYNC_HOST_PER_SEQ_S / 8)
    spec = resolve_model("llama3.1-8b").spec
    one, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.6.0"))
    ten, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.6.0", num_scheduler_steps=10))
    for c in (1, 64):
        saved = 0.9 * (rf.V0_STEP_HOST_S + rf.SYNC_HOST_PER_SEQ_S * c)
        assert one.decode_step_s(c, 600) - ten.decode_step_s(c, 600) == pytest.approx(saved, rel=1e-6)
    r = run_main("predict", "--model", "llama3.1-8b", "--gpu", "h100", "-c", "1", "--engine-version", "0.6.0",
                 "--num-scheduler-steps", "10")
    assert r.exit_code == 0 and "once per 10 steps: multi-step scheduling" in r.output
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--num-scheduler-steps", "8",
            fragments=("--num-scheduler-steps 8", "--engine-version 0.6.x"))
    refused("predict", "--model", "llama3.1-8b", "--gpu", "h100", "--engine-version", "0.6.0",
            "--num-scheduler-steps", "0", fragments=("--num-scheduler-steps must be a positive integer",))


def test_v0_engines_take_v0s_batch_defaults():
    """vLLM before 0.8: 256 sequences, and chunked prefill (512 tokens) only past 32K of context, else a whole
    prompt a step (max(max_model_len, 2048) tokens, which the profiling run holds in activations)."""
    spec = resolve_model("llama3.1-8b").spec
    ds = lookup("h100")
    from throughputlab.predict_engine import resolve

    long = resolve(EngineOptions(engine_version="0.6.3"), spec, ds, 1, 512, 512)
    assert (long.max_num_seqs, long.max_num_batched_tokens) == (256, 512)  # 131072 > 32K: chunked
    short = resolve(EngineOptions(engine_version="0.6.3", max_model_len=4096), spec, ds, 1, 512, 512)
    assert (short.max_num_seqs, short.max_num_batched_tokens) == (256, 4096)
    v1 = resolve(EngineOptions(engine_version="0.8.0", max_model_len=4096), spec, ds, 1, 512, 512)
    assert (v1.max_num_seqs, v1.max_num_batched_tokens) == (1024, 8192)
    # the whole-prompt profiling run leaves less KV cache than a 512-token chunk does
    m_short, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.6.3", max_model_len=32768))
    m_long, _, _ = analytic_model(spec, "h100", engine=EngineOptions(engine_version="0.6.3", max_model_len=32769))
    assert m_short.kv_cache_tokens < m_long.kv_cache_tokens


# ---------------------------------------------------------------- a served run's TPOT


def test_served_tpot_by_hand():
    """One request's output_len - 1 decode steps carry the other running slots' next prompts, one each."""
    assert rf.served_tpot_s(0.02, 0.5, 1, 101) == pytest.approx(0.02)  # alone: the decode step
    assert rf.served_tpot_s(0.02, 0.5, 11, 101) == pytest.approx(0.02 + 10 * 0.5 / 100)
    assert rf.served_tpot_s(0.02, 0.5, 11, 1) == pytest.approx(0.02 + 10 * 0.5)  # no decode step to spread over


@pytest.mark.parametrize("engine", ["sglang", "vllm"], ids=["prefill-apart", "prefill-mixed"])
def test_a_served_tpot_adds_the_other_requests_prefills_as_the_engine_schedules_them(engine):
    """SGLang keeps a prompt's prefill as a step of its own (--enable-mixed-chunk off): each of the other
    running requests' next prompt adds a whole prefill step; vLLM V1 mixes it into a decode step, which
    then costs only the prompt's compute on top of the decodes' weight read."""
    spec = resolve_model("llama3.1-8b").spec
    p, o = 2048, 256
    m = load_model(predict_analytic(spec, "h100", concurrency=(1,), prompt_len=p, output_len=o,
                                    engine=EngineOptions(engine=engine, max_num_batched_tokens=8192)))
    s = float(rf.mean_context(p, o))
    assert m.served_tpot_s(1, p, o) == pytest.approx(m.decode_step_s(1, s))
    tpot, dec = m.served_tpot_s(32, p, o), m.decode_step_s(32, s)
    own_step = m.prefill_tokens_s(p, p * p)
    mixed_extra = m.mixed_step_s(32, 32 * s, p, p * p) - dec
    assert 0 < mixed_extra < own_step
    extra = own_step if engine == "sglang" else mixed_extra
    assert tpot == pytest.approx(dec + 31 * extra / (o - 1), rel=1e-9)
    table = generation_table(m, [1, 32], p, o)
    assert list(table["tpot_ms"]) == pytest.approx([m.decode_step_s(1, s) * 1e3, tpot * 1e3])


def test_a_served_tpot_past_the_kv_cache_is_the_admitted_batchs():
    """Requests past what the engine admits queue: they lengthen the wait for a first token, not the TPOT."""
    spec = resolve_model("qwen2.5-32b").spec
    kw = dict(prompt_len=1024, output_len=1024, layout=Layout(gpus=2, tp=2))
    m = load_model(predict_analytic(spec, "l40s", concurrency=(1,), **kw))
    n = m.kv_sequences(1024, 1024)
    assert m.served_tpot_s(100, 1024, 1024) == pytest.approx(m.served_tpot_s(n, 1024, 1024), rel=1e-12)
    assert m.served_tpot_s(n, 1024, 1024) > m.served_tpot_s(n // 2, 1024, 1024)


def test_the_predicted_profile_records_the_served_tpot_and_its_interval(tmp_path):
    spec = resolve_model("qwen2.5-7b").spec
    pred = predict_analytic(spec, "h100", concurrency=(1, 64), prompt_len=1024, output_len=256)
    path = tmp_path / "p.json"
    pred.save(path)
    from throughputlab.records.profile import Profile
    again = Profile.load(path)
    m = load_model(again)
    for p in again.generation:
        got = p.predicted
        assert got.tpot_s == pytest.approx(m.served_tpot_s(p.concurrency, 1024, 256), rel=1e-9)
        assert got.tpot_s >= got.decode_step_s * (1 - 1e-12)
        lo, hi = got.tpot_s_interval
        assert lo < got.tpot_s < hi
    one, many = again.generation
    assert one.predicted.tpot_s == pytest.approx(one.predicted.decode_step_s, rel=1e-9)
    assert many.predicted.tpot_s > many.predicted.decode_step_s


def test_a_served_tpot_where_the_engine_admits_nothing_is_infinite():
    spec = resolve_model("llama3.1-70b").spec
    m = load_model(predict_analytic(spec, "h100", dtype="fp8", concurrency=(1,)))  # one H100 at 0.9: no KV room
    assert m.admitted(8, 512, 512) == 0 and math.isinf(m.served_tpot_s(8, 512, 512))
    assert m.served_tpot_s_interval(8, 512, 512) is None or math.isinf(m.served_tpot_s_interval(8, 512, 512)[0])
