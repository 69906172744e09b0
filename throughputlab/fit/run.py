"""``fit_profile``: every part a measured profile has, fitted, with knees and utilisation."""

from __future__ import annotations

import math
import statistics
from typing import Optional

import numpy as np

from throughputlab import roofline as rf
from throughputlab.errors import UserError
from throughputlab.fit.admission import admission_of
from throughputlab.fit.generation import ceilings, fit_generation
from throughputlab.fit.identify import bw_range
from throughputlab.fit.knees import (
    generation_knee_range_statement,
    generation_knee_statement,
    knee_range_statement,
    knee_statement,
)
from throughputlab.fit.mbu import utilisation
from throughputlab.fit.schema import (
    DEFAULT_SEED,
    FitResult,
    costs_of,
    engine_devices,
    peaks_of,
    phi_is_a_floor,
    probe_costs_of,
)
from throughputlab.fit.training import fit_training
from throughputlab.records.base import now_iso
from throughputlab.records.profile import Profile
from throughputlab.spread import fitted_spread
from throughputlab.throughput import CommParams, ThroughputModel


def fit_profile(profile: Profile, *, bootstrap: int = 0, seed: int = DEFAULT_SEED) -> FitResult:
    """Fit every part the profile has measured. ``bootstrap`` > 0 adds percentile intervals
    from refits on raw samples resampled within each point (Jacobian intervals otherwise);
    ``throughputlab fit`` uses ``DEFAULT_BOOTSTRAP``."""
    if profile.kind == "predicted":
        raise UserError("this profile is a prediction, not a measurement: there is nothing to fit "
                        "(pass a profile written by `throughputlab bench`)")
    costs = costs_of(profile)
    peaks = peaks_of(profile)
    warnings: list[str] = []
    gen_pts = [p for p in profile.generation if p.status == "ok" and p.samples]
    train_pts = [p for p in profile.training if p.status == "ok" and p.samples]
    if not gen_pts and not train_pts:
        raise UserError("the profile has no successful points to fit: re-run `throughputlab bench` "
                        "(points with status oom/error/skipped are not fitted)")
    skipped = len(profile.generation) + len(profile.training) - len(gen_pts) - len(train_pts)
    if skipped:
        warnings.append(f"{skipped} point(s) without status ok were left out of the fit")

    rng = np.random.default_rng(seed)
    gen = pre = dec_params = pre_params = None
    overhead = 0.0
    adm = admission_of(profile, gen_pts) if gen_pts else None
    if gen_pts:
        gen, dec_params, pre, pre_params, overhead = fit_generation(gen_pts, costs, peaks, warnings, bootstrap, rng,
                                                                    probe_costs_of(profile), engine_devices(profile),
                                                                    adm.admitted if adm else None)
    tr = tr_params = None
    if train_pts:
        tr, tr_params = fit_training(profile, train_pts, costs, peaks, warnings, bootstrap, rng, ceilings(peaks)[1])

    engine = profile.engine
    model = ThroughputModel(
        source="fit", costs=costs, decode=dec_params, prefill=pre_params, train=tr_params,
        kv_cache_tokens=engine.kv_cache_tokens if engine else None,
        max_num_seqs=engine.max_num_seqs if engine else None, gen_overhead_s=overhead,
        comm=_comm(profile, warnings),
    )
    if gen is not None:
        model.gen_spread = _spread(gen.points, gen_pts, "generation")
        if adm is not None and adm.from_curve:  # the cap the curve shows stands for the engine's
            model.max_num_seqs = adm.limit
        gen.ceiling, gen.admission_limit, gen.admission_note = _ceiling(model, gen_pts, adm)
    if tr is not None:
        model.train_spread = _spread(tr.points, train_pts, "training")
    if gen is not None:
        c_top = max(p.concurrency for p in gen_pts)
        gen.knee_concurrency, gen.knee_note = knee_statement(model, gen.context_len, c_top,
                                                             phi_floor=phi_is_a_floor(gen))
        ref = max(gen_pts, key=lambda p: p.concurrency)
        gen.generation_knee_concurrency, gen.generation_knee_note = generation_knee_statement(
            model, ref.prompt_len, ref.output_len, c_top)
        bws = bw_range(gen.params, gen.combinations, costs.weight_bytes, peaks, engine_devices(profile))
        if bws is not None:  # the knee moves with BW along what the data leave open
            gen.knee_range, gen.knee_note = knee_range_statement(model, gen.context_len, *bws)
            gen.generation_knee_note = generation_knee_range_statement(model, ref.prompt_len, ref.output_len, *bws)
    return FitResult(
        method="fit", created_at=now_iso(), model=model, peaks=peaks, generation=gen, prefill=pre, training=tr,
        utilisation=utilisation(profile, costs, peaks), warnings=warnings, bootstrap_samples=bootstrap,
    )


def _ceiling(model: ThroughputModel, points, adm) -> tuple[str, Optional[int], Optional[str]]:
    """What bounds the sweep's widest point: the admission limit, else the roofline term that dominates."""
    top = max(points, key=lambda p: p.concurrency)
    if adm is not None:
        return f"admission: {adm.bound}", adm.limit, adm.note
    mem, comp = model.decode_terms_s(top.concurrency, rf.mean_context(top.prompt_len, top.output_len))
    return ("memory bandwidth" if mem >= comp else "compute"), None, None


def _spread(errors, points, what: str):
    """The fitted model's interval: its leave-one-out errors and its points' run-to-run spread."""
    loo = [math.log1p(e.loo_rel_error) for e in errors if e.loo_rel_error is not None and e.loo_rel_error > -1]
    cvs = [p.cv for p in points if p.cv is not None]
    return fitted_spread(loo, statistics.median(cvs) if cvs else None, what)


def _comm(profile: Profile, warnings: list[str]):
    """Collective rates measured on the profile's machine (``throughputlab hardware --collectives``)."""
    bench = profile.hardware.collectives
    if bench is None:
        return None
    try:
        return CommParams.from_collectives(bench)
    except ValueError as e:
        warnings.append(f"the collective benchmark has no usable fit ({e}): communication not modelled")
        return None
