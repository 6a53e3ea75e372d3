"""Trace import: turn an Nsight Systems export into a `Trace`.

`load_trace(path)` accepts an SQLite export (any file with the SQLite header, whatever its
suffix) or an `.nsys-rep` report, which it converts with `nsys export` when `nsys` is on
PATH.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from nsys_ledger.errors import TraceError
from nsys_ledger.trace.model import Trace, TraceMeta
from nsys_ledger.trace.sqlite_reader import SQLITE_MAGIC, load_sqlite

__all__ = ["load_trace", "load_sqlite", "Trace", "TraceMeta"]

_REPORT_SUFFIXES = (".nsys-rep", ".qdrep")


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a trace file into a Trace. Raises TraceError (``<path>: <problem>``)."""
    p = Path(path)
    if p.name.lower().endswith(_REPORT_SUFFIXES) and p.is_file() and not _is_sqlite(p):
        return _load_report(p, str(path))
    return load_sqlite(path)


def _is_sqlite(p: Path) -> bool:
    try:
        with open(p, "rb") as fh:
            return fh.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _load_report(p: Path, shown: str) -> Trace:
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceError(
            shown,
            "this is an .nsys-rep report; convert it with `nsys export --type sqlite FILE` "
            "(nsys is not on PATH)",
        )
    with tempfile.TemporaryDirectory(prefix="nsys-ledger-") as tmp:
        out = Path(tmp) / "x.sqlite"
        try:
            proc = subprocess.run(
                [nsys, "export", "--type", "sqlite", "--output", str(out), str(p)],
                capture_output=True,
                text=True,
                check=False,
            )
        except OSError as exc:
            raise TraceError(shown, f"cannot run nsys export ({exc})") from exc
        if proc.returncode != 0 or not out.is_file():
            detail = (proc.stderr or proc.stdout or "").strip().splitlines()
            last = detail[-1] if detail else "no output"
            raise TraceError(shown, f"nsys export failed (exit {proc.returncode}): {last}")
        try:
            trace = load_sqlite(out)
        except TraceError as exc:
            raise TraceError(shown, f"{exc.problem} (in the SQLite export nsys made)") from exc
    return dataclasses.replace(trace, path=shown)
