"""The per-layer heatmap's data: for every layer and ledger group, how far it is from expected.

"Expected" is the ledger's range for the layer's classes (a group no class declares for a
layer is expected to launch nothing there) and, inside the range, what the layer's peers
launch: layers of the same classes run the same code, so the commonest count among them in
the same step is the reference (a stray kernel in one layer stays inside the seed's wide
ranges but not inside its peers' count). Per (layer, group) the step that deviates most is
kept, so a fault in one step still shows.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.ledger.model import Expectations

GRID_KEY = ["layer", "group"]


def declared_layer_groups(expectations: Expectations) -> pl.DataFrame:
    """`layer, group, low, high, class_set, classes` for every layer a class names and every
    group any class declares (undeclared pairs expect 0)."""
    classes_of: dict[int, list[str]] = {}
    ranges: dict[tuple[int, str], tuple[float | None, float | None]] = {}
    for layer_class in expectations.layer_classes:
        for layer in layer_class.layers:
            classes_of.setdefault(layer, []).append(layer_class.name)
            for group, expected in layer_class.groups.items():
                ranges[(layer, group)] = (expected.low, expected.high)
    groups = sorted({g for c in expectations.layer_classes for g in c.groups})
    rows = [
        (layer, group, *ranges.get((layer, group), (0.0, 0.0)), " + ".join(classes_of[layer]), classes_of[layer])
        for layer in sorted(classes_of) for group in groups
    ]
    return pl.DataFrame(rows, orient="row", schema={
        "layer": pl.Int64, "group": pl.Utf8, "low": pl.Float64, "high": pl.Float64, "class_set": pl.Utf8,
        "classes": pl.List(pl.Utf8),
    })


def layer_counts_grid(counts: pl.DataFrame, expectations: Expectations) -> pl.DataFrame:
    """`rank, step, layer, group, count, low, high, class_set, classes` for every declared
    (layer, group) in every step, zero where nothing launched, plus observed undeclared pairs."""
    declared = declared_layer_groups(expectations)
    steps = counts.select("rank", "step").unique()
    observed = counts.filter(pl.col("layer") >= 0).group_by("rank", "step", *GRID_KEY).agg(pl.col("count").sum())
    grid = steps.join(declared, how="cross")
    return grid.join(observed, on=["rank", "step", *GRID_KEY], how="full", coalesce=True).with_columns(
        pl.col("count").fill_null(0),
        pl.col("low").fill_null(0.0),
        pl.col("high").fill_null(0.0),
        pl.col("class_set").fill_null("undeclared layer"),
        pl.col("classes").fill_null([]),
    )


def layer_deviations(full: pl.DataFrame) -> pl.DataFrame:
    """One row per (layer, group) of `layer_counts_grid`: `count` and `peer` in the most
    deviating step, `deviation` (signed: beyond the range, else from the peers), `low`, `high`,
    `count_min`, `count_max`, `steps_deviating`, `class_set`."""
    peers = (
        full.group_by("rank", "step", "class_set", "group", "count").agg(pl.len().alias("_layers"))
        .sort(["_layers", "count"], descending=[True, False])
        .group_by("rank", "step", "class_set", "group", maintain_order=True)
        .agg(pl.col("count").first().alias("peer"))
    )
    deviation = (
        pl.when(pl.col("count") < pl.col("low")).then(pl.col("count") - pl.col("low"))
        .when(pl.col("count") > pl.col("high")).then(pl.col("count") - pl.col("high"))
        .otherwise(pl.col("count") - pl.col("peer"))
    )
    per_step = full.join(peers, on=["rank", "step", "class_set", "group"], how="left").with_columns(
        deviation.alias("deviation")
    )
    return per_step.group_by(GRID_KEY).agg(
        pl.col("count").sort_by(pl.col("deviation").abs()).last(),
        pl.col("peer").sort_by(pl.col("deviation").abs()).last(),
        pl.col("deviation").sort_by(pl.col("deviation").abs()).last(),
        pl.col("low").first(),
        pl.col("high").first(),
        pl.col("count").min().alias("count_min"),
        pl.col("count").max().alias("count_max"),
        (pl.col("deviation") != 0).sum().cast(pl.Int64).alias("steps_deviating"),
        pl.col("class_set").first(),
    ).sort(GRID_KEY)
