"""Read an Nsight Systems SQLite export (nsys 2021.x - 2026.x) into a `Trace`.

The file is opened read-only (SQLite URI ``mode=ro``); its bytes never change. Every table
is read once, with one query that names only the columns we need; a column that an older
schema lacks is selected as NULL, a table that a lazy export left out becomes an empty
frame. Which tables and columns, and how they become the Trace (names resolved by a join,
labels, process ids, API kinds), is `export_tables.py`, shared with the Parquet/Arrow reader;
this module is the SQLite side: file checks, the read-only connection, the queries.

Anything wrong with the input is raised as `TraceError(path, problem)`, never as a raw
sqlite3 or polars exception.
"""

from __future__ import annotations

import gc
import os
import shutil
import sqlite3
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar
from urllib.parse import quote

import polars as pl

from nsys_ledger.errors import TraceError
from nsys_ledger.trace.arrow_fetch import ArrowSource
from nsys_ledger.trace.export_tables import ExportReader, RowFilter, contiguous
from nsys_ledger.trace.model import Trace

__all__ = ["export_reader", "load_sqlite", "load_sqlite_streamed", "read_only_export", "SQLITE_MAGIC",
           "sniff_format", "sqlite_kernel_rows"]

_T = TypeVar("_T")

SQLITE_MAGIC = b"SQLite format 3\x00"

# Seconds SQLite waits on a lock held by another process before giving up.
BUSY_TIMEOUT_S = 1.0
# Rows fetched per round trip; small batches keep the peak of Python objects low.
FETCH_BATCH = 65_536

# --------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------


def load_sqlite(path: str | os.PathLike[str]) -> Trace:
    """Read the Nsight Systems SQLite export at `path`. Raises TraceError on bad input."""
    with _opened(path) as (conn, uri, shown):
        arrow = ArrowSource(uri)
        try:
            return ExportReader(_SqliteTables(conn, shown, arrow), shown).read()
        finally:
            arrow.close()


def load_sqlite_streamed(path: str | os.PathLike[str], rows: int,
                         consume: Callable[[Trace, str, pl.DataFrame], None]) -> Trace:
    """`load_sqlite`, but the kernel, copy and memset rows go to `consume` a chunk of at most
    `rows` at a time instead of into the Trace (ExportReader.read_streamed)."""
    with _opened(path) as (conn, uri, shown):
        arrow = ArrowSource(uri)
        try:
            return ExportReader(_SqliteTables(conn, shown, arrow), shown).read_streamed(rows, consume)
        finally:
            arrow.close()


def sqlite_kernel_rows(path: str | os.PathLike[str]) -> int | None:
    """About how many kernels the SQLite export at `path` holds (its kernel table's largest
    rowid: a look at the end of its B-tree, not a count), or None when `path` is no readable
    SQLite export with a kernel table (reading it whole then says what is wrong)."""
    try:
        if not Path(path).is_file():
            return None
        with open(path, "rb") as fh:
            if fh.read(len(SQLITE_MAGIC)) != SQLITE_MAGIC:
                return None
        with _opened(path) as (conn, _uri, _shown):
            (largest,) = conn.execute('SELECT max(rowid) FROM "CUPTI_ACTIVITY_KIND_KERNEL"').fetchone()
    except (OSError, TraceError, sqlite3.Error, TypeError, ValueError):
        return None
    return int(largest) if largest is not None else 0


@contextmanager
def read_only_export(path: str | os.PathLike[str]) -> Iterator[sqlite3.Connection]:
    """The export at `path`, checked like `load_sqlite` checks it, as a read-only connection
    (closed on leaving); an SQLite error met inside becomes TraceError(path, problem)."""
    with _opened(path) as (conn, _uri, _shown):
        yield conn


@contextmanager
def _opened(path: str | os.PathLike[str]) -> Iterator[tuple[sqlite3.Connection, str, str]]:
    """The file checks, then a read-only connection (mode=ro, and nothing beside a WAL-mode
    file): `(connection, its URI, the path as errors show it)`; an SQLite error met inside
    becomes TraceError(path, problem)."""
    shown = str(path)
    p = Path(path)
    head = _check_file(p, shown)
    with _read_only_uri(p, head, shown) as uri:
        conn = _connect(uri, shown)
        try:
            yield conn, uri, shown
        except sqlite3.Error as exc:
            raise TraceError(shown, _sqlite_problem(exc)) from exc
        except UnicodeDecodeError as exc:
            # SQLite's own error message quoted damaged schema bytes that Python cannot decode
            raise TraceError(shown, "corrupt SQLite database (damaged schema: text that is not UTF-8)") from exc
        finally:
            conn.close()


def export_reader(conn: sqlite3.Connection, shown: str) -> ExportReader:
    """The reader's view of an open export (its tables, versions, graph trace mode) for
    questions short of reading the whole Trace."""
    return ExportReader(_SqliteTables(conn, shown), shown)


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


def _check_file(p: Path, shown: str) -> bytes:
    """Refuse what is not a whole SQLite file before SQLite sees it; the first 512 bytes."""
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
    return head


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


def _uri(p: Path, *, immutable: bool = False) -> str:
    """The read-only SQLite URI of `p`: no connection made with it can write to the file.

    `immutable`: SQLite takes no locks and opens no -wal/-shm file beside it."""
    return f"file:{quote(str(p))}?mode=ro" + ("&immutable=1" if immutable else "")


def _may_use_wal(head: bytes) -> bool:
    """Whether SQLite may open a WAL for this file: its header's write and read versions
    (bytes 18 and 19) are not both 1, the rollback-journal format nsys writes. A 2 in either
    (WAL mode, or a damaged header that says so) makes a `mode=ro` connection create -shm and
    -wal files beside the database (found by the fuzzer: write version 1, read version 2)."""
    return len(head) < 20 or head[18] != 1 or head[19] != 1


@contextmanager
def _read_only_uri(p: Path, head: bytes, shown: str) -> Iterator[str]:
    """A URI that reads `p` without changing anything beside it.

    A rollback-journal export (what nsys writes) is opened `mode=ro`. A WAL-mode file (an
    export that went through a tool or a copy in WAL mode, or a damaged header) would make even a read-only
    connection create or rewrite `-shm` (and `-wal`) files beside it: without a `-wal` file it
    is opened `immutable=1` (no side files, no locks); with one, whose committed pages belong
    to the database, the file and its WAL are copied into a private temporary directory and
    the copy is read."""
    if not _may_use_wal(head):
        yield _uri(p)
        return
    wal = Path(f"{p}-wal")
    if not (wal.is_file() and wal.stat().st_size > 0):
        yield _uri(p, immutable=True)
        return
    with tempfile.TemporaryDirectory(prefix="nsys-ledger-wal-") as private:
        copy = Path(private) / "export.sqlite"
        try:
            shutil.copyfile(p, copy)
            shutil.copyfile(wal, Path(f"{copy}-wal"))
        except OSError as exc:
            raise TraceError(shown, f"cannot copy the WAL-mode database to read it ({exc.strerror or exc})") from None
        yield _uri(copy)


def _connect(uri: str, shown: str) -> sqlite3.Connection:
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
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


def _select_list(columns: Mapping[str, str | None]) -> str:
    """`col AS out, ...`; NULL for a column the table lacks."""
    return ", ".join(f"{_q(col) if col else 'NULL'} AS {_q(out)}" for out, col in columns.items())



class _SqliteTables:
    """The SQLite export as a TableSource: one SELECT per table naming only the needed
    columns, through the ADBC fast path when it can vouch for the result, else sqlite3."""

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
        self._fetching = ""  # the table being read, for the invalid-UTF-8 notice
        self._invalid_utf8: set[str] = set()  # tables whose text had invalid UTF-8
        self._warned_utf8: set[str] = set()

    def columns(self, table: str) -> list[str]:
        cols = self._columns.get(table)
        if cols is None:
            cols = [r[1] for r in self.conn.execute(f"PRAGMA table_info({_q(table)})")]
            self._columns[table] = cols
        return cols

    def missing_table_hint(self, table: str) -> str:
        return ""

    def fetch(
        self,
        table: str,
        columns: Mapping[str, str | None],
        schema: Mapping[str, pl.DataType],
        keep: RowFilter | None = None,
    ) -> pl.DataFrame:
        """One query over `table`, built batch-wise into polars."""
        sql = f"SELECT {_select_list(columns)} FROM {_q(table)}"
        if keep is not None:
            sql += f" WHERE {_q(keep.column)} IN ({', '.join(str(int(v)) for v in keep.values)})"
        return self._frame(table, sql, dict(schema))

    def fetch_chunks(
        self,
        table: str,
        columns: Mapping[str, str | None],
        schema: Mapping[str, pl.DataType],
        rows: int,
    ) -> Iterator[pl.DataFrame]:
        """`fetch` of the whole `table`, a frame of at most `rows` rows at a time, in the order a
        whole read gives them (rowid order): each chunk is the next `rows` rowids after the last
        one read, a seek in the table's B-tree (an export has no other index to range on)."""
        paged = {**schema, "_rowid": pl.Int64}
        after: int | None = None
        while True:
            where = "" if after is None else f" WHERE rowid > {after}"
            sql = (f"SELECT {_select_list(columns)}, rowid AS _rowid FROM {_q(table)}{where} "
                   f"ORDER BY rowid LIMIT {int(rows)}")
            chunk = self._frame(table, sql, paged)
            if chunk.height:
                after = int(chunk["_rowid"][-1])
                yield chunk.drop("_rowid")
            if chunk.height < rows:
                return

    def _frame(self, table: str, sql: str, schema: dict[str, pl.DataType]) -> pl.DataFrame:
        """The result of `sql` (over `table`) as a frame of `schema`: through the fast path
        when it vouches for it, else sqlite3, whose data errors name the table."""
        fast = self.arrow.frame(sql, schema) if self.arrow is not None else None
        if fast is not None:
            return contiguous(fast)
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

    def name_value(self, table: str) -> dict[str, str]:
        sql = f'SELECT "name", "value" FROM {_q(table)}'
        rows = self._decoding(table, lambda: self.conn.execute(sql).fetchall())
        return {str(n): ("" if v is None else str(v)) for n, v in rows}

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

