"""Building an expectations TOML text: value formatting and a document with comments.

The counterpart of `reading.LedgerReader`: every section writer
(`nsys_ledger.ledger.sections`) adds its table through one `LedgerWriter`, which

- formats values the way a person writes a ledger: regexes as TOML literal strings
  (``'deep_ep::'``, so backslashes stay single), formulas and names as basic strings,
  descriptions with line breaks as ``\"\"\"`` blocks, ranges compactly (``3``, ``"7-9"``);
- puts back the file's own form of a value where the ledger kept one (`Expectations.written`:
  ``moe_layers = "layers - dense_layers"`` rather than ``75``), as long as that form still
  reads as the model's value (a model changed in code gets its new numbers, not a stale formula);
- writes the comment attached to a key (`Expectations.comments`) after its value, or above
  a table header.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.formula import Number
from nsys_ledger.ledger.model import Range
from nsys_ledger.ledger.reading import LedgerReader

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")  # fullmatch: `$` would let a trailing newline through
_PLAIN_DECIMAL = re.compile(r"\d+(?:\.\d+)?")  # what the reader's "a-b" range form accepts
_BASIC_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
WIDTH = 100  # an array longer than this is written one item per line


def _is_control(c: str) -> bool:
    return (ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F


def key_text(name: str) -> str:
    """A TOML key: bare where TOML allows it, else quoted."""
    return name if _BARE_KEY.fullmatch(name) else basic_string(name)


def basic_string(text: str) -> str:
    """``"..."`` with TOML's escapes."""
    out = []
    for c in text:
        if c in _BASIC_ESCAPES:
            out.append(_BASIC_ESCAPES[c])
        elif _is_control(c):
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def multiline_string(text: str) -> str:
    """A ``\"\"\"`` block for text with line breaks (a description); reads back to `text`."""
    out = []
    for i, c in enumerate(text):
        if c == "\n":
            out.append(c)
        elif c == '"':
            # only a quote that could start a closing \"\"\" needs its backslash
            closing = i + 1 == len(text) or text[i + 1] == '"'
            out.append('\\"' if closing else c)
        elif c in _BASIC_ESCAPES:
            out.append(_BASIC_ESCAPES[c])
        elif _is_control(c):
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    # TOML drops a line break right after the opening quotes: start with one so the text
    # begins on its own line.
    return '"""\n' + "".join(out) + '"""'


def regex_string(pattern: str) -> str:
    """A regex as a literal string, so it reads as written: ``'deep_ep::\\w+'``, or
    ``'''...'''`` when it holds a single quote; a basic string when neither can hold it."""
    if any(_is_control(c) for c in pattern) or "\n" in pattern:
        return basic_string(pattern)
    if "'" not in pattern:
        return f"'{pattern}'"
    # A ''' string cannot hold ''' and is ambiguous when the text ends with a quote.
    if "'''" not in pattern and not pattern.endswith("'"):
        return f"'''{pattern}'''"
    return basic_string(pattern)


def number_text(value: Number) -> str:
    if isinstance(value, bool):
        raise TypeError("a boolean is not a number")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written to a ledger")
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def value_text(value: Any) -> str:
    """Any TOML value a ledger holds: strings as basic strings, arrays and inline tables inline."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return number_text(value)
    if isinstance(value, str):
        return multiline_string(value) if "\n" in value else basic_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{key_text(k)} = {value_text(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to a ledger")


class Literal(str):
    """Text that is already TOML (a regex literal, an array of them): written as it is."""


def toml_text(value: Any) -> str:
    return str(value) if isinstance(value, Literal) else value_text(value)


def regex_array(patterns: tuple[str, ...] | list[str]) -> Literal:
    """``['a', 'b']`` on one line, or one pattern per line when that is too long."""
    items = [regex_string(p) for p in patterns]
    one_line = "[" + ", ".join(items) + "]"
    if len(one_line) <= WIDTH:
        return Literal(one_line)
    return Literal("[\n" + "".join(f"  {item},\n" for item in items) + "]")


def range_value(r: Range) -> Any:
    """A range as a RANGE value, compactly: ``3``, ``"7-9"``, ``{ min = 1 }``, ``[0.5, 2.5]``."""
    if r.low is not None and r.high is not None:
        if r.low == r.high:
            return r.low
        low, high = number_text(r.low), number_text(r.high)
        if _PLAIN_DECIMAL.fullmatch(low) and _PLAIN_DECIMAL.fullmatch(high):
            return f"{low}-{high}"
        return [r.low, r.high]
    bounds = {}
    if r.low is not None:
        bounds["min"] = r.low
    if r.high is not None:
        bounds["max"] = r.high
    return bounds


class LedgerWriter:
    """The TOML text of one ledger, built table by table."""

    def __init__(self, params: dict[str, Number] | None = None, written: dict[str, object] | None = None,
                 comments: dict[str, str] | None = None):
        self.written = dict(written or {})
        self.comments = dict(comments or {})
        # Reads candidate forms back (over the ledger's parameters) to see that they still
        # mean the model's value.
        self.reader = LedgerReader("<ledger being written>", params=params)
        self._lines: list[str] = []

    def reads_as(self, raw: Any, read: Callable[[Any], Any], evaluated: Any) -> bool:
        """Whether `read(raw)` (a section reader's function) gives `evaluated`."""
        try:
            return read(raw) == evaluated
        except ExpectationsError:
            return False

    def as_written(self, key: str, evaluated: Any, read: Callable[[Any], Any], plain: Any) -> Any:
        """The file's own form of `key` where the ledger kept one that `read` still turns into
        `evaluated`; else `plain`, the value written from the model's numbers."""
        if key in self.written and self.reads_as(self.written[key], read, evaluated):
            return self.written[key]
        return plain

    def has(self, key: str) -> bool:
        """Whether the ledger kept a written form or a comment for `key` (then it is written
        even where its value is the default)."""
        return key in self.written or key in self.comments

    def commented(self, table: str) -> bool:
        """Whether a comment is attached to `table` or to a key in it (then the table is
        written even where it holds only defaults, so the comment has a place)."""
        return any(key == table or key.startswith(f"{table}.") for key in self.comments)

    def comment_lines(self, text: str) -> None:
        for line in text.splitlines() or [""]:
            self._lines.append(f"# {line}".rstrip())

    def table(self, key: str) -> None:
        """``[key]`` after a blank line, with the comment of `key` above it."""
        if self._lines:
            self._lines.append("")
        if key in self.comments:
            self.comment_lines(self.comments[key])
        self._lines.append(f"[{'.'.join(key_text(part) for part in key.split('.'))}]")

    def value(self, table: str, name: str, value: Any) -> None:
        """``name = value`` in the current table, with the comment of ``table.name`` after it
        (above it when the comment or the value takes several lines)."""
        text = f"{key_text(name)} = {toml_text(value)}"
        comment = self.comments.get(f"{table}.{name}")
        if comment is None:
            self._lines.append(text)
        elif "\n" in comment or "\n" in text:
            self.comment_lines(comment)
            self._lines.append(text)
        else:
            self._lines.append(f"{text}  # {comment}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"
