"""What a check's findings name, as sets: for comparing two ledgers' verdicts on one trace."""

from __future__ import annotations


def failures(result) -> tuple[set[str], dict[str, set[int]]]:
    """Anchors that fail, and per layer group the layers some layer finding names."""
    anchors = {f.subject for f in result.findings if f.check == "anchor"}
    layers: dict[str, set[int]] = {}
    for finding in result.findings:
        if finding.check in ("layer", "layer_uniform") and finding.layers:
            layers.setdefault(finding.subject, set()).update(layer_set(finding.layers))
    return anchors, layers


def layers_named(result) -> set[int]:
    """Every layer some per-layer finding names: a group count, a peer comparison, or an edit
    of the layer's kernel sequence (one ledger may tell a fault by count, another by place)."""
    named: set[int] = set()
    for finding in result.findings:
        if finding.check in ("layer", "layer_uniform", "layer_sequence") and finding.layers:
            named |= layer_set(finding.layers)
    return named


def layer_set(text: str) -> set[int]:
    """`"0-2, 6-74/4"` -> {0, 1, 2, 6, 10, ..., 74}."""
    out: set[int] = set()
    for part in text.split(","):
        low, _, rest = part.strip().partition("-")
        high, _, step = rest.partition("/")
        out.update(range(int(low), int(high or low) + 1, int(step or 1)))
    return out
