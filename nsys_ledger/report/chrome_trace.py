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
* each finding that names a drawn step as an instant event (`i`) on the activity it is about,
  on that activity's own track: an anchor's first kernel of its op, a per-layer finding's first
  kernel of its group in the first layer it names, a kernel-sequence finding's extra kernel in
  the first layer it names, an H2D finding's (pageable) copy, a gap
  finding's longest gap; a finding about the step as a whole (total, graph launches, layer
  count) stays a global instant at the step's start. It carries the message and the hint;
* flow arrows (`s` -> `f`) from each launch call to the kernel, copy or memset it launched (a
  graph launch: to the first kernel of the replay), so the host side and the device side of a
  launch are one click apart.

Times are microseconds from the earliest drawn event (the format's unit), with nanosecond
decimals. Every name from the trace goes into JSON strings only (escaped by the encoder).
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.layers import _bare_name
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
    events += _finding_events(result, windows, activities, gaps, origin)
    events += _flow_events(activities, calls, origin)
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


def _finding_events(result: Result, windows: pl.DataFrame, activities: pl.DataFrame, gaps: pl.DataFrame,
                    origin: int) -> list[dict]:
    """One instant event per (finding, drawn step it names): on the activity the finding is
    about (its track, its start), else a global one at the step's GPU start."""
    events = []
    all_steps = result.step_table.select(STEP_KEY)
    peers = _healthy_peers(result)
    for finding in result.findings:
        named = parse_step_list(finding.steps, all_steps).join(windows, on=STEP_KEY)
        for row in named.iter_rows(named=True):
            args = {"message": finding.message, "expectation": finding.source, "check": finding.check,
                    "steps": finding.steps, "hint": finding.hint, "step": row["step"], "rank": row["rank"]}
            place = _offending_activity(finding, activities, gaps, row["rank"], row["step"], peers)
            if place is None:
                where = {"s": "g", "pid": host_pid(row["rank"]), "tid": STEPS_TID, "ts": _us(row["start"], origin)}
            else:
                pid, tid, start, name = place
                where = {"s": "t", "pid": pid, "tid": tid, "ts": _us(start, origin)}
                args["on"] = name
            events.append({"ph": "i", "cat": "finding", "name": f"finding: {finding.source}", **where,
                           "args": {k: v for k, v in args.items() if v is not None}})
    return events


def _healthy_peers(result: Result) -> dict[tuple[str, int], list[int]]:
    """(group, layer) -> the layers of the same class that no finding about that group names,
    nearest first: what a faulted layer's kernels are compared with."""
    if result.expectations is None:
        return {}
    faulted: dict[str, set[int]] = {}
    for finding in result.findings:
        if finding.check in ("layer", "layer_uniform") and finding.layers:
            faulted.setdefault(finding.subject, set()).update(_compact_values(finding.layers))
    peers = {}
    for group, layers in faulted.items():
        for layer_class in result.expectations.layer_classes:
            healthy = [layer for layer in layer_class.layers if layer not in layers]
            for layer in set(layer_class.layers) & layers:
                peers[(group, layer)] = sorted(healthy, key=lambda peer: (abs(peer - layer), peer))[:3]
    return peers


def _offending_activity(finding, activities: pl.DataFrame, gaps: pl.DataFrame, rank: int, step: int,
                        peers: dict[tuple[str, int], list[int]]) -> tuple[int, int, int, str] | None:
    """(pid, tid, start, name) of the activity a finding is about in one drawn step, or None."""
    in_step = activities.filter((pl.col("rank") == rank) & (pl.col("step") == step))
    if finding.check == "anchor":
        about = in_step.filter((pl.col("activity") == "kernel") & (pl.col("op") == finding.subject))
    elif finding.check in ("layer", "layer_uniform") and finding.layers and "layer" in in_step.columns:
        layer = _compact_values(finding.layers)[0]
        about = _first_odd_kernel(in_step, finding.subject, layer, peers.get((finding.subject, layer), []))
    elif finding.check == "layer_sequence" and finding.layers and "layer" in in_step.columns:
        # an extra kernel in a layer's sequence (a missing one has no kernel to sit on): in the
        # first layer it names, the first kernel its label names (the op or, for a kernel no op
        # claims, the bare name), as the HTML report's offending-kernel marks read it
        if not (finding.observed or "").startswith("+ "):
            return None
        layer = _compact_values(finding.layers)[0]
        in_layer = in_step.filter((pl.col("activity") == "kernel") & (pl.col("layer") == layer))
        unclaimed = pl.col("op").is_null() | (pl.col("op") == "other")
        bare = pl.col("name").map_elements(_bare_name, return_dtype=pl.Utf8)
        about = in_layer.filter((pl.col("op") == finding.subject) | (unclaimed & (bare == finding.subject)))
    elif finding.check in ("h2d", "h2d_pageable", "h2d_bytes"):
        about = in_step.filter((pl.col("activity") == "memcpy") & (pl.col("copy_kind") == "HtoD"))
        if finding.check == "h2d_pageable":
            about = about.filter(pl.col("src_kind") == "Pageable")
    elif finding.check == "gaps" and gaps.height:
        longest = gaps.filter((pl.col("rank") == rank) & (pl.col("step") == step)).sort(
            "duration", "start", descending=[True, False]).head(1)
        if longest.height:
            gap = longest.row(0, named=True)
            return gpu_pid(rank, gap["device"]), GAPS_TID, gap["start"], f"gap: {gap['cause']}"
        return None
    else:
        return None
    if about.height == 0:
        return None
    first = about.sort("start").row(0, named=True)
    return gpu_pid(rank, first["device"]), first["stream"], first["start"], first["name"] or first["activity"]


def _compact_values(text: str) -> list[int]:
    """"3-32, 34-36, 41" -> [3, ..., 32, 34, 35, 36, 41]."""
    values = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        values += range(int(low), int(high or low) + 1)
    return values


def _first_odd_kernel(in_step: pl.DataFrame, group: str, faulted: int, peers: list[int]) -> pl.DataFrame:
    """The kernel of `group` in a faulted layer where its sequence of ops first departs from a
    healthy peer's of the same class (layer 41's stray kernel, not its first one); where they
    agree up to the shorter end, the first kernel beyond it; without a healthy peer (every layer
    of the class at fault), the group's first kernel."""
    def sequence(layer: int) -> pl.DataFrame:
        return in_step.filter((pl.col("layer") == layer) & (pl.col("layer_group") == group)).sort("start")

    kernels = sequence(faulted)
    for peer in peers:
        healthy = sequence(peer)
        if healthy.height == 0:
            continue
        ops = [op or name for op, name in kernels.select("op", "name").iter_rows()]
        peer_ops = [op or name for op, name in healthy.select("op", "name").iter_rows()]
        differ = next((i for i, (a, b) in enumerate(zip(ops, peer_ops)) if a != b), min(len(ops), len(peer_ops)))
        return kernels.slice(min(differ, max(kernels.height - 1, 0)), 1)
    return kernels.head(1)


def _flow_events(activities: pl.DataFrame, calls: pl.DataFrame, origin: int) -> list[dict]:
    """A flow arrow per launch: from the call on its host thread to the first activity with its
    correlation id (a graph launch's replay shares one id: the arrow goes to its first kernel)."""
    if calls.height == 0 or activities.height == 0:
        return []
    launched = (
        activities.filter(pl.col("correlation").is_not_null())
        .sort("start").group_by("rank", "pid", "correlation", maintain_order=True)
        .agg(pl.col("start").first().alias("gpu_start"), pl.col("device").first(), pl.col("stream").first())
    )
    pairs = calls.filter(pl.col("kind") != "sync").join(launched, on=["rank", "pid", "correlation"]).sort("start")
    events = []
    for flow_id, row in enumerate(pairs.iter_rows(named=True), start=1):
        common = {"cat": "launch", "name": "launch", "id": flow_id}
        events.append({"ph": "s", **common, "pid": host_pid(row["rank"]), "tid": row["tid"],
                       "ts": _us(row["start"], origin)})
        events.append({"ph": "f", "bp": "e", **common, "pid": gpu_pid(row["rank"], row["device"]),
                       "tid": row["stream"], "ts": _us(row["gpu_start"], origin)})
    return events
