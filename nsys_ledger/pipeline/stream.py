"""A check that never holds the whole activity table, for big SQLite exports.

The in-memory flow (api.check) reads the kernel, copy and memset tables whole and keeps every
activity until the end, ~0.5 KB per kernel. Here they pass through a private store on disk
(Parquet files in a temporary directory, removed when the check ends), so that memory follows
the chunk and the window of steps, not the trace:

* read: the export's host tables whole (API calls, NVTX, syncs, graphs: small in graph mode),
  its activity tables `CHUNK_ROWS` rows at a time (ExportReader.read_streamed); each chunk
  becomes activities (launch calls, ops) with `_order`, their place in the stacking order
  (attribution.activities.STACKING_ORDER), and goes to the store; the marker kernels'
  launches and the totals are gathered on the way.
* steps: the step windows chosen from those (attribution.steps.StepFinder); each stored chunk
  placed in them and summarised; the summaries added up judge and number the steps: the
  Steps of a whole read, without its activities. Where each host window's activities start
  and end is gathered in the same pass.
* plan: windows of whole decode steps, as pipeline.plan cuts them. The activities are split by
  start time into one bucket per window (from the earliest start of the window's steps'
  activities on), each bucket sorted and numbered: `row` is an activity's place in start
  order over all of them, as gpu_activities numbers them. An activity outside every step
  belongs to the window of its bucket (pipeline.plan gives it the window of the activity
  before it: each window sees it with the same context, so the figures are the same).
* window: each window's own activities, its halo and its context, read from the buckets
  that can hold them (starting before its last end, ending after its first start), go
  through pipeline.window as in memory; their per-activity results are dropped at once.

The Result then has no per-activity frames (`steps.activities` and `layers.assignments` are
empty, as for several rank files checked together).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from multiprocessing import get_context
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from nsys_ledger.attribution.activities import STACKING_ORDER, activity_rows, with_launch_calls
from nsys_ledger.attribution.ops import with_ops
from nsys_ledger.attribution.steps import StepFinder, Steps, add_summaries, marker_calls, window_summary
from nsys_ledger.frames import left_join_keys
from nsys_ledger.ledger import Expectations, StepRule
from nsys_ledger.pipeline.plan import window_parts
from nsys_ledger.pipeline.window import (
    WindowInput,
    WindowResult,
    WindowSettings,
    own_and_halo,
    run_window,
    time_reach,
    window_input,
)
from nsys_ledger.progress import quiet_worker
from nsys_ledger.trace import Trace

# Rows of an activity table read at once: a chunk's activities with their launch calls and
# ops are ~60 MB, small next to a window of 256 graph-mode decode steps (~0.5M kernels).
CHUNK_ROWS = 65_536
# Decode steps per window when the caller does not say. Through the store, a window's stages are
# what memory holds at the peak (~0.7 KB per kernel, docs/performance.md): 64 graph-mode GLM steps
# are ~130k kernels, a check of 1M kernels peaked at 535 MiB (128 steps: 683, 256: 1,009 MiB);
# each window repeats the stages' fixed costs (~0.4 cpu s), so 16 steps (498 MiB) cost 26 cpu s
# against 19 for 64.
STORE_WINDOW_STEPS = 64
# `_order`: the table's place in STACKING_ORDER above this bit, the row's place in its table below
ORDER_SHIFT = 40
NO_TIME_BEFORE = -(2**62)
NO_TIME_AFTER = 2**62
# Bucket files written at once (each an open file): under the usual limit of 1,024 descriptors
OPEN_FILES = 256
STORE_COLUMNS = ("part", "window_id", "_bucket")  # what a bucket holds besides the activities' columns


@dataclass
class Tallies:
    """What the whole-trace figures need of the activities, added up chunk by chunk."""

    activities: int = 0
    kernels_by_device: dict[int, int] = field(default_factory=dict)
    h2d_copies: int = 0
    h2d_pageable: int = 0
    graph_kernel_launches: list[pl.DataFrame] = field(default_factory=list)  # distinct pid, correlation
    markers: list[pl.DataFrame] = field(default_factory=list)  # marker_calls of each chunk
    pids: list[pl.Series] = field(default_factory=list)

    @property
    def kernels(self) -> int:
        return sum(self.kernels_by_device.values())

    def node_level_replays(self) -> int:
        """Graph replays traced node by node: distinct (process, launch correlation id) of the
        kernels that are graph nodes (as api._node_level_replays counts them)."""
        return pl.concat(self.graph_kernel_launches).unique().height if self.graph_kernel_launches else 0


@dataclass
class ActivityStore:
    """The private directory the activities pass through; `close` removes it."""

    root: Path
    chunks: list[Path] = field(default_factory=list)  # as read: activities with `_order`
    buckets: list[Path | None] = field(default_factory=list)  # per window: sorted, numbered, placed
    bucket_spans: pl.DataFrame | None = None  # bucket, first (start), last (latest end)

    @staticmethod
    def create() -> ActivityStore:
        return ActivityStore(Path(tempfile.mkdtemp(prefix="nsys-ledger-activities-")))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def add_chunk(self, activities: pl.DataFrame) -> None:
        path = self.root / f"chunk-{len(self.chunks):06d}.parquet"
        activities.write_parquet(path)
        self.chunks.append(path)

    def stored_chunks(self) -> Iterator[pl.DataFrame]:
        for path in self.chunks:
            yield pl.read_parquet(path)


def read_into_store(read_streamed: Callable, store: ActivityStore, expectations: Expectations | None,
                    rule_of: Callable[[Trace], StepRule | None]) -> tuple[Trace, Tallies]:
    """The trace without its activity tables, whose rows go to `store` a chunk at a time as
    activities with launch calls and ops. `read_streamed(rows, consume)`: the reader's;
    `rule_of(trace)`: the step rule, whose marker kernels are gathered on the way."""
    tallies = Tallies()
    rows_before = dict.fromkeys(STACKING_ORDER, 0)

    def consume(trace: Trace, kind: str, frame: pl.DataFrame) -> None:
        first = (STACKING_ORDER.index(kind) << ORDER_SHIFT) + rows_before[kind]
        rows_before[kind] += frame.height
        rows = activity_rows(kind, frame).with_columns(
            (pl.int_range(pl.len(), dtype=pl.Int64) + first).alias("_order"))
        activities = with_ops(with_launch_calls(rows, trace.api_calls), expectations)
        _tally(tallies, kind, frame, activities, rule_of(trace))
        store.add_chunk(activities)

    return read_streamed(CHUNK_ROWS, consume), tallies


def _tally(tallies: Tallies, kind: str, frame: pl.DataFrame, activities: pl.DataFrame, rule: StepRule | None) -> None:
    tallies.activities += frame.height
    if kind == "kernels":
        for device, count in frame.group_by("device").agg(pl.len()).iter_rows():
            tallies.kernels_by_device[device] = tallies.kernels_by_device.get(device, 0) + count
        tallies.graph_kernel_launches.append(
            frame.filter(pl.col("graph_node_id").is_not_null()).select("pid", "correlation").unique())
    if kind == "memcpys":
        h2d = frame.filter(pl.col("copy_kind") == "HtoD")
        tallies.h2d_copies += h2d.height
        tallies.h2d_pageable += h2d.filter(pl.col("src_kind") == "Pageable").height
    tallies.markers.append(marker_calls(activities, rule.marker_regex if rule else None))
    tallies.pids.append(activities["pid"].unique())


@dataclass(frozen=True)
class StoredSteps:
    steps: Steps  # without activities (an empty frame of their columns)
    finder: StepFinder  # places stored activities in the step windows again
    host_window_spans: pl.DataFrame  # key, window, first (start), last (latest end) of its activities


def find_stored_steps(store: ActivityStore, trace: Trace, tallies: Tallies, rule: StepRule | None, *,
                      step_nvtx: str | None, method: str | None) -> StoredSteps:
    """The Steps of the stored activities, a chunk at a time."""
    finder = StepFinder(trace.api_calls, trace.nvtx, rule, step_nvtx=step_nvtx, method=method)
    finder.choose(pl.concat(tallies.markers), pl.concat(tallies.pids))
    summaries, spans = [], []
    columns = None
    for chunk in store.stored_chunks():
        placed = finder.place(chunk)
        summaries.append(window_summary(placed, rule))
        spans.append(placed.filter(pl.col("window").is_not_null()).group_by("key", "window").agg(
            pl.col("start").min().alias("first"), pl.col("end").max().alias("last")))
        columns = placed.clear()
    # the activities' columns as the in-memory Steps has them: `row` first, no `_order`
    columns = columns.select(pl.lit(None, pl.UInt32).alias("row"), pl.exclude("_order"))
    spans_of = pl.concat(spans).group_by("key", "window").agg(pl.col("first").min(), pl.col("last").max())
    return StoredSteps(finder.steps(add_summaries(summaries), columns), finder, spans_of)


@dataclass(frozen=True)
class StorePlan:
    count: int  # windows of steps
    windows: pl.DataFrame  # Steps.windows + part, window_id, first, last (pipeline.plan's `windows`)
    part_spans: pl.DataFrame  # part, first, last: the first start and last end of each window's own activities


def plan_store(store: ActivityStore, stored: StoredSteps, window_steps: int) -> StorePlan:
    """Windows of `window_steps` decode steps; the stored activities split into one bucket per
    window by start time, each sorted and numbered, with their steps."""
    steps = stored.steps
    parts = window_parts(steps, window_steps)
    windows = parts.join(stored.host_window_spans, on=["key", "window"], how="left", maintain_order="left")
    count = int(parts["part"].max()) + 1 if parts.height else 1  # no step: one window of every activity
    # a bucket holds the activities that start from its window's earliest start on (made to rise
    # with the window: a later window's steps on another rank may start first)
    earliest = windows.group_by("part").agg(pl.col("first").min())
    bucket_from = (pl.DataFrame({"part": range(count)}, schema={"part": pl.Int64})
                   .join(earliest, on="part", how="left").sort("part")["first"]
                   .fill_null(strategy="forward").fill_null(NO_TIME_BEFORE).cum_max())
    keys = parts.select("key", "window", "part", "window_id")
    unsorted = _split_into_buckets(store, stored.finder, keys, bucket_from, count)
    step_of_window = steps.windows.select("key", "window", "step", "rank", "decode")
    rows_before = 0
    bucket_spans, owned_spans = [], []
    for bucket in range(count):
        if bucket not in unsorted:  # no activity starts in this window's time (its steps' started earlier)
            store.buckets.append(None)
            continue
        rows = _numbered(pl.read_parquet(unsorted[bucket]), rows_before, step_of_window)
        unsorted[bucket].unlink()
        rows_before += rows.height
        path = store.root / f"bucket-{bucket:06d}.parquet"
        rows.write_parquet(path, statistics=True)
        store.buckets.append(path)
        bucket_spans.append((bucket, rows["start"].min(), rows["end"].max()))
        owned_spans.append(rows.group_by(pl.coalesce("part", "_bucket").alias("part")).agg(
            pl.col("start").min().alias("first"), pl.col("end").max().alias("last")))
    store.bucket_spans = pl.DataFrame(bucket_spans, schema={"bucket": pl.Int64, "first": pl.Int64, "last": pl.Int64},
                                      orient="row")
    part_spans = pl.concat(owned_spans).group_by("part").agg(pl.col("first").min(), pl.col("last").max())
    return StorePlan(count, windows, part_spans)


def _split_into_buckets(store: ActivityStore, finder: StepFinder, keys: pl.DataFrame, bucket_from: pl.Series,
                        count: int) -> dict[int, Path]:
    """The stored chunks' activities, placed in their steps, appended to one file per bucket
    (`_bucket`: the last bucket whose time starts at or before theirs), the chunks removed.
    At most OPEN_FILES buckets are written at once: more buckets take more passes."""
    files: dict[int, Path] = {}
    for low in range(0, count, OPEN_FILES):
        writers: dict[int, pq.ParquetWriter] = {}
        try:
            for chunk in store.stored_chunks():
                bucket = (bucket_from.search_sorted(chunk["start"], side="right").cast(pl.Int64) - 1).clip(0)
                placed = _placed(finder, chunk, keys).with_columns(bucket.alias("_bucket")).filter(
                    pl.col("_bucket").is_between(low, low + OPEN_FILES - 1))
                for (index,), rows in placed.partition_by("_bucket", as_dict=True).items():
                    table = rows.to_arrow()
                    if index not in writers:
                        files[index] = store.root / f"unsorted-{index:06d}.parquet"
                        writers[index] = pq.ParquetWriter(files[index], table.schema)
                    writers[index].write_table(table.cast(writers[index].schema))
        finally:
            for writer in writers.values():
                writer.close()
    for path in store.chunks:
        path.unlink()
    store.chunks = []
    return files


def _placed(finder: StepFinder, activities: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Stored activities with `key, window` and their host window's `part, window_id` (null
    outside every step window)."""
    placed = finder.place(activities)
    found = left_join_keys(placed, keys, ["key", "window"])
    return placed.with_columns(found["part"], found["window_id"])


def _numbered(rows: pl.DataFrame, rows_before: int, step_of_window: pl.DataFrame) -> pl.DataFrame:
    """A bucket's activities in start order (among equal starts, in stacking order), with their
    `row` over the whole trace and their steps, `row` first."""
    rows = rows.sort("start", "_order")
    row = (pl.int_range(pl.len(), dtype=pl.Int64) + rows_before).cast(pl.UInt32).alias("row")
    steps = left_join_keys(rows, step_of_window, ["key", "window"])
    return rows.select(row, pl.exclude("_order")).with_columns(steps["step"], steps["rank"], steps["decode"])


def window_inputs(store: ActivityStore, steps: Steps, plan: StorePlan) -> Iterator[WindowInput]:
    """Each window's input, read from the buckets that can hold its activities and context."""
    columns = steps.activities.columns
    for part in range(plan.count):
        own, halo = own_and_halo(plan.windows, part)
        own_span = plan.part_spans.filter(pl.col("part") == part)
        if own_span.height == 0:  # nothing of its own (no step window is empty): its halo's time only
            first, last = time_reach(NO_TIME_AFTER, NO_TIME_BEFORE, halo)
        else:
            first, last = time_reach(int(own_span["first"][0]), int(own_span["last"][0]), halo)
        spans = store.bucket_spans
        wanted = spans.filter((pl.col("first") <= last) & (pl.col("last") >= first))["bucket"].to_list()
        overlapping = (pl.col("start") <= last) & (pl.col("end").fill_null(pl.col("start")) >= first)
        rows = pl.concat([pl.scan_parquet(store.buckets[b]).filter(overlapping) for b in wanted]).collect() \
            if wanted else steps.activities.with_columns(pl.lit(None, pl.Int64).alias(c) for c in STORE_COLUMNS)
        owned = rows.select(pl.coalesce("part", "_bucket") == part).to_series()
        in_halo = rows["window_id"].is_in(halo["window_id"].implode()).fill_null(False)
        every = pl.repeat(True, rows.height, eager=True)
        yield window_input(steps, part, own, halo, rows.select(columns), owned, in_halo, every)


def run_stored_windows(trace: Trace, steps: Steps, store: ActivityStore, plan: StorePlan,
                       settings: WindowSettings, *, jobs: int = 1) -> list[WindowResult]:
    """Every window's result, without its per-activity frames, here or in `jobs` local
    processes (at most `jobs` windows' inputs in memory at once)."""
    inputs = window_inputs(store, steps, plan)
    if jobs <= 1 or plan.count == 1:
        return [_without_activity_results(run_window(trace, window, settings)) for window in inputs]
    results: list[WindowResult] = []
    with ProcessPoolExecutor(max_workers=min(jobs, plan.count), mp_context=get_context("spawn"),
                             initializer=quiet_worker) as pool:
        running: list[Future] = []
        for window in inputs:
            running.append(pool.submit(run_window, trace, window, settings))
            if len(running) >= jobs:
                results.append(_without_activity_results(running.pop(0).result()))
        results += [_without_activity_results(future.result()) for future in running]
    return results


def _without_activity_results(result: WindowResult) -> WindowResult:
    """`result` without the op and layer of each of its activities (kept per step only)."""
    layers = replace(result.layers, assignments=result.layers.assignments.clear())
    return replace(result, op_of_row=result.op_of_row.clear(), layers=layers)
