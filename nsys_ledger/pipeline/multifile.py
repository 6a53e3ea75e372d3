"""Check several exports together, one process each, and stack them into one multi-rank Result.

Multi-node captures give one export per rank (`rank0.sqlite rank1.sqlite ...`). `check_many`
expands directories and glob patterns, runs the same `check()` as for one file on every
export in its own process (min(files, cores) workers: the work is CPU bound and polars uses
threads within a process, so processes are what spreads files over cores), and stacks the
results: rank = file order, then process order inside a file. The ledger checks then run once
more over the stacked tables, so a finding names the failing steps of every rank
("rank 3: 0-499") and the rank comparison sees all ranks.

What comes back from a worker: everything per step (the step and op tables, gaps, the
timeline and layer frames, the step windows), a few MB per file. The per-event frames (the
Trace's kernels, API calls, ..., the steps' activities and API calls, the layer of every
activity) cost ~330 MB and ~7 s to pickle and unpickle per million kernels, more than checking
the file, so they are left out unless `keep_events=True` (for reports that draw single
kernels, such as the HTML report); without them those frames are empty, with their columns.

One file is `check(file, keep_events=...)`, with no process started: a big SQLite export
without `keep_events` goes through a store on disk (pipeline.stream), with the same empty frames.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import polars as pl

from nsys_ledger.api import InputFile, Result, Totals, check, rejudge
from nsys_ledger.errors import TraceError
from nsys_ledger.ledger import Expectations, load_expectations
from nsys_ledger.progress import quiet_worker, stage
from nsys_ledger.trace.columnar_reader import is_table_directory
from nsys_ledger.trace.model import FRAME_SCHEMAS, Trace, TraceMeta
from nsys_ledger.pipeline.worker import CheckedFile, FailedFile, check_one_file

__all__ = ["check_many", "expand_trace_paths", "stack_results"]

# What a directory contributes: its exports, and reports that have no export next to them.
EXPORT_SUFFIX = ".sqlite"
REPORT_SUFFIXES = (".nsys-rep", ".qdrep")
_GLOB_CHARACTERS = re.compile(r"[*?\[]")
_FILES_SHOWN_IN_PATH = 4


# --------------------------------------------------------------------------------------
# Which files
# --------------------------------------------------------------------------------------


def expand_trace_paths(paths: Iterable[str | os.PathLike[str]]) -> list[str]:
    """Files in rank order: each path as given; a directory's trace files and a glob
    pattern's matches in natural name order (rank2 before rank10).

    Raises InputError for a directory without trace files, a pattern that matches nothing
    and a file given twice (it would pose as two ranks)."""
    files: list[str] = []
    for given in paths:
        text = str(given)
        if os.path.isdir(text) and not is_table_directory(text):  # a parquetdir is one export
            files += _directory_traces(text)
        elif not os.path.exists(text) and _GLOB_CHARACTERS.search(text):
            matches = sorted(glob.glob(text), key=_natural_key)
            if not matches:
                raise TraceError(text, "no file matches this pattern")
            files += matches
        else:
            files.append(text)
    seen: dict[str, str] = {}
    for path in files:
        key = os.path.realpath(path)
        if key in seen:
            raise TraceError(path, f"given twice (also as {seen[key]}); each file is one rank")
        seen[key] = path
    if not files:
        raise ValueError("no trace file given")
    return files


KINETO_SUFFIXES = (".json", ".json.gz")


def _directory_traces(directory: str) -> list[str]:
    entries = list(os.scandir(directory))
    names = [entry.name for entry in entries if entry.is_file()]
    exports = {n for n in names if n.lower().endswith(EXPORT_SUFFIX)}
    # PyTorch profiler traces, one per rank (SGLang: <ts>-TP-<rank>.trace.json.gz)
    exports |= {n for n in names if n.lower().endswith(KINETO_SUFFIXES)}
    # parquetdir / arrowdir exports inside it (rank0.parquetdir/, ...): one export each
    exports |= {entry.name for entry in entries if entry.is_dir() and is_table_directory(entry.path)}
    exported_stems = {n.rsplit(".", 1)[0].lower() for n in exports}
    reports = {
        n for n in names
        if n.lower().endswith(REPORT_SUFFIXES) and n.rsplit(".", 1)[0].lower() not in exported_stems
    }
    chosen = sorted(exports | reports, key=_natural_key)
    if not chosen:
        raise TraceError(directory, "is a directory without trace files (*.sqlite, *.nsys-rep, "
                                    "parquetdir or arrowdir exports, *.json / *.json.gz profiler traces)")
    return [os.path.join(directory, n) for n in chosen]


def _natural_key(text: str) -> list[Any]:
    return [int(part) if part.isdigit() else part.lower() for part in re.split(r"(\d+)", text)]


# --------------------------------------------------------------------------------------
# Checking in processes
# --------------------------------------------------------------------------------------


def check_many(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    expectations: str | Path | Expectations | None = None,
    *,
    workers: int | None = None,
    keep_events: bool = False,
    dask: str | None = None,
    **options: Any,
) -> Result:
    """Check every export in `paths` (files, directories, glob patterns) and stack the results.

    `options` are `check()`'s (step_nvtx, step_method, gap_us, ...). `workers` defaults to
    min(files, cores). `dask`: check the files on the Dask cluster at this scheduler address
    (or "local" for a LocalCluster) instead of local processes (`dask_cluster.py`).
    Raises InputError naming the file for the first bad input."""
    path_list = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    files = expand_trace_paths(path_list)
    if expectations is not None and not isinstance(expectations, Expectations):
        expectations = load_expectations(expectations)
    if len(files) == 1:  # the processes (or the Dask workers) go to its step windows (pipeline.run)
        return check(files[0], expectations, jobs=workers or 1, dask=dask, keep_events=keep_events, **options)
    for path in files:  # the cheap mistakes before any process starts
        if not os.path.exists(path):
            raise TraceError(path, "no such file")
    if dask is not None:
        checked = _check_on_dask(files, expectations, options, keep_events, dask, workers)
    else:
        checked = _check_in_processes(files, expectations, options, workers, keep_events)
    return stack_results([c.result for c in checked], files, graph_level=any(c.graph_level for c in checked))


def _check_on_dask(
    files: Sequence[str],
    expectations: Expectations | None,
    options: dict[str, Any],
    keep_events: bool,
    address: str,
    workers: int | None = None,
) -> list[CheckedFile]:
    """One Dask task per file; the outcomes in file order. Raises the first file's InputError."""
    from nsys_ledger.pipeline.dask_cluster import dask_client  # Dask is imported only when asked for

    with dask_client(address, len(files), workers) as client:
        client.run(quiet_worker)
        count = len(files)
        with stage(f"checking {count} files on the Dask cluster {address}") as line:
            futures = client.map(
                check_one_file, list(files), [expectations] * count, [options] * count, [keep_events] * count,
                pure=False,
            )
            outcomes: list[CheckedFile | FailedFile] = []
            for index, future in enumerate(futures):
                outcome = future.result()
                if isinstance(outcome, FailedFile):
                    client.cancel(futures[index + 1:])
                    raise outcome.kind(outcome.path, outcome.problem)
                outcomes.append(outcome)
                line.label = f"checking {count} files on the Dask cluster {address}: {index + 1} done"
    return [o for o in outcomes if isinstance(o, CheckedFile)]


def _check_in_processes(
    files: list[str], expectations: Expectations | None, options: dict[str, Any], workers: int | None,
    keep_events: bool,
) -> list[CheckedFile]:
    count = max(1, min(len(files), workers or os.cpu_count() or 1))
    checked: list[CheckedFile | None] = [None] * len(files)
    # spawn, not fork: a forked child inherits polars' thread pool locks mid-use and can hang.
    with stage(f"checking {len(files)} files in {count} processes") as line, ProcessPoolExecutor(
        max_workers=count, mp_context=get_context("spawn"), initializer=quiet_worker
    ) as pool:
        futures = {
            pool.submit(check_one_file, path, expectations, options, keep_events): index
            for index, path in enumerate(files)
        }
        try:
            for done, future in enumerate(as_completed(futures), start=1):
                outcome = future.result()
                if isinstance(outcome, FailedFile):
                    pool.shutdown(wait=False, cancel_futures=True)
                    raise outcome.kind(outcome.path, outcome.problem)
                checked[futures[future]] = outcome
                line.label = f"checking {len(files)} files in {count} processes: {done} done"
        except BrokenProcessPool as error:
            raise RuntimeError(
                f"a worker process died while checking {len(files)} files (out of memory?); "
                f"try fewer workers than {count}"
            ) from error
    return [c for c in checked if c is not None]


# --------------------------------------------------------------------------------------
# Stacking
# --------------------------------------------------------------------------------------


def stack_results(results: Sequence[Result], files: Sequence[str], *, graph_level: bool) -> Result:
    """One Result of all ranks from per-file results (in `files` order), judged again."""
    offsets, inputs = [], []
    next_rank = 0
    for path, result in zip(files, results, strict=True):
        ranks = _rank_count(result)
        offsets.append(next_rank)
        inputs.append(InputFile(path=path, ranks=tuple(range(next_rank, next_rank + ranks))))
        next_rank += ranks

    stacked = _stack(list(results), offsets, skip=frozenset({"trace", "totals"}))
    notices = _stacked_notices(results, files)
    op_table = stacked.op_table.with_columns(pl.exclude("rank", "step").fill_null(0))
    merged = dataclasses.replace(
        stacked,
        trace=_stacked_trace([r.trace for r in results], files),
        totals=_stacked_totals([r.totals for r in results]),
        op_table=op_table,
        notices=tuple(notices),
        files=tuple(inputs),
    )
    return rejudge(merged, graph_level=graph_level)


def _rank_count(result: Result) -> int:
    ranks = result.steps.windows["rank"].drop_nulls()
    return int(ranks.max()) + 1 if len(ranks) else 0


def _stack(values: list[Any], offsets: list[int], *, skip: frozenset[str] = frozenset()) -> Any:
    """Field-wise stacking of per-file values: frames are concatenated with their `rank`
    shifted by the file's offset; a dataclass holding frames (Result, Steps, Timeline) is
    stacked field by field, so fields added to them later are stacked too; anything else is
    taken from the first file (thresholds, method names: the same options gave them).
    A frame without `rank` is a lookup table the ranks share: stacked without duplicates.
    Fields named in `skip` keep the first file's value (the caller stacks them itself)."""
    present = [(v, off) for v, off in zip(values, offsets) if v is not None]
    if not present:
        return None
    first = present[0][0]
    if isinstance(first, pl.DataFrame):
        if "rank" not in first.columns:  # a lookup table the ranks share (sequence id -> text)
            return pl.concat([f for f, _ in present], how="diagonal_relaxed").unique(maintain_order=True)
        frames = [frame.with_columns(pl.col("rank") + offset) if offset else frame for frame, offset in present]
        return pl.concat(frames, how="diagonal_relaxed") if len(frames) > 1 else frames[0]
    if _holds_frames(first):
        kept = [v for v, _ in present]
        kept_offsets = [off for _, off in present]
        return dataclasses.replace(
            first,
            **{
                f.name: _stack([getattr(v, f.name) for v in kept], kept_offsets)
                for f in dataclasses.fields(first)
                if f.init and f.name not in skip
            },
        )
    return first


def _holds_frames(value: Any) -> bool:
    return (
        dataclasses.is_dataclass(value)
        and not isinstance(value, type)
        and any(isinstance(getattr(value, f.name), pl.DataFrame) or _holds_frames(getattr(value, f.name))
                for f in dataclasses.fields(value))
    )


def _stacked_trace(traces: Sequence[Trace], files: Sequence[str]) -> Trace:
    frames = {
        name: pl.concat([getattr(t, name) for t in traces], how="vertical_relaxed")
        for name in FRAME_SCHEMAS
    }
    frames["devices"] = frames["devices"].unique(subset=["device"], keep="first", maintain_order=True).sort("device")
    metas = [t.meta for t in traces]
    meta = TraceMeta(
        nsys_version=_first_set(m.nsys_version for m in metas),
        schema_version=_first_set(m.schema_version for m in metas),
        version_source=metas[0].version_source,
        cuda_graph_trace=_first_set(m.cuda_graph_trace for m in metas),
        warnings=tuple(
            f"{Path(path).name}: {warning}" for path, m in zip(files, metas) for warning in m.warnings
        ),
    )
    return Trace(path=_describe_files(files), meta=meta, **frames)


def _stacked_totals(totals: Sequence[Totals]) -> Totals:
    by_device: dict[int, int] = {}
    for t in totals:
        for device, count in t.kernels_by_device.items():
            by_device[device] = by_device.get(device, 0) + count
    summed = {
        f.name: sum(getattr(t, f.name) for t in totals)
        for f in dataclasses.fields(Totals)
        if f.name != "kernels_by_device"
    }
    return Totals(kernels_by_device=dict(sorted(by_device.items())), **summed)


def _stacked_notices(results: Sequence[Result], files: Sequence[str]) -> list[str]:
    """Every file's notices, named by file; and a word when the files disagree on how steps
    were found or how graphs were traced (their tables then mean different things)."""
    notices = [f"{Path(path).name}: {notice}" for path, r in zip(files, results) for notice in r.notices]
    methods = sorted({r.steps.method for r in results})
    if len(methods) > 1:
        notices.append(f"the files found their steps in different ways ({', '.join(methods)}); "
                       f"the step tables are stacked as they are")
    graph_modes = sorted({r.trace.meta.cuda_graph_trace or "unknown" for r in results})
    if len(graph_modes) > 1:
        notices.append(f"the files were captured with different --cuda-graph-trace modes ({', '.join(graph_modes)})")
    return notices


def _first_set(values: Iterable[str | None]) -> str | None:
    return next((v for v in values if v is not None), None)


def _describe_files(files: Sequence[str]) -> str:
    if len(files) <= _FILES_SHOWN_IN_PATH:
        return ", ".join(files)
    return f"{files[0]}, ..., {files[-1]} ({len(files)} files)"
