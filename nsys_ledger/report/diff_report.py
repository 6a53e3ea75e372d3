"""`nsys-ledger diff` output: terminal text, a versioned JSON document, a self-contained HTML page.

JSON layout in docs/json-schema.md ("diff"); its `schema_version` is separate from the check
document's (bump the minor when fields are added, the major when one changes meaning).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import plotly.graph_objects as go
import polars as pl

from nsys_ledger import __version__
from nsys_ledger.checks.ledger import short_kernel_name
from nsys_ledger.diff import FigureChange, TraceDiff
from nsys_ledger.report.html_kit import Cell, esc, figure, note, page, table
from nsys_ledger.report.layout import fit_lines, terminal_width

DIFF_SCHEMA_VERSION = "1.1"
MAX_NAMES = 20  # kernel names listed in the terminal per side


# ---- terminal -----------------------------------------------------------------------------

def render_diff(diff: TraceDiff, width: int | None = None) -> str:
    """The diff for the terminal, every line at most `width` columns (default: the terminal's)."""
    lines = [
        click.style(f"nsys-ledger diff {diff.before.trace.path} -> {diff.after.trace.path}", bold=True),
        _side_line("before", diff.before),
        _side_line("after", diff.after),
        "",
        click.style("per step (median over decode steps)", bold=True),
    ]
    lines += _change_rows(diff.step_figures, always=True)
    if diff.rank_step_time is not None:
        lines += ["", click.style("step time per rank (median ms)", bold=True)]
        for rank, before_ms, after_ms in diff.rank_step_time.iter_rows():
            lines.append(f"  rank {rank}: {_ms(before_ms)} -> {_ms(after_ms)}")
    lines += ["", click.style("ops per step (median; changed only)", bold=True)]
    lines += _change_rows(diff.op_changes, always=False) or ["  no op changed"]
    lines += ["", click.style("layers (median launches per step; changed only)", bold=True)]
    if diff.layer_changes is None:
        lines.append("  layers not attributed in both traces")
    else:
        before_source, after_source = diff.layer_sources
        if before_source != after_source:
            lines.append(f"  layers found by {before_source} in BEFORE, {after_source} in AFTER: "
                         "changes listed, not judged")
        lines += _change_rows(diff.layer_changes, always=False) or ["  no layer group changed"]
    lines += _time_rows(diff)
    lines += ["", click.style("kernel names", bold=True)]
    lines += _name_rows("new in AFTER", diff.new_kernels) + _name_rows("vanished from BEFORE", diff.vanished_kernels)
    lines += ["", click.style("idle gaps by cause (per step)", bold=True)]
    lines += [
        f"  {cause:<16} {_fmt(bg):>8} -> {_fmt(ag):>8} gaps   {bu:10,.1f} -> {au:10,.1f} us"
        for cause, bg, bu, ag, au in diff.gap_causes.select(
            "cause", "before_gaps", "before_us", "after_gaps", "after_us").iter_rows()
    ] or ["  no gap above the threshold in either trace"]
    lines += ["", click.style("ledger findings", bold=True),
              f"  new in AFTER: {', '.join(diff.new_findings) or 'none'}",
              f"  resolved:     {', '.join(diff.resolved_findings) or 'none'}", ""]
    lines += _diff_verdict(diff)
    return "\n".join(fit_lines(lines, width or terminal_width()))


def _time_rows(diff: TraceDiff) -> list[str]:
    """GPU time per op and per layer (median µs per step), the changes beyond the tolerance."""
    tolerance = f"{diff.rule.time_tolerance_pct:g}%"
    lines = []
    for what, changes in (("op", diff.op_time_changes), ("layer", diff.layer_time_changes)):
        lines += ["", click.style(f"GPU time per {what} (median us per step; changed by over {tolerance})", bold=True)]
        if changes is None:
            lines.append(f"  no GPU time per {what} in both traces")
            continue
        lines += _change_rows(changes, always=False) or [f"  no {what} changed by over {tolerance}"]
    return lines


def _side_line(label: str, result) -> str:
    return (
        f"{label:<7} {result.trace.path}: {result.verdict}, {result.step_table.height} decode steps by "
        f"{result.steps.method}"
    )


def _change_rows(changes: tuple[FigureChange, ...], *, always: bool) -> list[str]:
    rows = []
    for change in changes:
        if not always and change.change == 0:
            continue
        flag = click.style(f"  WORSE ({change.worse_by})", fg="red", bold=True) if change.worse_by else ""
        rows.append(f"  {change.name:<36} {_fmt(change.before):>12} -> {_fmt(change.after):>12}  "
                    f"{_signed(change):>16}{flag}")
    return rows


def _name_rows(label: str, names: pl.DataFrame) -> list[str]:
    if names.height == 0:
        return [f"  {label}: none"]
    rows = [f"  {label}: {names.height}"]
    for name, op, per_step in names.head(MAX_NAMES).iter_rows():
        rows.append(f"    {_fmt(per_step):>8}/step  [{op or '-'}] {short_kernel_name(name, 100)}")
    if names.height > MAX_NAMES:
        rows.append(f"    ... {names.height - MAX_NAMES} more (all of them in --json)")
    return rows


def _diff_verdict(diff: TraceDiff) -> list[str]:
    if not diff.worse:
        return [click.style("NOT WORSE", fg="green", bold=True) + " under the rule: " + "; ".join(diff.rule.describe())]
    lines = [click.style("WORSE", fg="red", bold=True) + f" {len(diff.reasons)} reason(s):"]
    lines += [f"  - {reason}" for reason in diff.reasons]
    return lines


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{int(value)}" if float(value).is_integer() else f"{value:.3f}"  # :g would write 1e+06


def _signed(change: FigureChange) -> str:
    if change.change is None:
        return ""
    pct = f" ({change.change_pct:+.3g}%)" if change.change_pct is not None and change.change else ""
    text = f"{change.change:+g}" if float(change.change).is_integer() else f"{change.change:+.3f}"
    return text + pct


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


# ---- JSON ---------------------------------------------------------------------------------

def diff_document(diff: TraceDiff) -> dict:
    return {
        "schema_version": DIFF_SCHEMA_VERSION,
        "tool": {"name": "nsys-ledger", "version": __version__},
        "before": _side_document(diff.before),
        "after": _side_document(diff.after),
        "rule": diff.rule.describe(),
        "step_figures": [_change_document(c) for c in diff.step_figures],
        "ops": [_change_document(c) for c in diff.op_changes],
        "layers": None if diff.layer_changes is None else [_change_document(c) for c in diff.layer_changes],
        "time_tolerance_pct": diff.rule.time_tolerance_pct,
        "op_time": None if diff.op_time_changes is None else [_change_document(c) for c in diff.op_time_changes],
        "layer_time": (None if diff.layer_time_changes is None
                       else [_change_document(c) for c in diff.layer_time_changes]),
        "new_kernels": diff.new_kernels.to_dicts(),
        "vanished_kernels": diff.vanished_kernels.to_dicts(),
        "gap_causes": diff.gap_causes.to_dicts(),
        "rank_step_time_ms": None if diff.rank_step_time is None else diff.rank_step_time.to_dicts(),
        "new_findings": list(diff.new_findings),
        "resolved_findings": list(diff.resolved_findings),
        "worse": diff.worse,
        "reasons": list(diff.reasons),
    }


def _side_document(result) -> dict:
    return {
        "path": result.trace.path,
        "verdict": result.verdict,
        "decode_steps": result.step_table.height,
        "step_method": result.steps.method,
    }


def _change_document(change: FigureChange) -> dict:
    return {"name": change.name, "kind": change.kind, "before": change.before, "after": change.after,
            "change": change.change, "worse_by": change.worse_by}


def write_diff_json(diff: TraceDiff, path: str | Path) -> None:
    Path(path).write_text(json.dumps(diff_document(diff), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# ---- HTML ---------------------------------------------------------------------------------

def render_diff_html(diff: TraceDiff) -> str:
    verdict = "WORSE" if diff.worse else "NOT WORSE"
    reasons = "".join(f"<li>{esc(r)}</li>" for r in diff.reasons)
    sides = (f"before {esc(diff.before.trace.path)} ({esc(diff.before.verdict)}) → "
             f"after {esc(diff.after.trace.path)} ({esc(diff.after.verdict)})")
    body = "".join([
        f'<header class="banner {"worse" if diff.worse else "same"}" id="verdict"><h1>{verdict}: '
        f'{len(diff.reasons)} reason(s)</h1><div class="sub">{sides}</div></header>',
        "<main>",
        f'<ul class="findings">{reasons}</ul>' if reasons else "",
        note("rule: " + "; ".join(diff.rule.describe())),
        '<h2 id="per-step">Per step (median over decode steps)</h2>',
        _changes_table(diff.step_figures),
        figure("step-time", _step_time_figure(diff)),
        '<h2 id="ops">Ops per step (changed)</h2>',
        _changes_table(diff.op_changes) if diff.op_changes else note("ops: no op count per step changed"),
        '<h2 id="layers">Layers (changed layer groups)</h2>',
        (note("layers: not attributed in both traces") if diff.layer_changes is None
         else _changes_table(diff.layer_changes) if diff.layer_changes
         else note("layers: no layer group changed")),
        '<h2 id="kernels">Kernel names</h2>',
        _names_table("new in AFTER", diff.new_kernels),
        _names_table("vanished from BEFORE", diff.vanished_kernels),
        '<h2 id="gaps">Idle gaps by cause (per step)</h2>',
        _gap_table(diff.gap_causes),
        '<h2 id="findings">Ledger findings</h2>',
        note(f"new in AFTER: {', '.join(diff.new_findings) or 'none'}; "
             f"resolved: {', '.join(diff.resolved_findings) or 'none'}"),
        "</main>",
    ])
    return page(f"nsys-ledger diff: {verdict}", body)


def write_diff_html(diff: TraceDiff, path: str | Path) -> None:
    Path(path).write_text(render_diff_html(diff), encoding="utf-8")


def _changes_table(changes: tuple[FigureChange, ...]) -> str:
    rows = [
        [
            Cell("WORSE" if c.worse_by else "", 0 if c.worse_by else 1, "fail" if c.worse_by else None),
            c.name,
            Cell(_fmt(c.before), c.before),
            Cell(_fmt(c.after), c.after),
            Cell(_signed(c), c.change),
            c.worse_by or "",
        ]
        for c in changes
    ]
    return table(["", "figure", "before", "after", "change", "rule"], rows)


def _names_table(label: str, names: pl.DataFrame) -> str:
    if names.height == 0:
        return note(f"{label}: none")
    rows = [[Cell(name, css="name"), op, Cell(f"{per_step:.2f}", per_step)] for name, op, per_step in names.iter_rows()]
    return f"<h3>{esc(label)}</h3>" + table(["kernel name", "op", "launches per step"], rows)


def _gap_table(causes: pl.DataFrame) -> str:
    if causes.height == 0:
        return note("gaps: no gap above the threshold in either trace")
    rows = [
        [cause, Cell(f"{bg:.2f}", bg), Cell(f"{ag:.2f}", ag), Cell(f"{bu:.1f}", bu), Cell(f"{au:.1f}", au)]
        for cause, bg, bu, ag, au in causes.select(
            "cause", "before_gaps", "before_us", "after_gaps", "after_us").iter_rows()
    ]
    return table(["cause", "gaps before", "gaps after", "idle µs before", "idle µs after"], rows)


def _step_time_figure(diff: TraceDiff) -> go.Figure:
    fig = go.Figure()
    for label, result, colour in (("before", diff.before, "#1f77b4"), ("after", diff.after, "#d62728")):
        fig.add_trace(go.Box(
            y=(result.step_table["duration_ns"].drop_nulls() / 1e6).to_list(), name=esc(label),
            boxpoints="all" if result.step_table.height <= 2000 else False, marker_color=colour,
        ))
    fig.update_layout(height=320, yaxis_title="step time (ms)", margin=dict(l=60, r=20, t=30, b=40),
                      showlegend=False)
    return fig
