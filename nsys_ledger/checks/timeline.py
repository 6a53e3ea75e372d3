"""Timeline checks: gaps with their cause, H2D copies, graph replays, the step time budget.

`build_timeline` makes one sweep of every device timeline and derives from it the gaps
(device-wide, and per stream on request), the step time budget, the H2D copies and the graph
replays of every decode step. `add_timeline_columns` puts the per-step figures into the step
table next to the seed's three columns (CPU submissions, GPU kernels, GPU gaps), and
`timeline_outcomes` compares them with the expectations.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import polars as pl

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.checks import budget as budget_mod
from nsys_ledger.checks.gaps import (
    DEVICE_KEY,
    collective_names,
    find_gaps,
    mark_step_entry_gaps,
    step_spans,
    timeline_segments,
)
from nsys_ledger.checks.graphs import activity_text, describe_break, graph_breaks, step_replays
from nsys_ledger.checks.host_time import host_record
from nsys_ledger.checks.h2d import H2D_POSITIONS, describe_positions, h2d_positions_per_step, step_h2d_copies
from nsys_ledger.checks.ledger import (
    CheckOutcome,
    Finding,
    compact_ranges,
    describe_steps,
    range_check,
)
from nsys_ledger.checks.ranks import RankComparison, compare_ranks, duration_text
from nsys_ledger.ledger.model import Expectations, Range, StepEntryGaps
from nsys_ledger.trace.model import Trace

STEP_KEY = ["rank", "step"]


@dataclass(frozen=True)
class Timeline:
    threshold_ns: int
    gaps: pl.DataFrame  # device-wide gaps above the threshold (gaps.GAP_SCHEMA), with cause
    stream_gaps: pl.DataFrame | None  # per-stream gaps (same schema, `stream` set); None unless asked for
    budget: pl.DataFrame  # per (rank, step, device): budget.BUDGET_COLUMNS + CAUSE_COLUMNS
    h2d: pl.DataFrame  # every H2D copy of a decode step (h2d.H2D_SCHEMA)
    replays: pl.DataFrame  # every graph replay of a decode step (graphs.step_replays)
    breaks: pl.DataFrame  # boundaries between replays of one step (graphs.BREAK_SCHEMA)


def build_timeline(
    steps: Steps, trace: Trace, threshold_ns: int, *, per_stream: bool = False, step_entry: StepEntryGaps | None = None
) -> Timeline:
    """Gaps (above `threshold_ns`), budget, H2D copies and graph replays of the decode steps.
    `step_entry`: the ledger's allowance for the graph-launch gap at each step's entry."""
    activities = with_graph_level_replays(steps, trace)
    in_decode = activities.lazy().filter(pl.col("decode").fill_null(False))
    # only the columns the spans and replays read: a filter copies every column it keeps, and
    # decode steps are nearly all of a trace's millions of activities
    decode = in_decode.select(*STEP_KEY, "pid", "device", "start", "end", "activity", "graph_node_id",
                              "correlation", "row").collect()
    overhead = trace.profiler_overhead
    host = host_record(trace.api_calls, trace.nvtx)
    spans = step_spans(decode)
    replays = step_replays(decode)
    # each wide intermediate is freed before the next is built: the decode copy before the
    # device sweep, the sweep's segments (two per activity) once the budget has read them
    del decode
    collectives = collective_names(activities)
    segments = timeline_segments(activities, overhead, DEVICE_KEY, collectives)
    gaps = find_gaps(activities, spans, overhead, host, trace.syncs, threshold_ns, segments=segments,
                     collectives=collectives)
    gaps = mark_step_entry_gaps(gaps, graph_launches_per_step(steps), step_entry)
    budget = budget_mod.step_budget(segments, spans, gaps, threshold_ns)
    del segments
    stream_gaps = (
        find_gaps(activities, spans, overhead, host, trace.syncs, threshold_ns, per_stream=True,
                  collectives=collectives)
        if per_stream else None
    )
    return Timeline(
        threshold_ns=threshold_ns,
        gaps=gaps,
        stream_gaps=stream_gaps,
        budget=budget,
        h2d=step_h2d_copies(steps),
        replays=replays,
        breaks=graph_breaks(replays, in_decode),
    )


def with_graph_level_replays(steps: Steps, trace: Trace) -> pl.DataFrame:
    """The step's activities plus one activity per graph replay traced at graph level
    (GRAPH_TRACE rows, `--cuda-graph-trace=graph`), whose kernels are in no kernel table: the
    device is busy for the whole replay, so it counts in busy time, the step span and the gaps.

    A replay row is `activity = "graph"`, named "graph <id> replay", with `graph_node_id` set
    to its exec graph id (it is graph work: two replays meet at a graph boundary), numbered
    after the other activities (`row`), and placed in the step of the cudaGraphLaunch that
    launched it (joined on process and correlation id, as kernels are)."""
    activities = steps.activities
    replays = trace.graph_replays
    if replays.height == 0:
        return activities
    calls = steps.api_calls.filter(pl.col("correlation").is_not_null()).select(
        "pid", "correlation", pl.col("start").alias("api_start"), pl.col("end").alias("api_end"),
        pl.col("global_tid").alias("api_tid"), pl.col("kind").alias("api_kind"), *STEP_KEY, "decode",
    ).unique(subset=["pid", "correlation"], keep="first")
    if "row" not in replays.columns:  # a whole trace's replays, not numbered yet (numbered_graph_replays)
        replays = numbered_graph_replays_frame(replays, activities.height)
    rows = replays.sort("start").select(
        "row", pl.lit("graph").alias("activity"),
        "start", "end", "device", "stream", "pid", "correlation",
        pl.format("graph {} replay", pl.col("graph_id")).alias("name"),
        pl.col("graph_exec_id").alias("graph_node_id"),
    ).join(calls, on=["pid", "correlation"], how="left", maintain_order="left")
    return pl.concat([activities, rows], how="diagonal_relaxed")


def numbered_graph_replays(trace: Trace, activities: int) -> Trace:
    """The trace with a `row` for each graph-level replay, numbered after the `activities` GPU
    activities in start order: a window of steps holds a part of the activities only, and its
    replays keep the numbers the whole trace gives them."""
    if trace.graph_replays.height == 0 or "row" in trace.graph_replays.columns:
        return trace
    return replace(trace, graph_replays=numbered_graph_replays_frame(trace.graph_replays, activities))


def numbered_graph_replays_frame(replays: pl.DataFrame, first_row: int) -> pl.DataFrame:
    return replays.sort("start").with_columns((pl.int_range(pl.len(), dtype=pl.UInt32) + first_row).alias("row"))


def graph_launches_per_step(steps: Steps) -> pl.DataFrame:
    """`rank, step, graph_launches` of the decode steps that launched a graph."""
    launches = steps.api_calls.lazy().filter(pl.col("decode").fill_null(False) & (pl.col("kind") == "graph_launch"))
    return launches.group_by(STEP_KEY).agg(pl.len().cast(pl.Int64).alias("graph_launches")).collect()


def add_timeline_columns(table: pl.DataFrame, timeline: Timeline, batch: int | None) -> pl.DataFrame:
    """The step table plus `replays`, `kernels_per_token`, `h2d_<position>`, the budget and
    the gaps per cause, for each decode step (on the step's device)."""
    replays = timeline.replays.group_by(STEP_KEY).agg(pl.len().cast(pl.Int64).alias("replays"))
    positions = h2d_positions_per_step(timeline.h2d)
    budget = timeline.budget
    filled = [f"h2d_{p}" for p in H2D_POSITIONS] + ["replays"] + budget_mod.BUDGET_COLUMNS + budget_mod.CAUSE_COLUMNS
    per_token = (pl.col("kernels") / batch).round(2) if batch else pl.lit(None, pl.Float64)
    return (
        table.join(replays, on=STEP_KEY, how="left")
        .join(positions, on=STEP_KEY, how="left")
        .join(budget, on=[*STEP_KEY, "device"], how="left")
        .with_columns(pl.col(c).fill_null(0) for c in filled)
        .with_columns(budget_mod.bound_expr().alias("bound"))
        .with_columns(per_token.alias("kernels_per_token"))
        .sort(STEP_KEY)
    )


def rank_comparison(table: pl.DataFrame) -> RankComparison | None:
    """Rank comparison over a step table with several ranks (processes of one export, or the
    stacked tables of several exports); None with one rank."""
    return compare_ranks(table.select("rank", "step", "step_ns", "busy_ns", "collective_ns"))


# ---------------------------------------------------------------------------------------------
# Checks against the expectations
# ---------------------------------------------------------------------------------------------
def timeline_outcomes(
    expectations: Expectations,
    table: pl.DataFrame,
    timeline: Timeline,
    ranks: RankComparison | None,
    *,
    step_method: str,
) -> list[CheckOutcome]:
    outcomes = [_h2d_outcome(expectations, table, timeline)]
    if expectations.graph_launches_per_step is not None and step_method == "graph":
        outcomes.append(_graph_outcome(expectations.graph_launches_per_step, table, timeline))
    outcomes.append(_gap_outcome(table, timeline, expectations.gaps_allowed_per_step))
    if ranks is not None and expectations.rank_imbalance_pct is not None:
        outcomes.append(_rank_outcome(expectations.rank_imbalance_pct, ranks))
    return outcomes


def _outcome(name: str, source: str, expected: str, values: pl.Series, findings: list[Finding]) -> CheckOutcome:
    return CheckOutcome(name, source, expected, _span(values) if len(values) else "-", tuple(findings))


def _h2d_outcome(expectations: Expectations, table: pl.DataFrame, timeline: Timeline) -> CheckOutcome:
    h2d = expectations.h2d
    low = h2d.per_step.low if h2d.per_step.low is not None else float("-inf")
    high = h2d.per_step.high if h2d.per_step.high is not None else float("inf")
    findings: list[Finding] = []
    for side, failing in (("too few", table.filter(pl.col("h2d") < low)),
                          ("too many", table.filter(pl.col("h2d") > high))):
        findings += [
            _with_positions(f, timeline, failing)
            for f in range_check(
                table, "h2d", h2d.per_step, check="h2d", subject="h2d", source=h2d.source,
                what="host-to-device copies", sides=(side,),
                hint_high="each extra H2D copy adds its latency to every decode step; it usually sits next to a "
                          "graph break",
            )
        ]
    if not h2d.pageable_allowed:
        findings += range_check(
            table, "h2d_pageable", Range(0, 0), check="h2d_pageable", subject="h2d_pageable",
            source=f"{h2d.source}.pageable_allowed", what="pageable host-to-device copies",
            hint_high="a pageable source blocks the host until the copy is staged: pin the buffer",
        )
    if h2d.max_bytes is not None:
        findings += range_check(
            table.with_columns(pl.col("h2d_max_bytes").fill_null(0)), "h2d_max_bytes",
            Range(None, h2d.max_bytes), check="h2d_bytes", subject="h2d_bytes", source=f"{h2d.source}.max_bytes",
            what="largest host-to-device copy (bytes)",
        )
    return _outcome("H2D copies per step", h2d.source, h2d.per_step.describe(), table["h2d"], findings)


def _with_positions(finding: Finding, timeline: Timeline, failing: pl.DataFrame) -> Finding:
    """Say where the copies of the failing steps sit relative to the graph launches."""
    where = describe_positions(timeline.h2d, failing)
    if not where:
        return finding
    return replace(finding, message=f"{finding.message}; per step: {where}")


def _graph_outcome(expected: Range, table: pl.DataFrame, timeline: Timeline) -> CheckOutcome:
    """Too few launches: the step ran eagerly. Too many: a graph break, with its position."""
    source = "graphs.launches_per_step"
    findings = range_check(
        table, "graph_launches", expected, check="graph_launches", subject="graph_launches", source=source,
        what="CUDA graph launches", hint_low="no graph replay in the step: the step ran eagerly", sides=("too few",),
    )
    high = expected.high if expected.high is not None else float("inf")
    split = table.filter(pl.col("graph_launches") > high)
    if split.height:
        steps_text = describe_steps(split)
        observed = _span(split["graph_launches"])
        message = (
            f"graph break: the decode graph ran as {observed} replays per step, expected {expected.describe()}, "
            f"in {split.height} of {table.height} steps (steps {steps_text}); "
            f"{describe_break(timeline.breaks, split)}"
        )
        findings.append(Finding(
            check="graph_break", subject="graph_launches", source=source, message=message, steps=steps_text,
            failing_steps=split.height, observed=observed, expected=expected.describe(),
            hint="the decode graph is split: each extra replay is a graph break with host work between",
        ))
    return _outcome("graph launches per step", source, expected.describe(), table["graph_launches"], findings)


def _gap_outcome(table: pl.DataFrame, timeline: Timeline, allowed: int = 0) -> CheckOutcome:
    """A step fails with more gaps above the threshold than `allowed` ([gaps] allowed_per_step)."""
    threshold = timeline.threshold_ns
    name = f"gaps above {threshold / 1000:g} us"
    expected = f"at most {allowed}" if allowed else "0"
    failing = table.filter(pl.col("gaps") > allowed)
    gaps = timeline.gaps.filter(~pl.col("step_entry"))
    if allowed:
        gaps = gaps.join(failing.select("rank", "step"), on=["rank", "step"], how="semi")
    if gaps.height == 0:
        observed = _span(table["gaps"]) if table.height else "-"
        entry = timeline.gaps.filter(pl.col("step_entry"))
        if entry.height:  # the allowed launch waits are part of the picture: say what they were
            observed += (f" (+{_span(table['step_entry_gaps'])} step-entry gap, "
                         f"{entry['duration'].min() / 1000:.1f}-{entry['duration'].max() / 1000:.1f} us)")
        return CheckOutcome(name, "gaps.threshold_us", expected, observed, ())
    worst = gaps.sort(["duration", "rank", "step", "start"], descending=[True, False, False, False]).row(0, named=True)
    steps_text = describe_steps(failing)
    observed = _span(failing["gaps"])
    message = (
        f"idle gaps above {threshold / 1000:g} us: {observed} per step in {failing.height} of {table.height} "
        f"steps (steps {steps_text}), by cause: {describe_causes(gaps)}; the largest is "
        f"{worst['duration'] / 1000:.1f} us ({_cause_text(worst)}) in step {worst['step']}"
        f"{'' if table['rank'].n_unique() == 1 else ' of rank ' + str(worst['rank'])} "
        f"after {_neighbour(worst, 'before')} before {_neighbour(worst, 'after')}"
    )
    finding = Finding(
        check="gaps", subject="gaps", source="gaps.threshold_us", message=message, steps=steps_text,
        failing_steps=failing.height, observed=observed, expected=expected, hint=_gap_hint(gaps),
    )
    return _outcome(name, "gaps.threshold_us", expected, table["gaps"], [finding])


def _cause_text(gap: dict) -> str:
    """'nvtx: ensure_layer_3_weights' for a gap the host spent in an NVTX range, else the cause."""
    name = gap.get("nvtx_range")
    if gap["cause"] != "nvtx" or not name:
        return gap["cause"]
    return f"nvtx: {name if len(name) <= 60 else name[:57] + '...'}"


def describe_causes(gaps: pl.DataFrame) -> str:
    """'host 1140 (52.3 ms), h2d 8 (30.1 us)': count and total per cause, largest first."""
    totals = gaps.group_by("cause").agg(pl.len().alias("n"), pl.col("duration").sum().alias("ns"))
    ordered = totals.sort("ns", "cause", descending=[True, False])
    return ", ".join(f"{cause} {n} ({duration_text(ns)})" for cause, n, ns in ordered.iter_rows())


GAP_HINTS = {
    "sync": "the launching thread was blocked in a synchronize call (e.g. .item() or .tolist()) after the GPU ran "
            "dry, and launched only after it returned",
    "copy_call": "the launching thread was inside a memcpy call (a pageable or synchronous copy blocks the host): "
                 "pin the buffer and copy asynchronously, or move the copy out of the step",
    "cuda_call": "the launching thread was inside other CUDA calls (cudaMalloc, cudaFree, ...) while the GPU "
                 "waited: allocate ahead, or use a caching allocator",
    "nvtx": "the launching thread was busy in its own code (inside NVTX range {range}) while the GPU waited",
    "host": "the launching thread began the call late, busy with work the trace does not show (Python overhead, "
            "scheduling, preparing metadata)",
    "launch": "the GPU waited for the host's cudaGraphLaunch (a large graph takes several µs to launch): allow the "
              "step-entry gap in [gaps] step_entry_per_launch, or launch the next graph earlier / make it smaller",
    "kernel_launch": "the kernel launch call was still in flight when the GPU ran dry: launch latency of eager "
                     "launches (capture the step in a CUDA graph)",
    "copy_launch": "a copy call was still in flight when the GPU ran dry (a pageable copy is staged by the host "
                   "inside the call): pin the buffer and copy asynchronously, ahead of the work that needs it",
    "collective": "a collective started late although it was queued in time: it waited for its peers on the "
                  "other ranks",
    "graph_boundary": "the gap sits at a graph boundary while the host was ahead: the decode graph is split or "
                      "eager work runs between replays",
    "event_wait": "the work was queued in time but its stream waited on an event of another stream",
    "copy": "a copy was queued in time but started late on the device (pageable staging or a busy copy engine)",
    "unknown": "the work was queued in time and nothing in the trace explains the wait (a device-side delay)",
}


def _gap_hint(gaps: pl.DataFrame) -> str:
    main_cause = gaps.group_by("cause").agg(pl.col("duration").sum()).sort(
        "duration", "cause", descending=[True, False]
    )["cause"][0]
    hint = GAP_HINTS[main_cause]
    if main_cause == "nvtx":
        ranges = gaps.filter(pl.col("cause") == "nvtx").group_by("nvtx_range").agg(pl.col("host_nvtx_ns").sum()).sort(
            "host_nvtx_ns", "nvtx_range", descending=[True, False], nulls_last=True)
        name = ranges["nvtx_range"][0] or "?"
        hint = hint.format(range=f"'{name if len(name) <= 60 else name[:57] + '...'}'")
    return f"mostly {main_cause}: {hint}"


def _rank_outcome(max_pct: float, ranks: RankComparison) -> CheckOutcome:
    source = "ranks.max_imbalance_pct"
    expected = f"<= {max_pct:g}%"
    findings = []
    if ranks.imbalance_pct > max_pct:
        per_rank = ", ".join(
            f"rank {r}: {duration_text(busy)} busy, {duration_text(wait)} collective wait"
            for r, busy, wait in ranks.per_rank.select("rank", "busy_ns", "collective_wait_ns").iter_rows()
        )
        findings.append(Finding(
            check="rank_imbalance", subject=f"rank {ranks.slowest_rank}", source=source,
            message=f"{ranks.describe()}; per step: {per_rank}",
            steps=compact_ranges(ranks.per_step["step"].to_list()), failing_steps=ranks.per_step.height,
            observed=f"{ranks.imbalance_pct:.1f}%", expected=expected,
            hint=f"rank {ranks.slowest_rank} makes its peers wait inside every collective: "
                 "look for a slower GPU, throttling, or more work routed to it",
        ))
    return CheckOutcome("rank imbalance (busy time)", source, expected, f"{ranks.imbalance_pct:.1f}%", tuple(findings))


def _neighbour(gap: dict, side: str) -> str:
    return activity_text(gap[f"{side}_op"], gap[f"{side}_layer"], gap[side])


def _span(values: pl.Series) -> str:
    low, high = values.min(), values.max()
    return f"{low}" if low == high else f"{low}-{high}"

