"""A whole ledger: its sections read in file order, and written back in the same order.

`read_expectations` and `write_expectations` are the same list of sections, one reader and
one writer each (`nsys_ledger.ledger.sections`); ``load -> write -> load`` gives back an equal
`Expectations` (tests/test_ledger_roundtrip.py).
"""

from __future__ import annotations

from typing import Any

from nsys_ledger.ledger.model import Expectations, LayerClass, Range
from nsys_ledger.ledger.reading import LedgerReader, type_name
from nsys_ledger.ledger.sections.counts import read_anchors, read_total, write_anchors, write_total
from nsys_ledger.ledger.sections.kinds import read_kinds, write_kinds
from nsys_ledger.ledger.sections.layers import read_layers, write_layers
from nsys_ledger.ledger.sections.model import read_model, write_model
from nsys_ledger.ledger.sections.ops import read_ops, write_ops
from nsys_ledger.ledger.sections.params import batch_of, read_params, write_params
from nsys_ledger.ledger.sections.steps import read_steps, write_steps
from nsys_ledger.ledger.sections.timeline import (
    read_gaps,
    read_gaps_allowed,
    read_graphs,
    read_h2d,
    read_ranks,
    write_gaps,
    write_graphs,
    write_h2d,
    write_ranks,
)
from nsys_ledger.ledger.writing import LedgerWriter

TOP_LEVEL = ("model", "params", "steps", "ops", "anchors", "total", "gaps", "h2d", "graphs", "ranks", "layers", "kinds")


def read_expectations(reader: LedgerReader, doc: dict[str, Any]) -> Expectations:
    """Validate and evaluate a parsed expectations TOML (`doc`); errors name key and line."""
    check_top_level(reader, doc)
    name, description = read_model(reader, doc)
    params = read_params(reader, doc)
    ops = read_ops(reader, doc)
    anchors = read_anchors(reader, doc, ops)
    total, total_hint_low, total_hint_high = read_total(reader, doc)
    steps = read_steps(reader, doc, ops)
    gap_threshold_ns, step_entry_gaps = read_gaps(reader, doc)
    h2d = read_h2d(reader, doc)
    graphs = read_graphs(reader, doc)
    rank_imbalance_pct = read_ranks(reader, doc)
    layer_regex, opening_op, classes, layer_rule = read_layers(reader, doc, ops)
    check_total_against_layers(reader, total, classes)
    kinds = read_kinds(reader, doc, ops)
    return Expectations(
        path=reader.path,
        name=name,
        description=description,
        params=params,
        ops=ops,
        anchors=anchors,
        total=total,
        total_hint_low=total_hint_low,
        total_hint_high=total_hint_high,
        steps=steps,
        gap_threshold_ns=gap_threshold_ns,
        h2d=h2d,
        graph_launches_per_step=graphs,
        batch=batch_of(reader),
        layer_regex=layer_regex,
        layer_classes=classes,
        layer_opening_op=opening_op,
        layer_rule=layer_rule,
        rank_imbalance_pct=rank_imbalance_pct,
        step_entry_gaps=step_entry_gaps,
        gaps_allowed_per_step=read_gaps_allowed(reader, doc),
        kinds=kinds,
        written=dict(reader.written),
    )


def write_expectations(exp: Expectations) -> str:
    """The ledger as a complete expectations TOML text that `load_expectations` reads back to
    an equal `Expectations` (formulas kept where the ledger kept them, `exp.comments` written
    as ``# ...``)."""
    out = LedgerWriter(params=exp.params, written=exp.written, comments=exp.comments)
    write_model(out, exp)
    write_params(out, exp)
    write_steps(out, exp)
    write_ops(out, exp)
    write_anchors(out, exp)
    write_total(out, exp)
    write_gaps(out, exp)
    write_h2d(out, exp)
    write_graphs(out, exp)
    write_ranks(out, exp)
    write_layers(out, exp)
    write_kinds(out, exp)
    return out.text()


def check_top_level(reader: LedgerReader, doc: dict[str, Any]) -> None:
    for name, value in doc.items():
        if name not in TOP_LEVEL:
            raise reader.fail(name, f"unknown top-level table [{name}] (known: {', '.join(TOP_LEVEL)})")
        if not isinstance(value, dict):
            raise reader.fail(name, f"wrong type: [{name}] must be a table, got {type_name(value)}")


def check_total_against_layers(reader: LedgerReader, total: Range, classes: tuple[LayerClass, ...]) -> None:
    """The layer classes' least launches per step must fit under the total's maximum."""
    if total.high is None or not classes:
        return
    floor_sum = sum((r.low or 0) * len(c.layers) for c in classes for r in c.groups.values())
    if floor_sum > total.high:
        raise reader.fail(
            "total.max",
            f"contradictory: the layer classes need at least {floor_sum:g} kernels per step "
            f"but the total allows at most {total.high:g}",
        )
