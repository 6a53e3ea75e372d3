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
    windows: pl.DataFrame  # Steps.windows + `part`: the window each host window belongs to
    part_of_row: pl.Series  # the window of every activity, in the activities' row order


def plan_windows(steps: Steps, window_steps: int) -> WindowPlan:
    """The window of every host window and of every activity."""
    if window_steps < 0:
        raise ValueError(f"window_steps must be >= 0, not {window_steps}")
    windows = steps.windows
    rows = steps.activities.height
    if window_steps == WHOLE_TRACE or steps.decode.height == 0:
        parts = windows.with_columns(pl.lit(0, pl.Int64).alias("part"))
        return WindowPlan(window_steps, 1, parts, pl.repeat(0, rows, dtype=pl.Int64, eager=True).alias("part"))
    # decode windows by step index; the others follow the decode step before them in their rank
    by_step = pl.when(pl.col("decode")).then(pl.col("step") // window_steps)
    parts = (
        windows.sort("rank", "host_start", maintain_order=True)
        .with_columns(by_step.forward_fill().over("rank").alias("part"))
        .with_columns(pl.col("part").backward_fill().over("rank").fill_null(0).cast(pl.Int64))
    )
    looked_up = left_join_keys(steps.activities, parts.select("key", "window", "part"), ["key", "window"])
    part_of_row = looked_up["part"].forward_fill().backward_fill().fill_null(0).alias("part")
    count = int(parts["part"].max()) + 1
    return WindowPlan(window_steps, count, parts, part_of_row)
