"""Plan: the trace's steps, cut into windows of `window_steps` whole decode steps.

A window is numbered by decode step index: window w holds decode steps [w*N, (w+1)*N) of every
rank (ranks step in lockstep, so one window spans the same stretch of time on all of them). A
host window that is no decode step (prefill, warm-up, the incomplete tail) belongs to the
window of the decode step before it in its rank, or the first window when none precedes it.
An activity belongs to the window of its host window; one launched outside every host window
to the window of the activity before it in start order (the rows are in start order), so each
window owns a stretch of the timeline and nothing is owned twice.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.frames import left_join_keys

# Steps per window when the caller does not say. A graph-mode GLM decode step holds about
# 2,000 kernels and a check holds ~0.9 KB per kernel at its peak (docs/performance.md), so 256
# steps are ~0.5M kernels, ~0.45 GB per window; each window repeats ~40 polars queries
# (~2 s of fixed cost), so smaller windows cost time without buying memory the laptop needs.
DEFAULT_WINDOW_STEPS = 256
WHOLE_TRACE = 0  # window_steps=0: the whole trace is one window


@dataclass(frozen=True)
class WindowPlan:
    window_steps: int  # decode steps per window (WHOLE_TRACE: one window)
    count: int  # windows planned
    windows: pl.DataFrame  # Steps.windows + `part` (the window it belongs to), `window_id`, `first`, `last`
    part_of_row: pl.Series  # the window of every activity, in the activities' row order
    window_id_of_row: pl.Series  # the host window (`windows.window_id`) of every activity, or null
    reach: pl.Series  # the latest end of the activities up to each row (a running maximum)
    part_spans: pl.DataFrame  # part, first, last: the first start and last end of each window's activities


def plan_windows(steps: Steps, window_steps: int) -> WindowPlan:
    """The window of every host window and of every activity, and the spans a window's cut
    looks up (so that cutting a window reads only its own stretch of rows)."""
    parts = window_parts(steps, window_steps)
    activities = steps.activities
    if window_steps == WHOLE_TRACE or steps.decode.height == 0:
        part_of_row = pl.repeat(0, activities.height, dtype=pl.Int64, eager=True).alias("part")
        return WindowPlan(window_steps, 1, parts, part_of_row, pl.Series("window_id", [], pl.Int64),
                          pl.Series("reach", [], pl.Int64), pl.DataFrame())
    looked_up = left_join_keys(activities, parts.select("key", "window", "part", "window_id"), ["key", "window"])
    part_of_row = looked_up["part"].forward_fill().backward_fill().fill_null(0).alias("part")
    ends = activities["end"].fill_null(activities["start"])
    rows = pl.DataFrame({"part": part_of_row, "window_id": looked_up["window_id"], "start": activities["start"],
                         "end": ends})
    window_spans = rows.drop_nulls("window_id").group_by("window_id").agg(
        pl.col("start").min().alias("first"), pl.col("end").max().alias("last"))
    part_spans = rows.group_by("part").agg(pl.col("start").min().alias("first"), pl.col("end").max().alias("last"))
    return WindowPlan(
        window_steps=window_steps,
        count=int(parts["part"].max()) + 1,
        windows=parts.join(window_spans, on="window_id", how="left", maintain_order="left"),
        part_of_row=part_of_row,
        window_id_of_row=looked_up["window_id"],
        reach=ends.cum_max(),
        part_spans=part_spans,
    )


def window_parts(steps: Steps, window_steps: int) -> pl.DataFrame:
    """Steps.windows with `window_id` (its row in Steps.windows) and `part`, the window of
    steps it belongs to, ordered by rank and host start."""
    if window_steps < 0:
        raise ValueError(f"window_steps must be >= 0, not {window_steps}")
    windows = steps.windows.with_row_index("window_id").with_columns(pl.col("window_id").cast(pl.Int64))
    if window_steps == WHOLE_TRACE or steps.decode.height == 0:
        return windows.with_columns(pl.lit(0, pl.Int64).alias("part"))
    # decode windows by step index; the others follow the decode step before them in their rank
    by_step = pl.when(pl.col("decode")).then(pl.col("step") // window_steps)
    return (
        windows.sort("rank", "host_start", maintain_order=True)
        .with_columns(by_step.forward_fill().over("rank").alias("part"))
        .with_columns(pl.col("part").backward_fill().over("rank").fill_null(0).cast(pl.Int64))
    )
