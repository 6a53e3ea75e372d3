"""[kinds.prefill] and [kinds.mixed]: what a step of a kind other than decode launches.

Each holds a ``[kinds.KIND.total]`` (kernels per step) and ``[kinds.KIND.anchors.OP]`` (per-step
counts of an op), in the same form as [total] and [anchors]. Decode steps are the rest of the
ledger, so there is no [kinds.decode].
"""

from __future__ import annotations

from typing import Any

from nsys_ledger.attribution.step_kinds import DEFAULT_KIND, STEP_KINDS
from nsys_ledger.ledger.model import Anchor, Expectations, KindSection, OpDef, Range
from nsys_ledger.ledger.reading import LedgerReader, short_list, type_name
from nsys_ledger.ledger.sections.counts import read_counted, write_count
from nsys_ledger.ledger.writing import LedgerWriter

KIND_KEYS = ("total", "anchors")
SECTION_KINDS = tuple(k for k in STEP_KINDS if k != DEFAULT_KIND)


def read_kinds(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]) -> dict[str, KindSection]:
    table = reader.table(doc, "kinds", "kinds")
    if table is None:
        return {}
    sections = {}
    for kind, spec in table.items():
        key = f"kinds.{kind}"
        if kind == DEFAULT_KIND:
            raise reader.fail(key, "decode steps are the ledger's own [total] and [anchors]; no [kinds.decode]")
        if kind not in SECTION_KINDS:
            raise reader.fail(key, f"unknown step kind {kind!r} (one of {', '.join(SECTION_KINDS)})")
        if not isinstance(spec, dict):
            raise reader.fail(key, f"wrong type: expected a table, got {type_name(spec)}")
        reader.known(spec, key, KIND_KEYS)
        total, formula, hint_low, hint_high = Range(None, None), None, None, None
        total_table = reader.table(spec, "total", f"{key}.total")
        if total_table is not None:
            total, formula, hint_low, hint_high = read_counted(reader, total_table, f"{key}.total")
        anchors = []
        for op, counted in (reader.table(spec, "anchors", f"{key}.anchors") or {}).items():
            anchor_key = f"{key}.anchors.{op}"
            if op not in ops:
                raise reader.fail(anchor_key, f"anchor refers to unknown op {op!r} (ops: {short_list(ops)})")
            if not isinstance(counted, dict):
                raise reader.fail(anchor_key, f"wrong type: expected a table, got {type_name(counted)}")
            expected, anchor_formula, low_hint, high_hint = read_counted(reader, counted, anchor_key)
            anchors.append(Anchor(op=op, formula=anchor_formula, expected=expected, hint_low=low_hint,
                                  hint_high=high_hint, source=anchor_key))
        if total_table is None and not anchors:
            raise reader.fail(key, f"[{key}] declares nothing: give [{key}.total] or [{key}.anchors.OP]")
        sections[kind] = KindSection(kind=kind, total=total, anchors=tuple(anchors), total_formula=formula,
                                     total_hint_low=hint_low, total_hint_high=hint_high, source=key)
    return sections


def write_kinds(out: LedgerWriter, exp: Expectations) -> None:
    for kind, section in exp.kinds.items():
        if section.total != Range(None, None) or section.total_hint_low or section.total_hint_high:
            write_count(out, f"kinds.{kind}.total", section.total, section.total_formula,
                        section.total_hint_low, section.total_hint_high)
        for anchor in section.anchors:
            write_count(out, anchor.source, anchor.expected, anchor.formula, anchor.hint_low, anchor.hint_high)
