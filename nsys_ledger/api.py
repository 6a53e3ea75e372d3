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
from nsys_ledger.checks.ledger import CheckOutcome, Finding, check_ledger, describe_steps
from nsys_ledger.checks.ranks import RankComparison
from nsys_ledger.checks.coverage import OpCoverage, op_coverage
from nsys_ledger.checks.stats import op_counts, step_table
from nsys_ledger.checks.time_use import TimeUse, time_use
from nsys_ledger.checks.step_kinds import check_step_kinds, kind_counts, kind_step_table
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
# (SGLang). A step with prefill requests (context_1+) is a prefill or mixed step by its kind
# (attribution.step_kinds), which says so first; the exclude rule still keeps a step with
# neither prefill nor decode requests (context_0 ... generation_0) out of the decode steps.
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
    time_use: TimeUse | None = None  # GPU time by op, group, layer, kernel; launch calls, overlap, delay, copies
    # per step kind found: `kind, found, checked, declared` (checks.step_kinds.kind_counts)
    step_kinds: pl.DataFrame | None = None
    # one row per complete prefill or mixed step: `rank, kind, step, kernels` + kernels per ledger op
    kind_table: pl.DataFrame | None = None

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
            return f"all {checks} checks passed on {steps} decode steps{self._other_kinds_checked()}"
        return f"{len(self.findings)} finding(s) in {checks} checks on {steps} decode steps{self._other_kinds_checked()}"

    def _other_kinds_checked(self) -> str:
        """" and 1 mixed step" when prefill or mixed steps were checked too; else nothing."""
        if self.step_kinds is None:
            return ""
        checked = [(kind, n) for kind, _, n, _ in self.step_kinds.iter_rows() if kind != "decode" and n]
        return "".join(f" and {n} {kind} step{'s' if n != 1 else ''}" for kind, n in checked)

    def to_pandas(self) -> dict[str, "pandas.DataFrame"]:
        """The result's tables as pandas DataFrames, for notebooks (as HTA hands out its frames):
        `steps` (one row per decode step), `ops` (kernels per step and op), `gaps` (idle gaps
        with their cause) and `kernels` (every decode kernel with its step, op and times)."""
        import pandas  # noqa: F401  (2.5 s to import: only when asked; polars converts through it)

        activities = self.steps.activities
        kernels = activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
        frames = {"steps": self.step_table, "ops": self.op_table, "gaps": self.gaps, "kernels": kernels}
        return {name: frame.to_pandas() for name, frame in frames.items()}


def _unmatched_step_nvtx(nvtx: pl.DataFrame, regex: str, steps) -> list[str]:
    """A --step-nvtx that matches no range would otherwise be ignored without a word."""
    if nvtx.filter(pl.col("name").str.contains(regex)).height:
        return []
    instead = (f"steps found by {steps.method} instead" if steps.method not in ("nvtx", "none")
               else "no decode step found")
    return [f"--step-nvtx /{regex}/ matches none of the trace's {nvtx.height:,} NVTX ranges: {instead}"]


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
            _step_rule(expectations, trace),
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
    with stage("measuring where the step time goes"):
        time = time_use(steps, layers.assignments)
    kind_table = kind_step_table(steps, list(expectations.ops) if expectations else [])

    notices: list[str] = list(trace.meta.warnings)
    if step_nvtx:
        notices += _unmatched_step_nvtx(trace.nvtx, step_nvtx, steps)
    outcomes: list[CheckOutcome] = []
    graph_level = _graph_level_replays(trace)
    if graph_level:
        notices.append(GRAPH_LEVEL_NOTICE.format(replays=trace.graph_replays.height))
    if expectations is not None:
        # a ledger for another model (the layer count differs) is said before what follows from it
        outcomes = _layer_count_outcomes(expectations, layers, table, graph_level)
        outcomes += _ledger_outcomes(expectations, table, ops, timeline, ranks, steps, graph_level, totals)
        outcomes += _layer_outcomes(expectations, layers, table, graph_level)
        outcomes += _kind_outcomes(expectations, kind_table, graph_level)
    return Result(
        trace=trace, expectations=expectations, totals=totals, steps=steps, step_table=table, op_table=ops,
        gaps=timeline.gaps, gap_threshold_ns=threshold_ns, outcomes=tuple(outcomes), notices=tuple(notices),
        timeline=timeline, ranks=ranks, batch=batch, layers=layers, coverage=coverage, time_use=time,
        step_kinds=kind_counts(steps, expectations), kind_table=kind_table,
    )


def _step_rule(expectations: Expectations | None, trace: Trace) -> StepRule:
    """The ledger's step rule, or (no ledger, or `learn`'s first pass) the default for the trace."""
    if expectations is None or expectations.steps.default_for_trace:
        return _default_step_rule(trace)
    return expectations.steps


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
        outcomes = _layer_count_outcomes(result.expectations, result.layers, result.step_table, graph_level)
        outcomes += _ledger_outcomes(result.expectations, result.step_table, result.op_table, result.timeline,
                                    ranks, result.steps, graph_level, result.totals)
        outcomes += _layer_outcomes(result.expectations, result.layers, result.step_table, graph_level)
        outcomes += _kind_outcomes(result.expectations, result.kind_table, graph_level)
    return replace(result, ranks=ranks, outcomes=tuple(outcomes),
                   step_kinds=kind_counts(result.steps, result.expectations))


def _layer_outcomes(
    expectations: Expectations, layers: LayerSummary | None, table: pl.DataFrame, graph_level: bool
) -> list[CheckOutcome]:
    """The per-layer ledger, when there are decode steps whose kernels are in the trace."""
    if layers is None or graph_level or table.height == 0:
        return []
    return check_layers(expectations, layers, table.height)


def _layer_count_outcomes(
    expectations: Expectations, layers: LayerSummary | None, table: pl.DataFrame, graph_level: bool
) -> list[CheckOutcome]:
    """A trace with another number of layers than the ledger declares: the ledger is for
    another model, and every per-layer finding after it follows from that, so it comes first.
    A row only when the numbers differ: a ledger that fits keeps its list of checks."""
    if layers is None or graph_level or table.height == 0:
        return []
    declared = sorted({layer for layer_class in expectations.layer_classes for layer in layer_class.layers})
    per_step = layers.counts.group_by("rank", "step").agg(pl.col("layer").n_unique().alias("layers"))
    if not declared or per_step.height == 0:
        return []
    found = int(per_step["layers"].max())
    if found == len(declared):
        return []
    failing = per_step.filter(pl.col("layers") != len(declared)).sort("rank", "step")
    message = (f"the trace has {found} layers per decode step, the ledger {len(declared)} (layers {declared[0]}-"
               f"{declared[-1]}): a ledger for another model? The per-layer, sequence and anchor findings below follow from it")
    finding = Finding(
        check="layer_count", subject="layers", source="layers.classes", message=message,
        steps=describe_steps(failing), failing_steps=failing.height, observed=str(found), expected=str(len(declared)),
        hint="check with the ledger of this model (expectations/), or learn one from a healthy capture "
             "with `nsys-ledger learn`",
    )
    return [CheckOutcome("layer count", "layers.classes", str(len(declared)), str(found), (finding,))]


def _kind_outcomes(expectations: Expectations, kind_table: pl.DataFrame | None, graph_level: bool
                   ) -> list[CheckOutcome]:
    """The prefill and mixed steps against the ledger's [kinds.*] sections (kernel counts: not
    when graph replays hide their kernels)."""
    return [] if graph_level else check_step_kinds(expectations, kind_table)


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
    if table.height == 0 and _checked_other_kinds(expectations, steps):
        return []  # the trace's steps are prefill or mixed steps that the ledger declares
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


def _checked_other_kinds(expectations: Expectations, steps: Steps) -> bool:
    """Whether the trace has steps of a kind other than decode that the ledger declares."""
    return any(steps.of_kind(kind).height for kind in expectations.kinds)


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
