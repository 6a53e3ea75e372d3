"""Fit terminal text to the terminal's width: prose wraps at word boundaries under its label,
tables either split into column blocks (numbers) or wrap inside their cells (text).

The width is the terminal's (`COLUMNS` wins, as everywhere in the shell); output that goes to
a file or a CI log is laid out for 100 columns. Text may carry click's ANSI styles: every width
is measured on the unstyled text.
"""

from __future__ import annotations

import re
import shutil
import textwrap

import click

DEFAULT_WIDTH = 100  # a CI log or a file: no terminal to ask
MIN_WIDTH = 40  # narrower than this nothing reads well; lay out for 40 and let it wrap
COLUMN_GAP = "  "
TABLE_INDENT = "  "
MIN_TEXT_COLUMN = 8  # a text column is never squeezed below this many characters

# Where the continuation of a wrapped line starts: under the text after a label such as
# "steps     ", "  - ", "    hint: " or "          fallback    ".
_HANGING = re.compile(r"^( *(?:- |hint: |[A-Za-z0-9_]+(?: [A-Za-z0-9_]+)?  +)?)")


def terminal_width() -> int:
    """The width to lay out for: COLUMNS, else the terminal's, else 100 (not a terminal)."""
    return max(MIN_WIDTH, shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns)


def visible_len(text: str) -> int:
    return len(click.unstyle(text))


def fit_lines(lines: list[str], width: int) -> list[str]:
    """Every line at most `width` columns: longer ones wrap under their label."""
    out: list[str] = []
    for line in lines:
        out += [line] if visible_len(line) <= width else wrap_line(line, width)
    return out


def wrap_line(line: str, width: int) -> list[str]:
    """`line` wrapped at spaces; continuation lines start under the text after its label."""
    plain = click.unstyle(line)
    hanging = len(_HANGING.match(plain).group(1))
    if hanging > width // 2:
        hanging = len(plain) - len(plain.lstrip(" "))
    indent = " " * max(min(hanging, width // 2), 2)
    # textwrap counts the characters of ANSI styles too: a styled line may break early, never late.
    return textwrap.wrap(line, width=width, subsequent_indent=indent, break_on_hyphens=False,
                         drop_whitespace=True) or [""]


def fit_table(rows: list[tuple[str, ...]], width: int, *, keys: int = 1, wrap: tuple[int, ...] = ()) -> list[str]:
    """Rows of cells (the first row the header, in bold) laid out in at most `width` columns.

    Too wide, the table either wraps the text of the columns in `wrap` inside their cells (for
    tables of sentences), or, with no `wrap`, repeats the first `keys` columns and shows the
    others in blocks one under the other (for tables of numbers, whose cells must stay whole).
    """
    widths = _natural_widths(rows)
    if _table_width(widths) <= width:
        return _render(rows, widths)
    if wrap:
        return _render_wrapped(rows, _shrink(rows, widths, wrap, width))
    return _render_blocks(rows, widths, keys, width)


def _natural_widths(rows: list[tuple[str, ...]]) -> list[int]:
    return [max(visible_len(row[i]) for row in rows) for i in range(len(rows[0]))]


def _table_width(widths: list[int]) -> int:
    return len(TABLE_INDENT) + sum(widths) + len(COLUMN_GAP) * (len(widths) - 1)


def _render(rows: list[tuple[str, ...]], widths: list[int]) -> list[str]:
    out = []
    for index, row in enumerate(rows):
        cells = [cell + " " * (widths[i] - visible_len(cell)) for i, cell in enumerate(row)]
        line = (TABLE_INDENT + COLUMN_GAP.join(cells)).rstrip()
        out.append(click.style(line, bold=True) if index == 0 else line)
    return out


def _shrink(rows: list[tuple[str, ...]], widths: list[int], wrap: tuple[int, ...], width: int) -> list[int]:
    """Narrow the wrappable columns one character at a time until the table fits, each time the
    column where the fewest cells would wrap (the widest on a tie): one long cell wraps, not all."""
    widths = list(widths)
    lengths = [[visible_len(row[i]) for row in rows[1:]] for i in range(len(widths))]
    while _table_width(widths) > width:
        candidates = [i for i in wrap if widths[i] > MIN_TEXT_COLUMN]
        if not candidates:
            break
        cheapest = min(candidates, key=lambda i: (sum(n > widths[i] - 1 for n in lengths[i]), -widths[i]))
        widths[cheapest] -= 1
    return widths


def _render_wrapped(rows: list[tuple[str, ...]], widths: list[int]) -> list[str]:
    out = []
    for index, row in enumerate(rows):
        columns = [
            _wrap_cell(cell, widths[i]) if visible_len(cell) > widths[i] else [cell]
            for i, cell in enumerate(row)
        ]
        for depth in range(max(len(c) for c in columns)):
            cells = [c[depth] if depth < len(c) else "" for c in columns]
            padded = [cell + " " * max(widths[i] - visible_len(cell), 0) for i, cell in enumerate(cells)]
            line = (TABLE_INDENT + COLUMN_GAP.join(padded)).rstrip()
            out.append(click.style(line, bold=True) if index == 0 else line)
    return out


def _wrap_cell(cell: str, width: int) -> list[str]:
    return textwrap.wrap(click.unstyle(cell), width=width, break_on_hyphens=False) or [""]


def _render_blocks(rows: list[tuple[str, ...]], widths: list[int], keys: int, width: int) -> list[str]:
    """The key columns, then as many of the other columns as fit; the rest in further blocks."""
    blocks: list[list[int]] = [[]]
    key_columns = list(range(keys))
    for column in range(keys, len(widths)):
        trial = key_columns + blocks[-1] + [column]
        if blocks[-1] and _table_width([widths[i] for i in trial]) > width:
            blocks.append([])
        blocks[-1].append(column)
    out: list[str] = []
    for number, block in enumerate(blocks):
        columns = key_columns + block
        if number:
            out.append("")
        block_rows = [tuple(row[i] for i in columns) for row in rows]
        block_widths = [widths[i] for i in columns]
        if _table_width(block_widths) > width:  # one column alone is too wide: wrap its cells
            text_columns = tuple(range(len(columns)))
            out += _render_wrapped(block_rows, _shrink(block_rows, block_widths, text_columns, width))
        else:
            out += _render(block_rows, block_widths)
    return out
