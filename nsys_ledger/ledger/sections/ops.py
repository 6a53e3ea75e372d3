"""[ops.NAME]: which kernels make up each op, by name pattern or by GEMM shape.

Declaration order is match priority (the first op whose pattern or GEMM shape matches wins),
so both the reader and the writer keep it.
"""

from __future__ import annotations

import re
from typing import Any

from nsys_ledger.ledger.model import GEMM_KINDS, Expectations, GemmShape, OpDef
from nsys_ledger.ledger.reading import NAME, LedgerReader, type_name
from nsys_ledger.ledger.roles import ROLES
from nsys_ledger.ledger.writing import LedgerWriter, regex_array

OP_KEYS = ("patterns", "gemm", "group", "role", "description", "fallback")


def read_ops(reader: LedgerReader, doc: dict[str, Any]) -> dict[str, OpDef]:
    table = reader.table(doc, "ops", "ops", required=True)
    if not table:
        raise reader.fail("ops", "no ops declared: [ops.NAME] with patterns = [...] is required")
    return {op: read_op(reader, op, spec) for op, spec in table.items()}


def read_op(reader: LedgerReader, op: str, spec: Any) -> OpDef:
    key = f"ops.{op}"
    if not NAME.match(op):
        raise reader.fail(key, f"op name {op!r} must be letters, digits, _ or - (starting with a letter)")
    if not isinstance(spec, dict):
        raise reader.fail(key, f"wrong type: expected a table, got {type_name(spec)}")
    reader.known(spec, key, OP_KEYS)
    patterns = reader.get(spec, "patterns", key, (list, str), default=[])
    if isinstance(patterns, str):
        patterns = [patterns]
    gemm = read_gemm_shapes(reader, spec.get("gemm"), f"{key}.gemm")
    if not patterns and not gemm:
        raise reader.fail(f"{key}.patterns", f"op {op!r} has no patterns and no gemm shape")
    for i, p in enumerate(patterns):
        if not isinstance(p, str):
            raise reader.fail(
                f"{key}.patterns",
                f"wrong type: pattern {i} of op {op!r} is {type_name(p)}, expected a string",
            )
        reader.regex(p, f"{key}.patterns", f"op {op!r} pattern {p!r}")
    group = reader.get(spec, "group", key, str)
    if group is not None and not NAME.match(group):
        raise reader.fail(f"{key}.group", f"group name {group!r} must be letters, digits, _ or -")
    role = reader.get(spec, "role", key, str)
    if role is not None and role not in ROLES:
        raise reader.fail(f"{key}.role", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    description = reader.get(spec, "description", key, str)
    fallback = reader.get(spec, "fallback", key, bool, default=False)
    opdef = OpDef(name=op, patterns=tuple(patterns), group=group, source=key, gemm=gemm, fallback=fallback,
                  description=description, role=role)
    try:
        re.compile(opdef.regex)
    except re.error as exc:
        raise reader.fail(
            f"{key}.patterns",
            f"op {op!r}: the patterns do not combine into one regex ({exc}); "
            "use scoped flags like (?i:...) instead of (?i)",
        ) from None
    return opdef


def read_gemm_shapes(reader: LedgerReader, value: Any, key: str) -> tuple[GemmShape, ...]:
    """`gemm = { n = N, k = K, kind = KIND }` or an array of such tables."""
    if value is None:
        return ()
    reader.keep(key, value)
    items = value if isinstance(value, list) else [value]
    shapes: list[GemmShape] = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]" if isinstance(value, list) else key
        if not isinstance(item, dict):
            raise reader.fail(where, f"wrong type: expected a table {{ n = N, k = K, kind = KIND }}, got {type_name(item)}")
        reader.known(item, where, ("n", "k", "kind"))
        if ("n" in item) != ("k" in item):
            raise reader.fail(where, "give both n and k (or neither, for any shape of the kind)")
        n = reader.whole(item["n"], f"{where}.n", low=1) if "n" in item else None
        k = reader.whole(item["k"], f"{where}.k", low=1) if "k" in item else None
        default_kind = "normal" if n is not None else "any"
        kind = reader.get(item, "kind", where, str, default=default_kind)
        if kind not in GEMM_KINDS:
            raise reader.fail(f"{where}.kind", f"unknown GEMM kind {kind!r} (known: {', '.join(GEMM_KINDS)})")
        if n is None and kind == "any":
            raise reader.fail(where, "a gemm with neither a shape nor a kind would match every GEMM")
        shapes.append(GemmShape(n=n, k=k, kind=kind))
    if not shapes:
        raise reader.fail(key, "an empty gemm array matches nothing")
    return tuple(shapes)


def gemm_table(shape: GemmShape) -> dict[str, Any]:
    """One shape as the reader takes it: the kind only where it is not the default."""
    table: dict[str, Any] = {}
    if shape.n is not None:
        table["n"] = shape.n
        table["k"] = shape.k
    if shape.kind != ("normal" if shape.n is not None else "any"):
        table["kind"] = shape.kind
    return table


def write_ops(out: LedgerWriter, exp: Expectations) -> None:
    for op in exp.ops.values():
        write_op(out, op)


def write_op(out: LedgerWriter, op: OpDef) -> None:
    key = f"ops.{op.name}"
    out.table(key)
    if op.group is not None:
        out.value(key, "group", op.group)
    if op.role is not None:
        out.value(key, "role", op.role)
    if op.description is not None:
        out.value(key, "description", op.description)
    if op.gemm:
        gkey = f"{key}.gemm"
        shapes = [gemm_table(shape) for shape in op.gemm]
        plain = shapes[0] if len(shapes) == 1 else shapes
        out.value(key, "gemm", out.as_written(gkey, op.gemm, lambda raw: read_gemm_shapes(out.reader, raw, gkey), plain))
    if op.fallback:
        out.value(key, "fallback", True)
    if op.patterns:
        out.value(key, "patterns", regex_array(op.patterns))
