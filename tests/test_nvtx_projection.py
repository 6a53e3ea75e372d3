"""NVTX projection (attribution.nvtx_projection) against SQL written here, on the real exports.

nsys's rule (nvtx_gpu_proj_trace): a GPU operation belongs to every push/pop or start/end
range that ends on its own thread and encloses the launching API call on the same thread
(range.start <= call.start and call.end <= range.end). The SQL below states that rule as a
plain join; the projection must give exactly the same ranges for every launching call, the
innermost first. Then edge cases on hand-made frames, and a randomized comparison with a
brute-force containment test.
"""

from __future__ import annotations

import os
import random
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest

from nsys_ledger.attribution.activities import gpu_activities, with_launch_calls
from nsys_ledger.attribution.nvtx_projection import (
    OPEN_END,
    enclosing_ranges,
    innermost_ranges,
    projectable_ranges,
    range_levels,
)
from nsys_ledger.trace import load_trace

from shared_data import REAL_TRACES, needs_shared, real_params  # noqa: E402

WITH_NVTX = sorted(p for p in REAL_TRACES.glob("*.sqlite") if not p.name.startswith("morluto")) if REAL_TRACES.is_dir() else []
LLAMA3 = REAL_TRACES / "Sh1mwww__llama3-inference__real_inference_simulation.sqlite"

GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def _sql(path: Path, query: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def _gpu_ops_sql(path: Path) -> str:
    tables = {row[0] for row in _sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    return " UNION ".join(f"SELECT correlationId, globalPid FROM {t}" for t in GPU_TABLES if t in tables)


def _enclosing_sql(path: Path) -> str:
    """Every (launching call, enclosing range) pair, with the range's domain-qualified name."""
    return f"""
    WITH ops AS ({_gpu_ops_sql(path)}),
    calls AS (
        SELECT DISTINCT r.correlationId AS corr, (r.globalTid >> 24) & 16777215 AS pid, r.globalTid AS tid,
               r.start AS start, r.end AS end
        FROM ops o JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
          ON r.correlationId = o.correlationId AND o.globalPid = (r.globalTid & -16777216)
         AND r.eventClass IN (0, 1)
    ),
    domains AS (
        SELECT domainId, globalTid & -16777216 AS proc, min(coalesce(s.value, d.text)) AS name
        FROM NVTX_EVENTS d LEFT JOIN StringIds s ON s.id = d.textId
        WHERE d.eventType = 75 GROUP BY 1, 2
    )
    SELECT c.pid AS pid, c.corr AS corr, n.start AS start, coalesce(n.end, {OPEN_END}) AS end,
           CASE WHEN n.domainId IS NULL OR n.domainId = 0 THEN coalesce(s.value, n.text)
                ELSE coalesce(dm.name, 'domain ' || n.domainId) || ':' || coalesce(s.value, n.text, '') END AS name
    FROM calls c
    JOIN NVTX_EVENTS n ON n.globalTid = c.tid AND n.eventType IN (59, 60)
         AND (n.endGlobalTid IS NULL OR n.endGlobalTid = n.globalTid)
         AND n.start <= c.start AND coalesce(n.end, {OPEN_END}) >= c.end
    LEFT JOIN StringIds s ON s.id = n.textId
    LEFT JOIN domains dm ON dm.domainId = n.domainId AND dm.proc = (n.globalTid & -16777216)
    """


def _launch_calls(trace) -> pl.DataFrame:
    activities = with_launch_calls(gpu_activities(trace), trace.api_calls)
    return (
        activities.filter(pl.col("api_start").is_not_null())
        .select("pid", "correlation", "api_tid", "api_start", "api_end")
        .unique()
        .sort("pid", "correlation")
        .with_row_index("call")
    )


def _project(trace) -> tuple[pl.DataFrame, pl.DataFrame]:
    calls = _launch_calls(trace)
    found = enclosing_ranges(calls, projectable_ranges(trace.nvtx), thread_col="api_tid",
                             start_col="api_start", end_col="api_end")
    return calls, found.join(calls.select("call", "pid", "correlation"), on="call")


@pytest.mark.parametrize("path", real_params(WITH_NVTX))
def test_enclosing_ranges_equal_the_sql_join(path):
    trace = load_trace(path)
    _, found = _project(trace)
    ours = sorted(found.select("pid", "correlation", "range_start", "range_end", "qualified_name").iter_rows())
    theirs = sorted(_sql(path, _enclosing_sql(path)))
    assert ours == theirs
    assert len(ours) == {"GindaChen": 4018, "LeiWang1999": 80, "Sh1mwww": 8192, "hpcgroup": 5}[path.name.split("__")[0]]


@pytest.mark.parametrize("path", real_params(WITH_NVTX))
def test_innermost_first(path):
    """nesting 0 is the range with the latest start (ties: the earliest end), then outward."""
    trace = load_trace(path)
    _, found = _project(trace)
    innermost_sql = f"""
    WITH pairs AS ({_enclosing_sql(path)})
    SELECT pid, corr, max(start) FROM pairs GROUP BY pid, corr"""
    inner = found.filter(pl.col("nesting") == 0).select("pid", "correlation", "range_start")
    assert sorted(inner.iter_rows()) == sorted(_sql(path, innermost_sql))
    ordered = found.sort("call", "nesting").group_by("call", maintain_order=True).agg("range_start", "range_end")
    for starts, ends in ordered.select("range_start", "range_end").iter_rows():
        assert starts == sorted(starts, reverse=True)
        assert all(a <= b for a, b in zip(ends, ends[1:]))  # each enclosing range ends no earlier


@needs_shared(LLAMA3)
def test_llama3_layer_token_ranges_project_like_sql():
    """The `layer_M_token_N` ranges of the llama3 simulation: GPU ops per range, as nsys counts them."""
    trace = load_trace(LLAMA3)
    calls = _launch_calls(trace)
    ranges = projectable_ranges(trace.nvtx).filter(pl.col("name").str.contains(r"^layer_\d+_token_\d+$"))
    inner = innermost_ranges(calls, ranges, thread_col="api_tid", start_col="api_start", end_col="api_end")
    activities = with_launch_calls(gpu_activities(trace), trace.api_calls)
    per_range = (
        activities.join(calls.select("call", "pid", "correlation"), on=["pid", "correlation"])
        .join(inner.select("call", pl.col("name").alias("range_name"), "range_start"), on="call")
        .group_by("range_name", "range_start").len()
    )
    sql = f"""
    WITH ops AS (SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL
                 UNION ALL SELECT correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET)
    SELECT n.text, n.start, count(*)
    FROM ops o
    JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = o.correlationId
         AND o.globalPid = (r.globalTid & -16777216) AND r.eventClass IN (0, 1)
    JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.eventType = 59
         AND n.start <= r.start AND n.end >= r.end
    WHERE n.text GLOB 'layer_*_token_*' AND n.text NOT GLOB '*_computation'
    GROUP BY n.rowid"""
    theirs = sorted(_sql(LLAMA3, sql))
    assert sorted(per_range.iter_rows()) == theirs
    assert len(theirs) == 512  # 8 layers x 64 tokens
    assert {count for _, _, count in theirs} == {4}  # 3 kernels and 1 memset in each


# ---- edge cases on hand-made ranges ------------------------------------------------------


def _nvtx(rows: list[tuple]) -> pl.DataFrame:
    """rows: (start, end, global_tid, end_global_tid, event_type, name, domain)."""
    return pl.DataFrame(
        rows, orient="row",
        schema={"start": pl.Int64, "end": pl.Int64, "global_tid": pl.Int64, "end_global_tid": pl.Int64,
                "event_type": pl.Int64, "name": pl.Utf8, "domain": pl.Utf8},
    ).with_columns(pl.lit(1, pl.Int64).alias("pid"), pl.col("global_tid").alias("tid"))


def _calls(rows: list[tuple]) -> pl.DataFrame:
    return pl.DataFrame(rows, orient="row", schema={"call": pl.Int64, "global_tid": pl.Int64,
                                                     "start": pl.Int64, "end": pl.Int64})


def _names(found: pl.DataFrame, call: int) -> list[str]:
    return found.filter(pl.col("call") == call).sort("nesting")["qualified_name"].to_list()


def test_nsys_rules_on_hand_made_ranges():
    nvtx = _nvtx([
        (0, 100, 1, None, 59, "outer", None),
        (10, 50, 1, None, 59, "inner", "MyDomain"),
        (10, 50, 1, None, 59, "inner twin", None),  # same interval: both enclose, order fixed
        (20, 30, 1, 2, 60, "ends elsewhere", None),  # start/end range closed on thread 2: skipped
        (20, 40, 1, None, 60, "start-end", None),
        (60, None, 1, None, 59, "still open", None),  # open at the end of the capture
        (0, 100, 2, None, 59, "other thread", None),
        (50, 50, 1, None, 59, "zero length", None),
    ])
    calls = _calls([
        (1, 1, 25, 28),  # in outer > inner > start-end
        (2, 1, 45, 55),  # crosses inner's end: only outer
        (3, 1, 70, 80),  # outer and the open range
        (4, 1, 50, 50),  # exactly at the zero-length range, inside inner's end
        (5, 3, 25, 28),  # a thread without ranges
    ])
    found = enclosing_ranges(calls, projectable_ranges(nvtx))
    assert _names(found, 1) == ["start-end", "inner twin", "MyDomain:inner", "outer"]
    assert _names(found, 2) == ["outer"]
    assert _names(found, 3) == ["still open", "outer"]
    assert _names(found, 4) == ["zero length", "inner twin", "MyDomain:inner", "outer"]
    assert _names(found, 5) == []


def test_crossing_start_end_ranges_get_separate_levels():
    nvtx = _nvtx([
        (0, 10, 1, None, 60, "a", None),
        (5, 15, 1, None, 60, "b", None),  # crosses a
        (12, 20, 1, None, 60, "c", None),  # crosses b; same nesting depth as b
        (30, 40, 1, None, 59, "d", None),
    ])
    leveled = range_levels(projectable_ranges(nvtx))
    by_level = leveled.group_by("level").agg(pl.col("name").sort())
    # no level holds two overlapping ranges
    for names in by_level["name"].to_list():
        spans = sorted((s, e) for n, s, e in leveled.select("name", "start", "end").iter_rows() if n in names)
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:]))
    found = enclosing_ranges(_calls([(1, 1, 13, 14), (2, 1, 6, 7)]), projectable_ranges(nvtx))
    assert _names(found, 1) == ["c", "b"]
    assert _names(found, 2) == ["b", "a"]


def test_random_ranges_match_brute_force():
    """Random push/pop stacks and crossing start/end ranges on 3 threads vs a direct test."""
    rng = random.Random(7)
    rows = []
    for tid in (1, 2, 3):
        t, stack = 0, []
        for _ in range(400):
            t += rng.randint(0, 3)  # zero steps make equal timestamps
            if stack and rng.random() < 0.45:
                start, name = stack.pop()
                rows.append((start, t, tid, None, 59, name, None))
            else:
                stack.append((t, f"p{tid}-{len(rows)}-{t}"))
        while stack:
            start, name = stack.pop()
            rows.append((start, t + 1, tid, None, 59, name, None))
        for k in range(60):
            a = rng.randint(0, t)
            rows.append((a, a + rng.randint(0, 40), tid, None, 60, f"s{tid}-{k}", None))
    nvtx = _nvtx(rows)
    calls = _calls([(i, rng.choice((1, 2, 3)), s, s + rng.randint(0, 2))
                    for i, s in enumerate(rng.randint(0, 500) for _ in range(600))])
    found = enclosing_ranges(calls, projectable_ranges(nvtx))
    ours = sorted(found.select("call", "qualified_name").iter_rows())
    brute = sorted(
        (call, name)
        for call, tid, cs, ce in calls.iter_rows()
        for start, end, rtid, _, _, name, _ in rows
        if rtid == tid and start <= cs and ce <= end
    )
    assert ours == brute
    assert len(brute) > 1000


def test_innermost_ranges_agree_with_enclosing_ranges():
    """The fast path (deepest level first) and the general one pick the same range."""
    rng = random.Random(11)
    rows = []
    for tid in (1, 2):
        t, stack = 0, []
        for _ in range(300):
            t += rng.randint(0, 2)
            if stack and rng.random() < 0.45:
                start, name = stack.pop()
                rows.append((start, t, tid, None, 59, name, None))
            else:
                stack.append((t, f"p{tid}-{len(rows)}-{t}"))
        while stack:
            start, name = stack.pop()
            rows.append((start, t + 1, tid, None, 59, name, None))
    ranges = projectable_ranges(_nvtx(rows))
    calls = _calls([(i, rng.choice((1, 2)), s, s + rng.randint(0, 1))
                    for i, s in enumerate(rng.randint(0, 300) for _ in range(500))])
    assert not range_levels(ranges)["crossed"].any()
    general = enclosing_ranges(calls, ranges).filter(pl.col("nesting") == 0).drop("nesting")
    fast = innermost_ranges(calls, ranges)
    assert fast.sort("call").rows() == general.sort("call").rows()
    assert fast.height > 400
