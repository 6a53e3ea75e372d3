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
