"""CUDA graph replays inside each decode step, and where a split decode graph breaks.

In a `--cuda-graph-trace=node` capture every node of one replay is a GPU row sharing the
correlation id of its `cudaGraphLaunch`, so a replay is a (process, correlation) group of
graph-node rows. A decode step that should be one replay (three with MTP) but takes more is
a graph break; its position is where one replay ends and the next begins: the last kernel
of the earlier replay and the first kernel of the later one, by op and (when layers are
known) layer, and the index of that first kernel among the step's kernels.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.checks.ledger import short_kernel_name
from nsys_ledger.frames import group_agg

STEP_KEY = ["rank", "step"]

BREAK_SCHEMA = {
    "rank": pl.Int64, "step": pl.Int64, "replay": pl.Int64, "kernel_index": pl.Int64,
    "before": pl.Utf8, "before_op": pl.Utf8, "before_layer": pl.Int64,
    "after": pl.Utf8, "after_op": pl.Utf8, "after_layer": pl.Int64, "boundary_ns": pl.Int64,
    "before_row": pl.UInt32, "after_row": pl.UInt32,  # the boundary kernels' `row` ids
}


def step_replays(decode_activities: pl.DataFrame) -> pl.DataFrame:
    """One row per graph replay in a decode step, in time order within the step.

    Columns: rank, step, pid, correlation, replay (0-based), start, end, kernels, and the row
    ids of its first kernel (earliest start) and of its last (latest end).
    """
    nodes = decode_activities.lazy().filter((pl.col("activity") == "kernel") & pl.col("graph_node_id").is_not_null())
    replays = group_agg(
        nodes, [*STEP_KEY, "pid", "correlation"],
        pl.col("start").min().alias("start"),
        pl.col("end").max().alias("end"),
        pl.len().cast(pl.Int64).alias("kernels"),
        pl.col("row").get(pl.col("start").arg_min()).alias("first_row"),
        pl.col("row").get(pl.col("end").arg_max()).alias("last_row"),
    )
    return replays.sort(*STEP_KEY, "start").with_columns(
        pl.int_range(pl.len()).over(STEP_KEY).cast(pl.Int64).alias("replay")
    )


def graph_breaks(replays: pl.DataFrame, decode_activities: pl.DataFrame | pl.LazyFrame) -> pl.DataFrame:
    """Each boundary between consecutive replays of one step (BREAK_SCHEMA).

    `replay` is the index of the later replay; `boundary_ns` the device time from the end of
    the earlier replay to the start of the later one (negative if they overlap). Only the
    (few) steps that have a break are looked at kernel by kernel, so `decode_activities` may
    be a lazy filter of all activities: just those steps' rows are gathered.
    """
    paired = replays.with_columns(
        pl.col("last_row").shift(1).over(STEP_KEY).alias("before_row"),
        pl.col("end").shift(1).over(STEP_KEY).alias("_previous_end"),
    ).filter(pl.col("replay") > 0)
    if paired.height == 0:
        return pl.DataFrame(schema=BREAK_SCHEMA)
    candidates = decode_activities.lazy()
    columns = candidates.collect_schema().names()
    kernels = (
        candidates.filter(pl.col("activity") == "kernel")
        .join(paired.lazy().select(STEP_KEY).unique(), on=STEP_KEY, how="semi")
        .select(*STEP_KEY, "row", "start", "name", *[c for c in ("op", "layer") if c in columns])
        .collect()
    )
    index = kernels.sort(*STEP_KEY, "start").select(
        pl.col("row").alias("after_row"), pl.int_range(pl.len()).over(STEP_KEY).cast(pl.Int64).alias("kernel_index")
    )
    op = pl.col("op") if "op" in kernels.columns else pl.lit(None, pl.Utf8)
    layer = pl.col("layer").cast(pl.Int64) if "layer" in kernels.columns else pl.lit(None, pl.Int64)
    described = kernels.select("row", "name", op.alias("op"), layer.alias("layer"))
    before = described.rename({"row": "before_row", "name": "before", "op": "before_op", "layer": "before_layer"})
    after = described.rename({"row": "after_row", "name": "after", "op": "after_op", "layer": "after_layer"})
    return (
        paired.rename({"first_row": "after_row"})
        .join(before, on="before_row", how="left")
        .join(after, on="after_row", how="left")
        .join(index, on="after_row", how="left")
        .with_columns((pl.col("start") - pl.col("_previous_end")).alias("boundary_ns"))
        .select(list(BREAK_SCHEMA))
        .cast(BREAK_SCHEMA)
        .sort(*STEP_KEY, "replay")
    )


def describe_break(breaks: pl.DataFrame, failing: pl.DataFrame) -> str:
    """The most common break position among the failing steps, in words."""
    mine = breaks.join(failing.select(STEP_KEY), on=STEP_KEY, how="semi")
    if mine.height == 0:
        return "no replay boundary found among the kernels (graph nodes not traced?)"
    common = (
        mine.group_by("replay", "before_op", "before_layer", "after_op", "after_layer", "kernel_index")
        .agg(pl.len().alias("n"), pl.col("before").first(), pl.col("after").first())
        .sort("n", "replay", descending=[True, False])
    )
    parts = []
    for row in common.head(3).iter_rows(named=True):
        first = activity_text(row["after_op"], row["after_layer"], row["after"])
        last_before = activity_text(row["before_op"], row["before_layer"], row["before"])
        parts.append(f"replay {row['replay'] + 1} starts at {first} (kernel {row['kernel_index']} of the step), "
                     f"after {last_before}, in {row['n']} step(s)")
    return "; ".join(parts)


def activity_text(op: str | None, layer: int | None, name: str | None) -> str:
    """'layer 39 fused_add_rmsnorm', or the op (else the short kernel name) without a layer."""
    what = op if op and op != "other" else short_kernel_name(name)
    return f"layer {layer} {what}" if layer is not None else what
