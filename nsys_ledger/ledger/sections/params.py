"""[params]: named numbers, or formulas over each other (``moe_layers = "layers - dense_layers"``).

Every formula after [params] is evaluated over these, so the reader sets `reader.params`.
"""

from __future__ import annotations

from typing import Any

from nsys_ledger.ledger.formula import FormulaError, Number, evaluate_params
from nsys_ledger.ledger.model import Expectations
from nsys_ledger.ledger.reading import LedgerReader, type_name
from nsys_ledger.ledger.writing import LedgerWriter


def read_params(reader: LedgerReader, doc: dict[str, Any]) -> dict[str, Number]:
    raw = reader.table(doc, "params", "params") or {}
    for pname, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise reader.fail(
                f"params.{pname}",
                f"wrong type: expected a number or a formula string, got {type_name(value)}",
            )
    try:
        reader.params = evaluate_params(raw)
    except FormulaError as exc:
        raise reader.fail(f"params.{exc.key}" if exc.key else "params", exc.message) from None
    for pname, value in raw.items():
        reader.keep(f"params.{pname}", value)
    return dict(reader.params)


def batch_of(reader: LedgerReader) -> int | None:
    """`params.batch`: requests per decode step (kernels per output token), if declared."""
    if "batch" not in reader.params:
        return None
    b = reader.params["batch"]
    if not float(b).is_integer() or b < 1:
        raise reader.fail("params.batch", f"must be a whole number >= 1, got {b!r}")
    return int(b)


def write_params(out: LedgerWriter, exp: Expectations) -> None:
    if not exp.params:
        return
    out.table("params")
    for name, value in exp.params.items():
        key = f"params.{name}"
        out.value("params", name, out.as_written(key, value, lambda raw: out.reader.number(raw, key), value))
