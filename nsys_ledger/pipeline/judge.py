"""Judge: the outcomes of a check, from the merged frames only (the step table, op table,
timeline, layer summary, step-kind table), so one judgement serves a whole trace, its merged
windows and the stacked results of several rank files (multifile)."""

from __future__ import annotations

import polars as pl

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.checks.layers import LayerSummary, check_layers
from nsys_ledger.checks.ledger import CheckOutcome, Finding, check_ledger, describe_steps
from nsys_ledger.checks.ranks import RankComparison
from nsys_ledger.checks.step_kinds import check_step_kinds
from nsys_ledger.checks.timeline import Timeline, timeline_outcomes
from nsys_ledger.ledger import Expectations

GRAPH_LEVEL_NOTICE = (
    "{replays} CUDA graph replays were traced at graph level (--cuda-graph-trace=graph, nsys's "
    "default): their kernels are not in the kernel table, so kernels inside graphs cannot be "
    "counted. Re-capture with `nsys profile --cuda-graph-trace=node` for per-kernel ledgers."
)



def judge(expectations: Expectations, table: pl.DataFrame, ops: pl.DataFrame, timeline: Timeline,
          ranks: RankComparison | None, steps: Steps, layers: LayerSummary | None,
          kind_table: pl.DataFrame | None, graph_level: bool, graph_replays: int) -> list[CheckOutcome]:
    """Every outcome, in the report's order: a ledger for another model (the layer count
    differs) is said before what follows from it."""
    outcomes = _layer_count_outcomes(expectations, layers, table, graph_level)
    outcomes += _ledger_outcomes(expectations, table, ops, timeline, ranks, steps, graph_level, graph_replays)
    outcomes += _layer_outcomes(expectations, layers, table, graph_level)
    outcomes += _kind_outcomes(expectations, kind_table, graph_level)
    return outcomes


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


def _ledger_outcomes(
    expectations: Expectations,
    table: pl.DataFrame,
    ops: pl.DataFrame,
    timeline: Timeline,
    ranks: RankComparison | None,
    steps: Steps,
    graph_level: bool,
    graph_replays: int,
) -> list[CheckOutcome]:
    if graph_level:
        message = GRAPH_LEVEL_NOTICE.format(replays=graph_replays)
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
