"""The triage page of a check: one self-contained HTML file that opens offline.

Top to bottom: the verdict and the findings (what a person must see in ten seconds), the
ledger table, the per-layer heatmap, the timelines of a representative and of the worst step,
the per-step charts, the gap and H2D tables, and the trace facts. A section whose data the
Result does not hold says so in one line instead of disappearing.

Large traces stay small: the page embeds per-step aggregates for every decode step, the
kernels of the (at most two) drawn steps, and the longest gaps and H2D copies up to a cap.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from nsys_ledger import __version__
from nsys_ledger.api import Result
from nsys_ledger.attribution.kernel_names import gemm_shape_text
from nsys_ledger.checks.coverage import FALLBACK, NO_OP, SPECIFIC
from nsys_ledger.checks.ledger import short_kernel_name
from nsys_ledger.report import figures
from nsys_ledger.report.html_kit import Cell, esc, esc_code, figure, note, page, table
from nsys_ledger.report.layer_grid import layer_counts_grid, layer_deviations
from nsys_ledger.report.time_html import mark_offending, time_section
from nsys_ledger.report.selection import (
    SelectedStep,
    outcome_values,
    select_steps,
    value_distribution,
)

MAX_FINDINGS_LISTED = 40
MAX_TABLE_ROWS = 300
STEP_KEY = ["rank", "step"]


def write_html(result: Result, path: str | Path) -> None:
    Path(path).write_text(render_html(result), encoding="utf-8")


def render_html(result: Result) -> str:
    selected = select_steps(result)
    layer_counts = _layer_counts(result)
    body = "".join([
        _banner(result),
        "<main>",
        _findings(result),
        _ledger_section(result, layer_counts),
        _layers_section(result, layer_counts),
        _timeline_section(result, selected),
        _per_step_section(result),
        time_section(result),
        _gaps_section(result),
        _h2d_section(result),
        _op_coverage_section(result),
        _kernel_names_section(result),
        _facts_section(result, selected),
        "</main>",
    ])
    title = f"nsys-ledger {result.verdict.upper()}: {Path(result.trace.path).name}"
    return page(title, body)


def verdict_line(result: Result) -> str:
    """The verdict in one line, e.g. "FAIL: 2 finding(s) in 18 checks on 4 decode steps"."""
    return f"{result.verdict.upper()}: {result.verdict_sentence}"


def _banner(result: Result) -> str:
    ledger = (
        f" · ledger {esc(result.expectations.name)}" if result.expectations is not None else " · no ledger given"
    )
    return (
        f'<header class="banner {esc(result.verdict)}" id="verdict"><h1>{esc(verdict_line(result))}</h1>'
        f'<div class="sub">trace {esc(result.trace.path)}{ledger}</div></header>'
    )


def _findings(result: Result) -> str:
    items = []
    for finding in result.findings[:MAX_FINDINGS_LISTED]:
        hint = f'<div class="hint">hint: {esc_code(finding.hint)}</div>' if finding.hint else ""
        items.append(f"<li><b>[{esc(finding.source)}]</b> {esc_code(finding.message)}{hint}</li>")
    hidden = len(result.findings) - MAX_FINDINGS_LISTED
    if hidden > 0:
        items.append(f"<li>… {hidden} more finding(s) in the ledger table below</li>")
    items += [f'<li class="notice"><b>notice</b> {esc(text)}</li>' for text in result.notices]
    return f'<ul class="findings" id="findings">{"".join(items)}</ul>' if items else ""


def _ledger_section(result: Result, layer_counts: pl.DataFrame | None) -> str:
    heading = "<h2 id=\"ledger\">Ledger</h2>"
    if result.expectations is None:
        return heading + note("ledger: no expectations given (--expect FILE checks a ledger)")
    rows = []
    for outcome in result.outcomes:
        values = outcome_values(result, outcome.source, layer_counts)
        failing_steps = "; ".join(dict.fromkeys(f.steps for f in outcome.findings)) or "–"
        failing_count = max((f.failing_steps for f in outcome.findings), default=0)
        detail = "".join(
            f"<div>{esc_code(f.message)}</div>" + (f'<div class="hint">hint: {esc_code(f.hint)}</div>' if f.hint else "")
            for f in outcome.findings
        )
        rows.append([
            Cell("ok" if outcome.passed else "FAIL", 1 if outcome.passed else 0, "ok" if outcome.passed else "fail"),
            outcome.name,
            Cell(outcome.source, markup=esc(outcome.source).replace(".", ".<wbr>")),
            outcome.expected,
            outcome.observed,
            value_distribution(values) if values is not None else "–",
            Cell(f"{failing_count}/{result.step_table.height}: {failing_steps}" if failing_count else "–",
                 failing_count),
            Cell(None, markup=detail or "–"),
        ])
    headers = ["status", "check", "expectation", "expected", "observed", "values (value ×how often)",
               "failing steps", "finding and hint"]
    caption = "values: one per decode step; for per-layer checks one per layer of the class and step"
    return heading + table(headers, rows, css="ledger", caption=caption)


def _layer_counts(result: Result) -> pl.DataFrame | None:
    """Launches per (rank, step, layer, group), zeros included, when layers were attributed."""
    layers = _layers(result)
    if layers is None or result.expectations is None or not result.expectations.layer_classes:
        return None
    return layer_counts_grid(layers.counts, result.expectations)


def _layers_section(result: Result, layer_counts: pl.DataFrame | None) -> str:
    heading = '<h2 id="layers">Per-layer ledger</h2>'
    layers = _layers(result)
    if layers is None or layers.counts.filter(pl.col("layer") >= 0).height == 0:
        return heading + note("per-layer heatmap: layers not attributed in this trace")
    coverage = note(_layer_coverage(layers))
    if result.expectations is None or not result.expectations.layer_classes:
        return heading + coverage + note("per-layer heatmap: the ledger declares no layer classes")
    deviations = layer_deviations(layer_counts)
    deviating = deviations.filter(pl.col("deviation") != 0)
    summary = (
        f"{deviating.height} (layer, group) cell(s) deviate from the ledger or from their peers"
        if deviating.height else "every layer launches what the ledger and its peers say"
    )
    return (heading + coverage + f"<p>{esc(summary)}; hover a cell for counts, range and peers.</p>"
            + figure("heatmap", figures.layer_heatmap(deviations)))


def _layers(result: Result):
    """The layer attribution's summary (per-layer counts, coverage), when computed."""
    return getattr(result, "layers", None)


def _layer_coverage(layers) -> str:
    by_how = {how: n for how, n in layers.kernels_by_how().items() if n}
    how_text = ", ".join(f"{how.replace('_', ' ')} {n:,}" for how, n in by_how.items())
    notes = "".join(f" {text}" for text in layers.notes)
    return f"layers found for {100 * layers.share_with_layer:.1f}% of decode kernels ({how_text}).{notes}"


def _timeline_section(result: Result, selected: list[SelectedStep]) -> str:
    heading = '<h2 id="timeline">Step timelines</h2>'
    if not selected:
        return heading + note("step timelines: no decode step found")
    decode = result.steps.activities.filter(pl.col("decode").fill_null(False))
    parts = [heading, note(_embedded_data_text(result, selected))]
    for chosen in selected:
        key = (pl.col("rank") == chosen.rank) & (pl.col("step") == chosen.step)
        activities = _with_layers(result, decode.filter(key))
        window = result.step_table.filter(key).row(0, named=True)
        origin = window["gpu_start"] if window["gpu_start"] is not None else 0
        calls = result.steps.api_calls.filter(key & pl.col("decode").fill_null(False))
        gaps = result.gaps.filter(key)
        replays = result.timeline.replays.filter(key) if _timeline(result) is not None else None
        why = f"NVTX '{window['label']}', {chosen.why}" if window.get("label") else chosen.why
        title = f"{chosen.role} step: {_step_name(result, chosen.rank, chosen.step)} ({why})"
        fig = figures.step_timeline(activities, gaps, calls, replays, origin_ns=origin)
        mark_offending(fig, result, activities, origin)
        parts.append(f"<h3>{esc(title)}</h3>" + figure(f"timeline-{chosen.role}", fig))
    parts.append(_graph_breaks_table(result))
    return "".join(parts)


def _graph_breaks_table(result: Result) -> str:
    """Where each step's decode graph was split into several replays (timeline checks)."""
    timeline = _timeline(result)
    if timeline is None or timeline.breaks.height == 0:
        return ""
    breaks = timeline.breaks.sort("rank", "step", "replay")
    names = _short_name_lookup(pl.concat([breaks["before"], breaks["after"]]))
    rows = [
        [_step_name(result, row["rank"], row["step"]), row["replay"], row["kernel_index"],
         Cell(names.get(row["before"], "?"), css="name"), row["before_op"], row["before_layer"],
         Cell(names.get(row["after"], "?"), css="name"), row["after_op"], row["after_layer"],
         Cell(f"{row['boundary_ns'] / 1000:.2f}", row["boundary_ns"])]
        for row in breaks.head(MAX_TABLE_ROWS).iter_rows(named=True)
    ]
    headers = ["step", "replay", "kernel index", "last kernel before", "op", "layer", "first kernel after", "op",
               "layer", "boundary µs"]
    shown = f", {MAX_TABLE_ROWS} shown" if breaks.height > MAX_TABLE_ROWS else ""
    caption = f"{breaks.height} graph break(s){shown}"
    return "<h3>Graph breaks</h3>" + table(headers, rows, caption=caption)


def _with_layers(result: Result, activities: pl.DataFrame) -> pl.DataFrame:
    """`activities` with the `layer` the attribution gave each of them (hover texts), if any."""
    layers = _layers(result)
    if layers is None or "layer" in activities.columns:
        return activities
    # The step's rows first: a hash join against every activity of a 1M-kernel trace costs more.
    step_rows = layers.assignments.filter(pl.col("row").is_in(activities["row"].implode())).select("row", "layer")
    return activities.join(step_rows, on="row", how="left")


def _embedded_data_text(result: Result, selected: list[SelectedStep]) -> str:
    drawn = result.step_table.join(
        pl.DataFrame([(s.rank, s.step) for s in selected], schema={"rank": pl.Int64, "step": pl.Int64},
                     orient="row"),
        on=STEP_KEY,
    )["kernels"].sum()
    total = result.step_table["kernels"].sum()
    return (
        f"This page embeds per-step aggregates of all {result.step_table.height} decode steps and the "
        f"kernels of the {len(selected)} step(s) drawn here only ({drawn:,} of {total:,} decode kernels); "
        f"the gap and H2D tables list at most {MAX_TABLE_ROWS} rows each."
    )


def _step_name(result: Result, rank: int, step: int) -> str:
    multi_rank = result.step_table["rank"].n_unique() > 1
    return f"rank {rank} step {step}" if multi_rank else f"step {step}"


def _per_step_section(result: Result) -> str:
    heading = '<h2 id="per-step">Per step: three-column ledger and step time</h2>'
    if result.step_table.height == 0:
        return heading + note("per-step charts: no decode step found")
    parts = [
        heading,
        figure("three-column-ledger", figures.three_column_ledger(result.step_table)),
        figure("step-time", figures.step_durations(result.step_table)),
        "<h3>Step time budget: T_step ≈ Σ t_i + N·g + C_comm + T_host</h3>",
    ]
    budget_columns = [column for column, _, _ in figures.BUDGET_TERMS]
    if set(budget_columns) <= set(result.step_table.columns):
        parts.append(figure("step-budget", figures.step_budget(result.step_table)))
    else:
        parts.append(note("step time budget: not computed for this result (timeline checks absent)"))
    parts.append(_ranks_table(result))
    return "".join(parts)


def _timeline(result: Result):
    """The timeline checks' frames (gaps with causes, H2D positions, replays), when computed."""
    return getattr(result, "timeline", None)


def _ranks_table(result: Result) -> str:
    ranks = getattr(result, "ranks", None)
    if ranks is None:
        return ""
    rows = [
        [row["rank"], row["steps"], Cell(f"{row['step_ns'] / 1e6:.3f}", row["step_ns"]),
         Cell(f"{row['busy_ns'] / 1e6:.3f}", row["busy_ns"]),
         Cell(f"{row['collective_ns'] / 1e6:.3f}", row["collective_ns"]),
         Cell(f"{row['collective_wait_ns'] / 1e6:.3f}", row["collective_wait_ns"])]
        for row in ranks.per_rank.iter_rows(named=True)
    ]
    headers = ["rank", "steps", "step ms", "busy ms", "collective ms", "collective wait ms"]
    return "<h3>Ranks (means per step)</h3>" + note(ranks.describe()) + table(headers, rows)


def _gaps_section(result: Result) -> str:
    threshold = f"{result.gap_threshold_ns / 1000:g} µs"
    heading = f'<h2 id="gaps">Idle gaps above {esc(threshold)}</h2>'
    gaps = result.gaps
    if gaps.height == 0:
        return heading + note(f"gaps: no idle gap above {threshold} in any decode step")
    entry = int(gaps["step_entry"].sum()) if "step_entry" in gaps.columns else 0
    if entry == gaps.height:
        heading += note(f"gaps: no idle gap above {threshold} in any decode step but the {entry} allowed "
                        "step-entry gaps (the wait for cudaGraphLaunch, cause launch)")
    longest = gaps.sort(["duration", "rank", "step", "start"], descending=[True, False, False, False]).head(MAX_TABLE_ROWS)
    names = _short_name_lookup(pl.concat([longest["before"], longest["after"]]))
    # Columns the timeline checks add (cause, ops and layers on both sides), when present.
    extra = [c for c in ("cause", "step_entry", "before_op", "before_layer", "after_op", "after_layer")
             if c in longest.columns]
    rows = []
    for row in longest.iter_rows(named=True):
        rows.append([
            _step_name(result, row["rank"], row["step"]),
            Cell(f"{row['duration'] / 1000:.2f}", row["duration"]),
            Cell(names.get(row["before"], "?"), css="name"),
            Cell(names.get(row["after"], "?"), css="name"),
            *[row[c] for c in extra],
        ])
    caption = (
        f"the {MAX_TABLE_ROWS} longest of {gaps.height:,} gaps" if gaps.height > MAX_TABLE_ROWS
        else f"{gaps.height} gap(s)"
    )
    headers = ["step", "idle µs", "after (last to end)", "before (next to start)",
               *[EXTRA_GAP_HEADERS.get(c, c.replace("_", " ")) for c in extra]]
    return heading + _causes_line(gaps) + table(headers, rows, caption=caption)


EXTRA_GAP_HEADERS = {"step_entry": "allowed step entry"}


def _causes_line(gaps: pl.DataFrame) -> str:
    if "cause" not in gaps.columns:
        return note("gap causes: not computed for this result (timeline checks absent)")
    by_cause = gaps.group_by("cause").agg(pl.len(), pl.col("duration").sum()).sort(
        "len", "cause", descending=[True, False])  # ties by name: the same page every run
    text = "; ".join(f"{cause}: {n:,} gaps, {ns / 1000:,.1f} µs" for cause, n, ns in by_cause.iter_rows())
    return f"<p>by cause: {esc(text)}</p>"


def _h2d_section(result: Result) -> str:
    heading = '<h2 id="h2d">Host-to-device copies in decode steps</h2>'
    copies = _h2d_copies(result)
    if copies.height == 0:
        return heading + note("H2D: no host-to-device copy in any decode step")
    starts = result.step_table.select(*STEP_KEY, "gpu_start")
    placed = copies.join(starts, on=STEP_KEY, how="left").sort(
        pl.col("memory") == "pageable", "rank", "step", "start", descending=[True, False, False, False]
    )
    rows = [
        [
            _step_name(result, row["rank"], row["step"]),
            Cell(f"{(row['start'] - row['gpu_start']) / 1000:.2f}", row["start"] - row["gpu_start"]),
            Cell(f"{row['bytes']:,}", row["bytes"]),
            Cell(row["memory"], css="fail" if row["memory"] == "pageable" else None),
            row["position"],
            Cell(f"{(row['end'] - row['start']) / 1000:.2f}", row["end"] - row["start"]),
            row["stream"],
        ]
        for row in placed.head(MAX_TABLE_ROWS).iter_rows(named=True)
    ]
    caption = (
        f"{MAX_TABLE_ROWS} of {copies.height:,} copies (pageable first)" if copies.height > MAX_TABLE_ROWS
        else f"{copies.height} copies"
    )
    headers = ["step", "start µs (from step start)", "bytes", "source memory", "position (graph launches)",
               "duration µs", "stream"]
    return heading + table(headers, rows, caption=caption)


def _h2d_copies(result: Result) -> pl.DataFrame:
    """Every H2D copy of a decode step: rank, step, start, end, bytes, memory, position, stream.

    The timeline checks place each copy relative to the step's graph launches; without them
    the position is unknown."""
    timeline = _timeline(result)
    if timeline is not None:
        return timeline.h2d.select(*STEP_KEY, "start", "end", "bytes", "memory", "position", "stream")
    return result.steps.activities.filter(
        pl.col("decode").fill_null(False) & (pl.col("activity") == "memcpy") & (pl.col("copy_kind") == "HtoD")
    ).select(*STEP_KEY, "start", "end", "bytes", pl.col("src_kind").str.to_lowercase().alias("memory"),
             pl.lit(None, pl.Utf8).alias("position"), "stream")


def _op_coverage_section(result: Result) -> str:
    """Decode kernels by specific op, generic fallback and no op, with the names behind the
    last two: how much of the step the ledger really names."""
    heading = '<h2 id="op-coverage">Op coverage</h2>'
    cov = result.coverage
    if cov is None or cov.total == 0:
        return heading + note("op coverage: no ledger given, or no kernel in a decode step")
    steps = max(cov.step_count, 1)
    summary = table(
        ["claimed by", "kernels per step", "share"],
        [[label, Cell(f"{cov.kernels(c) / steps:,.1f}", cov.kernels(c) / steps),
          Cell(f"{cov.share(c):.1%}", cov.share(c), css="fail" if c != SPECIFIC and cov.kernels(c) else None)]
         for c, label in ((SPECIFIC, "a specific op"), (FALLBACK, "only a generic fallback op"), (NO_OP, "no op"))],
    )
    rows = [
        [label, op if coverage == FALLBACK else "-", Cell(f"{per_step:.2f}", per_step), Cell(gemm_shape_text(name) or "-", css="name"),
         Cell(name, css="name")]
        for coverage, label in ((FALLBACK, "fallback"), (NO_OP, "no op"))
        for name, op, _, per_step in cov.top(coverage, MAX_COVERAGE_ROWS).iter_rows()
    ]
    names = table(["class", "op", "launches per step", "GEMM shape in the name", "kernel name"], rows,
                  caption="the names a ledger should name: add an op (patterns or gemm = { n, k }) for each")
    return heading + summary + (names if rows else "")


def _kernel_names_section(result: Result) -> str:
    heading = '<h2 id="kernel-names">Kernel names in decode steps</h2>'
    kernels = result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
    if kernels.height == 0:
        return heading + note("kernel names: no kernel in a decode step")
    steps = max(result.step_table.height, 1)
    names = kernels.group_by("name").agg(
        pl.col("op").first(), pl.col("group").first(), (pl.len() / steps).alias("per_step"),
    ).sort(pl.col("op") != "other", -pl.col("per_step"), "name")
    shown = names.head(MAX_TABLE_ROWS)
    rows = [
        [Cell(op, css="fail" if op == "other" else None), group, Cell(f"{per_step:.2f}", per_step),
         Cell(name, css="name")]
        for name, op, group, per_step in shown.select("name", "op", "group", "per_step").iter_rows()
    ]
    caption = (
        f"{MAX_TABLE_ROWS} of {names.height:,} distinct names (unmatched first)" if names.height > MAX_TABLE_ROWS
        else f"{names.height} distinct names; op 'other': matched by no op of the ledger"
    )
    return heading + table(["op", "group", "launches per step", "kernel name"], rows, caption=caption)


MAX_COVERAGE_ROWS = 20


def _short_name_lookup(names: pl.Series) -> dict[str, str]:
    return {name: short_kernel_name(name, 90) for name in names.unique().drop_nulls().to_list()}


def _facts_section(result: Result, selected: list[SelectedStep]) -> str:
    trace, totals, steps = result.trace, result.totals, result.steps
    meta = trace.meta
    devices = ", ".join(f"{d}: {n or 'GPU'}" for d, n in trace.devices.select("device", "name").iter_rows())
    excluded = steps.excluded.group_by("reason").agg(pl.len()).sort("len", "reason", descending=[True, False])
    decode_kernels = result.step_table["kernels"].sum() if result.step_table.height else 0
    files = getattr(result, "files", ())
    facts = [
        ("trace", trace.path),
        *([("files (ranks)", "; ".join(f"{f.path} ({', '.join(map(str, f.ranks))})" for f in files))]
          if files else []),
        ("nsys", f"{meta.nsys_version or 'unknown version'} (export schema {meta.schema_version or '?'}, "
                 f"from {meta.version_source})"),
        ("devices", devices or "none"),
        ("capture mode", _capture_mode(meta.cuda_graph_trace)),
        ("totals", f"{totals.kernels:,} kernels; {totals.h2d_copies:,} H2D copies ({totals.h2d_pageable} pageable); "
                   f"{totals.nvtx_ranges:,} NVTX ranges; {totals.api_launches:,} launch calls; "
                   f"{totals.graph_replays:,} graph replays"),
        ("decode steps", f"{result.step_table.height} by {steps.method}: {steps.detail}"),
        ("excluded windows", "; ".join(f"{n} {reason}" for reason, n in excluded.iter_rows()) or "none"),
        ("attribution coverage", _coverage(result, decode_kernels)),
        ("gap threshold", f"{result.gap_threshold_ns / 1000:g} µs"),
        ("ledger", f"{result.expectations.name} ({result.expectations.path})" if result.expectations else "none"),
        ("kernels per output token", _kernels_per_token(result)),
        ("embedded data", _embedded_data_text(result, selected) if selected else "per-step aggregates only"),
        ("tool", f"nsys-ledger {__version__}"),
    ]
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts)
    return f'<h2 id="facts">Trace facts</h2><dl class="facts">{items}</dl>'


def _capture_mode(cuda_graph_trace: str | None) -> str:
    return {
        "node": "CUDA graphs traced per node (--cuda-graph-trace=node): kernels inside graphs are counted",
        "graph": "CUDA graphs traced per graph (nsys default): kernels inside graphs are not in the trace",
    }.get(cuda_graph_trace, "CUDA graph trace mode not recorded")


def _coverage(result: Result, decode_kernels: int) -> str:
    total = result.totals.kernels
    in_steps = f"{decode_kernels:,} of {total:,} kernels in decode steps ({_percent(decode_kernels, total)})"
    if result.expectations is None or not decode_kernels:
        return in_steps
    matched = decode_kernels - int(result.op_table["other"].sum())
    text = in_steps + f"; {_percent(matched, decode_kernels)} of decode kernels matched a ledger op"
    layers = _layers(result)
    return text + "; " + (_layer_coverage(layers) if layers is not None else "layers not attributed")


def _kernels_per_token(result: Result) -> str:
    # the check's batch (--batch, else the expectations'), when the check reports one
    batch = getattr(result, "batch", None) or (result.expectations.batch if result.expectations else None)
    if not batch or result.step_table.height == 0:
        return "batch size not declared"
    median = result.step_table["kernels"].median()
    return f"{median / batch:.1f} (median {median:g} kernels per step / batch {batch})"


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "–"

