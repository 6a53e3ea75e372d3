"""The fast path of the SQLite reader: a query straight into Arrow with the ADBC SQLite driver.

Measured on a 1,000,000-kernel export (2 cores, docs/performance.md): the kernel columns take
about 1.3 s through ADBC and 3.1 s through the standard `sqlite3` module (most of that is
building one Python tuple per row). The driver is optional (`pip install nsys-ledger[fast]`);
without it, or whenever it cannot give exactly what the reader asked for, the reader falls
back to `sqlite3`, which stays the reference for every edge case (type errors, invalid UTF-8,
locks). So this module never raises on bad data: it answers "here is the frame" or "no".

The file is opened through an SQLite URI with ``mode=ro``, so the driver cannot write to it.
(connectorx, faster still at ~0.7 s, was rejected: it opens SQLite read-write with
SQLITE_OPEN_CREATE and passes the path on verbatim, so ``?mode=ro`` cannot be given; tried, it
creates an empty file named ``...sqlite?mode=ro`` instead.)

``NSYS_LEDGER_READER=sqlite3`` turns the fast path off (for comparisons and tests).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import polars as pl
import pyarrow as pa

# The driver infers each column's type from the first batch of rows; a big first batch makes
# a column that starts with NULLs less likely to be typed wrong (then we fall back anyway).
BATCH_ROWS = 1 << 20
READER_ENV = "NSYS_LEDGER_READER"

try:  # optional dependency: the `fast` extra
    import adbc_driver_sqlite.dbapi as _adbc
except ImportError:  # pragma: no cover - depends on the installation
    _adbc = None


def fast_reader_available() -> bool:
    """True when the ADBC driver is installed and not switched off by NSYS_LEDGER_READER."""
    return _adbc is not None and os.environ.get(READER_ENV, "").lower() != "sqlite3"


def reader_name() -> str:
    """The reader `load_trace` will use first: "adbc" or "sqlite3"."""
    return "adbc" if fast_reader_available() else "sqlite3"


class ArrowSource:
    """A read-only ADBC connection to one SQLite file, opened on first use."""

    def __init__(self, uri: str):
        self.uri = uri  # an SQLite URI with mode=ro
        self._conn: Any = None
        self._broken = not fast_reader_available()

    def frame(self, sql: str, schema: Mapping[str, pl.DataType]) -> pl.DataFrame | None:
        """The result of `sql` with exactly `schema`'s columns and types, or None when the
        fast path cannot vouch for it (the caller then reads with sqlite3)."""
        if self._broken:
            return None
        try:
            if self._conn is None:
                self._conn = _adbc.connect(self.uri)
            cursor = self._conn.cursor()
            try:
                cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(BATCH_ROWS)})
                cursor.execute(sql)
                table = cursor.fetch_arrow_table()
            finally:
                cursor.close()
        except Exception:  # locked, corrupt, a type that changed after the first batch, ...
            return None
        return _conform(table, schema)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
            self._conn = None


def _conform(table: pa.Table, schema: Mapping[str, pl.DataType]) -> pl.DataFrame | None:
    """`table` as a polars frame of `schema`, or None unless every column already has the
    declared type (or holds only NULLs): the driver silently turns a column that mixes
    integers and text into text, which sqlite3 would reject."""
    if table.column_names != list(schema):
        return None
    expected = {pl.Int64: (pa.int64(),), pl.Utf8: (pa.string(), pa.large_string())}
    for name, dtype in schema.items():
        column = table.column(name)
        if column.type not in expected.get(dtype, ()) and column.null_count != len(column):
            return None
    try:
        # Arrow strings must be UTF-8 and the driver does not check; an invalid one would
        # crash polars later. sqlite3 replaces such bytes and says so.
        table.validate(full=True)
    except (pa.ArrowInvalid, ValueError):
        return None
    frame = pl.from_arrow(table, rechunk=False)
    assert isinstance(frame, pl.DataFrame)
    return frame.cast(dict(schema)) if frame.schema != pl.Schema(schema) else frame
