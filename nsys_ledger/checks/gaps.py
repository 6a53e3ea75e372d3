"""Idle time of the GPU inside decode steps, and why the GPU waited.

One sweep over the device timeline (per process and device, or per stream on request) cuts
it into segments between consecutive activity boundaries. Every kernel, copy, memset and
graph replay traced at graph level (timeline.with_graph_level_replays) counts +1 while it
runs; PROFILER_OVERHEAD ranges of the process count on their own. A
segment is

* ``busy``        something other than a collective runs (the Σ t_i of the step budget),
* ``collective``  only collectives (NCCL, custom all-reduce, DeepEP) run,
* ``overhead``    nothing runs but the profiler was flushing its buffers: excluded from
                  gaps, as nsys's `gpu_gaps` does,
* ``idle``        nothing at all.

Segments are given to the decode step whose GPU span (first start to last end of its
activities on that device) holds them, so idle time between steps and around excluded
windows (prefill, warm-up) is never a gap. A run of idle segments with profiler overhead
inside is overhead as a whole (nsys's `gpu_gaps` leaves such gaps out too): the profiler's
flush must not split one idle period into several gaps. An idle segment longer than the
threshold is a gap; it carries the activity that ended last before it and the one that
started after it (the activity that ended the gap).

Who was late is decided by time, from the call that launched the activity that ended the gap
(its host start c0 and return c1) against the gap [t0, t1]. The gap's time is split in three,
each nanosecond in one (clipped to the gap):

* host   [t0, c0]  the launching call began only after the GPU went idle: the host was late.
                   This time is split further by what the launching thread did (host_time.py):
                   ``sync``, ``copy_call``, ``cuda_call``, ``nvtx`` (with the range's name) or
                   plain ``host`` time.
* launch [c0, c1]  the call was in flight while the GPU idled: launch latency (for a copy
                   call: its submission, which for a pageable copy includes the staging).
* device [c1, t1]  the call had returned and the work was queued: the GPU waited on the
                   device side.

The side with the most time decides (host on a tie, then launch), and the cause is the
largest part within it:

* host side:   the largest of ``sync``, ``copy_call``, ``cuda_call``, ``nvtx``, ``host``
* launch side: ``launch`` when the call is a graph launch (cudaGraphLaunch), ``copy_launch``
               when it is a memcpy or memset call, else ``kernel_launch``
* device side, first match: ``collective`` (the activity is a collective: it waited for its
               peers), ``graph_boundary`` (the gap separates two graph replays, or a replay
               and eager work), ``event_wait`` (its stream was told to wait on an event, a
               CUPTI 'Stream wait event' row, after the work before the gap was issued),
               ``copy`` (the activity is a copy or memset whose call had returned: the copy
               itself started late), ``unknown``.

So a call that began after half the gap had passed is always host side, and one that had
returned before the GPU went idle never is. Without a launching call in the trace the whole
gap is device time.

A ledger may allow the step entry's `launch` gap ([gaps] step_entry_per_launch): such a gap
keeps its cause and is listed with `step_entry` set, but is no finding (`mark_step_entry_gaps`).
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.checks.host_time import HOST_PARTS, SPLIT_COLUMNS, HostRecord, host_split
from nsys_ledger.frames import group_agg
from nsys_ledger.ledger.model import StepEntryGaps

# Kernel names of collectives: NCCL, SGLang's custom all-reduce (one/two shot, the 1/2 stage
# cross-device reduce, the all-reduce fused with the norm), DeepEP dispatch/combine.
COLLECTIVE_REGEX = (
    r"(?i)nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deep_ep::"
)
LAUNCH_CAUSES = ("launch", "kernel_launch", "copy_launch")
DEVICE_CAUSES = ("collective", "graph_boundary", "event_wait", "copy", "unknown")
GAP_CAUSES = (*HOST_PARTS, *LAUNCH_CAUSES, *DEVICE_CAUSES)
GAP_SIDES = ("host", "launch", "device")
SEGMENT_KINDS = ("busy", "collective", "overhead", "idle")
SEGMENT_KIND = pl.Enum(SEGMENT_KINDS)

DEVICE_KEY = ["pid", "device"]
STREAM_KEY = ["pid", "device", "stream"]

# Activity attributes a gap reports for its neighbours (before_*, after_*).
NEIGHBOUR_COLUMNS = ["name", "op", "layer", "activity", "copy_kind", "src_kind", "graph_node_id", "correlation",
                     "api_start", "api_end", "api_tid", "api_kind", "stream"]
# The time split of a gap (ns, adding up to its duration): the host-side parts, then the rest.
SPLIT_FIELDS = [*SPLIT_COLUMNS, "launch_ns", "device_ns"]

GAP_SCHEMA = {
    "rank": pl.Int64, "step": pl.Int64, "pid": pl.Int64, "device": pl.Int64, "stream": pl.Int64,
    "start": pl.Int64, "end": pl.Int64, "duration": pl.Int64, "cause": pl.Utf8,
    "before": pl.Utf8, "before_op": pl.Utf8, "before_layer": pl.Int64,
    "after": pl.Utf8, "after_op": pl.Utf8, "after_layer": pl.Int64,
    "before_row": pl.UInt32, "after_row": pl.UInt32,  # the neighbours' `row` ids (null: profiler overhead)
    "step_entry": pl.Boolean,  # an allowed step-entry launch gap (mark_step_entry_gaps): listed, no finding
    "side": pl.Utf8,  # GAP_SIDES: who was late
    **{c: pl.Int64 for c in SPLIT_FIELDS},
    "nvtx_range": pl.Utf8,  # the launching thread's innermost NVTX range at the middle of its NVTX time while late
    # the host call that launched the activity that ended the gap: its API kind, start, end
    "call_kind": pl.Utf8, "call_start": pl.Int64, "call_end": pl.Int64,
    # the activity that ended the gap is the first of its call that ran: the work before the gap
    # came from another call (a replay's first kernel, not a wait inside the replay)
    "opens_call": pl.Boolean,
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
    overhead_ranges = overhead.height
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
    segments = running.filter(pl.col("seg_end") > pl.col("seg_start")).select(
        *[pl.lit(value, pl.Int64).alias(k) for k, value in zip(key, key_values)],
        "seg_start", "seg_end", kind.alias("kind"), pl.col("row").alias("before_row"), "after_row",
    )
    # without profiler overhead on this process no segment is overhead, nor can a run become it
    return (_overhead_runs(segments) if overhead_ranges else segments).collect()


def _overhead_runs(segments: pl.LazyFrame) -> pl.LazyFrame:
    """Every idle segment of a run of idle and overhead segments (nothing running between two
    activities) that holds profiler overhead becomes overhead: nsys's `gpu_gaps` leaves out a
    gap with overhead inside, and the flush must not split one idle period into several gaps.

    A run holds overhead when the running count of overhead segments grew from just before its
    first segment to its last: two running sums and fills, where a window over the run ids
    (a hash of a million runs) took five times as long."""
    quiet = pl.col("kind").is_in(["idle", "overhead"])
    overhead = (pl.col("kind") == "overhead").cast(pl.Int64)
    seen = overhead.cum_sum()  # overhead segments up to and including this one
    before_run = pl.when((quiet != quiet.shift(1)).fill_null(True)).then(seen - overhead).forward_fill()
    through_run = pl.when((quiet != quiet.shift(-1)).fill_null(True)).then(seen).backward_fill()
    return segments.with_columns(
        pl.when(quiet & (through_run > before_run)).then(pl.lit("overhead", SEGMENT_KIND)).otherwise(pl.col("kind"))
        .alias("kind")
    )


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


def classify_gaps(
    gaps: pl.DataFrame, activities: pl.DataFrame, host: HostRecord, syncs: pl.DataFrame,
    collectives: pl.Series | None = None,
) -> pl.DataFrame:
    """Add the neighbours' attributes (before_*, after_*), the time split (SPLIT_FIELDS),
    `nvtx_range` and the `cause` of each gap (the rules are in the module's docstring).

    `host`: host_time.host_record of the trace; `syncs`: its CUPTI synchronization rows (the
    stream-wait-event rows tell a cross-stream wait)."""
    if collectives is None:
        collectives = collective_names(activities)
    lookup = _neighbour_lookup(activities)
    joined = pl.concat(
        [gaps, _neighbours(lookup, gaps["before_row"], "before"), _neighbours(lookup, gaps["after_row"], "after")],
        how="horizontal",
    ).with_row_index("_gap")
    joined = _with_time_split(joined, host).with_columns(_waited_on_event(joined, syncs))
    host_total = pl.sum_horizontal(pl.col(c) for c in SPLIT_COLUMNS)
    largest_side = (
        pl.when((host_total >= pl.col("launch_ns")) & (host_total >= pl.col("device_ns"))).then(pl.lit("host"))
        .when(pl.col("launch_ns") >= pl.col("device_ns")).then(pl.lit("launch"))
        .otherwise(pl.lit("device"))
    )
    joined = joined.with_columns(largest_side.alias("side"))
    return joined.with_columns(_cause(collectives).alias("cause")).drop("_gap", "_event_wait")


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


def _cause(collectives: pl.Series) -> pl.Expr:
    """The cause within the gap's side (see the module docstring)."""
    largest_part = pl.lit(None, pl.Utf8)
    parts = [(part, pl.col(f"host_{part}_ns")) for part in HOST_PARTS]
    most = pl.max_horizontal(value for _, value in parts)
    host_cause = pl.when(pl.lit(False)).then(largest_part)
    for part, value in parts:  # a tie goes to the earlier part
        host_cause = host_cause.when(value == most).then(pl.lit(part))
    host_cause = host_cause.otherwise(pl.lit("host"))
    launch_cause = (
        pl.when(pl.col("after_api_kind") == "graph_launch").then(pl.lit("launch"))
        .when(pl.col("after_api_kind").is_in(["memcpy", "memset"])).then(pl.lit("copy_launch"))
        .otherwise(pl.lit("kernel_launch"))
    )
    before_graph = pl.col("before_graph_node_id").is_not_null()
    after_graph = pl.col("after_graph_node_id").is_not_null()
    same_replay = (before_graph & after_graph & (pl.col("before_correlation") == pl.col("after_correlation"))).fill_null(False)
    after_collective = ((pl.col("after_activity") == "kernel") & pl.col("after_name").is_in(collectives.implode())
                        ).fill_null(False)
    after_copy = pl.col("after_activity").is_in(["memcpy", "memset"]).fill_null(False)
    device_cause = (
        pl.when(after_collective).then(pl.lit("collective"))
        .when((before_graph | after_graph) & ~same_replay).then(pl.lit("graph_boundary"))
        .when(pl.col("_event_wait")).then(pl.lit("event_wait"))
        .when(after_copy).then(pl.lit("copy"))
        .otherwise(pl.lit("unknown"))
    )
    return (
        pl.when(pl.col("side") == "host").then(host_cause)
        .when(pl.col("side") == "launch").then(launch_cause)
        .otherwise(device_cause)
    )


def _with_time_split(gaps: pl.DataFrame, host: HostRecord) -> pl.DataFrame:
    """The gap's time split by when the host began and ended the call that ended it (`_gap`
    numbers the gaps): before the call began, what the launching thread did (host_split);
    while the call ran, `launch_ns`; after it returned, `device_ns`. Without a known launching
    call the whole gap is device time."""
    start, end = pl.col("start"), pl.col("end")
    call_start = pl.col("after_api_start").clip(start, end)
    call_end = pl.max_horizontal(pl.col("after_api_end").clip(start, end), call_start)
    known = pl.col("after_api_start").is_not_null()
    windows = gaps.filter(known).select(
        pl.col("_gap").cast(pl.Int64).alias("id"), pl.col("after_api_tid").alias("global_tid"),
        start.alias("from"), call_start.alias("to"),
    )
    split = host_split(windows, host)
    in_call = pl.when(known).then(call_end - call_start).otherwise(0)
    late_total = pl.when(known).then(call_start - start).otherwise(0)
    joined = gaps.join(split.rename({"id": "_gap"}).with_columns(pl.col("_gap").cast(pl.UInt32)), on="_gap",
                       how="left", maintain_order="left")
    return joined.with_columns(
        # a launching thread not in the host tables (no thread id): its late time is plain host time
        *[pl.col(c).fill_null(0) for c in SPLIT_COLUMNS if c != "host_host_ns"],
        pl.col("host_host_ns").fill_null(late_total),
        in_call.alias("launch_ns"),
        pl.when(known).then(end - call_end).otherwise(pl.col("duration")).alias("device_ns"),
    )


def _waited_on_event(gaps: pl.DataFrame, syncs: pl.DataFrame) -> pl.Series:
    """For each gap (in `_gap` order): was the stream of the activity that ended it told to wait
    on an event (a CUPTI 'Stream wait event' row of its process and stream) after the work
    before the gap was issued and before its own launch began?"""
    waits = syncs.filter(pl.col("sync_type") == "Stream wait event").select(
        "pid", "stream", pl.col("start").alias("_wait")).drop_nulls()
    if gaps.height == 0 or waits.height == 0:
        return pl.Series("_event_wait", [False] * gaps.height, dtype=pl.Boolean)
    probe = gaps.select(
        "_gap", "pid", pl.col("after_stream").alias("stream"), "before_api_start",
        pl.col("after_api_start").fill_null(-(2**62)).alias("_launch"),
    ).sort("_launch")
    matched = probe.join_asof(
        waits.sort("_wait"), left_on="_launch", right_on="_wait", by=["pid", "stream"], strategy="backward",
        check_sortedness=False,
    ).sort("_gap")
    return (matched["_wait"] >= matched["before_api_start"]).fill_null(False).alias("_event_wait")


def find_gaps(
    activities: pl.DataFrame,
    spans: pl.DataFrame,
    overhead: pl.DataFrame,
    host: HostRecord,
    syncs: pl.DataFrame,
    threshold_ns: int,
    *,
    per_stream: bool = False,
    segments: pl.DataFrame | None = None,
    collectives: pl.Series | None = None,
) -> pl.DataFrame:
    """Gaps above `threshold_ns` inside decode steps (GAP_SCHEMA), with neighbours and cause.

    `activities` are all GPU activities (decode or not: the device is busy either way),
    `spans` the decode steps' GPU spans on each device (step_spans), `host` the trace's
    host_time.host_record, `syncs` its CUPTI synchronization rows. Device-wide by
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
    classified = classify_gaps(gaps, activities, host, syncs, collectives).with_columns(
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
        pl.lit(False).alias("step_entry"), "side", *SPLIT_FIELDS, "nvtx_range",
        pl.col("after_api_kind").alias("call_kind"), pl.col("after_api_start").alias("call_start"),
        pl.col("after_api_end").alias("call_end"),
        pl.col("before_correlation").ne_missing(pl.col("after_correlation")).alias("opens_call"),
    ).cast(GAP_SCHEMA).sort("rank", "step", "device", "start")


def is_step_entry_candidate() -> pl.Expr:
    """A gap that ends a graph replay's wait for its host: it ends at the replay's first
    activity (`opens_call`), its launching call is a graph launch, and the host was behind it
    (it began the call after the GPU went idle, side `host`, or the call was still in flight,
    `launch`). Either way the GPU waited for the replay to be issued, the entry cost of every
    graph step. A wait inside a replay is never one, even while a slow `hipGraphLaunch` is still
    issuing the replay's later kernels."""
    return (pl.col("call_kind") == "graph_launch") & pl.col("side").is_in(["host", "launch"]) & pl.col("opens_call")


def mark_step_entry_gaps(gaps: pl.DataFrame, launches: pl.DataFrame, rule: StepEntryGaps | None) -> pl.DataFrame:
    """Set `step_entry` on the step-entry gaps (`is_step_entry_candidate`) a ledger allows: per
    step, at most `rule.per_launch` per graph launch of the step (`launches`: `rank, step,
    graph_launches`), each at most `rule.max_ns` long, the shortest first. Without a rule none
    is allowed."""
    if rule is None or gaps.height == 0:
        return gaps
    allowed_per_step = launches.select("rank", "step", (pl.col("graph_launches") * rule.per_launch).alias("_allowed"))
    fits = is_step_entry_candidate() & (pl.lit(True) if rule.max_ns is None else pl.col("duration") <= rule.max_ns)
    ordinal = pl.col("duration").rank("ordinal").over("rank", "step", fits)
    return (
        gaps.join(allowed_per_step, on=["rank", "step"], how="left", maintain_order="left")
        .with_columns((fits & (ordinal <= pl.col("_allowed").fill_null(0))).alias("step_entry"))
        .drop("_allowed")
    )
