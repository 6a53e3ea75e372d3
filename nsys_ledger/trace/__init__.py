"""Trace import: turn an Nsight Systems export into a `Trace`.

`load_trace(path)` accepts an SQLite export (any file with the SQLite header, whatever its
suffix), an `nsys export --type parquetdir` / `arrowdir` directory (one `<TABLE>.parquet` or
`<TABLE>.arrow` file per table), or an `.nsys-rep` report, which it exports with `nsys export`
when `nsys` is on PATH (Parquet, kept in a cache beside the report; see `report_export.py`).
"""

from __future__ import annotations

import os
from pathlib import Path

from nsys_ledger.errors import TraceError
from nsys_ledger.safety import read_head
from nsys_ledger.trace.columnar_reader import is_table_directory, load_columnar
from nsys_ledger.trace.kineto_reader import is_kineto_file, load_kineto
from nsys_ledger.trace.model import Trace, TraceMeta
from nsys_ledger.trace.report_export import load_report
from nsys_ledger.trace.sqlite_reader import SQLITE_MAGIC, load_sqlite

__all__ = ["load_trace", "load_sqlite", "load_columnar", "Trace", "TraceMeta"]

_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def load_trace(path: str | os.PathLike[str], *, cache: bool = True) -> Trace:
    """Read a trace file into a Trace. Raises TraceError (``<path>: <problem>``).

    The format is told by content (an SQLite export named *.json is read as SQLite); a path
    that is neither a directory nor a regular file (a FIFO, a device) is refused before any
    read, so nothing blocks on it. `cache=False`: export an `.nsys-rep` into a temporary
    directory, not the cache beside it."""
    p = Path(path)
    if os.path.isdir(p):
        return load_columnar(path) if is_table_directory(p) else load_sqlite(path)
    head = read_head(p, str(path), len(SQLITE_MAGIC), TraceError)  # refuses a FIFO, a device, a loop
    if head == SQLITE_MAGIC:
        return load_sqlite(path)
    if p.name.lower().endswith(_REPORT_SUFFIXES) and head:
        return load_report(p, str(path), cache=cache)
    if is_kineto_file(p):
        return load_kineto(path)
    return load_sqlite(path)
