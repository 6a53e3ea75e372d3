"""Merge: the windows' frames stacked into the frames one whole-trace window gives.

Every per-step frame is sorted by `rank, step` first, and no step is in two windows, so the
windows' rows stacked and sorted stably by `rank, step` are the whole trace's rows in its
order. Figures over many steps are added up again here from the windows' parts: kernels per
name (the op of the name's first kernel), distinct streams and graph nodes, layer coverage,
the copies grid (every copy kind the trace has, in every step), the inference notes.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.layers import inference_notes
from nsys_ledger.checks.coverage import NAMES_SCHEMA, OpCoverage
from nsys_ledger.checks.layers import LayerSummary
from nsys_ledger.checks.time_use import COPY_KINDS, TimeUse
from nsys_ledger.checks.timeline import STEP_KEY, Timeline
from nsys_ledger.ledger import Expectations
from nsys_ledger.pipeline.window import WindowResult


@dataclass(frozen=True)
class Merged:
    table: pl.DataFrame
    ops: pl.DataFrame
    timeline: Timeline
    layers: LayerSummary
    op_of_row: pl.DataFrame  # row, op, group of every activity, in row order
    time: TimeUse
    kind_table: pl.DataFrame
    coverage: OpCoverage | None


def merge_windows(parts: list[WindowResult], expectations: Expectations | None, decode_steps: pl.DataFrame) -> Merged:
    """`decode_steps`: `rank, step` of every decode step (the coverage is over all of them)."""
    parts = sorted(parts, key=lambda part: part.part)
    timelines = [p.timeline for p in parts]
    first = timelines[0]
    timeline = Timeline(
        threshold_ns=first.threshold_ns,
        gaps=_by_step([t.gaps for t in timelines]),
        stream_gaps=None if first.stream_gaps is None else _by_step([t.stream_gaps for t in timelines]),
        budget=_by_step([t.budget for t in timelines]),
        h2d=_by_step([t.h2d for t in timelines]),
        replays=_by_step([t.replays for t in timelines]),
        breaks=_by_step([t.breaks for t in timelines]),
    )
    names = None
    if expectations is not None:
        names = _stack([p.coverage_names for p in parts]).group_by("rank", "name", "op", "coverage").agg(
            pl.col("kernels").sum()).select(list(NAMES_SCHEMA)).cast(NAMES_SCHEMA).sort(
            ["rank", "kernels", "name", "op"], descending=[False, True, False, False], maintain_order=True)
    return Merged(
        table=_by_step([p.table for p in parts]),
        ops=_by_step([p.ops for p in parts]),
        timeline=timeline,
        layers=_layers(parts, expectations),
        op_of_row=_by_row([p.op_of_row for p in parts]),
        time=_time_use(parts),
        kind_table=_stack([p.kind_table for p in parts]).sort("rank", "kind", "step", maintain_order=True),
        coverage=None if names is None else OpCoverage(names=names, steps=decode_steps.select(STEP_KEY)),
    )


def _stack(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """The frames one under the other (an empty one may type an all-null column differently)."""
    filled = [f for f in frames if f.height]
    if not filled:
        return frames[0]
    return pl.concat(filled, how="vertical_relaxed") if len(filled) > 1 else filled[0]


def _by_row(frames: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-activity frames in row order (one window's frame is already: not copied)."""
    return frames[0] if len(frames) == 1 else _stack(frames).sort("row")


def _by_step(frames: list[pl.DataFrame]) -> pl.DataFrame:
    return _stack(frames).sort(STEP_KEY, maintain_order=True)


def _layers(parts: list[WindowResult], expectations: Expectations | None) -> LayerSummary:
    summaries = [p.layers for p in parts]
    coverage = _stack([s.coverage for s in summaries]).group_by("rank", "how").agg(
        pl.col("kernels").sum().cast(pl.Int64)).sort("rank", "how")
    unresolved = _stack([p.unresolved_kernels for p in parts]).group_by("rank", "status").agg(
        pl.col("graph_node_id").n_unique().cast(pl.Int64).alias("nodes"),
        pl.col("kernels").sum().cast(pl.Int64).alias("kernels"),
    ).sort("rank", "status")
    sequences = _by_step([s.sequences for s in summaries])
    # one text per sequence id, spelled from its first layer in (rank, step, layer) order, as a
    # whole-trace window spells it; the texts in the order of those first layers
    first_layers = sequences.unique(subset="sequence_id", keep="first", maintain_order=True).with_row_index("_order")
    texts = (_stack([s.sequence_texts for s in summaries]).unique(subset="sequence_id", keep="first")
             .join(first_layers.select("sequence_id", "_order"), on="sequence_id", how="left")
             .sort("_order").drop("_order"))
    inferred = _by_step([s.inferred for s in summaries])
    notes: tuple[str, ...] = ()
    if expectations is not None and expectations.layer_opening_op and inferred.height:
        notes = tuple(inference_notes(inferred, expectations))
    return LayerSummary(
        regex=summaries[0].regex,
        coverage=coverage,
        counts=_by_step([s.counts for s in summaries]),
        sequences=sequences,
        sequence_texts=texts,
        inferred=inferred,
        unresolved_graph_nodes=unresolved,
        assignments=_by_row([s.assignments for s in summaries]),
        notes=notes,
        edits=_stack([s.edits for s in summaries]).sort("rank", "step", "layer", maintain_order=True),
    )


def _time_use(parts: list[WindowResult]) -> TimeUse:
    times = [p.time for p in parts]
    steps = _stack([p.decode_steps_per_rank for p in parts]).group_by("rank").agg(pl.col("steps").sum())
    kernels = (
        _stack([t.kernels for t in times]).sort("_first_row")
        .group_by("rank", "name", maintain_order=True)
        .agg(pl.col("op").first(), pl.col("kernels").sum(), pl.col("kernel_ns").sum())
        .join(steps, on="rank", how="left")
        .sort("rank", "kernel_ns", "name", descending=[False, True, False])
    )
    streams = _stack([t.streams for t in times]).group_by("rank", "pid", "device").agg(
        pl.col("stream").n_unique().cast(pl.Int64).alias("streams")).sort("rank", "pid", "device")
    return TimeUse(
        steps=_by_step([t.steps for t in times]),
        ops=_by_step([t.ops for t in times]),
        groups=_by_step([t.groups for t in times]),
        layers=_by_step([t.layers for t in times]),
        layer_groups=_by_step([t.layer_groups for t in times]),
        kernels=kernels,
        launch_delay=_by_step([t.launch_delay for t in times]),
        copies=_copies_grid(_by_step([t.copies for t in times])),
        streams=streams,
    )


def _copies_grid(copies: pl.DataFrame) -> pl.DataFrame:
    """Every copy kind some window saw, in every step (time_use.copies' grid over all steps)."""
    kinds = [*COPY_KINDS, *sorted(set(copies["kind"].to_list()) - set(COPY_KINDS))]
    steps = copies.select(STEP_KEY).unique(maintain_order=True)
    grid = steps.join(pl.DataFrame({"kind": kinds}), how="cross")
    order = {kind: i for i, kind in enumerate(kinds)}
    return grid.join(copies, on=[*STEP_KEY, "kind"], how="left").with_columns(
        pl.col(c).fill_null(0) for c in ("count", "bytes", "time_ns")
    ).sort(*STEP_KEY, pl.col("kind").replace_strict(order, return_dtype=pl.Int64))
