"""Rollout drain simulation: hand-computed cases, an independent step-by-step reference,
KV-cache preemption, determinism and speed (by ratio)."""

from __future__ import annotations

import numpy as np
import pytest

from throughputlab import roofline as rf
from throughputlab.decide.lengths import LengthDist, parse_length_dist, read_lengths_file
from throughputlab.decide.rollout import EngineCaps, predict_rollout, simulate_rollout
from throughputlab.errors import UserError
from throughputlab.models import resolve_model
from throughputlab.roofline import Costs
from throughputlab.throughput import DecodeParams, PrefillParams, ThroughputModel


def model(prefill: bool = False, smooth=None, name="demo", t_seq=0.0) -> ThroughputModel:
    costs = Costs.from_spec(resolve_model(name).spec, 4)
    return ThroughputModel(
        source="analytic", costs=costs,
        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=10e9, phi_flops_per_s=80e9, smooth_p=smooth, t_seq_s=t_seq),
        prefill=PrefillParams(t0_s=5e-3, bw_bytes_per_s=12e9, phi_flops_per_s=150e9) if prefill else None)


# ---------------------------------------------------------------- hand-computable cases


@pytest.mark.parametrize("prefill", [False, True])
def test_equal_lengths_without_cap_are_max_tokens_steps_at_concurrency_b(prefill):
    m = model(prefill, t_seq=1e-4 if prefill else 0.0)
    b, p, n = 12, 100, 40
    r = simulate_rollout(m, [n] * b, p)
    # one prefill step (emits the first token) then n - 1 decode steps, all at concurrency b
    expected = m.prefill_s(b, p) + sum(m.decode_step_s(b, p + j) for j in range(1, n))
    assert r.wall_s == pytest.approx(expected, rel=1e-12)
    assert r.steps == n
    assert r.peak_concurrency == b and set(r.timeline_concurrency[:-1]) == {b}
    assert r.mean_concurrency == pytest.approx(b)
    assert r.preemptions == 0 and r.recompute_s == 0


def test_cap_of_one_is_the_sum_over_requests():
    m = model(prefill=True)
    p = 80
    lengths = [7, 1, 15, 3, 9]
    r = simulate_rollout(m, lengths, p, EngineCaps(max_num_seqs=1))
    one = lambda n: m.prefill_s(1, p) + sum(m.decode_step_s(1, p + j) for j in range(1, n))  # noqa: E731
    assert r.wall_s == pytest.approx(sum(one(n) for n in lengths), rel=1e-12)
    assert r.steps == sum(lengths)
    assert r.peak_concurrency == 1


def test_a_single_longest_response_sets_the_wall_time():
    m = model()
    short = simulate_rollout(m, [10] * 32, 64)
    one_long = simulate_rollout(m, [10] * 31 + [200], 64)
    assert one_long.steps == 200
    # after step 10 only one sequence is left: the tail runs at concurrency 1
    tail = sum(m.decode_step_s(1, 64 + j) for j in range(10, 200))
    assert one_long.wall_s == pytest.approx(short.wall_s + tail, rel=1e-9)
    assert one_long.below_knee_share > short.below_knee_share


# ---------------------------------------------------------------- an independent reference


def reference(m: ThroughputModel, lengths, p: int, cap: int) -> float:
    """Step-by-step, request-by-request continuous batching (slow, obvious)."""
    queue = list(lengths)
    active: list[list[int]] = []  # [context, tokens left]
    total = 0.0
    while queue or active:
        new = []
        while queue and len(active) + len(new) < cap:
            new.append([p, queue.pop(0)])
        dec = len(active)
        ctx = sum(a[0] + 1 for a in active)
        if dec == 0:
            total += m.prefill_s(len(new), p)
        else:
            c = m.costs
            d = m.decode
            mem = (c.weight_bytes + ctx * c.kv_bytes_per_token) / d.bw_bytes_per_s
            comp = (dec * c.flops_per_token + ctx * c.attn_flops_per_ctx_token) / d.phi_flops_per_s
            comp += len(new) * p * (c.flops_per_token + p * c.attn_flops_per_ctx_token / 2) / d.phi_flops_per_s
            small = dec * c.num_layers * rf.decode_elementwise_bytes(c) / d.bw_bytes_per_s  # the small kernels' bytes
            total += d.t0_s + dec * d.t_seq_s + max(mem, comp) + small
        for a in active:
            a[0] += 1
            a[1] -= 1
        for a in new:
            a[1] -= 1
        active = [a for a in active + new if a[1] > 0]
    return total


@pytest.mark.parametrize("seed,cap,t_seq", [(0, 4, 0.0), (1, 16, 0.0), (2, 64, 0.0), (3, 1000, 0.0), (4, 16, 3e-4)])
def test_matches_a_step_by_step_reference(seed, cap, t_seq):
    m = model(t_seq=t_seq)
    lengths = LengthDist(kind="lognormal", mean=40, sigma=0.8, max_tokens=150).sample(48, seed)
    r = simulate_rollout(m, lengths, 32, EngineCaps(max_num_seqs=cap))
    assert r.wall_s == pytest.approx(reference(m, lengths, 32, cap), rel=1e-9)


def test_smooth_max_and_moe_models_evaluate_like_the_scalar_formulas():
    for m in (model(smooth=4.0), model(name="qwen3-30b-a3b")):
        r = simulate_rollout(m, [20] * 6, 50)
        expected = m.prefill_s(6, 50) + sum(m.decode_step_s(6, 50 + j) for j in range(1, 20))
        assert r.wall_s == pytest.approx(expected, rel=1e-9)


# ---------------------------------------------------------------- KV cache


def test_event_loop_equals_slot_schedule_when_the_cache_is_ample():
    m = model()
    lengths = LengthDist(kind="lognormal", mean=60, sigma=0.7, max_tokens=300).sample(300, 5)
    caps = EngineCaps(max_num_seqs=48, kv_cache_tokens=10**8, block_size=16)
    a = simulate_rollout(m, lengths, 64, caps)
    b = simulate_rollout(m, lengths, 64, caps, force_event_loop=True)
    assert a.wall_s == pytest.approx(b.wall_s, rel=1e-12)
    assert a.steps == b.steps and b.preemptions == 0 and not b.kv_limited


def test_kv_pressure_preempts_and_counts_the_recompute():
    m = model()
    lengths = LengthDist(kind="lognormal", mean=200, sigma=0.5, max_tokens=600).sample(64, 1)
    free = simulate_rollout(m, lengths, 128, EngineCaps(max_num_seqs=64))
    tight = simulate_rollout(m, lengths, 128, EngineCaps(max_num_seqs=64, kv_cache_tokens=64 * 128 + 2048,
                                                         block_size=16))
    assert tight.kv_limited and tight.preemptions > 0
    assert tight.recompute_s > 0
    assert tight.output_tokens == free.output_tokens
    assert tight.wall_s > free.wall_s
    assert tight.peak_concurrency <= 64


def test_admission_limited_by_kv_tokens_without_preemption():
    m = model()
    # 16 requests of prompt 100 + 20 tokens; the cache holds 4 of them at a time (blocks of 1 token)
    caps = EngineCaps(kv_cache_tokens=4 * 120, block_size=1)
    r = simulate_rollout(m, [20] * 16, 100, caps)
    assert r.peak_concurrency == 4 and r.preemptions == 0 and r.kv_limited
    same = simulate_rollout(m, [20] * 16, 100, EngineCaps(max_num_seqs=4))
    assert r.wall_s == pytest.approx(same.wall_s, rel=1e-12)


def test_a_request_larger_than_the_cache_is_a_user_error():
    with pytest.raises(UserError, match="KV-cache tokens"):
        simulate_rollout(model(), [500], 100, EngineCaps(kv_cache_tokens=256, block_size=16))


# ---------------------------------------------------------------- determinism, speed


def test_deterministic_for_a_seed():
    m = model()
    d = parse_length_dist("lognormal:mean=120,sigma=0.9,max=512")
    a = predict_rollout(m, 256, 64, d, EngineCaps(max_num_seqs=64), seed=3)
    b = predict_rollout(m, 256, 64, d, EngineCaps(max_num_seqs=64), seed=3)
    c = predict_rollout(m, 256, 64, d, EngineCaps(max_num_seqs=64), seed=4)
    assert a == b
    assert a.wall_s != c.wall_s


# ---------------------------------------------------------------- length inputs


def test_length_dist_forms_and_cut():
    d = parse_length_dist("lognormal:mean=300,sigma=1.5,max=512")
    x = d.sample(5000, 0)
    assert x.max() == 512 and x.min() >= 1
    assert (x == 512).mean() > 0.05  # the cut is where long responses stop
    u = parse_length_dist("uniform:min=5,max=9").sample(1000, 0)
    assert set(u.tolist()) == {5, 6, 7, 8, 9}
    assert set(parse_length_dist("fixed:len=33").sample(10, 0).tolist()) == {33}


@pytest.mark.parametrize("text,msg", [
    ("gamma:mean=3", "unknown form"),
    ("lognormal:mean=300", "missing sigma"),
    ("lognormal:mean=300,sigma=0.5,cap=10", "unknown key"),
    ("lognormal:mean=-1,sigma=0.5", "positive"),
    ("uniform:min=10,max=5", "at least min"),
    ("fixed:len=0", "positive integer"),
    ("lognormal:mean", "key=value"),
])
def test_bad_length_dist_is_one_line(text, msg):
    with pytest.raises(UserError, match=msg) as e:
        parse_length_dist(text)
    assert "\n" not in str(e.value)


def test_lengths_file_forms(tmp_path):
    (tmp_path / "a.txt").write_text("10\n20\n30\n")
    (tmp_path / "b.csv").write_text("id,response_len\n1,5\n2,7\n")
    (tmp_path / "c.json").write_text("[3, 4]")
    assert read_lengths_file(tmp_path / "a.txt").values == [10, 20, 30]
    assert read_lengths_file(tmp_path / "b.csv").values == [5, 7]
    d = read_lengths_file(tmp_path / "c.json", max_tokens=3)
    assert set(d.sample(50, 0).tolist()) == {3}
    (tmp_path / "bad.txt").write_text("10\n-2\n")
    with pytest.raises(UserError, match="positive whole"):
        read_lengths_file(tmp_path / "bad.txt")
    with pytest.raises(UserError, match="cannot read"):
        read_lengths_file(tmp_path / "missing.txt")


# ---------------------------------------------------------------- GRPO groups sharing their prompt


def test_a_group_prefills_its_prompt_once():
    m = model(prefill=True)
    p, g = 200, 4
    shared = simulate_rollout(m, [20] * 8, p, group=g)
    apart = simulate_rollout(m, [20] * 8, p)
    # one prefill step either way (all 8 admitted together); shared: 2 prompts of 200 tokens and one
    # token of each cached prompt for the other 6 requests; apart: 8 prompts
    first_shared = m.prefill_tokens_s(2 * p + 6, 2 * p * p + 6)
    first_apart = m.prefill_tokens_s(8 * p, 8 * p * p)
    assert apart.wall_s - shared.wall_s == pytest.approx(first_apart - first_shared, rel=1e-9)


def test_shared_prompts_hold_their_kv_once_so_more_requests_fit():
    m = model(prefill=True)
    p, n, g = 512, 32, 8
    lengths = np.full(n, 64)
    caps = EngineCaps(kv_cache_tokens=12 * (p + 64), block_size=16)  # 12 requests' worth when counted apart
    apart = simulate_rollout(m, lengths, p, caps)
    shared = simulate_rollout(m, lengths, p, caps, group=g)
    assert apart.kv_limited and apart.peak_concurrency <= 13  # prompts fit 13, their growth preempts
    assert shared.peak_concurrency > 2 * apart.peak_concurrency
    assert shared.wall_s < apart.wall_s
    # the event loop and the slot schedule agree when the cache is not the limit
    roomy = EngineCaps(kv_cache_tokens=10**7, block_size=16)
    a = simulate_rollout(m, lengths, p, roomy, group=g)
    b = simulate_rollout(m, lengths, p, roomy, group=g, force_event_loop=True)
    assert a.wall_s == pytest.approx(b.wall_s, rel=1e-9) and a.prefill_s == pytest.approx(b.prefill_s, rel=1e-9)


def test_a_preempted_request_of_a_running_group_recomputes_only_its_own_tokens():
    m = model(prefill=True)
    p = 256
    lengths = np.array([300, 300, 300, 300])
    caps = EngineCaps(kv_cache_tokens=3 * 16 * 24, block_size=16)  # the growing contexts outgrow the cache
    shared = simulate_rollout(m, lengths, p, caps, group=4, force_event_loop=True)
    apart = simulate_rollout(m, lengths, p, caps, force_event_loop=True)
    assert shared.preemptions >= 1 and apart.preemptions >= 1
    assert shared.recompute_s < apart.recompute_s


# ---------------------------------------------------------------- the event loop against brute force


def kv_reference(lengths, p: int, caps: EngineCaps, group: int = 1):
    """Step by step, request by request, every block counted again each step (slow, obvious):
    preempt the most recently admitted while the decodes' blocks exceed the cache, admit from the
    front of the queue only in a step that did not preempt."""
    n = len(lengths)
    shared = p - p // group if group > 1 else 0
    bs, total = caps.block_size, caps.kv_cache_tokens // caps.block_size
    max_seqs = caps.max_num_seqs or n
    waiting = [(i, 0) for i in range(n)]  # (request, tokens generated)
    running: list[list[int]] = []  # [request, context, tokens left], in admission order
    in_group = [0] * n
    rows, preemptions, kv_limited = [], 0, False

    def need(r):
        return -(-(r[1] + 1 - shared) // bs)

    while waiting or running:
        preempted = False
        while running and sum(need(r) for r in running) > total:
            r = running.pop()
            waiting.insert(0, (r[0], int(lengths[r[0]]) - r[2]))
            in_group[r[0] // group] -= 1
            preemptions += 1
            preempted = kv_limited = True
        used = sum(need(r) for r in running)
        new = []
        while not preempted and waiting and len(running) + len(new) < max_seqs:
            i, g = waiting[0]
            q = p + g
            if used + -(-(q - shared) // bs) > total:
                kv_limited = True
                break
            waiting.pop(0)
            used += -(-(q - shared) // bs)
            new.append((i, q, max(g, 1) if group > 1 and in_group[i // group] else q))
            in_group[i // group] += 1
        rows.append((len(running), sum(r[1] + 1 for r in running), len(new), sum(x[2] for x in new),
                     sum(x[2] ** 2 for x in new), sum(x[2] for x in new if x[1] > p)))
        for r in running:
            r[1] += 1
            r[2] -= 1
        running += [[i, q, int(lengths[i]) - (q - p) - 1] for i, q, _ in new]
        for r in running:
            if r[2] == 0:
                in_group[r[0] // group] -= 1
        running = [r for r in running if r[2] > 0]
    return np.array(rows, dtype=float).reshape(-1, 6), preemptions, kv_limited


def _columns(st):
    return np.stack([st.dec, st.ctx, st.new, st.q1, st.q2, st.rq1], axis=1)


def _random_case(rng):
    group = int(rng.choice([1, 2, 4]))
    n = max(group, int(rng.integers(2, 40)) // group * group)
    p = int(rng.integers(1, 80))
    bs = int(rng.choice([1, 4, 16]))
    lengths = np.minimum(np.maximum(1, rng.lognormal(3, 1, size=n).astype(int)), 200)
    kv = int(rng.integers(p + lengths.max() + bs, (p + lengths.max()) * 5 + 2 * bs))
    return lengths, p, EngineCaps(max_num_seqs=int(rng.integers(1, 30)), kv_cache_tokens=kv, block_size=bs), group


def test_event_loop_and_every_smaller_batch_match_a_brute_force_reference():
    from throughputlab.decide.schedule import schedule_kv_prefixes

    rng = np.random.default_rng(7)
    limited = 0
    for _ in range(60):
        lengths, p, caps, group = _random_case(rng)
        sizes = list(range(group, len(lengths), group))
        full, tails = schedule_kv_prefixes(lengths, p, caps, group, sizes)
        rows, pre, kv = kv_reference(lengths, p, caps, group)
        assert np.array_equal(_columns(full), rows) and full.preemptions == pre and full.kv_limited == kv
        limited += kv
        for m in sizes:
            rows, pre, kv = kv_reference(lengths[:m], p, caps, group)
            t = tails[m]
            got = np.concatenate([_columns(full)[:t.cut], _columns(t.steps)])
            assert np.array_equal(got, rows) and t.preemptions == pre and t.kv_limited == kv
    assert limited > 20  # the cases do exercise the cache


@pytest.mark.parametrize("kv", [None, "tight"])
def test_many_batch_sizes_at_once_equal_one_by_one(kv):
    from throughputlab.decide.rollout import simulate_rollouts

    m = model(prefill=True)
    lengths = LengthDist(kind="lognormal", mean=80, sigma=0.9, max_tokens=400).sample(96, 3)
    caps = EngineCaps(max_num_seqs=24, kv_cache_tokens=1200 if kv else None, block_size=16)
    sizes = [4, 8, 20, 44, 60, 96]
    many = simulate_rollouts(m, lengths, 48, sizes, caps, group=4, context_max=400)
    assert any(r.kv_limited for r in many.values()) == bool(kv)
    for n in sizes:
        one = simulate_rollout(m, lengths[:n], 48, caps, group=4, context_max=400)
        a, b = many[n].model_dump(), one.model_dump()
        for key in ("steps", "preemptions", "kv_limited", "peak_concurrency", "n_requests", "output_tokens",
                    "timeline_concurrency"):
            assert a[key] == b[key], key
        for key in ("wall_s", "decode_s", "prefill_s", "recompute_s", "mean_concurrency", "below_knee_share"):
            assert a[key] == pytest.approx(b[key], rel=1e-9, abs=1e-12), key
        assert a["timeline_t_s"] == pytest.approx(b["timeline_t_s"], rel=1e-9)


@pytest.mark.parametrize("tp,bw_mem", [(1, None), (1, 4e9), (8, None)])
def test_the_rollouts_knee_is_the_models_knee(tp, bw_mem):
    """One device of a tensor-parallel engine (qwen2.5-7b: 4 KV heads, replicated at tp 8), and KV
    reads below the weights' rate: the rollout's knee is the throughput model's, at its mean context."""
    costs = Costs.from_spec(resolve_model("qwen2.5-7b").spec, 2)
    m = ThroughputModel(source="analytic", costs=costs, tp=tp,
                        decode=DecodeParams(t0_s=2e-3, bw_bytes_per_s=3e12, phi_flops_per_s=6e14,
                                            bw_mem_bytes_per_s=bw_mem))
    r = simulate_rollout(m, [64] * 8, 512)
    s = round(512 + 63 / 2 + 0.5)
    if bw_mem is not None and bw_mem < 1e10:  # KV reads at 4 GB/s grow faster than the arithmetic: no knee
        assert m.knee(s) is None and r.knee_concurrency is None
    else:
        assert r.knee_concurrency == pytest.approx(m.knee(s), rel=1e-6)


def test_sglang_prefills_in_a_pass_of_its_own_while_the_decodes_wait():
    """SGLang keeps prefill apart from decodes (--enable-mixed-chunk off by default): a step that admits a prompt
    costs the prefill pass plus the decodes' pass; vLLM V1 reads the weights once for both. Every other step is
    the same, and the rollout's wall time differs by exactly those steps."""
    from throughputlab.decide.rollout import step_costs
    from throughputlab.decide.schedule import schedule_slots
    from throughputlab.fit import load_model
    from throughputlab.predict import predict_analytic
    from throughputlab.predict_engine import EngineOptions

    spec = resolve_model("llama3.1-8b").spec
    sg = load_model(predict_analytic(spec, "h100", concurrency=(1,), engine=EngineOptions(engine="sglang")))
    mixing = sg.model_copy(update={"engine": sg.engine.model_copy(update={"name": "vllm"})})
    assert sg.separate_prefill and not mixing.separate_prefill
    lengths, p = [30, 50, 40, 20, 60, 10], 512
    st, _, _ = schedule_slots(np.array(lengths), p, 3)
    t_sg, dec_sg = step_costs(sg, st)
    t_mix, _ = step_costs(mixing, st)
    both = (st.dec > 0) & (st.q1 > 0)
    assert both.any() and (~both).any()
    assert t_sg[~both] == pytest.approx(t_mix[~both], rel=1e-12)
    assert t_sg[both] == pytest.approx(dec_sg[both] + sg.prefill_tokens_s(st.q1[both], st.q2[both]), rel=1e-12)
    assert np.all(t_sg[both] > t_mix[both])
    caps = EngineCaps(max_num_seqs=3)
    gap = simulate_rollout(sg, lengths, p, caps).wall_s - simulate_rollout(mixing, lengths, p, caps).wall_s
    assert gap == pytest.approx(float((t_sg - t_mix).sum()), rel=1e-9)
