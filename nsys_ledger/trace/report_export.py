"""An `.nsys-rep` report, exported once by `nsys export` and kept beside it.

With `nsys` on PATH, a report is exported with `--type parquetdir --tables <the tables the
reader uses>` (nsys 2024.6 and later): only those tables, one Parquet file each, which the
columnar reader scans lazily. An nsys that refuses the table list is asked for all tables;
one that cannot write parquetdir fails or writes something else, and the report is then
exported as SQLite, as before.

The export is kept in a cache directory beside the report (`decode.nsys-rep` ->
`decode.nsys-rep.nsys-ledger-cache/`), with a stamp of the report's size and modification
time and of the tables asked for; it is reused while the stamp matches, so a report is
exported once however often it is checked, and again when it is replaced. The report itself
is only read (by nsys). `cache=False` (the CLI's `--no-cache`), or a directory we cannot
write to, exports into a temporary directory that is removed after reading.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from nsys_ledger.errors import TraceError
from nsys_ledger.trace.columnar_reader import is_table_directory, load_columnar
from nsys_ledger.trace.export_tables import TRACE_TABLES
from nsys_ledger.trace.model import Trace
from nsys_ledger.trace.sqlite_reader import load_sqlite

__all__ = ["CACHE_SUFFIX", "cache_dir_for", "load_report"]

CACHE_SUFFIX = ".nsys-ledger-cache"
_STAMP = "stamp.json"
_PARQUET = "parquet"
_SQLITE = "export.sqlite"
# Bumped when the cache layout or the set of tables changes meaning.
_CACHE_VERSION = 1


def cache_dir_for(report: Path) -> Path:
    return report.with_name(report.name + CACHE_SUFFIX)


def load_report(report: Path, shown: str, *, cache: bool = True) -> Trace:
    """The Trace of `report`, exported by nsys (or taken from a valid cache)."""
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceError(
            shown,
            "this is an .nsys-rep report; convert it with `nsys export --type sqlite FILE` "
            "(nsys is not on PATH)",
        )
    stamp = _stamp(report)
    cached = cache_dir_for(report)
    if cache and _stamp_matches(cached, stamp):
        return _load_export(cached, shown)
    if cache and os.access(report.parent, os.W_OK):
        return _export_into_cache(nsys, report, shown, cached, stamp)
    with tempfile.TemporaryDirectory(prefix="nsys-ledger-") as tmp:
        _export(nsys, report, shown, Path(tmp))
        return _load_export(Path(tmp), shown)


def _export_into_cache(nsys: str, report: Path, shown: str, cached: Path, stamp: dict) -> Trace:
    # Built under a temporary name beside the report and renamed into place, so a reader (or a
    # second check running at the same time) never sees half an export.
    # The export is read (validated) before it is stamped and kept: an export that nsys broke
    # (a crash, a full disk) is never cached, so the next check exports again.
    building = Path(tempfile.mkdtemp(prefix=f".{report.name}.", dir=report.parent))
    try:
        _export(nsys, report, shown, building)
        trace = _load_export(building, shown)
        (building / _STAMP).write_text(json.dumps(stamp))
        if cached.exists():
            shutil.rmtree(cached, ignore_errors=True)
        try:
            building.rename(cached)
        except OSError:  # another check put its export there first: ours is dropped
            pass
        return trace
    finally:
        if building.exists():
            shutil.rmtree(building, ignore_errors=True)


def _export(nsys: str, report: Path, shown: str, into: Path) -> None:
    """Export `report` into the directory `into`: Parquet tables if this nsys can (only the
    tables we read; all of them if it refuses the table list), else SQLite."""
    parquet = into / _PARQUET
    for tables in (["--tables", ",".join(TRACE_TABLES)], []):
        proc = _run(shown, [nsys, "export", "--type", "parquetdir", *tables, "--output", str(parquet), str(report)])
        if proc.returncode == 0 and is_table_directory(parquet):
            return
        _remove(parquet)
    sqlite = into / _SQLITE
    proc = _run(shown, [nsys, "export", "--type", "sqlite", "--output", str(sqlite), str(report)])
    if proc.returncode != 0 or not sqlite.is_file():
        detail = (proc.stderr or proc.stdout or "").strip().splitlines()
        last = detail[-1] if detail else "no output"
        raise TraceError(shown, f"nsys export failed (exit {proc.returncode}): {last}")


def _run(shown: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise TraceError(shown, f"cannot run nsys export ({exc})") from exc


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def _load_export(directory: Path, shown: str) -> Trace:
    parquet = directory / _PARQUET
    load: Callable[[Path], Trace]
    target, load, what = (
        (parquet, load_columnar, "Parquet") if is_table_directory(parquet) else (directory / _SQLITE, load_sqlite, "SQLite")
    )
    try:
        trace = load(target)
    except TraceError as exc:
        raise TraceError(shown, f"{exc.problem} (in the {what} export nsys made)") from exc
    return dataclasses.replace(trace, path=shown)


def _stamp(report: Path) -> dict:
    st = report.stat()
    return {"version": _CACHE_VERSION, "report_size": st.st_size, "report_mtime_ns": st.st_mtime_ns,
            "tables": list(TRACE_TABLES)}


def _stamp_matches(cached: Path, stamp: dict) -> bool:
    try:
        return json.loads((cached / _STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False
