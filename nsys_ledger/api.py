"""`check(path, expectations) -> Result`: the whole pipeline, callable from Python.

trace file -> Trace -> activities with launch calls and ops -> steps -> per-step figures ->
findings. The CLI only parses arguments, calls this and renders the Result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import polars as pl

from nsys_ledger.attribution.activities import gpu_activities, with_launch_calls
from nsys_ledger.attribution.ops import with_ops
from nsys_ledger.attribution.steps import Steps, find_steps
from nsys_ledger.attribution.layers import attribute_layers
from nsys_ledger.checks.layers import LayerSummary, check_layers, summarize_layers
from nsys_ledger.checks.ledger import CheckOutcome, Finding, check_ledger
from nsys_ledger.checks.ranks import RankComparison
from nsys_ledger.checks.coverage import OpCoverage, op_coverage
from nsys_ledger.checks.stats import op_counts, step_table
from nsys_ledger.checks.timeline import (
    Timeline,
    add_timeline_columns,
    attach_layers,
    build_timeline,
    rank_comparison,
    timeline_outcomes,
)
from nsys_ledger.frames import group_agg
from nsys_ledger.ledger import Expectations, StepRule, load_expectations
from nsys_ledger.progress import stage
from nsys_ledger.trace import Trace, load_trace
from nsys_ledger.trace.kineto_reader import KINETO_VERSION_SOURCE

DEFAULT_GAP_THRESHOLD_NS = 2000

# Without expectations, steps are still cut after the sampling kernels of SGLang and vLLM
# (flashinfer's sampling kernels run eagerly after the decode graph), so the copies issued
# before a graph launch land in the step they feed.
DEFAULT_STEP_RULE = StepRule(
    method="auto",
    nvtx_regex=None,
    marker_regex=r"SamplingFrom(?:Prob|Logits)Kernel",
    exclude_nvtx_regex=None,
    exclude_ops=(),
)

# PyTorch profiler traces of vLLM and SGLang carry one `record_function` range per engine step:
# `execute_context_{n}({tokens})_generation_{n}({tokens})` (vLLM V1), `execute_{bs}_context_...`
# (SGLang). A step with prefill requests (context_1+) or without decode requests
# (generation_0) is not a decode step.
KINETO_STEP_RULE = StepRule(
    method="auto",
    # ... or torch.profiler's own `ProfilerStep#N` around each profiler.step() (HF generate loops)
    nvtx_regex=r"^execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(|^ProfilerStep#\d+$",
    marker_regex=DEFAULT_STEP_RULE.marker_regex,
    exclude_nvtx_regex=r"context_[1-9]\d*\(|_generation_0\(",
    exclude_ops=(),
)

GRAPH_LEVEL_NOTICE = (
    "{replays} CUDA graph replays were traced at graph level (--cuda-graph-trace=graph, nsys's "
    "default): their kernels are not in the kernel table, so kernels inside graphs cannot be "
    "counted. Re-capture with `nsys profile --cuda-graph-trace=node` for per-kernel ledgers."
)


@dataclass(frozen=True)
class Totals:
    kernels: int
    kernels_by_device: dict[int, int]
    h2d_copies: int
    h2d_pageable: int
    nvtx_ranges: int
    api_launches: int  # kernel + graph launch calls
    graph_replays: int  # GRAPH_TRACE rows (graph-level capture) or cudaGraphLaunch calls with node rows


@dataclass(frozen=True)
class InputFile:
    """One export of a multi-file check (`check_many`) and the ranks its processes became."""

    path: str
    ranks: tuple[int, ...]  # in the merged numbering: file order, then process order in the file


@dataclass(frozen=True)
class Result:
    trace: Trace
    expectations: Expectations | None
    totals: Totals
    steps: Steps
    step_table: pl.DataFrame  # one row per decode step (checks.stats.step_table + checks.timeline columns)
    op_table: pl.DataFrame  # kernels per step and op, wide
    gaps: pl.DataFrame  # device-wide idle gaps above the threshold, with cause (checks.gaps.GAP_SCHEMA)
    gap_threshold_ns: int
    outcomes: tuple[CheckOutcome, ...]
    notices: tuple[str, ...] = field(default=())
    timeline: Timeline | None = None  # gaps, per-stream gaps, H2D copies, graph replays, step budget
    ranks: RankComparison | None = None  # with several ranks (processes) in the trace
    batch: int | None = None  # requests per step, for kernels per output token
    files: tuple[InputFile, ...] = ()  # several exports checked together (multifile.check_many); else empty
    layers: LayerSummary | None = None  # layer of every decode kernel, how it was found, per-layer counts
    coverage: OpCoverage | None = None  # decode kernels by specific op, generic fallback, no op (with a ledger)

    @property
    def findings(self) -> list[Finding]:
        return [f for outcome in self.outcomes for f in outcome.findings]

    @property
    def verdict(self) -> str:
        """"pass", "fail", or "summary" when no expectations were given."""
        if self.expectations is None:
            return "summary"
        return "fail" if self.findings else "pass"

    @property
    def exit_code(self) -> int:
        return 1 if self.verdict == "fail" else 0

    @property
    def verdict_sentence(self) -> str:
        """What the verdict rests on, for every report: "all 18 checks passed on 4 decode steps",
        "2 finding(s) in 18 checks on 4 decode steps", or for a summary "no expectations given;
        4 decode steps counted"."""
        checks, steps = len(self.outcomes), self.step_table.height
        if self.verdict == "summary":
            return f"no expectations given; {steps} decode steps counted"
        if self.verdict == "pass":
            return f"all {checks} checks passed on {steps} decode steps"
        return f"{len(self.findings)} finding(s) in {checks} checks on {steps} decode steps"


def check(
    trace: str | Path | Trace,
    expectations: str | Path | Expectations | None = None,
    *,
    step_nvtx: str | None = None,
    step_method: str | None = None,
    gap_us: float | None = None,
    batch: int | None = None,
    per_stream_gaps: bool = False,
    cache: bool = True,
) -> Result:
    """Load the trace (and expectations), find decode steps, count, and compare.

    `batch` (default: the expectations' `batch` parameter) gives kernels per output token;
    `per_stream_gaps` also finds the idle gaps of every stream on its own; `cache=False`
    exports an `.nsys-rep` afresh instead of reusing the export kept beside it.
    """
    # The small expectations file first: a typo in it is reported before a big trace is read.
    if expectations is not None and not isinstance(expectations, Expectations):
        expectations = load_expectations(expectations)
    if not isinstance(trace, Trace):
        with stage(f"reading {Path(trace).name}"):
            trace = load_trace(trace, cache=cache)
    threshold_ns = _gap_threshold_ns(expectations, gap_us)

    with stage(f"attributing {trace.kernels.height:,} kernels to steps"):
        activities = with_ops(with_launch_calls(gpu_activities(trace), trace.api_calls), expectations)
        steps = find_steps(
            activities,
            trace.api_calls,
            trace.nvtx,
            expectations.steps if expectations else _default_step_rule(trace),
            step_nvtx=step_nvtx,
            method=step_method,
        )
    batch = batch if batch is not None else (expectations.batch if expectations else None)
    with stage("sweeping the device timelines"):
        timeline = build_timeline(
            steps, trace, threshold_ns, per_stream=per_stream_gaps,
            step_entry=expectations.step_entry_gaps if expectations else None,
        )
    table = add_timeline_columns(step_table(steps, timeline.gaps), timeline, batch)
    ranks = rank_comparison(table)
    with stage("attributing kernels to layers"):
        attribution = attribute_layers(trace, steps.activities, expectations)
        layers = summarize_layers(attribution)
    # a kernel whose name several ops share counts as the op of its place in its layer's
    # sequence (attribution.sequence), in the op counts too
    steps = replace(steps, activities=steps.activities.with_columns(
        attribution.activities["op"], attribution.activities["group"]))
    ops = op_counts(steps, list(expectations.ops) if expectations else [])
    timeline = attach_layers(timeline, layers.assignments)  # gap and graph-break positions by layer
    totals = trace_totals(trace)
    coverage = op_coverage(steps.activities, steps.decode, expectations) if expectations else None

    notices: list[str] = list(trace.meta.warnings)
    outcomes: list[CheckOutcome] = []
    graph_level = _graph_level_replays(trace)
    if graph_level:
        notices.append(GRAPH_LEVEL_NOTICE.format(replays=trace.graph_replays.height))
    if expectations is not None:
        outcomes = _ledger_outcomes(expectations, table, ops, timeline, ranks, steps, graph_level, totals)
        outcomes += _layer_outcomes(expectations, layers, table, graph_level)
    return Result(
        trace=trace, expectations=expectations, totals=totals, steps=steps, step_table=table, op_table=ops,
        gaps=timeline.gaps, gap_threshold_ns=threshold_ns, outcomes=tuple(outcomes), notices=tuple(notices),
        timeline=timeline, ranks=ranks, batch=batch, layers=layers, coverage=coverage,
    )


def _default_step_rule(trace: Trace) -> StepRule:
    """Without expectations: the engine-step ranges of a PyTorch profiler trace, else the
    graph launches and sampling marker of an nsys capture."""
    return KINETO_STEP_RULE if trace.meta.version_source == KINETO_VERSION_SOURCE else DEFAULT_STEP_RULE


def rejudge(result: Result, *, graph_level: bool) -> Result:
    """`result` with its rank comparison and outcomes computed again from its tables: for a
    Result stacked from several exports (multifile.check_many), whose findings must span all
    ranks. `graph_level`: some export was captured with --cuda-graph-trace=graph."""
    ranks = rank_comparison(result.step_table)
    outcomes: list[CheckOutcome] = []
    if result.expectations is not None:
        outcomes = _ledger_outcomes(result.expectations, result.step_table, result.op_table, result.timeline,
                                    ranks, result.steps, graph_level, result.totals)
        outcomes += _layer_outcomes(result.expectations, result.layers, result.step_table, graph_level)
    return replace(result, ranks=ranks, outcomes=tuple(outcomes))


def _layer_outcomes(
    expectations: Expectations, layers: LayerSummary | None, table: pl.DataFrame, graph_level: bool
) -> list[CheckOutcome]:
    """The per-layer ledger, when there are decode steps whose kernels are in the trace."""
    if layers is None or graph_level or table.height == 0:
        return []
    return check_layers(expectations, layers, table.height)


def _gap_threshold_ns(expectations: Expectations | None, gap_us: float | None) -> int:
    if gap_us is not None:
        return int(round(gap_us * 1000))
    if expectations is not None:
        return expectations.gap_threshold_ns
    return DEFAULT_GAP_THRESHOLD_NS


def _ledger_outcomes(
    expectations: Expectations,
    table: pl.DataFrame,
    ops: pl.DataFrame,
    timeline: Timeline,
    ranks: RankComparison | None,
    steps: Steps,
    graph_level: bool,
    totals: Totals,
) -> list[CheckOutcome]:
    if graph_level:
        message = GRAPH_LEVEL_NOTICE.format(replays=totals.graph_replays)
        finding = Finding(
            check="capture", subject="cuda_graph_trace", source="steps", message=message, steps="all",
            failing_steps=table.height, observed="graph-level capture", expected="--cuda-graph-trace=node",
        )
        return [CheckOutcome("capture mode allows per-kernel counts", "steps", "node-level graph trace",
                             "graph-level", (finding,))]
    if table.height == 0:
        finding = Finding(
            check="steps", subject="steps", source="steps", steps="none", failing_steps=0,
            message=f"no decode step found ({steps.detail}); {steps.excluded.height} windows excluded",
            observed="0 decode steps", expected=">= 1 decode step",
            hint="give the step NVTX range with --step-nvtx, or check [steps] marker in the expectations",
        )
        return [CheckOutcome("decode steps found", "steps", ">= 1", "0", (finding,))]
    return check_ledger(expectations, table, ops) + timeline_outcomes(
        expectations, table, timeline, ranks, step_method=steps.method
    )


def _graph_level_replays(trace: Trace) -> bool:
    """Graph replays whose kernels are not in the trace (--cuda-graph-trace=graph).

    nsys records the graph mode option even when the program launched no graph, so the
    option alone says nothing: there must be replays (GRAPH_TRACE rows), or graph launch
    calls in a capture made at graph level.
    """
    if trace.graph_replays.height:
        return True
    launches = trace.api_calls.filter(pl.col("kind") == "graph_launch").height
    return trace.meta.cuda_graph_trace == "graph" and launches > 0


def trace_totals(trace: Trace) -> Totals:
    kernels_by_device = dict(
        trace.kernels.group_by("device").agg(pl.len()).sort("device").iter_rows()
    )
    h2d = trace.memcpys.filter(pl.col("copy_kind") == "HtoD")
    launches = trace.api_calls.filter(pl.col("kind").is_in(["kernel_launch", "graph_launch"]))
    graph_replays = trace.graph_replays.height or _node_level_replays(trace.kernels)
    return Totals(
        kernels=trace.kernels.height,
        kernels_by_device={int(k): int(v) for k, v in kernels_by_device.items()},
        h2d_copies=h2d.height,
        h2d_pageable=h2d.filter(pl.col("src_kind") == "Pageable").height,
        nvtx_ranges=trace.nvtx.height,
        api_launches=launches.height,
        graph_replays=int(graph_replays),
    )


def _node_level_replays(kernels: pl.DataFrame) -> int:
    """Graph replays traced node by node: distinct (process, launch correlation id) of the
    kernels that are graph nodes."""
    nodes = kernels.lazy().filter(pl.col("graph_node_id").is_not_null())  # lazy: reads two columns only
    return group_agg(nodes, ["pid", "correlation"], pl.len()).height
