"""The training fits: the micro-step line ``t0 + 3*b*S*(F + S*a/2)/PHI_train`` (plus the
sweep's median optimizer step), or on a sequence-length axis with the causal attention at a rate
of its own, ``t0 + 3*b*S*F/PHI_train + 3*b*S*S*a/2/PHI_attn``, whichever predicts held-out points
better; and the memory line ``M0 + b*m`` (``M0 + b*m(S)`` over several lengths) with the largest
micro-batch that fits (docs/model.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.stats import linregress
from scipy.stats import t as student_t

from throughputlab import roofline as rf
from throughputlab.fit.identify import flops_note
from throughputlab.fit.solver import LSQ, bootstrap, can_bootstrap, estimates, leave_one_out, rms, solve
from throughputlab.records.fit import CI_LEVEL, MemoryAtSeqLen, MemoryFit, Peaks, PointError, TrainingFit
from throughputlab.records.profile import Profile, TrainPoint
from throughputlab.roofline import Costs
from throughputlab.throughput import TrainParams


@dataclass
class TrainObs:
    b: int
    seq_len: int
    step_s: float  # what the line is fitted to: median forward + backward, plus the optimizer's median
    point: Optional[TrainPoint] = field(default=None, repr=False)
    measured_step_s: Optional[float] = None  # the point's own median micro-step (optimizer included)


def _train_obs(p: TrainPoint, samples, opt_s: float) -> TrainObs:
    """The optimizer step costs the same at every micro-batch, so its median over the whole sweep
    replaces each point's own (one noise source fewer); the forward and backward stay the point's."""
    compute = [s.forward_s + s.backward_s for s in samples if s.forward_s is not None and s.backward_s is not None]
    total = statistics.median(s.step_s for s in samples)
    fitted = statistics.median(compute) + opt_s if len(compute) == len(samples) and opt_s else total
    return TrainObs(p.micro_batch, p.seq_len, fitted, p, total)


def _fit_train_line(costs: Costs, obs: list[TrainObs], opt_s: float, phi_hi: Optional[float], starts=None,
                    extra_start=None, split: bool = False) -> LSQ:
    """Log t0, log PHI_train (and log PHI_attn with ``split``) by least squares on log step times."""
    b = np.array([o.b for o in obs], float)
    seq = np.array([o.seq_len for o in obs], float)
    y = np.array([o.step_s for o in obs], float)

    def f(x: np.ndarray) -> np.ndarray:
        t0, phi, *attn = np.exp(x)
        return np.log((rf.train_step_s(b, seq, costs, t0, phi, phi_attn=attn[0] if attn else None) + opt_s) / y)

    big = max(obs, key=lambda o: o.b * o.seq_len)
    small = min(obs, key=lambda o: o.b * o.seq_len)
    # two-point line through the smallest and largest micro-batch gives the natural start
    fl_big, fl_small = rf.train_flops(costs, big.b, big.seq_len), rf.train_flops(costs, small.b, small.seq_len)
    if big.step_s > small.step_s and fl_big > fl_small:
        phi0 = (fl_big - fl_small) / (big.step_s - small.step_s)
    else:
        phi0 = fl_big / big.step_s
    t00 = max(small.step_s - opt_s - fl_small / phi0, 0.01 * small.step_s)
    lo = np.log([1e-9, 1e6] + ([1e6] if split else []))
    hi = np.log([max(o.step_s for o in obs) * 10, phi_hi or 1e18] + ([phi_hi or 1e18] if split else []))
    s = starts or [np.log([t00, phi0]), np.log([0.1 * small.step_s, fl_big / big.step_s]),
                   np.log([0.5 * small.step_s, 2 * phi0])]
    if split and not starts:
        s = [np.append(x, x[1]) for x in s] + _linear_starts(costs, b, seq, y - opt_s)
    if extra_start is not None:
        s = [extra_start, *s]
    return solve(f, s, lo, hi)


def _linear_starts(costs: Costs, b: np.ndarray, seq: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The split form is linear in (t0, 1/PHI, 1/PHI_attn): its least-squares solution, where positive."""
    gemm = rf.train_step_s(b, seq, costs, 0.0, 1.0, phi_attn=np.inf)
    attn = rf.train_step_s(b, seq, costs, 0.0, np.inf, phi_attn=1.0)
    coef = np.linalg.lstsq(np.column_stack([np.ones_like(y), gemm, attn]) / y[:, None], np.ones_like(y), rcond=None)[0]
    return [np.log([coef[0], 1 / coef[1], 1 / coef[2]])] if np.all(coef > 0) else []


SPLIT_SEQ_RATIO = 2.0  # PHI_attn is tried when the sequence lengths span at least this ratio
SPLIT_MIN_POINTS = 6
MEMORY_LOO_LOOSE = 0.10  # held-out peak-memory error above which the memory fit says it is rough


def _held_out(costs: Costs, obs: list[TrainObs], opt_s: float, phi_hi: Optional[float], sol: LSQ,
              split: bool) -> list[Optional[float]]:
    """Each point's held-out relative error of tokens/s (step_meas/step_pred - 1), refitted without it."""
    def one(rest: list[TrainObs], o: TrainObs) -> float:
        t0, phi, *attn = _fit_train_line(costs, rest, opt_s, phi_hi, extra_start=sol.x, split=split).values()
        pred = rf.train_step_s(o.b, o.seq_len, costs, t0, phi, phi_attn=attn[0] if attn else None) + opt_s
        return o.measured_step_s / pred - 1

    return leave_one_out(obs, 4 if split else 2, one)


def _mean_abs(errs: list[Optional[float]]) -> Optional[float]:
    e = [abs(x) for x in errs if x is not None]
    return float(np.mean(e)) if e else None


def fit_training(profile: Profile, points: list[TrainPoint], costs: Costs, peaks: Peaks, warnings: list[str],
                 bootstrap_n: int, rng: np.random.Generator, phi_hi: Optional[float]):
    """(TrainingFit, TrainParams) of the profile's ok training points."""
    opt = [s.optimizer_s for p in points for s in p.samples if s.optimizer_s is not None]
    opt_s = statistics.median(opt) if opt else 0.0
    obs = [_train_obs(p, p.samples, opt_s) for p in points]
    note = None if opt else "no separate optimizer timing: the fixed cost t0 includes the optimizer step"
    seq_lens = sorted({o.seq_len for o in obs})
    fits = {"single": _fit_train_line(costs, obs, opt_s, phi_hi)}
    loo = {"single": _held_out(costs, obs, opt_s, phi_hi, fits["single"], False)}
    if len(seq_lens) > 1 and seq_lens[-1] >= SPLIT_SEQ_RATIO * seq_lens[0] and len(obs) >= SPLIT_MIN_POINTS:
        fits["split"] = _fit_train_line(costs, obs, opt_s, phi_hi, split=True)
        loo["split"] = _held_out(costs, obs, opt_s, phi_hi, fits["split"], True)
    errors = {k: _mean_abs(v) for k, v in loo.items()}
    form = "single"
    if "split" in fits and errors["split"] is not None and errors["single"] is not None \
            and errors["split"] < 0.9 * errors["single"] and not fits["split"].at_bound[2]:
        form = "split"  # one more parameter, kept only when it predicts held-out points clearly better
    split = form == "split"
    sol = fits[form]
    t0, phi, *attn = sol.values()
    phi_attn = attn[0] if attn else None

    boot = None
    if bootstrap_n > 0 and can_bootstrap("training", [len(o.point.samples) for o in obs], warnings):
        def draw() -> list[TrainObs]:
            out = []
            for o in obs:
                idx = rng.integers(0, len(o.point.samples), len(o.point.samples))
                out.append(_train_obs(o.point, [o.point.samples[i] for i in idx], opt_s))
            return out

        draws = bootstrap(bootstrap_n, draw, lambda bobs: np.exp(_fit_train_line(costs, bobs, opt_s, phi_hi,
                                                                                  starts=[sol.x], split=split).x))
        boot = np.array(draws) if draws else None

    if len(obs) < 3:
        warnings.append(f"only {len(obs)} training point(s): no leave-one-out error (measure at least 3 micro-batches)")

    pts = []
    for o, e in zip(obs, loo[form]):
        fit_t = rf.train_step_s(o.b, o.seq_len, costs, t0, phi, phi_attn=phi_attn) + opt_s
        meas_tps = o.point.tokens_per_s
        pts.append(PointError(
            x=o.b, context_len=o.seq_len, measured_tokens_per_s=meas_tps, fitted_tokens_per_s=o.b * o.seq_len / fit_t,
            loo_tokens_per_s=None if e is None else meas_tps * (1 + e), loo_rel_error=e, measured_s=o.measured_step_s,
            fitted_s=fit_t, loo_s=None if e is None else o.measured_step_s / (1 + e)))
    errs = [abs(e) for e in loo[form] if e is not None]

    ref_len = statistics.median_low(sorted(o.seq_len for o in obs))
    memory = fit_memory(profile, ref_len)
    params = TrainParams(
        t0_s=t0, phi_flops_per_s=phi, optimizer_step_s=opt_s,
        mem0_bytes=memory.mem0_bytes if memory else None,
        mem_per_sample_bytes=memory.mem_per_sample_bytes if memory else None,
        device_memory_bytes=memory.device_memory_bytes if memory else None,
        smallest_oom_micro_batch=memory.smallest_oom_micro_batch if memory else None,
        seq_len=ref_len, phi_attn_flops_per_s=phi_attn, mem_sq_share=memory.mem_sq_share if memory else 0.0,
        smallest_oom_by_seq_len={m.seq_len: m.smallest_oom_micro_batch for m in memory.per_seq_len
                                 if m.smallest_oom_micro_batch is not None} if memory else {},
    )
    names, units = ["t0_s", "phi_train_flops_per_s", "phi_attn_train_flops_per_s"], ["s", "FLOP/s", "FLOP/s"]
    k = 3 if split else 2
    fit = TrainingFit(
        params=flops_note(estimates(names[:k], units[:k], sol, boot, {}), "phi_train_flops_per_s", peaks),
        seq_len=ref_len, n_points=len(obs), rms_rel_residual=rms(sol), points=pts,
        loo_max_abs_error=max(errs) if errs else None, memory=memory, note=note, form=form,
        attention_note=_attention_note(form, seq_lens, len(obs), errors), form_loo_mean_abs_error=errors,
        seq_lens=seq_lens,
    )
    return fit, params


def _attention_note(form: str, seq_lens: list[int], n: int, errors: dict) -> str:
    span = f"sequence lengths {seq_lens[0]} to {seq_lens[-1]}"
    if form == "split":
        return (f"fitted from {span}: the causal attention (S*a/2 FLOPs per token) at its own rate PHI_attn "
                f"(held-out error {_pct(errors['split'])} against {_pct(errors['single'])} with one PHI_train)")
    if "split" in errors:
        return (f"PHI_attn tried on {span} and not kept (held-out error {_pct(errors['split'])} against "
                f"{_pct(errors['single'])}): PHI_train covers the attention FLOPs too")
    fix = "measure with --seq-lens to fit them"
    if len(seq_lens) == 1:
        why = f"one sequence length ({seq_lens[0]} tokens)"
    elif seq_lens[-1] < SPLIT_SEQ_RATIO * seq_lens[0]:
        why = f"{span} (less than {SPLIT_SEQ_RATIO:g}x apart)"
        fix = f"measure with --seq-lens spanning {SPLIT_SEQ_RATIO:g}x or more to fit them"
    else:
        why = f"{n} points, too few for one more parameter ({SPLIT_MIN_POINTS} or more)"
        fix = f"add micro-batches (-b) for {SPLIT_MIN_POINTS} points or more to fit them"
    return f"not identified: {why}; PHI_train stands in for the attention FLOPs ({fix})"


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def fit_memory(profile: Profile, seq_len: Optional[int] = None) -> Optional[MemoryFit]:
    """M(b) = M0 + b*m by ordinary least squares, and the largest micro-batch under device memory
    (capped below the smallest recorded OOM), beside what the sweep observed. Points at several
    sequence lengths: M0 + b*m(S) (:func:`fit_memory_axis`), stated at ``seq_len``."""
    pts = [p for p in profile.training if p.status == "ok" and p.peak_mem_bytes]
    if len({p.seq_len for p in pts}) > 1:
        return fit_memory_axis(profile, seq_len or statistics.median_low(sorted(p.seq_len for p in pts)))
    ooms = sorted(p.micro_batch for p in profile.training if p.status == "oom")
    oks = [p.micro_batch for p in profile.training if p.status == "ok" and (not ooms or p.micro_batch < ooms[0])]
    device = profile.hardware.memory_total_bytes
    if len(pts) < 2 or len({p.micro_batch for p in pts}) < 2:
        return None
    x = np.array([p.micro_batch for p in pts], float)
    y = np.array([p.peak_mem_bytes for p in pts], float)
    r = linregress(x, y)
    m0, m = float(r.intercept), float(r.slope)
    mem0_ci = slope_ci = None
    note = None
    if len(pts) > 2:
        q = float(student_t.ppf(0.5 + CI_LEVEL / 2, len(pts) - 2))
        slope_ci = (m - q * r.stderr, m + q * r.stderr)
        mem0_ci = (m0 - q * r.intercept_stderr, m0 + q * r.intercept_stderr)
    smallest_oom = ooms[0] if ooms else None
    max_b = rf.max_micro_batch(m0, m, float(device) if device else None, smallest_oom)
    if m <= 0:
        note = "peak memory does not grow with the micro-batch here: no memory limit can be derived"
    elif max_b is not None and smallest_oom is not None and max_b == smallest_oom - 1 \
            and rf.max_micro_batch(m0, m, float(device)) >= smallest_oom:
        note = f"an OOM was recorded at micro-batch {smallest_oom}, below the line's limit: capped there"
    return MemoryFit(mem0_bytes=m0, mem_per_sample_bytes=m, mem0_ci=mem0_ci, mem_per_sample_ci=slope_ci,
                     device_memory_bytes=float(device) if device else None, max_micro_batch=max_b,
                     smallest_oom_micro_batch=smallest_oom, largest_ok_micro_batch=max(oks) if oks else None,
                     note=note)


def _ols(x: np.ndarray, y: np.ndarray):
    """Least-squares coefficients on relative residuals (rows over y, as every fit here) and their
    covariance (None without spare points)."""
    xw, yw = x / y[:, None], np.ones_like(y)
    coef, *_ = np.linalg.lstsq(xw, yw, rcond=None)
    dof = len(y) - x.shape[1]
    if dof <= 0:
        return coef, None
    s2 = float(np.sum((yw - xw @ coef) ** 2)) / dof
    return coef, s2 * np.linalg.pinv(xw.T @ xw)


def fit_memory_axis(profile: Profile, seq_len: int) -> Optional[MemoryFit]:
    """M(b, S) = M0 + b*m(S) over several sequence lengths, m(S) = m1*S ("linear": activations
    linear in S, flash attention) or m1*S + m2*S^2 ("quadratic": attention scores kept), chosen by
    held-out error of peak memory (the quadratic kept only when 10% lower, with m1 >= 0 and m2's
    95% interval above zero);
    every length's own line beside it, and the largest micro-batch at each length."""
    pts = [p for p in profile.training if p.status == "ok" and p.peak_mem_bytes]
    if len(pts) < 3 or len({p.micro_batch for p in pts}) < 2:
        return None
    b = np.array([p.micro_batch for p in pts], float)
    sl = np.array([p.seq_len for p in pts], float)
    y = np.array([p.peak_mem_bytes for p in pts], float)
    # the design columns are 1, b*m1-per-token and b*m2-per-token^2, through the roofline's m(S)
    lin = b * rf.activations_at(1.0, sl, seq_len)
    quad = b * rf.activations_at(1.0, sl, seq_len, 1.0)
    designs = {"linear": np.column_stack([np.ones_like(y), lin]),
               "quadratic": np.column_stack([np.ones_like(y), lin, quad])}
    errors, loo = {}, {}
    for name, x in designs.items():
        if len(y) - 1 < x.shape[1] + 1:
            continue
        loo[name] = [float((x[i] @ _ols(np.delete(x, i, 0), np.delete(y, i))[0]) / y[i] - 1) for i in range(len(y))]
        errors[name] = float(np.mean(np.abs(loo[name])))
    form = "linear"
    coef_q, cov_q = _ols(designs["quadratic"], y)
    # the S^2 term must predict better and be there: its 95% interval clear of zero, m1 not negative
    sq_clear = cov_q is not None and coef_q[1] >= 0 and coef_q[2] > float(
        student_t.ppf(0.5 + CI_LEVEL / 2, len(y) - 3)) * float(np.sqrt(max(cov_q[2, 2], 0.0)))
    if "quadratic" in errors and "linear" in errors and errors["quadratic"] < 0.9 * errors["linear"] and sq_clear:
        form = "quadratic"
    coef, cov = _ols(designs[form], y)
    m0 = float(coef[0])
    # at seq_len the columns are b*1 (linear) and b*1 (quadratic): m(S_ref) is their coefficients' sum
    m_ref = float(np.sum(coef[1:]))
    share = float(coef[2] / m_ref) if form == "quadratic" and m_ref > 0 else 0.0
    mem0_ci = slope_ci = None
    if cov is not None:
        q = float(student_t.ppf(0.5 + CI_LEVEL / 2, len(y) - len(coef)))
        g = np.r_[0.0, np.ones(len(coef) - 1)]
        half_m, half_0 = q * float(np.sqrt(max(g @ cov @ g, 0.0))), q * float(np.sqrt(max(cov[0, 0], 0.0)))
        slope_ci, mem0_ci = (m_ref - half_m, m_ref + half_m), (m0 - half_0, m0 + half_0)
    device = float(profile.hardware.memory_total_bytes) if profile.hardware.memory_total_bytes else None
    ooms = [p for p in profile.training if p.status == "oom"]
    per = []
    for s in sorted({p.seq_len for p in pts} | {p.seq_len for p in ooms}):
        at = [p for p in pts if p.seq_len == s]
        oom = min((p.micro_batch for p in ooms if p.seq_len <= s), default=None)  # an OOM holds at longer lengths
        m_s = rf.activations_at(m_ref, s, seq_len, share)
        line = linregress([p.micro_batch for p in at], [p.peak_mem_bytes for p in at]) \
            if len({p.micro_batch for p in at}) >= 2 else None
        oks = [p.micro_batch for p in at if oom is None or p.micro_batch < oom]
        held = [abs(e) for p, e in zip(pts, loo.get(form, [])) if p.seq_len == s]
        per.append(MemoryAtSeqLen(
            seq_len=s, n_points=len(at), line_mem0_bytes=float(line.intercept) if line else None,
            line_mem_per_sample_bytes=float(line.slope) if line else None, mem_per_sample_bytes=m_s,
            max_micro_batch=rf.max_micro_batch(m0, m_s, device, oom), smallest_oom_micro_batch=oom,
            largest_ok_micro_batch=max(oks) if oks else None, loo_max_abs_error=max(held) if held else None))
    ref = next((m for m in per if m.seq_len == seq_len), None)
    smallest_oom = min((p.micro_batch for p in ooms if p.seq_len <= seq_len), default=None)
    note = None
    worst = max((a for a in per if a.loo_max_abs_error is not None), key=lambda a: a.loo_max_abs_error, default=None)
    if m_ref <= 0:
        note = "peak memory does not grow with the micro-batch here: no memory limit can be derived"
    elif worst is not None and worst.loo_max_abs_error > MEMORY_LOO_LOOSE:
        note = (f"peak memory is off M0 + b*m(S) by up to {_pct(worst.loo_max_abs_error)} held out (seq len "
                f"{worst.seq_len}): the per-sequence figures are rough"
                + (" (on a CPU the peak is the process RSS, which memory kept from earlier points blurs)"
                   if profile.hardware.device_type == "cpu" else ""))
    alt = "quadratic" if form == "linear" else "linear"
    tried = (f" ({alt} {_pct(errors[alt])})" if alt in errors else "")
    lens = sorted({p.seq_len for p in pts})
    act = (f"m(S) {form} in S, fitted from sequence lengths {lens[0]} to {lens[-1]}: held-out peak memory error "
           f"{_pct(errors.get(form))}{tried}")
    return MemoryFit(
        mem0_bytes=m0, mem_per_sample_bytes=m_ref, mem0_ci=mem0_ci, mem_per_sample_ci=slope_ci,
        device_memory_bytes=device, max_micro_batch=rf.max_micro_batch(m0, m_ref, device, smallest_oom),
        smallest_oom_micro_batch=smallest_oom, largest_ok_micro_batch=ref.largest_ok_micro_batch if ref else None,
        note=note, activation_form=form, seq_len=seq_len, mem_per_token_bytes=float(coef[1]) / seq_len,
        mem_per_token_sq_bytes=float(coef[2]) / seq_len ** 2 if form == "quadratic" else 0.0, mem_sq_share=share,
        form_loo_mean_abs_error=errors, activation_note=act, per_seq_len=per)
