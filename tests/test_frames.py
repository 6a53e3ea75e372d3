"""frames.group_agg: the packed-key group-by gives the same groups as polars' own."""

from __future__ import annotations

import polars as pl
import pytest

from nsys_ledger.frames import group_agg, packed_key


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(frame.columns)


def test_packed_key_distinguishes_every_combination() -> None:
    frame = pl.DataFrame({"rank": [0, 0, 1, 1, 1], "step": [3, 4, 3, 3, 4], "device": [7, 7, 7, 7, 2]})
    key = packed_key(frame, ["rank", "step", "device"])
    assert key is not None
    values = frame.select(key.alias("k"))["k"].to_list()
    assert len(set(values)) == 4  # rows 2 and 3 are the same (1, 3, 7)
    assert values[2] == values[3]


def test_group_agg_equals_group_by_on_integer_keys() -> None:
    frame = pl.DataFrame({
        "rank": [0, 0, 1, 1, 1, 0],
        "step": [5, 5, 5, 6, 6, 6],
        "pid": [4242, 4242, 999_999, 999_999, 999_999, 4242],
        "start": [10, 20, 30, 40, 50, 60],
    })
    got = group_agg(frame, ["rank", "step", "pid"], pl.col("start").min().alias("first"), pl.len().alias("n"))
    assert got.columns == ["rank", "step", "pid", "first", "n"]
    assert _sorted(got).rows() == [(0, 5, 4242, 10, 2), (0, 6, 4242, 60, 1), (1, 5, 999_999, 30, 1),
                                   (1, 6, 999_999, 40, 2)]


@pytest.mark.parametrize("frame", [
    pl.DataFrame({"rank": [0, None, 0], "step": [1, 1, 2], "x": [1, 2, 3]}),  # nulls: not packed
    pl.DataFrame({"rank": ["a", "b", "a"], "step": [1, 1, 1], "x": [1, 2, 3]}),  # text key
    pl.DataFrame({"rank": [0, 2**40, 0], "step": [0, 2**40, 1], "x": [1, 2, 3]}),  # 82 bits
])
def test_group_agg_falls_back_where_keys_cannot_be_packed(frame: pl.DataFrame) -> None:
    assert packed_key(frame, ["rank", "step"]) is None
    got = group_agg(frame, ["rank", "step"], pl.col("x").sum())
    assert _sorted(got).equals(_sorted(frame.group_by("rank", "step").agg(pl.col("x").sum())))


def test_group_agg_reads_a_lazy_filter() -> None:
    frame = pl.DataFrame({"rank": [0, 0, 1], "step": [1, 1, 1], "decode": [True, False, True]})
    got = group_agg(frame.lazy().filter(pl.col("decode")), ["rank", "step"], pl.len().alias("n"))
    assert _sorted(got).rows() == [(0, 1, 1), (1, 1, 1)]


def test_negative_keys_are_packed_from_their_minimum() -> None:
    frame = pl.DataFrame({"a": [-5, -5, 3], "b": [-1, 0, -1]})
    got = group_agg(frame, ["a", "b"], pl.len().alias("n"))
    assert _sorted(got).rows() == [(-5, -1, 1), (-5, 0, 1), (3, -1, 1)]


def test_one_packing_keys_both_sides_of_a_join() -> None:
    left = pl.DataFrame({"pid": [7, 7, 9], "correlation": [1, 2, 2]})
    right = pl.DataFrame({"pid": [9, 7, 12], "correlation": [2, 500, 1]})  # wider ranges than the left
    key = packed_key([left, right], ["pid", "correlation"])
    assert key is not None
    joined = left.with_columns(key.alias("k")).join(right.with_columns(key.alias("k")), on="k", how="inner")
    assert joined.select("pid", "correlation").rows() == [(9, 2)]
    # a null on either side: no packing (the pair join leaves nulls unmatched)
    assert packed_key([left, right.with_columns(pl.lit(None, pl.Int64).alias("pid"))], ["pid", "correlation"]) is None
    # an empty side covers no values
    assert packed_key([left, right.clear()], ["pid", "correlation"]) is not None


def test_a_packed_join_key_with_nulls_matches_as_the_pair_join_does() -> None:
    """nulls_never_match: a null in any key gives a null packed key, which a join leaves
    unmatched, exactly as a join on the key columns themselves (nulls unequal) does."""
    left = pl.DataFrame({"pid": [7, 7, None, 9, 9], "node": [1, None, 2, 2, 3]})
    right = pl.DataFrame({"pid": [7, 7, None, 9], "node": [1, None, 2, 3], "v": [10, 20, 30, 40]})
    assert packed_key([left, right], ["pid", "node"]) is None
    key = packed_key([left, right], ["pid", "node"], nulls_never_match=True)
    assert key is not None
    by_pair = left.join(right, on=["pid", "node"], how="left", maintain_order="left")
    by_key = left.with_columns(key.alias("k")).join(
        right.select(key.alias("k"), "v"), on="k", how="left", maintain_order="left"
    ).drop("k")
    assert by_key.equals(by_pair)
    assert by_key["v"].to_list() == [10, None, None, None, 40]
    all_null = pl.DataFrame({"pid": [None, None], "node": [1, 2]}, schema={"pid": pl.Int64, "node": pl.Int64})
    assert packed_key([all_null, right], ["pid", "node"], nulls_never_match=True) is not None
