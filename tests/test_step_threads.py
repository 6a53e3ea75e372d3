"""A step NVTX range collects the launches of every thread of its process, not only its own.

PyTorch's autograd engine launches the backward pass from its own thread, inference engines
launch from worker threads; the step range sits on the main thread. A hand-made trace with two
launching threads, then the real data-parallel training trace in ../shared (HTA's NCCL-parser
test data), whose step counts are computed here from the JSON with the standard library.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import click
import polars as pl
import pytest

from nsys_ledger.api import check
from nsys_ledger.attribution.steps import find_steps, launches_per_thread
from nsys_ledger.ledger.model import StepRule
from nsys_ledger.report.json_report import result_document
from nsys_ledger.report import terminal
from nsys_ledger.report.terminal import render

KINETO = Path(__file__).resolve().parents[1].parent / "shared" / "real_traces" / "kineto"
NCCL = KINETO / "HTA__nccl_parser_config__nccl_data.json.gz"
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")

MAIN, WORKER, OTHER_PROCESS = (7 << 24) + 1, (7 << 24) + 2, (8 << 24) + 3
STEP_RULE = StepRule(method="nvtx", nvtx_regex=r"^step$", marker_regex=None, exclude_nvtx_regex=None, exclude_ops=())


def _kernel(row: int, pid: int, tid: int, call_start: int) -> dict:
    return {"row": row, "activity": "kernel", "name": f"k{row}", "pid": pid, "api_tid": tid,
            "api_start": call_start, "start": call_start + 5, "end": call_start + 6}


def _two_thread_frames() -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Two steps on the main thread of process 7 (100-200, 300-400): the main thread launches
    one kernel in each, a worker thread two in the first and three in the second, one after
    both steps; process 8's thread launches inside the first step's time and is not its."""
    launches = [(MAIN, 110), (WORKER, 120), (WORKER, 190), (MAIN, 310), (WORKER, 320), (WORKER, 330),
                (WORKER, 399), (WORKER, 450), (OTHER_PROCESS, 150)]
    activities = pl.DataFrame(
        [_kernel(i, tid >> 24, tid, t) for i, (tid, t) in enumerate(launches)],
        schema={"row": pl.Int64, "activity": pl.Utf8, "name": pl.Utf8, "pid": pl.Int64, "api_tid": pl.Int64,
                "api_start": pl.Int64, "start": pl.Int64, "end": pl.Int64},
    )
    api_calls = pl.DataFrame(
        {"pid": [tid >> 24 for tid, _ in launches], "global_tid": [tid for tid, _ in launches],
         "start": [t for _, t in launches], "kind": ["kernel_launch"] * len(launches)},
        schema={"pid": pl.Int64, "global_tid": pl.Int64, "start": pl.Int64, "kind": pl.Utf8},
    )
    nvtx = pl.DataFrame(
        {"name": ["step", "step"], "pid": [7, 7], "global_tid": [MAIN, MAIN], "end_global_tid": [None, None],
         "start": [100, 300], "end": [200, 400]},
        schema={"name": pl.Utf8, "pid": pl.Int64, "global_tid": pl.Int64, "end_global_tid": pl.Int64,
                "start": pl.Int64, "end": pl.Int64},
    )
    return activities, api_calls, nvtx


def test_a_step_range_collects_the_launches_of_another_thread():
    steps = find_steps(*_two_thread_frames(), STEP_RULE)
    placed = steps.activities.sort("row")
    assert placed["step"].to_list() == [0, 0, 0, 1, 1, 1, 1, None, None]
    assert steps.api_calls.sort("start")["step"].drop_nulls().len() == 7
    per_step = steps.launch_threads.select("step", "tid", "launches").rows()
    assert per_step == [(0, 1, 1), (0, 2, 2), (1, 1, 1), (1, 2, 3)]
    summary = launches_per_thread(steps.launch_threads).select("tid", "steps", "min", "max", "total").rows()
    assert summary == [(2, 2, 2, 3, 5), (1, 2, 1, 1, 2)]


def test_a_step_range_timed_on_the_gpu_collects_nothing():
    """A profiler's GPU-side copy of a step annotation (GPU times, on a stream's pseudo thread)
    is no window: the worker's launch at 450, inside its GPU time, stays outside every step."""
    activities, api_calls, nvtx = _two_thread_frames()
    nvtx = nvtx.with_columns(pl.lit(None, pl.Utf8).alias("domain"))
    gpu_copy = pl.DataFrame(
        {"name": ["step"], "pid": [7], "global_tid": [(7 << 24) + 99], "end_global_tid": [None], "start": [420],
         "end": [480], "domain": ["gpu_user_annotation"]},
        schema=nvtx.schema,
    )
    steps = find_steps(activities, api_calls, pl.concat([nvtx, gpu_copy]), STEP_RULE)
    assert steps.activities.sort("row")["step"].to_list() == [0, 0, 0, 1, 1, 1, 1, None, None]
    assert steps.windows.height == 2


def test_a_launch_on_the_ranges_own_thread_stays_with_its_range():
    """Two threads with overlapping step ranges: each keeps its own launches (projection rule);
    a third thread's launch inside both goes to the range that started last."""
    activities, api_calls, nvtx = _two_thread_frames()
    worker_range = pl.DataFrame(
        {"name": ["step"], "pid": [7], "global_tid": [WORKER], "end_global_tid": [None], "start": [115], "end": [195]},
        schema=nvtx.schema,
    )
    third = (7 << 24) + 9
    extra = pl.DataFrame([_kernel(9, 7, third, 150)], schema=activities.schema)
    steps = find_steps(pl.concat([activities, extra]), api_calls, pl.concat([nvtx, worker_range]), STEP_RULE)
    placed = steps.activities.sort("row").select("row", "key", "window").rows()
    assert placed[:3] == [(0, MAIN, 0), (1, WORKER, 0), (2, WORKER, 0)]
    assert placed[9] == (9, WORKER, 0)


def _json_counts() -> dict[str, Counter]:
    """Per ProfilerStep range: GPU activities and kernels by the thread of their launching call."""
    events = json.loads(gzip.decompress(NCCL.read_bytes()))["traceEvents"]
    calls = {e["args"]["correlation"]: e for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    counts: dict[str, Counter] = {}
    for step in (e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")):
        activities, kernels = Counter(), Counter()
        for e in events:
            call = calls.get(e.get("args", {}).get("correlation")) if e.get("cat") in GPU_CATEGORIES else None
            if call and call["pid"] == step["pid"] and step["ts"] <= call["ts"] <= step["ts"] + step["dur"]:
                activities[call["tid"]] += 1
                kernels[call["tid"]] += e["cat"] == "kernel"
        counts[step["name"]] = (activities, kernels)
    return counts


@pytest.mark.skipif(not NCCL.is_file(), reason="shared real traces not present")
def test_profiler_steps_of_a_real_training_trace_count_the_autograd_threads_kernels():
    counts = _json_counts()
    assert sorted(counts) == ["ProfilerStep#4", "ProfilerStep#5", "ProfilerStep#6"]
    for activities, kernels in counts.values():
        assert dict(activities) == {2910249: 467, 2919752: 791}  # main thread, autograd thread
        assert dict(kernels) == {2910249: 308, 2919752: 592}

    result = check(NCCL)
    assert result.steps.method == "nvtx"
    assert result.step_table["kernels"].to_list() == [900, 900, 900]
    assert result.steps.launch_threads.select("step", "tid", "launches").rows() == [
        (0, 2910249, 467), (0, 2919752, 791), (1, 2910249, 467), (1, 2919752, 791),
        (2, 2910249, 467), (2, 2919752, 791)]

    document = result_document(result)
    assert document["step_detection"]["launch_threads"] == [
        {"rank": 0, "tid": 2919752, "steps": 3, "min": 791, "max": 791, "total": 2373},
        {"rank": 0, "tid": 2910249, "steps": 3, "min": 467, "max": 467, "total": 1401},
    ]
    terminal = click.unstyle(render(result))
    assert "threads   launches per step by thread: tid 2919752: 791, tid 2910249: 467" in terminal


def test_the_threads_line_fits_80_columns():
    """Nine launching threads: as many as fit in 80 columns, then how many more."""
    launch_threads = pl.DataFrame(
        {"rank": [0] * 9, "step": [0] * 9, "tid": list(range(1000001, 1000010)), "launches": list(range(100, 109))})
    result = SimpleNamespace(steps=SimpleNamespace(launch_threads=launch_threads))
    [line] = terminal._thread_lines(result)
    assert line == "threads   launches per step by thread: tid 1000009: 108, +8 more"
    two = SimpleNamespace(steps=SimpleNamespace(launch_threads=launch_threads.head(2)))
    assert terminal._thread_lines(two) == [
        "threads   launches per step by thread: tid 1000002: 101, tid 1000001: 100"]
