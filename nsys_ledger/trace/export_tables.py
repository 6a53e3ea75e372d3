"""Which tables and columns of an Nsight Systems export make a `Trace`, and how they become one.

Every export format nsys writes holds the same tables with the same columns: the SQLite
database (`sqlite_reader.py`) and the `--type parquetdir` / `arrowdir` directories
(`columnar_reader.py`, one file per table). This module is the part they share: which table
and which of its columns (under every name that column had from nsys 2021 to 2026) feed each
frame of the Trace, how StringIds are resolved (a join, never a Python lookup per row), how
enum ids become labels, process and thread ids are unpacked, API calls classified, NVTX
domains named, and which rows are damage. A format only has to answer a `TableSource`:
which tables exist, their columns, and "these columns of this table, as these types".

Anything wrong with the input is raised as `TraceError(path, problem)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import polars as pl

from nsys_ledger.errors import TraceError
from nsys_ledger.trace.model import FRAME_SCHEMAS, Trace, TraceMeta, empty_frame

__all__ = ["ExportReader", "NEEDED_TABLES", "RowFilter", "TableSource", "TRACE_TABLES", "contiguous",
           "graph_trace_mode_seen"]

I64 = pl.Int64
TESTED_SCHEMA_MAJOR = 3

I64 = pl.Int64
STR = pl.Utf8
_PID_SHIFT = 1 << 24
_LOW24 = 0xFFFFFF
_TID_CLEAR = ~0xFFFFFF  # keeps the HW, VM and PID bits of a globalTid

# Enum labels carried in code: exports before 2023.1 have no ENUM_* tables, and the labels
# of those that do are long ("Host-to-Device"), while the Trace uses the short form.
MEMCPY_KINDS = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD",
    7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH",
    13: "UVM DtoD",
}
MEM_KINDS = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}
# ENUM_CUPTI_SYNC_TYPE in real exports labels 2 "Stream wait sync"; the Trace uses CUPTI's
# name for it, "Stream wait event".
SYNC_TYPES = {
    0: "Unknown", 1: "Event sync", 2: "Stream wait event", 3: "Stream sync", 4: "Context sync",
}

# API classification, applied to names whose `_vNNNNN` suffix is already stripped. The
# first match wins, in this order.
_API_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("kernel_launch",
     r"^(?:cudaLaunchKernel|cudaLaunchCooperativeKernel|cuLaunchKernel|cuLaunchCooperativeKernel"
     r"|cuLaunchGrid)|^(?:cudaLaunch|cuLaunch)(?:_pt[sd]z)?$"),
    ("graph_launch", r"^(?:cudaGraphLaunch|cuGraphLaunch)"),
    ("memcpy", r"^(?:cudaMemcpy|cuMemcpy)"),
    ("memset", r"^(?:cudaMemset|cuMemset)"),
    ("sync", r"^cu\w*Synchronize|^(?:cudaStreamWaitEvent|cuStreamWaitEvent)"),
    ("graph_capture",
     r"^(?:cudaStreamBeginCapture|cudaStreamEndCapture|cudaGraphInstantiate"
     r"|cuStreamBeginCapture|cuStreamEndCapture|cuGraphInstantiate)"),
)
_VERSION_SUFFIX = r"_v\d+$"

_KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"


# The tables without which the reader cannot do its work: no kernels, nothing to check (it
# refuses the file); no StringIds, no names (it warns). The others are read when present.
NEEDED_TABLES: tuple[str, ...] = ("StringIds", _KERNEL_TABLE)

# Every table the reader may open: what `nsys export --tables` is asked for.
TRACE_TABLES: tuple[str, ...] = (
    "StringIds", "META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE",
    _KERNEL_TABLE, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
    "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS",
    "PROFILER_OVERHEAD", "TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU",
)


@dataclass(frozen=True)
class RowFilter:
    """Keep the rows whose `column` is one of `values` (rendered as SQL or a polars filter)."""

    column: str
    values: tuple[int, ...]


class TableSource(Protocol):
    """One export as tables. `fetch` gets the real column names (None: not in this table,
    give a column of NULLs) and returns a frame of exactly `schema`, or raises TraceError."""

    tables: set[str]
    warnings: list[str]  # problems met while reading (shared with the reader, in order)

    def columns(self, table: str) -> list[str]: ...

    def fetch(
        self,
        table: str,
        columns: Mapping[str, str | None],
        schema: Mapping[str, pl.DataType],
        keep: RowFilter | None = None,
    ) -> pl.DataFrame: ...

    def fetch_chunks(
        self,
        table: str,
        columns: Mapping[str, str | None],
        schema: Mapping[str, pl.DataType],
        rows: int,
    ) -> Iterator[pl.DataFrame]:
        """`fetch` of the whole table, at most `rows` rows a frame, in the order `fetch` gives."""
        ...

    def name_value(self, table: str) -> dict[str, str]:
        """The (name, value) rows of a metadata table, both as text."""
        ...

    def missing_table_hint(self, table: str) -> str:
        """What a missing table means in this format ("" when the problem says it all)."""
        ...


def graph_trace_mode_seen(*, graph_replays: bool, graph_node_rows: bool) -> str | None:
    """The `--cuda-graph-trace` mode an export without the recorded option shows: whole-graph
    replay rows mean "graph", GPU rows that name their graph node mean "node", neither None."""
    if graph_replays:
        return "graph"
    if graph_node_rows:
        return "node"
    return None


def _pid(col: str) -> pl.Expr:
    """`(globalTid >> 24) & 0xFFFFFF`; floor division is an arithmetic shift."""
    return (pl.col(col) // _PID_SHIFT) & _LOW24


def _tid(col: str) -> pl.Expr:
    return pl.col(col) & _LOW24


def _label(col: str, labels: Mapping[int, str]) -> pl.Expr:
    """Enum id -> label; an id the table does not know becomes "kind <id>"."""
    return pl.col(col).replace_strict(
        labels, default=pl.format("kind {}", pl.col(col)), return_dtype=STR
    )


def contiguous(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with one chunk per column. A table comes back in a chunk per Parquet row group
    or per million rows fetched from SQLite, and the first polars query that meets those next
    to the single-chunk columns added later (the kernel names) rechunks the whole frame at once
    (10M kernels: 0.4 s, +0.7 GB at the peak). Column by column, only one column is ever held
    twice."""
    if all(frame[name].n_chunks() == 1 for name in frame.columns):
        return frame
    columns = [frame.get_column(name) for name in frame.columns]
    del frame
    for index, column in enumerate(columns):
        columns[index] = column.rechunk()
        del column
    return pl.DataFrame(columns)

# The largest id a dense StringIds index may have, over its number of strings: each slot costs
# 16 bytes, so sparse ids (hand-made files) join instead.
_DENSE_SLACK = 1_000_000


def _dense_values(strings: pl.DataFrame) -> pl.Series | bool:
    """StringIds as a Series indexed by id, or False when the ids do not allow it."""
    ids = strings["id"]
    if strings.height == 0 or ids.null_count() or ids.n_unique() != strings.height:
        return False
    low, high = ids.min(), ids.max()
    if low < 0 or high > 4 * strings.height + _DENSE_SLACK:
        return False
    slots = pl.DataFrame({"id": pl.int_range(0, high + 1, eager=True, dtype=pl.Int64)})
    return slots.join(strings, on="id", how="left", maintain_order="left")["value"]


def _refuse_repeated_ids(strings: pl.DataFrame, shown: str) -> None:
    """`id` is StringIds' primary key in every nsys export: a repeated id (a damaged page) would
    give a name two values and repeat the rows of every table that names it."""
    repeated = strings.filter(pl.col("id").is_duplicated())["id"]
    if repeated.len():
        raise TraceError(shown, f"damaged export: StringIds repeats id {repeated.min()} "
                                f"({repeated.n_unique():,} ids appear more than once)")


def _attach(df: pl.DataFrame, lookup: pl.DataFrame, key: str) -> pl.DataFrame:
    """`df` left-joined with `lookup` on `key`, order kept. Only the key column goes through
    the join and the looked-up columns are appended: a join gathers every column of its left
    side, and the kernel frame is most of a trace (at 10M kernels each name join copied
    800 MB). Duplicate keys in `lookup` (a damaged StringIds) repeat rows as a join does."""
    looked_up = df.select(key).join(lookup, on=key, how="left", maintain_order="left")
    if looked_up.height != df.height:
        return df.join(lookup, on=key, how="left", maintain_order="left")
    return df.with_columns(looked_up.drop(key))


def _damaged_rows(df: pl.DataFrame) -> dict[str, int]:
    """GPU rows no timeline can place: without a valid interval, a device, a process."""
    bad_times = df.filter(pl.col("start").is_null() | pl.col("end").is_null() | (pl.col("end") < pl.col("start")))
    return {"times": bad_times.height, "device": df["device"].null_count(), "global_pid": df["global_pid"].null_count()}


def _negative_sizes(copies: pl.DataFrame) -> int:
    return copies.filter(pl.col("bytes") < 0).height


def _labelled_copies(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(
        _pid("global_pid").alias("pid"),
        _label("_copy", MEMCPY_KINDS).alias("copy_kind"),
        _label("_src", MEM_KINDS).alias("src_kind"),
        _label("_dst", MEM_KINDS).alias("dst_kind"),
    )


def _labelled_memsets(df: pl.DataFrame) -> pl.DataFrame:
    return df.with_columns(_pid("global_pid").alias("pid"), _label("_mem", MEM_KINDS).alias("mem_kind"))


@dataclass
class _Tally:
    """What a table read a chunk at a time adds up for its checks and warnings."""

    rows: int = 0
    damaged: dict[str, int] = field(default_factory=lambda: {"times": 0, "device": 0, "global_pid": 0})
    negative: int = 0  # copies with a negative size
    unnamed: int = 0  # kernels without a name


ACTIVITY_KINDS = ("kernels", "memcpys", "memsets")  # the Trace's frames of GPU activities


@dataclass(frozen=True)
class ActivitiesSeen:
    """What the Trace's devices and graph trace mode need of its GPU activities."""

    devices: pl.Series  # the distinct device ids that ran them
    graph_node_rows: bool  # some activity is a CUDA graph node

    @staticmethod
    def of(frames) -> ActivitiesSeen:
        # distinct per frame first: a concatenated copy of millions of kernel rows cost 0.6 s and
        # 700 MB at 10M kernels for a handful of devices
        frames = list(frames)
        devices = pl.concat([f["device"].drop_nulls().unique() for f in frames]).unique().alias("device")
        return ActivitiesSeen(devices, any(f["graph_node_id"].is_not_null().any() for f in frames))

    @staticmethod
    def added(parts: list[ActivitiesSeen]) -> ActivitiesSeen:
        if not parts:
            return ActivitiesSeen(pl.Series("device", [], I64), False)
        return ActivitiesSeen(pl.concat([p.devices for p in parts]).unique().alias("device"),
                              any(p.graph_node_rows for p in parts))


class ExportReader:
    """Builds the Trace from a TableSource; `shown` is the path named in errors."""

    def __init__(self, source: TableSource, shown: str):
        self.source = source
        self.shown = shown
        self.tables = source.tables
        self.warnings = source.warnings
        self._strings: pl.DataFrame | None = None
        self._by_id: pl.Series | bool | None = None  # False: the ids cannot index

    # -- schema discovery -------------------------------------------------------------

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        return self.source.columns(table)

    def pick(self, table: str, *candidates: str) -> str | None:
        """The first of `candidates` that `table` has, or None."""
        cols = self.columns(table)
        for c in candidates:
            if c in cols:
                return c
        return None

    # -- fetching ---------------------------------------------------------------------

    def fetch(
        self,
        table: str,
        select: Mapping[str, str | tuple[str, ...] | None],
        schema: Mapping[str, pl.DataType],
        keep: RowFilter | None = None,
    ) -> pl.DataFrame:
        """One read of `table`. `select` maps output name -> column (or candidates, the
        first present wins); a column the table lacks comes back as NULLs."""
        if keep is not None and keep.column not in self.columns(table):
            keep = None
        return self.source.fetch(table, self._present(table, select), dict(schema), keep)

    def fetch_chunks(
        self,
        table: str,
        select: Mapping[str, str | tuple[str, ...] | None],
        schema: Mapping[str, pl.DataType],
        rows: int,
    ) -> Iterator[pl.DataFrame]:
        """`fetch` of the whole table, at most `rows` rows a frame, in table order."""
        return self.source.fetch_chunks(table, self._present(table, select), dict(schema), rows)

    def _present(self, table: str, select: Mapping[str, str | tuple[str, ...] | None]) -> dict[str, str | None]:
        """Output name -> the first of its candidate columns that `table` has (None: none)."""
        columns = {}
        for out, src in select.items():
            cands = (src,) if isinstance(src, str) else (src or ())
            columns[out] = self.pick(table, *cands)
        return columns

    def strings(self) -> pl.DataFrame:
        """StringIds as a frame (id, value), read once."""
        if self._strings is None:
            schema = {"id": I64, "value": STR}
            if self.has("StringIds"):
                strings = self.fetch("StringIds", {"id": "id", "value": "value"}, schema)
                _refuse_repeated_ids(strings, self.shown)
                self._strings = strings
            else:
                self._strings = pl.DataFrame(schema=schema)
        return self._strings

    def resolve(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Add `out` = StringIds.value for the id in `id_col` (null where there is none)."""
        by_id = self.values_by_id()
        if by_id is None:
            return _attach(df, self.strings().rename({"id": id_col, "value": out}), id_col)
        known = pl.col(id_col).is_between(0, by_id.len() - 1)
        return df.with_columns(pl.lit(by_id).gather(pl.when(known).then(pl.col(id_col))).alias(out))

    def values_by_id(self) -> pl.Series | None:
        """StringIds.value at position id, when the ids are unique and small enough to index
        by (nsys numbers its strings 0, 1, 2, ...): a name lookup is then a gather, with no
        hash table over millions of rows (0.5 s and 300 MB less per name column at 10M
        kernels than a join). None otherwise: the lookups join."""
        if self._by_id is None:
            self._by_id = _dense_values(self.strings())
        return self._by_id if self._by_id is not False else None

    # -- the whole trace --------------------------------------------------------------

    def read(self) -> Trace:
        self._refuse_non_export()
        versions = self.versions()
        activities = {"kernels": self.kernels(), "memcpys": self.memcpys(), "memsets": self.memsets()}
        return self._trace(versions, activities, self._host_tables(), ActivitiesSeen.of(activities.values()))

    def read_streamed(self, rows: int, consume: Callable[[Trace, str, pl.DataFrame], None]) -> Trace:
        """The Trace without its kernel, copy and memset rows: after the other tables are read,
        those go to `consume(trace so far, "kernels" | "memcpys" | "memsets", frame)` instead, at
        most `rows` rows a frame, in table order, each frame as the Trace would hold it. Damaged
        rows are refused with the message `read` gives, once their table has been read through;
        the warnings come in the order `read` gives them."""
        self._refuse_non_export()
        versions = self.versions()
        before_host = len(self.warnings)
        host = self._host_tables()
        host_warnings = self.warnings[before_host:]
        del self.warnings[before_host:]
        empty = {kind: empty_frame(kind) for kind in ACTIVITY_KINDS}
        partial = Trace(path=self.shown, meta=TraceMeta(*versions, cuda_graph_trace=None), **host)
        seen = []
        for kind, chunks in (("kernels", self._kernel_chunks(rows)), ("memcpys", self._memcpy_chunks(rows)),
                             ("memsets", self._memset_chunks(rows))):
            for chunk in chunks:
                seen.append(ActivitiesSeen.of([chunk]))
                consume(partial, kind, chunk.select(list(FRAME_SCHEMAS[kind])))
        self.warnings.extend(host_warnings)
        return self._trace(versions, empty, host, ActivitiesSeen.added(seen))

    def _refuse_non_export(self) -> None:
        if not self.has("StringIds"):
            # every nsys export has it (SQLite, parquetdir, arrowdir alike): without it no kernel
            # has a name, and every check after would fail for a reason it cannot name
            raise TraceError(self.shown, "not an Nsight Systems export (no StringIds table)")
        if not self.has(_KERNEL_TABLE):
            raise TraceError(
                self.shown,
                "no CUDA kernels: was the capture made with -t cuda?"
                + self.source.missing_table_hint(_KERNEL_TABLE),
            )

    def _host_tables(self) -> dict[str, pl.DataFrame]:
        """The frames of the trace's host side and graph tables (all but the GPU activities,
        the devices and the profiler overhead), in the order `read` reads them."""
        return {"graph_replays": self.graph_replays(), "api_calls": self.api_calls(), "syncs": self.syncs(),
                "nvtx": self.nvtx(), "graph_nodes": self.graph_nodes()}

    def _trace(self, versions: tuple[str | None, str | None, str], activities: dict[str, pl.DataFrame],
               host: dict[str, pl.DataFrame], seen: ActivitiesSeen) -> Trace:
        nsys_version, schema_version, source = versions
        frames = {**activities, **host, "devices": self.devices(seen.devices),
                  "profiler_overhead": self.profiler_overhead()}
        for kind, df in frames.items():
            frames[kind] = df.select(list(FRAME_SCHEMAS[kind]))
        meta = TraceMeta(
            nsys_version=nsys_version,
            schema_version=schema_version,
            version_source=source,
            cuda_graph_trace=self.declared_graph_trace_mode() or graph_trace_mode_seen(
                graph_replays=host["graph_replays"].height > 0, graph_node_rows=seen.graph_node_rows),
            warnings=tuple(self.warnings),
        )
        return Trace(path=self.shown, meta=meta, **frames)

    # -- metadata ---------------------------------------------------------------------

    def _name_value(self, table: str) -> dict[str, str]:
        if not self.has(table):
            return {}
        cols = self.columns(table)
        if "name" not in cols or "value" not in cols:
            return {}
        return self.source.name_value(table)

    def versions(self) -> tuple[str | None, str | None, str]:
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):
            kv = self._name_value(table)
            product = kv.get("EXPORT_PRODUCT_VERSION") or None
            schema = kv.get("EXPORT_SCHEMA_VERSION") or None
            if product is None and schema is None:
                continue
            major_text = kv.get("EXPORT_SCHEMA_VERSION_MAJOR") or (schema or "").split(".")[0]
            try:
                major = int(major_text)
            except ValueError:
                major = None
            if major is not None and major > TESTED_SCHEMA_MAJOR:
                self.warnings.append(
                    f"schema version {schema or major} is newer than tested; continuing"
                )
            return product, schema, table
        return None, None, "none"

    def declared_graph_trace_mode(self) -> str | None:
        """The `--cuda-graph-trace` mode META_DATA_CAPTURE records ("graph" or "node"), or None."""
        modes = {
            v.strip().lower()
            for k, v in self._name_value("META_DATA_CAPTURE").items()
            if k.endswith("CUDA_GRAPH_TRACE_OPTIONS:MODE")
        } & {"graph", "node"}
        if len(modes) == 1:
            return modes.pop()
        if len(modes) > 1:
            self.warnings.append(
                "processes were captured with different --cuda-graph-trace modes; "
                "treating the trace as node mode"
            )
            return "node"
        return None

    # -- GPU activity -----------------------------------------------------------------

    def check_activity_rows(self, df: pl.DataFrame, table: str, what: str) -> None:
        """GPU rows without a valid interval, a device or a process cannot be placed on any
        timeline: nsys never writes them (its schema declares start, end and deviceId NOT
        NULL, and every export sets globalPid), so they mean a damaged or hand-edited file."""
        self._refuse_damaged_rows(_damaged_rows(df), df.height, table, what)

    def _refuse_damaged_rows(self, damaged: dict[str, int], rows: int, table: str, what: str) -> None:
        """`damaged`: counts of `_damaged_rows` over all `rows` rows of `table`."""
        if damaged["times"]:
            raise TraceError(
                self.shown,
                f"{damaged['times']} of {rows} {what} rows have a NULL or inverted start/end "
                f"timestamp ({table})",
            )
        for column, source in (("device", "deviceId"), ("global_pid", "globalPid")):
            if rows and source not in self.columns(table):
                # every nsys release writes both columns: their absence is a damaged schema
                raise TraceError(self.shown, f"the {table} table has no {source} column; the export is damaged")
            if damaged[column]:
                raise TraceError(
                    self.shown,
                    f"{damaged[column]} of {rows} {what} rows have no {source} ({table}); "
                    "the export is damaged",
                )

    def _checked_chunks(self, table: str, what: str, select: Mapping[str, str | tuple[str, ...] | None],
                        schema: Mapping[str, pl.DataType], rows: int, tally: _Tally) -> Iterator[pl.DataFrame]:
        """`fetch_chunks`, counting into `tally`; damaged rows are refused
        (`check_activity_rows`) once the table is read through, with the whole table's counts."""
        for chunk in self.fetch_chunks(table, select, schema, rows):
            for problem, count in _damaged_rows(chunk).items():
                tally.damaged[problem] += count
            tally.rows += chunk.height
            yield chunk
        self._refuse_damaged_rows(tally.damaged, tally.rows, table, what)

    # the kernel table's columns, and their types as read
    _KERNEL_COLUMNS: dict[str, str] = {
        "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
        "global_pid": "globalPid", "correlation": "correlationId",
        "demangled_id": "demangledName", "short_id": "shortName",
        "graph_node_id": "graphNodeId", "graph_id": "graphId",
    }
    _KERNEL_TYPES: dict[str, pl.DataType] = {
        "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
        "correlation": I64, "demangled_id": I64, "short_id": I64,
        "graph_node_id": I64, "graph_id": I64,
    }

    def kernels(self) -> pl.DataFrame:
        t = _KERNEL_TABLE
        raw = self.fetch(t, self._KERNEL_COLUMNS, self._KERNEL_TYPES)
        self.check_activity_rows(raw, t, "kernel")
        df = self._named_kernels(raw)
        self._warn_about_kernels(raw.height, df["name"].null_count())
        return df

    def _kernel_chunks(self, rows: int) -> Iterator[pl.DataFrame]:
        """`kernels`, at most `rows` rows a frame (read_streamed)."""
        tally = _Tally()
        for raw in self._checked_chunks(_KERNEL_TABLE, "kernel", self._KERNEL_COLUMNS, self._KERNEL_TYPES, rows,
                                        tally):
            df = self._named_kernels(raw)
            tally.unnamed += df["name"].null_count()
            yield df
        self._warn_about_kernels(tally.rows, tally.unnamed)

    def _named_kernels(self, raw: pl.DataFrame) -> pl.DataFrame:
        # name: the demangled name, else the short one. Chosen by id and then looked up once,
        # rather than coalescing two looked-up text columns into a third one.
        demangled = self.resolve(raw.select("demangled_id"), "demangled_id", "_demangled")["_demangled"]
        name_id = pl.when(demangled.is_not_null()).then(pl.col("demangled_id")).otherwise(pl.col("short_id"))
        df = raw.with_columns(name_id.alias("_name_id"), _pid("global_pid").alias("pid"))
        df = self.resolve(df, "_name_id", "name")
        return self.resolve(df, "short_id", "short_name")

    def _warn_about_kernels(self, rows: int, unnamed: int) -> None:
        if rows == 0:
            self.warnings.append("the kernel table is empty")
        if unnamed:
            self.warnings.append(f"{unnamed} kernel rows have no name in StringIds")

    _MEMCPY_COLUMNS: dict[str, str] = {
        "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
        "global_pid": "globalPid", "correlation": "correlationId", "bytes": "bytes",
        "_copy": "copyKind", "_src": "srcKind", "_dst": "dstKind",
        "graph_node_id": "graphNodeId",
    }
    _MEMCPY_TYPES: dict[str, pl.DataType] = {
        "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
        "correlation": I64, "bytes": I64, "_copy": I64, "_src": I64, "_dst": I64,
        "graph_node_id": I64,
    }

    def memcpys(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        if not self.has(t):
            return empty_frame("memcpys")
        df = self.fetch(t, self._MEMCPY_COLUMNS, self._MEMCPY_TYPES)
        self.check_activity_rows(df, t, "memcpy")
        self._refuse_negative_sizes(_negative_sizes(df), df.height)
        return _labelled_copies(df)

    def _memcpy_chunks(self, rows: int) -> Iterator[pl.DataFrame]:
        """`memcpys`, at most `rows` rows a frame (read_streamed)."""
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        if not self.has(t):
            return
        tally = _Tally()
        for df in self._checked_chunks(t, "memcpy", self._MEMCPY_COLUMNS, self._MEMCPY_TYPES, rows, tally):
            tally.negative += _negative_sizes(df)
            yield _labelled_copies(df)
        self._refuse_negative_sizes(tally.negative, tally.rows)

    def _refuse_negative_sizes(self, negative: int, rows: int) -> None:
        if negative:  # CUPTI's byte count is unsigned: a negative one is damage
            raise TraceError(self.shown, f"{negative} of {rows} memcpy rows have a negative size "
                                         "(bytes, CUPTI_ACTIVITY_KIND_MEMCPY)")

    _MEMSET_COLUMNS: dict[str, str] = {
        "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
        "global_pid": "globalPid", "correlation": "correlationId", "bytes": "bytes",
        "_mem": "memKind", "graph_node_id": "graphNodeId",
    }
    _MEMSET_TYPES: dict[str, pl.DataType] = {
        "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
        "correlation": I64, "bytes": I64, "_mem": I64, "graph_node_id": I64,
    }

    def memsets(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        if not self.has(t):
            return empty_frame("memsets")
        df = self.fetch(t, self._MEMSET_COLUMNS, self._MEMSET_TYPES)
        self.check_activity_rows(df, t, "memset")
        return _labelled_memsets(df)

    def _memset_chunks(self, rows: int) -> Iterator[pl.DataFrame]:
        """`memsets`, at most `rows` rows a frame (read_streamed)."""
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        if not self.has(t):
            return
        tally = _Tally()
        for df in self._checked_chunks(t, "memset", self._MEMSET_COLUMNS, self._MEMSET_TYPES, rows, tally):
            yield _labelled_memsets(df)

    def syncs(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
        if not self.has(t):
            return empty_frame("syncs")
        df = self.fetch(
            t,
            {
                "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
                "global_pid": "globalPid", "correlation": "correlationId",
                "_type": "syncType", "_old_type": "deprecatedSyncType",
            },
            {
                "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
                "correlation": I64, "_type": I64, "_old_type": I64,
            },
        )
        # 2025.5+ keeps a `deprecatedSyncType` column next to `syncType`; use whichever is set.
        return df.with_columns(
            pl.coalesce("_type", "_old_type").alias("_type")
        ).with_columns(
            _pid("global_pid").alias("pid"), _label("_type", SYNC_TYPES).alias("sync_type")
        )

    def graph_replays(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
        if not self.has(t):
            return empty_frame("graph_replays")
        df = self.fetch(
            t,
            {
                "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
                "global_pid": "globalPid", "correlation": "correlationId",
                "graph_id": "graphId", "graph_exec_id": "graphExecId",
            },
            {
                "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
                "correlation": I64, "graph_id": I64, "graph_exec_id": I64,
            },
        )
        return df.with_columns(_pid("global_pid").alias("pid"))

    # -- CPU side ---------------------------------------------------------------------

    def api_calls(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_RUNTIME"
        if not self.has(t):
            return empty_frame("api_calls")
        # eventClass 67 rows are CUDA backtrace duplicates of real calls (2022 exports).
        keep = RowFilter("eventClass", (0, 1))
        df = self.fetch(
            t,
            {
                "start": "start", "end": "end", "global_tid": "globalTid",
                "correlation": "correlationId", "_name_id": "nameId",
                "event_class": "eventClass",
            },
            {
                "start": I64, "end": I64, "global_tid": I64, "correlation": I64,
                "_name_id": I64, "event_class": I64,
            },
            keep=keep,
        )
        # Classify the distinct names only, then join the result back.
        names = self.resolve(
            df.select(pl.col("_name_id").unique()).drop_nulls(), "_name_id", "_raw"
        )
        name = pl.col("_raw").str.replace(_VERSION_SUFFIX, "")
        kind = pl.when(pl.lit(False)).then(pl.lit(None, dtype=STR))
        for label, pattern in _API_KIND_PATTERNS:
            kind = kind.when(pl.col("name").str.contains(pattern)).then(pl.lit(label))
        names = names.with_columns(name.alias("name")).with_columns(
            kind.otherwise(pl.lit("other")).alias("kind")
        ).select("_name_id", "name", "kind")
        df = _attach(df, names, "_name_id")
        return df.with_columns(
            pl.col("kind").fill_null("other"),
            _pid("global_tid").alias("pid"),
            _tid("global_tid").alias("tid"),
        )

    def nvtx(self) -> pl.DataFrame:
        t = "NVTX_EVENTS"
        if not self.has(t):
            return empty_frame("nvtx")
        raw = self.fetch(
            t,
            {
                "start": "start", "end": "end", "global_tid": "globalTid",
                "end_global_tid": "endGlobalTid", "event_type": "eventType",
                "_text_id": "textId", "_text": "text", "_domain_id": "domainId",
            },
            {
                "start": I64, "end": I64, "global_tid": I64, "end_global_tid": I64,
                "event_type": I64, "_text_id": I64, "_text": STR, "_domain_id": I64,
            },
            keep=RowFilter("eventType", (59, 60, 75)),
        )
        raw = self.resolve(raw, "_text_id", "_registered").with_columns(
            pl.coalesce("_registered", "_text").alias("name"),
            (pl.col("global_tid") & _TID_CLEAR).alias("_proc"),
        )
        # Domain names: eventType 75 rows, keyed by domainId and the process bits.
        domains = (
            raw.filter(pl.col("event_type") == 75)
            .select("_domain_id", "_proc", pl.col("name").alias("_domain_name"))
            .unique(subset=["_domain_id", "_proc"], keep="first", maintain_order=True)
        )
        ranges = raw.filter(pl.col("event_type").is_in([59, 60])).join(
            domains, on=["_domain_id", "_proc"], how="left", maintain_order="left"
        )
        named_domain = pl.col("_domain_id").is_not_null() & (pl.col("_domain_id") != 0)
        return ranges.with_columns(
            pl.when(named_domain)
            .then(pl.coalesce("_domain_name", pl.format("domain {}", pl.col("_domain_id"))))
            .otherwise(pl.lit(None, dtype=STR))
            .alias("domain"),
            _pid("global_tid").alias("pid"),
            _tid("global_tid").alias("tid"),
        )

    def graph_nodes(self) -> pl.DataFrame:
        # The node table is CUDA_GRAPH_NODE_EVENTS from 2024; in nsys <= 2023.3 it was
        # CUDA_GRAPH_EVENTS, which now holds graph-level events. Tell them apart by columns.
        frames = []
        for t in ("CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS"):
            if not self.has(t) or "graphNodeId" not in self.columns(t):
                continue
            df = self.fetch(
                t,
                {
                    "start": "start", "end": "end", "global_tid": "globalTid",
                    "event_class": "eventClass", "_name_id": "nameId",
                    "graph_node_id": "graphNodeId",
                    "original_graph_node_id": "originalGraphNodeId",
                },
                {
                    "start": I64, "end": I64, "global_tid": I64, "event_class": I64,
                    "_name_id": I64, "graph_node_id": I64, "original_graph_node_id": I64,
                },
            )
            frames.append(self.resolve(df, "_name_id", "name"))
        if not frames:
            return empty_frame("graph_nodes")
        df = frames[0] if len(frames) == 1 else pl.concat(frames)
        return df.with_columns(
            _pid("global_tid").alias("pid"), _tid("global_tid").alias("tid")
        )

    def profiler_overhead(self) -> pl.DataFrame:
        t = "PROFILER_OVERHEAD"
        if not self.has(t):
            return empty_frame("profiler_overhead")
        df = self.fetch(
            t,
            {"start": "start", "end": "end", "global_tid": "globalTid"},
            {"start": I64, "end": I64, "global_tid": I64},
        )
        return df.with_columns(_pid("global_tid").alias("pid"))

    # -- devices ----------------------------------------------------------------------

    def devices(self, used: pl.Series) -> pl.DataFrame:
        """TARGET_INFO_GPU's devices, and the `used` device ids it does not describe."""
        schema = {"device": I64, "name": STR, "sm_count": I64, "total_memory": I64,
                  "_major": I64, "_minor": I64}
        df = pl.DataFrame(schema=schema)
        # TARGET_INFO_GPU from 2021.4; TARGET_INFO_CUDA_GPU before, with other column names.
        for t in ("TARGET_INFO_GPU", "TARGET_INFO_CUDA_GPU"):
            if not self.has(t):
                continue
            key = self.pick(t, "id", "deviceId", "cudaId")
            if key is None:
                continue
            df = self.fetch(
                t,
                {
                    "device": key, "name": "name",
                    "sm_count": ("smCount", "numMultiprocessors"),
                    "total_memory": ("totalMemory", "globalMemorySize"),
                    "_major": ("computeMajor", "computeCapabilityMajor"),
                    "_minor": ("computeMinor", "computeCapabilityMinor"),
                },
                schema,
            )
            break
        df = df.unique(subset=["device"], keep="first", maintain_order=True)
        # Devices that ran work but are not described (pruned or absent TARGET_INFO_GPU).
        missing = used.to_frame("device").join(df.select("device"), on="device", how="anti")
        if missing.height:
            df = pl.concat([df, missing], how="diagonal")
        cc = pl.when(pl.col("_major").is_not_null() & pl.col("_minor").is_not_null()).then(
            pl.format("{}.{}", pl.col("_major"), pl.col("_minor"))
        )
        return df.with_columns(
            cc.otherwise(pl.lit(None, dtype=STR)).alias("compute_capability")
        ).sort("device")

