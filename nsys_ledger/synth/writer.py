"""Write nsys-schema SQLite files: tables from a `SchemaEra`, names through StringIds.

The writer knows nothing about GLM or SGLang; `generate.py` feeds it rows. Tables are created
lazily, as `nsys export --lazy=true` does (a table only exists once a row goes in), except the
ENUM_* tables and the few tables every real export holds. Rows go in with `executemany` while
journaling and syncing are off; `close()` restores nothing (the file is complete when it is
closed) and can VACUUM.

A different schema era is a different `SchemaEra` (its own DDL set). `insert` drops the columns
a table of that era does not have, so the same row producer can feed an older layout.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path

from nsys_ledger.synth.nsys_schema import ERA_2026_2, SchemaEra

# StringIds 0-4 as nsys 2025.5/2026.x writes them first
_PRESET_STRINGS = ("[Unknown]", "[kernel.kallsyms]", "[Max depth]", "[Broken backtraces]",
                   "[Called from Java]")

# tables every export we hold carries even when empty
_ALWAYS = ("StringIds", "META_DATA_EXPORT", "META_DATA_CAPTURE", "PROFILER_OVERHEAD",
           "ANALYSIS_DETAILS")


class SqliteTraceWriter:
    """Create one nsys-like SQLite export.

    >>> w = SqliteTraceWriter("/tmp/x.sqlite")
    >>> sid = w.string_id("cudaLaunchKernel_v7000")
    >>> w.insert("CUPTI_ACTIVITY_KIND_RUNTIME", ("start", "end", "eventClass", "globalTid",
    ...          "correlationId", "nameId", "returnValue"), [(1, 2, 0, 5, 1, sid, 0)])
    1
    >>> w.close()
    """

    def __init__(self, path: str | os.PathLike[str], era: SchemaEra = ERA_2026_2) -> None:
        self.path = Path(path)
        self.era = era
        if self.path.exists():
            self.path.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.con = sqlite3.connect(self.path, isolation_level=None)
        self.con.execute("PRAGMA journal_mode=OFF")
        self.con.execute("PRAGMA synchronous=OFF")
        self.con.execute("PRAGMA temp_store=MEMORY")
        self.con.execute("PRAGMA cache_size=-65536")
        self.con.execute("BEGIN")
        self._strings: dict[str, int] = {}
        self._values: list[str] = []  # id -> string, rebuilt on demand by string_value
        self._columns: dict[str, tuple[str, ...]] = {}
        self.rows_written: dict[str, int] = {}
        for s in _PRESET_STRINGS:
            self.string_id(s)
        for t in _ALWAYS:
            if era.has(t):  # older eras lack some (no META_DATA_* before 2023.3)
                self.create(t)

    # -- strings ------------------------------------------------------------------------------
    def string_id(self, value: str) -> int:
        sid = self._strings.get(value)
        if sid is None:
            sid = len(self._strings)
            self._strings[value] = sid
        return sid

    def string_value(self, sid: int) -> str:
        """The string of id `sid` (ids are dense: 0, 1, 2, ... in the order first asked)."""
        if len(self._values) != len(self._strings):
            self._values = list(self._strings)  # dicts keep insertion order, which is id order
        return self._values[sid]

    # -- tables -------------------------------------------------------------------------------
    def has_table(self, table: str) -> bool:
        return table in self._columns

    def create(self, table: str) -> tuple[str, ...]:
        cols = self._columns.get(table)
        if cols is not None:
            return cols
        try:
            ddl = self.era.ddl[table]
        except KeyError:
            raise KeyError(f"table {table!r} is not part of schema era {self.era.name}") from None
        self.con.execute(ddl)
        cols = tuple(r[1] for r in self.con.execute(f"PRAGMA table_info({table})"))
        self._columns[table] = cols
        self.rows_written.setdefault(table, 0)
        return cols

    def insert(self, table: str, columns: Sequence[str], rows: Iterable[Sequence]) -> int:
        """Insert rows given as tuples in the order of `columns`; returns the row count."""
        have = self.create(table)
        keep = [i for i, c in enumerate(columns) if c in have]
        if len(keep) != len(columns):
            cols = [columns[i] for i in keep]
            rows = (tuple(r[i] for i in keep) for r in rows)
        else:
            cols = list(columns)
        sql = (f"INSERT INTO {table} ({', '.join(cols)}) "
               f"VALUES ({', '.join('?' * len(cols))})")
        before = self.con.total_changes
        self.con.executemany(sql, rows)
        n = self.con.total_changes - before
        self.rows_written[table] = self.rows_written.get(table, 0) + n
        return n

    def write_enums(self) -> None:
        for table, rows in self.era.enum_rows.items():
            self.insert(table, ("id", "name", "label"), rows)

    def write_meta(self, table: str, pairs: Iterable[tuple[str, str | None]]) -> None:
        self.insert(table, ("name", "value"), list(pairs))

    # -- finish -------------------------------------------------------------------------------
    def close(self, *, vacuum: bool = False) -> None:
        self.insert("StringIds", ("id", "value"),
                    ((i, s) for s, i in sorted(self._strings.items(), key=lambda kv: kv[1])))
        self.con.execute("COMMIT")
        if vacuum:
            self.con.execute("VACUUM")
        self.con.close()

    def __enter__(self) -> "SqliteTraceWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        else:
            self.con.close()
