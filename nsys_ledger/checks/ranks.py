"""Compare the ranks of a tensor/expert-parallel deployment step by step.

Ranks run in lock step: every collective ends together on all of them, so a slow rank does
not show as a longer step (its peers wait for it inside their collectives) but as more busy
time outside collectives, while its peers show more collective time. Hence:

* step time spread: per step, the longest minus the shortest step time among the ranks;
* slowest rank: the rank with the most busy time (Σ t_i, collectives excluded) per step;
* collective wait per rank: its collective time minus the least collective time of any rank
  in the same step (the time it spent waiting for the last peer to arrive).

This needs no common clock, so it works both for one export with several processes and for
several exports, one per rank (multifile.check_many stacks their step tables first).
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

RANK_INPUT_COLUMNS = ["rank", "step", "step_ns", "busy_ns", "collective_ns"]


@dataclass(frozen=True)
class RankComparison:
    per_rank: pl.DataFrame  # rank, steps, step_ns, busy_ns, collective_ns, collective_wait_ns (means per step)
    per_step: pl.DataFrame  # step, ranks, step_ns_min, step_ns_max, spread_ns, busy_ns_min, busy_ns_max, slowest_rank
    slowest_rank: int
    imbalance_pct: float  # (most - least mean busy time) / least, in percent
    max_spread_ns: int  # largest step time spread over all steps

    def describe(self) -> str:
        slow = self.per_rank.filter(pl.col("rank") == self.slowest_rank).row(0, named=True)
        return (
            f"rank {self.slowest_rank} is the slowest: {duration_text(slow['busy_ns'])} busy per step, "
            f"{self.imbalance_pct:.1f}% more than the least busy rank; step time spread up to "
            f"{duration_text(self.max_spread_ns)}"
        )


def duration_text(ns: float) -> str:
    """'24.39 ms', '172.6 us'."""
    return f"{ns / 1e6:.2f} ms" if abs(ns) >= 1_000_000 else f"{ns / 1000:.1f} us"


def compare_ranks(step_rows: pl.DataFrame) -> RankComparison | None:
    """Rank comparison over `rank, step, step_ns, busy_ns, collective_ns` rows (one per rank
    and step); None with fewer than two ranks. Only steps present on every rank count."""
    rows = step_rows.select(RANK_INPUT_COLUMNS).drop_nulls()
    ranks = rows["rank"].n_unique()
    if ranks < 2:
        return None
    common = rows.group_by("step").agg(pl.len().alias("_n")).filter(pl.col("_n") == ranks).select("step")
    rows = rows.join(common, on="step", how="semi")
    if rows.height == 0:
        return None
    rows = rows.with_columns(
        (pl.col("collective_ns") - pl.col("collective_ns").min().over("step")).alias("collective_wait_ns")
    )
    per_rank = rows.group_by("rank").agg(
        pl.len().cast(pl.Int64).alias("steps"),
        pl.col("step_ns").mean().round(0).cast(pl.Int64),
        pl.col("busy_ns").mean().round(0).cast(pl.Int64),
        pl.col("collective_ns").mean().round(0).cast(pl.Int64),
        pl.col("collective_wait_ns").mean().round(0).cast(pl.Int64),
    ).sort("rank")
    per_step = rows.group_by("step").agg(
        pl.len().cast(pl.Int64).alias("ranks"),
        pl.col("step_ns").min().alias("step_ns_min"),
        pl.col("step_ns").max().alias("step_ns_max"),
        (pl.col("step_ns").max() - pl.col("step_ns").min()).alias("spread_ns"),
        pl.col("busy_ns").min().alias("busy_ns_min"),
        pl.col("busy_ns").max().alias("busy_ns_max"),
        pl.col("rank").sort_by("busy_ns").last().alias("slowest_rank"),
    ).sort("step")
    slowest = per_rank.sort("busy_ns", "rank", descending=[True, False]).row(0, named=True)
    least_busy = per_rank["busy_ns"].min()
    imbalance = 100.0 * (slowest["busy_ns"] - least_busy) / least_busy if least_busy else 0.0
    return RankComparison(
        per_rank=per_rank,
        per_step=per_step,
        slowest_rank=int(slowest["rank"]),
        imbalance_pct=imbalance,
        max_spread_ns=int(per_step["spread_ns"].max()),
    )
