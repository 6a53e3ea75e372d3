"""GPU activities (kernels, copies, memsets) joined to the host call that launched them.

Everything downstream (steps, gaps, H2D) looks at one frame: each GPU activity with its
launching API call's host start time and thread. The join is nsys's own:
`activity.correlationId = call.correlationId` within the same process.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.frames import packed_key
from nsys_ledger.trace.model import Trace

ACTIVITY_COLUMNS = [
    "activity",  # "kernel", "memcpy" or "memset"
    "start",
    "end",
    "device",
    "stream",
    "pid",
    "correlation",
    "name",
    "graph_node_id",
    "bytes",
    "copy_kind",
    "src_kind",
]


def gpu_activities(trace: Trace) -> pl.DataFrame:
    """All GPU activities in one frame, sorted by start, with `row` as a stable id."""
    stacked = [activity_rows(kind, getattr(trace, kind)) for kind in STACKING_ORDER]
    return pl.concat(stacked, how="vertical").sort("start", maintain_order=True).with_row_index("row")


# Among activities that start at the same time, kernels come first, then copies, then memsets,
# each in the order of its table: `row` numbers them in start order, then this order.
STACKING_ORDER = ("kernels", "memcpys", "memsets")


def activity_rows(kind: str, frame: pl.DataFrame) -> pl.DataFrame:
    """The rows of one of the Trace's activity frames (`kind`: "kernels", "memcpys" or
    "memsets") with ACTIVITY_COLUMNS."""
    if kind == "kernels":
        return frame.select(
            pl.lit("kernel").alias("activity"),
            "start", "end", "device", "stream", "pid", "correlation", "name", "graph_node_id",
            pl.lit(None, pl.Int64).alias("bytes"),
            pl.lit(None, pl.Utf8).alias("copy_kind"),
            pl.lit(None, pl.Utf8).alias("src_kind"),
        )
    if kind == "memcpys":
        return frame.select(
            pl.lit("memcpy").alias("activity"),
            "start", "end", "device", "stream", "pid", "correlation",
            pl.concat_str(pl.lit("memcpy "), pl.col("copy_kind")).alias("name"),
            "graph_node_id", "bytes", "copy_kind", "src_kind",
        )
    if kind == "memsets":
        return frame.select(
            pl.lit("memset").alias("activity"),
            "start", "end", "device", "stream", "pid", "correlation",
            pl.lit("memset").alias("name"),
            "graph_node_id", "bytes",
            pl.lit(None, pl.Utf8).alias("copy_kind"),
            pl.lit(None, pl.Utf8).alias("src_kind"),
        )
    raise ValueError(f"not an activity frame: {kind!r}")


def with_launch_calls(activities: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """Add the launching call's `api_start`, `api_end`, `api_tid`, `api_kind` (null if none).

    One graph launch fans out to every node of the replay; the join keeps that (many
    activities, one call). Correlation ids are unique per process for launch-like calls.
    Only the join keys go through the join and the four new columns are appended, so the
    activities keep their order and their columns are shared, not copied (millions of rows).
    """
    calls = api_calls.filter(pl.col("correlation").is_not_null()).select(
        "pid",
        "correlation",
        pl.col("start").alias("api_start"),
        pl.col("end").alias("api_end"),
        pl.col("global_tid").alias("api_tid"),
        pl.col("kind").alias("api_kind"),
    )
    # one packed integer key when the pair fits: it joins and deduplicates about twice as fast
    # (eager decode has a launch call per kernel: 1M x 1M rows, 1.5 s -> 0.7 s of CPU)
    packed = packed_key([activities, calls], ["pid", "correlation"])
    keys: list[str | pl.Expr] = ["pid", "correlation"] if packed is None else [packed.alias("_launch")]
    calls = calls.select(*keys, "api_start", "api_end", "api_tid", "api_kind")
    key_names = calls.columns[: len(keys)]
    if packed is not None:
        found = _launches_by_position(activities.select(packed.alias("_launch")).to_series(), calls)
        if found is not None:
            return activities.hstack(found)
    launches = activities.select(*keys).join(
        calls.unique(subset=key_names, keep="first"), on=key_names, how="left", maintain_order="left"
    )
    return activities.hstack(launches.drop(key_names))


def _launches_by_position(wanted: pl.Series, calls: pl.DataFrame) -> pl.DataFrame | None:
    """The call columns (all but `_launch`) for each key of `wanted` (null where no call has
    it), looked up in an array indexed by the packed key instead of joined: what the left join
    on `_launch` gives when the calls' keys are distinct, in a fraction of its time (eager
    decode: a million activities against a million calls, 0.3 s -> 0.05 s of CPU). None when
    keys repeat (the join keeps the first) or spread too thinly for an array."""
    have = calls["_launch"]
    if calls.height == 0 or wanted.len() == 0 or have.n_unique() != calls.height:
        return None
    low = min(int(have.min()), int(wanted.min()))
    span = max(int(have.max()), int(wanted.max())) - low + 1
    if span > 4 * (calls.height + wanted.len()) + 1024:
        return None
    at_key = pl.repeat(None, span, dtype=pl.UInt32, eager=True).scatter(
        have - low, pl.int_range(calls.height, dtype=pl.UInt32, eager=True)
    )
    position = at_key.gather(wanted - low)
    return calls.drop("_launch").select(pl.all().gather(position))
