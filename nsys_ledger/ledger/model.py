"""The ledger: what a decode step (and each layer) is expected to launch.

Loaded from an expectations TOML file by `nsys_ledger.ledger.load_expectations`; every
formula is already evaluated here, so the checks only compare numbers. Each item keeps
`source`, the TOML key it came from (e.g. ``anchors.fused_add_rmsnorm``), so a finding can say
which expectation line it is about.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Range:
    """An inclusive expected range; `low` or `high` may be None (unbounded)."""

    low: float | None
    high: float | None

    def contains(self, value: float) -> bool:
        return (self.low is None or value >= self.low) and (self.high is None or value <= self.high)

    def describe(self) -> str:
        def fmt(x: float) -> str:
            return str(int(x)) if float(x).is_integer() else f"{x:g}"

        if self.low is not None and self.high is not None:
            return fmt(self.low) if self.low == self.high else f"{fmt(self.low)}-{fmt(self.high)}"
        if self.low is not None:
            return f">= {fmt(self.low)}"
        if self.high is not None:
            return f"<= {fmt(self.high)}"
        return "any"


# GEMM kinds a ledger may declare: DeepGEMM's GemmType values, plus "grouped" (masked or
# contiguous) and "any".
GEMM_KINDS = ("normal", "masked", "contiguous", "k_contiguous", "batched", "grouped", "any")


@dataclass(frozen=True)
class GemmShape:
    """A GEMM told by the shape and kind in its template arguments, not by its spelling.

    `n`, `k` None: any shape of that kind (the routed MoE GEMMs: `kind = "masked"`)."""

    n: int | None
    k: int | None
    kind: str  # one of GEMM_KINDS

    def describe(self) -> str:
        shape = f"N={self.n} K={self.k}" if self.n is not None else "any shape"
        return f"{self.kind} GEMM {shape}" if self.kind != "any" else f"GEMM {shape}"


@dataclass(frozen=True)
class OpDef:
    """A canonical op: kernels whose demangled name matches any of `patterns`, or a templated
    GEMM whose arguments hold one of the `gemm` shapes.

    `fallback`: a generic catch-all (any other DeepGEMM or cuBLAS GEMM); kernels that only a
    fallback claims are reported apart in the op coverage, since the ledger cannot tell which
    projection they are."""

    name: str
    patterns: tuple[str, ...]
    group: str | None  # ledger group it belongs to (attention, indexer, moe, ...), if declared
    source: str
    gemm: tuple[GemmShape, ...] = ()
    fallback: bool = False
    description: str | None = None  # what the op is, as the ledger explains it
    role: str | None = None  # what it does in the model, from the shared vocabulary (ledger.roles)

    @property
    def regex(self) -> str:
        """One regex matching any of the patterns (for polars `str.contains`)."""
        return "|".join(f"(?:{p})" for p in self.patterns)


@dataclass(frozen=True)
class Anchor:
    """A per-step count of one op, e.g. fused_add_rmsnorm = 2 * layers."""

    op: str
    formula: str  # as written in the file, for messages
    expected: Range  # evaluated, tolerance applied
    hint_low: str | None  # the seed's diagnosis when the count is too low
    hint_high: str | None  # ... and when it is too high
    source: str


@dataclass(frozen=True)
class KindSection:
    """What a step of a kind other than decode launches ([kinds.prefill], [kinds.mixed]):
    kernels per step and per-step counts of ops, in the form of [total] and [anchors]."""

    kind: str  # "prefill" or "mixed"
    total: Range  # kernels per step
    anchors: tuple[Anchor, ...]
    total_formula: str | None = None  # as written, for messages
    total_hint_low: str | None = None
    total_hint_high: str | None = None
    source: str = "kinds"


@dataclass(frozen=True)
class StepRule:
    """How decode steps are found and which ones are excluded."""

    method: str  # "auto", "nvtx", "graph" or "marker"
    nvtx_regex: str | None  # a range whose name matches is one step (method nvtx)
    marker_regex: str | None  # a kernel that ends each step (e.g. the sampling kernel)
    exclude_nvtx_regex: str | None  # steps inside a range matching this are not decode
    exclude_ops: tuple[str, ...]  # a step containing any kernel of these ops is not decode
    source: str = "steps"
    marker_op: str | None = None  # the op whose patterns gave marker_regex ([steps] marker_op), if so
    # never read from or written to a ledger: `learn`'s first pass finds steps exactly as `check`
    # without a ledger does, with the default rule for the trace's kind (api._default_step_rule)
    default_for_trace: bool = False


@dataclass(frozen=True)
class H2DRule:
    per_step: Range  # expected count of host-to-device copies per step
    max_bytes: int | None  # a single copy larger than this is a finding
    pageable_allowed: bool
    source: str = "h2d"


@dataclass(frozen=True)
class StepEntryGaps:
    """The idle time a graph-mode step may start with, per graph launch ([gaps] step_entry_*).

    The GPU finishes the step's small pinned H2D copies in a few µs and then waits for the host
    to return from `cudaGraphLaunch` of a ~2000-node graph: one gap per launch, several µs, that
    is the price of the launch and not a fault inside the replay."""

    per_launch: int  # gaps allowed per graph launch of the step
    max_ns: int | None  # longest such gap; None: any length
    source: str = "gaps"


@dataclass(frozen=True)
class SequenceEntry:
    """One place in a layer class's kernel sequence: the op the kernels here count as, the ops
    whose kernels may fill the place (`op` first, then alternatives: a tile-named cuBLAS GEMM
    that only the generic op claims by name), and how many kernels run here (`0 or 1`, `1-2`,
    a chunked launch `1-8`)."""

    op: str
    fills: tuple[str, ...]
    low: int = 1
    high: int = 1

    def text(self) -> str:
        """The entry as a ledger writes it: ``"op|alternative low-high"``."""
        count = "" if (self.low, self.high) == (1, 1) else (
            f" {self.low}" if self.low == self.high else f" {self.low}-{self.high}")
        return "|".join(self.fills) + count


@dataclass(frozen=True)
class LayerClass:
    """A class of layers (dense, moe, full indexer) and the groups it launches.

    `sequence`: the kernels of a layer of this class in issue order (empty: not declared).
    A class with `insert_before` adds its sequence into the sequence of the layer's other
    class, before that class's first entry of op `insert_before` (the indexer runs inside
    the attention)."""

    name: str
    layers: tuple[int, ...]
    groups: dict[str, Range]  # ledger group -> launches per layer of this class
    source: str
    sequence: tuple[SequenceEntry, ...] = ()
    insert_before: str | None = None


@dataclass(frozen=True)
class LayerRule:
    """How kernels are given layers beyond the opening op ([layers] in the TOML).

    Layer inference (traces without layer-wise NVTX) cuts a step's kernel sequence where a
    layer opens: a kernel of the opening op, or of `first_opening_op` (layer 0 may have no
    residual yet: a plain RMSNorm), that is followed by `opening_followed_by` before the next
    kernel of either (an op that runs several times per layer, like the input and the
    post-attention norm, opens the layer only where the QKV projection follows). The layers
    end at the step's last kernel of `closing_op` (the final norm) when it comes after the last
    opening. `modules` maps a sub-module name of the layer-wise NVTX path to the ledger groups
    its kernels count in (the first one for kernels whose op group is not listed). `uniform`:
    layers of the same classes launch the same number of kernels per group, so a layer that
    differs from the others of its classes is a finding even inside the declared range.
    """

    first_opening_op: str | None = None
    opening_followed_by: str | None = None
    closing_op: str | None = None
    modules: dict[str, tuple[str, ...]] = field(default_factory=dict)
    uniform: bool = False
    source: str = "layers"


@dataclass(frozen=True)
class Expectations:
    path: str
    name: str
    description: str
    params: dict[str, float]  # every parameter, evaluated
    ops: dict[str, OpDef]  # declaration order = match priority (first match wins)
    anchors: tuple[Anchor, ...]
    total: Range  # kernels per step
    total_hint_low: str | None
    total_hint_high: str | None
    steps: StepRule
    gap_threshold_ns: int
    h2d: H2DRule
    graph_launches_per_step: Range | None  # None: not checked (eager deployments)
    batch: int | None
    layer_regex: str | None  # NVTX text -> layer index (one group)
    layer_classes: tuple[LayerClass, ...] = ()
    layer_opening_op: str | None = None  # the op that starts every layer (layer inference)
    layer_rule: LayerRule = field(default_factory=LayerRule)  # the rest of [layers]
    rank_imbalance_pct: float | None = None  # [ranks] max_imbalance_pct; None: not checked
    step_entry_gaps: StepEntryGaps | None = None  # [gaps] step_entry_per_launch; None: none allowed
    gaps_allowed_per_step: int = 0  # [gaps] allowed_per_step: gaps above the threshold a step may show
    # [kinds.prefill], [kinds.mixed]: the steps of that kind are checked against it; steps of a
    # kind without a section are counted, not checked. Decode steps are the rest of the ledger.
    kinds: dict[str, KindSection] = field(default_factory=dict)
    # Every number, range and layer list exactly as the file wrote it (formulas, "a-b", tables),
    # by dotted TOML key (``params.moe_layers``, ``anchors.sparse_mla.expected``,
    # ``ops.o_proj.gemm``, ``layers.classes.moe.groups``): the writer puts these back instead of
    # the evaluated numbers, so a ledger keeps its formulas. Code building a ledger may set
    # forms here too (``{"layers.classes.moe.count": "moe_layers"}``); the writer uses a form
    # only while it still reads as the model's value.
    written: dict[str, object] = field(default_factory=dict)
    # A comment per value or table, by dotted TOML key: the writer puts ``# text`` after the
    # value (or above the table header). `nsys-ledger learn` says here how each number was seen.
    # A comment on something the writer leaves out (an undeclared [graphs]) has no place and is
    # not written; the reader does not read comments back.
    comments: dict[str, str] = field(default_factory=dict)

    def op_regexes(self) -> list[tuple[str, re.Pattern[str] | None]]:
        """(op, compiled patterns) in match order; None for an op declared by GEMM shape only."""
        return [(name, re.compile(op.regex) if op.patterns else None) for name, op in self.ops.items()]
