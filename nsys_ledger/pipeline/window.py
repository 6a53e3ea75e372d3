"""One window: the per-step stages on the activities of a few whole decode steps.

The window's own activities come with context, so that every figure of its steps is the one
the whole trace gives:

* the decode steps just before and after it in each rank (`halo`), whole: a gap at a step's
  edge, a graph break or a kernel started in a step's GPU span may involve them, and "where
  spans overlap, the later step takes it" needs their spans;
* every other activity that overlaps the window's time, as plain non-step work (the device
  is busy either way): kernels still running from earlier steps, copies of later ones.

The stages then run as on a whole trace; what they say about the halo is dropped, and the
window keeps only its own steps' rows and its own activities' layers (`WindowResult`).
Figures over all steps (kernels per name, distinct streams, unresolved graph nodes) are kept
as the window's parts so that the merge can add them up.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from nsys_ledger.attribution.layers import attribute_layers
from nsys_ledger.attribution.graph_capture import RESOLVED
from nsys_ledger.attribution.steps import Steps
from nsys_ledger.checks.coverage import op_coverage
from nsys_ledger.checks.layers import LayerSummary, layer_assignments, summarize_layers
from nsys_ledger.checks.stats import op_counts, step_table
from nsys_ledger.checks.step_kinds import kind_step_table
from nsys_ledger.checks.time_use import NO_OP, TimeUse, time_use
from nsys_ledger.checks.timeline import Timeline, add_timeline_columns, build_timeline
from nsys_ledger.ledger import Expectations
from nsys_ledger.pipeline.plan import WindowPlan
from nsys_ledger.trace import Trace

STEP_KEY = ["rank", "step"]
STEP_COLUMNS = ["key", "window", "step", "rank", "decode"]  # what makes an activity part of a step


@dataclass(frozen=True)
class WindowSettings:
    """What every window is checked with (the same for all of them)."""

    expectations: Expectations | None
    threshold_ns: int
    per_stream_gaps: bool
    batch: int | None


@dataclass(frozen=True)
class WindowResult:
    """The figures of one window's own steps and activities."""

    part: int
    table: pl.DataFrame  # step table rows (checks.stats.step_table + timeline columns)
    ops: pl.DataFrame  # op table rows
    timeline: Timeline  # gaps, stream gaps, budget, H2D, replays, breaks of its steps
    layers: LayerSummary  # counts, sequences, inferred steps, edits of its steps; layers of its activities
    unresolved_kernels: pl.DataFrame  # rank, status, graph_node_id, kernels (summed and counted in the merge)
    op_of_row: pl.DataFrame  # row, op, group: the sequence-placed op of each of its activities
    time: TimeUse  # per-step frames of its steps; `kernels` with `_first_row`, `streams` distinct rows
    decode_steps_per_rank: pl.DataFrame  # rank, steps: its decode steps that have activities
    kind_table: pl.DataFrame  # its complete prefill and mixed steps
    coverage_names: pl.DataFrame | None  # op coverage by kernel name of its decode kernels


@dataclass(frozen=True)
class WindowInput:
    """What one window is checked from: all a worker process needs besides the trace's small
    tables (its activity tables are not read here)."""

    part: int
    steps: Steps  # its own host windows and the halo; its activities with the overlapping context
    owned: pl.Series  # which of `steps.activities` the window owns (the others are context)
    own_windows: pl.DataFrame  # its own host windows (Steps.windows rows)


def cut_window(steps: Steps, plan: WindowPlan, part: int) -> WindowInput:
    """The window's Steps (own host windows, the halo and the overlapping context) and which of
    its activities the window owns."""
    activities = steps.activities
    own, halo = own_and_halo(plan.windows, part)
    if plan.count == 1:
        return WindowInput(part, steps, pl.repeat(True, activities.height, eager=True), own)
    own_span = plan.part_spans.filter(pl.col("part") == part)
    first, last = time_reach(int(own_span["first"][0]), int(own_span["last"][0]), halo)
    # rows are in start order: the window's own rows and the halo's lie between its first start
    # and last end, and so does the context: the rows starting up to `last`, from the first row
    # whose end (a running maximum) reaches `first`
    low = int(plan.reach.search_sorted(first, side="left"))
    high = int(activities["start"].search_sorted(last, side="right"))
    sliced = activities.slice(low, high - low)
    owned_rows = plan.part_of_row.slice(low, high - low) == part
    in_halo = plan.window_id_of_row.slice(low, high - low).is_in(halo["window_id"].implode()).fill_null(False)
    ends = sliced["end"].fill_null(sliced["start"])
    return window_input(steps, part, own, halo, sliced, owned_rows, in_halo, ends >= first)


def own_and_halo(windows: pl.DataFrame, part: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The window's own host windows, and its halo: the decode steps just before and after its
    own in each rank (rows of a plan's `windows`)."""
    own = windows.filter(pl.col("part") == part)
    own_decode = own.filter(pl.col("decode"))
    edges = own_decode.group_by("rank").agg((pl.col("step").min() - 1).alias("before"),
                                            (pl.col("step").max() + 1).alias("after"))
    halo = windows.filter(pl.col("decode")).join(edges, on="rank", how="inner").filter(
        (pl.col("step") == pl.col("before")) | (pl.col("step") == pl.col("after"))).select(windows.columns)
    return own, halo


def time_reach(own_first: int, own_last: int, halo: pl.DataFrame) -> tuple[int, int]:
    """The stretch of GPU time a window's figures may involve: from the first start to the last
    end of its own activities and its halo's."""
    first = min([own_first, *(int(t) for t in halo["first"].drop_nulls())])
    last = max([own_last, *(int(t) for t in halo["last"].drop_nulls())])
    return first, last


def window_input(steps: Steps, part: int, own: pl.DataFrame, halo: pl.DataFrame, rows: pl.DataFrame,
                 owned_rows: pl.Series, in_halo: pl.Series, overlapping: pl.Series) -> WindowInput:
    """The window's input from `rows`, activities in start order around it: those it owns
    (`owned_rows`) and the halo's (`in_halo`) with their steps, the others that overlap its time
    (`overlapping`) as plain non-step work, the rest left out."""
    in_set = owned_rows | in_halo
    keep = in_set | overlapping
    sub = rows.with_columns(pl.lit(in_set).alias("_in_set")).filter(pl.lit(keep)).with_columns(
        pl.when(pl.col("_in_set")).then(pl.col(c)).alias(c) for c in STEP_COLUMNS
    ).drop("_in_set")
    members = pl.concat([own, halo]).select("key", "window").unique()
    sub_windows = steps.windows.join(members, on=["key", "window"], how="semi")
    return WindowInput(part, replace(steps, windows=sub_windows, activities=sub), owned_rows.filter(keep), own)


def run_window(trace: Trace, window: WindowInput, settings: WindowSettings) -> WindowResult:
    """The per-step stages of one window, cut to its own steps and activities. `trace`: its
    API calls, NVTX ranges, syncs, graph nodes and replays, profiler overhead are read."""
    expectations = settings.expectations
    op_names = list(expectations.ops) if expectations else []
    part, sub, owned, own_windows = window.part, window.steps, window.owned, window.own_windows
    own_steps = own_windows.filter(pl.col("decode")).select(STEP_KEY)

    # layers first: the timeline names the layer of each gap's and graph break's neighbours, and
    # a kernel whose name several ops share counts as the op of its place in its layer's
    # sequence, in the op counts, the time use and the neighbours alike
    attribution = attribute_layers(trace, sub.activities, expectations)
    sub = replace(sub, activities=sub.activities.with_columns(
        attribution.activities["op"], attribution.activities["group"], attribution.activities["layer"]))
    timeline = build_timeline(sub, trace, settings.threshold_ns, per_stream=settings.per_stream_gaps,
                              step_entry=expectations.step_entry_gaps if expectations else None)
    table = add_timeline_columns(step_table(sub, timeline.gaps), timeline, settings.batch)
    time = time_use(sub, layer_assignments(attribution))  # the context's layers too: gap neighbours

    mine = _own_steps(own_steps)
    whole = bool(owned.all())  # one window for the whole trace: nothing to cut away (nor to copy)
    owned_attribution = attribution if whole else replace(
        attribution, activities=attribution.activities.filter(owned),
        inferred=mine(attribution.inferred), edits=mine(attribution.edits), notes=(),
    )
    layers = summarize_layers(owned_attribution)
    owned_steps = sub if whole else replace(sub, activities=sub.activities.filter(owned))
    own_decode = owned_steps.activities.lazy().filter(pl.col("decode").fill_null(False))
    kinds = own_windows.filter(pl.col("complete") & (pl.col("kind") != "decode")).select(
        "rank", "kind", pl.col("kind_step").alias("step"))
    return WindowResult(
        part=part,
        table=mine(table),
        ops=mine(op_counts(sub, op_names)),
        timeline=replace(
            timeline, gaps=mine(timeline.gaps),
            stream_gaps=None if timeline.stream_gaps is None else mine(timeline.stream_gaps),
            budget=mine(timeline.budget), h2d=mine(timeline.h2d), replays=mine(timeline.replays),
            breaks=mine(timeline.breaks),
        ),
        layers=layers,
        unresolved_kernels=_unresolved_kernels(owned_attribution),
        op_of_row=owned_steps.activities.select("row", "op", "group"),
        time=replace(
            time, steps=mine(time.steps), ops=mine(time.ops), groups=mine(time.groups), layers=mine(time.layers),
            layer_groups=mine(time.layer_groups), launch_delay=mine(time.launch_delay), copies=mine(time.copies),
            kernels=_kernels_by_name(own_decode),
            streams=own_decode.select("rank", "pid", "device", "stream").unique().collect(),
        ),
        decode_steps_per_rank=own_decode.group_by("rank").agg(pl.struct("step").n_unique().cast(pl.Int64)
                                                              .alias("steps")).collect(),
        kind_table=kind_step_table(sub, op_names).join(kinds, on=["rank", "kind", "step"], how="semi",
                                                         maintain_order="left"),
        coverage_names=(op_coverage(owned_steps.activities, own_steps, expectations).names
                        if expectations is not None else None),
    )


def _own_steps(own_steps: pl.DataFrame):
    """A filter to the window's own decode steps that keeps the frame's row order."""
    def mine(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.join(own_steps, on=STEP_KEY, how="semi", maintain_order="left")
    return mine


def _kernels_by_name(decode: pl.LazyFrame) -> pl.DataFrame:
    """`rank, name, op, kernels, kernel_ns, _first_row` of the window's decode kernels
    (time_use.kernel_names_by_time's figures): the op is the one of the name's first kernel, and
    `_first_row` says which came first over windows."""
    return decode.filter(pl.col("activity") == "kernel").group_by("rank", "name").agg(
        pl.col("op").fill_null(NO_OP).first(), pl.len().cast(pl.Int64).alias("kernels"),
        (pl.col("end") - pl.col("start")).sum().cast(pl.Int64).alias("kernel_ns"),
        pl.col("row").first().alias("_first_row"),
    ).collect()


def _unresolved_kernels(attribution) -> pl.DataFrame:
    """`rank, status, graph_node_id, kernels`: the window's decode graph kernels without a capture
    origin, per node (the merge counts the distinct nodes over all windows)."""
    nodes = attribution.capture.filter(pl.col("status") != RESOLVED).select("pid", "graph_node_id", "status")
    kernels = attribution.activities.lazy().filter(
        pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel") & pl.col("graph_node_id").is_not_null())
    return (kernels.join(nodes.lazy(), on=["pid", "graph_node_id"], how="inner")
            .group_by("rank", "status", "graph_node_id").agg(pl.len().cast(pl.Int64).alias("kernels")).collect())
