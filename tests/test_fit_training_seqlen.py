"""The training fit on a sequence-length axis: the causal attention at a FLOP rate of its own or
not (chosen by held-out error), and activation memory per sequence as a function of S; a profile
with one sequence length fitted as before."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import linregress

from _synth import TRUE, make_profile
from throughputlab.fit import FitResult, fit_profile
from throughputlab.fit.schema import memory_statement, micro_batch_statement
from throughputlab.fit.summary import summary_lines
from throughputlab.records.profile import TrainPoint, TrainSample
from throughputlab.roofline import Costs, train_step_s

SEQ_LENS = (128, 256, 512, 1024)
MBS = (1, 2, 4)
GIB = 2 ** 30
M0, M1, M2 = 1.6e9, 1.0e6, 400.0  # bytes, bytes per token, bytes per token^2


def axis_profile(*, phi_attn=None, m2=0.0, noise=0.005, seed=0, seq_lens=SEQ_LENS, mbs=MBS, ooms=()):
    """The demo model's training points at every (micro-batch, sequence length), generated through
    the roofline's step time and M0 + b*(m1*S + m2*S^2); ``ooms``: (micro-batch, seq_len) pairs."""
    prof = make_profile(micro_batches=(1,), seed=seed)
    costs = Costs.from_spec(prof.model, 4)
    rng = np.random.default_rng(seed)
    train = []
    for s in seq_lens:
        for b in mbs:
            t = train_step_s(b, s, costs, TRUE["train_t0"], TRUE["train_phi"], phi_attn=phi_attn)
            samples = [TrainSample(step_s=t * (1 + noise * rng.standard_normal())) for _ in range(3)]
            mem = M0 + b * (M1 * s + m2 * s * s) * (1 + noise * rng.standard_normal())
            train.append(TrainPoint(backend="torch", micro_batch=b, seq_len=s, status="ok", samples=samples,
                                    peak_mem_bytes=int(mem)))
    train += [TrainPoint(backend="torch", micro_batch=b, seq_len=s, status="oom", error="out of memory")
              for b, s in ooms]
    prof.training = train
    return prof


def _param(params, name):
    return next((e for e in params if e.name == name), None)


@pytest.fixture(scope="module")
def split_fit():
    return fit_profile(axis_profile(phi_attn=TRUE["train_phi"] / 4, m2=M2))


@pytest.mark.slow
def test_attention_rate_of_its_own_is_chosen_and_recovered(split_fit):
    tr = split_fit.training
    assert tr.form == "split" and tr.seq_lens == list(SEQ_LENS)
    assert _param(tr.params, "phi_train_flops_per_s").value == pytest.approx(TRUE["train_phi"], rel=0.05)
    assert _param(tr.params, "phi_attn_train_flops_per_s").value == pytest.approx(TRUE["train_phi"] / 4, rel=0.1)
    assert _param(tr.params, "t0_s").value == pytest.approx(TRUE["train_t0"], rel=0.2)
    assert tr.form_loo_mean_abs_error["split"] < 0.9 * tr.form_loo_mean_abs_error["single"]
    assert tr.attention_note.startswith("fitted from sequence lengths 128 to 1024")
    # every point held out, and predicted within 5% of its tokens/s
    assert len(tr.points) == len(SEQ_LENS) * len(MBS)
    assert all(p.loo_rel_error is not None for p in tr.points)
    assert tr.loo_max_abs_error < 0.05
    assert split_fit.model.train.phi_attn_flops_per_s == _param(tr.params, "phi_attn_train_flops_per_s").value
    # the model's step at an unmeasured length follows the split form
    costs = Costs.from_spec(axis_profile().model, 4)
    true = train_step_s(2, 768, costs, TRUE["train_t0"], TRUE["train_phi"], phi_attn=TRUE["train_phi"] / 4)
    assert split_fit.model.train_step_s(2, 768) == pytest.approx(true, rel=0.03)


def test_one_rate_suffices_when_the_attention_runs_at_it():
    r = fit_profile(axis_profile())
    tr = r.training
    assert tr.form == "single" and "split" in tr.form_loo_mean_abs_error
    assert "not kept" in tr.attention_note
    assert _param(tr.params, "phi_attn_train_flops_per_s") is None
    assert _param(tr.params, "phi_train_flops_per_s").value == pytest.approx(TRUE["train_phi"], rel=0.03)
    assert r.model.train.phi_attn_flops_per_s is None
    assert tr.loo_max_abs_error < 0.05
    assert not any("fitted together" in w for w in r.warnings)


def test_lengths_close_together_do_not_try_the_attention_rate():
    tr = fit_profile(axis_profile(seq_lens=(128, 192), mbs=(1, 2, 4, 8))).training
    assert tr.form == "single" and "split" not in tr.form_loo_mean_abs_error
    assert tr.attention_note.startswith("not identified: sequence lengths 128 to 192 (less than 2x apart)")


def test_memory_per_sequence_quadratic_in_s(split_fit):
    mem = split_fit.training.memory
    assert mem.activation_form == "quadratic"
    assert mem.form_loo_mean_abs_error["quadratic"] < 0.9 * mem.form_loo_mean_abs_error["linear"]
    assert mem.mem0_bytes == pytest.approx(M0, rel=0.02)
    assert mem.mem_per_token_bytes == pytest.approx(M1, rel=0.1)
    assert mem.mem_per_token_sq_bytes == pytest.approx(M2, rel=0.1)
    assert [a.seq_len for a in mem.per_seq_len] == list(SEQ_LENS)
    for a in mem.per_seq_len:
        true = M1 * a.seq_len + M2 * a.seq_len ** 2
        assert a.mem_per_sample_bytes == pytest.approx(true, rel=0.03)
        assert a.line_mem_per_sample_bytes == pytest.approx(true, rel=0.05)  # the length's own line
        assert a.max_micro_batch == math.floor((8 * GIB - mem.mem0_bytes) / a.mem_per_sample_bytes)
        assert split_fit.model.max_micro_batch(a.seq_len) == a.max_micro_batch
        assert a.loo_max_abs_error < 0.03
    # the reference length (the median one) carries the top-level figures and the model's line
    assert mem.seq_len == split_fit.training.seq_len == 256
    ref = next(a for a in mem.per_seq_len if a.seq_len == 256)
    assert mem.max_micro_batch == ref.max_micro_batch == split_fit.model.max_micro_batch()
    assert split_fit.model.activation_bytes(1024) == pytest.approx(M1 * 1024 + M2 * 1024 ** 2, rel=0.03)
    text = memory_statement(mem, 1024)
    assert text.startswith(f"largest micro-batch that fits at seq len 1024: {mem.per_seq_len[-1].max_micro_batch} ")
    assert "quadratic" in text and "measured at 1024: largest ok 4, no OOM" in text
    assert micro_batch_statement(split_fit, 512).startswith("largest micro-batch that fits at seq len 512: ")
    assert "not measured at this length" in memory_statement(mem, 2048)


@pytest.mark.slow
def test_memory_linear_in_s_when_the_data_say_so():
    mem = fit_profile(axis_profile(seed=1)).training.memory
    assert mem.activation_form == "linear" and mem.mem_sq_share == 0.0 and mem.mem_per_token_sq_bytes == 0.0
    assert mem.mem_per_token_bytes == pytest.approx(M1, rel=0.03)
    for a in mem.per_seq_len:
        assert a.mem_per_sample_bytes == pytest.approx(M1 * a.seq_len, rel=0.03)


@pytest.mark.slow
def test_an_oom_at_a_long_length_caps_that_length_and_longer_only():
    r = fit_profile(axis_profile(m2=M2, ooms=[(8, 512)]))
    mem = r.training.memory
    by = {a.seq_len: a for a in mem.per_seq_len}
    assert by[512].smallest_oom_micro_batch == 8 and by[512].max_micro_batch == 7
    assert by[1024].smallest_oom_micro_batch == 8 and by[1024].max_micro_batch <= 7
    assert by[128].smallest_oom_micro_batch is None and by[128].max_micro_batch > 8
    assert mem.smallest_oom_micro_batch is None  # none at or below the reference length 256
    assert r.model.max_micro_batch(512) == 7 and r.model.max_micro_batch(128) == by[128].max_micro_batch
    assert "capped below the OOM at 8" in memory_statement(mem, 512)


def test_summary_states_the_form_the_errors_and_memory_by_length(split_fit):
    text = "\n".join(summary_lines(split_fit))
    assert "training (split form, seq lens 128, 256, 512, 1024, 12 points):" in text
    assert "attention term: fitted from sequence lengths 128 to 1024" in text
    assert "held-out tokens/s error by micro-batch@seq len: 1@128:" in text
    assert "m(S) quadratic in S" in text and "memory per sequence by seq len, m(S)/own line: 128:" in text


def test_one_length_fitted_as_before_and_the_attention_not_identified():
    prof = make_profile(seed=1)
    r = fit_profile(prof)
    tr = r.training
    assert tr.form == "single" and tr.seq_lens == [128] and tr.form_loo_mean_abs_error.keys() == {"single"}
    assert tr.attention_note.startswith("not identified: one sequence length (128 tokens)")
    assert [e.name for e in tr.params] == ["t0_s", "phi_train_flops_per_s"]
    assert r.model.train.phi_attn_flops_per_s is None and r.model.train.mem_sq_share == 0.0
    mem = tr.memory
    assert mem.activation_form is None and mem.per_seq_len == [] and mem.seq_len is None
    line = linregress([p.micro_batch for p in prof.training], [p.peak_mem_bytes for p in prof.training])
    assert mem.mem0_bytes == pytest.approx(line.intercept, rel=1e-12)
    assert mem.mem_per_sample_bytes == pytest.approx(line.slope, rel=1e-12)
    head = f"largest micro-batch that fits: {mem.max_micro_batch} (memory line M0 + b*m"
    assert memory_statement(mem).startswith(head)
    # the model's memory at another length scales the measured slope linearly, as before
    assert r.model.activation_bytes(512) == pytest.approx(mem.mem_per_sample_bytes * 4)
    text = "\n".join(summary_lines(r))
    assert "training (single form, seq len 128, 4 points):" in text and "attention term: not identified" in text


def test_a_stored_fit_without_the_new_fields_still_loads(split_fit):
    d = split_fit.model_dump(mode="json")
    for k in ("form", "attention_note", "form_loo_mean_abs_error", "seq_lens"):
        d["training"].pop(k)
    for k in ("activation_form", "seq_len", "mem_per_token_bytes", "mem_per_token_sq_bytes", "mem_sq_share",
              "form_loo_mean_abs_error", "activation_note", "per_seq_len"):
        d["training"]["memory"].pop(k)
    for k in ("phi_attn_flops_per_s", "mem_sq_share", "smallest_oom_by_seq_len"):
        d["model"]["train"].pop(k)
    old = FitResult.model_validate(d)
    assert old.training.form == "single" and old.training.memory.activation_form is None
    assert old.model.train.phi_attn_flops_per_s is None
