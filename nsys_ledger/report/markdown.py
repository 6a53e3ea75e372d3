"""A short Markdown summary of a check, for CI step summaries and pull-request comments.

The verdict as a heading, one line of trace facts, the checks as a table, the findings with
their hints, and the step time. Text from the trace is escaped: GitHub renders Markdown as
(sanitized) HTML, and a kernel name with `|` or `*` must not break the table or the emphasis.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from nsys_ledger.api import Result
from nsys_ledger.report.text import printable

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~#])")
MAX_FINDINGS = 20
STATUS_MARK = {True: "✅", False: "❌"}


def md(text: object) -> str:
    """Text that Markdown shows as written: HTML and Markdown syntax escaped, one line."""
    one_line = printable(" ".join(str(text).split()))  # an ESC or bidi override is shown, not obeyed
    return _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(one_line, quote=False))


_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def md_code(text: object) -> str:
    """Like `md`, but the names our messages quote in backticks (`deepgemm_dense`) render as code."""
    one_line = " ".join(str(text).split())
    parts = _CODE_SPAN.split(one_line)  # even indexes: prose, odd: the quoted names
    return "".join(_code(part) if index % 2 else _prose(part) for index, part in enumerate(parts))


def _prose(text: str) -> str:
    """`md` of the text between code spans, keeping the spaces that separate it from them."""
    lead = " " if text[:1].isspace() else ""
    trail = " " if text[-1:].isspace() and text.strip() else ""
    return lead + md(text) + trail


def _code(name: str) -> str:
    # inside a code span Markdown and HTML are literal; only a table's `|` still needs its escape
    return "`" + printable(name).replace("|", "\\|") + "`"


def render_markdown(result: Result) -> str:
    lines = [_heading(result), "", _facts_line(result), ""]
    if result.expectations is not None:
        lines += _checks_table(result) + [""]
    lines += _findings(result)
    lines += _notices(result)
    lines += _step_time(result)
    return "\n".join(lines).rstrip() + "\n"


def write_markdown(result: Result, path: str | Path) -> None:
    Path(path).write_text(render_markdown(result), encoding="utf-8")


_VERDICT_ICONS = {"summary": "ℹ️", "pass": "✅", "fail": "❌"}


def _heading(result: Result) -> str:
    if result.verdict == "summary":  # said loudly: a CI summary without a ledger gates nothing
        return (f"### {_VERDICT_ICONS['summary']} nsys-ledger SUMMARY ONLY: no ledger checked, this job gates "
                "nothing (--expect FILE checks one)")
    return f"### {_VERDICT_ICONS[result.verdict]} nsys-ledger {result.verdict.upper()}: {result.verdict_sentence}"


def _facts_line(result: Result) -> str:
    trace = result.trace
    parts = [
        f"trace {md(Path(trace.path).name)}",
        f"nsys {md(trace.meta.nsys_version or 'unknown')}",
        f"{result.step_table.height} decode steps by {md(result.steps.method)}",
        f"{result.totals.kernels:,} kernels",
    ]
    if result.expectations is not None:
        parts.append(f"ledger {md(result.expectations.name)}")
    return " · ".join(parts)


def _checks_table(result: Result) -> list[str]:
    rows = ["| | check | expected | observed | failing steps |", "|---|---|---|---|---|"]
    total_steps = result.step_table.height
    for outcome in result.outcomes:
        failing = max((f.failing_steps for f in outcome.findings), default=0)
        where = "; ".join(f.steps for f in outcome.findings)
        failing_text = f"{failing}/{total_steps} ({md(where)})" if failing else ""
        rows.append(f"| {STATUS_MARK[outcome.passed]} | {md(outcome.name)} | {md(outcome.expected)} | "
                    f"{md_code(outcome.observed)} | {failing_text} |")
    return rows


def _findings(result: Result) -> list[str]:
    findings = result.findings
    if not findings:
        return []
    lines = ["**Findings**", ""]
    for finding in findings[:MAX_FINDINGS]:
        lines.append(f"- **{md(finding.source)}**: {md_code(finding.message)}")
        if finding.hint:
            lines.append(f"  - hint: {md_code(finding.hint)}")
    if len(findings) > MAX_FINDINGS:
        lines.append(f"- … {len(findings) - MAX_FINDINGS} more (all of them in the JSON and HTML reports)")
    return lines + [""]


def _notices(result: Result) -> list[str]:
    return [f"> **notice** {md(text)}" for text in result.notices] + ([""] if result.notices else [])


def _step_time(result: Result) -> list[str]:
    durations = result.step_table["duration_ns"].drop_nulls() if result.step_table.height else None
    if durations is None or durations.len() == 0:
        return []
    kernels = result.step_table["kernels"]
    return [
        f"Step time: median {durations.median() / 1e6:.3f} ms, p90 {durations.quantile(0.9) / 1e6:.3f} ms · "
        f"kernels per step: median {kernels.median():g} (min {kernels.min()}, max {kernels.max()})"
    ]
