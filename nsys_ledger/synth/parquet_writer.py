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
    conn = sqlite3.connect(f"file:{quote(str(sqlite_path))}?mode=ro", uri=True)
    written = []
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
        for table in tables:
            target = out / f"{table}{COLUMNAR_FORMATS[fmt]}"
            _write_table(conn, table, target, fmt)
            written.append(target)
    finally:
        conn.close()
    return written


def _write_table(conn: sqlite3.Connection, table: str, target: Path, fmt: str) -> None:
    declared = [(r[1], (r[2] or "").upper()) for r in conn.execute(f"PRAGMA table_info({_q(table)})")]
    batches = list(_batches(conn, table, declared))
    # One schema for the whole file: a column that needed text (or bytes) in any batch gets
    # it in all of them.
    schema = _unify([b.schema for b in batches]) if batches else pa.schema(
        [(name, _DECLARED.get(kind, pa.string())) for name, kind in declared])
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
