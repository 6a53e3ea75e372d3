"""`check(path, expectations) -> Result`: the whole pipeline, callable from Python.

trace file -> Trace -> activities with launch calls and ops -> steps, cut into windows of whole
steps (pipeline.plan) -> per window: layers, timeline, per-step figures (pipeline.window) ->
merged (pipeline.merge) -> findings (pipeline.judge). A big SQLite export whose per-activity
frames nobody asked for takes the same flow through a store on disk (pipeline.stream): read a
chunk at a time, steps from the chunks, each window read back. The CLI only parses arguments,
calls this and renders the Result.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

import polars as pl

from nsys_ledger.attribution.activities import gpu_activities, with_launch_calls
from nsys_ledger.attribution.ops import with_ops
from nsys_ledger.attribution.steps import Steps, find_steps
from nsys_ledger.checks.layers import LayerSummary
from nsys_ledger.checks.ledger import CheckOutcome, Finding
from nsys_ledger.checks.ranks import RankComparison
from nsys_ledger.checks.coverage import OpCoverage
from nsys_ledger.checks.time_use import TimeUse
from nsys_ledger.checks.step_kinds import kind_counts
from nsys_ledger.checks.timeline import Timeline, numbered_graph_replays, rank_comparison
from nsys_ledger.frames import group_agg
from nsys_ledger.ledger import Expectations, StepRule, load_expectations
from nsys_ledger.pipeline.judge import GRAPH_LEVEL_NOTICE, judge
from nsys_ledger.pipeline.merge import merge_windows
from nsys_ledger.pipeline.plan import DEFAULT_WINDOW_STEPS, WHOLE_TRACE, plan_windows
from nsys_ledger.pipeline.run import run_windows, without_activity_tables
from nsys_ledger.pipeline.stream import (
    STORE_WINDOW_STEPS,
    ActivityStore,
    Tallies,
    find_stored_steps,
    plan_store,
    read_into_store,
    run_stored_windows,
)
from nsys_ledger.pipeline.window import WindowResult, WindowSettings
from nsys_ledger.progress import stage
from nsys_ledger.trace import Trace, load_trace
from nsys_ledger.trace.kineto_reader import KINETO_VERSION_SOURCE
from nsys_ledger.trace.sqlite_reader import load_sqlite_streamed, sqlite_kernel_rows

DEFAULT_GAP_THRESHOLD_NS = 2000
# An SQLite export with more kernels than this is checked through a store on disk when the
# caller needs no per-activity frames (pipeline.stream): in memory, a check holds ~0.5 KB per
# kernel (docs/performance.md), so this is where its peak passes ~0.5 GB.
STREAM_MIN_KERNELS = 1_000_000

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
    trace: Trace  # in several step windows: without its kernel, copy and memset rows (steps.activities has them;
    # through a store on disk nothing holds them: pipeline.stream)
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
    windows: int = 1  # step windows the per-step stages ran in (pipeline.plan)

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
    window_steps: int | None = None,
    jobs: int = 1,
    dask: str | None = None,
    keep_events: bool = True,
    stream: bool | None = None,
) -> Result:
    """Load the trace (and expectations), find decode steps, count, and compare.

    `batch` (default: the expectations' `batch` parameter) gives kernels per output token;
    `per_stream_gaps` also finds the idle gaps of every stream on its own; `cache=False`
    exports an `.nsys-rep` afresh instead of reusing the export kept beside it.
    `window_steps`: decode steps per window of the per-step stages (pipeline.plan; 0: the whole
    trace in one window; default DEFAULT_WINDOW_STEPS, or STORE_WINDOW_STEPS through a store);
    `jobs`: windows checked at once, in that many local processes; `dask`: on the Dask cluster
    at this address ("local": a LocalCluster of `jobs` workers). The result is the same whatever the window and the jobs.
    `keep_events=False`: the caller needs no per-activity frames (Result.steps.activities,
    layers.assignments), so an SQLite export of more than STREAM_MIN_KERNELS kernels is checked
    through a store on disk (pipeline.stream), in memory that does not grow with the trace, and
    its Result has those frames empty; `stream=True` does so for any SQLite export, `False` never.
    """
    # The small expectations file first: a typo in it is reported before a big trace is read.
    if expectations is not None and not isinstance(expectations, Expectations):
        expectations = load_expectations(expectations)
    threshold_ns = _gap_threshold_ns(expectations, gap_us)
    batch = batch if batch is not None else (expectations.batch if expectations else None)
    settings = WindowSettings(expectations, threshold_ns, per_stream_gaps, batch)
    if not isinstance(trace, Trace) and _streams(trace, stream, keep_events, window_steps, dask):
        return _check_through_store(trace, expectations, settings, window_steps or STORE_WINDOW_STEPS, jobs,
                                    step_nvtx=step_nvtx, step_method=step_method)
    window_steps = DEFAULT_WINDOW_STEPS if window_steps is None else window_steps
    if not isinstance(trace, Trace):
        with stage(f"reading {Path(trace).name}"):
            trace = load_trace(trace, cache=cache)

    # plan: the steps, and the windows of whole steps the per-step stages run on
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
    trace = numbered_graph_replays(trace, steps.activities.height)
    totals = trace_totals(trace)
    plan = plan_windows(steps, window_steps)
    if plan.count > 1:
        # in windows, the kernel, copy and memset tables are not kept beside the activities,
        # which hold all of their columns the checks read (~185 MiB per million kernels)
        trace = without_activity_tables(trace)
    # window: gaps, budget, H2D, layers, time use of each window's steps
    with stage(f"checking {plan.count} window{'s' if plan.count != 1 else ''} of steps"):
        windows = run_windows(trace, steps, plan, settings, jobs=jobs, dask=dask)
    return _merged_result(trace, expectations, settings, steps, totals, windows, plan.count, step_nvtx)


def _merged_result(trace: Trace, expectations: Expectations | None, settings: WindowSettings, steps: Steps,
                   totals: Totals, windows: list[WindowResult], count: int, step_nvtx: str | None) -> Result:
    """merge: the windows' frames as one whole-trace window gives them; judge: the outcomes."""
    merged = merge_windows(windows, expectations, steps.decode)
    # Result.steps keeps every activity for the reports that draw or list kernels (HTML, the
    # Chrome trace, to_pandas, learn, diff): their op is the one its place in its layer's
    # sequence gave (attribution.sequence), as in the op counts
    steps = replace(steps, activities=steps.activities.with_columns(merged.op_of_row["op"],
                                                                    merged.op_of_row["group"]))
    table = merged.table
    ranks = rank_comparison(table)

    notices: list[str] = list(trace.meta.warnings)
    if step_nvtx:
        notices += _unmatched_step_nvtx(trace.nvtx, step_nvtx, steps)
    outcomes: list[CheckOutcome] = []
    graph_level = _graph_level_replays(trace)
    if graph_level:
        notices.append(GRAPH_LEVEL_NOTICE.format(replays=trace.graph_replays.height))
    if expectations is not None:
        outcomes = judge(expectations, table, merged.ops, merged.timeline, ranks, steps, merged.layers,
                         merged.kind_table, graph_level, totals.graph_replays)
    return Result(
        trace=trace, expectations=expectations, totals=totals, steps=steps, step_table=table, op_table=merged.ops,
        gaps=merged.timeline.gaps, gap_threshold_ns=settings.threshold_ns, outcomes=tuple(outcomes),
        notices=tuple(notices), timeline=merged.timeline, ranks=ranks, batch=settings.batch, layers=merged.layers,
        coverage=merged.coverage, time_use=merged.time, step_kinds=kind_counts(steps, expectations),
        kind_table=merged.kind_table, windows=count,
    )


def _streams(path: str | Path, stream: bool | None, keep_events: bool, window_steps: int | None,
             dask: str | None) -> bool:
    """Whether to check `path` through a store on disk (pipeline.stream): an SQLite export, in
    windows of steps (one window would hold them all), on this machine, and asked for or big
    and without the per-activity frames."""
    if stream is False or window_steps == WHOLE_TRACE or dask is not None:
        return False
    kernels = sqlite_kernel_rows(path)
    if kernels is None:
        return False
    return bool(stream) or (not keep_events and kernels > STREAM_MIN_KERNELS)


def _check_through_store(path: str | Path, expectations: Expectations | None, settings: WindowSettings,
                         window_steps: int, jobs: int, *, step_nvtx: str | None, step_method: str | None) -> Result:
    """`check` of an SQLite export through a store on disk (pipeline.stream)."""
    store = ActivityStore.create()
    try:
        with stage(f"reading {Path(path).name} into windows of steps"):
            trace, tallies = read_into_store(partial(load_sqlite_streamed, path), store, expectations,
                                             lambda light: _step_rule(expectations, light))
        with stage(f"attributing {tallies.kernels:,} kernels to steps"):
            stored = find_stored_steps(store, trace, tallies, _step_rule(expectations, trace),
                                       step_nvtx=step_nvtx, method=step_method)
            plan = plan_store(store, stored, window_steps)
        trace = numbered_graph_replays(trace, tallies.activities)
        totals = _stored_totals(trace, tallies)
        with stage(f"checking {plan.count} window{'s' if plan.count != 1 else ''} of steps"):
            windows = run_stored_windows(trace, stored.steps, store, plan, settings, jobs=jobs)
    finally:
        store.close()
    return _merged_result(trace, expectations, settings, stored.steps, totals, windows, plan.count, step_nvtx)


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
        outcomes = judge(result.expectations, result.step_table, result.op_table, result.timeline, ranks,
                         result.steps, result.layers, result.kind_table, graph_level, result.totals.graph_replays)
    return replace(result, ranks=ranks, outcomes=tuple(outcomes),
                   step_kinds=kind_counts(result.steps, result.expectations))


def _gap_threshold_ns(expectations: Expectations | None, gap_us: float | None) -> int:
    if gap_us is not None:
        return int(round(gap_us * 1000))
    if expectations is not None:
        return expectations.gap_threshold_ns
    return DEFAULT_GAP_THRESHOLD_NS


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


def _stored_totals(trace: Trace, tallies: Tallies) -> Totals:
    """trace_totals, from what the store's chunks added up."""
    launches = trace.api_calls.filter(pl.col("kind").is_in(["kernel_launch", "graph_launch"]))
    return Totals(
        kernels=tallies.kernels,
        kernels_by_device={int(k): int(v) for k, v in sorted(tallies.kernels_by_device.items())},
        h2d_copies=tallies.h2d_copies,
        h2d_pageable=tallies.h2d_pageable,
        nvtx_ranges=trace.nvtx.height,
        api_launches=launches.height,
        graph_replays=int(trace.graph_replays.height or tallies.node_level_replays()),
    )


def _node_level_replays(kernels: pl.DataFrame) -> int:
    """Graph replays traced node by node: distinct (process, launch correlation id) of the
    kernels that are graph nodes."""
    nodes = kernels.lazy().filter(pl.col("graph_node_id").is_not_null())  # lazy: reads two columns only
    return group_agg(nodes, ["pid", "correlation"], pl.len()).height
