"""Plotly figures of the HTML report, each from frames the check already computed.

Every text that reaches a chart (kernel names, ops, layers) is escaped with `html_kit.esc`
before it goes into a label or hover text: plotly renders a subset of HTML in them.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
import polars as pl
from plotly.subplots import make_subplots

from nsys_ledger.checks.ledger import short_kernel_name
from nsys_ledger.report.html_kit import esc

# Ledger groups of the expectations, and the activity kinds that are not kernels.
_GROUP_COLOURS = {
    "attention": "#1f77b4",
    "indexer": "#9467bd",
    "ffn": "#2ca02c",
    "moe": "#2ca02c",
    "dense_mlp": "#98df8a",
    "deepep": "#ff7f0e",
    "step": "#8c564b",
    "prefill": "#e377c2",
    "unmatched": "#7f7f7f",
}
_OTHER_COLOURS = ["#17becf", "#bcbd22", "#aec7e8", "#ffbb78", "#c5b0d5", "#c49c94"]
GAP_COLOUR = "#d62728"
H2D_COLOUR = "#000000"
LAUNCH_COLOUR = "#444444"
HOST_ROW = "host: launch calls"
REPLAY_ROW = "graph replays"
IDLE_ROW = "device idle"
REPLAY_COLOURS = ["#c9d6e8", "#8fa9cf"]  # alternating, so that adjacent replays stand apart


def group_colour(group: str, index: int = 0) -> str:
    return _GROUP_COLOURS.get(group, _OTHER_COLOURS[index % len(_OTHER_COLOURS)])


def _short_names(names: pl.Series, limit: int = 100) -> dict[str, str]:
    """Escaped short name of each distinct kernel name (a step has tens of distinct names)."""
    return {name: esc(short_kernel_name(name, limit)) for name in names.unique().drop_nulls().to_list()}


def _us(column: str, origin_ns: int) -> pl.Expr:
    return ((pl.col(column) - origin_ns) / 1000).alias(f"{column}_us")


def step_timeline(
    activities: pl.DataFrame,
    gaps: pl.DataFrame,
    host_calls: pl.DataFrame,
    replays: pl.DataFrame | None = None,
    *,
    origin_ns: int,
) -> go.Figure:
    """One step: kernels per stream as bars coloured by ledger group, graph replay spans, and
    H2D copies, idle gaps above the threshold and the host's launch calls as markers (visible
    at any zoom)."""
    kernels = activities.filter(pl.col("activity") == "kernel")
    copies = activities.filter(pl.col("activity") != "kernel")
    streams = sorted(activities["stream"].unique().drop_nulls().to_list())
    with_replays = replays is not None and replays.height > 0
    rows = [HOST_ROW] + [REPLAY_ROW] * with_replays + [f"stream {s}" for s in streams] + [IDLE_ROW]

    fig = go.Figure()
    if with_replays:
        _add_replay_bars(fig, replays, activities, host_calls, origin_ns)
    _add_kernel_bars(fig, kernels, origin_ns)
    _add_copy_markers(fig, copies, origin_ns)
    _add_gap_markers(fig, gaps, origin_ns)
    _add_launch_markers(fig, host_calls, origin_ns)
    fig.update_layout(
        barmode="overlay",
        height=150 + 42 * len(rows),
        margin=dict(l=140, r=20, t=50, b=50),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
        xaxis=dict(title="µs from the step's first GPU activity (double-click: whole window with host calls)",
                   zeroline=False, range=_gpu_range(activities, origin_ns)),
        yaxis=dict(categoryorder="array", categoryarray=list(reversed(rows)), type="category"),
        hoverlabel=dict(align="left"),
    )
    return fig


def _gpu_range(activities: pl.DataFrame, origin_ns: int) -> list[float] | None:
    """The x range first shown: the step's GPU work. The host runs ahead (a step's launch calls
    may come a whole step before its kernels), so its calls can lie left of this range."""
    if activities.height == 0:
        return None
    low, high = activities["start"].min(), activities["end"].max()
    margin = (high - low) * 0.01
    return [(low - origin_ns - margin) / 1000, (high - origin_ns + margin) / 1000]


def _add_kernel_bars(fig: go.Figure, kernels: pl.DataFrame, origin_ns: int) -> None:
    short = _short_names(kernels["name"])
    ops = {op: esc(op) for op in kernels["op"].fill_null("-").unique().to_list()}
    layer = (
        pl.concat_str(pl.lit(" · layer "), pl.col("layer").cast(pl.Utf8))
        if "layer" in kernels.columns
        else pl.lit("")
    )
    labelled = kernels.with_columns(
        _us("start", origin_ns),
        ((pl.col("end") - pl.col("start")) / 1000).alias("duration_us"),
        pl.concat_str(pl.lit("stream "), pl.col("stream").cast(pl.Utf8)).alias("row"),
        pl.col("group").fill_null("unmatched"),
    ).with_columns(
        pl.concat_str(
            pl.col("name").replace_strict(short, default="?", return_dtype=pl.Utf8),
            pl.lit("<br>op "), pl.col("op").fill_null("-").replace_strict(ops, default="?", return_dtype=pl.Utf8),
            layer.fill_null(" · layer ?"),
            pl.lit("<br>"), pl.col("duration_us").round(2).cast(pl.Utf8), pl.lit(" µs · "), pl.col("row"),
        ).alias("hover")
    )
    # The most frequent group first, so that rarer groups are drawn on top of it.
    groups = labelled.group_by("group").agg(pl.len()).sort(["len", "group"], descending=[True, False])
    for index, group in enumerate(groups["group"].to_list()):
        part = labelled.filter(pl.col("group") == group)
        fig.add_trace(go.Bar(
            name=esc(group), orientation="h", y=part["row"].to_list(), base=part["start_us"].to_list(),
            x=part["duration_us"].to_list(), marker=dict(color=group_colour(group, index), line=dict(width=0)),
            hovertext=part["hover"].to_list(), hoverinfo="text",
        ))


def _add_copy_markers(fig: go.Figure, copies: pl.DataFrame, origin_ns: int) -> None:
    if copies.height == 0:
        return
    labelled = copies.with_columns(
        _us("start", origin_ns),
        pl.concat_str(pl.lit("stream "), pl.col("stream").cast(pl.Utf8)).alias("row"),
        pl.concat_str(
            pl.col("name"), pl.lit(" "), pl.col("bytes").fill_null(0).cast(pl.Utf8), pl.lit(" bytes"),
            pl.when(pl.col("src_kind").is_not_null()).then(pl.concat_str(pl.lit(" from "), pl.col("src_kind")))
            .otherwise(pl.lit("")),
            pl.lit("<br>"), ((pl.col("end") - pl.col("start")) / 1000).round(2).cast(pl.Utf8), pl.lit(" µs"),
        ).alias("hover"),
    )
    fig.add_trace(go.Scatter(
        name="copy / memset", mode="markers", y=labelled["row"].to_list(), x=labelled["start_us"].to_list(),
        marker=dict(symbol="diamond", size=11, color=H2D_COLOUR), hovertext=labelled["hover"].to_list(),
        hoverinfo="text",
    ))


def _add_gap_markers(fig: go.Figure, gaps: pl.DataFrame, origin_ns: int) -> None:
    if gaps.height == 0:
        return
    names = pl.concat([gaps["before"], gaps["after"]])
    short = _short_names(names, 60)
    cause = (
        pl.concat_str(pl.lit("<br>cause "), pl.col("cause").fill_null("?"))
        if "cause" in gaps.columns else pl.lit("")
    )
    labelled = gaps.with_columns(
        (((pl.col("start") + pl.col("end")) / 2 - origin_ns) / 1000).alias("middle_us"),
        pl.concat_str(
            pl.lit("idle "), (pl.col("duration") / 1000).round(2).cast(pl.Utf8), pl.lit(" µs"),
            pl.lit("<br>after "), pl.col("before").replace_strict(short, default="?", return_dtype=pl.Utf8),
            pl.lit("<br>before "), pl.col("after").replace_strict(short, default="?", return_dtype=pl.Utf8),
            cause,
        ).alias("hover"),
    )
    fig.add_trace(go.Scatter(
        name="idle gap above threshold", mode="markers", y=[IDLE_ROW] * labelled.height,
        x=labelled["middle_us"].to_list(), marker=dict(symbol="triangle-down", size=13, color=GAP_COLOUR),
        hovertext=labelled["hover"].to_list(), hoverinfo="text",
    ))


def _add_launch_markers(fig: go.Figure, host_calls: pl.DataFrame, origin_ns: int) -> None:
    if host_calls.height == 0:
        return
    symbols = {"graph_launch": "star", "kernel_launch": "line-ns-open", "memcpy": "diamond-open",
               "memset": "square-open"}
    for kind, symbol in symbols.items():
        part = host_calls.filter(pl.col("kind") == kind).with_columns(_us("start", origin_ns))
        if part.height == 0:
            continue
        hover = [f"{esc(name)}<br>host call at {t:.2f} µs" for name, t in zip(part["name"], part["start_us"])]
        fig.add_trace(go.Scatter(
            name=esc(kind.replace("_", " ")), mode="markers", y=[HOST_ROW] * part.height,
            x=part["start_us"].to_list(),
            marker=dict(symbol=symbol, size=14 if kind == "graph_launch" else 9, color=LAUNCH_COLOUR,
                        line=dict(width=1.5, color=LAUNCH_COLOUR)),
            hovertext=hover, hoverinfo="text",
        ))


def three_column_ledger(steps: pl.DataFrame) -> go.Figure:
    """The seed's three columns per step: CPU submissions, GPU kernels executed, GPU idle gaps."""
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.08,
        subplot_titles=("CPU submissions (launch calls) per step", "GPU kernels executed per step",
                        "GPU idle gaps above the threshold per step"),
    )
    for rank, part in _by_rank(steps):
        hover_gaps = [f"{g} gaps, {ns / 1000:.1f} µs in all" for g, ns in zip(part["gaps"], part["gap_ns"])]
        for row, column, hover in ((1, "cpu_submissions", None), (2, "kernels", None), (3, "gaps", hover_gaps)):
            fig.add_trace(go.Scatter(
                x=part["step"].to_list(), y=part[column].to_list(), mode="lines+markers", name=f"rank {rank}",
                legendgroup=f"rank {rank}", showlegend=row == 1, hovertext=hover,
                line=dict(color=_OTHER_COLOURS[rank % len(_OTHER_COLOURS)] if rank else "#1f77b4"),
            ), row=row, col=1)
    fig.update_xaxes(title_text="decode step", row=3, col=1)
    fig.update_xaxes(**integer_axis(steps["step"].to_list()))
    for row, column in ((1, "cpu_submissions"), (2, "kernels"), (3, "gaps")):
        fig.update_yaxes(**integer_axis(steps[column].to_list()), row=row, col=1)
    fig.update_layout(height=520, margin=dict(l=60, r=20, t=40, b=50), hovermode="x unified")
    return fig


def step_durations(steps: pl.DataFrame) -> go.Figure:
    """Step time per step (GPU span), with the median and p90 over all steps."""
    fig = go.Figure()
    for rank, part in _by_rank(steps):
        fig.add_trace(go.Scatter(
            x=part["step"].to_list(), y=(part["duration_ns"] / 1e6).to_list(), mode="lines+markers",
            name=f"rank {rank}",
            line=dict(color=_OTHER_COLOURS[rank % len(_OTHER_COLOURS)] if rank else "#1f77b4"),
        ))
    durations = steps["duration_ns"].drop_nulls() / 1e6
    if durations.len():
        for label, value, dash in (("median", durations.median(), "dash"), ("p90", durations.quantile(0.9), "dot")):
            fig.add_hline(y=value, line=dict(color="#57606a", dash=dash, width=1),
                          annotation_text=f"{label} {value:.3f} ms", annotation_position="top left")
    fig.update_layout(height=320, margin=dict(l=60, r=20, t=30, b=50), xaxis_title="decode step",
                      yaxis_title="ms (first GPU start to last GPU end)")
    fig.update_xaxes(**integer_axis(steps["step"].to_list()))
    return fig


MAX_INTEGER_TICKS = 8


def integer_axis(values) -> dict:
    """Axis settings that tick whole numbers only, for step indexes and counts: left to
    itself plotly ticks 0.5 steps and 2,001.5 kernels when the values barely vary."""
    present = [v for v in values if v is not None]
    if not present:
        return dict(tickformat=",d")
    low, high = math.floor(min(present)), math.ceil(max(present))
    dtick = _nice_step(math.ceil((high - low + 2) / MAX_INTEGER_TICKS))
    low -= low % dtick  # ticks on multiples of the step: 0, 50, 100, not 3, 53, 103
    return dict(tickmode="linear", tick0=low, dtick=dtick, tickformat=",d",
                range=[low - dtick / 2, high + dtick / 2])


def _nice_step(at_least: int) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... not below `at_least`."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= at_least:
                return factor * magnitude
        magnitude *= 10


def _by_rank(steps: pl.DataFrame):
    for (rank,), part in steps.sort("rank", "step").group_by("rank", maintain_order=True):
        yield rank, part


# The terms of the seed's step time budget (checks.budget), in stacking order.
BUDGET_TERMS = [
    ("busy_ns", "Σ t_i: kernels, copies, memsets", "#1f77b4"),
    ("small_gap_ns", "N·g: gaps up to the threshold", "#aec7e8"),
    ("collective_ns", "C_comm: collectives and their waits", "#ff7f0e"),
    ("host_ns", "T_host: host-caused gaps", "#d62728"),
    ("other_gap_ns", "other gaps (H2D, graph boundary, unknown)", "#9467bd"),
    ("overhead_ns", "profiler overhead", "#7f7f7f"),
]


def step_budget(steps: pl.DataFrame) -> go.Figure:
    """T_step ≈ Σ t_i + N·g + C_comm + T_host per step, as stacked bars (ms); one panel per rank."""
    ranks = steps["rank"].unique().sort().to_list()
    fig = make_subplots(rows=len(ranks), cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[f"rank {r}" for r in ranks] if len(ranks) > 1 else None)
    for row, (rank, part) in enumerate(_by_rank(steps), start=1):
        for column, label, colour in BUDGET_TERMS:
            fig.add_trace(go.Bar(
                x=part["step"].to_list(), y=(part[column].fill_null(0) / 1e6).to_list(), name=esc(label),
                marker=dict(color=colour, line=dict(width=0)), legendgroup=column, showlegend=row == 1,
            ), row=row, col=1)
    fig.update_layout(barmode="stack", height=260 + 160 * len(ranks), margin=dict(l=60, r=20, t=40, b=50),
                      legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0), bargap=0.1)
    fig.update_yaxes(title_text="ms")
    fig.update_xaxes(title_text="decode step", row=len(ranks), col=1)
    fig.update_xaxes(**integer_axis(steps["step"].to_list()))
    return fig


def _add_replay_bars(fig: go.Figure, replays: pl.DataFrame, activities: pl.DataFrame, host_calls: pl.DataFrame,
                     origin_ns: int) -> None:
    """The span of each graph replay of the step in its own row (a split graph shows two),
    with how long before it the host launched it and its first and last kernel's op and layer.
    A step has one to a few replays, so the hover texts are built row by row."""
    launches = host_calls.filter(pl.col("kind") == "graph_launch").select(
        "pid", "correlation", pl.col("start").alias("launch_start")
    )
    labelled = replays.join(launches, on=["pid", "correlation"], how="left").with_columns(
        _us("start", origin_ns), ((pl.col("end") - pl.col("start")) / 1000).alias("duration_us"),
        ((pl.col("start") - pl.col("launch_start")) / 1000).alias("launch_lead_us"),
    )
    kernel_of_row = {
        row["row"]: row for row in activities.filter(pl.col("row").is_in(
            pl.concat([labelled.get_column("first_row", default=pl.Series([], dtype=pl.UInt32)),
                       labelled.get_column("last_row", default=pl.Series([], dtype=pl.UInt32))]).implode()
        )).iter_rows(named=True)
    }

    def kernel(row_id) -> str:
        found = kernel_of_row.get(row_id)
        if found is None:
            return "?"
        layer = found.get("layer")
        return f"{esc(found['op'] or '-')} (layer {layer if layer is not None else '?'})"

    hover = [
        f"replay {r['replay']}: {r['kernels']} kernels, {r['duration_us']:.1f} µs"
        + (f"<br>launched {r['launch_lead_us']:.1f} µs before it started" if r["launch_lead_us"] is not None else "")
        + f"<br>first {kernel(r.get('first_row'))}<br>last {kernel(r.get('last_row'))}"
        for r in labelled.iter_rows(named=True)
    ]
    fig.add_trace(go.Bar(
        name="graph replay", orientation="h", y=[REPLAY_ROW] * labelled.height,
        base=labelled["start_us"].to_list(), x=labelled["duration_us"].to_list(),
        marker=dict(color=[REPLAY_COLOURS[i % 2] for i in range(labelled.height)],
                    line=dict(width=1, color="#1b1f24")),
        hovertext=hover, hoverinfo="text",
    ))


def layer_heatmap(deviations: pl.DataFrame) -> go.Figure:
    """Layer × ledger group, coloured by the signed deviation from expectation (red: extra
    launches, blue: missing ones, white: as expected); the launch count is written in each cell."""
    layers = deviations["layer"].unique().sort().to_list()
    groups = deviations["group"].unique().sort().to_list()
    cell = {(row["layer"], row["group"]): row for row in deviations.iter_rows(named=True)}

    def grid(value) -> list[list]:
        return [[value(cell.get((layer, group))) for layer in layers] for group in groups]

    def hover(row) -> str:
        if row is None:
            return ""
        low, high = row["count_min"], row["count_max"]
        counts = f"{low}" if low == high else f"{low}-{high}"
        return (
            f"layer {row['layer']} · {esc(row['group'])} ({esc(row['class_set'])})<br>{counts} launches per step; "
            f"ledger {_range_text(row['low'], row['high'])}, peers {row['peer']}<br>deviation {row['deviation']:+g} "
            f"in the worst step; {row['steps_deviating']} step(s) deviate"
        )

    limit = max(1, int(deviations["deviation"].abs().max() or 0))
    fig = go.Figure(go.Heatmap(
        x=layers, y=[esc(g) for g in groups], z=grid(lambda r: None if r is None else r["deviation"]),
        text=grid(lambda r: "" if r is None else str(r["count"])), texttemplate="%{text}",
        textfont=dict(size=HEATMAP_TEXT_PX),
        hovertext=grid(hover), hoverinfo="text", zmin=-limit, zmax=limit, zmid=0, xgap=1, ygap=1,
        colorscale=[[0, "#2166ac"], [0.5, "#ffffff"], [1, "#b2182b"]],
        colorbar=dict(title=dict(text="deviation"), thickness=12, tickfont=dict(size=HEATMAP_TEXT_PX)),
    ))
    # Cells wide enough for their count at a readable size: a wide model scrolls sideways
    # (the chart's div) rather than shrinking its numbers to 9 px.
    fig.update_layout(height=150 + HEATMAP_CELL_PX["height"] * len(groups), margin=dict(l=90, r=20, t=20, b=50),
                      width=max(HEATMAP_MIN_WIDTH, 200 + HEATMAP_CELL_PX["width"] * len(layers)), autosize=False,
                      xaxis=dict(title="layer", tickmode="linear", tick0=min(layers, default=0), dtick=1,
                                 tickformat="d", tickfont=dict(size=HEATMAP_TEXT_PX)),
                      yaxis=dict(autorange="reversed", tickfont=dict(size=HEATMAP_TEXT_PX)))
    return fig


HEATMAP_TEXT_PX = 13
HEATMAP_CELL_PX = {"width": 26, "height": 40}  # a two-digit count at 13 px, with a margin
HEATMAP_MIN_WIDTH = 900


def _range_text(low: float | None, high: float | None) -> str:
    def fmt(value: float) -> str:
        return f"{value:g}"

    if low is not None and high is not None:
        return fmt(low) if low == high else f"{fmt(low)}-{fmt(high)}"
    return "any"
