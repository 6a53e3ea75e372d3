"""Read an `nsys export --type parquetdir` or `--type arrowdir` directory into a `Trace`.

nsys (2024.6 and later) writes one file per table, named after the table
(`CUPTI_ACTIVITY_KIND_KERNEL.parquet`, `StringIds.parquet`, ... or `.arrow`), with the same
columns as the SQLite export. So the tables, the columns and how they become a Trace are the
SQLite reader's (`export_tables.py`); this module only answers "these columns of this table":
each table is scanned lazily and only the columns the Trace needs are read (a file's other
columns, such as NVTX_EVENTS.binaryData, which some nsys releases write as a large string,
are never decoded). Arrow files may be in the IPC file format (memory-mapped, scanned
lazily) or the IPC stream format (read column-projected).

The files are only ever opened for reading. Anything wrong is a `TraceError(path, problem)`
that names the table file.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Mapping
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from nsys_ledger.errors import TraceError
from nsys_ledger.safety import file_kind
from nsys_ledger.trace.export_tables import ExportReader, RowFilter, contiguous
from nsys_ledger.trace.model import Trace

__all__ = ["TABLE_SUFFIXES", "is_table_directory", "load_columnar"]

# Table file suffix -> format. When a table has both, the Parquet file is read.
TABLE_SUFFIXES: dict[str, str] = {".parquet": "parquet", ".arrow": "arrow"}
_ARROW_FILE_MAGIC = b"ARROW1"
_STRING = pl.Utf8


def table_files(directory: str | os.PathLike[str]) -> dict[str, Path]:
    """Table name -> file for the table files directly in `directory` (Parquet first)."""
    found: dict[str, Path] = {}
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return found
    for preferred in TABLE_SUFFIXES:
        for entry in entries:
            stem, suffix = os.path.splitext(entry.name)
            if suffix.lower() == preferred and stem and stem not in found and not _is_directory(entry):
                found[stem] = Path(entry.path)  # not a regular file: load_columnar says so
    return found


def _is_directory(entry: os.DirEntry) -> bool:
    try:
        return entry.is_dir()
    except OSError:  # a symlink loop: a table file that cannot be read
        return False


def _check_table_files(files: dict[str, Path], shown: str) -> None:
    """Every table file is a regular file (symlinks followed): a FIFO, a device or a symlink
    loop named like a table is refused by name before any reader opens it."""
    for file in files.values():
        try:
            mode = file.stat().st_mode
        except OSError as exc:
            problem = "a symlink loop" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror or exc})"
            raise TraceError(shown, f"table file {file.name} is {problem}") from None
        if not stat.S_ISREG(mode):
            raise TraceError(shown, f"table file {file.name} is {file_kind(mode)}, not a regular file")


def is_table_directory(path: str | os.PathLike[str]) -> bool:
    """True for a directory holding export table files (*.parquet, *.arrow)."""
    return os.path.isdir(path) and bool(table_files(path))


def load_columnar(path: str | os.PathLike[str]) -> Trace:
    """Read the parquetdir / arrowdir export at `path`. Raises TraceError on bad input."""
    shown = str(path)
    if not os.path.isdir(path):
        raise TraceError(shown, "no such directory")
    files = table_files(path)
    if not files:
        raise TraceError(shown, "is a directory without export tables (*.parquet, *.arrow)")
    _check_table_files(files, shown)
    return ExportReader(_ColumnarTables(files, shown), shown).read()


def _is_binary(dtype: pa.DataType) -> bool:
    return pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype)


class _ColumnarTables:
    """A parquetdir / arrowdir export as a TableSource."""

    def __init__(self, files: dict[str, Path], shown: str):
        self.files = files
        self.shown = shown
        self.tables: set[str] = set(files)
        self.warnings: list[str] = []
        self._schemas: dict[str, pa.Schema] = {}
        self._stream_format: dict[str, bool] = {}

    # -- schema -----------------------------------------------------------------------

    def columns(self, table: str) -> list[str]:
        return list(self._schema(table).names)

    def missing_table_hint(self, table: str) -> str:
        return f" (the directory has no {table}.parquet or {table}.arrow)"

    def _schema(self, table: str) -> pa.Schema:
        schema = self._schemas.get(table)
        if schema is None:
            file = self.files[table]
            try:
                if file.suffix.lower() == ".parquet":
                    schema = pq.read_schema(file)
                else:
                    schema = self._arrow_schema(table, file)
            except (OSError, pa.ArrowException, ValueError) as exc:
                raise self._unreadable(file, exc) from exc
            self._schemas[table] = schema
        return schema

    def _arrow_schema(self, table: str, file: Path) -> pa.Schema:
        with open(file, "rb") as fh:
            stream = fh.read(len(_ARROW_FILE_MAGIC)) != _ARROW_FILE_MAGIC
        self._stream_format[table] = stream
        if stream:
            with pa.OSFile(str(file), "rb") as fh:
                return ipc.open_stream(fh).schema
        with pa.memory_map(str(file), "r") as fh:
            return ipc.open_file(fh).schema

    def _unreadable(self, file: Path, exc: BaseException) -> TraceError:
        kind = TABLE_SUFFIXES.get(file.suffix.lower(), "table")
        text = " ".join(str(exc).split()) or type(exc).__name__
        return TraceError(self.shown, f"corrupt or unreadable {kind} file {file.name} ({text[:200]})")

    # -- reading ----------------------------------------------------------------------

    def _scan(self, table: str, needed: list[str]) -> pl.LazyFrame:
        file = self.files[table]
        if file.suffix.lower() == ".parquet":
            return pl.scan_parquet(file)
        self._schema(table)
        if self._stream_format[table]:
            # A stream has no footer to find a column by: read it batch by batch and keep only
            # the needed columns of each, so the other columns never pile up in memory.
            with pa.OSFile(str(file), "rb") as fh:
                reader = ipc.open_stream(fh)
                schema = pa.schema([reader.schema.field(name) for name in needed])
                arrow = pa.Table.from_batches([batch.select(needed) for batch in reader], schema=schema)
            frame = pl.from_arrow(arrow, rechunk=False)
            assert isinstance(frame, pl.DataFrame)
            return frame.lazy()
        return pl.scan_ipc(file)

    def fetch(
        self,
        table: str,
        columns: Mapping[str, str | None],
        schema: Mapping[str, pl.DataType],
        keep: RowFilter | None = None,
    ) -> pl.DataFrame:
        file_schema = self._schema(table)
        needed = sorted({c for c in columns.values() if c} | ({keep.column} if keep else set()))
        binary_text = {
            out for out, col in columns.items()
            if col and schema[out] == _STRING and _is_binary(file_schema.field(col).type)
        }
        exprs = []
        for out, col in columns.items():
            if col is None:
                exprs.append(pl.lit(None, dtype=schema[out]).alias(out))
            elif out in binary_text:  # decoded below, with invalid UTF-8 replaced
                exprs.append(pl.col(col).alias(out))
            else:
                exprs.append(pl.col(col).cast(schema[out], strict=True).alias(out))
        try:
            lazy = self._scan(table, needed)
            if keep is not None:
                lazy = lazy.filter(pl.col(keep.column).is_in(list(keep.values)))
            frame = contiguous(lazy.select(exprs).collect())
        except (pl.exceptions.InvalidOperationError, pl.exceptions.SchemaError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TraceError(self.shown, f"unexpected data in table {table}: {first[:200]}") from exc
        except (pl.exceptions.PolarsError, OSError, pa.ArrowException, ValueError) as exc:
            raise self._unreadable(self.files[table], exc) from exc
        if binary_text:
            frame = frame.with_columns(self._text(frame[out], table) for out in sorted(binary_text))
        return frame

    def _text(self, column: pl.Series, table: str) -> pl.Series:
        """A binary column as text: valid UTF-8 as it is; otherwise the bad bytes become
        U+FFFD (as the SQLite reader does) and the table is named once in the warnings."""
        try:
            return column.cast(_STRING, strict=True)
        except pl.exceptions.PolarsError:
            pass
        warning = f"invalid UTF-8 in {table} replaced with U+FFFD"
        if warning not in self.warnings:
            self.warnings.append(warning)
        values = [None if v is None else v.decode("utf-8", errors="replace") for v in column.to_list()]
        return pl.Series(column.name, values, dtype=_STRING)

    def name_value(self, table: str) -> dict[str, str]:
        frame = self.fetch(table, {"name": "name", "value": "value"}, {"name": _STRING, "value": _STRING})
        return {str(n): ("" if v is None else v) for n, v in frame.iter_rows()}
