"""The HTML report's time: a 'Where the time goes' section (per-step table, GPU time by op,
a layer × group heatmap that switches between launches and µs, the kernels that took the most
time), and the offending kernels of the findings marked in the step timelines."""

from __future__ import annotations

import plotly.graph_objects as go
import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.layers import _bare_name
from nsys_ledger.checks.ledger import Finding, short_kernel_name
from nsys_ledger.checks.time_use import top_kernels
from nsys_ledger.ledger.roles import NO_ROLE, op_roles
from nsys_ledger.report.html_kit import Cell, esc, figure, note, table

MAX_STEP_ROWS = 300
TOP_KERNELS = 20
MAX_MARKS = 200  # offending kernels marked per finding and step
MARK_COLOUR = "#d62728"


def time_section(result: Result) -> str:
    heading = '<h2 id="time">Where the time goes</h2>'
    use = result.time_use
    if use is None or use.steps.height == 0:
        return heading + note("time use: no decode step found")
    return "".join([
        heading,
        note("Busy time is the union of the step's GPU activity (all streams); a share is an item's kernel time "
             "over it. Launch delay: kernel start minus launch call start."),
        _step_table(result),
        figure("time-per-op", op_time_figure(use.ops, use.steps.height, op_roles(result.expectations))),
        _layer_heatmap(result),
        _top_kernel_table(result),
    ])


def _us_cell(ns: int | float | None) -> Cell:
    return Cell("-" if ns is None else f"{ns / 1000:,.1f}", ns)


def _step_table(result: Result) -> str:
    use = result.time_use
    delay = use.launch_delay.pivot(on="mode", index=["rank", "step"], values="p50_ns") if use.launch_delay.height \
        else use.steps.select("rank", "step")
    copies = use.copies.group_by("rank", "step").agg(
        pl.col("count").filter(pl.col("kind") != "HtoD").sum().alias("other_copies"),
        pl.col("time_ns").sum().alias("copy_ns"),
    )
    gaps = result.step_table.select("rank", "step", "gaps", "gap_ns")
    rows_frame = use.steps.join(delay, on=["rank", "step"], how="left").join(copies, on=["rank", "step"], how="left") \
        .join(gaps, on=["rank", "step"], how="left")
    rows = []
    for row in rows_frame.head(MAX_STEP_ROWS).iter_rows(named=True):
        rows.append([
            row["rank"], row["step"], row["launch_calls"], _us_cell(row["launch_host_ns"]), row["kernels"],
            _us_cell(row["kernel_ns"]), _us_cell(row["busy_ns"]), row["gaps"], _us_cell(row["gap_ns"]),
            _us_cell(row["collective_ns"]), _us_cell(row["overlapped_ns"]), _us_cell(row["exposed_ns"]),
            _us_cell(row.get("eager")), _us_cell(row.get("graph")), row["other_copies"], _us_cell(row["copy_ns"]),
        ])
    headers = ["rank", "step", "launch calls", "host µs in them", "kernels", "Σt µs", "busy µs", "gaps", "gap µs",
               "collective µs", "overlapped µs", "exposed µs", "eager launch delay p50 µs",
               "graph launch delay p50 µs", "non-H2D copies", "copy µs"]
    shown = f", {MAX_STEP_ROWS} shown" if use.steps.height > MAX_STEP_ROWS else ""
    return ("<h3>The seed's three columns in time, communication, launch delay and copies</h3>"
            + table(headers, rows, caption=f"{use.steps.height} decode step(s){shown}"))


def op_time_figure(ops: pl.DataFrame, steps: int, roles: dict[str, str] | None = None) -> go.Figure:
    """Mean GPU time per decode step of each op, longest at the top, share of busy time and the
    op's role (`roles`: op -> role, ledger.roles.op_roles) in hover."""
    roles = roles or {}
    per = ops.group_by("op").agg(
        (pl.col("kernel_ns").sum() / steps / 1000).alias("us"), (pl.col("kernels").sum() / steps).alias("kernels"),
        (pl.col("share").sum() / steps).alias("share"),
    ).sort("us", "op")
    fig = go.Figure(go.Bar(
        orientation="h", y=[esc(op) for op in per["op"]], x=per["us"].to_list(), marker=dict(color="#1f77b4"),
        hovertext=[f"{esc(op)} (role {esc(roles.get(op, NO_ROLE))}): {us:,.1f} µs per step, {share:.1%} of busy "
                   f"time, {kernels:g} launches per step" for op, us, kernels, share in per.iter_rows()],
        hoverinfo="text",
    ))
    fig.update_layout(height=120 + 22 * per.height, margin=dict(l=180, r=20, t=40, b=50),
                      title=dict(text="GPU time per op (mean µs per decode step)"), xaxis=dict(title="µs per step"))
    return fig


def layer_time_heatmap(layer_groups: pl.DataFrame) -> go.Figure:
    """Layer × group: the median launches per step, or (the switch above the chart) the median
    GPU µs per step; both written in the cells."""
    per = layer_groups.group_by("layer", "group").agg(
        pl.col("kernels").median().alias("kernels"), (pl.col("kernel_ns").median() / 1000).alias("us")
    )
    layers = sorted(per["layer"].unique().to_list())
    groups = sorted(per["group"].unique().to_list())
    cell = {(layer, group): (kernels, us) for layer, group, kernels, us in per.iter_rows()}

    def grid(index: int) -> list[list]:
        return [[cell[(layer, group)][index] if (layer, group) in cell else None for layer in layers]
                for group in groups]

    def texts(index: int, fmt) -> list[list[str]]:
        return [["" if value is None else fmt(value) for value in row] for row in grid(index)]

    counts, micros = grid(0), grid(1)
    count_text, us_text = texts(0, lambda v: f"{v:g}"), texts(1, lambda v: f"{v:,.0f}" if v >= 10 else f"{v:.1f}")
    fig = go.Figure(go.Heatmap(
        x=layers, y=[esc(g) for g in groups], z=counts, text=count_text, texttemplate="%{text}",
        textfont=dict(size=11), colorscale="Blues", xgap=1, ygap=1, hoverinfo="text",
        hovertext=[[f"layer {layer} · {esc(group)}" for layer in layers] for group in groups],
        colorbar=dict(thickness=12),
    ))
    fig.update_layout(
        height=170 + 40 * len(groups), margin=dict(l=90, r=20, t=60, b=50),
        xaxis=dict(title="layer", dtick=2 if len(layers) > 40 else 1), yaxis=dict(autorange="reversed"),
        updatemenus=[dict(type="buttons", direction="right", x=0, y=1.18, xanchor="left", buttons=[
            dict(label="launches per step", method="restyle", args=[{"z": [counts], "text": [count_text]}]),
            dict(label="µs per step", method="restyle", args=[{"z": [micros], "text": [us_text]}]),
        ])],
    )
    return fig


def _layer_heatmap(result: Result) -> str:
    groups = result.time_use.layer_groups
    if groups.height == 0:
        return note("time per layer: layers not attributed in this trace")
    return ("<h3>Time per layer and group (median per decode step; switch launches / µs)</h3>"
            + figure("layer-time", layer_time_heatmap(groups)))


def _top_kernel_table(result: Result) -> str:
    top = top_kernels(result.time_use, TOP_KERNELS, 100)
    roles = op_roles(result.expectations)
    rows = [
        [Cell(label, css="name"), op, roles.get(op, NO_ROLE), kernels, _us_cell(kernel_ns), _us_cell(per_step_ns),
         Cell(f"{share:.1%}", share)]
        for _, label, op, kernels, kernel_ns, per_step_ns, share in top.iter_rows()
    ]
    return "<h3>Kernels by GPU time</h3>" + table(
        ["kernel (one row per full name)", "op", "role", "launches", "total µs", "µs per step", "share of busy"], rows,
        caption=f"the {top.height} kernel names with the most GPU time in the decode steps")


# ---- the offending kernels in a step timeline ----------------------------------------------


def _expand(compact: str) -> list[int]:
    """'3-77, 41' -> [3, ..., 77, 41]."""
    values: list[int] = []
    for part in compact.split(","):
        low, _, high = part.strip().partition("-")
        if low.strip().isdigit():
            values += list(range(int(low), int(high or low) + 1))
    return values


def offending_kernels(result: Result, step_activities: pl.DataFrame) -> pl.DataFrame:
    """`row, finding`: the kernels of one step that the findings blame. An anchor finding blames
    the kernels of its op; a per-layer finding the kernels of its group in its layers whose name
    occurs there more often than in the median peer layer (the extra launch), or, with no peer
    layer, all of that group's kernels there; a sequence finding's extra kernel likewise, among
    the kernels of its label. At most MAX_MARKS per finding."""
    kernels = step_activities.filter(pl.col("activity") == "kernel")
    layers = result.layers
    if layers is not None and "layer_group" not in kernels.columns:
        kernels = kernels.drop("layer", strict=False).join(
            layers.assignments.select("row", "layer", "layer_group"), on="row", how="left")
    marks = []
    for finding in result.findings:
        blamed = _blamed(finding, kernels)
        if blamed is not None and blamed.height:
            marks.append(blamed.head(MAX_MARKS).select("row", pl.lit(finding.message).alias("finding")))
    if not marks:
        return pl.DataFrame(schema={"row": pl.UInt32, "finding": pl.Utf8})
    return pl.concat(marks).unique("row", keep="first", maintain_order=True)


def _blamed(finding: Finding, kernels: pl.DataFrame) -> pl.DataFrame | None:
    if finding.check == "anchor":
        return kernels.filter(pl.col("op") == finding.subject)
    if finding.check == "layer_sequence" and finding.layers and "layer" in kernels.columns:
        # an extra kernel in a layer's sequence (a missing one has no kernel to mark): the
        # kernels its label names, the op or, for a kernel no op claims, the bare name
        if not (finding.observed or "").startswith("+ "):
            return None
        unclaimed = kernels.filter(pl.col("op").is_null() | (pl.col("op") == "other"))["name"].unique().to_list()
        bare = [name for name in unclaimed if _bare_name(name) == finding.subject]
        group = kernels.filter((pl.col("op") == finding.subject) | pl.col("name").is_in(bare))
    elif finding.check in ("layer", "layer_uniform") and finding.layers and "layer_group" in kernels.columns:
        group = kernels.filter(pl.col("layer_group") == finding.subject)
    else:
        return None
    faulty = _expand(finding.layers)
    at_fault = group.filter(pl.col("layer").is_in(faulty))
    peers = group.filter(pl.col("layer").is_not_null() & ~pl.col("layer").is_in(faulty))
    if peers.height == 0:
        return at_fault
    peer_layers = peers["layer"].n_unique()
    # the median launches of each name over the peer layers (zero where a layer lacks it)
    typical = peers.group_by("name", "layer").agg(pl.len().alias("n")).group_by("name").agg(
        pl.col("n").sort().alias("counts"))
    typical = typical.with_columns(
        pl.col("counts").map_elements(lambda c: sorted([0] * (peer_layers - len(c)) + list(c))[peer_layers // 2],
                                      return_dtype=pl.Int64).alias("typical")
    ).select("name", "typical")
    counted = at_fault.group_by("layer", "name").agg(pl.len().alias("n"))
    extra = counted.join(typical, on="name", how="left").filter(pl.col("n") > pl.col("typical").fill_null(0))
    return at_fault.join(extra.select("layer", "name"), on=["layer", "name"], how="semi")


def mark_offending(fig: go.Figure, result: Result, step_activities: pl.DataFrame, origin_ns: int) -> None:
    """Red markers on the step timeline at the kernels the findings blame (hover: the finding)."""
    marks = offending_kernels(result, step_activities)
    if marks.height == 0:
        return
    kernels = step_activities.join(marks, on="row", how="inner")
    fig.add_trace(go.Scatter(
        name="offending kernel", mode="markers",
        x=(((kernels["start"] + kernels["end"]) / 2 - origin_ns) / 1000).to_list(),
        y=[f"stream {s}" for s in kernels["stream"]],
        marker=dict(symbol="x", size=12, color=MARK_COLOUR, line=dict(width=2, color=MARK_COLOUR)),
        hovertext=[f"{esc(short_kernel_name(name, 100))}<br>{esc(finding)}"
                   for name, finding in kernels.select("name", "finding").iter_rows()],
        hoverinfo="text",
    ))
