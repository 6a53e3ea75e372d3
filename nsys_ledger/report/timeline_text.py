"""Terminal lines for the timeline checks: the step time budget, gaps by cause, H2D copies,
graph breaks, per-stream gaps and the rank comparison."""

from __future__ import annotations

import click
import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.h2d import H2D_POSITIONS
from nsys_ledger.checks.timeline import describe_causes

MAX_ROWS = 12


def timeline_lines(result: Result, table_lines) -> list[str]:
    """`table_lines(rows)` formats rows of cells like the rest of the terminal output."""
    timeline = result.timeline
    table = result.step_table
    if timeline is None:
        return []
    if table.height == 0:
        return _no_step_gaps(result)
    lines = _budget(table, table_lines, result.gap_threshold_ns)
    lines += _gap_summary(timeline.gaps, timeline.threshold_ns, "gaps    ")
    if timeline.stream_gaps is not None:
        lines += _stream_gaps(timeline.stream_gaps, timeline.threshold_ns)
    lines += _h2d_summary(timeline.h2d, table)
    if result.ranks is not None:
        lines += ["", *_ranks(result, table_lines)]
    return lines


def _budget(table: pl.DataFrame, table_lines, threshold_ns: int) -> list[str]:
    multi_rank = table["rank"].n_unique() > 1
    header = ("rank",) * multi_rank + (
        "step", "T_step", "busy Σt", "N", "N·g", "C_comm", "T_host", "other gaps", "overhead", "bound"
    )
    rows = [header]
    for row in table.head(MAX_ROWS).iter_rows(named=True):
        rows.append((str(row["rank"]),) * multi_rank + (
            str(row["step"]), _us(row["step_ns"]), _us(row["busy_ns"]), f"{row['small_gaps']:,}",
            _us(row["small_gap_ns"]), _us(row["collective_ns"]), _us(row["host_ns"]), _us(row["other_gap_ns"]),
            _us(row["overhead_ns"]), f"{row['bound']}-bound" if row["bound"] else "-",
        ))
    lines = [
        f"step time budget (us): T_step = busy Σt + N·g (gaps up to {threshold_ns / 1000:g} us) + C_comm "
        "(collectives) + T_host (host-side and launch gaps) + other gaps",
        *table_lines(rows, keys=1 + multi_rank),
    ]
    if table.height > MAX_ROWS:
        lines.append(f"... {table.height - MAX_ROWS} more steps (all of them in --json)")
    bounds = table.group_by("bound").agg(pl.len()).sort("len", "bound", descending=[True, False])
    lines.append("bound   " + ", ".join(
        f"{n} of {table.height} steps {bound}-bound" for bound, n in bounds.iter_rows() if bound
    ) + " (the largest term of the budget)")
    return lines


def _no_step_gaps(result: Result) -> list[str]:
    """Gaps are measured inside decode steps only: say so, and how to get them anyway."""
    if result.steps.method == "capture":
        return ["gaps    none measured: the capture holds no GPU activity"]
    return ["gaps    none measured: no decode step (gaps are measured inside decode steps)",
            "        --step-method capture takes the whole capture of each process as one step"]


def _gap_summary(gaps: pl.DataFrame, threshold_ns: int, label: str) -> list[str]:
    if gaps.height == 0:
        return [f"{label}no idle gap above {threshold_ns / 1000:g} us in any decode step"]
    entry = int(gaps["step_entry"].sum()) if "step_entry" in gaps.columns else 0
    allowed = f" ({entry} of them the allowed step-entry gap)" if entry else ""
    return [f"{label}{gaps.height:,} above {threshold_ns / 1000:g} us, by cause: {describe_causes(gaps)}{allowed}"]


def _stream_gaps(stream_gaps: pl.DataFrame, threshold_ns: int) -> list[str]:
    if stream_gaps.height == 0:
        return [f"streams no stream idles above {threshold_ns / 1000:g} us inside a decode step"]
    per_stream = (
        stream_gaps.group_by("pid", "device", "stream")
        .agg(pl.len().alias("n"), pl.col("duration").sum().alias("ns"))
        .sort("pid", "device", "stream")
    )
    parts = [f"device {d} stream {s}: {n:,} ({ns / 1000:,.1f} us)" for _, d, s, n, ns in per_stream.iter_rows()]
    return [f"streams per-stream gaps above {threshold_ns / 1000:g} us: " + "; ".join(parts)]


def _h2d_summary(copies: pl.DataFrame, table: pl.DataFrame) -> list[str]:
    if copies.height == 0:
        return ["H2D     no host-to-device copy in any decode step"]
    steps = table.height
    by_memory = copies.group_by("memory").agg(pl.len()).sort("memory")
    memory = ", ".join(f"{n / steps:g} {kind}" for kind, n in by_memory.iter_rows())
    counts = dict(copies.group_by("position").agg(pl.len()).iter_rows())
    positions = ", ".join(
        f"{counts[p] / steps:g} {p.replace('_', ' ')}" for p in H2D_POSITIONS if p in counts
    )
    return [
        f"H2D     per step: {copies.height / steps:g} copies, {copies['bytes'].sum() / steps:,.0f} bytes "
        f"({memory}); relative to the graph launches: {positions}"
    ]


def _ranks(result: Result, table_lines) -> list[str]:
    ranks = result.ranks
    rows = [("rank", "steps", "step (us)", "busy Σt (us)", "collectives (us)", "collective wait (us)")]
    for row in ranks.per_rank.iter_rows(named=True):
        marker = click.style(" slowest", fg="red", bold=True) if row["rank"] == ranks.slowest_rank else ""
        rows.append((str(row["rank"]) + marker, f"{row['steps']:,}", _us(row["step_ns"]), _us(row["busy_ns"]),
                     _us(row["collective_ns"]), _us(row["collective_wait_ns"])))
    return [f"ranks   {ranks.describe()}", *table_lines(rows)]


def _us(ns: int | None) -> str:
    return "-" if ns is None else f"{ns / 1000:,.1f}"

