"""The ledger: expectations files, their model, and the safe formula evaluator."""

from nsys_ledger.ledger.formula import FormulaError, evaluate, evaluate_params
from nsys_ledger.ledger.load import compact_layers, load_expectations, render_expectations
from nsys_ledger.ledger.model import (
    Anchor,
    Expectations,
    H2DRule,
    LayerClass,
    OpDef,
    Range,
    StepRule,
)

__all__ = [
    "Anchor",
    "Expectations",
    "FormulaError",
    "H2DRule",
    "LayerClass",
    "OpDef",
    "Range",
    "StepRule",
    "compact_layers",
    "evaluate",
    "evaluate_params",
    "load_expectations",
    "render_expectations",
]
