"""Typed access to a parsed expectations TOML, with errors that name the key and its line.

Every section reader (`nsys_ledger.ledger.sections`) reads its table through one
`LedgerReader`, so all of them fail the same way: `ExpectationsError(path, problem)`, the
problem starting with the dotted key at fault and, where the key can be found in the text,
its line (``anchors.rmsnorm.expected (line 17): unknown name 'layer' ...``).

The reader also keeps `written`: the raw TOML value of each number, range or layer list a
section read (formulas included), so the writer can put the file's own forms back.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.safety import regex_problem
from nsys_ledger.ledger.formula import FormulaError, Number, evaluate
from nsys_ledger.ledger.model import Range

NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")  # op, group and class names
RANGE_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*$")  # "7-9"
_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
# Constructs Python's re accepts and polars' Rust regex does not.
_UNPORTABLE = (
    (re.compile(r"(?<!\\)\(\?<?[=!]"), "look-around (?=, (?!, (?<=, (?<!"),
    (re.compile(r"(?<!\\)\\[1-9]"), "a back-reference (\\1)"),
    (re.compile(r"(?<!\\)\(\?P="), "a named back-reference (?P=...)"),
    (re.compile(r"(?<!\\)\(\?>"), "an atomic group (?>...)"),
)
_TOML_TYPES = {
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    str: "a string",
    list: "an array",
    dict: "a table",
}


def type_name(value: object) -> str:
    """How a TOML value's type is named in messages: ``an integer``, ``a table``."""
    return _TOML_TYPES.get(type(value), f"a {type(value).__name__}")


def shown(value: Any) -> str:
    """A raw TOML value as messages and `Anchor.formula` show it: ``2 * layers``, ``[1, dense]``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {shown(v)}" for k, v in value.items()) + "}"
    return str(value)


def short_list(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


class LedgerReader:
    """One expectations file being read: its path and text (for line numbers), the evaluated
    parameters (set by the [params] reader, used by every formula after it) and the raw
    values read so far (`written`)."""

    def __init__(self, path: str, text: str = "", params: dict[str, Number] | None = None):
        self.path = path
        self.lines = text.splitlines()
        self.params: dict[str, Number] = dict(params or {})
        self.written: dict[str, object] = {}
        self._tables = self._index_tables()

    # ---- errors and key locations -------------------------------------------------------

    def _index_tables(self) -> dict[tuple[str, ...], tuple[int, int]]:
        """Header path -> (first line index, end line index) of each table in the text."""
        spans: dict[tuple[str, ...], tuple[int, int]] = {}
        current: tuple[str, ...] = ()
        start = 0
        for i, line in enumerate(self.lines):
            m = _HEADER.match(line)
            if m:
                spans.setdefault(current, (start, i))
                current = tuple(part.strip().strip("\"'") for part in m.group(1).split("."))
                start = i
        spans.setdefault(current, (start, len(self.lines)))
        return spans

    def line_of(self, key: str) -> int | None:
        """Best effort: the 1-based line where `key` (dotted) is written, or its table's."""
        segs = key.split(".")
        for i in range(len(segs), -1, -1):
            head = tuple(segs[:i])
            if head not in self._tables:
                continue
            start, end = self._tables[head]
            if i == len(segs):
                return start + 1 if head else None
            rest = segs[i:]
            for j in range(len(rest), 0, -1):
                dotted = r"\s*\.\s*".join(rf"[\"']?{re.escape(s)}[\"']?" for s in rest[:j])
                pattern = re.compile(rf"^\s*{dotted}\s*[=.]")
                for ln in range(start + (1 if head else 0), end):
                    if pattern.match(self.lines[ln]):
                        return ln + 1
            return start + 1 if head else None
        return None

    def fail(self, key: str, problem: str) -> ExpectationsError:
        line = self.line_of(key) if key else None
        where = f"{key} (line {line})" if line else key
        return ExpectationsError(self.path, f"{where}: {problem}" if where else problem)

    # ---- raw values kept for the writer ---------------------------------------------------

    def keep(self, key: str, raw: object) -> None:
        """Remember `raw` as the file wrote the value of `key` (see `Expectations.written`)."""
        self.written[key] = raw

    # ---- typed access -------------------------------------------------------------------

    def table(self, parent: dict[str, Any], name: str, key: str, required: bool = False) -> dict[str, Any] | None:
        if name not in parent:
            if required:
                raise self.fail(key, f"missing required table [{key}]")
            return None
        value = parent[name]
        if not isinstance(value, dict):
            raise self.fail(key, f"wrong type: expected a table, got {type_name(value)}")
        return value

    def known(self, table: dict[str, Any], key: str, allowed: Iterable[str]) -> None:
        allowed = tuple(allowed)
        for name in table:
            if name not in allowed:
                where = f"[{key}]" if key else "the top level"
                raise self.fail(
                    f"{key}.{name}" if key else name,
                    f"unknown key {name!r} in {where} (known: {', '.join(allowed)})",
                )

    def get(self, table: dict[str, Any], name: str, key: str, kind: type | tuple[type, ...],
            required: bool = False, default: Any = None) -> Any:
        full = f"{key}.{name}"
        if name not in table:
            if required:
                raise self.fail(full, f"missing required key {name!r} in [{key}]")
            return default
        value = table[name]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            want = " or ".join(_TOML_TYPES.get(k, k.__name__) for k in kinds)
            raise self.fail(full, f"wrong type: expected {want}, got {type_name(value)}")
        return value

    def number(self, value: Any, key: str) -> Number:
        """A number or a formula over the parameters."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self.fail(key, f"wrong type: expected a number or a formula string, got {type_name(value)}")
        try:
            return evaluate(value, self.params)
        except FormulaError as exc:
            raise self.fail(key, exc.message) from None

    def whole(self, value: Any, key: str, low: int = 0) -> int:
        v = self.number(value, key)
        if not float(v).is_integer():
            raise self.fail(key, f"must be a whole number, got {v!r}")
        if v < low:
            raise self.fail(key, f"must be at least {low}, got {v!r}")
        return int(v)

    def regex(self, value: Any, key: str, what: str) -> str:
        """A regex that both Python's re and polars accept; polars (linear time) runs it."""
        if not isinstance(value, str):
            raise self.fail(key, f"wrong type: expected a regex string, got {type_name(value)}")
        if value == "":
            raise self.fail(key, f"{what}: an empty regex matches everything")
        try:
            re.compile(value)
        except re.error as exc:
            raise self.fail(key, f"{what}: invalid regex {value!r}: {exc}") from None
        for probe, name in _UNPORTABLE:
            if probe.search(value):
                raise self.fail(
                    key, f"{what}: regex {value!r} uses {name}, which polars' regex engine does not support"
                )
        problem = regex_problem(value)
        if problem:
            raise self.fail(key, f"{what}: {problem}")
        return value

    def make_range(self, low: Number | None, high: Number | None, key: str) -> Range:
        if low is not None and high is not None and low > high:
            raise self.fail(key, f"contradictory range: min {low:g} > max {high:g}")
        for bound in (low, high):
            if bound is not None and bound < 0:
                raise self.fail(key, f"a count cannot be negative (got {bound:g})")
        return Range(low, high)

    def range_value(self, value: Any, key: str) -> Range:
        """RANGE: number, formula, "a-b", [low, high] or {min, max}."""
        if isinstance(value, str):
            m = RANGE_TEXT.match(value)
            if m:
                return self.make_range(evaluate(m.group(1)), evaluate(m.group(2)), key)
            v = self.number(value, key)
            return self.make_range(v, v, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            v = self.number(value, key)
            return self.make_range(v, v, key)
        if isinstance(value, list):
            if len(value) != 2:
                raise self.fail(key, f"a range array needs exactly 2 items [low, high], got {len(value)}")
            return self.make_range(self.number(value[0], key), self.number(value[1], key), key)
        if isinstance(value, dict):
            self.known(value, key, ("min", "max"))
            if not value:
                raise self.fail(key, "a range table needs min or max")
            low = self.number(value["min"], f"{key}.min") if "min" in value else None
            high = self.number(value["max"], f"{key}.max") if "max" in value else None
            return self.make_range(low, high, key)
        raise self.fail(
            key,
            f"wrong type: expected a number, a formula, \"a-b\", [low, high] or {{min, max}}, got {type_name(value)}",
        )
