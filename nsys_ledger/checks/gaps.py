"""Idle time of the GPU inside decode steps, and why the GPU waited.

One sweep over the device timeline (per process and device, or per stream on request) cuts
it into segments between consecutive activity boundaries. Every kernel, copy and memset
counts +1 while it runs; PROFILER_OVERHEAD ranges of the process count on their own. A
segment is

* ``busy``        something other than a collective runs (the Σ t_i of the step budget),
* ``collective``  only collectives (NCCL, custom all-reduce, DeepEP) run,
* ``overhead``    nothing runs but the profiler was flushing its buffers: excluded from
                  gaps, as nsys's `gpu_gaps` does,
* ``idle``        nothing at all.

Segments are given to the decode step whose GPU span (first start to last end of its
activities on that device) holds them, so idle time between steps and around excluded
windows (prefill, warm-up) is never a gap. An idle segment longer than the threshold is a
gap; it carries the activity that ended last before it and the one that started after it,
and a cause, read from who was late (the event that ended the gap); first match wins:

1. ``sync``            a host-blocking synchronize call (cuda*Synchronize, or a CUPTI
                       event/stream/context sync row) of the process returned inside the gap,
                       before the next activity's launching call began: the host waited,
                       then launched late. (A sync that merely spans the gap is no cause: an
                       overlapping scheduler always waits for the step the GPU runs, with
                       the next work already queued.)
2. ``h2d``             a host-to-device copy ends the gap, or a pageable one (which blocks
                       the host until it is staged) opened it
3. ``launch``          the next activity is the first kernel of a graph replay and its
                       `cudaGraphLaunch` returned after the device went idle: the GPU waited
                       for the host to launch the graph (a ~2000-node graph takes several µs),
                       whatever copy finished before
4. ``host``            the next activity's (eager) launching call returned after the device
                       went idle: the GPU waited for the CPU
5. ``h2d``             a pinned host-to-device copy ended right before it, launches on time
6. ``graph_boundary``  the gap separates two graph replays, or a replay and eager work,
                       while the host was ahead (graph launch latency on the device)
7. ``collective``      the next kernel is a collective and its launch was not late: it
                       waited for something outside this process (its peers)
8. ``unknown``         nothing in the trace explains it (a device-side delay)

A ledger may allow the step entry's `launch` gap ([gaps] step_entry_per_launch): such a gap
keeps its cause and is listed with `step_entry` set, but is no finding (`mark_step_entry_gaps`).
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.frames import group_agg
from nsys_ledger.ledger.model import StepEntryGaps

# Kernel names of collectives: NCCL, SGLang's custom all-reduce (one/two shot, the 1/2 stage
# cross-device reduce, the all-reduce fused with the norm), DeepEP dispatch/combine.
COLLECTIVE_REGEX = (
    r"(?i)nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deep_ep::"
)
GAP_CAUSES = ("sync", "h2d", "launch", "host", "graph_boundary", "collective", "unknown")
BLOCKING_SYNC_TYPES = ("Event sync", "Stream sync", "Context sync")
SEGMENT_KINDS = ("busy", "collective", "overhead", "idle")
SEGMENT_KIND = pl.Enum(SEGMENT_KINDS)

DEVICE_KEY = ["pid", "device"]
STREAM_KEY = ["pid", "device", "stream"]

# Activity attributes a gap reports for its neighbours (before_*, after_*).
NEIGHBOUR_COLUMNS = ["name", "op", "layer", "activity", "copy_kind", "src_kind", "graph_node_id", "correlation",
                     "api_start", "api_end", "stream"]

GAP_SCHEMA = {
    "rank": pl.Int64, "step": pl.Int64, "pid": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
    "start": pl.Int64, "end": pl.Int64, "duration": pl.Int64, "cause": pl.Utf8,
    "before": pl.Utf8, "before_op": pl.Utf8, "before_layer": pl.Int64,
    "after": pl.Utf8, "after_op": pl.Utf8, "after_layer": pl.Int64,
    "before_row": pl.UInt32, "after_row": pl.UInt32,  # the neighbours' `row` ids (null: profiler overhead)
    "step_entry": pl.Boolean,  # an allowed step-entry launch gap (mark_step_entry_gaps): listed, no finding
}


def collective_names(activities: pl.DataFrame) -> pl.Series:
    """The distinct kernel names that are collectives (the regex runs once per distinct name)."""
    names = (
        activities.lazy().filter(pl.col("activity") == "kernel").select(pl.col("name").unique().drop_nulls())
        .collect().to_series()
    )
    return names.filter(names.str.contains(COLLECTIVE_REGEX))


def is_collective(names: pl.Series) -> pl.Expr:
    """True for kernels whose name is in `names` (collective_names); copies and memsets are not."""
    return (pl.col("activity") == "kernel") & pl.col("name").is_in(names.implode()).fill_null(False)


def timeline_segments(
    activities: pl.DataFrame, overhead: pl.DataFrame, key: list[str], collectives: pl.Series | None = None
) -> pl.DataFrame:
    """The device timeline per `key` as consecutive segments with what ran in them.

    Columns: key..., `seg_start`, `seg_end`, `kind` (SEGMENT_KIND), `before_row` (the row id
    of the activity whose end opened the segment) and `after_row` (the one whose start closed
    it); row ids are the `row` column of `activities`. Zero-length segments are dropped. Sorted
    by key, then time: each key's segments tile its timeline from its first to its last event.
    `collectives`: collective_names(activities), when already known.
    """
    if collectives is None:
        collectives = collective_names(activities)
    acts = activities.select(
        *key, "row", "start",
        pl.max_horizontal("start", "end").alias("end"),  # a row ending before it starts counts as a point
        (~is_collective(collectives)).cast(pl.Int32).alias("_compute"),
    )
    ranges = overhead.select("pid", "start", "end").filter(pl.col("end") > pl.col("start"))
    # few groups (processes x devices, or x streams): one sort per group on one column is far
    # cheaper than a sort of everything by several columns
    # a damaged export can leave a pid or device NULL: such groups sort last instead of failing
    # one value in every key column (nulls count as a value) is one group: integer n_unique per
    # column is several times cheaper than n_unique of a struct of them
    one_group = all(n == 1 for n in acts.select(pl.col(k).n_unique() for k in key).row(0))
    groups = [acts] if one_group else sorted(  # one device: no partition, which would copy it all
        acts.partition_by(key, maintain_order=True),
        key=lambda g: tuple((g[k][0] is None, g[k][0] or 0) for k in key),
    )
    parts = [_group_segments(group, ranges.filter(pl.col("pid") == group["pid"][0]), key) for group in groups]
    if not parts:
        return pl.DataFrame(schema={**{k: pl.Int64 for k in key}, "seg_start": pl.Int64, "seg_end": pl.Int64,
                                    "kind": SEGMENT_KIND, "before_row": pl.UInt32, "after_row": pl.UInt32})
    return pl.concat(parts, how="vertical")


def _group_segments(group: pl.DataFrame, overhead: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """Segments of one key's timeline (see timeline_segments)."""
    key_values = group.select(pl.col(k).first() for k in key).row(0)
    # one lazy query, so that the intermediate event tables are freed as soon as they are read
    group = group.lazy()
    # `_t2` = 2 t for starts, 2 t + 1 for ends: at equal times starts come first, so
    # back-to-back activities leave no zero-length hole
    starts = group.select(
        (pl.col("start") * 2).alias("_t2"), pl.lit(1, pl.Int32).alias("_all"), "_compute",
        pl.lit(0, pl.Int32).alias("_overhead"), "row",
    )
    ends = group.select(
        (pl.col("end") * 2 + 1).alias("_t2"), pl.lit(-1, pl.Int32).alias("_all"),
        (-pl.col("_compute")).alias("_compute"), pl.lit(0, pl.Int32).alias("_overhead"), "row",
    )
    no_activity = [pl.lit(0, pl.Int32).alias("_all"), pl.lit(0, pl.Int32).alias("_compute")]
    overhead = overhead.lazy()
    overhead_events = pl.concat([
        overhead.select((pl.col("start") * 2).alias("_t2"), *no_activity, pl.lit(1, pl.Int32).alias("_overhead"),
                        pl.lit(None, pl.UInt32).alias("row")),
        overhead.select((pl.col("end") * 2 + 1).alias("_t2"), *no_activity, pl.lit(-1, pl.Int32).alias("_overhead"),
                        pl.lit(None, pl.UInt32).alias("row")),
    ])
    # one stable sort of all events (measured: cheaper than sorting starts and ends apart and
    # merging them); equal times keep the activities' order, so neighbours are deterministic
    events = pl.concat([starts, ends, overhead_events]).sort("_t2", maintain_order=True)
    running = events.with_columns(
        pl.col("_all").cum_sum(),
        pl.col("_compute").cum_sum(),
        pl.col("_overhead").cum_sum(),
        (pl.col("_t2") // 2).alias("seg_start"),
        (pl.col("_t2").shift(-1) // 2).alias("seg_end"),
        pl.col("row").shift(-1).alias("after_row"),
    )
    kind = (
        pl.when(pl.col("_compute") > 0).then(pl.lit("busy", SEGMENT_KIND))
        .when(pl.col("_all") > 0).then(pl.lit("collective", SEGMENT_KIND))
        .when(pl.col("_overhead") > 0).then(pl.lit("overhead", SEGMENT_KIND))
        .otherwise(pl.lit("idle", SEGMENT_KIND))
    )
    return running.filter(pl.col("seg_end") > pl.col("seg_start")).select(
        *[pl.lit(value, pl.Int64).alias(k) for k, value in zip(key, key_values)],
        "seg_start", "seg_end", kind.alias("kind"), pl.col("row").alias("before_row"), "after_row",
    ).collect()


def step_spans(decode_activities: pl.DataFrame) -> pl.DataFrame:
    """GPU span of each decode step on each device: `rank, step, pid, device, gpu_start, gpu_end`."""
    return group_agg(
        decode_activities, ["rank", "step", "pid", "device"],
        pl.col("start").min().alias("gpu_start"), pl.col("end").max().alias("gpu_end"),
    )


def segments_in_steps(segments: pl.DataFrame, spans: pl.DataFrame, *, presorted: bool = False) -> pl.DataFrame:
    """Segments that lie inside a decode step's span on their device, with `rank, step`.

    Spans start and end at activity boundaries, so a segment is either inside or outside;
    where two steps' spans overlap, the overlap belongs to the later step. `presorted`: the
    segments are already in time order per device (a device-wide sweep).
    """
    if segments.height == 0 or spans.height == 0:
        return segments.with_columns(pl.lit(None, pl.Int64).alias("rank"), pl.lit(None, pl.Int64).alias("step")).clear()
    lookup = spans.select(*DEVICE_KEY, "gpu_start", "gpu_end", "rank", "step").sort([*DEVICE_KEY, "gpu_start"])
    ordered = segments if presorted else segments.sort([*DEVICE_KEY, "seg_start"])
    placed = ordered.join_asof(
        lookup, left_on="seg_start", right_on="gpu_start", by=DEVICE_KEY, strategy="backward",
        check_sortedness=False,
    )
    return placed.filter(pl.col("seg_end") <= pl.col("gpu_end")).drop("gpu_start", "gpu_end")


def blocking_syncs(api_calls: pl.DataFrame, syncs: pl.DataFrame) -> pl.DataFrame:
    """Host intervals blocked in a synchronize call, per process: `pid, start, end`.

    cudaStreamWaitEvent is left out: it makes a stream wait, not the host.
    """
    calls = api_calls.filter(
        (pl.col("kind") == "sync") & pl.col("name").str.contains("Synchronize")
    ).select("pid", "start", "end")
    rows = syncs.filter(pl.col("sync_type").is_in(list(BLOCKING_SYNC_TYPES))).select("pid", "start", "end")
    return pl.concat([calls, rows], how="vertical").drop_nulls()


def classify_gaps(
    gaps: pl.DataFrame, activities: pl.DataFrame, sync_windows: pl.DataFrame, collectives: pl.Series | None = None
) -> pl.DataFrame:
    """Add the neighbours' attributes (before_*, after_*) and the `cause` of each gap."""
    if collectives is None:
        collectives = collective_names(activities)
    lookup = _neighbour_lookup(activities)
    joined = pl.concat(
        [gaps, _neighbours(lookup, gaps["before_row"], "before"), _neighbours(lookup, gaps["after_row"], "after")],
        how="horizontal",
    )
    joined = joined.with_columns(_sync_before_launch(joined, sync_windows))
    before_graph = pl.col("before_graph_node_id").is_not_null()
    after_graph = pl.col("after_graph_node_id").is_not_null()
    same_replay = (before_graph & after_graph & (pl.col("before_correlation") == pl.col("after_correlation"))).fill_null(False)
    copy_before = (pl.col("before_copy_kind") == "HtoD").fill_null(False)
    copy_after = (pl.col("after_copy_kind") == "HtoD").fill_null(False)
    pageable_before = copy_before & (pl.col("before_src_kind") == "Pageable").fill_null(False)
    launched_late = (pl.col("after_api_end") > pl.col("start")).fill_null(False)
    replay_opens = after_graph & ~same_replay
    after_collective = (pl.col("after_activity") == "kernel") & pl.col("after_name").is_in(collectives.implode())
    cause = (
        pl.when(pl.col("_sync")).then(pl.lit("sync"))
        .when(copy_after | pageable_before).then(pl.lit("h2d"))
        .when(launched_late & replay_opens).then(pl.lit("launch"))
        .when(launched_late).then(pl.lit("host"))
        .when(copy_before).then(pl.lit("h2d"))
        .when((before_graph | after_graph) & ~same_replay).then(pl.lit("graph_boundary"))
        .when(after_collective.fill_null(False)).then(pl.lit("collective"))
        .otherwise(pl.lit("unknown"))
    )
    return joined.with_columns(cause.alias("cause")).drop("_sync")


def _neighbour_lookup(activities: pl.DataFrame) -> pl.DataFrame:
    """NEIGHBOUR_COLUMNS of every activity, positioned by `row` (row r at position r) when the
    rows are the dense 0..n-1 of gpu_activities, so neighbours are gathered, not joined."""
    lookup = activities.select(
        "row", *[(pl.col(c) if c in activities.columns else pl.lit(None)).alias(c) for c in NEIGHBOUR_COLUMNS]
    ).with_columns(pl.col("layer").cast(pl.Int64))
    if not lookup["row"].is_sorted():
        lookup = lookup.sort("row")
    return lookup


def _neighbours(lookup: pl.DataFrame, rows: pl.Series, side: str) -> pl.DataFrame:
    """The attributes of the activities `rows` (null rows: profiler overhead), as `<side>_*`."""
    dense = lookup.height == 0 or lookup["row"][-1] == lookup.height - 1
    if dense:
        found = lookup.select(pl.all().gather(rows))
    else:  # a subset of activities (tests, callers outside check): join instead
        found = pl.DataFrame({"row": rows}).join(lookup, on="row", how="left", maintain_order="left")
    return found.select(pl.col(c).alias(f"{side}_{c}") for c in NEIGHBOUR_COLUMNS)


def _sync_before_launch(gaps: pl.DataFrame, sync_windows: pl.DataFrame) -> pl.Series:
    """For each gap (in its row order of `gaps`, which carries `after_api_start`): did a
    blocking sync of its process return after the device went idle and before the next
    activity's launching call began? The latest sync end at or before that call decides."""
    if gaps.height == 0 or sync_windows.height == 0:
        return pl.Series("_sync", [False] * gaps.height, dtype=pl.Boolean)
    ends = sync_windows.select("pid", pl.col("end").alias("_sync_end")).sort("pid", "_sync_end")
    probe = (
        gaps.select("pid", "start", "after_api_start")
        .with_row_index("_order")
        .with_columns(pl.col("after_api_start").fill_null(-(2**62)).alias("_launch"))
        .sort("pid", "_launch")
    )
    matched = probe.join_asof(
        ends, left_on="_launch", right_on="_sync_end", by="pid", strategy="backward", check_sortedness=False,
    ).sort("_order")
    return (matched["_sync_end"] > matched["start"]).fill_null(False).alias("_sync")


def find_gaps(
    activities: pl.DataFrame,
    spans: pl.DataFrame,
    overhead: pl.DataFrame,
    sync_windows: pl.DataFrame,
    threshold_ns: int,
    *,
    per_stream: bool = False,
    segments: pl.DataFrame | None = None,
    collectives: pl.Series | None = None,
) -> pl.DataFrame:
    """Gaps above `threshold_ns` inside decode steps (GAP_SCHEMA), with neighbours and cause.

    `activities` are all GPU activities (decode or not: the device is busy either way),
    `spans` the decode steps' GPU spans on each device (step_spans). Device-wide by
    default; per stream with `per_stream`. `segments` may pass a sweep already made with
    the matching key; `collectives` the collective kernel names, when already known.
    """
    key = STREAM_KEY if per_stream else DEVICE_KEY
    if segments is None:
        segments = timeline_segments(activities, overhead, key, collectives)
    idle = segments.filter((pl.col("kind") == "idle") & (pl.col("seg_end") - pl.col("seg_start") > threshold_ns))
    inside = segments_in_steps(idle, spans, presorted=not per_stream)
    if inside.height == 0:
        return pl.DataFrame(schema=GAP_SCHEMA)
    gaps = inside.select(
        "rank", "step", *key, pl.col("seg_start").alias("start"), pl.col("seg_end").alias("end"),
        (pl.col("seg_end") - pl.col("seg_start")).alias("duration"), "before_row", "after_row",
    )
    classified = classify_gaps(gaps, activities, sync_windows, collectives).with_columns(
        # a neighbour without a row is a profiler overhead range
        pl.col(f"{side}_name").fill_null(pl.when(pl.col(f"{side}_row").is_null()).then(pl.lit("profiler overhead")))
        for side in ("before", "after")
    )
    if not per_stream:
        classified = classified.with_columns(pl.lit(None, pl.Int64).alias("stream"))
    return classified.select(
        "rank", "step", "pid", "device", "stream", "start", "end", "duration", "cause",
        pl.col("before_name").alias("before"), "before_op", "before_layer",
        pl.col("after_name").alias("after"), "after_op", "after_layer", "before_row", "after_row",
        pl.lit(False).alias("step_entry"),
    ).cast(GAP_SCHEMA).sort("rank", "step", "device", "start")


def mark_step_entry_gaps(gaps: pl.DataFrame, launches: pl.DataFrame, rule: StepEntryGaps | None) -> pl.DataFrame:
    """Set `step_entry` on the `launch` gaps a ledger allows: per step, at most
    `rule.per_launch` per graph launch of the step (`launches`: `rank, step, graph_launches`),
    each at most `rule.max_ns` long, the shortest first. Without a rule none is allowed."""
    if rule is None or gaps.height == 0:
        return gaps
    allowed_per_step = launches.select("rank", "step", (pl.col("graph_launches") * rule.per_launch).alias("_allowed"))
    fits = (pl.col("cause") == "launch") & (pl.lit(True) if rule.max_ns is None else pl.col("duration") <= rule.max_ns)
    ordinal = pl.col("duration").rank("ordinal").over("rank", "step", fits)
    return (
        gaps.join(allowed_per_step, on=["rank", "step"], how="left", maintain_order="left")
        .with_columns((fits & (ordinal <= pl.col("_allowed").fill_null(0))).alias("step_entry"))
        .drop("_allowed")
    )
