"""[model]: the ledger's name and description."""

from __future__ import annotations

from typing import Any

from nsys_ledger.ledger.model import Expectations
from nsys_ledger.ledger.reading import LedgerReader
from nsys_ledger.ledger.writing import LedgerWriter

MODEL_KEYS = ("name", "description")


def read_model(reader: LedgerReader, doc: dict[str, Any]) -> tuple[str, str]:
    """(name, description)."""
    model = reader.table(doc, "model", "model", required=True)
    reader.known(model, "model", MODEL_KEYS)
    name = reader.get(model, "name", "model", str, required=True)
    description = reader.get(model, "description", "model", str, default="")
    return name, description


def write_model(out: LedgerWriter, exp: Expectations) -> None:
    out.table("model")
    out.value("model", "name", exp.name)
    if exp.description or out.has("model.description"):
        out.value("model", "description", exp.description)
