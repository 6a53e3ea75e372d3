"""What the HTML report and the diff look at: findings per step, the steps to draw, distributions.

Reports of a 1M-kernel trace embed per-step aggregates and the kernels of two steps only: a
representative step (the median duration) and the worst step (the most failing checks, then
the longest). The failing steps come from each finding's `steps` text (the compact form
written by `checks.ledger.describe_steps`), so every check, present or future, counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from nsys_ledger.api import Result

STEP_KEY = ["rank", "step"]
_RANK_PREFIX = re.compile(r"^rank (\d+): (.*)$")


def parse_step_list(text: str, all_steps: pl.DataFrame) -> pl.DataFrame:
    """`rank, step` rows named by a finding's `steps` text ("0-3, 7", "rank 1: 2; rank 2: 0-1").

    The inverse of `describe_steps`: without a rank prefix the steps are rank 0's; "all" names
    every step of `all_steps`; anything else that is not a step list ("none", "") names none.
    """
    empty = pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64})
    text = (text or "").strip()
    if text == "all":
        return all_steps.select(STEP_KEY)
    pairs: list[tuple[int, int]] = []
    for part in text.split(";"):
        part = part.strip()
        match = _RANK_PREFIX.match(part)
        rank, steps_text = (int(match.group(1)), match.group(2)) if match else (0, part)
        for item in steps_text.split(","):
            bounds = item.strip().split("-")
            if not all(b.strip().isdigit() for b in bounds) or len(bounds) > 2:
                continue
            low, high = int(bounds[0]), int(bounds[-1])
            pairs.extend((rank, step) for step in range(low, high + 1))
    if not pairs:
        return empty
    return pl.DataFrame(pairs, schema={"rank": pl.Int64, "step": pl.Int64}, orient="row").unique()


def findings_per_step(result: Result) -> pl.DataFrame:
    """Every decode step with `findings`: how many findings name it (0 for clean steps)."""
    steps = result.step_table.select(STEP_KEY)
    named = [parse_step_list(f.steps, steps) for f in result.findings]
    counts = (
        pl.concat(named).group_by(STEP_KEY).agg(pl.len().cast(pl.Int64).alias("findings"))
        if named
        else pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "findings": pl.Int64})
    )
    return steps.join(counts, on=STEP_KEY, how="left").with_columns(pl.col("findings").fill_null(0))


@dataclass(frozen=True)
class SelectedStep:
    rank: int
    step: int
    role: str  # "representative" or "worst"
    why: str  # one line for the page, e.g. "median duration 29.0 ms"


def select_steps(result: Result) -> list[SelectedStep]:
    """The representative step (median duration) and the worst one (most findings, then longest).

    One entry when both are the same step; none without decode steps.
    """
    table = result.step_table
    if table.height == 0:
        return []
    timed = table.select(*STEP_KEY, pl.col("duration_ns").fill_null(0)).join(
        findings_per_step(result), on=STEP_KEY
    )
    median_ns = timed["duration_ns"].median()
    representative = timed.sort(
        (pl.col("duration_ns") - median_ns).abs(), *STEP_KEY
    ).row(0, named=True)
    worst = timed.sort(["findings", "duration_ns", "rank", "step"], descending=[True, True, False, False]).row(
        0, named=True
    )
    chosen = [
        SelectedStep(representative["rank"], representative["step"], "representative",
                     f"the step closest to the median duration ({median_ns / 1e6:.3f} ms)"),
    ]
    if (worst["rank"], worst["step"]) != (representative["rank"], representative["step"]):
        reason = (
            f"named by {worst['findings']} finding(s), the longest of those steps"
            if worst["findings"]
            else "no finding names a step: the longest step"
        )
        chosen.append(SelectedStep(worst["rank"], worst["step"], "worst",
                                   f"{reason} ({worst['duration_ns'] / 1e6:.3f} ms)"))
    return chosen


def value_distribution(values: pl.Series, *, max_distinct: int = 4) -> str:
    """Per-step values in a few characters: "156 x4", "2002 x3, 2003 x1", or "min 3 / median 5 / max 9"."""
    values = values.drop_nulls()
    if values.len() == 0:
        return "-"
    counts = values.value_counts(sort=True, name="n").sort(["n", values.name], descending=[True, False])
    if counts.height <= max_distinct:
        return ", ".join(f"{_number(v)} ×{n}" for v, n in counts.iter_rows())
    return f"min {_number(values.min())} / median {_number(values.median())} / max {_number(values.max())}"


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# Which per-step column each check of `checks.ledger` compares, by its expectations key.
_STEP_COLUMN_OF_SOURCE = {
    "total": "kernels",
    "h2d": "h2d",
    "graphs.launches_per_step": "graph_launches",
    "gaps.threshold_us": "gaps",
}


_LAYER_CLASS_SOURCE = re.compile(r"^layers\.classes\.(?P<layer_class>[^.]+)\.groups\.(?P<group>[^.]+)$")


def outcome_values(result: Result, source: str, layer_counts: pl.DataFrame | None = None) -> pl.Series | None:
    """The values a check compared: one per decode step, or for a per-layer range check one per
    layer of the class and step (from `layer_counts`, report.layer_grid.layer_counts_grid).
    None when the check is not such a count."""
    layer_check = _LAYER_CLASS_SOURCE.match(source)
    if layer_check:
        if layer_counts is None:
            return None
        return layer_counts.filter(
            pl.col("classes").list.contains(layer_check["layer_class"]) & (pl.col("group") == layer_check["group"])
        )["count"]
    if source.startswith("anchors."):
        op = source.removeprefix("anchors.")
        return result.op_table[op] if op in result.op_table.columns else None
    column = _STEP_COLUMN_OF_SOURCE.get(source)
    if column is None or column not in result.step_table.columns:
        return None
    return result.step_table[column]
