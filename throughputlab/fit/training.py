"""The training fits: the micro-step line ``t0 + 3*b*S*(F + S*a/2)/PHI_train`` (plus the
sweep's median optimizer step) and the memory line ``M0 + b*m`` with the largest micro-batch
that fits (docs/model.md)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
from scipy.stats import linregress
from scipy.stats import t as student_t

from throughputlab import roofline as rf
from throughputlab.fit.schema import CI_LEVEL, MemoryFit, Peaks, PointError, TrainingFit
from throughputlab.fit.identify import flops_note
from throughputlab.fit.solver import LSQ, bootstrap, estimates, leave_one_out, rms, solve
from throughputlab.profile import Profile, TrainPoint
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
                    extra_start=None) -> LSQ:
    b = np.array([o.b for o in obs], float)
    seq = np.array([o.seq_len for o in obs], float)
    y = np.array([o.step_s for o in obs], float)

    def f(x: np.ndarray) -> np.ndarray:
        t0, phi = np.exp(x)
        return np.log((rf.train_step_s(b, seq, costs, t0, phi) + opt_s) / y)

    big = max(obs, key=lambda o: o.b * o.seq_len)
    small = min(obs, key=lambda o: o.b * o.seq_len)
    # two-point line through the smallest and largest micro-batch gives the natural start
    fl_big, fl_small = rf.train_flops(costs, big.b, big.seq_len), rf.train_flops(costs, small.b, small.seq_len)
    if big.step_s > small.step_s and fl_big > fl_small:
        phi0 = (fl_big - fl_small) / (big.step_s - small.step_s)
    else:
        phi0 = fl_big / big.step_s
    t00 = max(small.step_s - opt_s - fl_small / phi0, 0.01 * small.step_s)
    lo = np.log([1e-9, 1e6])
    hi = np.log([max(o.step_s for o in obs) * 10, phi_hi or 1e18])
    s = starts or [np.log([t00, phi0]), np.log([0.1 * small.step_s, fl_big / big.step_s]),
                   np.log([0.5 * small.step_s, 2 * phi0])]
    if extra_start is not None:
        s = [extra_start, *s]
    return solve(f, s, lo, hi)


def fit_training(profile: Profile, points: list[TrainPoint], costs: Costs, peaks: Peaks, warnings: list[str],
                 bootstrap_n: int, rng: np.random.Generator, phi_hi: Optional[float]):
    """(TrainingFit, TrainParams) of the profile's ok training points."""
    opt = [s.optimizer_s for p in points for s in p.samples if s.optimizer_s is not None]
    opt_s = statistics.median(opt) if opt else 0.0
    obs = [_train_obs(p, p.samples, opt_s) for p in points]
    note = None if opt else "no separate optimizer timing: the fixed cost t0 includes the optimizer step"
    sol = _fit_train_line(costs, obs, opt_s, phi_hi)
    t0, phi = sol.values()

    boot = None
    if bootstrap_n > 0:
        def draw() -> list[TrainObs]:
            out = []
            for o in obs:
                idx = rng.integers(0, len(o.point.samples), len(o.point.samples))
                out.append(_train_obs(o.point, [o.point.samples[i] for i in idx], opt_s))
            return out

        draws = bootstrap(bootstrap_n, draw, lambda bobs: np.exp(_fit_train_line(costs, bobs, opt_s, phi_hi,
                                                                                  starts=[sol.x]).x))
        boot = np.array(draws) if draws else None

    def held_out(rest: list[TrainObs], o: TrainObs) -> float:
        lt0, lphi = _fit_train_line(costs, rest, opt_s, phi_hi, extra_start=sol.x).values()
        pred = rf.train_step_s(o.b, o.seq_len, costs, lt0, lphi) + opt_s
        return o.measured_step_s / pred - 1  # relative error of tokens/s = step_meas/step_pred - 1

    loo = leave_one_out(obs, 2, held_out)
    if len(obs) < 3:
        warnings.append(f"only {len(obs)} training point(s): no leave-one-out error (measure at least 3 micro-batches)")

    pts = []
    for o, e in zip(obs, loo):
        fit_t = rf.train_step_s(o.b, o.seq_len, costs, t0, phi) + opt_s
        meas_tps = o.point.tokens_per_s
        pts.append(PointError(
            x=o.b, context_len=o.seq_len, measured_tokens_per_s=meas_tps, fitted_tokens_per_s=o.b * o.seq_len / fit_t,
            loo_tokens_per_s=None if e is None else meas_tps * (1 + e), loo_rel_error=e, measured_s=o.measured_step_s,
            fitted_s=fit_t, loo_s=None if e is None else o.measured_step_s / (1 + e)))
    errs = [abs(e) for e in loo if e is not None]
    seq_lens = {o.seq_len for o in obs}
    if len(seq_lens) > 1:
        warnings.append(f"training points at several sequence lengths {sorted(seq_lens)}: fitted together")

    memory = fit_memory(profile)
    params = TrainParams(
        t0_s=t0, phi_flops_per_s=phi, optimizer_step_s=opt_s,
        mem0_bytes=memory.mem0_bytes if memory else None,
        mem_per_sample_bytes=memory.mem_per_sample_bytes if memory else None,
        device_memory_bytes=memory.device_memory_bytes if memory else None,
        smallest_oom_micro_batch=memory.smallest_oom_micro_batch if memory else None,
        seq_len=statistics.median_low(sorted(o.seq_len for o in obs)),
    )
    fit = TrainingFit(
        params=flops_note(estimates(["t0_s", "phi_train_flops_per_s"], ["s", "FLOP/s"], sol, boot, {}),
                          "phi_train_flops_per_s", peaks),
        seq_len=statistics.median_low(sorted(o.seq_len for o in obs)), n_points=len(obs),
        rms_rel_residual=rms(sol), points=pts, loo_max_abs_error=max(errs) if errs else None, memory=memory, note=note,
    )
    return fit, params


def fit_memory(profile: Profile) -> Optional[MemoryFit]:
    """M(b) = M0 + b*m by ordinary least squares, and the largest micro-batch under device memory
    (capped below the smallest recorded OOM), beside what the sweep observed."""
    pts = [p for p in profile.training if p.status == "ok" and p.peak_mem_bytes]
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
