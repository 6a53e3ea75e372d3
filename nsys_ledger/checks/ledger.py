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
    check: str  # "anchor", "total", "h2d", "h2d_pageable", "h2d_bytes", "graph_launches", "gaps", "steps", "capture"
    subject: str  # what was checked: the op name for anchors, else the check name
    source: str  # the expectations key, e.g. "anchors.fused_add_rmsnorm"
    message: str  # one line, complete on its own
    steps: str  # failing steps, compact: "0-7", "rank 1: 2, 5"
    failing_steps: int
    observed: str  # "312" or "157-160"
    expected: str  # "156"
    hint: str | None = None


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
        f"rank {rank}: {compact_ranges(steps.to_list())}" for rank, steps in by_rank.iter_rows()
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
) -> list[Finding]:
    """Steps whose `column` lies outside `expected`: one finding for those too low, one for too high."""
    low = expected.low if expected.low is not None else float("-inf")
    high = expected.high if expected.high is not None else float("inf")
    total_steps = table.height
    expected_text = expected.describe() + (f" (= {formula})" if formula and formula != expected.describe() else "")
    findings = []
    for side, condition, hint in (
        ("too few", pl.col(column) < low, hint_low),
        ("too many", pl.col(column) > high, hint_high),
    ):
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
    gaps: pl.DataFrame,
    *,
    step_method: str,
    gap_threshold_ns: int,
) -> list[CheckOutcome]:
    """Run every per-step check the expectations declare."""
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

    h2d = expectations.h2d
    h2d_findings = range_check(
        steps_table, "h2d", h2d.per_step, check="h2d", subject="h2d", source=h2d.source,
        what="host-to-device copies",
        hint_high="each extra H2D copy adds its latency to every decode step; it usually sits next to a graph break",
    )
    if not h2d.pageable_allowed:
        h2d_findings += range_check(
            steps_table, "h2d_pageable", Range(0, 0), check="h2d_pageable", subject="h2d_pageable",
            source=f"{h2d.source}.pageable_allowed", what="pageable host-to-device copies",
            hint_high="a pageable source blocks the host until the copy is staged: pin the buffer",
        )
    if h2d.max_bytes is not None:
        h2d_findings += range_check(
            steps_table.with_columns(pl.col("h2d_max_bytes").fill_null(0)), "h2d_max_bytes",
            Range(None, h2d.max_bytes), check="h2d_bytes", subject="h2d_bytes", source=f"{h2d.source}.max_bytes",
            what="largest host-to-device copy (bytes)",
        )
    outcomes.append(_outcome("H2D copies per step", h2d.source, h2d.per_step, steps_table["h2d"], h2d_findings))

    if expectations.graph_launches_per_step is not None and step_method == "graph":
        launches = range_check(
            steps_table, "graph_launches", expectations.graph_launches_per_step, check="graph_launches",
            subject="graph_launches", source="graphs.launches_per_step", what="CUDA graph launches",
            hint_high="the decode graph is split: each extra replay is a graph break with host work between",
            hint_low="no graph replay in the step: the step ran eagerly",
        )
        outcomes.append(
            _outcome("graph launches per step", "graphs.launches_per_step",
                     expectations.graph_launches_per_step, steps_table["graph_launches"], launches)
        )

    gap_findings = _gap_findings(steps_table, gaps, gap_threshold_ns)
    outcomes.append(
        _outcome(f"gaps above {gap_threshold_ns / 1000:g} us", "gaps.threshold_us", Range(0, 0),
                 steps_table["gaps"], gap_findings)
    )
    return outcomes


def _outcome(name: str, source: str, expected: Range, values: pl.Series, findings: list[Finding]) -> CheckOutcome:
    observed = _describe_values(values) if len(values) else "-"
    return CheckOutcome(name, source, expected.describe(), observed, tuple(findings))


def _gap_findings(steps_table: pl.DataFrame, gaps: pl.DataFrame, threshold_ns: int) -> list[Finding]:
    if gaps.height == 0:
        return []
    failing = steps_table.filter(pl.col("gaps") > 0)
    worst = gaps.sort("duration", descending=True).row(0, named=True)
    steps_text = describe_steps(failing)
    observed = _describe_values(failing["gaps"])
    message = (
        f"idle gaps above {threshold_ns / 1000:g} us: {observed} per step in {failing.height} of "
        f"{steps_table.height} steps (steps {steps_text}); the largest is {worst['duration'] / 1000:.1f} us "
        f"in step {worst['step']} after {short_kernel_name(worst['before'])} before "
        f"{short_kernel_name(worst['after'])}"
    )
    return [
        Finding(
            check="gaps", subject="gaps", source="gaps.threshold_us", message=message, steps=steps_text,
            failing_steps=failing.height, observed=observed, expected="0",
            hint="the GPU waited: host preparing metadata, a graph break, or a collective waiting for its peers",
        )
    ]


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
