"""NVTX projection with nsys's semantics: the ranges that enclose each launching call.

nsys (`nvtx_gpu_proj_trace`, `nvtx_kern_sum`) puts a GPU activity inside an NVTX range when
the CUDA API call that launched it lies inside the range on the same thread:
``range.start <= call.start and call.end <= range.end``. Only push/pop ranges and start/end
ranges that end on the thread they started on take part; a range still open when the capture
stopped reaches to the end of time. A range's name is shown with its domain
(``domain:text``; the default domain has an empty prefix in nsys, here just the text).

How, without an interval cross join (a trace can hold 10M ranges), thread by thread:

1. Give every range a *level* such that ranges of one level never overlap. For properly
   nested ranges this is the nesting depth: in the order ranges open, the number opened
   before minus the number closed before (two sorted sequences and one as-of lookup).
   Start/end ranges may cross instead of nesting; ranges that overlap an earlier range of
   their level are moved to a new level, repeated until no level holds an overlap (one extra
   round per crossing depth, none for push/pop traces).
2. For each level, one ``join_asof`` of the calls (on start) against that level's ranges
   finds the only range of the level that can enclose the call: the last one that started
   before it. It encloses the call when it also ends after it.

Within a thread every sort and as-of join has a single key (time), which polars does far
faster than multi-column ones; the loop is over threads and levels, never over rows.
"""

from __future__ import annotations

import polars as pl

PUSH_POP = 59
START_END = 60
OPEN_END = 2**62  # a range still open at the end of the capture encloses everything after it

# Output of `enclosing_ranges`: one row per (call, enclosing range).
ENCLOSING_SCHEMA = {
    "call": pl.Int64,  # the caller's id column
    "nesting": pl.Int64,  # 0 = innermost enclosing range, 1 = its parent, ...
    "range_id": pl.Int64,
    "range_start": pl.Int64,
    "range_end": pl.Int64,  # OPEN_END for ranges never closed
    "name": pl.Utf8,  # the range text
    "domain": pl.Utf8,  # null for the default domain
    "qualified_name": pl.Utf8,  # "domain:name", or the name alone in the default domain
}

_PAIR_COLUMNS = ["call", "range_id", "range_start", "range_end", "level"]
_PAIR_SCHEMA = dict.fromkeys(_PAIR_COLUMNS, pl.Int64)


def projectable_ranges(nvtx: pl.DataFrame) -> pl.DataFrame:
    """The ranges nsys projects: `range_id` (row index in `nvtx`), `global_tid, start, end,
    name, domain`.

    Push/pop (59) and start/end (60) ranges whose end is on their own thread; open ranges get
    ``end = OPEN_END``.
    """
    same_thread = pl.col("end_global_tid").is_null() | (pl.col("end_global_tid") == pl.col("global_tid"))
    return (
        nvtx.with_row_index("range_id")
        .filter(pl.col("event_type").is_in([PUSH_POP, START_END]) & same_thread & pl.col("start").is_not_null())
        .select(
            pl.col("range_id").cast(pl.Int64),
            "global_tid",
            "start",
            pl.col("end").fill_null(OPEN_END),
            "name",
            "domain",
        )
    )


def range_levels(ranges: pl.DataFrame) -> pl.DataFrame:
    """Add `level` and `crossed` so that ranges of one `global_tid` and one level never overlap.

    `ranges` needs `range_id, global_tid, start, end`; the result is sorted by thread, then
    start, outer range first. Levels start at the nesting depth (0 for outermost ranges);
    crossing start/end ranges are pushed to levels above the deepest one (`crossed` says
    which: without any, the deepest level holding a call's range is its innermost one).
    """
    if ranges.height == 0:
        return ranges.with_columns(pl.lit(0, pl.Int64).alias("level"), pl.lit(False).alias("crossed"))
    threads = ranges.partition_by("global_tid", as_dict=True)
    return pl.concat([_thread_levels(threads[key]) for key in sorted(threads)])


def _thread_levels(ranges: pl.DataFrame) -> pl.DataFrame:
    """range_levels for the ranges of one thread."""
    ordered = _opening_order(ranges)
    leveled = ordered.with_columns(_nesting_depth(ordered).alias("level"), pl.lit(False).alias("crossed"))
    while True:
        # rows are in opening order in every level, so an overlap is a start before the
        # furthest end reached by the earlier ranges of the same level
        reached = pl.col("end").cum_max().shift(1).over("level")
        flagged = leveled.with_columns((pl.col("start") < reached).fill_null(False).alias("_overlaps"))
        if not flagged["_overlaps"].any():
            return leveled
        # Move every range that overlaps an earlier one of its level above all used levels;
        # the first range of each overlapping run stays, so every round settles at least one.
        top = flagged["level"].max() + 1
        leveled = flagged.with_columns(
            pl.when(pl.col("_overlaps")).then(pl.col("level") + top).otherwise(pl.col("level")).alias("level"),
            (pl.col("crossed") | pl.col("_overlaps")).alias("crossed"),
        ).drop("_overlaps")


def _opening_order(ranges: pl.DataFrame) -> pl.DataFrame:
    """One thread's ranges in the order they open: by start, the outer one (later end) first
    when two start together. Equal starts are rare, so the one-key sort is tried first."""
    by_start = ranges.sort("start")
    if not (by_start["start"].diff() == 0).any():
        return by_start
    return ranges.sort("start", "end", descending=[False, True])


def _nesting_depth(ordered: pl.DataFrame) -> pl.Series:
    """How many ranges of the thread enclose each range when it opens (a sorted sweep).

    `ordered` is in opening order (`_opening_order`). The depth is the number of ranges
    opened before minus the number closed before. A range that ends exactly when a longer one
    starts does not enclose it (touching ranges do not nest), but it does enclose a
    zero-length range at that instant (start <= t and t <= end).
    """
    zero_length = pl.col("end") == pl.col("start")
    probes = ordered.select("start", pl.int_range(pl.len(), dtype=pl.Int64).alias("_opened"))
    longer = _closings(ordered.filter(~zero_length))
    closed = _count_closed(longer, probes, inclusive=True)
    instants = ordered.select(zero_length.arg_true()).to_series()
    if len(instants):
        # zero-length ranges: a longer range ending at their instant still encloses them, and
        # other zero-length ranges close only after everything at their instant has opened
        at_instants = _count_closed(longer, probes[instants], inclusive=False)
        closed = closed.scatter(instants, at_instants)
        closed = closed + _count_closed(_closings(ordered.filter(zero_length)), probes, inclusive=False)
    return (probes["_opened"] - closed).alias("level")


def _closings(ranges: pl.DataFrame) -> pl.DataFrame:
    """`_end, _closed`: one thread's range ends in order, with how many have closed by each."""
    return ranges.select(pl.col("end").alias("_end")).sort("_end").with_columns(
        pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("_closed")
    )


def _count_closed(closings: pl.DataFrame, probes: pl.DataFrame, *, inclusive: bool) -> pl.Series:
    """Per probe row: how many of `closings` end before its start (at or before it when
    `inclusive`). Aligned with `probes`, which is sorted by start."""
    if closings.height == 0:
        return pl.zeros(probes.height, pl.Int64, eager=True)
    return (
        probes.join_asof(
            closings,
            left_on="start",
            right_on="_end",
            strategy="backward",
            allow_exact_matches=inclusive,
            check_sortedness=False,
        )["_closed"]
        .fill_null(0)
    )


def enclosing_ranges(
    calls: pl.DataFrame,
    ranges: pl.DataFrame,
    *,
    id_col: str = "call",
    thread_col: str = "global_tid",
    start_col: str = "start",
    end_col: str = "end",
) -> pl.DataFrame:
    """Every range that encloses each call on its thread, innermost first (ENCLOSING_SCHEMA).

    `calls` holds one row per call with an integer id, its thread (`globalTid`) and its host
    interval; `ranges` comes from `projectable_ranges` (any subset of it, e.g. only the ranges
    whose name matches a pattern: then the innermost *matching* range comes first).
    """
    pairs = [
        _all_pairs(probes, leveled)
        for probes, leveled in _per_thread(_probes(calls, id_col, thread_col, start_col, end_col), ranges)
    ]
    if not pairs:
        return pl.DataFrame(schema=ENCLOSING_SCHEMA)
    ordered = _innermost_first(pl.concat(pairs))
    return _with_details(ordered.with_columns(pl.int_range(pl.len()).over("call").cast(pl.Int64).alias("nesting")),
                         ranges)


def innermost_ranges(
    calls: pl.DataFrame,
    ranges: pl.DataFrame,
    *,
    id_col: str = "call",
    thread_col: str = "global_tid",
    start_col: str = "start",
    end_col: str = "end",
) -> pl.DataFrame:
    """The innermost enclosing range of each call that has one: ENCLOSING_SCHEMA less `nesting`."""
    found = innermost_range_ids(calls, ranges, id_col=id_col, thread_col=thread_col, start_col=start_col,
                                end_col=end_col)
    return _with_details(found.with_columns(pl.lit(0, pl.Int64).alias("nesting")), ranges).drop("nesting")


def innermost_range_ids(
    calls: pl.DataFrame,
    ranges: pl.DataFrame,
    *,
    id_col: str = "call",
    thread_col: str = "global_tid",
    start_col: str = "start",
    end_col: str = "end",
) -> pl.DataFrame:
    """`call, range_id, range_start, range_end, level` of each call's innermost enclosing range
    (the one `enclosing_ranges` gives at nesting 0), without the names.

    When no start/end ranges cross, the levels are nesting depths: walking them from the
    deepest, a call's first hit is its innermost range and the call is done, so no pair of an
    outer range is ever built and nothing needs sorting.
    """
    found = []
    for probes, leveled in _per_thread(_probes(calls, id_col, thread_col, start_col, end_col), ranges):
        if leveled["crossed"].any():
            found.append(_innermost_first(_all_pairs(probes, leveled)).unique(subset="call", keep="first",
                                                                              maintain_order=True))
            continue
        # a zero-length call where one range ends and its sibling starts lies in two chains of
        # ranges, not one: such calls take the general path
        instant = pl.col("_call_end") == pl.col("_call_start")
        found.append(_deepest_pairs(probes.filter(~instant), leveled))
        found.append(_innermost_first(_all_pairs(probes.filter(instant), leveled)).unique(
            subset="call", keep="first", maintain_order=True))
    return pl.concat(found) if found else pl.DataFrame(schema=_PAIR_SCHEMA)


def _probes(calls: pl.DataFrame, id_col: str, thread_col: str, start_col: str, end_col: str) -> pl.DataFrame:
    """`call, global_tid, _call_start, _call_end` (a missing end: the call is an instant)."""
    return (
        calls.select(
            pl.col(id_col).cast(pl.Int64).alias("call"),
            pl.col(thread_col).alias("global_tid"),
            pl.col(start_col).alias("_call_start"),
            pl.col(end_col).alias("_call_end"),
        )
        .filter(pl.col("_call_start").is_not_null() & pl.col("global_tid").is_not_null())
        .with_columns(pl.col("_call_end").fill_null(pl.col("_call_start")))
    )


def _per_thread(probes: pl.DataFrame, ranges: pl.DataFrame):
    """(probes sorted by start, leveled ranges) for each thread that has both."""
    if probes.height == 0 or ranges.height == 0:
        return
    probes_of = probes.partition_by("global_tid", as_dict=True, include_key=False)
    ranges_of = ranges.select("range_id", "global_tid", "start", "end").partition_by("global_tid", as_dict=True)
    for thread in sorted(probes_of.keys() & ranges_of.keys()):
        leveled = _thread_levels(ranges_of[thread]).select(
            "level", "crossed", "range_id", pl.col("start").alias("range_start"), pl.col("end").alias("range_end"),
        )
        yield probes_of[thread].sort("_call_start"), leveled


def _all_pairs(probes: pl.DataFrame, leveled: pl.DataFrame) -> pl.DataFrame:
    """Every (call, enclosing range) of one thread: one join_asof per level."""
    levels = leveled.partition_by("level", maintain_order=True)
    return pl.concat([_found_at_level(probes, at_level) for at_level in levels]).unique(subset=["call", "range_id"])


def _deepest_pairs(probes: pl.DataFrame, leveled: pl.DataFrame) -> pl.DataFrame:
    """For nested ranges of one thread: each call's range at the deepest level holding one."""
    found = [pl.DataFrame(schema=_PAIR_SCHEMA)]
    remaining = probes
    by_level = leveled.partition_by("level", maintain_order=True, as_dict=True)
    for _, at_level in sorted(by_level.items(), reverse=True):  # deepest level first
        if remaining.height == 0:
            break
        hits, remaining = _found_at_level(remaining, at_level, keep_rest=True)
        found.append(hits)
    return pl.concat(found)


def _innermost_first(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per call: the latest start first, then the earliest end, then the deeper level (of two
    ranges with the same interval, the one opened later nests in the other)."""
    return pairs.sort("call", "range_start", "range_end", "level", descending=[False, True, False, True])


def _found_at_level(probes: pl.DataFrame, at_level: pl.DataFrame, *, keep_rest: bool = False):
    """The ranges of one level of one thread that enclose the probes: one join_asof on start.

    Ranges of one level never overlap, so the last one starting at or before a call is the only
    candidate; a zero-length call exactly where one range ends and the next starts is inside
    both, and the earlier one is the last range starting strictly before it.
    With `keep_rest`, also returns the probes no range of this level encloses.
    """
    level = at_level.drop("crossed")  # in opening order: sorted by range_start
    found = probes.join_asof(level, left_on="_call_start", right_on="range_start", strategy="backward",
                             check_sortedness=False)
    inside = (pl.col("range_end") >= pl.col("_call_end")).fill_null(False)
    hits = [found.filter(inside).select(_PAIR_COLUMNS)]
    instants = probes.filter(pl.col("_call_end") == pl.col("_call_start"))
    if instants.height:
        touching = instants.join_asof(level, left_on="_call_start", right_on="range_start", strategy="backward",
                                      allow_exact_matches=False, check_sortedness=False)
        hits.append(touching.filter(inside).select(_PAIR_COLUMNS))
    pairs = pl.concat(hits)
    if not keep_rest:
        return pairs
    return pairs, found.filter(~inside).select(probes.columns)


def _with_details(pairs: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Pairs + the range's name, domain and `domain:name` (just the name in the default domain)."""
    details = ranges.select("range_id", "name", "domain")
    qualified = (
        pl.when(pl.col("domain").is_null())
        .then(pl.col("name"))
        .otherwise(pl.concat_str(pl.col("domain"), pl.lit(":"), pl.col("name").fill_null("")))
    )
    return (
        pairs.join(details, on="range_id", how="left", maintain_order="left")
        .with_columns(qualified.alias("qualified_name"))
        .select(list(ENCLOSING_SCHEMA))
    )
