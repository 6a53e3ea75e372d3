"""Canonical op of every kernel, from the expectations' op patterns and GEMM shapes.

A trace has millions of kernel rows but only hundreds or thousands of distinct names, so each
distinct name is classified once (`classify_name`) and the result is joined back.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.kernel_names import GemmSignature, gemm_signature
from nsys_ledger.ledger.model import Expectations, GemmShape, OpDef
from nsys_ledger.safety import regex_hits

UNMATCHED_OP = "other"

# How an op claimed a name (the `matched_by` column, and `expectations match`).
BY_PATTERN = "pattern"
BY_GEMM = "gemm"
BY_NOTHING = "none"

OP_TABLE_SCHEMA = {
    "name": pl.Utf8,
    "op": pl.Utf8,
    "group": pl.Utf8,
    "matched_by": pl.Utf8,  # BY_PATTERN, BY_GEMM or BY_NOTHING
    "fallback": pl.Boolean,  # the op is a generic catch-all (OpDef.fallback)
}


@dataclass(frozen=True)
class OpMatch:
    """Which op a kernel name belongs to and why."""

    op: str  # UNMATCHED_OP when no op claims the name
    group: str | None
    matched_by: str  # BY_PATTERN, BY_GEMM or BY_NOTHING
    detail: str  # the pattern or the GEMM shape that matched; "" for no op
    fallback: bool


def gemm_matches(shape: GemmShape, signature: GemmSignature) -> bool:
    """A declared GEMM shape against what the name states. A name without a GemmType (a fused
    or router GEMM) is judged by its shape alone."""
    if signature.kind is not None and not _kind_matches(shape.kind, signature.kind):
        return False
    if shape.n is None:
        return signature.kind is not None or shape.kind == "any"
    return signature.has_shape(shape.n, shape.k)


def _kind_matches(declared: str, stated: str) -> bool:
    if declared == "any":
        return True
    if declared == "grouped":
        return stated in ("masked", "contiguous")
    return declared == stated


class OpClassifier:
    """The ledger's ops in match order.

    Patterns run in polars (Rust's `regex` crate: linear time in the name, so a pattern such
    as `(a+)+$` cannot hang on a long name); `classify_many` runs each pattern once over all
    the names, then picks each name's first matching op in declaration order."""

    def __init__(self, expectations: Expectations | None):
        self._ops: list[OpDef] = list(expectations.ops.values()) if expectations is not None else []
        self._reads_shapes = any(op.gemm for op in self._ops)  # else no name needs parsing

    def classify(self, kernel_name: str) -> OpMatch:
        """The first declared op whose pattern or GEMM shape matches (declaration order)."""
        return self.classify_many([kernel_name])[0]

    def classify_many(self, kernel_names: list[str]) -> list[OpMatch]:
        hits = [regex_hits(op.patterns, kernel_names) for op in self._ops]
        return [self._first_match(i, name, hits) for i, name in enumerate(kernel_names)]

    def _first_match(self, index: int, kernel_name: str, hits: list[list[list[bool]]]) -> OpMatch:
        signature = gemm_signature(kernel_name) if self._reads_shapes else None
        for op, op_hits in zip(self._ops, hits):
            if signature is not None:
                shape = next((s for s in op.gemm if gemm_matches(s, signature)), None)
                if shape is not None:
                    return OpMatch(op.name, op.group, BY_GEMM, shape.describe(), op.fallback)
            pattern = next((p for p, found in zip(op.patterns, op_hits) if found[index]), None)
            if pattern is not None:
                return OpMatch(op.name, op.group, BY_PATTERN, pattern, op.fallback)
        return OpMatch(UNMATCHED_OP, None, BY_NOTHING, "", False)

    def all_matches(self, kernel_name: str) -> tuple[str, ...]:
        """Every declared op whose pattern or GEMM shape matches `kernel_name` (all_matches_many)."""
        return self.all_matches_many([kernel_name])[0]

    def all_matches_many(self, kernel_names: list[str]) -> list[tuple[str, ...]]:
        """For each name, every declared op whose pattern or GEMM shape matches, in declaration
        order: the ops a kernel of this name could be, of which `classify` names the first."""
        hits = [regex_hits(op.patterns, kernel_names) for op in self._ops]
        matches = []
        for index, name in enumerate(kernel_names):
            signature = gemm_signature(name) if self._reads_shapes else None
            matches.append(tuple(
                op.name for op, op_hits in zip(self._ops, hits)
                if (signature is not None and any(gemm_matches(s, signature) for s in op.gemm))
                or any(found[index] for found in op_hits)
            ))
        return matches


def op_table(names: pl.Series, expectations: Expectations | None) -> pl.DataFrame:
    """`name -> op, group, matched_by, fallback` for each distinct name."""
    distinct = names.unique().drop_nulls().to_list()
    matches = OpClassifier(expectations).classify_many(distinct)
    return pl.DataFrame(
        {
            "name": distinct,
            "op": [m.op for m in matches],
            "group": [m.group for m in matches],
            "matched_by": [m.matched_by for m in matches],
            "fallback": [m.fallback for m in matches],
        },
        schema=OP_TABLE_SCHEMA,
    )


def with_ops(activities: pl.DataFrame, expectations: Expectations | None) -> pl.DataFrame:
    """Add `op` and `group` to kernel rows; copies and memsets get null.

    Only the names go through the join; the activities keep their order and columns."""
    is_kernel = activities["activity"] == "kernel"
    table = op_table(activities["name"].filter(is_kernel), expectations)
    looked_up = activities.select("name").join(table, on="name", how="left", maintain_order="left")
    return activities.with_columns(
        pl.when(is_kernel).then(looked_up["op"]).otherwise(None).alias("op"),
        pl.when(is_kernel).then(looked_up["group"]).otherwise(None).alias("group"),
    )
