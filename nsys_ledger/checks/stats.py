"""Per-step figures, computed for all steps at once: counts, copies, submissions, gaps.

Input is the `Steps` of attribution (activities and API calls carrying `rank, step`); output
are plain frames keyed by `(rank, step)` that the ledger checks and the reports read.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.frames import group_agg

SUBMISSION_KINDS = ["kernel_launch", "graph_launch", "memcpy", "memset"]
STEP_KEY = ["rank", "step"]


def _decode_activities(steps: Steps) -> pl.LazyFrame:
    """Lazy, so that only the columns an aggregation reads are filtered (not all of them)."""
    return steps.activities.lazy().filter(pl.col("decode").fill_null(False))


def step_table(steps: Steps, gaps: pl.DataFrame) -> pl.DataFrame:
    """One row per decode step: where it ran and what it submitted and executed."""
    activities = _decode_activities(steps)
    windows = steps.decode.select(*STEP_KEY, "pid", "host_start", "host_end", "label")
    gpu = group_agg(
        activities, STEP_KEY,
        pl.col("device").mode().first().alias("device"),
        pl.col("start").min().alias("gpu_start"),
        pl.col("end").max().alias("gpu_end"),
        (pl.col("activity") == "kernel").sum().cast(pl.Int64).alias("kernels"),
        pl.when(pl.col("activity") == "kernel").then(pl.col("end") - pl.col("start")).sum().cast(pl.Int64)
        .alias("kernel_ns"),
        _is_h2d().sum().cast(pl.Int64).alias("h2d"),
        (_is_h2d() & (pl.col("src_kind") == "Pageable")).sum().cast(pl.Int64).alias("h2d_pageable"),
        pl.col("bytes").filter(_is_h2d()).sum().cast(pl.Int64).alias("h2d_bytes"),
        pl.col("bytes").filter(_is_h2d()).max().cast(pl.Int64).alias("h2d_max_bytes"),
    )
    calls = (
        steps.api_calls.filter(pl.col("decode").fill_null(False))
        .group_by(STEP_KEY)
        .agg(
            pl.col("kind").is_in(SUBMISSION_KINDS).sum().cast(pl.Int64).alias("cpu_submissions"),
            (pl.col("kind") == "graph_launch").sum().cast(pl.Int64).alias("graph_launches"),
        )
    )
    # the allowed step-entry launch gaps are counted apart: they are the price of the launch
    findings = ~pl.col("step_entry")
    gap_totals = gaps.group_by(STEP_KEY).agg(
        findings.sum().cast(pl.Int64).alias("gaps"),
        pl.col("duration").filter(findings).sum().cast(pl.Int64).alias("gap_ns"),
        pl.col("step_entry").sum().cast(pl.Int64).alias("step_entry_gaps"),
        pl.col("duration").filter(pl.col("step_entry")).sum().cast(pl.Int64).alias("step_entry_gap_ns"),
    )
    return (
        windows.join(gpu, on=STEP_KEY, how="left")
        .join(calls, on=STEP_KEY, how="left")
        .join(gap_totals, on=STEP_KEY, how="left")
        .with_columns(
            pl.col(c).fill_null(0)
            for c in ["kernels", "kernel_ns", "h2d", "h2d_pageable", "h2d_bytes", "cpu_submissions",
                      "graph_launches", "gaps", "gap_ns", "step_entry_gaps", "step_entry_gap_ns"]
        )
        .with_columns((pl.col("gpu_end") - pl.col("gpu_start")).alias("duration_ns"))
        .sort(STEP_KEY)
    )


def _is_h2d() -> pl.Expr:
    return (pl.col("activity") == "memcpy") & (pl.col("copy_kind") == "HtoD")


def op_counts(steps: Steps, ops: list[str]) -> pl.DataFrame:
    """Kernels per step and op, wide: one column per op (zero when absent), plus `other`."""
    kernels = _decode_activities(steps).filter(pl.col("activity") == "kernel")
    decode_steps = steps.decode.select(STEP_KEY)
    long = kernels.group_by(*STEP_KEY, "op").agg(pl.len().cast(pl.Int64).alias("count")).collect()
    wide = long.pivot(on="op", index=STEP_KEY, values="count") if long.height else decode_steps
    result = decode_steps.join(wide, on=STEP_KEY, how="left")
    missing = [op for op in [*ops, "other"] if op not in result.columns]
    result = result.with_columns(pl.lit(0, pl.Int64).alias(op) for op in missing)
    # columns in the ledger's op order: a pivot orders them by first appearance, which a
    # parallel group_by does not keep from run to run
    columns = [*ops, "other"]
    return result.select(*STEP_KEY, *(pl.col(op).fill_null(0) for op in columns)).sort(STEP_KEY)
