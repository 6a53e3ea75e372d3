"""What an Nsight Systems SQLite export holds, without reading it: `nsys-ledger inspect`.

The file is opened read-only (`sqlite_reader.read_only_export`, the reader's own checks and
``mode=ro`` URI; nothing is written beside it), and the connection is handed to sqlite-utils,
whose table objects give each table's columns and row count. The nsys and schema versions and
the CUDA graph trace mode come from the reader's own rules (`export_tables.py`), so `inspect`
says what `check` will see.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import sqlite_utils

from nsys_ledger import __version__
from nsys_ledger.errors import TraceError
from nsys_ledger.trace.export_tables import NEEDED_TABLES, TRACE_TABLES, graph_trace_mode_seen
from nsys_ledger.trace.sqlite_reader import export_reader, read_only_export

__all__ = ["ExportInventory", "INSPECT_SCHEMA_VERSION", "TableSummary", "inspect_document", "inspect_export",
           "inventory_document"]

# The `inspect --json` document's version (docs/json-schema.md), bumped as the check's is.
INSPECT_SCHEMA_VERSION = "1.0"

_KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
_GRAPH_REPLAY_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
# GPU activity tables whose rows name their graph node when graphs are traced per node
_NODE_ROW_TABLES = (_KERNEL_TABLE, "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


@dataclass(frozen=True)
class TableSummary:
    name: str
    rows: int
    columns: int
    read: bool  # nsys-ledger reads this table


@dataclass(frozen=True)
class ExportInventory:
    path: str
    nsys_version: str | None
    schema_version: str | None
    version_source: str  # the metadata table the versions came from, or "none"
    cuda_graph_trace: str | None  # "graph", "node", or None (no graph seen)
    tables: tuple[TableSummary, ...]
    missing_needed: tuple[str, ...]  # tables the reader needs that the file lacks
    missing_optional: tuple[str, ...]  # tables the reader reads when present, absent here

    @property
    def kernels(self) -> int:
        return next((t.rows for t in self.tables if t.name == _KERNEL_TABLE), 0)


def inspect_export(path: str | os.PathLike[str]) -> ExportInventory:
    """The inventory of the SQLite export at `path`. Raises TraceError on bad input."""
    shown = str(path)
    with read_only_export(path) as conn:
        # no plugins: none may run a statement against the user's file
        db = sqlite_utils.Database(conn, execute_plugins=False)
        names = set(db.table_names()) | set(db.view_names())
        if "StringIds" not in names and not any(n.startswith("CUPTI_ACTIVITY_KIND_") for n in names):
            raise TraceError(shown, "not an Nsight Systems export (no StringIds table)")
        tables = tuple(
            TableSummary(name=table.name, rows=table.count, columns=len(table.columns),
                         read=table.name in TRACE_TABLES)
            for table in sorted(db.tables, key=lambda t: t.name)
        )
        reader = export_reader(conn, shown)
        nsys_version, schema_version, version_source = reader.versions()
        graph_mode = reader.declared_graph_trace_mode() or graph_trace_mode_seen(
            graph_replays=_has_rows(db, _GRAPH_REPLAY_TABLE),
            graph_node_rows=any(_has_rows(db, t, not_null="graphNodeId") for t in _NODE_ROW_TABLES),
        )
    return ExportInventory(
        path=shown,
        nsys_version=nsys_version,
        schema_version=schema_version,
        version_source=version_source,
        cuda_graph_trace=graph_mode,
        tables=tables,
        missing_needed=tuple(t for t in NEEDED_TABLES if t not in names),
        missing_optional=tuple(t for t in TRACE_TABLES if t not in names and t not in NEEDED_TABLES),
    )


def _has_rows(db: sqlite_utils.Database, name: str, not_null: str | None = None) -> bool:
    """Whether table `name` has a row (one whose `not_null` column holds a value): stops at
    the first row, never counts them all."""
    table = db.table(name)
    if not table.exists() or (not_null is not None and not_null not in table.columns_dict):
        return False
    where = None if not_null is None else f"[{not_null}] IS NOT NULL"
    return next(table.rows_where(where, select="1", limit=1), None) is not None


def inventory_document(inventory: ExportInventory) -> dict:
    """The inventory as JSON for scripts: counts as integers, absent versions as null."""
    return {
        "path": inventory.path,
        "nsys_version": inventory.nsys_version,
        "schema_version": inventory.schema_version,
        "version_source": inventory.version_source,
        "cuda_graph_trace": inventory.cuda_graph_trace,
        "kernels": inventory.kernels,
        "tables": [
            {"name": t.name, "rows": t.rows, "columns": t.columns, "read": t.read} for t in inventory.tables
        ],
        "missing_needed": list(inventory.missing_needed),
        "missing_optional": list(inventory.missing_optional),
    }


def inspect_document(inventories: list[ExportInventory]) -> dict:
    """The `inspect --json` document: one inventory per file, in the order given."""
    return {
        "schema_version": INSPECT_SCHEMA_VERSION,
        "tool": {"name": "nsys-ledger", "version": __version__},
        "files": [inventory_document(inventory) for inventory in inventories],
    }
