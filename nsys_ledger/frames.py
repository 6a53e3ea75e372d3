"""Grouping helpers for the hot paths over millions of GPU activities.

Polars groups by several key columns through a row encoding of those columns: on the
10M-kernel decode trace a group-by on (rank, step, pid, device) took three times as long and
hundreds of MB more than the same group-by on one Int64. Integer keys whose value ranges
fit together in 62 bits (rank, step, layer, pid, device, correlation ids of one trace all
do) are therefore packed into one Int64 and grouped by that.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

Frame = pl.DataFrame | pl.LazyFrame
_PACKED = "__packed_key"
_PACKED_BITS = 62  # leaves the sign bit and one spare


def group_agg(frame: Frame, keys: Sequence[str], *aggs: pl.Expr) -> pl.DataFrame:
    """`frame.group_by(keys).agg(*aggs)`: the key columns first, groups in no set order.

    `frame` may be lazy (a filter of a bigger frame): only the columns the keys and
    aggregations name are read.
    """
    lazy = frame.lazy()
    packed = packed_key(lazy, keys)
    if packed is None:
        return lazy.group_by(keys).agg(*aggs).collect()
    return (
        lazy.group_by(packed.alias(_PACKED))
        .agg(*[pl.col(k).first() for k in keys], *aggs)
        .drop(_PACKED)
        .collect()
    )


def left_join_keys(frame: pl.DataFrame, lookup: pl.DataFrame, keys: Sequence[str]) -> pl.DataFrame:
    """`frame.select(keys)` left-joined with `lookup` on `keys`, in `frame`'s order.

    Through one packed Int64 key when the keys fit (a null in any key matches nothing either
    way): a join on two Int64 columns over a million activities goes through a row encoding of
    both and takes about twice as long."""
    keys = list(keys)
    packed = packed_key([frame, lookup], keys, nulls_never_match=True)
    if packed is None:
        return frame.select(keys).join(lookup, on=keys, how="left", maintain_order="left")
    found = frame.select(*keys, packed.alias(_PACKED)).join(
        lookup.select(packed.alias(_PACKED), pl.exclude(keys)), on=_PACKED, how="left", maintain_order="left"
    )
    return found.drop(_PACKED)


def packed_key(
    frames: Frame | Sequence[Frame], keys: Sequence[str], *, nulls_never_match: bool = False
) -> pl.Expr | None:
    """One Int64 expression equal for two rows exactly when all `keys` are, or None when a
    key is not an integer, holds nulls, or the keys' ranges need more than 62 bits.

    Given several frames (the two sides of a join), the packing covers the values of all of
    them, so the same expression keys each side. `nulls_never_match`: for a join (nulls
    unequal, polars' default), a row with a null in any key gets a null packed key, which
    matches nothing, as a join on the key columns themselves does."""
    frames = [frames] if isinstance(frames, (pl.DataFrame, pl.LazyFrame)) else list(frames)
    if len(keys) < 2:
        return None
    lows, highs = dict.fromkeys(keys), dict.fromkeys(keys)
    for frame in frames:
        bounds = _key_bounds(frame.lazy(), keys, allow_nulls=nulls_never_match)
        if bounds is None:
            return None
        for k, (low, high) in bounds.items():
            if low is None:  # no rows: no values to cover
                continue
            lows[k] = low if lows[k] is None else min(lows[k], low)
            highs[k] = high if highs[k] is None else max(highs[k], high)
    packed: pl.Expr | None = None
    shift = 0
    for k in reversed(keys):
        low, high = lows[k] or 0, highs[k] or 0
        term = (pl.col(k).cast(pl.Int64) - low) * (1 << shift)
        shift += max(int(high - low).bit_length(), 1)
        if shift > _PACKED_BITS:
            return None
        packed = term if packed is None else packed + term
    return packed


def _key_bounds(
    lazy: pl.LazyFrame, keys: Sequence[str], *, allow_nulls: bool = False
) -> dict[str, tuple[int | None, int | None]] | None:
    """`key -> (min, max)` of the non-null values, or None when a key is not an integer or
    holds a null (unless `allow_nulls`)."""
    schema = lazy.collect_schema()
    if not all(schema[k].is_integer() for k in keys):
        return None
    bounds = lazy.select(
        *[pl.col(k).min().cast(pl.Int64, strict=False).alias(f"{k}\x00min") for k in keys],
        *[pl.col(k).max().cast(pl.Int64, strict=False).alias(f"{k}\x00max") for k in keys],
        *[pl.col(k).null_count().alias(f"{k}\x00nulls") for k in keys],
        pl.len().alias("\x00rows"),
    ).collect().row(0, named=True)
    found = {}
    for k in keys:
        low, high = bounds[f"{k}\x00min"], bounds[f"{k}\x00max"]
        if bounds[f"{k}\x00nulls"] and not allow_nulls:
            return None  # a null
        if (low is None) != (high is None) or (
            low is None and bounds["\x00rows"] > bounds[f"{k}\x00nulls"]
        ):
            return None  # a value outside Int64
        found[k] = (low, high)
    return found
