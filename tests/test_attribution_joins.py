"""The narrow joins of the attribution keep the activities' rows, order and columns."""

from __future__ import annotations

import polars as pl
import pytest

from nsys_ledger.attribution.activities import with_launch_calls

ACTIVITIES = {"row": pl.UInt32, "pid": pl.Int64, "correlation": pl.Int64, "name": pl.Utf8}
CALLS = {"pid": pl.Int64, "correlation": pl.Int64, "start": pl.Int64, "end": pl.Int64, "global_tid": pl.Int64,
         "kind": pl.Utf8}


@pytest.mark.parametrize("correlation_base", [7, 1 << 33], ids=["packed key", "pair key (id above 32 bits)"])
def test_launch_calls_are_joined_row_for_row(correlation_base):
    c = correlation_base
    activities = pl.DataFrame(
        [(0, 42, c + 2, "b"), (1, 42, c + 1, "a"), (2, 42, c + 2, "b2"), (3, 43, c + 1, "other pid"),
         (4, 42, None, "no correlation")],
        schema=ACTIVITIES, orient="row",
    )
    calls = pl.DataFrame(
        [(42, c + 1, 100, 110, 9, "kernel_launch"), (42, c + 2, 200, 230, 9, "graph_launch"),
         (42, c + 2, 999, 999, 9, "graph_launch"),  # a duplicate correlation: the first one counts
         (44, c + 1, 300, 310, 9, "kernel_launch")],
        schema=CALLS, orient="row",
    )
    joined = with_launch_calls(activities, calls)
    assert joined.columns == [*ACTIVITIES, "api_start", "api_end", "api_tid", "api_kind"]
    assert joined.select("row", "api_start", "api_kind").rows() == [
        (0, 200, "graph_launch"), (1, 100, "kernel_launch"), (2, 200, "graph_launch"), (3, None, None),
        (4, None, None),
    ]


@pytest.mark.parametrize("case", ["distinct keys: array lookup", "a repeated key: join", "sparse keys: join"])
def test_launch_calls_by_array_lookup_equal_the_join(case):
    """with_launch_calls looks the calls up by position in an array over the packed key when
    the keys are distinct and dense enough; whichever way, the columns are the left join's,
    the first call of a repeated key counting."""
    spread = 10**9 if case.startswith("sparse") else 1
    activities = pl.DataFrame(
        [(i, 42 + (i % 2), 5 + (i % 7) * spread, f"k{i}") for i in range(40)], schema=ACTIVITIES, orient="row",
    )
    calls = [(42 + (j % 2), 5 + (j % 7) * spread, 100 + j, 110 + j, 9, "kernel_launch") for j in range(12)
             if (j % 2, j % 7) != (1, 3)]  # some activities have no call
    if case.startswith("a repeated"):
        calls.append((42, 5, 999, 999, 9, "graph_launch"))  # the first (42, 5) counts
    calls = pl.DataFrame(calls, schema=CALLS, orient="row")
    joined = with_launch_calls(activities, calls)
    renamed = calls.select("pid", "correlation", pl.col("start").alias("api_start"), pl.col("end").alias("api_end"),
                           pl.col("global_tid").alias("api_tid"), pl.col("kind").alias("api_kind"))
    expected = activities.hstack(
        activities.select("pid", "correlation")
        .join(renamed.unique(subset=["pid", "correlation"], keep="first"), on=["pid", "correlation"], how="left",
              maintain_order="left")
        .drop("pid", "correlation")
    )
    assert joined.equals(expected)
    assert joined["api_start"].null_count() > 0
