"""`check --trace-out FILE.json`: the worst and a representative decode step as a Chrome trace.

Open the file in Perfetto UI (ui.perfetto.dev) or `chrome://tracing` to look at the flagged
step itself. The steps are the ones the HTML report draws (`selection.select_steps`). Tracks:

* per rank, one process per GPU (``rank 0 GPU 3``) with a thread per stream: kernels, copies and
  memsets as complete events (`X`), their op, layer, ledger group, graph node and correlation
  id in `args`, and a ``gaps`` thread with each idle gap above the threshold (its cause and
  neighbours in `args`);
* per rank, one process for the host (``rank 0 host``) with a thread per OS thread: the launch
  calls of the step (kernel and graph launches, copies, syncs) and a ``steps`` thread with one
  event per drawn step;
* each finding that names a drawn step as a global instant event (`i`, scope `g`) at the
  step's start, carrying the message and the hint.

Times are microseconds from the earliest drawn event (the format's unit), with nanosecond
decimals. Every name from the trace goes into JSON strings only (escaped by the encoder).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.report.selection import SelectedStep, parse_step_list, select_steps

STEP_KEY = ["rank", "step"]
# Chrome-trace process ids: host and GPUs of one rank side by side, ranks apart.
PIDS_PER_RANK = 1000
HOST_PID_OFFSET = 999
GAPS_TID = 1_000_000  # the gap track of a GPU process (streams use their own ids)
STEPS_TID = 1_000_001  # the drawn-steps track of the host process
LAUNCH_KINDS = ("kernel_launch", "graph_launch", "memcpy", "memset", "sync")


def chrome_trace_document(result: Result) -> dict:
    """The Chrome trace (JSON Object Format) of the drawn steps of `result`."""
    selected = select_steps(result)
    if not selected:
        return {"traceEvents": [], "displayTimeUnit": "ns",
                "otherData": {"nsys_ledger": "no decode step to draw", "trace": result.trace.path}}
    chosen = pl.DataFrame(
        [(s.rank, s.step, s.role) for s in selected], schema={"rank": pl.Int64, "step": pl.Int64, "role": pl.Utf8},
        orient="row",
    )
    activities = _step_activities(result, chosen)
    calls = _step_calls(result, chosen)
    gaps = result.gaps.join(chosen, on=STEP_KEY, how="inner") if result.gaps.height else result.gaps
    windows = _step_windows(result, chosen, activities)
    origin = min(
        v for v in (activities["start"].min(), calls["start"].min() if calls.height else None,
                    windows["start"].min()) if v is not None
    )
    events: list[dict] = []
    events += _metadata(activities, calls)
    events += _activity_events(activities, origin)
    events += _gap_events(gaps, origin)
    events += _call_events(calls, origin)
    events += _step_events(windows, origin, selected)
    events += _finding_events(result, windows, origin)
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "nsys_ledger": "drawn decode steps: " + "; ".join(f"{s.role} rank {s.rank} step {s.step} ({s.why})"
                                                             for s in selected),
            "trace": result.trace.path,
            "verdict": result.verdict_sentence,
        },
    }


def write_chrome_trace(result: Result, target: Path) -> None:
    with open(target, "w", encoding="utf-8") as out:
        json.dump(chrome_trace_document(result), out, ensure_ascii=False, separators=(",", ":"))


# ---- gathering the drawn steps ----------------------------------------------------------


def _step_activities(result: Result, chosen: pl.DataFrame) -> pl.DataFrame:
    columns = ["row", "activity", "start", "end", "device", "stream", "pid", "correlation", "name",
               "graph_node_id", "bytes", "copy_kind", "src_kind", "op", "group", "rank", "step"]
    present = [c for c in columns if c in result.steps.activities.columns]
    activities = result.steps.activities.lazy().select(present).join(chosen.lazy(), on=STEP_KEY).collect()
    if result.layers is not None:
        layers = result.layers.assignments.lazy().join(chosen.lazy().select(STEP_KEY), on=STEP_KEY).select(
            "rank", "row", "layer", "submodule", "layer_group", "how").collect()
        activities = activities.join(layers, on=["rank", "row"], how="left")
    return activities.sort("start")


def _step_calls(result: Result, chosen: pl.DataFrame) -> pl.DataFrame:
    calls = result.steps.api_calls
    return (
        calls.lazy().filter(pl.col("kind").is_in(LAUNCH_KINDS))
        .select("start", "end", "pid", "tid", "correlation", "name", "kind", "rank", "step")
        .join(chosen.lazy(), on=STEP_KEY).collect().sort("start")
    )


def _step_windows(result: Result, chosen: pl.DataFrame, activities: pl.DataFrame) -> pl.DataFrame:
    """Per drawn step: its GPU span (first start, last end of its activities) and role."""
    return (
        activities.group_by(STEP_KEY).agg(pl.col("start").min(), pl.col("end").max(), pl.col("pid").first())
        .join(chosen, on=STEP_KEY).sort("start")
    )


# ---- events -----------------------------------------------------------------------------


def _us(ns: int, origin: int) -> float:
    return round((ns - origin) / 1000, 3)


def gpu_pid(rank: int, device: int) -> int:
    return rank * PIDS_PER_RANK + device


def host_pid(rank: int) -> int:
    return rank * PIDS_PER_RANK + HOST_PID_OFFSET


def _metadata(activities: pl.DataFrame, calls: pl.DataFrame) -> list[dict]:
    events = []
    for rank, device in activities.select("rank", "device").unique().sort("rank", "device").iter_rows():
        pid = gpu_pid(rank, device)
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"rank {rank} GPU {device}"}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": GAPS_TID, "args": {"name": "gaps"}})
    for rank, device, stream in activities.select("rank", "device", "stream").unique().sort(
            "rank", "device", "stream").iter_rows():
        events.append({"ph": "M", "name": "thread_name", "pid": gpu_pid(rank, device), "tid": stream,
                       "args": {"name": f"stream {stream}"}})
    ranks = set(activities["rank"].unique().to_list()) | set(calls["rank"].unique().to_list())
    for rank in sorted(ranks):
        events.append({"ph": "M", "name": "process_name", "pid": host_pid(rank), "tid": 0,
                       "args": {"name": f"rank {rank} host"}})
        events.append({"ph": "M", "name": "thread_name", "pid": host_pid(rank), "tid": STEPS_TID,
                       "args": {"name": "decode steps"}})
    for rank, tid in calls.select("rank", "tid").unique().sort("rank", "tid").iter_rows():
        events.append({"ph": "M", "name": "thread_name", "pid": host_pid(rank), "tid": tid,
                       "args": {"name": f"thread {tid}"}})
    return events


def _activity_events(activities: pl.DataFrame, origin: int) -> list[dict]:
    events = []
    has_layers = "layer" in activities.columns
    for row in activities.iter_rows(named=True):
        args = {"step": row["step"], "role": row["role"], "op": row.get("op"), "correlation": row["correlation"]}
        if has_layers:
            args |= {"layer": row["layer"], "submodule": row["submodule"], "layer_group": row["layer_group"],
                     "layer_from": row["how"]}
        if row["graph_node_id"] is not None:
            args["graph_node_id"] = row["graph_node_id"]
        if row["activity"] != "kernel":
            args |= {"bytes": row["bytes"], "copy_kind": row["copy_kind"], "src_kind": row["src_kind"]}
        events.append({
            "ph": "X", "cat": row["activity"], "name": row["name"] or row["activity"],
            "pid": gpu_pid(row["rank"], row["device"]), "tid": row["stream"],
            "ts": _us(row["start"], origin), "dur": round((row["end"] - row["start"]) / 1000, 3),
            "args": {k: v for k, v in args.items() if v is not None},
        })
    return events


def _gap_events(gaps: pl.DataFrame, origin: int) -> list[dict]:
    events = []
    for row in gaps.iter_rows(named=True):
        args = {
            "cause": row["cause"], "duration_ns": row["duration"], "step": row["step"], "role": row["role"],
            "before": row["before"], "before_op": row["before_op"], "before_layer": row["before_layer"],
            "after": row["after"], "after_op": row["after_op"], "after_layer": row["after_layer"],
        }
        events.append({
            "ph": "X", "cat": "gap", "name": f"gap: {row['cause']}",
            "pid": gpu_pid(row["rank"], row["device"]), "tid": GAPS_TID,
            "ts": _us(row["start"], origin), "dur": round(row["duration"] / 1000, 3),
            "args": {k: v for k, v in args.items() if v is not None},
        })
    return events


def _call_events(calls: pl.DataFrame, origin: int) -> list[dict]:
    return [
        {
            "ph": "X", "cat": f"api_{row['kind']}", "name": row["name"], "pid": host_pid(row["rank"]),
            "tid": row["tid"],
            "ts": _us(row["start"], origin), "dur": round((row["end"] - row["start"]) / 1000, 3),
            "args": {k: v for k, v in {"correlation": row["correlation"], "kind": row["kind"], "step": row["step"],
                                       "role": row["role"]}.items() if v is not None},
        }
        for row in calls.iter_rows(named=True)
    ]


def _step_events(windows: pl.DataFrame, origin: int, selected: list[SelectedStep]) -> list[dict]:
    why = {(s.rank, s.step): s.why for s in selected}
    return [
        {
            "ph": "X", "cat": "step", "name": f"{row['role']} step {row['step']}", "pid": host_pid(row["rank"]),
            "tid": STEPS_TID, "ts": _us(row["start"], origin), "dur": round((row["end"] - row["start"]) / 1000, 3),
            "args": {"rank": row["rank"], "step": row["step"], "role": row["role"],
                     "why": why[(row["rank"], row["step"])]},
        }
        for row in windows.iter_rows(named=True)
    ]


def _finding_events(result: Result, windows: pl.DataFrame, origin: int) -> list[dict]:
    """One global instant event per (finding, drawn step it names), at the step's GPU start."""
    events = []
    all_steps = result.step_table.select(STEP_KEY)
    for finding in result.findings:
        named = parse_step_list(finding.steps, all_steps).join(windows, on=STEP_KEY)
        for row in named.iter_rows(named=True):
            args = {"message": finding.message, "expectation": finding.source, "check": finding.check,
                    "steps": finding.steps, "hint": finding.hint, "step": row["step"], "rank": row["rank"]}
            events.append({
                "ph": "i", "s": "g", "cat": "finding", "name": f"finding: {finding.source}",
                "pid": host_pid(row["rank"]), "tid": STEPS_TID, "ts": _us(row["start"], origin),
                "args": {k: v for k, v in args.items() if v is not None},
            })
    return events
