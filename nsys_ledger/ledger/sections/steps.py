"""[steps]: how decode steps are found (method, NVTX range, marker kernel) and which are not decode."""

from __future__ import annotations

from typing import Any

from nsys_ledger.ledger.model import Expectations, OpDef, StepRule
from nsys_ledger.ledger.reading import LedgerReader, short_list, type_name
from nsys_ledger.ledger.writing import LedgerWriter, Literal, regex_string

STEP_METHODS = ("auto", "nvtx", "graph", "marker", "capture")
STEP_KEYS = ("method", "nvtx", "marker", "marker_op", "exclude_nvtx", "exclude_ops")
DEFAULT_STEP_RULE = StepRule("auto", None, None, None, ())  # no [steps]


def read_steps(reader: LedgerReader, doc: dict[str, Any], ops: dict[str, OpDef]) -> StepRule:
    table = reader.table(doc, "steps", "steps")
    if table is None:
        return DEFAULT_STEP_RULE
    reader.known(table, "steps", STEP_KEYS)
    method = reader.get(table, "method", "steps", str, default="auto")
    if method not in STEP_METHODS:
        raise reader.fail("steps.method", f"unknown method {method!r} (one of {', '.join(STEP_METHODS)})")
    nvtx = table.get("nvtx")
    if nvtx is not None:
        reader.regex(nvtx, "steps.nvtx", "step NVTX")
    marker = table.get("marker")
    if marker is not None:
        reader.regex(marker, "steps.marker", "step marker")
    marker_op = reader.get(table, "marker_op", "steps", str)
    if marker_op is not None:
        if marker is not None:
            raise reader.fail("steps.marker_op", "give marker or marker_op, not both")
        if marker_op not in ops:
            raise reader.fail("steps.marker_op", f"unknown op {marker_op!r} (ops: {short_list(ops)})")
        if not ops[marker_op].patterns:
            raise reader.fail("steps.marker_op", f"op {marker_op!r} has no patterns to find its kernels by name")
        marker = ops[marker_op].regex
    exclude_nvtx = table.get("exclude_nvtx")
    if exclude_nvtx is not None:
        reader.regex(exclude_nvtx, "steps.exclude_nvtx", "excluded NVTX")
    exclude_ops = reader.get(table, "exclude_ops", "steps", list, default=[])
    for op in exclude_ops:
        if not isinstance(op, str):
            raise reader.fail("steps.exclude_ops", f"wrong type: expected op names, got {type_name(op)}")
        if op not in ops:
            raise reader.fail("steps.exclude_ops", f"unknown op {op!r} (ops: {short_list(ops)})")
    if method == "nvtx" and nvtx is None:
        raise reader.fail("steps.nvtx", "missing required key 'nvtx' for method = \"nvtx\"")
    if method == "marker" and marker is None:
        raise reader.fail("steps.marker", "missing required key 'marker' (or marker_op) for method = \"marker\"")
    return StepRule(method, nvtx, marker, exclude_nvtx, tuple(exclude_ops), marker_op=marker_op)


def write_steps(out: LedgerWriter, exp: Expectations) -> None:
    rule = exp.steps
    if rule == DEFAULT_STEP_RULE and not out.commented("steps"):
        return
    out.table("steps")
    out.value("steps", "method", rule.method)
    if rule.nvtx_regex is not None:
        out.value("steps", "nvtx", Literal(regex_string(rule.nvtx_regex)))
    # marker_op names the op whose patterns are the marker; write it while they still are
    if rule.marker_op is not None and rule.marker_op in exp.ops and exp.ops[rule.marker_op].regex == rule.marker_regex:
        out.value("steps", "marker_op", rule.marker_op)
    elif rule.marker_regex is not None:
        out.value("steps", "marker", Literal(regex_string(rule.marker_regex)))
    if rule.exclude_nvtx_regex is not None:
        out.value("steps", "exclude_nvtx", Literal(regex_string(rule.exclude_nvtx_regex)))
    if rule.exclude_ops:
        out.value("steps", "exclude_ops", list(rule.exclude_ops))
