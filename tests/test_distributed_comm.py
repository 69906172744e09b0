"""Exposed communication time: interval arithmetic and trace reading, on hand-made numbers."""

import pytest

from throughputlab.distributed import comm


def test_merge_and_length():
    assert comm.merge([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert comm.length([(0, 1), (0.5, 2), (3, 4)]) == pytest.approx(3.0)


def test_uncovered_is_the_part_no_cover_overlaps():
    # comm 0-10 and 20-30; compute 2-4, 8-22, 25-26 -> uncovered 0-2, 4-8, 22-25, 26-30 = 2+4+3+4
    assert comm.uncovered([(0, 10), (20, 30)], [(2, 4), (8, 22), (25, 26)]) == pytest.approx(13.0)
    assert comm.uncovered([(0, 1)], []) == pytest.approx(1.0)
    assert comm.uncovered([(0, 1)], [(-1, 2)]) == pytest.approx(0.0)
    assert comm.uncovered([], [(0, 1)]) == 0.0


def test_clip_keeps_what_lies_inside_the_windows():
    assert comm.clip([(0, 10)], [(2, 3), (5, 6)]) == [(2, 3), (5, 6)]
    assert comm.clip([(0, 1)], [(2, 3)]) == []


def test_innermost_events_of_a_thread():
    evs = [{"name": "outer", "ts": 0, "dur": 10}, {"name": "a", "ts": 1, "dur": 2}, {"name": "b", "ts": 4, "dur": 5},
           {"name": "b1", "ts": 5, "dur": 1}, {"name": "after", "ts": 12, "dur": 1}]
    assert [e["name"] for e in comm.innermost(evs)] == ["a", "b1", "after"]


def _x(name, ts, dur, tid, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "tid": tid, "pid": 1, "cat": cat}


def test_cpu_trace_counts_gloo_spans_inside_the_phases_against_main_thread_ops():
    trace = {"traceEvents": [
        _x("throughputlab::forward", 0, 100, 1, "user_annotation"),
        _x("aten::mm", 0, 40, 1),
        _x("FSDP::pre_forward", 40, 30, 1, "user_annotation"),  # waits for the all-gather: not compute
        _x("c10d::_allgather_base_", 40, 1, 1),  # the collective call itself: not compute
        _x("aten::mm", 70, 30, 1),
        _x("gloo:all_gather", 30, 40, 7, "user_annotation"),  # 30-70: 10 us under the first mm
        _x("gloo:all_reduce", 150, 20, 7, "user_annotation"),  # between phases: the ranks' agreement
        _x("throughputlab::backward", 200, 100, 1, "user_annotation"),
        _x("aten::mm", 200, 100, 1),
        _x("gloo:all_reduce", 250, 10, 8, "user_annotation"),  # fully hidden under compute
    ]}
    spans, compute = comm.split_trace(trace, cuda=False)
    assert comm.length(spans) == pytest.approx(50e-6)
    assert comm.uncovered(spans, compute) == pytest.approx(30e-6)


def test_cuda_trace_counts_nccl_kernels_against_other_kernels():
    trace = {"traceEvents": [
        _x("throughputlab::forward", 0, 100, 1, "user_annotation"),
        _x("ncclDevKernel_AllGather_RING_LL", 10, 30, 20, "kernel"),
        _x("ampere_sgemm_128x64", 0, 20, 21, "kernel"),
        _x("Memcpy DtoD", 50, 10, 21, "gpu_memcpy"),
    ]}
    spans, compute = comm.split_trace(trace, cuda=True)
    assert comm.length(spans) == pytest.approx(30e-6)
    assert comm.uncovered(spans, compute) == pytest.approx(20e-6)
