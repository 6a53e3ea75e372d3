"""What a host thread did during a stretch of time: the split of a late launch's wait.

When the GPU went idle before the host even began the call that ended the idle time, the host
was late, and what its launching thread did in between is the reason. That time is split into
five parts (HOST_PARTS), each nanosecond in exactly one:

* ``sync``       inside a blocking synchronize call (cu*Synchronize / cuda*Synchronize)
* ``copy_call``  inside a memcpy call (a pageable or synchronous copy blocks the host)
* ``cuda_call``  inside any other CUDA call (cudaMalloc, cudaFree, launches of other work,
                 cudaStreamWaitEvent, ...)
* ``nvtx``       outside CUDA calls but inside one of the thread's NVTX ranges (the range is
                 named separately: the innermost one open at the middle of the thread's NVTX
                 time in the window)
* ``host``       none of these: plain host time the trace does not describe

Calls nest on a thread (a runtime call holds the driver calls it makes), so only outermost
calls count, each with its own part; NVTX ranges count by their union. Per thread, the time a
part holds before an instant x is a running total over those disjoint, sorted intervals, read
with one as-of lookup, so a window's share is the difference of two lookups: no interval join.
"""

from __future__ import annotations

from functools import cached_property

import polars as pl

from nsys_ledger.attribution.nvtx_projection import innermost_ranges, projectable_ranges

HOST_PARTS = ("sync", "copy_call", "cuda_call", "nvtx", "host")
CALL_PARTS = ("sync", "copy_call", "cuda_call")
SPLIT_COLUMNS = [f"host_{part}_ns" for part in HOST_PARTS]


class HostRecord:
    """The host side of a trace, ready for host_split. Built on first use: a trace with no gap
    (or none the host was late for) never sorts its calls."""

    def __init__(self, api_calls: pl.DataFrame, nvtx: pl.DataFrame):
        self._api_calls = api_calls
        self._nvtx = nvtx

    @cached_property
    def named_ranges(self) -> pl.DataFrame:
        """Projectable NVTX ranges (nvtx_projection), for the range's name."""
        return projectable_ranges(self._nvtx)

    @cached_property
    def ranges(self) -> pl.DataFrame:
        """Outermost NVTX ranges: global_tid, start, end, _before (running total)."""
        ranges = _outermost(self.named_ranges.select("global_tid", "start", "end"))
        return ranges.with_columns(_running_before(pl.col("end") - pl.col("start")).alias("_before"))

    @cached_property
    def calls(self) -> pl.DataFrame:
        """Outermost CUDA calls: global_tid, start, end, part, and the running totals."""
        calls = _outermost(
            self._api_calls.filter(pl.col("global_tid").is_not_null() & pl.col("start").is_not_null())
            .select("global_tid", "start", pl.max_horizontal("start", "end").alias("end"), call_part().alias("part"))
        )
        # the NVTX time inside each call, so that NVTX time outside calls can be told apart
        nvtx_at_start = _nvtx_before(self.ranges, calls.select("global_tid", pl.col("start").alias("x")))
        nvtx_at_end = _nvtx_before(self.ranges, calls.select("global_tid", pl.col("end").alias("x")))
        calls = calls.with_columns(nvtx_at_start.alias("_nvtx_at_start"),
                                   (nvtx_at_end - nvtx_at_start).alias("_in_nvtx"))
        length = pl.col("end") - pl.col("start")
        return calls.with_columns(
            *[_running_through(pl.when(pl.col("part") == part).then(length).otherwise(0)).alias(f"_through_{part}")
              for part in CALL_PARTS],
            _running_through(pl.col("_in_nvtx")).alias("_through_nvtx"),
        )


def call_part() -> pl.Expr:
    """The part (CALL_PARTS) an API call's time belongs to."""
    return (
        pl.when((pl.col("kind") == "sync") & pl.col("name").str.contains("Synchronize")).then(pl.lit("sync"))
        .when(pl.col("kind") == "memcpy").then(pl.lit("copy_call"))
        .otherwise(pl.lit("cuda_call"))
    )


def host_record(api_calls: pl.DataFrame, nvtx: pl.DataFrame) -> HostRecord:
    return HostRecord(api_calls, nvtx)


def host_split(windows: pl.DataFrame, record: HostRecord) -> pl.DataFrame:
    """`id`, SPLIT_COLUMNS and `nvtx_range` for each window (`id, global_tid, from, to`).

    `nvtx_range` is the thread's innermost NVTX range open at the middle of the window's NVTX
    time (null when it holds no NVTX time outside calls); the parts add up to `to - from`.
    """
    schema = {"id": pl.Int64, **{c: pl.Int64 for c in SPLIT_COLUMNS}, "nvtx_range": pl.Utf8}
    windows = windows.filter(pl.col("global_tid").is_not_null() & (pl.col("to") > pl.col("from")))
    if windows.height == 0:
        return pl.DataFrame(schema=schema)
    at_from = _held_before(record, windows.select("id", "global_tid", pl.col("from").alias("x")))
    at_to = _held_before(record, windows.select("id", "global_tid", pl.col("to").alias("x")))
    held = {part: at_to[part] - at_from[part] for part in (*CALL_PARTS, "nvtx_all", "nvtx_in_calls")}
    in_calls = sum(held[part] for part in CALL_PARTS)
    nvtx_only = held["nvtx_all"] - held["nvtx_in_calls"]
    split = windows.select(
        pl.col("id").cast(pl.Int64),
        *[held[part].alias(f"host_{part}_ns") for part in CALL_PARTS],
        nvtx_only.alias("host_nvtx_ns"),
        (pl.col("to") - pl.col("from") - in_calls - nvtx_only).alias("host_host_ns"),
    )
    # only windows with NVTX time outside calls need a range's name (an eager trace has a gap
    # per launch); it is named at the middle of the thread's NVTX time in the window
    middle = windows.select(
        "id", "global_tid", (at_from["nvtx_all"] + (held["nvtx_all"] + 1) // 2).alias("_target"),
    ).filter(nvtx_only > 0)
    return split.join(_range_names(middle, record), on="id", how="left").select(list(schema)).cast(schema)


def _outermost(intervals: pl.DataFrame) -> pl.DataFrame:
    """The intervals no earlier one of the same thread covers, sorted by thread and start.
    (An interval that starts inside another is taken for nested in it.)"""
    ordered = intervals.sort("global_tid", "start", pl.col("end"), descending=[False, False, True])
    reached = pl.col("end").cum_max().shift(1).over("global_tid")
    return ordered.filter(reached.is_null() | (pl.col("start") >= reached))


def _running_through(value: pl.Expr) -> pl.Expr:
    """Running total of `value` per thread, this interval included (rows in thread, start order)."""
    return value.cum_sum().over("global_tid")


def _running_before(value: pl.Expr) -> pl.Expr:
    return _running_through(value) - value


def _nvtx_before(ranges: pl.DataFrame, probes: pl.DataFrame) -> pl.Series:
    """NVTX time of the thread (union of its ranges) before `x`, for each probe (in its order)."""
    if probes.height == 0:
        return pl.Series([], dtype=pl.Int64)
    found = _last_started(probes.with_row_index("_order"), ranges.select("global_tid", "start", "end", "_before"))
    return found.select(
        (pl.col("_before") + (pl.min_horizontal("end", "x") - pl.col("start")).clip(lower_bound=0)).fill_null(0)
    ).to_series().cast(pl.Int64)


def _last_started(probes: pl.DataFrame, intervals: pl.DataFrame) -> pl.DataFrame:
    """Each probe (`_order, global_tid, x`) with the thread's last interval starting at or
    before x; back in the probes' order."""
    found = probes.sort("x").join_asof(
        intervals.sort("start"), left_on="x", right_on="start", by="global_tid", strategy="backward",
        check_sortedness=False,
    )
    return found.sort("_order")


def _held_before(record: HostRecord, probes: pl.DataFrame) -> dict[str, pl.Series]:
    """Per part, the thread's time in that part before each probe's `x` (in the probes' order):
    the call parts, all NVTX time (`nvtx_all`) and the NVTX time inside calls (`nvtx_in_calls`)."""
    nvtx_at_x = _nvtx_before(record.ranges, probes)
    found = _last_started(probes.with_row_index("_order").with_columns(nvtx_at_x.alias("_nvtx_x")), record.calls)
    # the last call that started at or before x counts only up to x
    over = (pl.col("end") - pl.col("x")).clip(lower_bound=0)
    held = {
        part: found.select((pl.col(f"_through_{part}") - pl.when(pl.col("part") == part).then(over).otherwise(0))
                           .fill_null(0)).to_series()
        for part in CALL_PARTS
    }
    nvtx_after_x = pl.col("_in_nvtx") - (pl.col("_nvtx_x") - pl.col("_nvtx_at_start"))
    held["nvtx_in_calls"] = found.select(
        (pl.col("_through_nvtx") - pl.when(pl.col("end") > pl.col("x")).then(nvtx_after_x).otherwise(0)).fill_null(0)
    ).to_series()
    held["nvtx_all"] = nvtx_at_x
    return held


def _range_names(middle: pl.DataFrame, record: HostRecord) -> pl.DataFrame:
    """`id, nvtx_range` for each window (`id, global_tid, _target`): the innermost range open
    at the instant the thread's NVTX time reaches `_target` (a running total of ranges.`_before`):
    the middle of the NVTX time the window holds."""
    if middle.height == 0 or record.named_ranges.height == 0:
        return pl.DataFrame(schema={"id": pl.Int64, "nvtx_range": pl.Utf8})
    # the outermost range holding that instant: the last whose running total before it is short
    # of the target
    holding = middle.sort("_target").join_asof(
        record.ranges.sort("_before"), left_on="_target", right_on="_before", by="global_tid", strategy="backward",
        allow_exact_matches=False, check_sortedness=False,
    ).filter(pl.col("start").is_not_null())
    instants = holding.select(
        "id", "global_tid",
        (pl.col("start") + pl.col("_target") - pl.col("_before") - 1).clip(pl.col("start"), pl.col("end") - 1)
        .alias("_at"),
    ).with_columns((pl.col("_at") + 1).alias("_at_end"))
    found = innermost_ranges(instants, record.named_ranges, id_col="id", start_col="_at", end_col="_at_end")
    return found.select(pl.col("call").alias("id"), pl.col("qualified_name").alias("nvtx_range"))
