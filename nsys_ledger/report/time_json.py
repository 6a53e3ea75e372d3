"""The `time_use` section of the check's JSON document (docs/json-schema.md): where the time
of each decode step went, from `Result.time_use` (checks.time_use)."""

from __future__ import annotations

from collections import defaultdict

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.time_use import DELAY_QUANTILES, STEP_TIME_COLUMNS, time_by_role, top_kernels
from nsys_ledger.ledger.roles import NO_ROLE, op_roles

STEP_LIST_LIMIT = 1000  # steps listed in full; `steps_total` counts all
TOP_KERNELS = 20
SHARE_DECIMALS = 4


def time_use_document(result: Result) -> dict | None:
    use = result.time_use
    if use is None:
        return None
    steps = use.steps.head(STEP_LIST_LIMIT)
    by_op = _per_step(use.ops, "op")
    by_group = _per_step(use.groups, "group")
    by_layer = _per_step(use.layers, "layer")
    roles = op_roles(result.expectations)
    by_role = _per_step(time_by_role(use.ops, roles), "role")
    delays = _delays(use.launch_delay)
    copies = _copies(use.copies)
    entries = []
    for row in steps.iter_rows(named=True):
        key = (row["rank"], row["step"])
        entries.append({
            "rank": row["rank"], "step": row["step"], "device": row["device"], "busy_ns": row["busy_ns"],
            **{column: row[column] for column in STEP_TIME_COLUMNS},
            "ops": by_op.get(key, {}), "roles": by_role.get(key, {}), "groups": by_group.get(key, {}),
            "layers": by_layer.get(key, {}),
            "launch_delay": delays.get(key, {}), "copies": copies.get(key, {}),
        })
    return {
        "list_limit": STEP_LIST_LIMIT,
        "steps_total": use.steps.height,
        "steps": entries,
        "top_kernels": [
            {**row, "role": roles.get(row["op"], NO_ROLE), "share": round(row["share"], SHARE_DECIMALS)}
            for row in top_kernels(use, TOP_KERNELS).to_dicts()
        ],
        "streams": use.streams.to_dicts(),
    }


def _per_step(frame: pl.DataFrame, column: str) -> dict[tuple[int, int], dict[str, dict]]:
    """(rank, step) -> {value of `column` (as text): {kernels, ns, share}}."""
    out: dict[tuple[int, int], dict[str, dict]] = defaultdict(dict)
    for rank, step, value, kernels, ns, share in frame.select(
        "rank", "step", column, "kernels", "kernel_ns", "share"
    ).iter_rows():
        out[(rank, step)][str(value)] = {"kernels": kernels, "ns": ns, "share": round(share, SHARE_DECIMALS)}
    return out


def _delays(frame: pl.DataFrame) -> dict[tuple[int, int], dict[str, dict]]:
    columns = ["count", "min_ns", *DELAY_QUANTILES, "max_ns", "mean_ns"]
    out: dict[tuple[int, int], dict[str, dict]] = defaultdict(dict)
    for row in frame.iter_rows(named=True):
        out[(row["rank"], row["step"])][row["mode"]] = {c: row[c] for c in columns}
    return out


def _copies(frame: pl.DataFrame) -> dict[tuple[int, int], dict[str, dict]]:
    out: dict[tuple[int, int], dict[str, dict]] = defaultdict(dict)
    for rank, step, kind, count, moved, ns in frame.select(
        "rank", "step", "kind", "count", "bytes", "time_ns"
    ).iter_rows():
        out[(rank, step)][kind] = {"count": count, "bytes": moved, "ns": ns}
    return out

