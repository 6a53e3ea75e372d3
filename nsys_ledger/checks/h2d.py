"""Host-to-device copies of each decode step: size, pinned or pageable, and where they sit
relative to the step's CUDA graph launches.

The seed's fourth checklist item: a decode step has a fixed set of small pinned copies
(page table, sequence lengths, sampling parameters) issued before its graph replay. A copy
issued between two graph launches of one step sits at a graph break; a pageable one blocks
the host until it has been staged.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.attribution.steps import Steps

STEP_KEY = ["rank", "step"]
# Where the copy's launching call lies on the host, relative to the step's graph launches.
H2D_POSITIONS = ("before", "between", "after", "in_graph", "no_graph", "unknown")

H2D_SCHEMA = {
    "rank": pl.Int64, "step": pl.Int64, "pid": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
    "start": pl.Int64, "end": pl.Int64, "bytes": pl.Int64, "memory": pl.Utf8, "position": pl.Utf8,
}


def step_h2d_copies(steps: Steps) -> pl.DataFrame:
    """One row per host-to-device copy in a decode step (H2D_SCHEMA), in time order.

    `memory` is the source memory kind in lower case (`pinned`, `pageable`, ...); `position`
    one of H2D_POSITIONS: `in_graph` for a copy node replayed by a graph, `no_graph` in a
    step without graph launches (eager), `unknown` when its launching call is not in the trace.
    """
    copies = steps.activities.filter(
        pl.col("decode").fill_null(False) & (pl.col("activity") == "memcpy") & (pl.col("copy_kind") == "HtoD")
    )
    launches = (
        steps.api_calls.filter(pl.col("decode").fill_null(False) & (pl.col("kind") == "graph_launch"))
        .group_by(STEP_KEY)
        .agg(pl.col("start").min().alias("_first_launch"), pl.col("start").max().alias("_last_launch"))
    )
    placed = copies.join(launches, on=STEP_KEY, how="left")
    position = (
        pl.when(pl.col("graph_node_id").is_not_null()).then(pl.lit("in_graph"))
        .when(pl.col("_first_launch").is_null()).then(pl.lit("no_graph"))
        .when(pl.col("api_start").is_null()).then(pl.lit("unknown"))
        .when(pl.col("api_start") < pl.col("_first_launch")).then(pl.lit("before"))
        .when(pl.col("api_start") > pl.col("_last_launch")).then(pl.lit("after"))
        .otherwise(pl.lit("between"))
    )
    return placed.select(
        *STEP_KEY, "pid", "device", "stream", "start", "end", "bytes",
        pl.col("src_kind").str.to_lowercase().fill_null("unknown").alias("memory"),
        position.alias("position"),
    ).cast(H2D_SCHEMA).sort(*STEP_KEY, "start")


def h2d_positions_per_step(copies: pl.DataFrame) -> pl.DataFrame:
    """Per step: `h2d_<position>` counts (every position of H2D_POSITIONS, zeros included)."""
    return copies.group_by(STEP_KEY).agg(
        (pl.col("position") == position).sum().cast(pl.Int64).alias(f"h2d_{position}")
        for position in H2D_POSITIONS
    )


def describe_positions(copies: pl.DataFrame, failing: pl.DataFrame) -> str:
    """'3 before, 1 between the graph launches' for the copies of the failing steps, per step."""
    if failing.height == 0:
        return ""
    mine = copies.join(failing.select(STEP_KEY), on=STEP_KEY, how="semi")
    counts = dict(mine.group_by("position").agg(pl.len().alias("n")).iter_rows())
    words = {
        "before": "before the graph launch", "between": "between graph launches", "after": "after the graph launch",
        "in_graph": "inside the graph", "no_graph": "in a step without graph", "unknown": "of unknown position",
    }
    per_step = failing.height
    parts = [
        f"{_per_step(counts[position], per_step)} {words[position]}" for position in H2D_POSITIONS if position in counts
    ]
    return ", ".join(parts)


def _per_step(total: int, steps: int) -> str:
    mean = total / steps
    return f"{mean:g}" if mean == int(mean) else f"{mean:.1f}"
