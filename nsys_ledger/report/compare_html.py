"""`nsys-ledger compare` as one self-contained HTML page (html_kit: escaped text, sortable
tables, nothing loaded from the network; no chart, so no plotly.js in the page)."""

from __future__ import annotations

import re
from pathlib import Path

from nsys_ledger.compare import Comparison
from nsys_ledger.report.compare_text import headline, sections, side_lines
from nsys_ledger.report.html_kit import Cell, esc, note, page, table

# a formatted figure ("2,077", "+389.70 µs", "28.70 ms", "–") back to a number to sort by
_NUMBER = re.compile(r"^([+-]?[\d,]+(?:\.\d+)?)(?: (ns|µs|ms|s))?$")
_NS_PER = {None: 1, "ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}


def render_compare_html(comparison: Comparison) -> str:
    sides = "".join(f"<div class=\"sub\">{esc(line)}</div>" for line in side_lines(comparison))
    parts = [
        f'<header class="banner summary" id="headline"><h1>{esc(headline(comparison))}</h1>{sides}</header>',
        "<main>",
        note(comparison.steady_rule + "; deltas are B - A"),
        *(note(n) for n in comparison.notes),
    ]
    for index, section in enumerate(sections(comparison, layer_detail=True)):
        parts.append(f'<h2 id="section-{index}">{esc(section.title)}</h2>')
        if section.rows:
            parts.append(table(list(section.header), [[_sortable(cell) for cell in row] for row in section.rows]))
        if section.note:
            parts.append(note(section.note))
    parts.append("</main>")
    return page("nsys-ledger compare", "".join(parts))


def _sortable(text: str) -> Cell | str:
    """A figure cell sorts by its value in ns (or as a count), not as text; other cells as text."""
    match = _NUMBER.match(text)
    if not match:
        return text
    return Cell(text, float(match[1].replace(",", "")) * _NS_PER[match[2]])


def write_compare_html(comparison: Comparison, path: str | Path) -> None:
    Path(path).write_text(render_compare_html(comparison), encoding="utf-8")
