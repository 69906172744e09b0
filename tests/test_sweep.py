"""Sweep logic: what is measured next, OOM handling, resume, noisy re-measurement, interruption.

A scripted backend drives the runner here (this tests the sweep's decisions, not an engine);
the real torch backends are exercised in test_backends_torch.py and test_cli_bench.py.
"""

import pytest

from throughputlab.models import resolve_model
from throughputlab.records.machine import Environment, Hardware
from throughputlab.records.profile import GenSample, Profile, TrainSample
from throughputlab.records.settings import Measurement, SweepSettings
from throughputlab.sweep import Extras, largest_fitting, run_generation, run_training


class ScriptedOOM(RuntimeError):
    pass


class ScriptedBackend:
    """Throughput follows a given function of x; x above ``oom_above`` raises an OOM."""

    name = "scripted"

    def __init__(self, tps, oom_above=None, interrupt_at=None, noisy=None):
        self.tps, self.oom_above, self.interrupt_at = tps, oom_above, interrupt_at
        self.noisy = noisy or {}
        self.calls = []
        self.released = 0

    def _check(self, x):
        self.calls.append(x)
        if self.interrupt_at == x:
            raise KeyboardInterrupt
        if self.oom_above is not None and x > self.oom_above:
            raise ScriptedOOM("CUDA out of memory")

    def run(self, c, prompt_len, output_len):  # generation
        self._check(c)
        jitter = self.noisy.get(c, [1.0]).pop(0) if self.noisy.get(c) else 1.0
        total = c * output_len / self.tps(c) * jitter
        return GenSample(total_s=total, output_tokens=c * output_len)

    def reset_peak_memory(self):
        pass

    def peak_memory_bytes(self):
        return None

    def is_oom(self, exc):
        return isinstance(exc, ScriptedOOM)

    def release(self):
        self.released += 1

    def pids(self):
        return []


class ScriptedTrain(ScriptedBackend):
    def run(self, b, seq_len):
        self._check(b)
        return TrainSample(step_s=b * seq_len / self.tps(b))


def new_profile():
    return Profile(model=resolve_model("tiny").spec, hardware=Hardware(device_type="cpu", device_name="cpu"),
                   environment=Environment(python="3", platform="x", hostname="h"),
                   settings=SweepSettings(dtype="float32", device="cpu"))


H = Measurement(warmup=1, repeats=2, max_cv=0.1, max_remeasure=2, rounds=1)


def test_auto_stops_when_throughput_saturates(tmp_path):
    # grows linearly to 8, then flat: auto measures 1,2,4,8,16 and stops (16 gains < 5%)
    backend = ScriptedTrain(lambda b: 100.0 * min(b, 8))
    prof = new_profile()
    run_training(prof, tmp_path / "p.json", backend, None, seq_len=10, hygiene=H)
    assert [p.micro_batch for p in prof.training] == [1, 2, 4, 8, 16]
    assert all(p.status == "ok" for p in prof.training)


def test_auto_says_when_it_stops_at_the_cap_not_at_saturation(tmp_path, caplog):
    prof = new_profile()
    with caplog.at_level("WARNING"):
        run_training(prof, tmp_path / "p.json", ScriptedTrain(lambda b: 100.0 * b), None, seq_len=10,
                     hygiene=H.model_copy(update={"auto_cap": 8}))
    assert [p.micro_batch for p in prof.training] == [1, 2, 4, 8]
    assert "stopped at 8, the cap (--auto-cap 8), with tokens/s still growing" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        run_training(new_profile(), tmp_path / "q.json", ScriptedTrain(lambda b: 100.0 * min(b, 8)), None,
                     seq_len=10, hygiene=H)
    assert "auto-cap" not in caplog.text


def test_oom_is_recorded_and_bisected_to_largest_fit(tmp_path):
    backend = ScriptedTrain(lambda b: 100.0 * b, oom_above=5)
    prof = new_profile()
    run_training(prof, tmp_path / "p.json", backend, [1, 2, 4, 8, 16, 32], seq_len=10, hygiene=H)
    by = {p.micro_batch: p.status for p in prof.training}
    assert by[8] == "oom" and by[4] == "ok"
    assert by[6] == "oom" and by[5] == "ok"  # bisection between 4 and 8
    assert by[16] == by[32] == "skipped"  # never run after the OOM
    assert 16 not in backend.calls and 32 not in backend.calls
    assert largest_fitting(prof.training) == 5
    assert backend.released >= 2
    saved = Profile.load(tmp_path / "p.json")
    assert {p.micro_batch: p.status for p in saved.training} == by


def test_noisy_point_is_remeasured_and_all_samples_kept(tmp_path):
    # warm-up takes the first factor, then samples 1.0, 2.0 (cv high) -> re-measured with 1.0, 1.0
    backend = ScriptedBackend(lambda c: 100.0, noisy={2: [1.0, 1.0, 2.0, 1.0, 1.0, 1.0, 1.0]})
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", backend, [1, 2], prompt_len=4, output_len=4, hygiene=H)
    p2 = prof.generation[1]
    assert p2.remeasured >= 1
    assert len(p2.samples) == 2 * (1 + p2.remeasured)
    assert len(prof.generation[0].samples) == 2 and prof.generation[0].remeasured == 0


def test_interrupt_keeps_finished_points_and_resume_skips_them(tmp_path):
    path = tmp_path / "p.json"
    prof = new_profile()
    backend = ScriptedBackend(lambda c: 10.0 * c, interrupt_at=8)
    with pytest.raises(KeyboardInterrupt):
        run_generation(prof, path, backend, [1, 2, 4, 8, 16], prompt_len=4, output_len=4, hygiene=H)
    saved = Profile.load(path)
    assert [p.concurrency for p in saved.generation] == [1, 2, 4]
    stamps = {p.concurrency: p.measured_at for p in saved.generation}

    again = ScriptedBackend(lambda c: 10.0 * c)
    run_generation(saved, path, again, [1, 2, 4, 8, 16], prompt_len=4, output_len=4, hygiene=H)
    assert set(again.calls) == {8, 16}  # nothing finished before is measured again
    final = Profile.load(path)
    assert [p.concurrency for p in final.generation] == [1, 2, 4, 8, 16]
    assert all(final.find(("generation", "scripted", c, 4, 4)).measured_at == s for c, s in stamps.items())


class InterruptedSampler:
    """Ctrl-C arrives while the telemetry sampler is starting (inside psutil, in a real run)."""

    stopped = 0

    def __init__(self, pids):
        pass

    def start(self):
        raise KeyboardInterrupt

    def stop(self):
        InterruptedSampler.stopped += 1
        raise RuntimeError("stop() before start()")


class FailingRecorder:
    def start(self, label, pids):
        pass

    def stop(self):
        raise OSError("py-spy vanished")


def test_ctrl_c_while_an_instrument_starts_is_still_an_interrupt(tmp_path):
    path = tmp_path / "p.json"
    prof = new_profile()
    extras = Extras(telemetry=InterruptedSampler)
    with pytest.raises(KeyboardInterrupt):
        run_generation(prof, path, ScriptedBackend(lambda c: 10.0), [1, 2], prompt_len=4, output_len=4, hygiene=H,
                       extras=extras)
    assert InterruptedSampler.stopped == 0  # never started, so never stopped


def test_an_instrument_that_fails_to_stop_does_not_lose_the_point(tmp_path):
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", ScriptedBackend(lambda c: 10.0), [1], prompt_len=4, output_len=4,
                   hygiene=H, extras=Extras(pyspy=FailingRecorder()))
    assert prof.generation[0].status == "ok" and prof.generation[0].host_profile is None


def test_error_points_are_recorded_and_sweep_goes_on(tmp_path):
    class Flaky(ScriptedBackend):
        def run(self, c, p, o):
            if c == 2:
                raise ValueError("kernel exploded")
            return super().run(c, p, o)

    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", Flaky(lambda c: 10.0), [1, 2, 4], prompt_len=4, output_len=4, hygiene=H)
    assert [(p.concurrency, p.status) for p in prof.generation] == [(1, "ok"), (2, "error"), (4, "ok")]
    assert "kernel exploded" in prof.generation[1].error


def test_an_engine_error_after_ctrl_c_is_the_interrupt_not_an_error_point(tmp_path, monkeypatch):
    # Ctrl-C stops the engine's own processes too; its client may report that as an error of its own
    import throughputlab.errors as errors

    monkeypatch.setattr(errors, "_stop_requested", False)

    class StoppedEngine(ScriptedBackend):
        def run(self, c, p, o):
            if c == 2:
                errors.request_stop()  # what the CLI's SIGINT handler does
                raise RuntimeError("cancelled")
            return super().run(c, p, o)

    prof = new_profile()
    with pytest.raises(KeyboardInterrupt):
        run_generation(prof, tmp_path / "p.json", StoppedEngine(lambda c: 10.0), [1, 2, 4], prompt_len=4, output_len=4,
                       hygiene=H)
    assert [(p.concurrency, p.status) for p in prof.generation] == [(1, "ok")]  # no error point, nothing after
    assert [(p.concurrency, p.status) for p in Profile.load(tmp_path / "p.json").generation] == [(1, "ok")]


def test_the_cli_notes_ctrl_c_before_raising_it(monkeypatch):
    import signal

    import throughputlab.cli as cli
    import throughputlab.errors as errors

    monkeypatch.setattr(errors, "_stop_requested", False)
    with pytest.raises(KeyboardInterrupt):
        cli._interrupt(signal.SIGINT, None)
    assert errors.stop_requested()


R3 = Measurement(warmup=1, repeats=1, max_cv=0.5, max_remeasure=2, rounds=3)


class Timeline(ScriptedBackend):
    """The machine's speed changes over time: call number -> slowdown factor; optional Ctrl-C
    or failure at a given call number (counting warm-ups)."""

    def __init__(self, tps, slow=None, interrupt_call=None, fail_call=None):
        super().__init__(tps)
        self.slow, self.interrupt_call, self.fail_call = slow or {}, interrupt_call, fail_call

    def run(self, c, prompt_len, output_len):
        n = len(self.calls)
        if n == self.interrupt_call:
            self.calls.append(c)
            raise KeyboardInterrupt
        if n == self.fail_call:
            self.calls.append(c)
            raise RuntimeError("engine hiccup")
        sample = super().run(c, prompt_len, output_len)
        sample.total_s *= self.slow.get(n, 1.0)
        return sample


def test_rounds_interleave_points_and_keep_every_sample(tmp_path):
    backend = Timeline(lambda c: 10.0 * c)
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", backend, [1, 2, 4], prompt_len=4, output_len=4, hygiene=R3)
    # round 1: warm-up + one run per point; rounds 2 and 3: one run per point, no warm-up
    assert backend.calls == [1, 1, 2, 2, 4, 4, 1, 2, 4, 1, 2, 4]
    saved = Profile.load(tmp_path / "p.json")
    assert [(p.concurrency, len(p.samples), p.rounds, p.remeasured) for p in saved.generation] == \
        [(1, 3, 3, 0), (2, 3, 3, 0), (4, 3, 3, 0)]


def test_a_slow_spell_moves_one_sample_per_point_not_a_whole_point(tmp_path):
    # the machine is 30% slower for three consecutive timed runs (calls 6, 7, 8)
    slow = {6: 1.3, 7: 1.3, 8: 1.3}
    one_go = Timeline(lambda c: 10.0 * c, slow=slow)
    prof = new_profile()
    run_generation(prof, tmp_path / "a.json", one_go, [1, 2, 4], prompt_len=4, output_len=4,
                   hygiene=Measurement(warmup=1, repeats=3, max_cv=0.5, rounds=1))
    off = [p.tokens_per_s / (10.0 * p.concurrency) - 1 for p in prof.generation]
    assert min(off) < -0.2  # one point took the whole spell: its median is 23% low

    rounds = Timeline(lambda c: 10.0 * c, slow=slow)
    prof = new_profile()
    run_generation(prof, tmp_path / "b.json", rounds, [1, 2, 4], prompt_len=4, output_len=4,
                   hygiene=Measurement(warmup=1, repeats=1, max_cv=0.5, rounds=3))
    assert all(p.tokens_per_s == pytest.approx(10.0 * p.concurrency) for p in prof.generation)


def test_interrupt_in_a_later_round_keeps_samples_and_resume_adds_only_missing_rounds(tmp_path):
    path = tmp_path / "p.json"
    prof = new_profile()
    backend = Timeline(lambda c: 10.0 * c, interrupt_call=7)  # round 2, at concurrency 2
    with pytest.raises(KeyboardInterrupt):
        run_generation(prof, path, backend, [1, 2, 4], prompt_len=4, output_len=4, hygiene=R3)
    saved = Profile.load(path)
    assert [(p.concurrency, len(p.samples), p.rounds) for p in saved.generation] == [(1, 2, 2), (2, 1, 1), (4, 1, 1)]
    first = {p.concurrency: p.samples[0].total_s for p in saved.generation}

    again = Timeline(lambda c: 10.0 * c)
    run_generation(saved, path, again, [1, 2, 4], prompt_len=4, output_len=4, hygiene=R3)
    # rounds 2 (what was missing) and 3, no first round; the new backend has run nothing yet, so
    # its first visit starts with the warm-up a first measurement has (R3: one run)
    assert again.calls == [2, 2, 4, 1, 2, 4]
    final = Profile.load(path)
    assert [(p.concurrency, len(p.samples), p.rounds) for p in final.generation] == [(1, 3, 3), (2, 3, 3), (4, 3, 3)]
    assert all(p.samples[0].total_s == first[p.concurrency] for p in final.generation)


def test_a_failed_later_visit_keeps_the_point_and_its_samples(tmp_path):
    backend = Timeline(lambda c: 10.0 * c, fail_call=7)  # round 2, concurrency 2
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", backend, [1, 2, 4], prompt_len=4, output_len=4, hygiene=R3)
    p2 = prof.generation[1]
    assert p2.status == "ok" and len(p2.samples) == 2 and p2.rounds == 2  # rounds 1 and 3
    assert "visit 2 failed" in p2.error and "engine hiccup" in p2.error
    assert backend.released == 1
    assert [len(p.samples) for p in prof.generation] == [3, 2, 3]


def test_a_point_still_noisy_after_the_last_round_adds_whole_rounds(tmp_path):
    # concurrency 2 is 3x slow in round 2 (call 7): spread far above max_cv after three rounds
    backend = Timeline(lambda c: 10.0 * c, slow={7: 3.0})
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", backend, [1, 2, 4], prompt_len=4, output_len=4,
                   hygiene=Measurement(warmup=1, repeats=1, max_cv=0.1, max_remeasure=2, rounds=3))
    # every point gets the extra rounds, so a slow spell cannot land on the noisy point alone;
    # at most max_remeasure of them (the slow sample keeps the spread above 10%)
    assert backend.calls[12:] == [1, 2, 4, 1, 2, 4]
    assert [(p.remeasured, len(p.samples), p.rounds) for p in prof.generation] == [(2, 5, 3)] * 3
    assert prof.generation[1].tokens_per_s == pytest.approx(20.0)  # the median of five ignores the slow one


def test_extra_rounds_stop_once_no_point_is_noisy(tmp_path):
    backend = Timeline(lambda c: 10.0 * c, slow={7: 1.5})  # 50% slow once: spread 24% after 3 samples
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", backend, [1, 2], prompt_len=4, output_len=4,
                   hygiene=Measurement(warmup=1, repeats=1, max_cv=0.2, max_remeasure=5, rounds=3))
    # calls: 0-3 round 1, 4-5 round 2, 6-7 round 3 (7 slow), then one extra round brings the spread under 20%
    assert backend.calls[8:] == [1, 2]
    assert all(p.remeasured == 1 and len(p.samples) == 4 for p in prof.generation)


class CountingSampler:
    def __init__(self, pids):
        pass

    def start(self):
        pass

    def stop(self):
        from throughputlab.records.profile import TelemetrySummary

        return TelemetrySummary(source="host", hz=20.0, n_samples=10, mean={"host_cpu_pct": 50.0},
                                max={"host_cpu_pct": 60.0})


def test_telemetry_of_every_visit_is_merged(tmp_path):
    prof = new_profile()
    run_generation(prof, tmp_path / "p.json", Timeline(lambda c: 10.0), [1, 2], prompt_len=4, output_len=4,
                   hygiene=R3, extras=Extras(telemetry=CountingSampler))
    assert all(p.telemetry.n_samples == 30 for p in prof.generation)


def test_telemetry_summaries_combine_by_sample_count():
    from throughputlab.records.profile import TelemetrySummary

    a = TelemetrySummary(source="host", hz=20.0, n_samples=10, mean={"cpu": 50.0, "rss": 1.0}, max={"cpu": 60.0},
                         throttled=False)
    b = TelemetrySummary(source="host", hz=10.0, n_samples=30, mean={"cpu": 90.0}, max={"cpu": 95.0, "rss": 2.0},
                         throttled=True, throttle_reasons=["thermal"])
    c = a.combined(b)
    assert c.n_samples == 40 and c.mean["cpu"] == pytest.approx(80.0) and c.mean["rss"] == 1.0
    assert c.max == {"cpu": 95.0, "rss": 2.0} and c.hz == pytest.approx(12.5)
    assert c.throttled and c.throttle_reasons == ["thermal"]


class GrowingPeakTrain(ScriptedTrain):
    """Peak memory reads as the largest micro-batch run so far: what RSS does on CPU when the
    allocator keeps memory that larger points left behind."""

    def __init__(self, tps):
        super().__init__(tps)
        self.largest = 0

    def run(self, b, seq_len):
        self.largest = max(self.largest, b)
        return super().run(b, seq_len)

    def peak_memory_bytes(self):
        return 1000 * self.largest


def test_training_rounds_warm_up_each_visit_and_keep_the_first_visits_peak(tmp_path):
    backend = GrowingPeakTrain(lambda b: 100.0)
    prof = new_profile()
    run_training(prof, tmp_path / "p.json", backend, [1, 2, 4], seq_len=10, hygiene=R3)
    # every visit runs one untimed step at its own size before the timed one
    assert backend.calls == [1, 1, 2, 2, 4, 4] * 3
    assert [(p.micro_batch, len(p.samples), p.warmup_runs, p.rounds) for p in prof.training] == \
        [(1, 3, 3, 3), (2, 3, 3, 3), (4, 3, 3, 3)]
    # later visits would read the larger points' memory; the peaks stay the first round's
    assert [p.peak_mem_bytes for p in prof.training] == [1000, 2000, 4000]


def test_training_visits_after_the_first_skip_the_warm_up_under_a_caching_allocator(tmp_path):
    backend = GrowingPeakTrain(lambda b: 100.0)
    prof = new_profile()
    run_training(prof, tmp_path / "p.json", backend, [1, 2, 4], seq_len=10, hygiene=R3, warm_each_visit=False)
    assert backend.calls == [1, 1, 2, 2, 4, 4] + [1, 2, 4] * 2  # the first visit's warm-up only
    assert [(p.micro_batch, len(p.samples), p.warmup_runs, p.rounds) for p in prof.training] == \
        [(1, 3, 1, 3), (2, 3, 1, 3), (4, 3, 1, 3)]
