"""Op coverage: how much of a decode step the ledger's ops really name.

A ledger can look fine on counts while a generic catch-all (`deepgemm_dense`, `cublas_gemm`)
swallows half the step, or while a build launches kernels no op describes (activation
quantizations, a fused all-reduce). Every check therefore says how many decode kernels a
specific op claimed, how many only a fallback op (`fallback = true` in the ledger) and how many
no op, with the names behind the last two, so a user can see where to sharpen the ledger.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.ops import UNMATCHED_OP
from nsys_ledger.ledger.model import Expectations

SPECIFIC = "specific"
FALLBACK = "fallback"
NO_OP = "no_op"
CLASSES = (SPECIFIC, FALLBACK, NO_OP)

NAMES_SCHEMA = {"rank": pl.Int64, "name": pl.Utf8, "op": pl.Utf8, "coverage": pl.Utf8, "kernels": pl.Int64}


@dataclass(frozen=True)
class OpCoverage:
    """Decode kernels per distinct name, with the op that claimed them and how specific it is."""

    names: pl.DataFrame  # NAMES_SCHEMA: one row per (rank, kernel name) of the decode steps
    steps: pl.DataFrame  # `rank, step` of the decode steps the counts are over

    @property
    def step_count(self) -> int:
        return self.steps.height

    def kernels(self, coverage: str) -> int:
        return int(self.names.filter(pl.col("coverage") == coverage)["kernels"].sum())

    @property
    def total(self) -> int:
        return int(self.names["kernels"].sum())

    def share(self, coverage: str) -> float:
        return self.kernels(coverage) / self.total if self.total else 0.0

    def top(self, coverage: str, limit: int = 5) -> pl.DataFrame:
        """The names of one class with the most kernels: `name, op, kernels, per_step`."""
        steps = max(self.step_count, 1)
        return (
            self.names.filter(pl.col("coverage") == coverage)
            .group_by("name", "op").agg(pl.col("kernels").sum())
            .sort("kernels", "name", descending=[True, False]).head(limit)
            .with_columns((pl.col("kernels") / steps).alias("per_step"))
        )

    def to_dict(self, limit: int = 10) -> dict:
        """The JSON form (docs/json-schema.md, `op_coverage`)."""
        steps = max(self.step_count, 1)
        return {
            "decode_kernels": self.total,
            "steps": self.step_count,
            **{
                coverage: {
                    "kernels": self.kernels(coverage),
                    "per_step": round(self.kernels(coverage) / steps, 2),
                    "share": round(self.share(coverage), 4),
                }
                for coverage in CLASSES
            },
            "top_fallback": _top_rows(self.top(FALLBACK, limit)),
            "top_no_op": _top_rows(self.top(NO_OP, limit)),
        }


def _top_rows(frame: pl.DataFrame) -> list[dict]:
    return [
        {"name": name, "op": op if op != UNMATCHED_OP else None, "kernels": kernels, "per_step": round(per_step, 2)}
        for name, op, kernels, per_step in frame.select("name", "op", "kernels", "per_step").iter_rows()
    ]


def op_coverage(activities: pl.DataFrame, decode_steps: pl.DataFrame, expectations: Expectations) -> OpCoverage:
    """Coverage of the decode kernels of `activities` (Steps.activities: `decode`, `op`)."""
    fallback_ops = [name for name, op in expectations.ops.items() if op.fallback]
    coverage = (
        pl.when(pl.col("op") == UNMATCHED_OP).then(pl.lit(NO_OP))
        .when(pl.col("op").is_in(fallback_ops)).then(pl.lit(FALLBACK))
        .otherwise(pl.lit(SPECIFIC))
    )
    names = (
        activities.lazy()
        .filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
        .group_by("rank", "name", "op").agg(pl.len().alias("kernels"))
        .with_columns(coverage.alias("coverage"))
        .select(list(NAMES_SCHEMA))
        .collect()
        .cast(NAMES_SCHEMA)
        .sort("rank", "kernels", "name", descending=[False, True, False])
    )
    return OpCoverage(names=names, steps=decode_steps.select("rank", "step"))
