"""Steps of each kind: how many were found and checked, and the checks of the prefill and mixed
steps against the ledger's [kinds.KIND] sections.

Decode steps are checked by the rest of the ledger (checks.ledger, checks.timeline); a step of
another kind is checked only where the ledger declares its kind, and is counted either way, so
a trace whose steps are all mixed says so instead of showing nothing.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.attribution.step_kinds import DEFAULT_KIND, STEP_KINDS
from nsys_ledger.attribution.steps import Steps
from nsys_ledger.checks.ledger import CheckOutcome, _outcome, range_check
from nsys_ledger.ledger.model import Expectations

KIND_COUNT_SCHEMA = {"kind": pl.Utf8, "found": pl.Int64, "checked": pl.Int64, "declared": pl.Boolean}


def kind_counts(steps: Steps, expectations: Expectations | None) -> pl.DataFrame:
    """Per step kind (decode, prefill, mixed, in that order; a kind with no step is left out):
    complete steps `found`, steps `checked`, and whether the ledger `declared` the kind.

    A decode step is checked when it is a decode step of the ledger (not excluded for another
    reason); a step of another kind when the ledger has a section for its kind."""
    declared = set(expectations.kinds) if expectations is not None else set()
    rows = []
    for kind in STEP_KINDS:
        found = steps.of_kind(kind).height
        if kind == DEFAULT_KIND:
            checked = steps.decode.height if expectations is not None else 0
            is_declared = expectations is not None
        else:
            is_declared = kind in declared
            checked = found if is_declared else 0
        if found:
            rows.append((kind, found, checked, is_declared))
    return pl.DataFrame(rows, schema=KIND_COUNT_SCHEMA, orient="row")


def kind_step_table(steps: Steps, ops: list[str]) -> pl.DataFrame:
    """One row per complete step of a kind other than decode: `rank, kind, step` (index among
    the steps of that kind in the rank), `kernels`, and per op in `ops` its kernels. Computed
    where the activities are at hand, kept in the Result (a multi-file check stacks it)."""
    windows = steps.windows.filter(pl.col("complete") & (pl.col("kind") != DEFAULT_KIND)).select(
        "key", "window", "rank", "kind", pl.col("kind_step").alias("step"))
    has_op = "op" in steps.activities.columns
    kernels = (
        steps.activities.lazy()
        .filter(pl.col("window").is_not_null() & (pl.col("activity") == "kernel"))
        .select("key", "window", *(["op"] if has_op else []))  # not the decode step's rank, step
        .join(windows.lazy(), on=["key", "window"], how="inner")
    )
    op_columns = [(pl.col("op") == op).sum().cast(pl.Int64).alias(op) for op in ops if has_op]
    counted = kernels.group_by("rank", "kind", "step").agg(pl.len().cast(pl.Int64).alias("kernels"), *op_columns)
    table = windows.select("rank", "kind", "step").join(counted.collect(), on=["rank", "kind", "step"], how="left")
    table = table.with_columns(pl.exclude("rank", "kind", "step").fill_null(0))
    missing = [pl.lit(0, pl.Int64).alias(op) for op in ops if op not in table.columns]
    return table.with_columns(missing).sort("rank", "kind", "step")


def steps_of_kind(kind_table: pl.DataFrame | None, kind: str, ops: list[str]) -> pl.DataFrame:
    """The rows of `kind_table` of one kind, with a zero column for every op in `ops` it lacks
    (a stacked table has the ops some rank saw)."""
    if kind_table is None or kind_table.height == 0:
        columns = ["rank", "step", "kernels", *ops]
        return pl.DataFrame(schema=dict.fromkeys(columns, pl.Int64))
    table = kind_table.filter(pl.col("kind") == kind)
    missing = [pl.lit(0, pl.Int64).alias(op) for op in ops if op not in table.columns]
    return table.with_columns(missing).with_columns(pl.col(op).fill_null(0) for op in ops)


def check_step_kinds(expectations: Expectations, kind_table: pl.DataFrame | None) -> list[CheckOutcome]:
    """The checks of every declared kind that has steps: its total and each of its anchors."""
    outcomes: list[CheckOutcome] = []
    for kind, section in expectations.kinds.items():
        table = steps_of_kind(kind_table, kind, [a.op for a in section.anchors])
        if table.height == 0:
            continue
        for anchor in section.anchors:
            findings = range_check(
                table, anchor.op, anchor.expected, check="kind_anchor", subject=f"{kind}:{anchor.op}",
                source=anchor.source, what=f"{anchor.op} kernels in {kind} steps", hint_low=anchor.hint_low,
                hint_high=anchor.hint_high, formula=anchor.formula,
            )
            outcomes.append(_outcome(f"{kind} steps: anchor {anchor.op}", anchor.source, anchor.expected,
                                     table[anchor.op], findings))
        if section.total.low is not None or section.total.high is not None:
            source = f"kinds.{kind}.total"
            findings = range_check(
                table, "kernels", section.total, check="kind_total", subject=f"{kind}:kernels", source=source,
                what=f"kernels in {kind} steps", hint_low=section.total_hint_low, hint_high=section.total_hint_high,
                formula=section.total_formula,
            )
            outcomes.append(_outcome(f"{kind} steps: total kernels per step", source, section.total,
                                     table["kernels"], findings))
    return outcomes
