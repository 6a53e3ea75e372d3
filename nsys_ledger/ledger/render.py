"""The evaluated ledger as text, for ``nsys-ledger expectations show FILE``."""

from __future__ import annotations

import math

from nsys_ledger.ledger.formula import Number
from nsys_ledger.ledger.model import Expectations
from nsys_ledger.ledger.sections.layers import compact_layers


def _num(x: Number | None) -> str:
    if x is None:
        return "-"
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def render_expectations(exp: Expectations) -> str:
    """The evaluated ledger as text, for ``nsys-ledger expectations show FILE``."""
    out: list[str] = []
    add = out.append
    add(f"{exp.name}  ({exp.path})")
    if exp.description:
        for line in exp.description.strip().splitlines():
            add(f"  {line.strip()}")
    add("")

    add("Parameters")
    if exp.params:
        width = max(len(k) for k in exp.params)
        for k, v in exp.params.items():
            add(f"  {k:<{width}} = {_num(v)}")
    else:
        add("  (none)")
    add("")

    add("Ops (declaration order = match priority: the first match wins)")
    width = max(len(k) for k in exp.ops)
    for i, op in enumerate(exp.ops.values(), 1):
        group = f"[{op.group}]" if op.group else "[-]"
        fallback = "  (generic fallback)" if op.fallback else ""
        add(f"  {i:>2}. {op.name:<{width}}  {group}{fallback}")
        for shape in op.gemm:
            add(f"        {shape.describe()}")
        for p in op.patterns:
            add(f"        {p}")
    add("")

    add("Anchors per step")
    if exp.anchors:
        width = max(len(a.op) for a in exp.anchors)
        fwidth = max(len(a.formula) for a in exp.anchors)
        for a in exp.anchors:
            add(f"  {a.op:<{width}}  {a.formula:<{fwidth}}  →  {a.expected.describe()}")
            if a.hint_low:
                add(f"  {'':<{width}}    too few:  {a.hint_low}")
            if a.hint_high:
                add(f"  {'':<{width}}    too many: {a.hint_high}")
    else:
        add("  (none)")
    add("")

    add(f"Total kernels per step: {exp.total.describe()}")
    if exp.total_hint_low:
        add(f"    too few:  {exp.total_hint_low}")
    if exp.total_hint_high:
        add(f"    too many: {exp.total_hint_high}")
    add("")

    s = exp.steps
    add(f"Steps: method {s.method}")
    if s.nvtx_regex:
        add(f"  NVTX range:    {s.nvtx_regex}")
    if s.marker_regex:
        add(f"  marker kernel: {s.marker_regex}")
    if s.exclude_nvtx_regex:
        add(f"  exclude NVTX:  {s.exclude_nvtx_regex}")
    if s.exclude_ops:
        add(f"  exclude steps with ops: {', '.join(s.exclude_ops)}")
    add(f"Gaps: flag idle gaps above {exp.gap_threshold_ns / 1000:g} µs between adjacent kernels")
    if exp.step_entry_gaps is not None:
        entry = exp.step_entry_gaps
        longest = f", each at most {entry.max_ns / 1000:g} µs" if entry.max_ns is not None else ""
        add(f"  allowed: {entry.per_launch} step-entry gap(s) per graph launch (cause launch){longest}")

    h = exp.h2d
    h2d = [f"{h.per_step.describe()} per step"]
    if h.max_bytes is not None:
        h2d.append(f"each at most {_bytes(h.max_bytes)}")
    h2d.append("pageable allowed" if h.pageable_allowed else "pageable not allowed")
    add(f"H2D copies: {', '.join(h2d)}")
    graphs = exp.graph_launches_per_step
    add(f"Graph launches per step: {graphs.describe() if graphs is not None else 'not checked'}")
    if exp.rank_imbalance_pct is not None:
        add(f"Ranks: busy time of the slowest rank at most {exp.rank_imbalance_pct:g}% over the least busy")
    if exp.batch is not None:
        add(f"Batch: {exp.batch}")
    add("")

    add("Layers")
    add(f"  layer regex: {exp.layer_regex or '(none)'}")
    add(f"  opening op:  {exp.layer_opening_op or '(none)'}")
    rule = exp.layer_rule
    if rule.first_opening_op:
        add(f"  layer 0 may open with: {rule.first_opening_op}")
    if rule.opening_followed_by:
        add(f"  an opening kernel is followed by {rule.opening_followed_by} before the next opening-op kernel")
    if rule.closing_op:
        add(f"  the layers end at the step's last {rule.closing_op}")
    if rule.modules:
        add("  sub-modules: " + ", ".join(f"{m} -> {'/'.join(g)}" for m, g in rule.modules.items()))
    if rule.uniform:
        add("  layers of the same classes launch the same kernels per group")
    for c in exp.layer_classes:
        add(f"  {c.name} ({len(c.layers)} layers): {compact_layers(c.layers)}")
        if c.groups:
            add("    " + ", ".join(f"{g} {r.describe()}" for g, r in c.groups.items()))
    if exp.layer_classes:
        lo = hi = 0.0
        for c in exp.layer_classes:
            for r in c.groups.values():
                lo += (r.low or 0) * len(c.layers)
                hi += (r.high if r.high is not None else math.inf) * len(c.layers)
        high = _num(hi) if math.isfinite(hi) else "any"
        add(f"  per-layer groups over all layers: {_num(lo)}-{high} kernels per step")
    return "\n".join(out) + "\n"
