"""The versioned JSON document of `nsys-ledger compare` (docs/json-schema.md, "compare").

Its `schema_version` is its own: bump the minor when fields are added, the major when one is
removed or changes meaning. Medians are numbers: an integer when whole (a count, a time in
ns), else a float (the median of an even number of steps).
"""

from __future__ import annotations

import json
from pathlib import Path

from nsys_ledger import __version__
from nsys_ledger.compare import STEP_FIGURES, WARMUP_MIN_STEPS, Comparison, Side
from nsys_ledger.report.compare_text import headline

COMPARE_SCHEMA_VERSION = "1.0"
ROW_FIELDS = ("kernels_a", "kernels_b", "delta", "ns_a", "ns_b", "ns_delta")


def number(value: float | None) -> int | float | None:
    """A whole number as an int (2077, not 2077.0); else the float, rounded to 3 decimals."""
    if value is None:
        return None
    return int(value) if float(value).is_integer() else round(float(value), 3)


def compare_document(comparison: Comparison) -> dict:
    return {
        "schema_version": COMPARE_SCHEMA_VERSION,
        "tool": {"name": "nsys-ledger", "version": __version__},
        "headline": headline(comparison),
        "a": _side(comparison.a),
        "b": _side(comparison.b),
        "steady_state": {"rule": comparison.steady_rule, "warmup_min_steps": WARMUP_MIN_STEPS},
        "kinds": list(comparison.kinds),
        "ranks": list(comparison.ranks),
        "notes": list(comparison.notes),
        "compared": [_compared(comparison, kind, rank) for kind in comparison.kinds for rank in comparison.ranks],
    }


def _side(side: Side) -> dict:
    return {
        "path": side.path, "ledger": side.ledger, "ledger_path": side.ledger_path,
        "roles_declared": side.roles_declared,
        "steps": {kind: {"found": found, "steady": steady} for kind, (found, steady) in side.steps.items()},
        "ranks": list(side.ranks),
    }


def _compared(comparison: Comparison, kind: str, rank: int) -> dict:
    figures = {}
    for name, label, unit in STEP_FIGURES:
        a, b, delta = comparison.figure(name, kind, rank)
        figures[name] = {"label": label, "unit": unit, "a": number(a), "b": number(b), "delta": number(delta)}
    return {
        "kind": kind,
        "rank": rank,
        "figures": figures,
        "explaining_roles": [row.role for row in comparison.explaining_roles(kind, rank)],
        "roles": [{"role": row.role, **{f: number(getattr(row, f)) for f in ROW_FIELDS}}
                  for row in comparison.role_rows(kind, rank)],
        "layers": [{"layer": row["layer"], **{f: number(row[f]) for f in ROW_FIELDS}}
                   for row in comparison.layer_rows(kind, rank).iter_rows(named=True)],
    }


def dumps_compare(comparison: Comparison) -> str:
    return json.dumps(compare_document(comparison), indent=2, ensure_ascii=False)


def write_compare_json(comparison: Comparison, path: str | Path) -> None:
    Path(path).write_text(dumps_compare(comparison) + "\n", encoding="utf-8")
