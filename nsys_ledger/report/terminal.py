"""The terminal report: the verdict and findings first, then trace facts, what was checked,
per-step counts and the time use; the verdict line again at the end.

Plain text with optional colour (click strips it when stdout is not a terminal), so the same
output reads well in a CI log. Every line fits the terminal's width (`layout.py`): prose wraps
under its label, tables of numbers split into column blocks, tables of text wrap in their cells.
"""

from __future__ import annotations

from functools import partial

import click
import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.attribution.steps import launches_per_thread
from nsys_ledger.attribution.layers import inference_rule_text
from nsys_ledger.attribution.kernel_names import gemm_shape_text
from nsys_ledger.checks.coverage import FALLBACK, NO_OP, SPECIFIC
from nsys_ledger.checks.ledger import short_kernel_name
from nsys_ledger.checks.time_use import distinct_labels
from nsys_ledger.trace.kineto_reader import KINETO_VERSION_SOURCE
from nsys_ledger.report.layout import fit_lines, fit_table, terminal_width
from nsys_ledger.report.text import printable  # names and paths from the trace, escaped
from nsys_ledger.report.time_text import time_lines
from nsys_ledger.report.timeline_text import timeline_lines

MAX_STEP_ROWS = 12


def render(result: Result, width: int | None = None) -> str:
    """The terminal report, every line at most `width` columns (default: the terminal's)."""
    width = width or terminal_width()
    table = partial(fit_table, width=width)
    # the verdict and its findings first (what a reader needs), the evidence after, and the
    # verdict line again at the end, where `| tail -1` and a scrolled CI log see it
    lines: list[str] = [*_verdict(result), ""]
    lines += _facts(result)
    lines.append("")
    for notice in result.notices:
        lines.append(click.style("notice  ", fg="yellow") + printable(notice))
    if result.notices:
        lines.append("")
    if result.expectations is not None:
        lines += _checks(result, width)
        lines.append("")
    lines += _step_rows(result, table)
    lines.append("")
    timeline = timeline_lines(result, table)
    if timeline:
        lines += [*timeline, ""]
    time_use = time_lines(result)
    if time_use:
        lines += [*time_use, ""]
    lines.append(_headline(result))
    return "\n".join(fit_lines(lines, width))


def count_text(value: float) -> str:
    """A count as an integer when it is one (2,158), else with one decimal (67.4)."""
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def _facts(result: Result) -> list[str]:
    trace, totals, steps = result.trace, result.totals, result.steps
    meta = trace.meta
    version = meta.nsys_version or "unknown version"
    schema = f" (schema {meta.schema_version})" if meta.schema_version else ""
    producer = f"nsys {version}{schema}"
    if meta.version_source == KINETO_VERSION_SOURCE:
        producer = f"PyTorch profiler (Kineto) trace{schema}"
    devices = ", ".join(
        f"{d} {printable(n or 'GPU')}" for d, n in trace.devices.select("device", "name").iter_rows()
    ) or "none"
    graph_mode = {"node": "CUDA graphs traced per node", "graph": "CUDA graphs traced per graph (no kernels inside)"}
    by_device = ", ".join(f"device {d}: {n:,}" for d, n in totals.kernels_by_device.items())
    excluded = steps.excluded.group_by("reason").agg(pl.len()).sort("len", "reason", descending=[True, False])
    excluded_text = "; ".join(f"{n} {printable(reason)}" for reason, n in excluded.iter_rows())
    lines = [
        click.style(f"nsys-ledger check {printable(trace.path)}", bold=True),
        f"trace     {producer}; devices: {devices}"
        + (f"; {graph_mode[meta.cuda_graph_trace]}" if totals.graph_replays and meta.cuda_graph_trace in graph_mode
           else ""),
        f"totals    {totals.kernels:,} kernels ({by_device or 'none'}); {totals.h2d_copies:,} H2D copies "
        f"({totals.h2d_pageable} pageable); {totals.nvtx_ranges:,} NVTX ranges; {totals.api_launches:,} launch "
        f"calls; {totals.graph_replays:,} graph replays",
        f"steps     {steps.decode.height} decode steps by {steps.method}: {printable(steps.detail)}",
    ]
    if excluded_text:
        lines.append(f"excluded  {excluded_text}")
    lines += _kind_lines(result)
    lines += _thread_lines(result)
    lines += _layer_lines(result)
    lines += _coverage_lines(result)
    lines += _file_lines(result)
    if result.expectations is not None:
        lines.append(f"ledger    {printable(result.expectations.name)} ({printable(result.expectations.path)})")
    return lines


def _kind_lines(result: Result) -> list[str]:
    """How many steps of each kind were found and checked, when there is more than decode."""
    kinds = result.step_kinds
    if kinds is None or kinds.filter(pl.col("kind") != "decode").height == 0:
        return []
    undeclared = " without a ledger" if result.expectations is None else " not declared"
    parts = [f"{kind} {found}/{checked}" + ("" if declared else undeclared)
             for kind, found, checked, declared in kinds.iter_rows()]
    return [f"kinds     steps found/checked: {', '.join(parts)}"]


THREAD_LINE_WIDTH = 80  # the threads line lists as many threads as fit, then "+N more"


def _thread_lines(result: Result) -> list[str]:
    """Which threads launched the decode steps' GPU work, and how much per step."""
    per_thread = launches_per_thread(result.steps.launch_threads)
    if per_thread.height == 0:
        return []
    several_ranks = per_thread["rank"].n_unique() > 1
    items = [
        f"{'rank ' + str(rank) + ' ' if several_ranks else ''}tid {tid}: "
        + (f"{low}" if low == high else f"{low}-{high}")
        for rank, tid, low, high in per_thread.select("rank", "tid", "min", "max").iter_rows()
    ]
    head = "threads   launches per step by thread: "
    shown: list[str] = []
    for n, item in enumerate(items):
        rest = len(items) - n - 1
        more = f", +{rest} more" if rest else ""
        if shown and len(head + ", ".join([*shown, item]) + more) > THREAD_LINE_WIDTH:
            break
        shown.append(item)
    hidden = len(items) - len(shown)
    return [head + ", ".join(shown) + (f", +{hidden} more" if hidden else "")]


LAYER_HOW_LABELS = {
    "capture_nvtx": "capture-time NVTX",
    "replay_nvtx": "NVTX at launch",
    "inferred": "inferred",
    "none": "outside any layer",
}


def _layer_lines(result: Result) -> list[str]:
    """Coverage of the layer attribution, and whether the layers had to be inferred."""
    layers = result.layers
    if layers is None or result.step_table.height == 0:
        return []
    by_how = layers.kernels_by_how()
    total = sum(by_how.values())
    if total == 0:
        return []
    found = layers.counts["layer"].n_unique()
    parts = ", ".join(f"{LAYER_HOW_LABELS[how]} {n:,}" for how, n in by_how.items() if n)
    lines = [f"layers    {layers.share_with_layer:.1%} of {total:,} decode kernels have a layer, {found} layers "
             f"({parts})"]
    if layers.inferred_steps:
        rule = f": {inference_rule_text(result.expectations)}" if result.expectations else ""
        lines.append(click.style("          layers INFERRED", bold=True)
                     + f" in {layers.inferred_steps} decode steps (no layer-wise NVTX range; "
                       f"{_inference_confidence(layers.inferred)}){rule}")
    lines += [f"          {printable(note)}" for note in layers.notes]
    for status, nodes, kernels in layers.unresolved_graph_nodes.group_by("status").agg(
        pl.col("nodes").sum(), pl.col("kernels").sum()
    ).sort("status").iter_rows():
        lines.append(f"          {kernels:,} graph kernels ({nodes:,} nodes) without a capture origin: {status}")
    return lines


COVERAGE_LABELS = ((SPECIFIC, "specific op"), (FALLBACK, "generic fallback"), (NO_OP, "no op"))
COVERAGE_NAME_WIDTH = 90
UNNAMED_SHARE_HINT = 0.05  # more decode kernels than this without an op: point to match and learn


def _coverage_lines(result: Result, limit: int = 3) -> list[str]:
    """How many decode kernels a specific op, only a fallback op, or no op claimed, and the
    names behind the last two, per step: where the ledger does not describe the build."""
    cov = result.coverage
    if cov is None or cov.total == 0:
        return []
    steps = max(cov.step_count, 1)
    parts = ", ".join(f"{label} {count_text(cov.kernels(c) / steps)} ({cov.share(c):.1%})"
                      for c, label in COVERAGE_LABELS)
    lines = [f"ops       {count_text(cov.total / steps)} decode kernels per step: {parts}"]
    for coverage, label in ((FALLBACK, "fallback"), (NO_OP, "no op")):
        for name, op, _, per_step in cov.top(coverage, limit).iter_rows():
            claimed = f"{op}: " if coverage == FALLBACK else ""
            shape = gemm_shape_text(name)
            lines.append(f"          {label:<8} {count_text(per_step):>7}/step  {claimed}"
                         f"{printable(short_kernel_name(name, COVERAGE_NAME_WIDTH))}" + (f" ({shape})" if shape else ""))
    if cov.share(NO_OP) > UNNAMED_SHARE_HINT:
        lines.append("          hint: the ledger does not describe this build: see how it reads the names with "
                     "`nsys-ledger expectations match`, or learn one from a healthy capture with `nsys-ledger learn`")
    return lines


def _inference_confidence(inferred: pl.DataFrame) -> str:
    """'4 exact by anchor' or '3 exact by anchor, 1 repaired by opening': how sure the cut is."""
    groups = inferred.group_by("confidence", "cut_by").agg(pl.len()).sort("confidence", "cut_by")
    return ", ".join(f"{n} {confidence} by {cut_by}" for confidence, cut_by, n in groups.iter_rows())


MAX_FILE_ROWS = 12


def _file_lines(result: Result) -> list[str]:
    """Which ranks came from which file, when several files were checked together."""
    lines = [
        f"file      {'rank ' + ', '.join(map(str, f.ranks)) if f.ranks else 'no decode steps'}: {printable(f.path)}"
        for f in result.files[:MAX_FILE_ROWS]
    ]
    if len(result.files) > MAX_FILE_ROWS:
        lines.append(f"          ... {len(result.files) - MAX_FILE_ROWS} more files (all of them in --json)")
    return lines


def _checks(result: Result, width: int) -> list[str]:
    rows = [("check", "expected", "observed", "failing", "")]
    total_steps = result.step_table.height
    for outcome in result.outcomes:
        failing = max((f.failing_steps for f in outcome.findings), default=0)
        status = click.style("ok", fg="green") if outcome.passed else click.style("FAIL", fg="red", bold=True)
        rows.append((printable(outcome.name), printable(outcome.expected), printable(outcome.observed),
                     f"{failing}/{total_steps}", status))
    # the check, expected and observed texts wrap in their cells; the step counts and status stay whole
    return fit_table(rows, width, wrap=(0, 1, 2))


def _step_rows(result: Result, table_lines) -> list[str]:
    table = result.step_table
    if table.height == 0:
        lines = ["no decode steps to list"]
        if result.expectations is None:
            lines += ["", "most launched kernels in the whole trace:"] + _top_kernels(result)
        return lines
    anchor_ops = [a.op for a in result.expectations.anchors] if result.expectations else []
    joined = table.join(result.op_table.select("rank", "step", *anchor_ops), on=["rank", "step"], how="left")
    multi_rank = joined["rank"].n_unique() > 1
    per_token = result.batch is not None and "kernels_per_token" in joined.columns
    # the seed's three columns first: CPU submissions, GPU kernels, GPU gaps (count and time)
    header = ("rank",) * multi_rank + ("step", "submissions", "kernels") + ("kernels/token",) * per_token
    header += ("gaps", "gap (us)", "graphs", "H2D", "time (us)") + tuple(anchor_ops)
    rows = [header]
    shown = joined.head(MAX_STEP_ROWS)
    for row in shown.iter_rows(named=True):
        cells = (str(row["rank"]),) * multi_rank + (
            str(row["step"]), f"{row['cpu_submissions']:,}", f"{row['kernels']:,}")
        if per_token:
            cells += (f"{row['kernels_per_token']:,.1f}",)
        cells += (
            f"{row['gaps']:,}", f"{(row['gap_ns'] or 0) / 1000:,.1f}", f"{row['graph_launches']:,}", f"{row['h2d']:,}",
            f"{(row['duration_ns'] or 0) / 1000:,.1f}",
        )
        cells += tuple("-" if row[op] is None else f"{row[op]:,}" for op in anchor_ops)
        rows.append(cells)
    title = f"per step (kernels/token: kernels per step / {result.batch} tokens of the batch):" if per_token \
        else "per step:"
    lines = [title] + table_lines(rows, keys=1 + multi_rank)
    if joined.height > MAX_STEP_ROWS:
        lines.append(f"... {joined.height - MAX_STEP_ROWS} more steps (all of them in --json)")
    if result.expectations is None:
        lines += ["", "most launched kernels per step:"] + _top_kernels(result)
    return lines


def _top_kernels(result: Result, limit: int = 10) -> list[str]:
    """Per step when there are steps, else over the whole trace."""
    in_steps = result.step_table.height > 0
    kernels = result.steps.activities.filter(
        (pl.col("decode").fill_null(False) | (not in_steps)) & (pl.col("activity") == "kernel")
    )
    if kernels.height:
        counts = kernels.group_by("name").agg(pl.len().alias("count"))
    elif in_steps and result.time_use is not None and result.time_use.kernels.height:
        # no kernel rows kept (several files, or a big export checked through a store on disk):
        # the decode kernels per name are in the time use
        counts = result.time_use.kernels.group_by("name").agg(pl.col("kernels").sum().alias("count"))
    elif result.files:
        return ["  (kernel rows are not kept when several files are checked together; check one file for them)"]
    elif result.totals.kernels:
        return ["  (kernel rows are not kept for a big export outside decode steps; --html keeps them)"]
    else:
        return ["  (none)"]
    steps = max(result.step_table.height, 1)
    top = counts.sort("count", "name", descending=[True, False]).head(limit)
    labels = distinct_labels(top["name"].to_list(), 80)  # one row per name: labels that do not collide
    return [f"  {count_text(count / steps):>8}  {printable(label)}" for label, count in zip(labels, top["count"])]


def _headline(result: Result) -> str:
    """PASS, FAIL or SUMMARY and what it rests on, in one line."""
    if result.verdict == "summary":
        return click.style("SUMMARY", bold=True) + " no expectations given (--expect FILE checks a ledger)"
    if result.verdict == "pass":
        return click.style("PASS", fg="green", bold=True) + f" {result.verdict_sentence}"
    return click.style("FAIL", fg="red", bold=True) + f" {result.verdict_sentence}"


def _verdict(result: Result) -> list[str]:
    """The headline and, on a failure, every finding with its hint."""
    lines = [_headline(result)]
    for finding in result.findings:
        lines.append(f"  - [{printable(finding.source)}] {printable(finding.message)}")
        if finding.hint:
            lines.append(f"    hint: {printable(finding.hint)}")
    return lines

