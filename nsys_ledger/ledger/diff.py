"""What two ledgers disagree on (`nsys-ledger expectations diff A.toml B.toml`).

Compared section by section on the evaluated values the checks use, so a changed parameter
also shows every anchor and layer class it moves; formulas are shown next to the numbers.
Each difference is one `LedgerChange` keyed by the dotted TOML key, so a reviewer of a
relearned ledger can find the line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from difflib import SequenceMatcher
from typing import Any

from nsys_ledger.ledger.model import Anchor, Expectations, GemmShape, LayerClass, OpDef, Range
from nsys_ledger.ledger.sections.layers import compact_layers
from nsys_ledger.ledger.writing import regex_string

ADDED, REMOVED, CHANGED, MOVED = "added", "removed", "changed", "moved"
_MARKS = {ADDED: "+", REMOVED: "-", CHANGED: "~", MOVED: "~"}


@dataclass(frozen=True)
class LedgerChange:
    """One difference: `key` is the dotted TOML key (``params.layers``,
    ``ops.sampling.patterns``); `before`/`after` are readable values, None where absent."""

    key: str
    change: str  # added, removed, changed, moved (an op's match priority)
    before: str | None
    after: str | None

    @property
    def section(self) -> str:
        return self.key.split(".")[0]

    def describe(self) -> str:
        mark = _MARKS[self.change]
        if self.change == ADDED:
            return f"{mark} {self.key}: {self.after}"
        if self.change == REMOVED:
            return f"{mark} {self.key}: {self.before}"
        return f"{mark} {self.key}: {self.before} -> {self.after}"


def diff_expectations(a: Expectations, b: Expectations) -> list[LedgerChange]:
    """Every difference from ledger `a` to ledger `b`, in file order."""
    return [
        *_model(a, b), *_params(a, b), *_steps(a, b), *_ops(a, b), *_anchors(a, b), *_total(a, b),
        *_gaps(a, b), *_h2d(a, b), *_graphs(a, b), *_ranks(a, b), *_layers(a, b),
    ]


def render_ledger_diff(changes: list[LedgerChange], a_path: str, b_path: str) -> str:
    """For a terminal or a pull-request comment: one line per difference."""
    if not changes:
        return f"the ledgers agree: {a_path} and {b_path} declare the same expectations\n"
    lines = [f"{len(changes)} difference(s) from {a_path} to {b_path}"]
    lines += [f"  {change.describe()}" for change in changes]
    return "\n".join(lines) + "\n"


def ledger_diff_json(changes: list[LedgerChange], a_path: str, b_path: str) -> dict[str, Any]:
    return {
        "a": a_path,
        "b": b_path,
        "equal": not changes,
        "changes": [{"section": c.section, **asdict(c)} for c in changes],
    }


# ---- how values read ----------------------------------------------------------------------


def _num(x: float | None) -> str:
    if x is None:
        return "none"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _one_line(text: str) -> str:
    """A description on one line (a diff prints one line per difference)."""
    return " ".join(text.split())


def _with_formula(value: str, formula: object) -> str:
    """``75 (layers - dense_layers)``: the number the check uses, and how the file wrote it."""
    if isinstance(formula, str) and formula != value:
        return f"{value} (= {formula})"
    return value


def _anchor_value(anchor: Anchor) -> str:
    return _with_formula(anchor.expected.describe(), anchor.formula)


def _layers_value(layer_class: LayerClass) -> str:
    return f"{compact_layers(layer_class.layers)} ({len(layer_class.layers)} layers)"


def _us(ns: int | None) -> str:
    return "none" if ns is None else f"{ns / 1000:g} µs"


# ---- comparing ---------------------------------------------------------------------------


def _value(key: str, before: Any, after: Any, show: Callable[[Any], str] = str) -> Iterator[LedgerChange]:
    """A single value: changed, or added / removed where one side has None."""
    if before == after:
        return
    if before is None:
        yield LedgerChange(key, ADDED, None, show(after))
    elif after is None:
        yield LedgerChange(key, REMOVED, show(before), None)
    else:
        yield LedgerChange(key, CHANGED, show(before), show(after))


def _items(key: str, before: Iterable[str], after: Iterable[str]) -> Iterator[LedgerChange]:
    """Members of a list (patterns, GEMM shapes, excluded ops): each removed and added one."""
    before, after = list(before), list(after)
    for item in before:
        if item not in after:
            yield LedgerChange(key, REMOVED, item, None)
    for item in after:
        if item not in before:
            yield LedgerChange(key, ADDED, None, item)


def _model(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("model.name", a.name, b.name)
    yield from _value("model.description", a.description.strip() or None, b.description.strip() or None, _one_line)


def _params(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    def show(exp: Expectations, name: str) -> str | None:
        if name not in exp.params:
            return None
        return _with_formula(_num(exp.params[name]), exp.written.get(f"params.{name}"))

    for name in _keys_of_both(a.params, b.params):
        if a.params.get(name) != b.params.get(name):
            yield from _value(f"params.{name}", show(a, name), show(b, name))


def _steps(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    sa, sb = a.steps, b.steps
    yield from _value("steps.method", sa.method, sb.method)
    yield from _value("steps.nvtx", sa.nvtx_regex, sb.nvtx_regex, regex_string)
    yield from _value("steps.marker_op", sa.marker_op, sb.marker_op)
    yield from _value("steps.marker", sa.marker_regex, sb.marker_regex, regex_string)
    yield from _value("steps.exclude_nvtx", sa.exclude_nvtx_regex, sb.exclude_nvtx_regex, regex_string)
    yield from _items("steps.exclude_ops", sa.exclude_ops, sb.exclude_ops)


def _op_value(op: OpDef) -> str:
    parts = [f"group {op.group or '-'}"]
    parts += [shape.describe() for shape in op.gemm]
    parts += [regex_string(p) for p in op.patterns]
    if op.fallback:
        parts.append("fallback")
    return ", ".join(parts)


def _shape(shape: GemmShape) -> str:
    return shape.describe()


def _ops(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    for name, op in a.ops.items():
        if name not in b.ops:
            yield LedgerChange(f"ops.{name}", REMOVED, _op_value(op), None)
    for name, op in b.ops.items():
        if name not in a.ops:
            yield LedgerChange(f"ops.{name}", ADDED, None, _op_value(op))
    for name, before in a.ops.items():
        after = b.ops.get(name)
        if after is None or after == before:
            continue
        key = f"ops.{name}"
        yield from _value(f"{key}.group", before.group, after.group)
        yield from _items(f"{key}.patterns", map(regex_string, before.patterns), map(regex_string, after.patterns))
        yield from _items(f"{key}.gemm", map(_shape, before.gemm), map(_shape, after.gemm))
        yield from _value(f"{key}.fallback", before.fallback, after.fallback, lambda v: str(v).lower())
        yield from _value(f"{key}.description", before.description, after.description, _one_line)
    yield from _op_order(a, b)


def _op_order(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    """Ops both ledgers declare whose match priority (declaration order) changed: the ops
    outside the longest run of ops kept in the same order."""
    common_a = [n for n in a.ops if n in b.ops]
    common_b = [n for n in b.ops if n in a.ops]
    kept: set[str] = set()
    for block in SequenceMatcher(a=common_a, b=common_b, autojunk=False).get_matching_blocks():
        kept.update(common_a[block.a:block.a + block.size])
    order_a, order_b = list(a.ops), list(b.ops)
    for name in common_b:
        if name not in kept:
            yield LedgerChange(
                f"ops.{name}", MOVED,
                f"match priority {order_a.index(name) + 1}", f"match priority {order_b.index(name) + 1}",
            )


def _keys_of_both(a: dict, b: dict) -> list:
    """The keys of `a` in its order, then those only `b` has: every key once, in file order."""
    return [*a, *(key for key in b if key not in a)]


def _anchors(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    before = {anchor.op: anchor for anchor in a.anchors}
    after = {anchor.op: anchor for anchor in b.anchors}
    for op in _keys_of_both(before, after):
        key = f"anchors.{op}"
        x, y = before.get(op), after.get(op)
        if x is None or y is None:
            yield from _value(key, x and _anchor_value(x), y and _anchor_value(y))
            continue
        if (x.expected, x.formula) != (y.expected, y.formula):
            yield LedgerChange(key, CHANGED, _anchor_value(x), _anchor_value(y))
        yield from _value(f"{key}.hint_low", x.hint_low, y.hint_low)
        yield from _value(f"{key}.hint_high", x.hint_high, y.hint_high)


def _range(r: Range | None) -> str:
    return "not checked" if r is None else r.describe()


def _total(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("total", a.total, b.total, _range)
    yield from _value("total.hint_low", a.total_hint_low, b.total_hint_low)
    yield from _value("total.hint_high", a.total_hint_high, b.total_hint_high)


def _gaps(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("gaps.threshold_us", a.gap_threshold_ns, b.gap_threshold_ns, _us)
    ea, eb = a.step_entry_gaps, b.step_entry_gaps
    yield from _value("gaps.step_entry_per_launch", ea and ea.per_launch, eb and eb.per_launch)
    yield from _value("gaps.step_entry_max_us", ea and ea.max_ns, eb and eb.max_ns, _us)


def _h2d(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("h2d.per_step", a.h2d.per_step, b.h2d.per_step, _range)
    yield from _value("h2d.max_bytes", a.h2d.max_bytes, b.h2d.max_bytes)
    yield from _value("h2d.pageable_allowed", a.h2d.pageable_allowed, b.h2d.pageable_allowed,
                      lambda v: str(v).lower())


def _graphs(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("graphs.launches_per_step", a.graph_launches_per_step, b.graph_launches_per_step, _range)


def _ranks(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("ranks.max_imbalance_pct", a.rank_imbalance_pct, b.rank_imbalance_pct, lambda v: f"{v:g}%")


def _layers(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    yield from _value("layers.regex", a.layer_regex, b.layer_regex, regex_string)
    yield from _value("layers.opening_op", a.layer_opening_op, b.layer_opening_op)
    ra, rb = a.layer_rule, b.layer_rule
    for name in ("first_opening_op", "opening_followed_by", "closing_op"):
        yield from _value(f"layers.{name}", getattr(ra, name), getattr(rb, name))
    yield from _value("layers.uniform", ra.uniform, rb.uniform, lambda v: str(v).lower())
    for module in _keys_of_both(ra.modules, rb.modules):
        yield from _value(f"layers.modules.{module}", ra.modules.get(module), rb.modules.get(module), "/".join)
    yield from _layer_classes(a, b)


def _layer_classes(a: Expectations, b: Expectations) -> Iterator[LedgerChange]:
    before = {c.name: c for c in a.layer_classes}
    after = {c.name: c for c in b.layer_classes}
    for name in _keys_of_both(before, after):
        key = f"layers.classes.{name}"
        x, y = before.get(name), after.get(name)
        if x is None or y is None:
            yield from _value(key, x and _layers_value(x), y and _layers_value(y))
            continue
        if x.layers != y.layers:
            yield LedgerChange(f"{key}.layers", CHANGED, _layers_value(x), _layers_value(y))
        for group in _keys_of_both(x.groups, y.groups):
            yield from _value(f"{key}.groups.{group}", x.groups.get(group), y.groups.get(group), _range)
        yield from _sequence(f"{key}.sequence", x.sequence, y.sequence)
        yield from _value(f"{key}.insert_before", x.insert_before, y.insert_before)


def _sequence(key: str, before: tuple, after: tuple) -> Iterator[LedgerChange]:
    """The entries of a layer sequence that were removed and added, each with its 1-based
    place (in the old sequence for a removed one, in the new for an added one): the order is
    the content, so a moved entry shows as removed here and added there."""
    a, b = [e.text() for e in before], [e.text() for e in after]
    matcher = SequenceMatcher(a=a, b=b, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            for i in range(i1, i2):
                yield LedgerChange(key, REMOVED, f"{a[i]} (entry {i + 1})", None)
        if tag in ("insert", "replace"):
            for j in range(j1, j2):
                yield LedgerChange(key, ADDED, None, f"{b[j]} (entry {j + 1})")
