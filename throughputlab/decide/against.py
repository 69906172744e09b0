"""The model against a real RL run: per phase, the logged time beside the model's prediction for
the run's batch, response lengths and devices (``decide --against LOG``), and per-phase
efficiencies fitted from a log that the decision then uses (``decide --calibrate-from LOG``).

The prediction is the decision's own: :func:`decide_from_spec` at the log's batch, with a hook
that keeps the step model and the step time it computed (no cost is computed here). The model's
phases map onto the log's as follows: ``gen`` the rollout, ``logprob`` and ``ref`` one forward
pass each (the model's log-prob time holds both), ``values`` the critic's forward pass and
``update_critic`` the rest of the critic's time, ``update_actor`` the policy update, ``sync`` the
weight sync, ``step`` the whole step. A calibration factor is the median over steps of logged /
predicted; it multiplies that phase's whole predicted time at every batch size, so the model
still says how a phase scales with the batch and the factor only sets its level.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from throughputlab.decide.calculator import DecideSpec, LRSpec, SamplesSpec, decide_from_spec
from throughputlab.decide.cluster import idle_shares
from throughputlab.decide.curves import read_curves_csv
from throughputlab.decide.lengths import CAPPED_SIGMA, sigma_for_longest
from throughputlab.decide.logcheck import Calibration, LogCheck, PhaseCheck, check_text
from throughputlab.decide.steptime import ResponseSpec, StepModel, StepTime
from throughputlab.errors import UserError
from throughputlab.imports.runlog import RunLog, load_run_log, spread
from throughputlab.roofline import rl as rf_rl

MODEL_PHASES = ("gen", "logprob", "ref", "values", "update_critic", "update_actor", "sync")
ROWS = (*MODEL_PHASES, "other", "step")
LOG_FLAGS = ("against", "calibrate_from", "log_format", "log_columns", "log_prompts", "against_prompts")


# ---------------------------------------------------------------- reading the log


def read_log(path: str, option: str, fmt: Optional[str], columns: tuple[str, ...]) -> RunLog:
    """The run log behind ``option``; its errors name the option (and --log-format/--log-column)."""
    renames = {}
    for item in columns or ():
        name, sep, key = item.partition("=")
        if not sep:
            raise UserError(f"--log-column expects NAME=KEY (gen=my_gen_time), got {item!r}")
        renames[name.strip()] = key.strip()
    try:
        return load_run_log(path, fmt, renames)
    except UserError as e:
        msg = str(e).replace("--column", "--log-column").replace("--format", "--log-format")
        raise UserError(msg if msg.startswith("--") else f"{option} {msg}") from None


def lengths_from_log(rl: RunLog, responses: int) -> tuple[str, str]:
    """A lognormal response-length form from the log's per-step mean and max (and clip ratio):
    mean = the median per-step mean; cut = the longest logged response; sigma such that the
    share of responses cut equals the logged clip ratio, or, without clipping, such that the
    median per-step max is the batch's expected longest (the 1 - 1/(n+1) quantile)."""
    mean = rl.response_length_summary()
    if mean is None:
        raise UserError(f"{rl.path}: no response lengths logged (response_length/mean, completions/mean_length "
                        "or a response_length column): give --response-dist or --response-lengths")
    extra = rl.extra_summary()
    m, top, clip = mean.median, extra.get("response_length_max"), extra.get("clip_ratio")
    seen = f"per-step mean {m:.4g} tokens"
    if top is not None and top.max - m < 1:  # the typical step's mean is its longest: (nearly) every response at it
        n = max(int(round(top.max)), 1)
        at_cut = f", {clip.median:.0%} at the cut" if clip is not None and clip.median > 0 else ""
        return f"fixed:len={n}", f"run log {rl.path}: per-step mean {m:.4g} tokens = the longest, {n}{at_cut}"
    if top is None or top.max <= m:
        return (f"lognormal:mean={m:.6g},sigma={CAPPED_SIGMA:g}",
                f"run log {rl.path}: {seen}, no max logged (sigma {CAPPED_SIGMA:g})")
    cut = int(round(top.max))
    if clip is not None and clip.median > 0:  # the logged mean is after the cut: the share at the cut as logged
        if clip.median * cut + (1 - clip.median) < m < cut:
            return (f"capped:mean={m:.6g},clip={clip.median:.4g},max={cut}",
                    f"run log {rl.path}: {seen}, max {cut}, {clip.median:.1%} at the cut (the mean after it)")
        tail, longest = min(clip.median, 0.5), float(cut)
        seen += f", max {cut}, {clip.median:.1%} cut"
    else:
        tail, longest = 1 / (responses + 1), top.median
        seen += f", max {top.median:.4g}"
    return (f"lognormal:mean={m:.6g},sigma={sigma_for_longest(m, longest, tail):.4g},max={cut}",
            f"run log {rl.path}: {seen}")


def log_batch(spec: DecideSpec, log_prompts: Optional[int], option: str, path: str) -> tuple[int, str]:
    if log_prompts is not None:
        if log_prompts < 1:
            raise UserError(f"--log-prompts must be a positive integer, got {log_prompts}")
        return log_prompts, "--log-prompts"
    if len(spec.prompts) == 1:
        return spec.prompts[0], "--prompts"
    if not spec.prompts:
        raise UserError(f"{option} {path}: the log does not record its batch: give its prompts per step with "
                        "--prompts N (or --log-prompts N beside the candidates) and --group")
    raise UserError(f"{option} {path}: --prompts has {len(spec.prompts)} values and the log does not record which "
                    "batch it ran: give its prompts per step with --log-prompts N")


# ---------------------------------------------------------------- the model at the log's batch


def predicted_phases(steps: StepModel, st: StepTime) -> dict[str, float]:
    """The model's time of each phase the log can hold, for one step time."""
    tr = steps.shape.train
    passes = int(tr.old_logprob) + int(tr.ref_logprob)
    out = {"gen": st.gen_s}
    if tr.old_logprob:
        out["logprob"] = st.logprob_s / passes
    if tr.ref_logprob:
        out["ref"] = st.logprob_s / passes
    if steps.critic_model is not None:
        values = _critic_forward_s(steps, st)
        out["values"], out["update_critic"] = values, st.critic_s - values
    out.update(update_actor=st.train_s, sync=st.sync_s, step=st.step_s)
    return out


def _critic_forward_s(steps: StepModel, st: StepTime) -> float:
    """The value forward pass inside the step's critic time (as StepModel.step sums it)."""
    return steps.critic_forward_s(-(-st.responses // steps.data_parallel(st.train_devices)),
                                  st.critic_seq_len_mean or st.seq_len_mean, st.real_len_mean)


def _missing_reason(phase: str) -> str:
    if phase in ("values", "update_critic"):
        return "not in the model: GRPO has no critic (--algo ppo models one)"
    if phase == "logprob":
        return "not in the model: train.old_logprob is off in the RL shape"
    if phase == "ref":
        return "not in the model: train.ref_logprob is off in the RL shape"
    return "not in the model"


def calibrated_step(steps: StepModel, st: StepTime, cal: Calibration) -> StepTime:
    """The step time with each phase multiplied by its factor, put together as StepModel.step
    does (roofline.rl.rl_step_s): in sequence, or the slowest stage plus the sync when generation overlaps
    training. The logged phases hold the host offload (veRL times its reloads inside update_actor and the
    log-prob passes), so it is not added again; an overlapped step's scoring stays as modelled."""
    f = cal.factor
    tr = steps.shape.train
    passes = int(tr.old_logprob) + int(tr.ref_logprob)
    per_pass = st.logprob_s / passes if passes else 0.0
    gen = st.gen_s * f("gen")
    logprob = per_pass * (f("logprob") * tr.old_logprob + f("ref") * tr.ref_logprob)
    critic = 0.0
    if steps.critic_model is not None:
        values = _critic_forward_s(steps, st)
        critic = values * f("values") + (st.critic_s - values) * f("update_critic")
    if cal.sync_in_gen:  # the logged generation held the sync: its factor covers both, counted once
        gen, sync = (st.gen_s + st.sync_s) * f("gen"), 0.0
    train, sync = st.train_s * f("update_actor"), (0.0 if cal.sync_in_gen else st.sync_s * f("sync"))
    learn = logprob + train + critic  # the host offload is inside the logged phases (veRL's update_actor holds it)
    overlapped = st.overlap == "off-policy"  # on-policy, gen holds the scoring (and its factor with it)
    total = rf_rl.rl_step_s(gen, st.reward_s if overlapped else 0.0, learn, sync, overlapped)
    gen_mean = (st.gen_engine_mean_s if st.gen_engine_mean_s is not None else st.gen_s) * f("gen")
    idle = idle_shares(steps.placement, gen, gen_mean, learn, total) if steps.placement is not None else {}
    return st.model_copy(update={"gen_s": gen, "logprob_s": logprob, "train_s": train, "critic_s": critic,
                                 "sync_s": sync, "step_s": total, "gen_engine_mean_s": gen_mean, "idle_share": idle})


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b is not None and b > 0 else None


def check_log(spec: DecideSpec, path: str, option: str, fmt: Optional[str] = None, columns: tuple[str, ...] = (),
              log_prompts: Optional[int] = None, user_lengths: bool = False):
    """Compare one run log with the model at its batch; returns (LogCheck, the DecideSpec used for
    the log, the StepModel and StepTime of the prediction)."""
    if spec.cluster is not None and spec.cluster.placement == "search":
        raise UserError(f"{option} compares one placement: give the logged run's with --placement colocated or "
                        "split (and --gen-gpus, --engine-tp), not search")
    rl = read_log(path, option, fmt, columns)
    prompts, batch_from = log_batch(spec, log_prompts, option, path)
    responses = prompts * spec.group
    shape = spec.shape
    source = "--response-dist/--response-lengths or the spec file"
    if not user_lengths:
        dist, source = lengths_from_log(rl, responses)
        shape = shape.model_copy(update={"response": ResponseSpec(dist=dist)})
    log_spec = spec.model_copy(update={"prompts": [prompts], "baseline": None, "shape": shape,
                                       "samples": SamplesSpec(nstar="flat"), "lr": LRSpec()})
    seen: list[tuple[StepModel, StepTime]] = []

    def keep(steps: StepModel, st: StepTime) -> StepTime:
        seen.append((steps, st))
        return st

    decision = decide_from_spec(log_spec, adjust_step=keep)[0]
    steps, st = seen[0]
    predicted = predicted_phases(steps, st)
    logged = rl.phase_summary()
    # veRL's colocated timing_s/gen runs inside the rollout's sharding manager: the weights' resharding into
    # the engines and their wake-up and sleep are in it, and no sync timer is logged
    sync_in_gen = rl.format == "verl" and "sync" not in logged and st.overlap != "off-policy" and "gen" in logged
    if sync_in_gen:
        predicted["gen"] = st.gen_s + st.sync_s
        predicted.pop("sync", None)
    rows = []
    for phase in ROWS:
        if phase == "other":
            row = _other_row(rl, st)
            if row is not None:
                rows.append(row)
            continue
        got, pred = logged.get(phase), predicted.get(phase)
        if phase == "sync" and sync_in_gen:
            rows.append(PhaseCheck(phase="sync", status=f"in gen: veRL's timing_s/gen holds it ({st.sync_s:.3g} s "
                                                        "modelled)"))
            continue
        if got is None and pred is None:
            continue
        status = "compared" if got is not None and pred is not None else (
            "not logged" if got is None else _missing_reason(phase))
        rows.append(PhaseCheck(phase=phase, log_key=rl.keys.get(phase), logged=got, predicted_s=pred,
                               ratio=_ratio(got.median if got else None, pred), status=status))
    notes = [f"predicted at the same batch, response lengths and devices; ratio = logged median / predicted "
             f"(the median over the {len(rl.steps)} step(s) of logged / predicted)"]
    if sync_in_gen:
        notes.append("veRL's timing_s/gen holds the weight sync and the engines' wake-up and sleep (colocated, no "
                     "sync timer logged): gen is compared with the model's generation + sync")
    notes.extend(_batch_note(rl, spec, st, batch_from))
    if rl.skipped:
        notes.append(f"{rl.skipped} record(s) without phase times skipped")
    check = LogCheck(log=str(path), format=rl.format, steps=len(rl.steps), prompts=prompts, group=spec.group,
                     responses=responses, batch_from=batch_from, response_lengths=steps.dist.describe(),
                     response_lengths_from=source, placement=decision.placement, overlap=st.overlap,
                     phases=rows, notes=notes, sync_in_gen=sync_in_gen)
    return check, log_spec, steps, st


def _other_row(rl: RunLog, st: StepTime) -> Optional[PhaseCheck]:
    """The logged step's time outside the logged phases (reward, advantages, checkpoints...)."""
    if st.overlap == "off-policy":
        return None  # overlapped phases do not add up to the step
    rest = [s.phases_s["step"] - sum(v for k, v in s.phases_s.items() if k != "step")
            for s in rl.steps if "step" in s.phases_s and len(s.phases_s) > 1]
    if not rest:
        return None
    return PhaseCheck(phase="other", log_key="step - logged phases", logged=spread(rest),
                      status="not in the model: reward, advantages, checkpoints and what else the step holds")


def _batch_note(rl: RunLog, spec: DecideSpec, st: StepTime, batch_from: str) -> list[str]:
    tokens = rl.extra_summary().get("tokens")
    if tokens is None or tokens.median <= 0:
        return []
    implied = tokens.median / st.seq_len_mean
    if abs(implied / st.responses - 1) <= 0.25:
        return []
    return [f"the log's tokens per step ({tokens.median:.4g}) make about {implied:.0f} responses of "
            f"{st.seq_len_mean:.0f} tokens, against the {st.responses} given ({batch_from} x --group): "
            "check the batch and --prompt-len"]


def fit_calibration(check: LogCheck) -> Calibration:
    """Per-phase factors from a comparison: logged median / predicted for each phase both have."""
    by = {p.phase: p for p in check.phases}
    factors, uncalibrated = {}, {}
    for phase in MODEL_PHASES:
        row = by.get(phase)
        if row is None or row.predicted_s is None:
            continue
        if row.logged is None:
            uncalibrated[phase] = "not logged"
        elif row.ratio is None:
            uncalibrated[phase] = "predicted 0 s"
        else:
            factors[phase] = row.ratio
    step = by.get("step")
    if not factors and step is not None and step.ratio is not None:
        return Calibration(log=check.log, factors={"step": step.ratio}, uncalibrated={}, step_only=True)
    if check.sync_in_gen:  # the sync is inside the gen factor
        uncalibrated.pop("sync", None)
    if not factors:
        raise UserError(f"--calibrate-from {check.log}: no phase both logged and modelled to fit a factor from "
                        "(--log-column PHASE=KEY names the log's keys)")
    return Calibration(log=check.log, factors=factors, uncalibrated=uncalibrated, sync_in_gen=check.sync_in_gen)


def fill_calibrated(check: LogCheck, steps: StepModel, st: StepTime, cal: Calibration) -> None:
    """The calibrated prediction beside each phase of ``check``."""
    check.calibrated_from = cal.log
    total = calibrated_step(steps, st, cal).step_s
    for row in check.phases:
        if row.predicted_s is None:
            continue
        row.calibrated_s = total if row.phase == "step" else row.predicted_s * cal.factor(row.phase)
        if row.phase == "gen" and cal.sync_in_gen and not check.sync_in_gen:
            row.calibrated_s = (st.gen_s + st.sync_s) * cal.factor("gen")
        row.calibrated_ratio = _ratio(row.logged.median if row.logged else None, row.calibrated_s)


# ---------------------------------------------------------------- the command's part


class LogChecks:
    """What ``decide --against/--calibrate-from`` adds: the comparisons, the calibration, the
    decision's spec (response lengths from the log when the user gave none) and its step hook."""

    def __init__(self, spec: DecideSpec, against: Optional[str] = None, calibrate_from: Optional[str] = None,
                 log_format: Optional[str] = None, log_columns: tuple[str, ...] = (),
                 log_prompts: Optional[int] = None, against_prompts: Optional[int] = None):
        if not (against or calibrate_from):
            used = [f"--{n}" for n, v in (("log-format", log_format), ("log-column", log_columns),
                                          ("log-prompts", log_prompts), ("against-prompts", against_prompts))
                    if v]
            raise UserError(f"{', '.join(used)}: only with a run log; give --against LOG or --calibrate-from LOG")
        user_lengths = "response" in spec.shape.model_fields_set
        kw = dict(fmt=log_format, columns=log_columns, log_prompts=log_prompts, user_lengths=user_lengths)
        read_curves_csv(spec.samples.curves)  # the curves file's errors before the log's table: validation first
        self.spec = spec
        self.checks: list[LogCheck] = []
        self.calibration: Optional[Calibration] = None
        if calibrate_from:
            check, log_spec, steps, st = check_log(spec, calibrate_from, "--calibrate-from", **kw)
            self.calibration = fit_calibration(check)
            fill_calibrated(check, steps, st, self.calibration)
            self.checks.append(check)
            self.spec = spec.model_copy(update={"shape": log_spec.shape})
        if against_prompts is not None and not (against and calibrate_from):
            raise UserError("--against-prompts goes with --calibrate-from LOG and --against LOG: the batch of the run "
                            "the calibration is checked on")
        if against and (not calibrate_from or Path(against).resolve() != Path(calibrate_from).resolve()):
            if against_prompts is not None:
                kw = {**kw, "log_prompts": against_prompts}
            check, log_spec, steps, st = check_log(spec, against, "--against", **kw)
            if self.calibration is not None:
                fill_calibrated(check, steps, st, self.calibration)
            else:
                self.spec = spec.model_copy(update={"shape": log_spec.shape})
            self.checks.append(check)
        self.lengths_note = None if user_lengths else \
            f"response lengths for the decision from {self.checks[0].response_lengths_from}"

    def adjust(self, steps: StepModel, st: StepTime) -> StepTime:
        return calibrated_step(steps, st, self.calibration) if self.calibration is not None else st

    @property
    def hook(self):
        return self.adjust if self.calibration is not None else None

    def notes(self) -> list[str]:
        out = [self.calibration.describe() + " (the table's step times are the calibrated ones)"] \
            if self.calibration is not None else []
        return out + ([self.lengths_note] if self.lengths_note else [])

    def json(self) -> dict:
        data: dict = {"run_logs": [c.model_dump(mode="json") for c in self.checks]}
        if self.calibration is not None:
            data["calibration"] = self.calibration.model_dump(mode="json")
        return data

    def text(self) -> str:
        return "\n\n".join([*(check_text(c) for c in self.checks),
                            *([self.calibration.describe()] if self.calibration is not None else [])])
