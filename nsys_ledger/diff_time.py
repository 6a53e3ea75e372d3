"""The time half of `nsys-ledger diff`: GPU time per op and per layer, BEFORE against AFTER.

Per-step figures are medians over the decode steps (an op or layer absent from a step counts
0 there), in µs. Timing is noisy, so a change is listed only beyond a tolerance (a percentage
of BEFORE, and at least MIN_CHANGE_US), and it makes AFTER worse only when a slowdown limit is
given, as for the step time.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.api import Result

STEP_KEY = ["rank", "step"]
MIN_CHANGE_US = 1.0  # below this a change is jitter, whatever its percentage
SLOWER = "slower than {pct:g}%"


def median_time_per_step(result: Result, column: str) -> pl.DataFrame | None:
    """`<column>, us`: median GPU time per decode step of each op (`column="op"`) or layer
    (`"layer"`), zeros for steps without it; None when the result has no time use."""
    use = result.time_use
    if use is None or use.steps.height == 0:
        return None
    frame = use.ops if column == "op" else use.layers
    values = frame.select(column).unique()
    grid = use.steps.select(STEP_KEY).join(values, how="cross")
    filled = grid.join(frame.select(*STEP_KEY, column, "kernel_ns"), on=[*STEP_KEY, column], how="left")
    return filled.group_by(column).agg(
        (pl.col("kernel_ns").fill_null(0).median() / 1000).alias("us")
    ).sort(column)


def time_changes(
    before: Result, after: Result, column: str, *, tolerance_pct: float, slowdown_pct: float | None
) -> tuple[tuple[str, float, float, str | None], ...] | None:
    """`(value, before_us, after_us, worse_by)` for each op or layer whose median time per step
    moved by more than `tolerance_pct` % of BEFORE and MIN_CHANGE_US (new and vanished ones
    included), in `column` order; `worse_by` set when it rose by more than `slowdown_pct` %.
    None when either result has no time use (or, for layers, no layers)."""
    b, a = median_time_per_step(before, column), median_time_per_step(after, column)
    if b is None or a is None or (column == "layer" and (b.height == 0 or a.height == 0)):
        return None
    joined = b.join(a, on=column, how="full", coalesce=True, suffix="_after").with_columns(
        pl.col("us").fill_null(0.0), pl.col("us_after").fill_null(0.0)
    ).sort(column)
    changes = []
    for value, before_us, after_us in joined.iter_rows():
        change = after_us - before_us
        if abs(change) < MIN_CHANGE_US or (before_us and abs(100 * change / before_us) <= tolerance_pct):
            continue
        rose = slowdown_pct is not None and change > 0 and (not before_us or 100 * change / before_us > slowdown_pct)
        changes.append((str(value), round(before_us, 3), round(after_us, 3),
                        SLOWER.format(pct=slowdown_pct) if rose else None))
    return tuple(changes)
