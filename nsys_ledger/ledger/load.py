"""Read an expectations (ledger) file: bytes -> UTF-8 text -> TOML -> `Expectations`.

The format is described in the package docstring (`nsys_ledger.ledger`); the sections are
read by `nsys_ledger.ledger.sections`, in the order `nsys_ledger.ledger.document` lists.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.document import TOP_LEVEL, read_expectations
from nsys_ledger.ledger.model import Expectations
from nsys_ledger.ledger.reading import LedgerReader
from nsys_ledger.safety import MAX_LEDGER_BYTES, read_bounded
# Imported from here before the package was split; kept so those imports still work.
from nsys_ledger.ledger.render import render_expectations
from nsys_ledger.ledger.sections.layers import compact_layers
from nsys_ledger.ledger.sections.steps import STEP_METHODS
from nsys_ledger.ledger.sections.timeline import DEFAULT_GAP_US

__all__ = ["DEFAULT_GAP_US", "STEP_METHODS", "TOP_LEVEL", "compact_layers", "load_expectations",
           "read_expectations", "render_expectations"]


def load_expectations(path: str | Path) -> Expectations:
    """Read, validate and evaluate an expectations TOML file."""
    p = Path(path)
    if p.is_dir():
        raise ExpectationsError(path, "is a directory, not an expectations file")
    # a regular file of at most MAX_LEDGER_BYTES: a FIFO or /dev/zero never blocks or fills memory
    data = read_bounded(p, str(path), MAX_LEDGER_BYTES, "an expectations file", ExpectationsError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExpectationsError(path, f"not UTF-8 text (byte {exc.start})") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ExpectationsError(path, f"not valid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ExpectationsError(path, "not valid TOML: arrays or tables nested too deeply") from None
    try:
        return read_expectations(LedgerReader(str(path), text), doc)
    except RecursionError:  # a formula or parameter chain deeper than the interpreter's stack
        raise ExpectationsError(path, "formulas or parameters nested too deeply to evaluate "
                                      "(a chain of parameters, each naming the next?)") from None
