"""The timeline part of the JSON document (docs/json-schema.md: `timeline`, and the per-step
`kernels_per_token`, `replays`, `h2d_positions`, `budget`, `gaps_by_cause` fields)."""

from __future__ import annotations

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.budget import BUDGET_COLUMNS
from nsys_ledger.checks.gaps import DEVICE_CAUSES, GAP_CAUSES, LAUNCH_CAUSES, SPLIT_FIELDS
from nsys_ledger.checks.host_time import HOST_PARTS
from nsys_ledger.checks.h2d import H2D_POSITIONS

GAP_FIELDS = ["rank", "step", "pid", "device", "start", "end", "duration", "cause", "before", "before_op",
              "before_layer", "after", "after_op", "after_layer", "step_entry", "side", *SPLIT_FIELDS, "nvtx_range",
              "call_kind", "call_start", "call_end", "opens_call"]
H2D_FIELDS = ["rank", "step", "device", "stream", "start", "end", "bytes", "memory", "position"]
BREAK_FIELDS = ["rank", "step", "replay", "kernel_index", "before", "before_op", "before_layer", "after",
                "after_op", "after_layer", "boundary_ns"]
# Lists are capped: an eager 1M-kernel trace has over half a million gaps (a 400 MB document);
# the per-step counts and totals carry all of them, Result.gaps (Python) every row.
LIST_LIMIT = 1000


def step_timeline_fields(row: dict) -> dict:
    """The timeline fields of one `steps[]` entry, from its step-table row."""
    if "step_ns" not in row:
        return {}
    return {
        "kernels_per_token": row["kernels_per_token"],
        "replays": row["replays"],
        "h2d_positions": {position: row[f"h2d_{position}"] for position in H2D_POSITIONS},
        "budget": {column: row[column] for column in BUDGET_COLUMNS} | {"bound": row["bound"]},
        "gaps_by_cause": {
            cause: {"count": row[f"gaps_{cause}"], "ns": row[f"gap_ns_{cause}"]}
            for cause in GAP_CAUSES
            if row[f"gaps_{cause}"]
        },
    }


def timeline_document(result: Result) -> dict | None:
    timeline = result.timeline
    if timeline is None:
        return None
    stream_gaps = timeline.stream_gaps
    return {
        "batch": result.batch,
        "gap_causes": list(GAP_CAUSES),
        "gap_sides": {"host": list(HOST_PARTS), "launch": list(LAUNCH_CAUSES), "device": list(DEVICE_CAUSES)},
        "list_limit": LIST_LIMIT,
        "gaps_total": timeline.gaps.height,
        "gaps": _longest(timeline.gaps).select(GAP_FIELDS).to_dicts(),
        "stream_gaps_total": None if stream_gaps is None else stream_gaps.height,
        "stream_gaps": None if stream_gaps is None else _longest(stream_gaps).select(*GAP_FIELDS, "stream").to_dicts(),
        "h2d_copies_total": timeline.h2d.height,
        "h2d_copies": timeline.h2d.head(LIST_LIMIT).select(H2D_FIELDS).to_dicts(),
        "graph_breaks_total": timeline.breaks.height,
        "graph_breaks": timeline.breaks.head(LIST_LIMIT).select(BREAK_FIELDS).to_dicts(),
        "ranks": _ranks(result),
    }


def _longest(gaps: pl.DataFrame) -> pl.DataFrame:
    """The LIST_LIMIT longest gaps, in time order (rank, step, start)."""
    if gaps.height <= LIST_LIMIT:
        return gaps
    return gaps.top_k(LIST_LIMIT, by="duration").sort("rank", "step", "start")


def _ranks(result: Result) -> dict | None:
    ranks = result.ranks
    if ranks is None:
        return None
    return {
        "slowest_rank": ranks.slowest_rank,
        "imbalance_pct": round(ranks.imbalance_pct, 3),
        "max_spread_ns": ranks.max_spread_ns,
        "per_rank": ranks.per_rank.to_dicts(),
        "per_step": ranks.per_step.to_dicts(),
    }
