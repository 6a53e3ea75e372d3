"""[anchors.OP] and [total]: per-step counts, which share one form.

``expected = RANGE`` with ``tolerance = N`` or ``tolerance_pct = P``, or ``min``/``max``; and
``hint_low``/``hint_high``, the diagnosis a finding prints when the count is too low or high.
"""

from __future__ import annotations

import re
from typing import Any

from nsys_ledger.ledger.formula import Number
from nsys_ledger.ledger.model import Anchor, Expectations, OpDef, Range
from nsys_ledger.ledger.reading import LedgerReader, short_list, shown, type_name
from nsys_ledger.ledger.writing import LedgerWriter

COUNT_KEYS = ("expected", "tolerance", "tolerance_pct", "min", "max", "hint_low", "hint_high")
_RANGE_KEYS = ("expected", "tolerance", "tolerance_pct", "min", "max")
# Anchor.formula as `read_counted` shows it: "2 * layers ± 10%", "min layers, max 2 * layers".
_WITH_TOLERANCE = re.compile(r"^(?P<expected>.+) ± (?P<tolerance>.+?)(?P<pct>%?)$")
_BOUNDS = re.compile(r"^(?:min (?P<min>.+?))?(?:, )?(?:max (?P<max>.+))?$")
_NUMBER = re.compile(r"^\d+(?:\.\d+)?$")

Counted = tuple[Range, str, str | None, str | None]  # range, formula, hint_low, hint_high


def read_counted(reader: LedgerReader, table: dict[str, Any], key: str) -> Counted:
    """An anchor or the total: (expected range with the tolerance applied, the formula as
    messages show it, hint_low, hint_high)."""
    reader.known(table, key, COUNT_KEYS)
    hint_low = reader.get(table, "hint_low", key, str)
    hint_high = reader.get(table, "hint_high", key, str)
    for name in _RANGE_KEYS:
        if name in table:
            reader.keep(f"{key}.{name}", table[name])
    has_bounds = "min" in table or "max" in table
    if "expected" in table:
        if has_bounds:
            raise reader.fail(f"{key}.expected", "give expected (with a tolerance) or min/max, not both")
        if "tolerance" in table and "tolerance_pct" in table:
            raise reader.fail(f"{key}.tolerance_pct", "give tolerance or tolerance_pct, not both")
        raw = table["expected"]
        base = reader.range_value(raw, f"{key}.expected")
        formula = raw if isinstance(raw, str) else shown(raw)
        low, high = base.low, base.high
        if "tolerance" in table:
            tol = reader.number(table["tolerance"], f"{key}.tolerance")
            if tol < 0:
                raise reader.fail(f"{key}.tolerance", f"a tolerance cannot be negative (got {tol:g})")
            low = None if low is None else max(0, low - tol)
            high = None if high is None else high + tol
            if tol:
                formula += f" ± {shown(table['tolerance'])}"
        elif "tolerance_pct" in table:
            pct = reader.number(table["tolerance_pct"], f"{key}.tolerance_pct")
            if pct < 0:
                raise reader.fail(f"{key}.tolerance_pct", f"a tolerance cannot be negative (got {pct:g})")
            low = None if low is None else max(0, low * (1 - pct / 100))
            high = None if high is None else high * (1 + pct / 100)
            if pct:
                formula += f" ± {shown(table['tolerance_pct'])}%"
        return reader.make_range(low, high, f"{key}.expected"), formula, hint_low, hint_high
    if has_bounds:
        for name in ("tolerance", "tolerance_pct"):
            if name in table:
                raise reader.fail(f"{key}.{name}", "a tolerance applies to expected, not to min/max")
        low = reader.number(table["min"], f"{key}.min") if "min" in table else None
        high = reader.number(table["max"], f"{key}.max") if "max" in table else None
        parts = []
        if "min" in table:
            parts.append(f"min {shown(table['min'])}")
        if "max" in table:
            parts.append(f"max {shown(table['max'])}")
        return reader.make_range(low, high, key), ", ".join(parts), hint_low, hint_high
    raise reader.fail(f"{key}.expected", f"missing required key 'expected' (or min/max) in [{key}]")


def read_anchors(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]) -> tuple[Anchor, ...]:
    table = reader.table(doc, "anchors", "anchors") or {}
    anchors = []
    for op, spec in table.items():
        key = f"anchors.{op}"
        if op not in ops:
            raise reader.fail(key, f"anchor refers to unknown op {op!r} (ops: {short_list(ops)})")
        if not isinstance(spec, dict):
            raise reader.fail(key, f"wrong type: expected a table, got {type_name(spec)}")
        expected, formula, hint_low, hint_high = read_counted(reader, spec, key)
        anchors.append(Anchor(op=op, formula=formula, expected=expected,
                              hint_low=hint_low, hint_high=hint_high, source=key))
    return tuple(anchors)


def read_total(reader: LedgerReader, doc: dict[str, Any]) -> tuple[Range, str | None, str | None]:
    """(kernels per step, hint_low, hint_high); any count when there is no [total]."""
    table = reader.table(doc, "total", "total")
    if table is None:
        return Range(None, None), None, None
    total, _, hint_low, hint_high = read_counted(reader, table, "total")
    return total, hint_low, hint_high


# ---- writing ----------------------------------------------------------------------------


def _raw_number(text: str) -> Number | str:
    """``"2"`` -> 2: a number shown in a formula goes back as a number, a formula as text."""
    if _NUMBER.match(text):
        return float(text) if "." in text else int(text)
    return text


def keys_from_formula(formula: str) -> dict[str, Any]:
    """The count keys that `formula` (as `read_counted` shows it) was read from."""
    m = _WITH_TOLERANCE.match(formula)
    if m:
        name = "tolerance_pct" if m["pct"] else "tolerance"
        return {"expected": _raw_number(m["expected"]), name: _raw_number(m["tolerance"])}
    m = _BOUNDS.match(formula)
    if m and (m["min"] or m["max"]) and formula.startswith(("min ", "max ")):
        return {name: _raw_number(m[name]) for name in ("min", "max") if m[name]}
    return {"expected": _raw_number(formula)}


def keys_from_range(r: Range) -> dict[str, Any]:
    """The count keys for a range of plain numbers: ``expected = 3``, else ``min``/``max`` (one
    line each, so each bound can carry its comment: how `learn` saw it)."""
    if r.low is not None and r.low == r.high:
        return {"expected": r.low}
    bounds = {name: bound for name, bound in (("min", r.low), ("max", r.high)) if bound is not None}
    return bounds or {"min": 0}  # any count: a count table needs a bound


def count_keys(out: LedgerWriter, key: str, expected: Range, formula: str | None) -> dict[str, Any]:
    """What to write for a count: the file's own keys where kept, else the anchor's formula
    where it reads as the expected range (a ledger built by `learn`: ``"2 * layers"``), else
    the range's numbers."""
    def reads(table: dict[str, Any]) -> tuple[Range, str]:
        counted = read_counted(out.reader, table, key)
        return counted[0], counted[1]

    written = {name: out.written[f"{key}.{name}"] for name in _RANGE_KEYS if f"{key}.{name}" in out.written}
    if written and out.reads_as(written, lambda t: reads(t)[0], expected):
        return written
    if formula:
        from_formula = keys_from_formula(formula)
        if out.reads_as(from_formula, lambda t: reads(t)[0], expected):
            return from_formula
    return keys_from_range(expected)


def write_count(out: LedgerWriter, key: str, expected: Range, formula: str | None,
                hint_low: str | None, hint_high: str | None) -> None:
    out.table(key)
    for name, value in count_keys(out, key, expected, formula).items():
        out.value(key, name, value)
    if hint_low is not None:
        out.value(key, "hint_low", hint_low)
    if hint_high is not None:
        out.value(key, "hint_high", hint_high)


def write_anchors(out: LedgerWriter, exp: Expectations) -> None:
    for anchor in exp.anchors:
        write_count(out, f"anchors.{anchor.op}", anchor.expected, anchor.formula, anchor.hint_low, anchor.hint_high)


def write_total(out: LedgerWriter, exp: Expectations) -> None:
    if exp.total == Range(None, None) and exp.total_hint_low is None and exp.total_hint_high is None:
        return
    write_count(out, "total", exp.total, None, exp.total_hint_low, exp.total_hint_high)
