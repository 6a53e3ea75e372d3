"""Timeline checks on the real Nsight Systems exports (../shared/real_traces, read-only).

H2D copies per step and their pageable flags are compared with plain SQL over the same file;
gap detection runs on every export (with the step rules that make sense for it) and its gaps
are checked against the file: inside their step, above the threshold, never over profiler
overhead, and, for the LLaMA layer loop, equal to an independent interval sweep of SQL rows.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.checks.gaps import GAP_CAUSES

REPO = Path(__file__).resolve().parents[1]
from shared_data import REAL_TRACES as TRACES_DIR, skip_without_shared  # noqa: E402
FILES = sorted(TRACES_DIR.glob("*.sqlite")) if TRACES_DIR.is_dir() else []

NSYS_AI = "GindaChen__nsys-ai"
PIPIT = "hpcgroup__pipit"
LLAMA3 = "Sh1mwww__llama3-inference"
# Step rules per export: its NVTX ranges that make sensible "steps" (None: auto, as a user would)
STEP_NVTX = {
    NSYS_AI: [None, r"^aten::_to_copy"],
    LLAMA3: [None, r"^token_\d+_processing$", r"^layer_\d+_computation$"],
}


def _file(prefix: str) -> Path:
    matches = [p for p in FILES if p.name.startswith(prefix)]
    if not matches:
        skip_without_shared()
    return matches[0]


def _sql(path: Path, query: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def _cases():
    cases = []
    for path in FILES:
        prefix = "__".join(path.name.split("__")[:2])
        for nvtx in STEP_NVTX.get(prefix, [None]):
            cases.append(pytest.param(path, nvtx, id=f"{prefix.split('__')[1]}-{nvtx or 'auto'}"))
    return cases or [pytest.param(None, None, id="no-real-traces")]


# ---------------------------------------------------------------------------------------------
# H2D copies per step = SQL
# ---------------------------------------------------------------------------------------------
# The copies whose launching call starts inside each `aten::_to_copy` range on its own thread
# (nsys's projection rule), per range: host start, H2D copies, pageable ones, bytes.
TO_COPY_H2D = """
WITH ranges AS (
  SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
  WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL
    AND (n.endGlobalTid IS NULL OR n.endGlobalTid = n.globalTid)
    AND coalesce(s.value, n.text) LIKE 'aten::_to_copy%'
)
SELECT g.start, count(*), sum(m.srcKind = 0), sum(m.bytes)
FROM ranges g
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = g.globalTid AND r.start BETWEEN g.start AND g.end
     AND r.eventClass IN (0, 1)
JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId
     AND m.globalPid = (r.globalTid & -16777216)
WHERE m.copyKind = 1
GROUP BY g.start, g.globalTid ORDER BY g.start
"""


def test_h2d_per_nvtx_step_equals_sql_on_the_nsys_ai_export():
    path = _file(NSYS_AI)
    result = nsys_ledger.check(path, step_nvtx=r"^aten::_to_copy")
    steps = result.step_table.filter(pl.col("h2d") > 0).sort("host_start")
    observed = steps.select("host_start", "h2d", "h2d_pageable", "h2d_bytes").rows()
    assert observed == [tuple(row) for row in _sql(path, TO_COPY_H2D)]
    assert steps["h2d"].sum() == 218 and steps["h2d_pageable"].sum() == 4  # of the file's 450 H2D copies
    copies = result.timeline.h2d
    assert copies.height == 218
    assert copies.group_by("memory").len().sort("memory").rows() == [("pageable", 4), ("pinned", 214)]
    assert set(copies["position"]) == {"no_graph"}  # no CUDA graph in this capture


# The pipit saxpy loop: each launch of the `saxpy` kernel ends a step (a marker), so a step is
# the copies issued since the previous launch; the part after the last launch is incomplete.
SAXPY_H2D = """
WITH markers AS (
  SELECT r.start AS t, lag(r.start) OVER (ORDER BY r.start) AS previous
  FROM CUPTI_ACTIVITY_KIND_KERNEL k
  JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
       AND k.globalPid = (r.globalTid & -16777216) AND r.eventClass IN (0, 1)
  JOIN StringIds s ON s.id = k.demangledName WHERE s.value LIKE 'saxpy%'
)
SELECT w.t, count(m.start), coalesce(sum(m.srcKind = 0), 0)
FROM markers w
LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.eventClass IN (0, 1)
     AND r.start > coalesce(w.previous, -1) AND r.start <= w.t
LEFT JOIN CUPTI_ACTIVITY_KIND_MEMCPY m ON m.correlationId = r.correlationId
     AND m.globalPid = (r.globalTid & -16777216) AND m.copyKind = 1
GROUP BY w.t ORDER BY w.t
"""


def test_h2d_per_marker_step_equals_sql_on_the_pipit_export(tmp_path):
    path = _file(PIPIT)
    ledger = tmp_path / "saxpy.toml"
    ledger.write_text(
        '[model]\nname = "saxpy loop"\n[ops.saxpy]\npatterns = ["^saxpy"]\n'
        '[steps]\nmethod = "marker"\nmarker_op = "saxpy"\n[h2d]\npageable_allowed = false\n'
    )
    result = nsys_ledger.check(path, ledger)
    table = result.step_table.sort("host_end")
    assert table.select("host_end", "h2d", "h2d_pageable").rows() == [tuple(r) for r in _sql(path, SAXPY_H2D)]
    assert table["h2d"].to_list() == [2] * 5 and table["h2d_pageable"].to_list() == [2] * 5
    assert [f.check for f in result.findings if f.check.startswith("h2d")] == ["h2d_pageable"]


# ---------------------------------------------------------------------------------------------
# Gap detection on every export
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("path", "step_nvtx"), _cases())
def test_gap_detection_runs_and_its_gaps_hold_on_the_file(path, step_nvtx):
    if path is None:
        skip_without_shared()
    result = nsys_ledger.check(path, step_nvtx=step_nvtx, per_stream_gaps=True)
    gaps, table = result.gaps, result.step_table
    assert set(gaps["cause"]) <= set(GAP_CAUSES)
    assert (gaps["duration"] > result.gap_threshold_ns).all()
    spans = gaps.join(table.select("rank", "step", "gpu_start", "gpu_end"), on=["rank", "step"], how="left")
    assert ((spans["start"] >= spans["gpu_start"]) & (spans["end"] <= spans["gpu_end"])).all()
    assert table["gaps"].sum() == gaps.height
    # the budget terms add up to the step's device time
    terms = ["busy_ns", "small_gap_ns", "collective_ns", "host_ns", "other_gap_ns", "overhead_ns"]
    assert (table.select(pl.sum_horizontal(terms).alias("t"))["t"] == table["step_ns"]).all()
    # no reported idle time lies under a profiler overhead range of its process
    overhead = result.trace.profiler_overhead
    for pid, start, end in gaps.select("pid", "start", "end").iter_rows():
        hit = overhead.filter((pl.col("pid") == pid) & (pl.col("start") < end) & (pl.col("end") > start))
        assert hit.height == 0, (pid, start, end)


# An independent sweep of the LLaMA layer loop: SQL rows, merged in Python, per token range.
LLAMA_ACTIVITIES = """
SELECT start, end, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL
UNION ALL SELECT start, end, globalPid, deviceId FROM CUPTI_ACTIVITY_KIND_MEMSET
"""
LLAMA_STEP_SPANS = """
WITH ranges AS (
  SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n
  WHERE n.eventType IN (59, 60) AND n.end IS NOT NULL AND n.text GLOB 'token_*_processing'
), acts AS (
  SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL
  UNION ALL SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_MEMSET
)
SELECT g.start, min(a.start), max(a.end)
FROM ranges g
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.globalTid = g.globalTid AND r.start BETWEEN g.start AND g.end
     AND r.eventClass IN (0, 1)
JOIN acts a ON a.correlationId = r.correlationId AND a.globalPid = (r.globalTid & -16777216)
GROUP BY g.start, g.globalTid ORDER BY g.start
"""


def test_llama_token_step_gaps_equal_an_independent_sweep():
    path = _file(LLAMA3)
    activities = sorted(_sql(path, LLAMA_ACTIVITIES))
    assert len({(gpid, device) for _, _, gpid, device in activities}) == 1  # one process, one GPU
    overhead = [(s, e) for s, e in _sql(path, "SELECT start, end FROM PROFILER_OVERHEAD")]
    busy = sorted([(s, e) for s, e, _, _ in activities] + overhead)
    idle, reach = [], busy[0][1]
    for start, end in busy[1:]:
        if start > reach:
            idle.append((reach, start))
        reach = max(reach, end)
    spans = _sql(path, LLAMA_STEP_SPANS)
    expected = []
    for index, (_, gpu_start, gpu_end) in enumerate(spans):
        inside = [(s, e) for s, e in idle if s >= gpu_start and e <= gpu_end and e - s > 2_000]
        expected.append((index, len(inside), sum(e - s for s, e in inside)))
    result = nsys_ledger.check(path, step_nvtx=r"^token_\d+_processing$")
    assert result.step_table.select("step", "gaps", "gap_ns").rows() == expected
    assert result.step_table.height == 64 and result.gaps.height == 1983
