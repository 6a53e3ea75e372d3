"""Read an expectations (ledger) TOML file into a validated, evaluated `Expectations`.

The layout (every table but ``[model]`` and ``[ops]`` may be left out):

```toml
[model]    name = "...", description = "..."
[params]   layers = 78, moe_layers = "layers - dense_layers"   # numbers or formulas
[steps]    method = "auto" | "nvtx" | "graph" | "marker"
           nvtx = REGEX, marker = REGEX (or marker_op = OP), exclude_nvtx = REGEX,
           exclude_ops = [OP, ...]
[ops.NAME] patterns = [REGEX, ...], group = "attention", description = "...",
           gemm = { n = F, k = F, kind = KIND } or [ {...}, ... ], fallback = BOOL
           (declaration order is match priority: the first op whose pattern or GEMM shape
           matches wins; `gemm` matches a templated GEMM by N and K among its leading integer
           arguments and by DeepGEMM's GemmType, in any layout and demangler style; KIND is
           normal (the default with a shape), masked, contiguous, batched, grouped or any;
           `fallback = true` marks a generic catch-all, reported apart in the op coverage)
[anchors.OP]  expected = RANGE, tolerance = N | tolerance_pct = P   (or min = F, max = F)
              hint_low = "...", hint_high = "..."
[total]    same keys as an anchor: kernels per step
[gaps]     threshold_us = 2, step_entry_per_launch = N, step_entry_max_us = F
           (a graph-mode step may start with N idle gaps per graph launch, each at most F µs:
           the GPU waits for the host's cudaGraphLaunch; gaps inside the replay stay findings)
[h2d]      per_step = RANGE, max_bytes = N, pageable_allowed = false
[graphs]   launches_per_step = RANGE
[ranks]    max_imbalance_pct = P   (busy time of the slowest rank over the least busy one)
[layers]   regex = REGEX (one capturing group: the layer index), opening_op = OP,
           first_opening_op = OP, opening_followed_by = OP, closing_op = OP, uniform = BOOL
[layers.modules]       SUBMODULE = GROUP or [GROUP, ...]   (NVTX sub-module -> ledger groups)
[layers.classes.NAME]  layers = LAYERS, groups = { GROUP = RANGE, ... }, count = F
```

A RANGE is a number, a formula (``"2 * layers"``), two plain numbers joined by a dash
(``"7-9"``; write ``"(a - b)"`` for a subtraction of two literals), a two-item array
``[low, high]`` of numbers or formulas, or a table ``{ min = F, max = F }`` (either may be
left out). LAYERS is an array of indexes and ``"a-b"`` strings, a string of comma separated
items ``"0-2, 6-74/4"`` (``/4``: every 4th), a pattern string with one character per layer
(``F`` or ``X``: member, ``S`` or ``.``: not; spaces and ``_`` ignored), or a table
``{ first = F, last = F, step = F }`` (inclusive). A layer may belong to several classes (a
full-indexer class on top of dense/MoE), but each (layer, group) is declared by one class only.

Regexes must work both in Python's `re` and in polars (Rust regex): no look-around, no
back-references; flags only at the start of a standalone regex or scoped, as ``(?i:...)``.
Every error is an `ExpectationsError(path, problem)`; the problem starts with the key at
fault and, where the key can be found in the text, its line.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.formula import FormulaError, Number, evaluate, evaluate_params
from nsys_ledger.ledger.model import (
    GEMM_KINDS,
    Anchor,
    Expectations,
    GemmShape,
    H2DRule,
    LayerClass,
    LayerRule,
    OpDef,
    Range,
    StepEntryGaps,
    StepRule,
)

TOP_LEVEL = ("model", "params", "steps", "ops", "anchors", "total", "gaps", "h2d", "graphs", "ranks", "layers")
STEP_METHODS = ("auto", "nvtx", "graph", "marker")
_LAYER_RULE_KEYS = ("first_opening_op", "opening_followed_by", "closing_op", "uniform")
DEFAULT_GAP_US = 2.0  # the seed's threshold

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_RANGE_STR = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*-\s*(\d+(?:\.\d+)?)\s*$")
_LAYER_ITEM = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*(?:/\s*(\d+)\s*)?)?$")
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


def _type_name(value: object) -> str:
    return _TOML_TYPES.get(type(value), f"a {type(value).__name__}")


class _Loader:
    def __init__(self, path: str, text: str, doc: dict[str, Any]):
        self.path = path
        self.doc = doc
        self.lines = text.splitlines()
        self.params: dict[str, Number] = {}
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

    # ---- typed access -------------------------------------------------------------------

    def table(self, parent: dict[str, Any], name: str, key: str, required: bool = False) -> dict[str, Any] | None:
        if name not in parent:
            if required:
                raise self.fail(key, f"missing required table [{key}]")
            return None
        value = parent[name]
        if not isinstance(value, dict):
            raise self.fail(key, f"wrong type: expected a table, got {_type_name(value)}")
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
            raise self.fail(full, f"wrong type: expected {want}, got {_type_name(value)}")
        return value

    def number(self, value: Any, key: str) -> Number:
        """A number or a formula over the parameters."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise self.fail(key, f"wrong type: expected a number or a formula string, got {_type_name(value)}")
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
        if not isinstance(value, str):
            raise self.fail(key, f"wrong type: expected a regex string, got {_type_name(value)}")
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
            m = _RANGE_STR.match(value)
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
            f"wrong type: expected a number, a formula, \"a-b\", [low, high] or {{min, max}}, got {_type_name(value)}",
        )

    def counted(self, table: dict[str, Any], key: str) -> tuple[Range, str, str | None, str | None]:
        """An anchor or the total: expected (+ tolerance or tolerance_pct) or min/max; hints."""
        self.known(table, key, ("expected", "tolerance", "tolerance_pct", "min", "max", "hint_low", "hint_high"))
        hint_low = self.get(table, "hint_low", key, str)
        hint_high = self.get(table, "hint_high", key, str)
        has_bounds = "min" in table or "max" in table
        if "expected" in table:
            if has_bounds:
                raise self.fail(f"{key}.expected", "give expected (with a tolerance) or min/max, not both")
            if "tolerance" in table and "tolerance_pct" in table:
                raise self.fail(f"{key}.tolerance_pct", "give tolerance or tolerance_pct, not both")
            raw = table["expected"]
            base = self.range_value(raw, f"{key}.expected")
            formula = raw if isinstance(raw, str) else _fmt_raw(raw)
            low, high = base.low, base.high
            if "tolerance" in table:
                tol = self.number(table["tolerance"], f"{key}.tolerance")
                if tol < 0:
                    raise self.fail(f"{key}.tolerance", f"a tolerance cannot be negative (got {tol:g})")
                low = None if low is None else max(0, low - tol)
                high = None if high is None else high + tol
                if tol:
                    formula += f" ± {_fmt_raw(table['tolerance'])}"
            elif "tolerance_pct" in table:
                pct = self.number(table["tolerance_pct"], f"{key}.tolerance_pct")
                if pct < 0:
                    raise self.fail(f"{key}.tolerance_pct", f"a tolerance cannot be negative (got {pct:g})")
                low = None if low is None else max(0, low * (1 - pct / 100))
                high = None if high is None else high * (1 + pct / 100)
                if pct:
                    formula += f" ± {_fmt_raw(table['tolerance_pct'])}%"
            return self.make_range(low, high, f"{key}.expected"), formula, hint_low, hint_high
        if has_bounds:
            for name in ("tolerance", "tolerance_pct"):
                if name in table:
                    raise self.fail(f"{key}.{name}", "a tolerance applies to expected, not to min/max")
            low = self.number(table["min"], f"{key}.min") if "min" in table else None
            high = self.number(table["max"], f"{key}.max") if "max" in table else None
            parts = []
            if "min" in table:
                parts.append(f"min {_fmt_raw(table['min'])}")
            if "max" in table:
                parts.append(f"max {_fmt_raw(table['max'])}")
            return self.make_range(low, high, key), ", ".join(parts), hint_low, hint_high
        raise self.fail(f"{key}.expected", f"missing required key 'expected' (or min/max) in [{key}]")

    # ---- sections -----------------------------------------------------------------------

    def build(self) -> Expectations:
        doc = self.doc
        for name, value in doc.items():
            if name not in TOP_LEVEL:
                raise self.fail(name, f"unknown top-level table [{name}] (known: {', '.join(TOP_LEVEL)})")
            if not isinstance(value, dict):
                raise self.fail(name, f"wrong type: [{name}] must be a table, got {_type_name(value)}")

        model = self.table(doc, "model", "model", required=True)
        self.known(model, "model", ("name", "description"))
        name = self.get(model, "name", "model", str, required=True)
        description = self.get(model, "description", "model", str, default="")

        self.load_params()
        ops = self.load_ops()
        anchors = self.load_anchors(ops)

        total_table = self.table(doc, "total", "total")
        if total_table is None:
            total, total_hint_low, total_hint_high = Range(None, None), None, None
        else:
            total, _, total_hint_low, total_hint_high = self.counted(total_table, "total")

        steps = self.load_steps(ops)
        gap_ns = self.load_gaps()
        step_entry_gaps = self.load_step_entry_gaps()
        h2d = self.load_h2d()
        graphs = self.load_graphs()
        rank_imbalance_pct = self.load_ranks()
        layer_regex, opening_op, classes = self.load_layers(ops)
        layer_rule = self.load_layer_rule(ops)
        self.check_total_against_layers(total, classes)

        batch = None
        if "batch" in self.params:
            b = self.params["batch"]
            if not float(b).is_integer() or b < 1:
                raise self.fail("params.batch", f"must be a whole number >= 1, got {b!r}")
            batch = int(b)

        return Expectations(
            path=self.path,
            name=name,
            description=description,
            params=dict(self.params),
            ops=ops,
            anchors=anchors,
            total=total,
            total_hint_low=total_hint_low,
            total_hint_high=total_hint_high,
            steps=steps,
            gap_threshold_ns=gap_ns,
            h2d=h2d,
            graph_launches_per_step=graphs,
            batch=batch,
            layer_regex=layer_regex,
            layer_classes=classes,
            layer_opening_op=opening_op,
            layer_rule=layer_rule,
            rank_imbalance_pct=rank_imbalance_pct,
            step_entry_gaps=step_entry_gaps,
        )

    def load_params(self) -> None:
        raw = self.table(self.doc, "params", "params") or {}
        for pname, value in raw.items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise self.fail(
                    f"params.{pname}",
                    f"wrong type: expected a number or a formula string, got {_type_name(value)}",
                )
        try:
            self.params = evaluate_params(raw)
        except FormulaError as exc:
            raise self.fail(f"params.{exc.key}" if exc.key else "params", exc.message) from None

    def load_ops(self) -> dict[str, OpDef]:
        table = self.table(self.doc, "ops", "ops", required=True)
        if not table:
            raise self.fail("ops", "no ops declared: [ops.NAME] with patterns = [...] is required")
        ops: dict[str, OpDef] = {}
        for op, spec in table.items():
            key = f"ops.{op}"
            if not _NAME.match(op):
                raise self.fail(key, f"op name {op!r} must be letters, digits, _ or - (starting with a letter)")
            if not isinstance(spec, dict):
                raise self.fail(key, f"wrong type: expected a table, got {_type_name(spec)}")
            self.known(spec, key, ("patterns", "gemm", "group", "description", "fallback"))
            patterns = self.get(spec, "patterns", key, (list, str), default=[])
            if isinstance(patterns, str):
                patterns = [patterns]
            gemm = self.gemm_shapes(spec.get("gemm"), f"{key}.gemm")
            if not patterns and not gemm:
                raise self.fail(f"{key}.patterns", f"op {op!r} has no patterns and no gemm shape")
            for i, p in enumerate(patterns):
                if not isinstance(p, str):
                    raise self.fail(
                        f"{key}.patterns",
                        f"wrong type: pattern {i} of op {op!r} is {_type_name(p)}, expected a string",
                    )
                self.regex(p, f"{key}.patterns", f"op {op!r} pattern {p!r}")
            group = self.get(spec, "group", key, str)
            if group is not None and not _NAME.match(group):
                raise self.fail(f"{key}.group", f"group name {group!r} must be letters, digits, _ or -")
            self.get(spec, "description", key, str)
            fallback = self.get(spec, "fallback", key, bool, default=False)
            opdef = OpDef(name=op, patterns=tuple(patterns), group=group, source=key, gemm=gemm, fallback=fallback)
            try:
                re.compile(opdef.regex)
            except re.error as exc:
                raise self.fail(
                    f"{key}.patterns",
                    f"op {op!r}: the patterns do not combine into one regex ({exc}); "
                    "use scoped flags like (?i:...) instead of (?i)",
                ) from None
            ops[op] = opdef
        return ops

    def gemm_shapes(self, value: Any, key: str) -> tuple[GemmShape, ...]:
        """`gemm = { n = N, k = K, kind = KIND }` or an array of such tables."""
        if value is None:
            return ()
        items = value if isinstance(value, list) else [value]
        shapes: list[GemmShape] = []
        for i, item in enumerate(items):
            where = f"{key}[{i}]" if isinstance(value, list) else key
            if not isinstance(item, dict):
                raise self.fail(where, f"wrong type: expected a table {{ n = N, k = K, kind = KIND }}, got {_type_name(item)}")
            self.known(item, where, ("n", "k", "kind"))
            if ("n" in item) != ("k" in item):
                raise self.fail(where, "give both n and k (or neither, for any shape of the kind)")
            n = self.whole(item["n"], f"{where}.n", low=1) if "n" in item else None
            k = self.whole(item["k"], f"{where}.k", low=1) if "k" in item else None
            default_kind = "normal" if n is not None else "any"
            kind = self.get(item, "kind", where, str, default=default_kind)
            if kind not in GEMM_KINDS:
                raise self.fail(f"{where}.kind", f"unknown GEMM kind {kind!r} (known: {', '.join(GEMM_KINDS)})")
            if n is None and kind == "any":
                raise self.fail(where, "a gemm with neither a shape nor a kind would match every GEMM")
            shapes.append(GemmShape(n=n, k=k, kind=kind))
        if not shapes:
            raise self.fail(key, "an empty gemm array matches nothing")
        return tuple(shapes)

    def load_anchors(self, ops: dict[str, OpDef]) -> tuple[Anchor, ...]:
        table = self.table(self.doc, "anchors", "anchors") or {}
        anchors = []
        for op, spec in table.items():
            key = f"anchors.{op}"
            if op not in ops:
                raise self.fail(key, f"anchor refers to unknown op {op!r} (ops: {_short(ops)})")
            if not isinstance(spec, dict):
                raise self.fail(key, f"wrong type: expected a table, got {_type_name(spec)}")
            expected, formula, hint_low, hint_high = self.counted(spec, key)
            anchors.append(Anchor(op=op, formula=formula, expected=expected,
                                  hint_low=hint_low, hint_high=hint_high, source=key))
        return tuple(anchors)

    def load_steps(self, ops: dict[str, OpDef]) -> StepRule:
        table = self.table(self.doc, "steps", "steps")
        if table is None:
            return StepRule("auto", None, None, None, ())
        self.known(table, "steps", ("method", "nvtx", "marker", "marker_op", "exclude_nvtx", "exclude_ops"))
        method = self.get(table, "method", "steps", str, default="auto")
        if method not in STEP_METHODS:
            raise self.fail("steps.method", f"unknown method {method!r} (one of {', '.join(STEP_METHODS)})")
        nvtx = table.get("nvtx")
        if nvtx is not None:
            self.regex(nvtx, "steps.nvtx", "step NVTX")
        marker = table.get("marker")
        if marker is not None:
            self.regex(marker, "steps.marker", "step marker")
        marker_op = self.get(table, "marker_op", "steps", str)
        if marker_op is not None:
            if marker is not None:
                raise self.fail("steps.marker_op", "give marker or marker_op, not both")
            if marker_op not in ops:
                raise self.fail("steps.marker_op", f"unknown op {marker_op!r} (ops: {_short(ops)})")
            if not ops[marker_op].patterns:
                raise self.fail("steps.marker_op", f"op {marker_op!r} has no patterns to find its kernels by name")
            marker = ops[marker_op].regex
        exclude_nvtx = table.get("exclude_nvtx")
        if exclude_nvtx is not None:
            self.regex(exclude_nvtx, "steps.exclude_nvtx", "excluded NVTX")
        exclude_ops = self.get(table, "exclude_ops", "steps", list, default=[])
        for op in exclude_ops:
            if not isinstance(op, str):
                raise self.fail("steps.exclude_ops", f"wrong type: expected op names, got {_type_name(op)}")
            if op not in ops:
                raise self.fail("steps.exclude_ops", f"unknown op {op!r} (ops: {_short(ops)})")
        if method == "nvtx" and nvtx is None:
            raise self.fail("steps.nvtx", "missing required key 'nvtx' for method = \"nvtx\"")
        if method == "marker" and marker is None:
            raise self.fail("steps.marker", "missing required key 'marker' (or marker_op) for method = \"marker\"")
        return StepRule(method, nvtx, marker, exclude_nvtx, tuple(exclude_ops))

    def load_gaps(self) -> int:
        table = self.table(self.doc, "gaps", "gaps")
        if table is None:
            return int(DEFAULT_GAP_US * 1000)
        self.known(table, "gaps", ("threshold_us", "step_entry_per_launch", "step_entry_max_us"))
        if "threshold_us" not in table:
            raise self.fail("gaps.threshold_us", "missing required key 'threshold_us' in [gaps]")
        us = self.number(table["threshold_us"], "gaps.threshold_us")
        if us <= 0:
            raise self.fail("gaps.threshold_us", f"must be positive, got {us:g}")
        return int(round(us * 1000))

    def load_step_entry_gaps(self) -> StepEntryGaps | None:
        table = self.table(self.doc, "gaps", "gaps") or {}
        if "step_entry_per_launch" not in table:
            if "step_entry_max_us" in table:
                raise self.fail("gaps.step_entry_max_us", "give step_entry_per_launch with it")
            return None
        per_launch = self.whole(table["step_entry_per_launch"], "gaps.step_entry_per_launch")
        max_ns = None
        if "step_entry_max_us" in table:
            max_us = self.number(table["step_entry_max_us"], "gaps.step_entry_max_us")
            if max_us <= 0:
                raise self.fail("gaps.step_entry_max_us", f"must be positive, got {max_us:g}")
            max_ns = int(round(max_us * 1000))
        return StepEntryGaps(per_launch=per_launch, max_ns=max_ns)

    def load_h2d(self) -> H2DRule:
        table = self.table(self.doc, "h2d", "h2d")
        if table is None:
            return H2DRule(Range(None, None), None, True)
        self.known(table, "h2d", ("per_step", "max_bytes", "pageable_allowed"))
        per_step = self.range_value(table["per_step"], "h2d.per_step") if "per_step" in table else Range(None, None)
        max_bytes = self.whole(table["max_bytes"], "h2d.max_bytes") if "max_bytes" in table else None
        pageable = self.get(table, "pageable_allowed", "h2d", bool, default=True)
        return H2DRule(per_step, max_bytes, pageable)

    def load_graphs(self) -> Range | None:
        table = self.table(self.doc, "graphs", "graphs")
        if table is None:
            return None
        self.known(table, "graphs", ("launches_per_step",))
        if "launches_per_step" not in table:
            return None
        return self.range_value(table["launches_per_step"], "graphs.launches_per_step")

    def load_ranks(self) -> float | None:
        table = self.table(self.doc, "ranks", "ranks")
        if table is None:
            return None
        self.known(table, "ranks", ("max_imbalance_pct",))
        if "max_imbalance_pct" not in table:
            return None
        pct = self.number(table["max_imbalance_pct"], "ranks.max_imbalance_pct")
        if pct < 0:
            raise self.fail("ranks.max_imbalance_pct", f"must be >= 0, got {pct:g}")
        return float(pct)

    def load_layers(self, ops: dict[str, OpDef]) -> tuple[str | None, str | None, tuple[LayerClass, ...]]:
        table = self.table(self.doc, "layers", "layers")
        if table is None:
            return None, None, ()
        self.known(table, "layers", ("regex", "opening_op", *_LAYER_RULE_KEYS, "modules", "classes"))
        layer_regex = None
        if "regex" in table:
            layer_regex = self.regex(table["regex"], "layers.regex", "layer")
            groups = re.compile(layer_regex).groups
            if groups != 1:
                raise self.fail(
                    "layers.regex",
                    f"the layer regex needs exactly one capturing group (the index), it has {groups}",
                )
        opening = self.get(table, "opening_op", "layers", str)
        if opening is not None and opening not in ops:
            raise self.fail("layers.opening_op", f"unknown op {opening!r} (ops: {_short(ops)})")

        classes_table = self.table(table, "classes", "layers.classes") or {}
        if not classes_table:
            return layer_regex, opening, ()
        if "layers" not in self.params:
            raise self.fail("params.layers", "missing required key 'layers' in [params] (needed by [layers.classes])")
        nlayers = self.params["layers"]
        if not float(nlayers).is_integer() or nlayers < 1:
            raise self.fail("params.layers", f"must be a whole number >= 1, got {nlayers!r}")
        nlayers = int(nlayers)
        declared_groups = {op.group for op in ops.values() if op.group}

        classes: list[LayerClass] = []
        owner: dict[tuple[int, str], str] = {}
        for cname, spec in classes_table.items():
            key = f"layers.classes.{cname}"
            if not _NAME.match(cname):
                raise self.fail(key, f"class name {cname!r} must be letters, digits, _ or -")
            if not isinstance(spec, dict):
                raise self.fail(key, f"wrong type: expected a table, got {_type_name(spec)}")
            self.known(spec, key, ("layers", "groups", "count"))
            if "layers" not in spec:
                raise self.fail(f"{key}.layers", f"missing required key 'layers' in [{key}]")
            layers = self.layer_list(spec["layers"], f"{key}.layers", nlayers)
            if "count" in spec:
                want = self.whole(spec["count"], f"{key}.count")
                if want != len(layers):
                    raise self.fail(
                        f"{key}.layers",
                        f"lists {len(layers)} layers but count = {_fmt_raw(spec['count'])} = {want}",
                    )
            groups_raw = self.get(spec, "groups", key, dict, default={})
            groups: dict[str, Range] = {}
            for gname, value in groups_raw.items():
                gkey = f"{key}.groups.{gname}"
                if gname not in declared_groups:
                    raise self.fail(
                        gkey,
                        f"group {gname!r} is not declared by any op "
                        f"(groups: {', '.join(sorted(declared_groups)) or 'none'})",
                    )
                groups[gname] = self.range_value(value, gkey)
                for layer in layers:
                    other = owner.setdefault((layer, gname), cname)
                    if other != cname:
                        raise self.fail(
                            gkey,
                            f"layer {layer} gets group {gname!r} from both class {other!r} and class {cname!r}",
                        )
            classes.append(LayerClass(name=cname, layers=layers, groups=groups, source=key))
        return layer_regex, opening, tuple(classes)

    def load_layer_rule(self, ops: dict[str, OpDef]) -> LayerRule:
        """The inference keys, the sub-module map and `uniform` of [layers] (see LayerRule)."""
        table = self.table(self.doc, "layers", "layers") or {}
        named_ops: dict[str, str | None] = {}
        for name in ("first_opening_op", "opening_followed_by", "closing_op"):
            op = self.get(table, name, "layers", str)
            if op is not None and op not in ops:
                raise self.fail(f"layers.{name}", f"unknown op {op!r} (ops: {_short(ops)})")
            named_ops[name] = op
        uniform = self.get(table, "uniform", "layers", bool, default=False)
        declared_groups = {op.group for op in ops.values() if op.group}
        modules: dict[str, tuple[str, ...]] = {}
        for submodule, value in (self.table(table, "modules", "layers.modules") or {}).items():
            key = f"layers.modules.{submodule}"
            groups = [value] if isinstance(value, str) else value
            if not isinstance(groups, list) or not groups or not all(isinstance(g, str) for g in groups):
                raise self.fail(key, f"wrong type: expected a group name or a non-empty array of group names, got {_type_name(value)}")
            for group in groups:
                if group not in declared_groups:
                    raise self.fail(
                        key, f"group {group!r} is not declared by any op (groups: {', '.join(sorted(declared_groups))})"
                    )
            modules[submodule] = tuple(groups)
        return LayerRule(modules=modules, uniform=uniform, **named_ops)

    def layer_list(self, value: Any, key: str, nlayers: int) -> tuple[int, ...]:
        out: list[int] = []
        if isinstance(value, str):
            if not any(c.isdigit() for c in value):
                out = self.layer_pattern(value, key, nlayers)
            else:
                for item in value.split(","):
                    out.extend(self.layer_item(item, key))
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, int) and not isinstance(item, bool):
                    out.append(item)
                elif isinstance(item, str):
                    out.extend(self.layer_item(item, key))
                elif isinstance(item, dict):
                    out.extend(self.layer_span(item, key))
                else:
                    raise self.fail(key, f"wrong type: a layer must be an integer or \"a-b\", got {_type_name(item)}")
        elif isinstance(value, dict):
            out = self.layer_span(value, key)
        else:
            raise self.fail(
                key, f"wrong type: expected an array, a string or a table of layers, got {_type_name(value)}"
            )
        for layer in out:
            if not 0 <= layer < nlayers:
                raise self.fail(key, f"layer {layer} is outside 0-{nlayers - 1} (params.layers = {nlayers})")
        if not out:
            raise self.fail(key, "no layers listed")
        return tuple(sorted(set(out)))

    def layer_item(self, item: str, key: str) -> list[int]:
        m = _LAYER_ITEM.match(item)
        if not m:
            raise self.fail(key, f"cannot read {item.strip()!r} as a layer or a range \"a-b\" / \"a-b/step\"")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        step = int(m.group(3)) if m.group(3) is not None else 1
        if first > last:
            raise self.fail(key, f"contradictory layer range {item.strip()!r}: {first} > {last}")
        if step < 1:
            raise self.fail(key, f"the step in {item.strip()!r} must be at least 1")
        return list(range(first, last + 1, step))

    def layer_span(self, table: dict[str, Any], key: str) -> list[int]:
        self.known(table, key, ("first", "last", "step"))
        for name in ("first", "last"):
            if name not in table:
                raise self.fail(f"{key}.{name}", f"missing required key {name!r} in the layer span")
        first = self.whole(table["first"], f"{key}.first", low=-(2**62))
        last = self.whole(table["last"], f"{key}.last", low=-(2**62))
        step = self.whole(table.get("step", 1), f"{key}.step", low=1)
        if first > last:
            raise self.fail(key, f"contradictory layer span: first {first} > last {last}")
        if (last - first) // step > 1_000_000:
            raise self.fail(key, "layer span too long")
        return list(range(first, last + 1, step))

    def layer_pattern(self, value: str, key: str, nlayers: int) -> list[int]:
        chars = [c for c in value if c not in " _\t"]
        if len(chars) != nlayers:
            raise self.fail(key, f"the layer pattern has {len(chars)} characters, expected one per layer ({nlayers})")
        out = []
        for i, c in enumerate(chars):
            if c in "FX":
                out.append(i)
            elif c not in "S.":
                raise self.fail(key, f"unexpected character {c!r} in the layer pattern (F or X: member, S or .: not)")
        return out

    def check_total_against_layers(self, total: Range, classes: tuple[LayerClass, ...]) -> None:
        if total.high is None or not classes:
            return
        floor_sum = sum((r.low or 0) * len(c.layers) for c in classes for r in c.groups.values())
        if floor_sum > total.high:
            raise self.fail(
                "total.max",
                f"contradictory: the layer classes need at least {floor_sum:g} kernels per step "
                f"but the total allows at most {total.high:g}",
            )


def _fmt_raw(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(_fmt_raw(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_fmt_raw(v)}" for k, v in value.items()) + "}"
    return str(value)


def _short(names: Iterable[str], limit: int = 12) -> str:
    names = list(names)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "")


def load_expectations(path: str | Path) -> Expectations:
    """Read, validate and evaluate an expectations TOML file."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ExpectationsError(path, "no such file") from None
    except IsADirectoryError:
        raise ExpectationsError(path, "is a directory, not an expectations file") from None
    except OSError as exc:
        raise ExpectationsError(path, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpectationsError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(path, f"not valid TOML: {exc}") from None
    return _Loader(str(path), text, doc).build()


# ---- rendering --------------------------------------------------------------------------


def compact_layers(layers: Iterable[int]) -> str:
    """``[0, 1, 2, 6, 10, 14]`` -> ``"0-2, 6-14/4"``; the parser reads the result back."""
    xs = sorted(set(layers))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if j > i:
            parts.append(f"{xs[i]}-{xs[j]}")
            i = j + 1
            continue
        if i + 2 < len(xs):
            step = xs[i + 1] - xs[i]
            j = i + 1
            while j + 1 < len(xs) and xs[j + 1] - xs[j] == step:
                j += 1
            # Leave a trailing consecutive pair to the next run ("6-14/4, 15-17").
            if j + 1 < len(xs) and xs[j + 1] == xs[j] + 1 and j - i >= 3:
                j -= 1
            if j - i >= 2:
                parts.append(f"{xs[i]}-{xs[j]}/{step}")
                i = j + 1
                continue
        parts.append(str(xs[i]))
        i += 1
    return ", ".join(parts)


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
