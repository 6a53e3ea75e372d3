"""Read an Nsight Systems SQLite export (nsys 2021.x - 2026.x) into a `Trace`.

The file is opened read-only (SQLite URI ``mode=ro``); its bytes never change. Every table
is read once, with one query that names only the columns we need; a column that an older
schema lacks is selected as NULL, a table that a lazy export left out becomes an empty
frame. Names are resolved by joining `StringIds` in polars (never a Python lookup per
row), and labels, process ids and API kinds are computed with polars expressions.

Anything wrong with the input is raised as `TraceError(path, problem)`, never as a raw
sqlite3 or polars exception.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import polars as pl

from nsys_ledger.errors import TraceError
from nsys_ledger.trace.arrow_fetch import ArrowSource
from nsys_ledger.trace.model import FRAME_SCHEMAS, Trace, TraceMeta, empty_frame

__all__ = ["load_sqlite", "SQLITE_MAGIC", "sniff_format"]

_T = TypeVar("_T")

SQLITE_MAGIC = b"SQLite format 3\x00"

# Seconds SQLite waits on a lock held by another process before giving up.
BUSY_TIMEOUT_S = 1.0
# Rows fetched per round trip; small batches keep the peak of Python objects low.
FETCH_BATCH = 65_536
# The newest schema major version the reader was tested against.
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


# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def load_sqlite(path: str | os.PathLike[str]) -> Trace:
    """Read the Nsight Systems SQLite export at `path`. Raises TraceError on bad input."""
    shown = str(path)
    p = Path(path)
    _check_file(p, shown)
    conn = _connect(p, shown)
    arrow = ArrowSource(_uri(p))
    try:
        return _Reader(conn, shown, arrow).read()
    except sqlite3.Error as exc:
        raise TraceError(shown, _sqlite_problem(exc)) from exc
    except UnicodeDecodeError as exc:
        # SQLite's own error message quoted damaged schema bytes that Python cannot decode
        raise TraceError(shown, "corrupt SQLite database (damaged schema: text that is not UTF-8)") from exc
    finally:
        arrow.close()
        conn.close()


# --------------------------------------------------------------------------------------
# File checks (before SQLite sees the file)
# --------------------------------------------------------------------------------------

_MAGICS: tuple[tuple[bytes, str], ...] = (
    (b"\x1f\x8b", "gzip data"),
    (b"PK\x03\x04", "zip archive"),
    (b"\x28\xb5\x2f\xfd", "zstd data"),
    (b"BZh", "bzip2 data"),
    (b"\xfd7zXZ\x00", "xz data"),
)
_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def sniff_format(head: bytes) -> str:
    """Name the format of a file from its first bytes: "sqlite", "gzip data", "text", ..."""
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    for magic, what in _MAGICS:
        if head.startswith(magic):
            return what
    sample = head[:512]
    if sample and b"\x00" not in sample:
        try:
            sample.decode("utf-8")
        except UnicodeDecodeError:
            # A cut in the middle of a multi-byte character still counts as text.
            try:
                sample[:-3].decode("utf-8")
            except UnicodeDecodeError:
                return "unknown format"
        return "text file"
    return "unknown format"


def _check_file(p: Path, shown: str) -> None:
    try:
        st = p.stat()
    except FileNotFoundError:
        raise TraceError(shown, "no such file") from None
    except PermissionError:
        raise TraceError(shown, "permission denied") from None
    except OSError as exc:
        raise TraceError(shown, f"cannot access the file ({exc.strerror or exc})") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(shown, "is a directory, not a trace file")
    if not stat.S_ISREG(st.st_mode):
        raise TraceError(shown, "not a regular file")
    if st.st_size == 0:
        raise TraceError(shown, "empty file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(512)
    except PermissionError:
        raise TraceError(shown, "permission denied") from None
    except OSError as exc:
        raise TraceError(shown, f"cannot read the file ({exc.strerror or exc})") from None

    kind = sniff_format(head)
    if kind != "sqlite":
        if p.name.lower().endswith(_REPORT_SUFFIXES):
            raise TraceError(
                shown,
                "this is an .nsys-rep report, not an SQLite export; convert it with "
                "`nsys export --type sqlite FILE`",
            )
        raise TraceError(shown, f"not an SQLite database ({kind})")
    if st.st_size < 100:
        raise TraceError(shown, f"truncated SQLite database (only {st.st_size} bytes)")
    expected = _header_size(head)
    if expected is not None and st.st_size < expected:
        raise TraceError(
            shown,
            f"truncated SQLite database: the file has {st.st_size} bytes, its header says "
            f"{expected} (incomplete copy or download?)",
        )


def _header_size(head: bytes) -> int | None:
    """Database size in bytes according to the SQLite header, or None when not recorded.

    The in-header page count is only valid when the change counter (offset 24) equals the
    version-valid-for number (offset 92) and the count is non-zero; SQLite applies the same
    rule.
    """
    if len(head) < 100:
        return None
    page_size = int.from_bytes(head[16:18], "big")
    if page_size == 1:
        page_size = 65536
    n_pages = int.from_bytes(head[28:32], "big")
    if n_pages == 0 or head[24:28] != head[92:96]:
        return None
    if page_size < 512 or page_size & (page_size - 1):
        return None
    return page_size * n_pages


def _uri(p: Path) -> str:
    """The read-only SQLite URI of `p`: no connection made with it can write to the file."""
    return f"file:{quote(str(p))}?mode=ro"


def _connect(p: Path, shown: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(_uri(p), uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise TraceError(shown, _sqlite_problem(exc)) from exc
    return conn


def _sqlite_problem(exc: sqlite3.Error) -> str:
    msg = " ".join(str(exc).split()) or type(exc).__name__
    low = msg.lower()
    if "locked" in low or "busy" in low:
        return f"database is locked by another process ({msg}); try again when it is done"
    if "malformed" in low or "corrupt" in low:
        return f"corrupt or truncated SQLite database ({msg})"
    if "not a database" in low:
        return f"not a readable SQLite database ({msg})"
    if "unable to open" in low:
        return f"cannot open the database ({msg})"
    if "disk i/o" in low or "short read" in low:
        return f"cannot read the database, probably truncated ({msg})"
    return f"SQLite error: {msg}"


# --------------------------------------------------------------------------------------
# Column-wise fetching helpers
# --------------------------------------------------------------------------------------


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic GC while millions of short-lived tuples are built and dropped."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


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


class _Reader:
    def __init__(self, conn: sqlite3.Connection, shown: str, arrow: ArrowSource | None = None):
        self.conn = conn
        self.shown = shown
        self.arrow = arrow  # the fast path; sqlite3 (`conn`) answers whatever it declines
        self.warnings: list[str] = []
        rows = conn.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view')"
        ).fetchall()
        self.tables: set[str] = {r[0] for r in rows}
        self._columns: dict[str, list[str]] = {}
        self._strings: pl.DataFrame | None = None
        self._fetching = ""  # the table being read, for the invalid-UTF-8 notice
        self._invalid_utf8: set[str] = set()  # tables whose text had invalid UTF-8
        self._warned_utf8: set[str] = set()

    # -- schema discovery -------------------------------------------------------------

    def has(self, table: str) -> bool:
        return table in self.tables

    def columns(self, table: str) -> list[str]:
        cols = self._columns.get(table)
        if cols is None:
            cols = [r[1] for r in self.conn.execute(f"PRAGMA table_info({_q(table)})")]
            self._columns[table] = cols
        return cols

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
        where: str | None = None,
    ) -> pl.DataFrame:
        """One query over `table`. `select` maps output name -> column (or candidates);
        a column the table lacks is selected as NULL. Built batch-wise into polars."""
        exprs = []
        for out, src in select.items():
            cands = (src,) if isinstance(src, str) else (src or ())
            col = self.pick(table, *cands)
            exprs.append(f"{_q(col) if col else 'NULL'} AS {_q(out)}")
        sql = f"SELECT {', '.join(exprs)} FROM {_q(table)}"
        if where:
            sql += f" WHERE {where}"
        schema = dict(schema)
        fast = self.arrow.frame(sql, schema) if self.arrow is not None else None
        if fast is not None:
            return fast
        try:
            parts = self._decoding(table, lambda: self._run(sql, schema))
        except (pl.exceptions.PolarsError, TypeError, ValueError, OverflowError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TraceError(self.shown, f"unexpected data in table {table}: {first}") from exc
        if not parts:
            return pl.DataFrame(schema=schema)
        if len(parts) == 1:
            return parts[0]
        return pl.concat(parts, rechunk=True)

    def _decoding(self, table: str, read: Callable[[], _T]) -> _T:
        """`read()` of `table`; when its text is not valid UTF-8 (NVTX strings and names come
        from user code), read again with undecodable bytes replaced rather than give up on
        the trace, and say so once per table."""
        self._fetching = table
        try:
            result = read()
        except sqlite3.OperationalError as exc:
            if "decode" not in str(exc).lower() or self.conn.text_factory is not str:
                raise
            self.conn.text_factory = self._lenient_text
            result = read()
        if table in self._invalid_utf8 and table not in self._warned_utf8:
            self._warned_utf8.add(table)
            self.warnings.append(f"invalid UTF-8 in {table} replaced with U+FFFD")
        return result

    def _lenient_text(self, raw: bytes) -> str:
        """The text factory once invalid UTF-8 was met: bad bytes become U+FFFD, and the
        table being read is noted, so that every table that held some is named once."""
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self._invalid_utf8.add(self._fetching)
            return raw.decode("utf-8", errors="replace")

    def _run(self, sql: str, schema: dict[str, pl.DataType]) -> list[pl.DataFrame]:
        parts: list[pl.DataFrame] = []
        cur = self.conn.execute(sql)
        with _gc_paused():
            while True:
                batch = cur.fetchmany(FETCH_BATCH)
                if not batch:
                    break
                parts.append(pl.DataFrame(batch, schema=schema, orient="row"))
                del batch
        return parts

    def strings(self) -> pl.DataFrame:
        """StringIds as a frame (id, value), read once."""
        if self._strings is None:
            schema = {"id": I64, "value": STR}
            if self.has("StringIds"):
                self._strings = self.fetch("StringIds", {"id": "id", "value": "value"}, schema)
            else:
                self._strings = pl.DataFrame(schema=schema)
        return self._strings

    def resolve(self, df: pl.DataFrame, id_col: str, out: str) -> pl.DataFrame:
        """Add `out` = StringIds.value for the id in `id_col` (left join, order kept)."""
        s = self.strings().rename({"id": id_col, "value": out})
        return df.join(s, on=id_col, how="left", maintain_order="left")

    # -- the whole trace --------------------------------------------------------------

    def read(self) -> Trace:
        has_cupti = any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in self.tables)
        if not self.has("StringIds") and not has_cupti:
            raise TraceError(self.shown, "not an Nsight Systems export (no StringIds table)")
        if not self.has(_KERNEL_TABLE):
            raise TraceError(self.shown, "no CUDA kernels: was the capture made with -t cuda?")
        if not self.has("StringIds"):
            self.warnings.append("no StringIds table: names are unavailable")

        nsys_version, schema_version, source = self.versions()
        kernels = self.kernels()
        memcpys = self.memcpys()
        memsets = self.memsets()
        graph_replays = self.graph_replays()
        frames = {
            "kernels": kernels,
            "api_calls": self.api_calls(),
            "memcpys": memcpys,
            "memsets": memsets,
            "syncs": self.syncs(),
            "nvtx": self.nvtx(),
            "graph_nodes": self.graph_nodes(),
            "graph_replays": graph_replays,
            "devices": self.devices(kernels, memcpys, memsets),
            "profiler_overhead": self.profiler_overhead(),
        }
        for kind, df in frames.items():
            frames[kind] = df.select(list(FRAME_SCHEMAS[kind]))
        meta = TraceMeta(
            nsys_version=nsys_version,
            schema_version=schema_version,
            version_source=source,
            cuda_graph_trace=self.graph_trace_mode(kernels, memcpys, memsets, graph_replays),
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
        sql = f'SELECT "name", "value" FROM {_q(table)}'
        rows = self._decoding(table, lambda: self.conn.execute(sql).fetchall())
        return {str(n): ("" if v is None else str(v)) for n, v in rows}

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

    def graph_trace_mode(
        self,
        kernels: pl.DataFrame,
        memcpys: pl.DataFrame,
        memsets: pl.DataFrame,
        graph_replays: pl.DataFrame,
    ) -> str | None:
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
        if graph_replays.height:
            return "graph"
        if any(df["graph_node_id"].is_not_null().any() for df in (kernels, memcpys, memsets)):
            return "node"
        return None

    # -- GPU activity -----------------------------------------------------------------

    def check_activity_rows(self, df: pl.DataFrame, table: str, what: str) -> None:
        """GPU rows without a valid interval, a device or a process cannot be placed on any
        timeline: nsys never writes them (its schema declares start, end and deviceId NOT
        NULL, and every export sets globalPid), so they mean a damaged or hand-edited file."""
        bad_times = df.filter(
            pl.col("start").is_null() | pl.col("end").is_null() | (pl.col("end") < pl.col("start"))
        ).height
        if bad_times:
            raise TraceError(
                self.shown,
                f"{bad_times} of {df.height} {what} rows have a NULL or inverted start/end "
                f"timestamp ({table})",
            )
        for column, source in (("device", "deviceId"), ("global_pid", "globalPid")):
            if df.height and source not in self.columns(table):
                # every nsys release writes both columns: their absence is a damaged schema
                raise TraceError(self.shown, f"the {table} table has no {source} column; the export is damaged")
            missing = df[column].null_count()
            if missing:
                raise TraceError(
                    self.shown,
                    f"{missing} of {df.height} {what} rows have no {source} ({table}); "
                    "the export is damaged",
                )

    def kernels(self) -> pl.DataFrame:
        t = _KERNEL_TABLE
        raw = self.fetch(
            t,
            {
                "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
                "global_pid": "globalPid", "correlation": "correlationId",
                "demangled_id": "demangledName", "short_id": "shortName",
                "graph_node_id": "graphNodeId", "graph_id": "graphId",
            },
            {
                "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
                "correlation": I64, "demangled_id": I64, "short_id": I64,
                "graph_node_id": I64, "graph_id": I64,
            },
        )
        self.check_activity_rows(raw, t, "kernel")
        if raw.height == 0:
            self.warnings.append("the kernel table is empty")
        df = self.resolve(raw, "demangled_id", "_demangled")
        df = self.resolve(df, "short_id", "short_name")
        df = df.with_columns(
            pl.coalesce("_demangled", "short_name").alias("name"),
            _pid("global_pid").alias("pid"),
        )
        unresolved = df["name"].null_count()
        if unresolved:
            self.warnings.append(f"{unresolved} kernel rows have no name in StringIds")
        return df

    def memcpys(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMCPY"
        if not self.has(t):
            return empty_frame("memcpys")
        df = self.fetch(
            t,
            {
                "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
                "global_pid": "globalPid", "correlation": "correlationId", "bytes": "bytes",
                "_copy": "copyKind", "_src": "srcKind", "_dst": "dstKind",
                "graph_node_id": "graphNodeId",
            },
            {
                "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
                "correlation": I64, "bytes": I64, "_copy": I64, "_src": I64, "_dst": I64,
                "graph_node_id": I64,
            },
        )
        self.check_activity_rows(df, t, "memcpy")
        return df.with_columns(
            _pid("global_pid").alias("pid"),
            _label("_copy", MEMCPY_KINDS).alias("copy_kind"),
            _label("_src", MEM_KINDS).alias("src_kind"),
            _label("_dst", MEM_KINDS).alias("dst_kind"),
        )

    def memsets(self) -> pl.DataFrame:
        t = "CUPTI_ACTIVITY_KIND_MEMSET"
        if not self.has(t):
            return empty_frame("memsets")
        df = self.fetch(
            t,
            {
                "start": "start", "end": "end", "device": "deviceId", "stream": "streamId",
                "global_pid": "globalPid", "correlation": "correlationId", "bytes": "bytes",
                "_mem": "memKind", "graph_node_id": "graphNodeId",
            },
            {
                "start": I64, "end": I64, "device": I64, "stream": I64, "global_pid": I64,
                "correlation": I64, "bytes": I64, "_mem": I64, "graph_node_id": I64,
            },
        )
        self.check_activity_rows(df, t, "memset")
        return df.with_columns(
            _pid("global_pid").alias("pid"), _label("_mem", MEM_KINDS).alias("mem_kind")
        )

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
        where = '"eventClass" IN (0, 1)' if "eventClass" in self.columns(t) else None
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
            where=where,
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
        df = df.join(names, on="_name_id", how="left", maintain_order="left")
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
            where='"eventType" IN (59, 60, 75)',
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

    def devices(
        self, kernels: pl.DataFrame, memcpys: pl.DataFrame, memsets: pl.DataFrame
    ) -> pl.DataFrame:
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
        used = pl.concat(
            [f.select("device") for f in (kernels, memcpys, memsets)]
        ).drop_nulls().unique()
        missing = used.join(df.select("device"), on="device", how="anti")
        if missing.height:
            df = pl.concat([df, missing], how="diagonal")
        cc = pl.when(pl.col("_major").is_not_null() & pl.col("_minor").is_not_null()).then(
            pl.format("{}.{}", pl.col("_major"), pl.col("_minor"))
        )
        return df.with_columns(
            cc.otherwise(pl.lit(None, dtype=STR)).alias("compute_capability")
        ).sort("device")
