"""Synthetic nsys SQLite exports of SGLang GLM-5.3 decode, driven by a reference schedule.

    >>> from nsys_ledger.synth import generate, FAULTS
    >>> summary = generate("glm5.sqlite", mode="graph", steps=8, faults=("broken_fusion",))

The generator never reads the expectation file and never imports the checks: the checker
judges its output against the expectations (see docs/ARCHITECTURE.md).
"""

from nsys_ledger.synth.generate import (
    FAULTS,
    GAP_SITES,
    GAP_THRESHOLD_NS,
    CopyTruth,
    GenerateSummary,
    InjectedGap,
    StepTruth,
    generate,
)

__all__ = ["FAULTS", "GAP_SITES", "GAP_THRESHOLD_NS", "CopyTruth", "GenerateSummary",
           "InjectedGap", "StepTruth", "generate"]
