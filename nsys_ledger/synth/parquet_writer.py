"""An SQLite export rewritten as an `nsys export --type parquetdir` / `arrowdir` directory.

nsys writes one file per table, named after the table (`StringIds.parquet`,
`CUPTI_ACTIVITY_KIND_KERNEL.parquet`, ... or `.arrow`), with the same columns as the SQLite
export. The synthetic generator writes SQLite; this converter gives the same trace in the
columnar layouts, so that every sample (and any real SQLite export) can be checked through
both readers. Every table is copied, not only those the checker reads, as nsys does.

Column types follow the declared SQLite types (INTEGER -> int64, REAL -> float64, TEXT ->
string, BLOB -> binary). A column whose values do not fit its declared type (SQLite allows
text in an INTEGER column) is written as text, which the reader then rejects or converts
exactly as it would have the SQLite column. Text that is not valid UTF-8 is written as
binary, so that the bytes reach the reader unchanged.

Tables are read through the ADBC SQLite driver straight into Arrow when it is installed
(1M-kernel traces convert in seconds); a table it cannot vouch for (a value that does not fit
the declared type, invalid UTF-8) is read again row by row through `sqlite3`, which handles
those cases as described above.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from nsys_ledger.trace import arrow_fetch

__all__ = ["COLUMNAR_FORMATS", "write_columnar"]

# CLI format name -> file suffix
COLUMNAR_FORMATS: dict[str, str] = {"parquetdir": ".parquet", "arrowdir": ".arrow"}
# Rows converted per record batch: bounds the Python objects alive at once.
BATCH_ROWS = 65_536

_DECLARED: dict[str, pa.DataType] = {
    "INTEGER": pa.int64(), "INT": pa.int64(), "REAL": pa.float64(), "TEXT": pa.string(),
    "BLOB": pa.binary(),
}


def write_columnar(sqlite_path: str | os.PathLike[str], out_dir: str | os.PathLike[str], fmt: str) -> list[Path]:
    """Write every table of the SQLite export at `sqlite_path` as one file in `out_dir`
    (created; must be empty if it exists) in `fmt` ("parquetdir" or "arrowdir").
    Returns the files written."""
    if fmt not in COLUMNAR_FORMATS:
        raise ValueError(f"unknown columnar format {fmt!r}; known: {', '.join(COLUMNAR_FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty")
    uri = f"file:{quote(str(sqlite_path))}?mode=ro"
    conn = sqlite3.connect(uri, uri=True)
    fast = _fast_connection(uri)
    written = []
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        for table in tables:
            target = out / f"{table}{COLUMNAR_FORMATS[fmt]}"
            _write_table(conn, fast, table, target, fmt)
            written.append(target)
    finally:
        conn.close()
        if fast is not None:
            fast.close()
    return written


def _write_table(conn: sqlite3.Connection, fast, table: str, target: Path, fmt: str) -> None:
    declared = [(r[1], (r[2] or "").upper()) for r in conn.execute(f"PRAGMA table_info({_q(table)})")]
    declared_schema = pa.schema([(name, _DECLARED.get(kind, pa.string())) for name, kind in declared])
    fast_table = _fast_table(fast, table, declared_schema)
    if fast_table is not None:
        schema, batches = declared_schema, fast_table.to_batches()
    else:
        batches = list(_batches(conn, table, declared))
        # One schema for the whole file: a column that needed text (or bytes) in any batch
        # gets it in all of them.
        schema = _unify([b.schema for b in batches]) if batches else declared_schema
        batches = [b.cast(schema) for b in batches]
    if fmt == "parquetdir":
        with pq.ParquetWriter(target, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)
            if not batches:
                writer.write_table(schema.empty_table())
    else:
        with pa.OSFile(str(target), "wb") as sink, ipc.new_file(sink, schema) as writer:
            for batch in batches:
                writer.write_batch(batch)


def _fast_connection(uri: str):
    """A read-only ADBC connection, or None when the driver is not installed or switched off."""
    if not arrow_fetch.fast_reader_available():
        return None
    try:
        return arrow_fetch._adbc.connect(uri)
    except Exception:  # any driver failure: the sqlite3 path converts everything
        return None


def _fast_table(fast, table: str, schema: pa.Schema) -> pa.Table | None:
    """`table` through ADBC in the declared types, or None when the driver cannot give exactly
    that: it types a column by its first rows and fails on a later value of another type,
    and it does not check UTF-8."""
    if fast is None:
        return None
    cursor = fast.cursor()
    try:
        cursor.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(arrow_fetch.BATCH_ROWS)})
        cursor.execute(f"SELECT {', '.join(_q(n) for n in schema.names)} FROM {_q(table)}")
        fetched = cursor.fetch_arrow_table()
        fetched.validate(full=True)
        return fetched.cast(schema)
    except Exception:
        return None
    finally:
        cursor.close()


def _batches(conn: sqlite3.Connection, table: str, declared: list[tuple[str, str]]) -> Iterator[pa.RecordBatch]:
    names = [name for name, _ in declared]
    conn.text_factory = bytes  # decoded per column, so that invalid UTF-8 survives as bytes
    try:
        cursor = conn.execute(f"SELECT {', '.join(_q(n) for n in names)} FROM {_q(table)}")
        while rows := cursor.fetchmany(BATCH_ROWS):
            columns = list(zip(*rows))
            yield pa.record_batch(
                [_column(values, kind) for values, (_, kind) in zip(columns, declared)], names=names)
    finally:
        conn.text_factory = str


def _column(values: tuple, kind: str) -> pa.Array:
    """One column of one batch in its declared type, else as text, else as bytes."""
    wanted = _DECLARED.get(kind, pa.string())
    if wanted in (pa.int64(), pa.float64()):
        try:
            return pa.array(values, type=wanted)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            pass
    if wanted == pa.binary():
        return pa.array([None if v is None else bytes(v) if isinstance(v, bytes) else str(v).encode()
                         for v in values], type=pa.binary())
    try:
        return pa.array([None if v is None else v.decode("utf-8") if isinstance(v, bytes) else str(v)
                         for v in values], type=pa.string())
    except UnicodeDecodeError:
        return pa.array([None if v is None else v if isinstance(v, bytes) else str(v).encode()
                         for v in values], type=pa.binary())


def _unify(schemas: list[pa.Schema]) -> pa.Schema:
    """Per column the widest type any batch needed: bytes > text > float > integer."""
    rank = {pa.int64(): 0, pa.float64(): 1, pa.string(): 2, pa.binary(): 3}
    fields = []
    for i, field in enumerate(schemas[0]):
        types = [s.field(i).type for s in schemas]
        fields.append(pa.field(field.name, max(types, key=lambda t: rank.get(t, 2))))
    return pa.schema(fields)


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'
