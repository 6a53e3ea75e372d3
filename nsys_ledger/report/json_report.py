"""The versioned JSON document of a check (schema in docs/json-schema.md).

Bump SCHEMA_VERSION's major number when a field is removed or changes meaning, the minor
number when fields are added.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import msgspec
import polars as pl

from nsys_ledger import __version__
from nsys_ledger.api import Result
from nsys_ledger.attribution.steps import launches_per_thread
from nsys_ledger.checks.layers import compact_layer_counts
from nsys_ledger.checks.ledger import compact_ranges
from nsys_ledger.ledger.roles import NO_ROLE, op_roles
from nsys_ledger.report.time_json import time_use_document
from nsys_ledger.report.timeline_json import step_timeline_fields, timeline_document

SCHEMA_VERSION = "2.1"

STEP_FIELDS = [
    "pid", "device", "host_start", "host_end", "gpu_start", "gpu_end", "duration_ns", "kernels", "kernel_ns",
    "cpu_submissions", "graph_launches", "h2d", "h2d_pageable", "h2d_bytes", "gaps", "gap_ns",
    "step_entry_gaps", "step_entry_gap_ns",
]


def result_document(result: Result) -> dict:
    trace = result.trace
    steps = result.steps
    excluded_reasons = dict(steps.excluded.group_by("reason").agg(pl.len()).sort("reason").iter_rows())
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "nsys-ledger", "version": __version__},
        "trace": {
            "path": trace.path,
            "nsys_version": trace.meta.nsys_version,
            "schema_version": trace.meta.schema_version,
            "version_source": trace.meta.version_source,
            "cuda_graph_trace": trace.meta.cuda_graph_trace,
            "devices": trace.devices.select("device", "name").to_dicts(),
        },
        "expectations": (
            {"path": result.expectations.path, "name": result.expectations.name} if result.expectations else None
        ),
        "op_roles": op_roles(result.expectations),
        "totals": asdict(result.totals) | {
            "kernels_by_device": {str(k): v for k, v in result.totals.kernels_by_device.items()}
        },
        "step_detection": {
            "method": steps.method,
            "detail": steps.detail,
            "decode_steps": steps.decode.height,
            "excluded_steps": steps.excluded.height,
            "excluded_reasons": excluded_reasons,
            "launch_threads": launches_per_thread(steps.launch_threads).to_dicts(),
            "kinds": result.step_kinds.to_dicts() if result.step_kinds is not None else [],
        },
        "gap_threshold_ns": result.gap_threshold_ns,
        "steps": _steps(result),
        "checks": [
            {"name": o.name, "source": o.source, "expected": o.expected, "observed": o.observed, "passed": o.passed}
            for o in result.outcomes
        ],
        "findings": [asdict(f) for f in result.findings],
        "notices": list(result.notices),
        "files": _files(result),
        "layers": _layers(result),
        "op_coverage": result.coverage.to_dict() if result.coverage is not None else None,
        "timeline": timeline_document(result),
        "time_use": time_use_document(result),
        "verdict": result.verdict,
    }


def _layers(result: Result) -> dict | None:
    """Layer attribution: coverage by how, and per-layer group counts, compact (see schema)."""
    layers = result.layers
    if layers is None:
        return None
    by_how = layers.kernels_by_how()
    per_layer = [
        {
            "rank": rank,
            "layers": layer_list,
            "steps": compact_ranges(step_list),
            "step_count": len(step_list),
            "kernels": kernels,
            "groups": {g: int(n) for g, n in (item.split("=") for item in groups.split(","))},
        }
        for rank, layer_list, step_list, groups, kernels in compact_layer_counts(layers.counts).iter_rows()
    ]
    return {
        "regex": layers.regex,
        "decode_kernels": sum(by_how.values()),
        "kernels_by_how": by_how,
        "share_with_layer": round(layers.share_with_layer, 6),
        "inferred_steps": layers.inferred_steps,
        "inferred_by": {
            f"{confidence} by {cut_by}": n
            for confidence, cut_by, n in layers.inferred.group_by("confidence", "cut_by").agg(pl.len())
            .sort("confidence", "cut_by").iter_rows()
        },
        "unresolved_graph_nodes": layers.unresolved_graph_nodes.to_dicts(),
        "notes": list(layers.notes),
        "per_layer": per_layer,
    }


def _steps(result: Result) -> list[dict]:
    op_columns = [c for c in result.op_table.columns if c not in ("rank", "step")]
    roles = op_roles(result.expectations)
    joined = result.step_table.join(result.op_table, on=["rank", "step"], how="left")
    documents = []
    for row in joined.iter_rows(named=True):
        step = {"index": row["step"], "rank": row["rank"]}
        step.update({field: row[field] for field in STEP_FIELDS})
        step.update(step_timeline_fields(row))
        step["ops"] = {op: row[op] for op in op_columns if row[op]}
        step["roles"] = _kernels_by_role(step["ops"], roles)
        documents.append(step)
    return documents


def _kernels_by_role(ops: dict[str, int], roles: dict[str, str]) -> dict[str, int]:
    """A step's kernels per op summed by role (NO_ROLE for ops without one and for `other`)."""
    out: dict[str, int] = {}
    for op, kernels in ops.items():
        role = roles.get(op, NO_ROLE)
        out[role] = out.get(role, 0) + kernels
    return out


def _files(result: Result) -> list[dict]:
    """The input files in rank order and the ranks each one's processes became."""
    if result.files:
        return [{"path": f.path, "ranks": list(f.ranks)} for f in result.files]
    ranks = result.steps.windows["rank"].drop_nulls().unique().sort().to_list()
    return [{"path": result.trace.path, "ranks": ranks}]


def write_json(result: Result, path: str | Path) -> None:
    # UTF-8 whatever the locale: kernel names can hold any character (U+FFFD for bad bytes)
    Path(path).write_text(dumps_indented(result_document(result)) + "\n", encoding="utf-8")


def dumps_indented(document: dict) -> str:
    """`json.dumps(document, indent=2, ensure_ascii=False)`, the same text, 5-6x faster.

    With `indent` the standard library encodes in Python (1 s for the 220k values of a 1M-kernel
    check); without it, in C. So the document is encoded compactly in C (every number and string
    spelled by `json` itself) and msgspec only lays the tokens out, copying them verbatim, in
    the layout `indent=2` gives. What msgspec cannot read (NaN or Infinity, which `json` writes
    but JSON does not allow) goes the slow way.
    """
    compact = json.dumps(document, ensure_ascii=False)
    try:
        return msgspec.json.format(compact, indent=2)
    except (msgspec.DecodeError, UnicodeError):
        return json.dumps(document, indent=2, ensure_ascii=False)
