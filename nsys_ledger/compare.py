"""Compare two checked traces of one model (two frameworks, or two versions of one) by op role.

`compare(a, b) -> Comparison` is a pure function over two `Result`s, each checked with its own
ledger (or none). Kernels are never matched by name across the two stacks: each side's ledger
gives every kernel an op, and the op a role from the shared vocabulary (ledger/roles.py); a
kernel without a role (no ledger, an op without `role`, a name no op claims) is counted in the
`(no role)` row, never dropped.

Per step kind found in both traces (decode, prefill, mixed), per rank present in both, the
figures are medians over the **steady-state steps**: the steps of that kind in that rank,
without the first one when the rank has at least `WARMUP_MIN_STEPS` of them (the first step
after the profiler starts pays for lazy allocation, cold caches and the first replay's upload).

Per step:

* kernels and their summed time (Σ t_i), the busy union of their intervals, and the GPU span
  (first kernel start to last kernel end); `summed - busy` is time two kernels ran at once
  (concurrency): two stacks with the same kernel cost can differ there alone;
* graph replays (`cudaGraphLaunch` calls), nodes per graph (the GPU activities those launches
  ran, per launch), launches outside graphs (`cudaLaunchKernel` calls), the host time of a
  `cudaGraphLaunch` call, per graph and per node (about 1 µs per node: the node count
  predicts the launch cost);

then per role and per layer: kernels and summed kernel time. `delta` is always B - A, so
swapping the traces negates every delta.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.attribution.step_kinds import DEFAULT_KIND, STEP_KINDS
from nsys_ledger.checks.time_use import union_ns
from nsys_ledger.ledger.roles import NO_ROLE, op_roles, role_of, role_order

__all__ = ["NO_ROLE", "STEP_FIGURES", "WARMUP_MIN_STEPS", "Comparison", "RoleRow", "Side", "compare",
           "compared_steps"]

WARMUP_MIN_STEPS = 3  # a rank with this many steps of a kind drops its first one
EXPLAINING_ROLES = 5  # roles listed as explaining the difference

STEP_KEY = ["rank", "kind", "index"]

# The per-step figures, in report order: (column, what it is, unit)
STEP_FIGURES: tuple[tuple[str, str, str], ...] = (
    ("kernels", "kernels", "count"),
    ("kernel_ns", "summed kernel time", "ns"),
    ("busy_ns", "GPU busy (union of kernels)", "ns"),
    ("span_ns", "GPU span (first start to last end)", "ns"),
    ("concurrency_ns", "concurrency (summed - busy)", "ns"),
    ("graph_replays", "graph replays", "count"),
    ("nodes_per_graph", "nodes per graph", "count"),
    ("non_graph_launches", "launches outside graphs", "count"),
    ("graph_launch_ns_per_graph", "graph launch host time per graph", "ns"),  # cudaGraphLaunch, hipGraphLaunch
    ("graph_launch_ns_per_node", "graph launch host time per node", "ns"),
)


@dataclass(frozen=True)
class RoleRow:
    """One role in one step kind and rank: medians per steady-state step; deltas are B - A."""

    role: str
    kernels_a: float
    kernels_b: float
    delta: float  # kernels
    ns_a: float
    ns_b: float
    ns_delta: float


@dataclass(frozen=True)
class Side:
    label: str  # "A" or "B"
    path: str
    ledger: str | None  # the ledger's name, None without one
    ledger_path: str | None
    roles_declared: int  # ops of the ledger that carry a role
    # kind -> (steps found, steady-state steps), over all ranks
    steps: dict[str, tuple[int, int]]
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Comparison:
    a: Side
    b: Side
    kinds: tuple[str, ...]  # the step kinds both traces have, in STEP_KINDS order
    ranks: tuple[int, ...]  # the ranks both traces have
    # rank, kind, figure, a, b, delta (medians over the steady-state steps; null where a figure
    # does not apply, e.g. nodes per graph without a graph replay)
    figures: pl.DataFrame
    # rank, kind, role, kernels_a, kernels_b, delta, ns_a, ns_b, ns_delta; roles in the
    # vocabulary's order, NO_ROLE last
    roles: pl.DataFrame
    # rank, kind, layer, kernels_a, kernels_b, delta, ns_a, ns_b, ns_delta; a layer one trace
    # lacks has null on that side and a null delta (models with other layer counts)
    layers: pl.DataFrame
    notes: tuple[str, ...]

    @property
    def steady_rule(self) -> str:
        return (f"medians over the steady-state steps: the steps of each kind per rank, without the first "
                f"when a rank has {WARMUP_MIN_STEPS} or more (warm-up)")

    def role_rows(self, kind: str = DEFAULT_KIND, rank: int | None = None) -> list[RoleRow]:
        """The per-role rows of one step kind and rank (default: the first rank both have)."""
        frame = self.roles.filter((pl.col("kind") == kind) & (pl.col("rank") == self._rank(rank)))
        return [RoleRow(**row) for row in frame.drop("rank", "kind").iter_rows(named=True)]

    def explaining_roles(self, kind: str = DEFAULT_KIND, rank: int | None = None,
                         limit: int | None = EXPLAINING_ROLES) -> list[RoleRow]:
        """The roles that explain the difference, largest time delta first (then kernel delta);
        roles with neither a time nor a kernel delta are left out."""
        rows = [r for r in self.role_rows(kind, rank) if r.ns_delta or r.delta]
        rows.sort(key=lambda r: (-abs(r.ns_delta), -abs(r.delta), role_order(r.role)))
        return rows if limit is None else rows[:limit]

    def figure(self, name: str, kind: str = DEFAULT_KIND, rank: int | None = None) -> tuple:
        """(a, b, delta) of one per-step figure (a STEP_FIGURES column)."""
        frame = self.figures.filter(
            (pl.col("kind") == kind) & (pl.col("rank") == self._rank(rank)) & (pl.col("figure") == name))
        if frame.height == 0:
            raise KeyError(f"no figure {name!r} for {kind} steps")
        return frame.select("a", "b", "delta").row(0)

    def layer_rows(self, kind: str = DEFAULT_KIND, rank: int | None = None) -> pl.DataFrame:
        return self.layers.filter((pl.col("kind") == kind) & (pl.col("rank") == self._rank(rank))).drop("rank", "kind")

    def _rank(self, rank: int | None) -> int | None:
        return (self.ranks[0] if self.ranks else None) if rank is None else rank


def compare(a: Result, b: Result) -> Comparison:
    """Line up two checked traces by step kind, rank, role and layer (module docstring)."""
    sides = [_side_frames(result) for result in (a, b)]
    kinds_of = [set(frames.steps["kind"].unique().to_list()) for frames in sides]
    ranks_of = [set(frames.steps["rank"].unique().to_list()) for frames in sides]
    kinds = tuple(k for k in STEP_KINDS if k in kinds_of[0] and k in kinds_of[1])
    ranks = tuple(sorted(ranks_of[0] & ranks_of[1]))
    notes = _notes(kinds_of, ranks_of) + _capture_notes(a, b)
    figures = _paired(*(_step_medians(f.steps) for f in sides), ["rank", "kind", "figure"], ["value"])
    roles_a, roles_b = (_medians_by(f.steps, f.kernels, "role") for f in sides)
    roles = _paired(roles_a, roles_b, ["rank", "kind", "role"], ["kernels", "ns"], fill_zero=True)
    layers_a, layers_b = (_medians_by(f.steps, f.kernels.filter(pl.col("layer").is_not_null()), "layer") for f in sides)
    layers = _paired(layers_a, layers_b, ["rank", "kind", "layer"], ["kernels", "ns"], fill_zero=False)

    def kept(frame: pl.DataFrame) -> pl.DataFrame:
        return frame.filter(pl.col("kind").is_in(list(kinds)) & pl.col("rank").is_in(list(ranks)))

    figure_order = {name: i for i, (name, _, _) in enumerate(STEP_FIGURES)}
    kind_order = {k: i for i, k in enumerate(STEP_KINDS)}
    figures = kept(figures).rename({"value_a": "a", "value_b": "b", "value_delta": "delta"}).sort(
        "rank", pl.col("kind").replace_strict(kind_order, return_dtype=pl.Int64),
        pl.col("figure").replace_strict(figure_order, return_dtype=pl.Int64))
    roles = kept(roles).sort("rank", pl.col("kind").replace_strict(kind_order, return_dtype=pl.Int64),
                             pl.col("role").map_elements(role_order, return_dtype=pl.Int64))
    layers = kept(layers).sort("rank", pl.col("kind").replace_strict(kind_order, return_dtype=pl.Int64), "layer")
    if not kinds:
        notes.insert(0, "the two traces have no step kind in common: nothing to compare")
    return Comparison(
        a=_side("A", a, sides[0]), b=_side("B", b, sides[1]), kinds=kinds, ranks=ranks,
        figures=figures, roles=_renamed(roles), layers=_renamed(layers), notes=tuple(notes),
    )


@dataclass(frozen=True)
class _Frames:
    steps: pl.DataFrame  # rank, kind, index, steady + the per-step figures
    kernels: pl.DataFrame  # rank, kind, index, role, layer, duration (steady-state steps' kernels)


def _side_frames(result: Result) -> _Frames:
    windows = compared_steps(result.steps.windows)
    # the windows' own rank and kind (the activities' `step` numbers decode steps only)
    activities = result.steps.activities.drop("rank", "step", "decode").join(windows, on=["key", "window"], how="inner")
    kernels = activities.filter(pl.col("activity") == "kernel").with_columns(
        (pl.col("end") - pl.col("start")).alias("duration"))
    kernels = kernels.with_columns(_role_column(result).alias("role")).join(
        _layer_of_rows(result), on="row", how="left")
    calls = result.steps.api_calls.select("key", "window", "start", "end", pl.col("kind").alias("call_kind")).join(
        windows, on=["key", "window"], how="inner")
    steps = windows.join(_step_figures(kernels, activities, calls), on=STEP_KEY, how="left").with_columns(
        pl.col(c).fill_null(0) for c in ("kernels", "kernel_ns", "busy_ns", "span_ns", "concurrency_ns",
                                         "graph_replays", "non_graph_launches"))
    return _Frames(
        steps=steps.drop("key", "window"),
        kernels=kernels.select(*STEP_KEY, "steady", "role", "layer", "duration"),
    )


def compared_steps(windows: pl.DataFrame) -> pl.DataFrame:
    """`key, window, rank, kind, index, steady`: the steps a comparison reads. Decode steps are
    the trace's decode steps (`index`: the decode step number); a prefill or mixed step is any
    complete window of its kind (`index`: its number among them in its rank). `steady`: not the
    first step of its kind in a rank that has at least WARMUP_MIN_STEPS of them."""
    decode = windows.filter(pl.col("decode")).select("key", "window", "rank", "kind", pl.col("step").alias("index"))
    other = windows.filter(pl.col("complete") & (pl.col("kind") != DEFAULT_KIND)).select(
        "key", "window", "rank", "kind", pl.col("kind_step").alias("index"))
    steps = pl.concat([decode, other]).with_columns(pl.col("index").cast(pl.Int64))
    count = pl.len().over("rank", "kind")
    first = pl.col("index") == pl.col("index").min().over("rank", "kind")
    return steps.with_columns((~(first & (count >= WARMUP_MIN_STEPS))).alias("steady")).sort(STEP_KEY)


def _role_column(result: Result) -> pl.Expr:
    """Each kernel's role: its op's role in the result's ledger, else NO_ROLE."""
    return role_of("op", op_roles(result.expectations))


def _layer_of_rows(result: Result) -> pl.DataFrame:
    if result.layers is None or result.layers.assignments.height == 0:
        return pl.DataFrame(schema={"row": pl.Int64, "layer": pl.Int64})
    return result.layers.assignments.select(pl.col("row").cast(pl.Int64), pl.col("layer").cast(pl.Int64)).unique("row")


def _step_figures(kernels: pl.DataFrame, activities: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """STEP_KEY + every STEP_FIGURES column, one row per step with kernels or calls."""
    busy = union_ns(kernels, STEP_KEY).rename({"union_ns": "busy_ns"})
    per_kernel = kernels.group_by(STEP_KEY).agg(
        pl.len().cast(pl.Int64).alias("kernels"), pl.col("duration").sum().cast(pl.Int64).alias("kernel_ns"),
        (pl.col("end").max() - pl.col("start").min()).cast(pl.Int64).alias("span_ns"))
    # graph nodes: the GPU activities (kernels, copies, memsets) a cudaGraphLaunch ran
    nodes = activities.filter(pl.col("api_kind") == "graph_launch").group_by(STEP_KEY).agg(
        pl.len().cast(pl.Int64).alias("graph_nodes"))
    per_call = calls.group_by(STEP_KEY).agg(
        (pl.col("call_kind") == "graph_launch").sum().cast(pl.Int64).alias("graph_replays"),
        (pl.col("call_kind") == "kernel_launch").sum().cast(pl.Int64).alias("non_graph_launches"),
        (pl.col("end") - pl.col("start")).filter(pl.col("call_kind") == "graph_launch").sum().cast(pl.Int64)
        .alias("graph_launch_ns"))
    replays = pl.col("graph_replays")
    joined = (
        per_kernel.join(busy, on=STEP_KEY, how="full", coalesce=True)
        .join(per_call, on=STEP_KEY, how="full", coalesce=True)
        .join(nodes, on=STEP_KEY, how="left")
    )
    return joined.select(
        *STEP_KEY, "kernels", "kernel_ns", "busy_ns", "span_ns",
        (pl.col("kernel_ns") - pl.col("busy_ns")).alias("concurrency_ns"),
        "graph_replays",
        pl.when(replays > 0).then(pl.col("graph_nodes") / replays).alias("nodes_per_graph"),
        "non_graph_launches",
        pl.when(replays > 0).then(pl.col("graph_launch_ns") / replays).alias("graph_launch_ns_per_graph"),
        pl.when(pl.col("graph_nodes") > 0).then(pl.col("graph_launch_ns") / pl.col("graph_nodes"))
        .alias("graph_launch_ns_per_node"),
    )


def _step_medians(steps: pl.DataFrame) -> pl.DataFrame:
    """`rank, kind, figure, value`: each per-step figure's median over the steady-state steps."""
    names = [name for name, _, _ in STEP_FIGURES]
    steady = steps.filter(pl.col("steady")).with_columns(pl.col(n).cast(pl.Float64) for n in names)
    long = steady.unpivot(index=["rank", "kind"], on=names, variable_name="figure", value_name="value")
    return long.group_by("rank", "kind", "figure").agg(pl.col("value").median())


def _medians_by(steps: pl.DataFrame, kernels: pl.DataFrame, column: str) -> pl.DataFrame:
    """`rank, kind, <column>, kernels, ns`: kernels and summed kernel time per steady-state step,
    median over the steps; a step without a kernel of a value counts as zero for it."""
    steady = steps.filter(pl.col("steady")).select(STEP_KEY)
    per_step = kernels.filter(pl.col("steady")).group_by(*STEP_KEY, column).agg(
        pl.len().cast(pl.Int64).alias("kernels"), pl.col("duration").sum().cast(pl.Int64).alias("ns"))
    values = per_step.select("rank", "kind", column).unique()
    grid = steady.join(values, on=["rank", "kind"], how="inner")
    full = grid.join(per_step, on=[*STEP_KEY, column], how="left").with_columns(
        pl.col("kernels").fill_null(0), pl.col("ns").fill_null(0))
    return full.group_by("rank", "kind", column).agg(
        pl.col("kernels").cast(pl.Float64).median(), pl.col("ns").cast(pl.Float64).median())


def _paired(a: pl.DataFrame, b: pl.DataFrame, key: list[str], values: list[str], *,
            fill_zero: bool = False) -> pl.DataFrame:
    """`key..., <v>_a, <v>_b, <v>_delta` for every value column: B - A. With `fill_zero`, a row
    one side lacks counts as zero there (a role with no kernels); else it stays null."""
    joined = a.rename({v: f"{v}_a" for v in values}).join(
        b.rename({v: f"{v}_b" for v in values}), on=key, how="full", coalesce=True)
    if fill_zero:
        joined = joined.with_columns(pl.col(f"{v}_{s}").fill_null(0.0) for v in values for s in "ab")
    return joined.select(*key, *[c for v in values for c in (
        pl.col(f"{v}_a"), pl.col(f"{v}_b"), (pl.col(f"{v}_b") - pl.col(f"{v}_a")).alias(f"{v}_delta"))])


def _renamed(frame: pl.DataFrame) -> pl.DataFrame:
    """kernels_delta -> delta (the kernel delta is the comparison's first number)."""
    return frame.rename({"kernels_delta": "delta"})


def _side(label: str, result: Result, frames: _Frames) -> Side:
    steps = {
        kind: (frames.steps.filter(pl.col("kind") == kind).height,
               frames.steps.filter((pl.col("kind") == kind) & pl.col("steady")).height)
        for kind in STEP_KINDS if frames.steps.filter(pl.col("kind") == kind).height
    }
    ledger = result.expectations
    return Side(
        label=label, path=result.trace.path,
        ledger=ledger.name if ledger else None, ledger_path=ledger.path if ledger else None,
        roles_declared=len(op_roles(ledger)),
        steps=steps, ranks=tuple(sorted(frames.steps["rank"].unique().to_list())),
    )


def _capture_notes(a: Result, b: Result) -> list[str]:
    """A trace captured with --cuda-graph-trace=graph has no kernel rows for its replays: its
    kernel, role and layer figures miss every graph kernel."""
    return [f"{label} was captured at graph level ({result.trace.graph_replays.height} replays without kernel rows): "
            "its kernel, role and layer figures miss the kernels inside graphs; re-capture with "
            "`nsys profile --cuda-graph-trace=node`"
            for label, result in (("A", a), ("B", b)) if result.trace.graph_replays.height]


def _notes(kinds_of: list[set[str]], ranks_of: list[set[int]]) -> list[str]:
    notes = []
    for kind in STEP_KINDS:
        if (kind in kinds_of[0]) != (kind in kinds_of[1]):
            notes.append(f"{kind} steps only in {'A' if kind in kinds_of[0] else 'B'}: not compared")
    for label, mine, theirs in (("A", ranks_of[0], ranks_of[1]), ("B", ranks_of[1], ranks_of[0])):
        only = sorted(mine - theirs)
        if only:
            notes.append(f"rank(s) {', '.join(map(str, only))} only in {label}: not compared")
    return notes
