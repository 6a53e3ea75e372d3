"""The seed's step time budget, T_step ≈ Σ t_i + N·g + C_comm + T_host, measured per step.

Every nanosecond of a step's GPU span on its device falls in exactly one term, so the terms
add up to the step time:

* ``busy_ns``         Σ t_i: some non-collective kernel, copy or memset runs
* ``small_gap_ns``    N·g: idle intervals up to the gap threshold (``small_gaps`` = N), the
                      node-to-node latency of a graph or the launch latency of eager work
* ``collective_ns``   C_comm: only collectives run, plus the gaps caused by collectives
* ``host_ns``         T_host: gaps (above the threshold) whose cause is on the host side (the
                      launching thread was late: ``sync``, ``copy_call``, ``cuda_call``,
                      ``nvtx``, ``host``) or launch latency (``launch``: the wait for
                      cudaGraphLaunch at the step entry, ``kernel_launch``)
* ``other_gap_ns``    gaps the device side caused, other than collectives (``graph_boundary``,
                      ``event_wait``, ``copy``, ``unknown``)
* ``overhead_ns``     profiler overhead and the idle time around it (not the program's time)

Gap counts and totals per cause are kept as well (``gaps_<cause>``, ``gap_ns_<cause>``), and
``bound`` names the term that takes the most time: ``gpu`` (busy), ``host``, ``collective``,
``launch`` (N·g) or ``other`` (other gaps). Eager decode is host-bound: the GPU waits for the
launches longer than it computes.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.checks.gaps import DEVICE_CAUSES, DEVICE_KEY, GAP_CAUSES, LAUNCH_CAUSES
from nsys_ledger.checks.host_time import HOST_PARTS

BUDGET_KEY = ["rank", "step", "device"]
HOST_CAUSES = (*HOST_PARTS, *LAUNCH_CAUSES)  # the GPU waited for the CPU (a launch is host time too)
COLLECTIVE_CAUSES = ("collective",)
OTHER_CAUSES = tuple(c for c in DEVICE_CAUSES if c not in COLLECTIVE_CAUSES)
BUDGET_COLUMNS = ["step_ns", "busy_ns", "small_gaps", "small_gap_ns", "collective_ns", "host_ns",
                  "other_gap_ns", "overhead_ns"]
CAUSE_COLUMNS = [f"gaps_{c}" for c in GAP_CAUSES] + [f"gap_ns_{c}" for c in GAP_CAUSES]
# budget term -> `bound` label; on a tie the earlier term wins
BOUND_TERMS = {"busy_ns": "gpu", "host_ns": "host", "collective_ns": "collective", "small_gap_ns": "launch",
               "other_gap_ns": "other"}


# running totals along each device timeline: what a span [t0, t1] holds is total(t1) - total(t0)
_RUNNING = ["_busy", "_collective_only", "_overhead", "_small_gaps", "_small_gap_ns", "_all"]


def step_budget(segments: pl.DataFrame, spans: pl.DataFrame, gaps: pl.DataFrame, threshold_ns: int) -> pl.DataFrame:
    """One row per (rank, step, device) with BUDGET_COLUMNS and CAUSE_COLUMNS.

    `segments` is the device-wide sweep (gaps.timeline_segments, in its order: per device,
    tiling its timeline), `spans` the step spans, `gaps` the device-wide gaps above
    `threshold_ns` with their causes. Span ends are activity boundaries, hence segment ends,
    so each term is the difference of a running total at the two ends of the span: a binary
    search per step, no per-segment assignment.
    """
    shares = pl.concat(
        [_device_shares(device_segments, device_spans, threshold_ns)
         for device_segments, device_spans in _per_device(segments, spans)],
        how="vertical",
    ) if spans.height else pl.DataFrame(schema={**{c: pl.Int64 for c in BUDGET_KEY}, **{c: pl.Int64 for c in _RUNNING}})
    budget = shares.join(gaps_by_cause(gaps), on=BUDGET_KEY, how="left").with_columns(
        pl.col(c).fill_null(0) for c in CAUSE_COLUMNS
    )
    return budget.select(
        *BUDGET_KEY,
        pl.col("_all").alias("step_ns"),
        pl.col("_busy").alias("busy_ns"),
        pl.col("_small_gaps").alias("small_gaps"),
        pl.col("_small_gap_ns").alias("small_gap_ns"),
        (pl.col("_collective_only") + _cause_sum(COLLECTIVE_CAUSES)).alias("collective_ns"),
        _cause_sum(HOST_CAUSES).alias("host_ns"),
        _cause_sum(OTHER_CAUSES).alias("other_gap_ns"),
        pl.col("_overhead").alias("overhead_ns"),
        *CAUSE_COLUMNS,
    ).cast({c: pl.Int64 for c in [*BUDGET_COLUMNS, *CAUSE_COLUMNS]}).with_columns(
        bound_expr().alias("bound")
    ).sort(BUDGET_KEY)


def _per_device(segments: pl.DataFrame, spans: pl.DataFrame):
    """(segments, spans) of each device that has spans; segments are contiguous per device."""
    first_of_device = pl.any_horizontal(pl.col(k) != pl.col(k).shift(1) for k in DEVICE_KEY).fill_null(True)
    bounds = segments.select(*DEVICE_KEY).with_row_index("_at").filter(first_of_device)
    ends = [*bounds["_at"].to_list()[1:], segments.height]
    for (at, pid, device), end in zip(bounds.iter_rows(), ends):
        device_spans = spans.filter((pl.col("pid") == pid) & (pl.col("device") == device))
        if device_spans.height:
            yield segments.slice(at, end - at), device_spans


def _device_shares(segments: pl.DataFrame, spans: pl.DataFrame, threshold_ns: int) -> pl.DataFrame:
    """Budget terms (_RUNNING) of each span of one device."""
    length = pl.col("seg_end") - pl.col("seg_start")
    small = (pl.col("kind") == "idle") & (length <= threshold_ns)
    running = {
        "_busy": pl.when(pl.col("kind") == "busy").then(length).otherwise(0),
        "_collective_only": pl.when(pl.col("kind") == "collective").then(length).otherwise(0),
        "_overhead": pl.when(pl.col("kind") == "overhead").then(length).otherwise(0),
        "_small_gaps": small.cast(pl.Int64),
        "_small_gap_ns": pl.when(small).then(length).otherwise(0),
        "_all": length,
    }
    # the segments ending at or before a span's start and end: a span end is a segment end
    # (or the start of the device's timeline, where none has ended: totals 0). Row k - 1 of a
    # running total holds the total over the first k segments, gathered at a null index for k = 0
    seg_end = segments["seg_end"]

    def last_ended(times: pl.Series) -> pl.Series:
        ended = seg_end.search_sorted(times, side="right").cast(pl.Int64)
        return pl.select(pl.when(ended > 0).then(ended - 1)).to_series()

    at_start, at_end = last_ended(spans["gpu_start"]), last_ended(spans["gpu_end"])
    shares = spans.select(BUDGET_KEY)
    for name, term in running.items():
        # one running total at a time (a column per segment, two segments per activity), read
        # at the span ends and dropped, instead of six held together
        total = segments.select(term.cum_sum().alias(name)).to_series()
        shares = shares.with_columns(
            (total.gather(at_end).fill_null(0) - total.gather(at_start).fill_null(0)).alias(name)
        )
        del total
    return shares


def bound_expr() -> pl.Expr:
    """The label of the largest budget term (BOUND_TERMS)."""
    largest = pl.max_horizontal(*BOUND_TERMS)
    label = pl.when(largest.fill_null(0) == 0).then(pl.lit(None, pl.Utf8)).when(pl.col("busy_ns") == largest).then(
        pl.lit("gpu")
    )
    for column, name in list(BOUND_TERMS.items())[1:]:
        label = label.when(pl.col(column) == largest).then(pl.lit(name))
    return label.otherwise(None)


def _cause_sum(causes: tuple[str, ...]) -> pl.Expr:
    return pl.sum_horizontal(pl.col(f"gap_ns_{c}") for c in causes)


def gaps_by_cause(gaps: pl.DataFrame) -> pl.DataFrame:
    """Gap count and total per cause, wide: `rank, step, device, gaps_<cause>, gap_ns_<cause>`."""
    aggregations = []
    for cause in GAP_CAUSES:
        mine = pl.col("cause") == cause
        aggregations.append(mine.sum().cast(pl.Int64).alias(f"gaps_{cause}"))
        aggregations.append(pl.col("duration").filter(mine).sum().cast(pl.Int64).alias(f"gap_ns_{cause}"))
    return gaps.group_by(BUDGET_KEY).agg(aggregations)
