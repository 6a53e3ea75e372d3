"""Who was late, on every real export in ../shared/real_traces (read-only).

For each gap the tool finds (`--step-method capture`: the whole capture of each process is one
step), plain SQL written here finds the GPU activity that ended it (the process's activity on
that device starting at the gap's end) and, by correlation id, when its launching call began
and returned. The rule the docs state must then hold by time:

* the call began after half the gap had passed -> the cause is host side (the host was late);
* the call had returned before the GPU went idle -> the cause is not host side (nor launch).

At least 99% of the gap time of each kind agrees in every file (by construction it is all of
it). The PyTorch-profiler exports in kineto/ are judged the same way from their JSON. The
examples of issue 17 (item 1) are asserted with their literal figures.
"""

from __future__ import annotations

import gzip
import json
import os
import sqlite3
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.checks.gaps import DEVICE_CAUSES, LAUNCH_CAUSES, SPLIT_FIELDS
from nsys_ledger.checks.host_time import HOST_PARTS

REPO = Path(__file__).resolve().parents[1]
TRACES_DIR = Path(os.environ.get("NSYS_LEDGER_REAL_TRACES", REPO.parent / "shared" / "real_traces"))
FILES = sorted(TRACES_DIR.glob("*.sqlite")) if TRACES_DIR.is_dir() else []
KINETO_DIR = TRACES_DIR / "kineto"

# GPU activity tables and the launching-call table of an nsys export
# (GRAPH_TRACE: a graph replay traced at graph level is one activity)
ACTIVITY_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                   "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
# The CUDA call (event class 0 runtime, 1 driver) that launched each activity starting at a
# given time of a process and device: its start and return (min/max over the activities
# starting together) and how many distinct calls they have: none (the copy's call is not in the
# capture), one, or more (the "ending call" is ambiguous, and such gaps are not judged).
ENDING_CALLS = """
WITH acts AS ({union})
SELECT (a.globalPid >> 24) & 16777215 AS pid, a.deviceId AS device, a.start AS gap_end,
       min(r.start) AS call_start, max(r.end) AS call_end, count(DISTINCT r.correlationId) AS calls
FROM acts a
LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
  ON r.correlationId = a.correlationId AND (r.globalTid & -16777216) = a.globalPid AND r.eventClass IN (0, 1)
GROUP BY a.globalPid, a.deviceId, a.start
"""


def _connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)


def _sql(path: Path, query: str, params: tuple = ()) -> list[tuple]:
    conn = _connect(path)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def _ending_calls(path: Path) -> pl.DataFrame:
    tables = {name for (name,) in _sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    union = " UNION ALL ".join(
        f"SELECT start, globalPid, deviceId, correlationId FROM {table}" for table in ACTIVITY_TABLES if table in tables
    )
    rows = _sql(path, ENDING_CALLS.format(union=union))
    return pl.DataFrame(rows, orient="row", schema={"pid": pl.Int64, "device": pl.Int64, "gap_end": pl.Int64,
                                                    "sql_call_start": pl.Int64, "sql_call_end": pl.Int64,
                                                    "calls": pl.Int64})


def _file(prefix: str) -> Path:
    matches = [p for p in FILES if p.name.startswith(prefix)]
    if not matches:
        pytest.skip(f"{prefix} export not found in {TRACES_DIR} (set NSYS_LEDGER_REAL_TRACES)")
    return matches[0]


_CHECKED: dict[Path, nsys_ledger.Result] = {}


def _checked(path: Path) -> nsys_ledger.Result:
    if path not in _CHECKED:
        _CHECKED[path] = nsys_ledger.check(path, step_method="capture")
    return _CHECKED[path]


def _files():
    return [pytest.param(p, id=p.name.split("__")[1]) for p in FILES] or [
        pytest.param(None, id="no-real-traces")]


@pytest.mark.parametrize("path", _files())
def test_the_cause_is_host_side_exactly_when_the_host_began_the_ending_call_late(path):
    if path is None:
        pytest.skip(f"no real exports in {TRACES_DIR} (set NSYS_LEDGER_REAL_TRACES)")
    gaps = _checked(path).gaps
    truth = _ending_calls(path)
    joined = gaps.join(truth, left_on=["pid", "device", "end"], right_on=["pid", "device", "gap_end"], how="left")
    # every gap's ending activity was found by SQL, with its launching call (one per gap)
    assert joined["calls"].null_count() == 0, joined.filter(pl.col("calls").is_null())
    # an activity whose call is not in the capture: the tool knows no call either, device side
    uncalled = joined.filter(pl.col("calls") == 0)
    assert uncalled["call_start"].null_count() == uncalled.height and set(uncalled["side"]) <= {"device"}
    single = joined.filter(pl.col("calls") == 1)
    assert single.height >= (joined.height - uncalled.height) * 0.99
    host_side = pl.col("cause").is_in(list(HOST_PARTS))
    began_late = single.filter(pl.col("sql_call_start") > pl.col("start") + pl.col("duration") / 2)
    returned_before = single.filter(pl.col("sql_call_end") < pl.col("start"))
    for subset, agrees in ((began_late, host_side), (returned_before, ~host_side & ~pl.col("side").eq("launch"))):
        if subset.height == 0:
            continue
        agreeing = subset.filter(agrees)["duration"].sum()
        assert agreeing >= 0.99 * subset["duration"].sum(), subset.filter(~agrees)
    # the tool's own call times are those of SQL, and its time split adds up to the gap
    assert (single["call_start"] == single["sql_call_start"]).all()
    assert (single["call_end"] == single["sql_call_end"]).all()
    assert (gaps.select(pl.sum_horizontal(*SPLIT_FIELDS)).to_series() == gaps["duration"]).all()


def test_the_exports_have_gaps_of_both_kinds_to_judge():
    """The test above is not vacuous: per file, how many gaps each rule judges (SQL truth)."""
    if not FILES:
        pytest.skip(f"no real exports in {TRACES_DIR} (set NSYS_LEDGER_REAL_TRACES)")
    counts = {}
    for path in FILES:
        joined = _checked(path).gaps.join(
            _ending_calls(path), left_on=["pid", "device", "end"], right_on=["pid", "device", "gap_end"]
        ).filter(pl.col("calls") == 1)
        late = joined.filter(pl.col("sql_call_start") > pl.col("start") + pl.col("duration") / 2).height
        early = joined.filter(pl.col("sql_call_end") < pl.col("start")).height
        counts[path.name.split("__")[1]] = (joined.height, late, early)
    # (gaps with one ending call, of them begun after half the gap, returned before it began)
    assert counts == {
        "nsys-ai": (597, 14, 583),
        "memfusion_artifact": (0, 0, 0),  # no gap above 2 us in its capture
        "llama3-inference": (2046, 1348, 0),
        "pipit": (19, 4, 0),
        "flameox": (5, 1, 0),
    }


# ---------------------------------------------------------------------------------------------
# The same rule on the PyTorch-profiler (Kineto) exports, from their JSON
# ---------------------------------------------------------------------------------------------
GPU_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}
CALL_CATEGORIES = {"cuda_runtime", "cuda_driver"}


def _ns(value) -> int:
    """A Kineto time (µs with up to three decimals, read as Decimal) in integer ns."""
    return int(Decimal(value) * 1000)


def _kineto_ending_calls(path: Path) -> pl.DataFrame:
    """Per GPU activity start (ns): the launching call's start and end and how many distinct
    calls start activities then (the activity and its call share `args.correlation`)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        events = json.load(f, parse_float=Decimal)["traceEvents"]
    calls, starts = {}, {}
    for event in events:
        category, args = event.get("cat"), event.get("args") or {}
        if event.get("ph") != "X" or "correlation" not in args:
            continue
        if category in CALL_CATEGORIES:
            calls[args["correlation"]] = (_ns(event["ts"]), _ns(event["ts"]) + _ns(event.get("dur", 0)))
        elif category in GPU_CATEGORIES:
            starts.setdefault(_ns(event["ts"]), set()).add(args["correlation"])
    rows = []
    for start, correlations in starts.items():
        found = [calls[c] for c in correlations if c in calls]
        rows.append((start, min((c[0] for c in found), default=None), max((c[1] for c in found), default=None),
                     len(found)))
    return pl.DataFrame(rows, orient="row", schema={"gap_end": pl.Int64, "sql_call_start": pl.Int64,
                                                    "sql_call_end": pl.Int64, "calls": pl.Int64})


def _kineto_files():
    files = sorted(KINETO_DIR.glob("*.json.gz")) if KINETO_DIR.is_dir() else []
    return [pytest.param(p, id=p.name.split("__")[-1][:40]) for p in files] or [
        pytest.param(None, id="no-kineto-traces")]


@pytest.mark.parametrize("path", _kineto_files())
def test_kineto_causes_follow_the_same_rule(path):
    if path is None:
        pytest.skip(f"no Kineto traces in {KINETO_DIR} (set NSYS_LEDGER_REAL_TRACES)")
    gaps = _checked(path).gaps
    joined = gaps.join(_kineto_ending_calls(path), left_on="end", right_on="gap_end", how="left")
    assert joined["calls"].null_count() == 0  # every gap ends where a GPU activity of the JSON starts
    single = joined.filter(pl.col("calls") == 1)
    host_side = pl.col("cause").is_in(list(HOST_PARTS))
    began_late = single.filter(pl.col("sql_call_start") > pl.col("start") + pl.col("duration") / 2)
    returned_before = single.filter(pl.col("sql_call_end") < pl.col("start"))
    for subset, agrees in ((began_late, host_side), (returned_before, ~host_side & ~pl.col("side").eq("launch"))):
        agreeing = subset.filter(agrees)["duration"].sum()
        assert agreeing >= 0.99 * subset["duration"].sum(), subset.filter(~agrees)


# ---------------------------------------------------------------------------------------------
# The examples of issue 17, item 1, literally
# ---------------------------------------------------------------------------------------------
def _longest(gaps: pl.DataFrame) -> dict:
    return gaps.sort("duration", descending=True).row(0, named=True)


def test_saxpy_long_gap_ended_by_a_copy_begun_late_is_the_host_after_mpi_and_three_mallocs():
    path = _file("hpcgroup__pipit")
    gap = _longest(_checked(path).gaps)
    assert (gap["duration"], gap["after"], gap["call_start"] - gap["start"]) == (196_245_801, "memcpy HtoD",
                                                                              196_140_922)
    assert (gap["side"], gap["cause"]) == ("host", "host")
    # the CUDA calls of the launching thread while the GPU was idle, by SQL: three cudaMallocs
    (tid,) = _sql(path, "SELECT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start = ? AND eventClass IN (0, 1)",
                  (gap["call_start"],))[0]
    names = _sql(path, """
        SELECT s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
        WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ? ORDER BY r.start""",
        (tid, gap["start"], gap["call_start"]))
    assert [n for (n,) in names if n.startswith("cudaMalloc_")] == ["cudaMalloc_v3020"] * 3
    assert gap["host_cuda_call_ns"] == sum(
        end - start for start, end in _sql(path, """
            SELECT r.start, r.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r
            WHERE r.globalTid = ? AND r.start >= ? AND r.end <= ? AND r.eventClass IN (0, 1)""",
            (tid, gap["start"], gap["call_start"])))
    # MPI's own NVTX ranges hold part of the rest
    assert gap["host_nvtx_ns"] == 58_202_229 and gap["host_host_ns"] == 136_909_508


def test_saxpy_copies_issued_long_before_the_gap_are_not_the_hosts():
    """Its synchronous cudaMemcpy calls began 17.7 ms before the GPU went idle and returned
    after: the host was not late; the copy call was in flight (its submission)."""
    gaps = _checked(_file("hpcgroup__pipit")).gaps
    issued_early = gaps.filter(pl.col("call_start") < pl.col("start") - 1_000_000)
    assert issued_early.height == 5
    assert set(issued_early["after"]) == {"memcpy DtoH"} and set(issued_early["cause"]) == {"copy_launch"}
    assert set(issued_early["side"]) == {"launch"}


def test_nsys_ai_762us_gap_before_a_copy_called_747us_into_it_is_the_host():
    gap = _longest(_checked(_file("GindaChen__nsys-ai")).gaps)
    assert (gap["duration"], gap["after"], gap["call_start"] - gap["start"]) == (761_862, "memcpy HtoD", 746_733)
    assert gap["side"] == "host" and gap["cause"] == "host"


def test_llama3_gaps_after_a_sync_are_the_hosts_nvtx_ranges_not_the_sync():
    gaps = _checked(_file("Sh1mwww__llama3")).gaps
    after_sync = gaps.filter(pl.col("host_sync_ns") > 0)
    # the 511 gaps the old rules called sync: the sync returned early in the gap, the thread then
    # spent the rest in its own ensure_layer_N_weights ranges
    assert after_sync.height == 511
    assert set(after_sync["cause"]) == {"nvtx"}
    assert set(after_sync["nvtx_range"]) == {f"ensure_layer_{n}_weights" for n in range(8)}
    share = after_sync.select((pl.col("host_sync_ns") / pl.col("duration")).median()).item()
    assert share < 0.01  # the median sync share of such a gap: 0.1 %


def test_kineto_decode_gap_with_the_launch_returned_45us_in_is_the_device_side():
    path = KINETO_DIR / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
    if not path.is_file():
        pytest.skip(f"{path.name} not found in {KINETO_DIR}")
    gap = _longest(_checked(path).gaps)
    assert gap["duration"] == 463_295_405 and gap["call_end"] - gap["start"] == 43_647
    assert (gap["side"], gap["cause"]) == ("device", "unknown")
    assert gap["device_ns"] == 463_295_405 - 43_647


# ---------------------------------------------------------------------------------------------
# Smaller real-data defects of item 5
# ---------------------------------------------------------------------------------------------
def test_no_gap_has_profiler_overhead_inside():
    """nsys's gpu_gaps leaves out a gap with profiler overhead inside; so does the tool, instead
    of splitting the idle period into several gaps (PROFILER_OVERHEAD rows, by SQL)."""
    checked_any = False
    for path in FILES:
        overhead = _sql(path, "SELECT start, end, (globalTid >> 24) & 16777215 FROM PROFILER_OVERHEAD")
        if not overhead:
            continue
        checked_any = True
        frame = pl.DataFrame(overhead, orient="row", schema={"o_start": pl.Int64, "o_end": pl.Int64, "pid": pl.Int64})
        gaps = _checked(path).gaps.select("pid", "start", "end")
        # inside, or touching it: the idle time on either side of a flush is one period with it
        touching = (pl.col("o_start") <= pl.col("end")) & (pl.col("o_end") >= pl.col("start"))
        inside = gaps.join(frame, on="pid").filter(touching)
        assert inside.height == 0, (path.name, inside)
    if not checked_any:
        pytest.skip("no real export with PROFILER_OVERHEAD rows")


def test_graph_level_replays_count_in_the_step_span_and_busy_time():
    path = _file("morluto__flameox")
    result = _checked(path)
    rows = _sql(path, """
        SELECT start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY
        UNION ALL SELECT start, end FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE ORDER BY start""")
    (replays,) = _sql(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")[0]
    assert replays == 2
    span = max(e for _, e in rows) - min(s for s, _ in rows)
    busy, reached = 0, None
    for start, end in rows:  # the union of the intervals
        if reached is None or start > reached:
            busy, reached = busy + end - start, end
        elif end > reached:
            busy, reached = busy + end - reached, end
    step = result.step_table.row(0, named=True)
    assert (step["step_ns"], step["busy_ns"]) == (span, busy) == (186_815, 7_808)
    # the idle time before and between the two replays are gaps like any other
    replay_gaps = result.gaps.filter(pl.col("after") == "graph 1 replay")
    assert replay_gaps.select("cause", "call_kind").rows() == [
        ("cuda_call", "graph_launch"), ("launch", "graph_launch")]


def test_no_decode_step_says_that_capture_would_measure_the_gaps():
    from click.testing import CliRunner

    from nsys_ledger.cli import main

    path = _file("hpcgroup__pipit")
    run = CliRunner().invoke(main, ["check", str(path)])
    assert run.exit_code == 0, run.output
    assert "gaps    none measured: no decode step (gaps are measured inside decode steps)" in run.output
    assert "--step-method capture takes the whole capture of each process as one step" in run.output


def test_cause_sets_are_the_documented_ones():
    assert set(HOST_PARTS) | set(LAUNCH_CAUSES) | set(DEVICE_CAUSES) == {
        "sync", "copy_call", "cuda_call", "nvtx", "host", "launch", "kernel_launch", "copy_launch",
        "collective", "graph_boundary", "event_wait", "copy", "unknown"}


def test_the_kineto_exports_have_gaps_to_judge():
    """Per Kineto export: (gaps, of them with one ending call, begun after half the gap,
    returned before it began), from the JSON: the Kineto rule test is not vacuous."""
    if not KINETO_DIR.is_dir():
        pytest.skip(f"no Kineto traces in {KINETO_DIR} (set NSYS_LEDGER_REAL_TRACES)")
    counts = {}
    for path in sorted(KINETO_DIR.glob("*.json.gz")):
        gaps = _checked(path).gaps
        joined = gaps.join(_kineto_ending_calls(path), left_on="end", right_on="gap_end").filter(pl.col("calls") == 1)
        late = joined.filter(pl.col("sql_call_start") > pl.col("start") + pl.col("duration") / 2).height
        early = joined.filter(pl.col("sql_call_end") < pl.col("start")).height
        counts[path.name.split("__")[-1].removesuffix(".json.gz")] = (gaps.height, joined.height, late, early)
    expected = {
        "b200_eager_trace": (0, 0, 0, 0),
        "1016005": (216, 181, 22, 147),  # h100_Qwen_Qwen1.5-0.5B-Chat__1016005
        "inference_sglang_decode_capture_traces_bs_32_rank0": (0, 0, 0, 0),
        "inference_sglang_decode_sglang_Qwen3-8B_decode": (8, 8, 4, 1),
        "inference_vllm_decode_full_capture_traces_graph_capture_rank_0.1773709742341309550.pt.trace": (8, 8, 6, 1),
        "inference_vllm_decode_full_graph_execution": (3, 3, 0, 3),
        "benchmark_result_2869224_1695835535_trace": (39, 39, 31, 1),
        "nccl_data": (2641, 2641, 2407, 76),
    }
    assert {name: counts.get(name) for name in expected} == expected
