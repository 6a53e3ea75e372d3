"""Compare per-step figures with the expectations; every mismatch becomes a Finding.

A finding names the check, the expectation it came from (`source`, a TOML key), the steps
where it happened, what was observed against what was expected, and the seed's diagnosis
hint where the expectations give one.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.ledger.model import Expectations, Range

STEP_KEY = ["rank", "step"]


@dataclass(frozen=True)
class Finding:
    check: str  # "anchor", "total", "h2d", "h2d_pageable", "h2d_bytes", "graph_launches", "graph_break", "gaps",
    # "rank_imbalance", "steps", "capture", "kind_total", "kind_anchor" (prefill/mixed steps: checks.step_kinds)
    subject: str  # what was checked: the op name for anchors, else the check name
    source: str  # the expectations key, e.g. "anchors.fused_add_rmsnorm"
    message: str  # one line, complete on its own
    steps: str  # failing steps, compact: "0-7", "rank 1: 2, 5"
    failing_steps: int
    observed: str  # "312" or "157-160"
    expected: str  # "156"
    hint: str | None = None
    layers: str | None = None  # per-layer checks: the layers at fault, compact ("3-77", "41")


@dataclass(frozen=True)
class CheckOutcome:
    """Each check that ran, and what it found (an empty list: it passed)."""

    name: str  # "anchor fused_add_rmsnorm", "total kernels", ...
    source: str
    expected: str
    observed: str  # the range over all decode steps, e.g. "156" or "2010-2014"
    findings: tuple[Finding, ...]

    @property
    def passed(self) -> bool:
        return not self.findings


def compact_ranges(values: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    values = sorted(set(values))
    parts: list[str] = []
    start = prev = None
    for v in values:
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            parts.append(f"{start}-{prev}" if prev != start else f"{start}")
            start = prev = v
    if start is not None:
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ", ".join(parts)


def describe_steps(failing: pl.DataFrame) -> str:
    """Step list for messages; ranks are named only when the trace has several."""
    by_rank = failing.group_by("rank", maintain_order=True).agg(pl.col("step").sort())
    if by_rank.height == 1 and by_rank["rank"][0] == 0:
        return compact_ranges(by_rank["step"][0].to_list())
    return "; ".join(
        f"rank {rank}: {compact_ranges(list(steps))}" for rank, steps in by_rank.iter_rows()
    )


def _describe_values(values: pl.Series) -> str:
    low, high = values.min(), values.max()
    return f"{low}" if low == high else f"{low}-{high}"


def range_check(
    table: pl.DataFrame,
    column: str,
    expected: Range,
    *,
    check: str,
    subject: str,
    source: str,
    what: str,
    hint_low: str | None = None,
    hint_high: str | None = None,
    formula: str | None = None,
    sides: tuple[str, ...] = ("too few", "too many"),
) -> list[Finding]:
    """Steps whose `column` lies outside `expected`: one finding for those too low, one for too
    high (only the `sides` asked for)."""
    low = expected.low if expected.low is not None else float("-inf")
    high = expected.high if expected.high is not None else float("inf")
    total_steps = table.height
    expected_text = expected.describe() + (f" (= {formula})" if formula and formula != expected.describe() else "")
    findings = []
    for side, condition, hint in (
        ("too few", pl.col(column) < low, hint_low),
        ("too many", pl.col(column) > high, hint_high),
    ):
        if side not in sides:
            continue
        failing = table.filter(condition)
        if failing.height == 0:
            continue
        observed = _describe_values(failing[column])
        steps_text = describe_steps(failing)
        message = (
            f"{what}: {observed} per step, expected {expected_text}, in {failing.height} of "
            f"{total_steps} steps (steps {steps_text}): {side}"
        )
        findings.append(
            Finding(
                check=check, subject=subject, source=source, message=message, steps=steps_text,
                failing_steps=failing.height, observed=observed, expected=expected_text, hint=hint,
            )
        )
    return findings


def check_ledger(
    expectations: Expectations,
    steps_table: pl.DataFrame,
    ops_table: pl.DataFrame,
) -> list[CheckOutcome]:
    """The per-step count checks: every anchor and the total. (H2D copies, graph launches,
    gaps and ranks are timeline checks: checks.timeline.timeline_outcomes.)"""
    outcomes: list[CheckOutcome] = []
    for anchor in expectations.anchors:
        findings = range_check(
            ops_table, anchor.op, anchor.expected, check="anchor", subject=anchor.op, source=anchor.source,
            what=f"{anchor.op} kernels", hint_low=anchor.hint_low, hint_high=anchor.hint_high,
            formula=anchor.formula,
        )
        outcomes.append(_outcome(f"anchor {anchor.op}", anchor.source, anchor.expected, ops_table[anchor.op], findings))

    total = range_check(
        steps_table, "kernels", expectations.total, check="total", subject="kernels", source="total",
        what="kernels", hint_low=expectations.total_hint_low, hint_high=expectations.total_hint_high,
    )
    outcomes.append(_outcome("total kernels per step", "total", expectations.total, steps_table["kernels"], total))
    return outcomes


def _outcome(name: str, source: str, expected: Range, values: pl.Series, findings: list[Finding]) -> CheckOutcome:
    observed = _describe_values(values) if len(values) else "-"
    return CheckOutcome(name, source, expected.describe(), observed, tuple(findings))


def short_kernel_name(name: str | None, limit: int = 60) -> str:
    """A demangled name without its argument list and template arguments, for messages."""
    if not name:
        return "?"
    base = name.removeprefix("void ").replace("(anonymous namespace)", "{anonymous}")
    depth = 0
    out = []
    for ch in base:
        if ch in "<(":
            if depth == 0 and ch == "(":
                break
            depth += 1
            continue
        if ch in ">)":
            depth = max(depth - 1, 0)
            continue
        if depth == 0:
            out.append(ch)
    short = "".join(out).strip() or name
    return short if len(short) <= limit else short[: limit - 1] + "…"
