"""Compare two checks of the same deployment (BEFORE and AFTER a change) and say if the ledger got worse.

Per-step figures are medians over the decode steps of each trace (robust to one odd step,
and comparable between traces with different step counts): kernels, each op, each layer
group when both traces have layers, CPU submissions, graph launches, H2D copies, gaps; the
step time as median and p90. Kernel names that appear or vanish, gap causes, and findings
that are new or resolved are listed too.

The worsening rule is declared in `WorseningRule` (defaults: any new launch per step, a new
gap cause, more graph launches, more H2D or pageable H2D copies, a newly failing check; step
time only when a slowdown limit is given, since timing is noisy). `TraceDiff.worse` is what
`nsys-ledger diff` turns into exit code 1, so the command can gate a pull request.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.attribution.layers import CAPTURE_NVTX, INFERRED, REPLAY_NVTX
from nsys_ledger.attribution.kernel_names import canonical_kernel_name
from nsys_ledger.checks.ledger import compact_ranges
from nsys_ledger.diff_time import time_changes

NO_CAUSE = "unattributed"  # gaps of a result without gap causes


@dataclass(frozen=True)
class WorseningRule:
    """When AFTER is worse than BEFORE. Allowances are per-step medians; None switches a rule off."""

    extra_launches_per_step: float | None = 0  # kernels per step, any op, any layer group
    extra_submissions_per_step: float | None = 0  # CPU launch calls per step
    extra_graph_launches_per_step: float | None = 0
    extra_h2d_per_step: float | None = 0  # H2D copies, and pageable ones
    new_gap_cause: bool = True  # a gap cause AFTER has in any step and BEFORE has in none
    new_failing_check: bool = True  # a finding whose expectation BEFORE did not violate
    step_time_slowdown_pct: float | None = None  # p90 step time rise beyond this percentage
    time_tolerance_pct: float = 10.0  # op and layer GPU time changes within this are not listed (diff_time)
    op_time_slowdown_pct: float | None = None  # an op's or layer's median GPU time rise beyond this percentage

    def describe(self) -> list[str]:
        """The rule in words, one line per part that is on."""
        parts = []
        for allowance, what in (
            (self.extra_launches_per_step, "kernel launches per step (in all, per op, per layer group)"),
            (self.extra_submissions_per_step, "CPU submissions (launch calls) per step"),
            (self.extra_graph_launches_per_step, "CUDA graph launches per step"),
            (self.extra_h2d_per_step, "H2D copies per step (in all, and pageable)"),
        ):
            if allowance is not None:
                parts.append(f"more {what} than BEFORE" + (f" by over {allowance:g}" if allowance else ""))
        if self.new_gap_cause:
            parts.append("an idle-gap cause that BEFORE did not have")
        if self.new_failing_check:
            parts.append("a ledger check that fails in AFTER but not in BEFORE")
        if self.step_time_slowdown_pct is not None:
            parts.append(f"p90 step time more than {self.step_time_slowdown_pct:g}% above BEFORE")
        if self.op_time_slowdown_pct is not None:
            parts.append(f"an op's or layer's median GPU time more than {self.op_time_slowdown_pct:g}% above BEFORE")
        return parts


@dataclass(frozen=True)
class FigureChange:
    """One per-step figure in both traces."""

    name: str  # "kernels per step", "op per_token_group_quant", "layer 41 ffn", ...
    kind: str  # "step", "op", "layer", "time", "op_time", "layer_time" (the last two in µs)
    before: float | None
    after: float | None
    worse_by: str | None = None  # the part of the rule it breaks, or None

    @property
    def change(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before

    @property
    def change_pct(self) -> float | None:
        if self.change is None or not self.before:
            return None
        return 100 * self.change / self.before


@dataclass(frozen=True)
class TraceDiff:
    before: Result
    after: Result
    rule: WorseningRule
    step_figures: tuple[FigureChange, ...]  # kernels, submissions, graph launches, H2D, gaps, step time
    op_changes: tuple[FigureChange, ...]  # ops whose median per step changed
    layer_changes: tuple[FigureChange, ...] | None  # None when a trace has no layers
    new_kernels: pl.DataFrame  # name, op, per_step (in AFTER)
    vanished_kernels: pl.DataFrame  # name, op, per_step (in BEFORE)
    gap_causes: pl.DataFrame  # cause, before_per_step, after_per_step, before_us_per_step, after_us_per_step
    new_findings: tuple[str, ...]  # expectation keys violated in AFTER only
    resolved_findings: tuple[str, ...]  # ... in BEFORE only
    rank_step_time: pl.DataFrame | None  # rank, before_ms, after_ms (median), with several ranks
    reasons: tuple[str, ...] = field(default=())  # why AFTER is worse (empty: it is not)
    # how each trace found its decode kernels' layers ("nvtx", "inferred", None without layers);
    # layer groups gate only when both found them the same way (see _layer_changes)
    layer_sources: tuple[str | None, str | None] = (None, None)
    # median GPU time per step of ops and layers that moved beyond the rule's tolerance (µs);
    # None when a trace has no time use (layers: no layers)
    op_time_changes: tuple[FigureChange, ...] | None = None
    layer_time_changes: tuple[FigureChange, ...] | None = None

    @property
    def worse(self) -> bool:
        return bool(self.reasons)

    @property
    def exit_code(self) -> int:
        return 1 if self.worse else 0


def diff_results(before: Result, after: Result, rule: WorseningRule | None = None) -> TraceDiff:
    rule = rule or WorseningRule()
    step_figures = _step_figures(before, after, rule)
    op_changes = _op_changes(before, after, rule)
    layer_changes = _layer_changes(before, after, rule)
    op_time, layer_time = (_time_changes(before, after, rule, column) for column in ("op", "layer"))
    gap_causes = _gap_causes(before, after)
    new_causes = gap_causes.filter((pl.col("before_gaps") == 0) & (pl.col("after_gaps") > 0))["cause"].to_list()
    before_sources = {f.source for f in before.findings}
    after_sources = {f.source for f in after.findings}
    new_findings = tuple(s for s in dict.fromkeys(f.source for f in after.findings) if s not in before_sources)
    resolved = tuple(s for s in dict.fromkeys(f.source for f in before.findings) if s not in after_sources)

    reasons = [f"{c.name}: {_fmt(c.before)} -> {_fmt(c.after)} ({c.worse_by})"
               for c in (*step_figures, *op_changes, *(layer_changes or ()), *(op_time or ()), *(layer_time or ()))
               if c.worse_by]
    if rule.new_gap_cause:
        reasons += [f"new idle-gap cause {cause!r}" for cause in new_causes]
    if rule.new_failing_check:
        reasons += [f"newly failing check {source}" for source in new_findings]
    return TraceDiff(
        before=before, after=after, rule=rule, step_figures=step_figures, op_changes=op_changes,
        layer_changes=layer_changes, new_kernels=_kernel_names_only_in(after, before),
        vanished_kernels=_kernel_names_only_in(before, after), gap_causes=gap_causes, new_findings=new_findings,
        resolved_findings=resolved, rank_step_time=_rank_step_time(before, after), reasons=tuple(reasons),
        layer_sources=(layer_source(before), layer_source(after)), op_time_changes=op_time,
        layer_time_changes=layer_time,
    )


def _time_changes(before: Result, after: Result, rule: WorseningRule, column: str) -> tuple[FigureChange, ...] | None:
    """Ops (`column="op"`) or layers whose median GPU time per step moved beyond the tolerance."""
    changes = time_changes(before, after, column, tolerance_pct=rule.time_tolerance_pct,
                           slowdown_pct=rule.op_time_slowdown_pct)
    if changes is None:
        return None
    return tuple(FigureChange(f"{column} {value} (us)", f"{column}_time", b, a, worse)
                 for value, b, a, worse in changes)


def _median(values: pl.Series) -> float | None:
    values = values.drop_nulls()
    return float(values.median()) if values.len() else None


def _rose(before: float | None, after: float | None, allowance: float | None) -> bool:
    if allowance is None or before is None or after is None:
        return False
    return after - before > allowance


def _step_figures(before: Result, after: Result, rule: WorseningRule) -> tuple[FigureChange, ...]:
    rows = [
        ("kernels per step", "kernels", rule.extra_launches_per_step, "new launches per step"),
        ("CPU submissions per step", "cpu_submissions", rule.extra_submissions_per_step, "more CPU submissions"),
        ("graph launches per step", "graph_launches", rule.extra_graph_launches_per_step, "more graph launches"),
        ("H2D copies per step", "h2d", rule.extra_h2d_per_step, "more H2D copies"),
        ("pageable H2D copies per step", "h2d_pageable", rule.extra_h2d_per_step, "more pageable H2D copies"),
        ("idle gaps per step", "gaps", None, None),
        ("idle time in gaps per step (us)", "gap_ns", None, None),
    ]
    figures = []
    for name, column, allowance, why in rows:
        b, a = _median(before.step_table[column]), _median(after.step_table[column])
        if column == "gap_ns":
            b, a = (None if b is None else b / 1000), (None if a is None else a / 1000)
        figures.append(FigureChange(name, "step", b, a, why if _rose(b, a, allowance) else None))
    figures += _step_time_figures(before, after, rule)
    return tuple(figures)


def _step_time_figures(before: Result, after: Result, rule: WorseningRule) -> list[FigureChange]:
    def ms(result: Result, quantile: float) -> float | None:
        values = result.step_table["duration_ns"].drop_nulls()
        return float(values.quantile(quantile, interpolation="linear")) / 1e6 if values.len() else None

    median = FigureChange("step time median (ms)", "time", ms(before, 0.5), ms(after, 0.5))
    p90_before, p90_after = ms(before, 0.9), ms(after, 0.9)
    slower = (
        rule.step_time_slowdown_pct is not None and p90_before and p90_after is not None
        and 100 * (p90_after - p90_before) / p90_before > rule.step_time_slowdown_pct
    )
    p90 = FigureChange("step time p90 (ms)", "time", p90_before, p90_after,
                       f"slower than {rule.step_time_slowdown_pct:g}%" if slower else None)
    return [median, p90]


def _op_changes(before: Result, after: Result, rule: WorseningRule) -> tuple[FigureChange, ...]:
    """Ops whose median count per step differs (all ops of either trace, zero where absent)."""
    key = {"rank", "step"}
    ops = list(dict.fromkeys([c for c in (*before.op_table.columns, *after.op_table.columns) if c not in key]))
    changes = []
    for op in ops:
        b = _median(before.op_table[op]) if op in before.op_table.columns else 0.0
        a = _median(after.op_table[op]) if op in after.op_table.columns else 0.0
        b, a = b or 0.0, a or 0.0
        if a != b:
            worse = "new launches per step" if _rose(b, a, rule.extra_launches_per_step) else None
            changes.append(FigureChange(f"op {op}", "op", b, a, worse))
    return tuple(changes)


def layer_group_medians(result: Result) -> pl.DataFrame | None:
    """`layer, group, count`: median launches per step of each layer's ledger group, or None
    when the result has no per-layer counts (layers not attributed)."""
    layers = getattr(result, "layers", None)
    counts = getattr(layers, "counts", None) if layers is not None else None
    if counts is None or not isinstance(counts, pl.DataFrame) or counts.height == 0:
        return None
    needed = {"rank", "step", "layer", "group", "count"}
    if not needed <= set(counts.columns):
        return None
    return counts.group_by("layer", "group").agg(pl.col("count").median().alias("count")).sort("layer", "group")


def layer_source(result: Result) -> str | None:
    """How most decode kernels of `result` got their layer: "nvtx" (layer-wise ranges, at replay
    or at graph capture), "inferred" (from the kernel sequence), None when none got one."""
    if result.layers is None:
        return None
    by_how = result.layers.kernels_by_how()
    by_source = {"nvtx": by_how.get(REPLAY_NVTX, 0) + by_how.get(CAPTURE_NVTX, 0),
                 "inferred": by_how.get(INFERRED, 0)}
    source, kernels = max(by_source.items(), key=lambda item: item[1])
    return source if kernels else None


def _layer_changes(before: Result, after: Result, rule: WorseningRule) -> tuple[FigureChange, ...] | None:
    b, a = layer_group_medians(before), layer_group_medians(after)
    if b is None or a is None:
        return None
    # Layers read from NVTX module paths and layers inferred from the kernel sequence may put a
    # kernel in different groups (a kernel under the indexer module is indexer work by its path,
    # attention by its op when inferred), as between an nsys export with capture-time NVTX and a
    # PyTorch profiler trace of graph replays: the changes are listed, but gate only when both
    # traces found their layers the same way.
    comparable = layer_source(before) == layer_source(after)
    changed = b.join(a, on=["layer", "group"], how="full", coalesce=True, suffix="_after").with_columns(
        pl.col("count").fill_null(0), pl.col("count_after").fill_null(0)
    ).filter(pl.col("count") != pl.col("count_after"))
    # Layers with the same change in one line ("layers 3-77 ffn"): a fault repeats in every layer.
    runs = changed.group_by("group", "count", "count_after").agg(pl.col("layer").sort()).sort(
        pl.col("layer").list.first(), "group"
    )
    return tuple(
        FigureChange(f"{'layer' if len(layers) == 1 else 'layers'} {compact_ranges(layers)} {group}", "layer",
                     float(cb), float(ca),
                     "new launches per step" if comparable and _rose(cb, ca, rule.extra_launches_per_step)
                     else None)
        for group, cb, ca, layers in runs.iter_rows()
    )


def _decode_kernel_names(result: Result) -> pl.DataFrame:
    """`name, op, per_step, canonical`: launches per decode step of every kernel (mean over
    steps), by its canonical name, so that an nsys export and a PyTorch profiler trace of the
    same build name the same kernels alike; `name` is one of the trace's own spellings."""
    steps = max(result.step_table.height, 1)
    kernels = result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
    spellings = kernels.select(pl.col("name").unique())
    canonical = spellings.with_columns(
        pl.Series("canonical", [canonical_kernel_name(n) for n in spellings["name"]], dtype=pl.String)
    )
    return (
        kernels.join(canonical, on="name", how="left")
        .group_by("canonical")
        .agg(pl.col("name").min(), pl.col("op").first(), (pl.len() / steps).alias("per_step"))
        .select("name", "op", "per_step", "canonical")
        .sort("per_step", "name", descending=[True, False])
    )


def _kernel_names_only_in(result: Result, other: Result) -> pl.DataFrame:
    names = _decode_kernel_names(result)
    return names.join(_decode_kernel_names(other).select("canonical"), on="canonical", how="anti").drop("canonical")


def _gap_causes(before: Result, after: Result) -> pl.DataFrame:
    """Per cause: gaps and idle µs per step in each trace (causes of either trace)."""
    def per_cause(result: Result, prefix: str) -> pl.DataFrame:
        steps = max(result.step_table.height, 1)
        gaps = result.gaps
        cause = pl.col("cause").fill_null("unknown") if "cause" in gaps.columns else pl.lit(NO_CAUSE)
        return gaps.group_by(cause.alias("cause")).agg(
            (pl.len() / steps).alias(f"{prefix}_gaps"), (pl.col("duration").sum() / steps / 1000).alias(f"{prefix}_us")
        )

    joined = per_cause(before, "before").join(per_cause(after, "after"), on="cause", how="full", coalesce=True)
    return joined.with_columns(
        pl.col(c).fill_null(0.0) for c in ("before_gaps", "before_us", "after_gaps", "after_us")
    ).sort("cause")


def _rank_step_time(before: Result, after: Result) -> pl.DataFrame | None:
    """Median step time per rank, when either trace has several ranks."""
    if before.step_table["rank"].n_unique() < 2 and after.step_table["rank"].n_unique() < 2:
        return None

    def per_rank(result: Result, column: str) -> pl.DataFrame:
        return result.step_table.group_by("rank").agg((pl.col("duration_ns").median() / 1e6).alias(column))

    return per_rank(before, "before_ms").join(per_rank(after, "after_ms"), on="rank", how="full",
                                              coalesce=True).sort("rank")


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{int(value)}" if float(value).is_integer() else f"{value:.3f}"  # :g would write 1e+06
