"""Canonical op of every kernel, from the expectations' op regexes.

A trace has millions of kernel rows but only hundreds or thousands of distinct names, so the
regexes run once per distinct name and the result is joined back.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.ledger.model import Expectations

UNMATCHED_OP = "other"


def op_table(names: pl.Series, expectations: Expectations | None) -> pl.DataFrame:
    """`name -> op, group` for each distinct name; first declared op that matches wins."""
    distinct = names.unique().drop_nulls().to_list()
    compiled = expectations.op_regexes() if expectations else []
    groups = {name: op.group for name, op in expectations.ops.items()} if expectations else {}
    ops: list[str] = []
    for kernel_name in distinct:
        op = next((op_name for op_name, rx in compiled if rx.search(kernel_name)), UNMATCHED_OP)
        ops.append(op)
    return pl.DataFrame(
        {
            "name": distinct,
            "op": ops,
            "group": [groups.get(op) for op in ops],
        },
        schema={"name": pl.Utf8, "op": pl.Utf8, "group": pl.Utf8},
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
