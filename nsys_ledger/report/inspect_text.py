"""`nsys-ledger inspect` as terminal text: the verdict (can `check` read this export?), the
versions and the graph trace mode, then one row per table, all fitted to the terminal."""

from __future__ import annotations

from nsys_ledger.report.layout import fit_lines, fit_table
from nsys_ledger.report.text import printable
from nsys_ledger.trace.inspect_export import ExportInventory

_GRAPH_MODES = {
    "node": "traced per node (--cuda-graph-trace=node): each kernel of a replay is a row",
    "graph": "traced per graph (--cuda-graph-trace=graph): one row per replay, not its kernels",
    None: "no CUDA graph seen (eager launches, or graphs not traced)",
}
_MISSING_MEANS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": "no kernels to check: was the capture made with -t cuda?",
    "StringIds": "no names: kernels and ranges cannot be matched by name",
}


def render_inventory(inventory: ExportInventory, width: int) -> str:
    lines = [_verdict(inventory), *_facts(inventory), ""]
    lines += fit_table(_table_rows(inventory), width, wrap=(0,))
    if inventory.missing_optional:
        lines += ["", "absent      read when present: " + ", ".join(inventory.missing_optional)]
    return "\n".join(fit_lines(lines, width))


def _verdict(inventory: ExportInventory) -> str:
    shown = printable(inventory.path)
    tables = f"{len(inventory.tables):,} tables"
    if inventory.missing_needed:
        lacks = "; ".join(f"no {t} ({_MISSING_MEANS[t]})" for t in inventory.missing_needed)
        return f"{shown}: {tables}; nsys-ledger lacks what it needs: {lacks}"
    return f"{shown}: nsys-ledger can read it: {inventory.kernels:,} kernels in {tables}"


def _facts(inventory: ExportInventory) -> list[str]:
    if inventory.version_source == "none":
        versions = "unknown (no META_DATA_EXPORT or EXPORT_META_DATA table)"
    else:
        versions = (f"{inventory.nsys_version or 'unknown'}, export schema "
                    f"{inventory.schema_version or 'unknown'} (from {inventory.version_source})")
    return [f"nsys        {versions}", f"graphs      {_GRAPH_MODES[inventory.cuda_graph_trace]}"]


def _table_rows(inventory: ExportInventory) -> list[tuple[str, ...]]:
    """Header, then every table by name; a table the reader needs and the file lacks is a row
    too, so the gap shows where the table would be."""
    body = [(t.name, f"{t.rows:,}", f"{t.columns:,}", "yes" if t.read else "") for t in inventory.tables]
    body += [(name, "-", "-", "NEEDED, absent") for name in inventory.missing_needed]
    body.sort(key=lambda row: row[0])
    rows_width = max(len("rows"), *(len(row[1]) for row in body))
    columns_width = max(len("columns"), *(len(row[2]) for row in body))
    # numbers right-aligned, so their digits line up
    return [("table", "rows".rjust(rows_width), "columns", "read")] + [
        (printable(name), rows.rjust(rows_width), columns.rjust(columns_width), read)
        for name, rows, columns, read in body
    ]
