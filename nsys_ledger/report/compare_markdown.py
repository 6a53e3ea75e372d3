"""`nsys-ledger compare` as Markdown, for a pull-request comment or a CI step summary: the
headline, the two traces, then the shared tables of report/compare_text.py. Text from the
traces is escaped (report/markdown.py's `md`)."""

from __future__ import annotations

from pathlib import Path

from nsys_ledger.compare import Comparison
from nsys_ledger.report.compare_text import headline, sections, side_lines
from nsys_ledger.report.markdown import md


def render_compare_markdown(comparison: Comparison) -> str:
    lines = [f"### nsys-ledger compare: {md(headline(comparison))}", ""]
    lines += [f"- {md(line)}" for line in side_lines(comparison)]
    lines += [f"- {md(comparison.steady_rule)}; deltas are B - A"]
    lines += [f"- note: {md(n)}" for n in comparison.notes]
    for section in sections(comparison):
        lines += ["", f"**{md(section.title)}**", ""]
        if section.rows:
            lines.append("| " + " | ".join(md(h) for h in section.header) + " |")
            lines.append("|" + "---|" * len(section.header))
            lines += ["| " + " | ".join(md(cell) for cell in row) + " |" for row in section.rows]
        if section.note:
            lines += ["", md(section.note)]
    return "\n".join(lines).rstrip() + "\n"


def write_compare_markdown(comparison: Comparison, path: str | Path) -> None:
    Path(path).write_text(render_compare_markdown(comparison), encoding="utf-8")
