"""Decode steps: cut the host timeline into windows and give every GPU activity its step.

Three ways to find steps, tried in this order by `method="auto"`:

* ``nvtx``: a push/pop or start/end range whose name matches a regex is one step; a GPU
  activity belongs to it when its launching call lies inside the range, on any thread of the
  process: a launch on the range's own thread first (nsys's projection rule), then one from
  another thread by time (PyTorch's autograd thread launches most of a training step's
  kernels, inference engines launch from worker threads). `launch_threads` says which
  threads launched how many in each step.
* ``graph``: real SGLang decode has no per-step NVTX; a decode step is a replay of the
  decode CUDA graph (`cudaGraphLaunch`) plus the eager work around it, above all the
  sampling kernel that runs outside the graph. When the expectations name that step-ending
  marker kernel, the host timeline is cut right after each marker launch, so the H2D copies
  issued before a launch and the sampling after it land in the same step and a step split
  into two graph replays stays one step. Without a marker, each graph launch opens a step.
  Windows without a graph launch are eager work (prefill, warm-up) and are excluded.
* ``marker``: for eager traces, every launch of the marker kernel ends a step.
* ``capture`` (never chosen by ``auto``): each process's whole capture is one step, for a
  capture limited to one iteration (`nsys profile --capture-range=cudaProfilerApi`, or a
  window cut from a longer report) that has no step range, graph launch or marker kernel.

Windows are intervals of host time per key (the process for cut-based methods, the thread for
NVTX ranges); activities are placed by a sorted as-of join on the launching call's start,
never by an interval cross join. An NVTX window also takes the launches of the process's other
threads that start inside it and lie in no window of their own thread; where two threads'
step ranges overlap in time, such a launch goes to the range that started last.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.step_kinds import (
    DECODE_ATTENTION_REGEX,
    PREFILL_ATTENTION_REGEX,
    STEP_ANNOTATION_REGEX,
    window_kinds,
)
from nsys_ledger.frames import left_join_keys
from nsys_ledger.ledger.model import StepRule
from nsys_ledger.trace.kineto_reader import GPU_RANGE_CATS

NO_TIME_BEFORE = -(2**62)
NO_TIME_AFTER = 2**62
THREAD_ID_MODULUS = 2**24  # the thread id is the low 24 bits of a global thread id (nsys and our Kineto reader)

WINDOW_SCHEMA = {
    "key": pl.Int64,  # pid (cut-based methods) or global_tid (nvtx)
    "pid": pl.Int64,
    "window": pl.Int64,
    "host_start": pl.Int64,  # inclusive
    "host_end": pl.Int64,  # inclusive
    "label": pl.Utf8,  # the NVTX range name for nvtx windows
    "complete": pl.Boolean,  # False for the trailing window after the last marker
}


@dataclass(frozen=True)
class Steps:
    method: str  # "nvtx", "graph", "marker" or "none"
    detail: str  # one sentence on how steps were found, for the report
    # one row per window: WINDOW_SCHEMA + decode, reason, rank, step, kind (decode, prefill or mixed),
    # kind_source (the annotation or the kernels that told the kind), kind_step (index among the
    # complete windows of its kind in its rank)
    windows: pl.DataFrame
    activities: pl.DataFrame  # the input activities + window key columns + step, rank
    api_calls: pl.DataFrame  # api calls + step, rank (for submissions and graph launches)
    rule: StepRule | None = None  # the step rule in effect (the ledger's, or check's default for the trace)
    launch_threads: pl.DataFrame | None = None  # per decode step and launching thread: `rank, step, tid, launches`

    @property
    def decode(self) -> pl.DataFrame:
        return self.windows.filter(pl.col("decode"))

    @property
    def excluded(self) -> pl.DataFrame:
        return self.windows.filter(~pl.col("decode"))

    def of_kind(self, kind: str) -> pl.DataFrame:
        """The complete windows of one step kind (decode ones included whether checked or not)."""
        return self.windows.filter((pl.col("kind") == kind) & pl.col("complete"))


def find_steps(
    activities: pl.DataFrame,
    api_calls: pl.DataFrame,
    nvtx: pl.DataFrame,
    rule: StepRule | None,
    *,
    step_nvtx: str | None = None,
    method: str | None = None,
) -> Steps:
    """Choose the step method, build its windows, place activities and calls in them."""
    finder = StepFinder(api_calls, nvtx, rule, step_nvtx=step_nvtx, method=method)
    finder.choose(marker_calls(activities, finder.marker_regex), activities["pid"])
    placed = finder.place(activities)
    return finder.steps(window_summary(placed, rule), placed)


class StepFinder:
    """`find_steps` in stages, so that the activities may come in parts (a trace read a chunk
    at a time, pipeline.stream): `choose` from the marker kernels' launches and the
    activities' processes, `place` each part, `steps` from the parts' `window_summary`s
    added up (`add_summaries`)."""

    def __init__(self, api_calls: pl.DataFrame, nvtx: pl.DataFrame, rule: StepRule | None, *,
                 step_nvtx: str | None = None, method: str | None = None):
        self.api_calls, self.nvtx, self.rule = api_calls, nvtx, rule
        self.nvtx_regex = step_nvtx or (rule.nvtx_regex if rule else None)
        self.marker_regex = rule.marker_regex if rule else None
        self.requested = method or (rule.method if rule else "auto")
        self.chosen = ""
        self.detail = ""
        self.by_thread = False
        self.windows = pl.DataFrame(schema=WINDOW_SCHEMA)

    def choose(self, markers: pl.DataFrame, pids: pl.Series) -> None:
        """The method and its windows. `markers`: `pid, t` of the marker kernels' launches
        (`marker_calls`), `pids`: the processes of the activities (for `capture`)."""
        chosen = self.requested
        if chosen == "auto":
            chosen = _auto_method(self.api_calls, self.nvtx, self.nvtx_regex, markers)
        if chosen == "nvtx":
            if not self.nvtx_regex:
                raise ValueError("step method nvtx needs a range regex (--step-nvtx or [steps] nvtx)")
            self.windows = _nvtx_windows(self.nvtx, self.nvtx_regex)
            self.detail = f"NVTX ranges matching /{self.nvtx_regex}/ ({self.windows.height} ranges)"
            self.by_thread = True
        elif chosen == "graph":
            if markers.height:
                self.windows = _windows_from_cuts(markers, left_closed=False)
                self.detail = (
                    "CUDA graph launches; each step ends with the launch of the marker kernel "
                    f"/{self.marker_regex}/ that runs after the replay"
                )
            else:
                launches = self.api_calls.filter(pl.col("kind") == "graph_launch").select(
                    "pid", pl.col("start").alias("t"))
                self.windows = _windows_from_cuts(launches, left_closed=True)
                self.detail = "CUDA graph launches; each cudaGraphLaunch opens a step (no marker kernel found)"
        elif chosen == "marker":
            if not self.marker_regex:
                raise ValueError("step method marker needs a marker kernel regex ([steps] marker)")
            self.windows = _windows_from_cuts(markers, left_closed=False)
            self.detail = f"marker kernel /{self.marker_regex}/ ends each step"
        elif chosen == "capture":
            self.windows = _capture_windows(pids)
            self.detail = "the whole capture of each process is one step (--step-method capture)"
        elif chosen == "none":
            self.windows = pl.DataFrame(schema=WINDOW_SCHEMA)
            self.detail = "no steps found: no step NVTX range, no CUDA graph launch, no marker kernel"
        else:
            raise ValueError(f"unknown step method {chosen!r}")
        self.chosen = chosen

    def place(self, activities: pl.DataFrame) -> pl.DataFrame:
        """`activities` (all of them or a part) with the `key, window` that holds each."""
        if self.chosen == "capture":
            # the whole capture is the step: a kernel whose launch fell before a cut window (its
            # call is not in the export) still belongs to it, by its own start
            at = activities.with_columns(pl.coalesce("api_start", "start").alias("_placed_at"))
            return _place(at, self.windows, time_col="_placed_at", key_col="pid").drop("_placed_at")
        placed = _place(activities, self.windows, time_col="api_start",
                        key_col="api_tid" if self.by_thread else "pid")
        return _place_other_threads(placed, self.windows) if self.by_thread else placed

    def steps(self, summary: WindowSummary, placed: pl.DataFrame) -> Steps:
        """The Steps, from the activities' summary; `placed`: the activities with their windows
        (an empty frame when they are kept elsewhere: pipeline.stream)."""
        calls = self.api_calls.rename({"start": "api_start", "global_tid": "api_tid"})
        placed_calls = _place(calls, self.windows, time_col="api_start", key_col="api_tid" if self.by_thread else "pid")
        if self.by_thread:
            placed_calls = _place_other_threads(placed_calls, self.windows)
        placed_calls = placed_calls.rename({"api_start": "start", "api_tid": "global_tid"})
        judged = _judge_windows(self.windows, summary, placed_calls, self.nvtx, self.rule, self.chosen, self.by_thread)
        numbered = _number_decode_steps(judged)
        step_of_window = numbered.select("key", "window", "step", "rank", "decode")
        return Steps(
            method=self.chosen,
            detail=self.detail,
            windows=numbered,
            activities=_with_steps(placed, step_of_window),
            api_calls=_with_steps(placed_calls, step_of_window),
            rule=self.rule,
            launch_threads=_decode_launch_threads(summary.launches, step_of_window),
        )


@dataclass(frozen=True)
class WindowSummary:
    """What judging the windows needs of their activities, per window: `key, window,
    activities, excluded_op, _excluded_at` (the first activity of an excluded op: its
    start, table and place there), `_prefill, _decode` (attention kernels of either kind);
    and `launches`: `key, window, tid, launches` (activities per launching thread)."""

    windows: pl.DataFrame
    launches: pl.DataFrame


def window_summary(placed: pl.DataFrame, rule: StepRule | None) -> WindowSummary:
    """The summary of placed activities (all of them, or a part: `add_summaries` adds parts).
    The order of activities is `start`, then `_order` where the activities have it (the
    stacking order: pipeline.stream), else `row`."""
    excluded_ops = list(rule.exclude_ops) if rule else []
    order = "_order" if "_order" in placed.columns else "row"
    in_window = placed.lazy().filter(pl.col("window").is_not_null())
    if excluded_ops and "op" in placed.columns:
        excluded = pl.col("op").is_in(excluded_ops)
        by = [pl.col("start").filter(excluded), pl.col(order).filter(excluded)]
        first_excluded = [pl.col(c).filter(excluded).sort_by(by).first().alias(alias)
                          for c, alias in (("op", "excluded_op"), ("start", "_excluded_start"), (order, "_excluded_order"))]
    else:
        first_excluded = [pl.lit(None, pl.Utf8).alias("excluded_op"), pl.lit(None, pl.Int64).alias("_excluded_start"),
                          pl.lit(None, pl.Int64).alias("_excluded_order")]
    is_kernel = pl.col("activity") == "kernel"
    windows = (
        in_window.group_by("key", "window")
        .agg(
            pl.len().cast(pl.Int64).alias("activities"),
            *first_excluded,
            (is_kernel & pl.col("name").str.contains(PREFILL_ATTENTION_REGEX)).any().alias("_prefill"),
            (is_kernel & pl.col("name").str.contains(DECODE_ATTENTION_REGEX)).any().alias("_decode"),
        )
        .with_columns(pl.col("_excluded_start").cast(pl.Int64), pl.col("_excluded_order").cast(pl.Int64))
        .collect()
    )
    launches = (
        in_window.filter(pl.col("api_tid").is_not_null())
        .group_by("key", "window", (pl.col("api_tid") % THREAD_ID_MODULUS).alias("tid"))
        .agg(pl.len().cast(pl.Int64).alias("launches"))
        .collect()
    )
    return WindowSummary(windows, launches)


def add_summaries(parts: list[WindowSummary]) -> WindowSummary:
    """The summary of all the parts' activities together."""
    windows = (
        pl.concat([p.windows for p in parts], how="vertical_relaxed")
        .sort("_excluded_start", "_excluded_order", nulls_last=True, maintain_order=True)
        .group_by("key", "window", maintain_order=True)
        .agg(pl.col("activities").sum(), pl.col("excluded_op").first(), pl.col("_excluded_start").first(),
             pl.col("_excluded_order").first(), pl.col("_prefill").any(), pl.col("_decode").any())
    )
    launches = pl.concat([p.launches for p in parts], how="vertical_relaxed").group_by("key", "window", "tid").agg(
        pl.col("launches").sum())
    return WindowSummary(windows, launches)


def _decode_launch_threads(launches: pl.DataFrame, step_of_window: pl.DataFrame) -> pl.DataFrame:
    """Per decode step and launching thread (`tid`: the launching call's thread id as the trace
    gives it): the GPU activities it launched, `rank, step, tid, launches`."""
    decode = step_of_window.filter(pl.col("decode").fill_null(False))
    return (
        launches.join(decode, on=["key", "window"], how="inner")
        .group_by("rank", "step", "tid")
        .agg(pl.col("launches").sum().cast(pl.Int64))
        .select("rank", "step", "tid", "launches")
        .sort("rank", "step", "tid")
    )


def _capture_windows(pids: pl.Series) -> pl.DataFrame:
    """One window per process, over all of its host time."""
    pids = pids.unique().drop_nulls().sort()
    return pl.DataFrame(
        {
            "key": pids, "pid": pids, "window": [0] * len(pids), "host_start": [NO_TIME_BEFORE] * len(pids),
            "host_end": [NO_TIME_AFTER] * len(pids), "label": [None] * len(pids), "complete": [True] * len(pids),
        },
        schema=WINDOW_SCHEMA,
    )


def _auto_method(api_calls: pl.DataFrame, nvtx: pl.DataFrame, nvtx_regex: str | None, markers: pl.DataFrame) -> str:
    if nvtx_regex and nvtx.filter(pl.col("name").str.contains(nvtx_regex)).height:
        return "nvtx"
    if api_calls.filter(pl.col("kind") == "graph_launch").height:
        return "graph"
    if markers.height:
        return "marker"
    return "none"


def marker_calls(activities: pl.DataFrame, marker_regex: str | None) -> pl.DataFrame:
    """Host start of each marker kernel's launching call: `pid, t` (of all the activities, or
    of a part: the parts' calls stacked are all of them; `_windows_from_cuts` drops repeats)."""
    if not marker_regex:
        return pl.DataFrame(schema={"pid": pl.Int64, "t": pl.Int64})
    re.compile(marker_regex)
    # the regex runs once per distinct name, not once per kernel (millions of rows, ~100 names)
    names = activities["name"].unique().drop_nulls()
    markers = names.filter(names.str.contains(marker_regex))
    return (
        activities.lazy()
        .filter(
            (pl.col("activity") == "kernel")
            & pl.col("api_start").is_not_null()
            & pl.col("name").is_in(markers.implode())
        )
        .select("pid", pl.col("api_start").alias("t"))
        .unique()
        .sort("pid", "t")
        .collect()
    )


def _windows_from_cuts(cuts: pl.DataFrame, *, left_closed: bool) -> pl.DataFrame:
    """Per process, the intervals between consecutive cut times.

    left_closed=False (marker cuts): windows (c[k-1], c[k]], the marker launch closes its step,
    plus a trailing incomplete window after the last marker.
    left_closed=True (graph launch cuts): windows [c[k], c[k+1]), plus a leading window
    before the first launch.
    """
    if cuts.height == 0:
        return pl.DataFrame(schema=WINDOW_SCHEMA)
    cuts = cuts.unique().sort("pid", "t")
    previous = pl.col("t").shift(1).over("pid")
    if left_closed:
        # [c[k], c[k+1] - 1] for every cut, and the leading window before the first one.
        following = pl.col("t").shift(-1).over("pid")
        inner = cuts.select("pid", pl.col("t").alias("host_start"), (following - 1).fill_null(NO_TIME_AFTER).alias("host_end"))
        edge = cuts.group_by("pid").agg(pl.lit(NO_TIME_BEFORE).alias("host_start"), (pl.col("t").min() - 1).alias("host_end"))
    else:
        # [c[k-1] + 1, c[k]] for every cut, and the trailing window after the last one.
        inner = cuts.select("pid", (previous + 1).fill_null(NO_TIME_BEFORE).alias("host_start"), pl.col("t").alias("host_end"))
        edge = cuts.group_by("pid").agg((pl.col("t").max() + 1).alias("host_start"), pl.lit(NO_TIME_AFTER).alias("host_end"))
    windows = (
        pl.concat([inner, edge.select(inner.columns)], how="vertical")
        .with_columns(pl.col("host_start").cast(pl.Int64), pl.col("host_end").cast(pl.Int64))
        .sort("pid", "host_start")
        .with_columns(
            pl.col("pid").alias("key"),
            pl.int_range(pl.len()).over("pid").cast(pl.Int64).alias("window"),
            pl.lit(None, pl.Utf8).alias("label"),
        )
    )
    last_window = pl.col("window") == pl.col("window").max().over("pid")
    complete = pl.lit(True) if left_closed else ~last_window
    return windows.with_columns(complete.alias("complete")).select(list(WINDOW_SCHEMA))


def _nvtx_windows(nvtx: pl.DataFrame, regex: str) -> pl.DataFrame:
    """Each matching range on its own thread is a window (ranges still open are incomplete).

    Ranges timed on the GPU (a PyTorch profiler's `gpu_user_annotation` copy of each host
    annotation) are not windows: their times are GPU times, and a window gathers launch calls
    by host time from every thread of the process."""
    host_ranges = ~pl.col("domain").is_in(list(GPU_RANGE_CATS)).fill_null(False) if "domain" in nvtx.columns \
        else pl.lit(True)
    matching = nvtx.filter(
        pl.col("name").str.contains(regex)
        & host_ranges
        & (pl.col("end_global_tid").is_null() | (pl.col("end_global_tid") == pl.col("global_tid")))
    ).sort("global_tid", "start")
    return matching.select(
        pl.col("global_tid").alias("key"),
        "pid",
        pl.int_range(pl.len()).over("global_tid").cast(pl.Int64).alias("window"),
        pl.col("start").alias("host_start"),
        pl.col("end").fill_null(NO_TIME_AFTER).alias("host_end"),
        pl.col("name").alias("label"),
        pl.col("end").is_not_null().alias("complete"),
    )


def _place(frame: pl.DataFrame, windows: pl.DataFrame, *, time_col: str, key_col: str) -> pl.DataFrame:
    """Add `key, window`: the window whose [host_start, host_end] holds `time_col` (else null).

    Only the key, the time and the row's position are sorted for the as-of join; the windows
    found are scattered back to the rows' positions. So `frame` keeps its row order, and its
    columns are shared with the result instead of copied (there are millions of activities).
    """
    original_columns = [c for c in frame.columns if c not in ("key", "window")]
    keyed = frame.select(pl.col(key_col).alias("key"), pl.col(time_col).alias("_time"))
    window = pl.repeat(None, frame.height, dtype=pl.Int64, eager=True).alias("window")
    if windows.height and frame.height:
        timed = keyed.with_row_index("_position").filter(pl.col("_time").is_not_null()).sort("key", "_time")
        lookup = windows.select("key", "window", "host_start", "host_end").sort("key", "host_start")
        matched = timed.join_asof(
            lookup,
            left_on="_time",
            right_on="host_start",
            by="key",
            strategy="backward",
            check_sortedness=False,
        ).filter(pl.col("_time") <= pl.col("host_end"))
        window = window.scatter(matched["_position"], matched["window"])
    return frame.select(original_columns).with_columns(keyed["key"], window)


def _place_other_threads(placed: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Rows that no window of their own thread holds: the window of another thread of the same
    process whose host time holds their launching call (`key` becomes that window's thread)."""
    unplaced = placed.select(pl.col("window").is_null() & pl.col("api_start").is_not_null()).to_series()
    if windows.height == 0 or not unplaced.any():
        return placed
    by_process = windows.select(pl.col("pid").alias("key"), pl.col("key").alias("thread"), "window",
                                "host_start", "host_end")
    positions = unplaced.arg_true()
    candidates = placed.select("pid", "api_start")[positions].with_columns(positions.alias("_position"))
    # `_place` by pid, over windows renumbered per process so that their (pid, window) is unique
    numbered = by_process.sort("key", "host_start").with_columns(
        pl.int_range(pl.len()).over("key").cast(pl.Int64).alias("_in_process"))
    found = _place(candidates, numbered.select("key", pl.col("_in_process").alias("window"), "host_start", "host_end"),
                   time_col="api_start", key_col="pid").filter(pl.col("window").is_not_null())
    if found.height == 0:
        return placed
    owners = found.join(numbered.rename({"window": "_thread_window"}), left_on=["key", "window"],
                        right_on=["key", "_in_process"], how="left")
    key = placed["key"].clone().scatter(owners["_position"], owners["thread"])
    window = placed["window"].clone().scatter(owners["_position"], owners["_thread_window"])
    return placed.with_columns(key, window)


def _with_steps(placed: pl.DataFrame, step_of_window: pl.DataFrame) -> pl.DataFrame:
    """`placed` plus the `step, rank, decode` of its window (null outside any window).

    Only the window keys go through the join, so the rows keep their order and the columns
    are shared, not copied."""
    looked_up = left_join_keys(placed, step_of_window, ["key", "window"])
    return placed.hstack(looked_up.select("step", "rank", "decode"))


def _judge_windows(
    windows: pl.DataFrame,
    summary: WindowSummary,
    api_calls: pl.DataFrame,
    nvtx: pl.DataFrame,
    rule: StepRule | None,
    method: str,
    by_thread: bool,
) -> pl.DataFrame:
    """Decide for each window whether it is a decode step, and if not, why.

    Windows that hold no GPU activity are dropped (they are idle host time, not steps).
    """
    activity_counts = summary.windows.select("key", "window", "activities", "excluded_op")
    graph_launches = (
        api_calls.filter(pl.col("window").is_not_null() & (pl.col("kind") == "graph_launch"))
        .group_by("key", "window")
        .agg(pl.len().alias("graph_launches"))
    )
    nvtx_hits = _windows_with_excluded_nvtx(windows, nvtx, rule, by_thread)
    attention = summary.windows.select("key", "window", "_prefill", "_decode")
    kinds = window_kinds(windows, attention, _step_annotations_in_windows(windows, nvtx, by_thread))

    judged = (
        windows.join(activity_counts, on=["key", "window"], how="inner")
        .join(graph_launches, on=["key", "window"], how="left")
        .join(nvtx_hits, on=["key", "window"], how="left")
        .join(kinds, on=["key", "window"], how="left")
        .with_columns(pl.col("graph_launches").fill_null(0))
    )
    reason = (
        pl.when(~pl.col("complete"))
        .then(pl.lit("incomplete: the capture ended inside this step"))
        .when(pl.lit(method == "graph") & (pl.col("graph_launches") == 0))
        .then(pl.lit("eager work without a graph launch (prefill, warm-up or capture)"))
        .when(pl.col("kind") != "decode")
        .then(pl.concat_str(pl.lit("a "), pl.col("kind"), pl.lit(" step, by "), pl.col("kind_source")))
        .when(pl.col("excluded_op").is_not_null())
        .then(pl.concat_str(pl.lit("contains "), pl.col("excluded_op"), pl.lit(" (not a decode step)")))
        .when(pl.col("excluded_nvtx").is_not_null())
        .then(pl.concat_str(pl.lit("inside NVTX range '"), pl.col("excluded_nvtx"), pl.lit("' (not decode)")))
        .otherwise(None)
    )
    return judged.with_columns(reason.alias("reason")).with_columns(pl.col("reason").is_null().alias("decode"))


def _step_annotations_in_windows(windows: pl.DataFrame, nvtx: pl.DataFrame, by_thread: bool) -> pl.DataFrame:
    """The engines' step annotations (host ranges) placed in the windows where they start:
    `key, window, name`, in start order."""
    empty = pl.DataFrame(schema={"key": pl.Int64, "window": pl.Int64, "name": pl.Utf8})
    if windows.height == 0 or nvtx.height == 0:
        return empty
    host = ~pl.col("domain").is_in(list(GPU_RANGE_CATS)).fill_null(False) if "domain" in nvtx.columns else pl.lit(True)
    ranges = nvtx.filter(pl.col("name").str.contains(STEP_ANNOTATION_REGEX) & host).sort("start").select(
        pl.col("global_tid" if by_thread else "pid").alias("key"), pl.col("start").alias("api_start"), "name"
    )
    if ranges.height == 0:
        return empty
    placed = _place(ranges, windows, time_col="api_start", key_col="key")
    return placed.filter(pl.col("window").is_not_null()).select("key", "window", "name")


def _windows_with_excluded_nvtx(
    windows: pl.DataFrame, nvtx: pl.DataFrame, rule: StepRule | None, by_thread: bool
) -> pl.DataFrame:
    """Windows that are, or that contain the start of, an NVTX range matching the exclude rule."""
    empty = pl.DataFrame(schema={"key": pl.Int64, "window": pl.Int64, "excluded_nvtx": pl.Utf8})
    if not rule or not rule.exclude_nvtx_regex or windows.height == 0:
        return empty
    pattern = rule.exclude_nvtx_regex
    if by_thread:
        return windows.filter(pl.col("label").str.contains(pattern)).select(
            "key", "window", pl.col("label").alias("excluded_nvtx")
        )
    excluded_ranges = nvtx.filter(pl.col("name").str.contains(pattern)).select(
        pl.col("pid").alias("key"), pl.col("start").alias("api_start"), pl.col("name").alias("excluded_nvtx")
    )
    if excluded_ranges.height == 0:
        return empty
    placed = _place(excluded_ranges, windows, time_col="api_start", key_col="key")
    return (
        placed.filter(pl.col("window").is_not_null())
        .group_by("key", "window")
        .agg(pl.col("excluded_nvtx").first())
    )


def _number_decode_steps(windows: pl.DataFrame) -> pl.DataFrame:
    """`rank`: index of the process in pid order; `step`: decode index within its rank."""
    ranks = windows.select(pl.col("pid").unique().sort()).with_row_index("rank").with_columns(
        pl.col("rank").cast(pl.Int64)
    )
    ordered = windows.join(ranks, on="pid", how="left").sort("rank", "host_start")
    step = pl.when(pl.col("decode")).then(pl.col("decode").cast(pl.Int64).cum_sum().over("rank") - 1)
    kind_step = pl.when(pl.col("complete")).then(
        pl.col("complete").cast(pl.Int64).cum_sum().over("rank", "kind") - 1)
    return ordered.with_columns(step.otherwise(None).alias("step"), kind_step.otherwise(None).alias("kind_step"))


def launches_per_thread(launch_threads: pl.DataFrame | None) -> pl.DataFrame:
    """Per rank and launching thread, over the decode steps: `rank, tid, steps, min, max, total`
    (launches per step), most launches first."""
    if launch_threads is None:
        launch_threads = pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "tid": pl.Int64, "launches": pl.Int64})
    return (
        launch_threads.group_by("rank", "tid")
        .agg(pl.len().cast(pl.Int64).alias("steps"), pl.col("launches").min().alias("min"),
             pl.col("launches").max().alias("max"), pl.col("launches").sum().alias("total"))
        .sort(["rank", "total", "tid"], descending=[False, True, False])
    )
