"""Learn a ledger from known-good captures (`nsys-ledger learn`).

A hand-written ledger is a lower bound read off the code path; a real build launches more
(activation quantizations, a fused all-reduce, MTP). `learn` writes the ledger a healthy
capture obeys, so that `check` then fails when a change breaks it. Two passes over the
traces, each a plain `check`:

1. with the base ledger (if any): the decode steps, the layer of every kernel and the ops the
   base ledger names. Kernel names become ops: a name a specific base op claims keeps that
   op; the others are grouped by GEMM shape and kind (templated GEMMs) or by their function
   name, each with a readable name and its group (the layer sub-module, else outside the
   layers: `step`).
2. with those ops: per-step counts of every op, the total, H2D copies, graph launches, idle
   gaps and per-layer group counts, which become the anchors, ranges and layer classes.

Every number gets a comment saying how it was observed; a count that varies across steps,
or that was seen in fewer than MIN_STABLE_STEPS steps, becomes a range, never an exact anchor.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import polars as pl

from nsys_ledger.api import DEFAULT_GAP_THRESHOLD_NS, DEFAULT_STEP_RULE, Result
from nsys_ledger.attribution.kernel_names import function_name, gemm_signature
from nsys_ledger.attribution.layers import DEFAULT_LAYER_REGEX
from nsys_ledger.attribution.ops import UNMATCHED_OP, OpClassifier
from nsys_ledger.checks.gaps import is_step_entry_candidate
from nsys_ledger.checks.step_kinds import steps_of_kind
from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.document import read_expectations, write_expectations
from nsys_ledger.ledger.reading import LedgerReader
from nsys_ledger.ledger.sections.kinds import SECTION_KINDS
from nsys_ledger.ledger.model import (
    Anchor,
    Expectations,
    GemmShape,
    H2DRule,
    KindSection,
    LayerClass,
    LayerRule,
    OpDef,
    Range,
    SequenceEntry,
    StepEntryGaps,
    StepRule,
)
from nsys_ledger.pipeline.multifile import check_many
from nsys_ledger.safety import write_atomically

STEP_KEY = ["rank", "step"]
OUTSIDE_LAYERS_GROUP = "step"  # ops that run outside the decoder layers (embedding, LM head, sampling)
IN_LAYER_GROUP = "layer"  # ops inside the layers whose sub-module is unknown
GROUPED_KINDS = ("masked", "contiguous", "k_contiguous", "batched")
# Sub-module -> group when the base ledger does not say ([layers.modules] of SGLang/vLLM module paths).
DEFAULT_MODULE_GROUPS = {"self_attn": ("attention",), "attn": ("attention",), "indexer": ("indexer",),
                         "mlp": ("ffn",), "experts": ("ffn",), "shared_experts": ("ffn",)}
STEP_ENTRY_MARGIN = 1.5  # a learned step-entry gap may be this much longer than the longest seen
IMBALANCE_MARGIN = 1.25  # ... and the ranks' busy-time spread this much larger,
IMBALANCE_FLOOR_PCT = 10  # but never below the shipped ledgers' 10%: a nearly even capture's 0.1% is noise
MAX_OP_NAME = 48
# A count is "stable" (an exact anchor) only when it is the same in at least this many decode
# steps: one or two steps say nothing about how a count varies, so their counts stay ranges.
MIN_STABLE_STEPS = 3
GAP_QUANTILE = 0.99  # the learned gap threshold: this quantile of the known-good gaps (longest left out) ...
GAP_MARGIN = 2.0  # ... times this margin


@dataclass(frozen=True)
class LearnOptions:
    base: Expectations | None = None  # ops, step rule and layer rule to start from
    tolerance: int = 0  # kernels of slack on every learned count
    named_params: dict[str, float] = field(default_factory=dict)  # --params layers=78: names for counts
    from_steps: tuple[int, int] | None = None  # only these decode steps (inclusive, per rank)
    step_nvtx: str | None = None
    step_method: str | None = None
    gap_us: float | None = None
    name: str | None = None  # the ledger's [model] name


def learn(paths: Sequence[str | os.PathLike[str]], options: LearnOptions) -> Expectations:
    """The ledger the decode steps of `paths` (one or more exports or traces: ranks) obey."""
    check_options = {"step_nvtx": options.step_nvtx, "step_method": options.step_method, "gap_us": options.gap_us}
    first = check_many(list(paths), options.base or bare_ledger(options), keep_events=True, **check_options)
    if first.step_table.height == 0:
        raise LearnError(f"no decode step found in {', '.join(map(str, paths))} ({first.steps.detail}"
                         f"{_excluded_text(first)}): give --step-nvtx REGEX, --step-method capture, or a --base "
                         "ledger that finds them")
    names = decode_kernel_names(first, options)
    provisional = provisional_ledger(first, learned_ops(names, options.base), options)
    second = check_many(list(paths), provisional, **check_options)
    ledger = final_ledger(provisional, second, options, [str(p) for p in paths])
    learned_ledger_text(ledger)  # a ledger that cannot be read back is an error here, not in the next check
    return ledger


def _excluded_text(result: Result) -> str:
    """'; 1 window excluded: inside NVTX range ... (not decode)': why the windows found are not steps."""
    excluded = result.steps.excluded
    if excluded.height == 0:
        return ""
    reasons = sorted(set(excluded["reason"].drop_nulls()))
    return f"; {excluded.height} window(s) excluded: {'; '.join(reasons)}"


class LearnError(ValueError):
    """The traces hold nothing to learn from, or the ledger learned from them does not hold
    together (one line for the command line)."""


def learned_ledger_text(ledger: Expectations) -> str:
    """The ledger's TOML text, validated by reading it back as `check --expect` will (the same
    checks as a hand-written ledger: known keys, formulas, layer classes within the total).
    Raises LearnError naming the contradiction."""
    text = write_expectations(ledger)
    try:
        read_expectations(LedgerReader("the learned ledger", text), tomllib.loads(text))
    except (ExpectationsError, tomllib.TOMLDecodeError) as error:
        raise LearnError(f"the learned ledger does not hold together, nothing written: {error}") from None
    return text


def write_learned_ledger(ledger: Expectations, path: str | os.PathLike[str]) -> None:
    """Validate, then write `path` whole or not at all (safety.write_atomically: a temporary
    file beside it, renamed over it), so a failure leaves neither a partial ledger nor a stray
    file behind."""
    text = learned_ledger_text(ledger)
    write_atomically(path, lambda target: target.write_text(text, encoding="utf-8"))


# ---- pass 1: kernel names into ops ---------------------------------------------------------


def _in_steps(frame: pl.DataFrame, options: LearnOptions) -> pl.DataFrame:
    if options.from_steps is None:
        return frame
    low, high = options.from_steps
    return frame.filter(pl.col("step").is_between(low, high))


def decode_kernel_names(result: Result, options: LearnOptions) -> pl.DataFrame:
    """Per distinct decode kernel name: `name, kernels, op, base_group, fallback, layer_group,
    in_layer` (the share of its kernels inside a layer)."""
    kernels = _in_steps(
        result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel")), options
    ).select("rank", "row", "name", "op", "group")
    assignments = result.layers.assignments.select("rank", "row", "layer", "layer_group") if result.layers else None
    if assignments is not None and assignments.height:
        kernels = kernels.join(assignments, on=["rank", "row"], how="left")
    else:
        kernels = kernels.with_columns(pl.lit(None, pl.Int64).alias("layer"), pl.lit(None, pl.Utf8).alias("layer_group"))
    fallback_ops = [n for n, op in result.expectations.ops.items() if op.fallback] if result.expectations else []
    # ops by name: a kernel's `op` may be the op of its place in a layer sequence (a tile-named
    # cuBLAS GEMM in the router's place), which the learned ops, matched by name, cannot repeat
    classifier = OpClassifier(result.expectations)
    distinct = kernels.select(pl.col("name").unique()).drop_nulls()["name"].to_list()
    matches = [classifier.classify(name) for name in distinct]
    by_name = pl.DataFrame({"name": distinct, "_op": [m.op for m in matches], "_group": [m.group for m in matches]},
                           schema={"name": pl.Utf8, "_op": pl.Utf8, "_group": pl.Utf8})
    kernels = kernels.join(by_name, on="name", how="left").with_columns(
        pl.col("_op").alias("op"), pl.col("_group").alias("group")).drop("_op", "_group")
    return (
        kernels.group_by("name")
        .agg(
            pl.len().alias("kernels"),
            pl.col("op").first().fill_null(UNMATCHED_OP),
            pl.col("group").first().alias("base_group"),
            pl.col("layer").is_not_null().mean().alias("in_layer"),
            pl.col("layer_group").drop_nulls().mode().sort().first().alias("layer_group"),
            pl.col("row").min().alias("_first"),
        )
        .with_columns(pl.col("op").is_in(fallback_ops).alias("fallback"))
        .sort("_first")
        .drop("_first")
    )


@dataclass
class _DerivedOp:
    name: str
    patterns: list[str]
    gemm: tuple[GemmShape, ...]
    groups: Counter
    kernels: int = 0
    examples: list[str] = field(default_factory=list)


def learned_ops(names: pl.DataFrame, base: Expectations | None) -> dict[str, OpDef]:
    """Ops for the observed names, in match order: the base ledger's specific ops that claim
    names (and those its step and layer rules name), then GEMMs by shape, then the other
    names by function name."""
    base_ops = base.ops if base else {}
    claimed = {op for op, fallback in names.filter(pl.col("op") != UNMATCHED_OP).select("op", "fallback").iter_rows()
               if not fallback}
    kept = [name for name in base_ops if name in claimed or name in _ops_named_by_rules(base)]
    derived: dict[tuple, _DerivedOp] = {}
    for name, op, kernels, base_group, in_layer, layer_group in names.select(
        "name", "op", "kernels", "base_group", "in_layer", "layer_group"
    ).iter_rows():
        if op in kept:
            continue
        key, op_name, patterns, gemm = _derive(name)
        entry = derived.setdefault(key, _DerivedOp(op_name, patterns, gemm, Counter()))
        entry.kernels += kernels
        entry.groups[_group_of(in_layer, layer_group, base_group)] += kernels
        entry.examples.append(name)
    ops = {name: base_ops[name] for name in kept}
    used = set(ops)
    # GEMM shapes first: a function-name pattern of a runtime-shaped GEMM would also match them
    for entry in sorted(derived.values(), key=lambda e: not e.gemm):
        unique = _unique_name(entry.name, used)
        used.add(unique)
        group = entry.groups.most_common(1)[0][0]
        ops[unique] = OpDef(
            name=unique, patterns=tuple(entry.patterns), group=group, source=f"ops.{unique}", gemm=entry.gemm,
            description=f"learned: {len(entry.examples)} kernel name(s), e.g. {entry.examples[0][:160]}",
        )
    return ops


def _ops_named_by_rules(base: Expectations | None) -> set[str]:
    """Ops the base ledger's step and layer rules refer to: kept even when not observed."""
    if base is None:
        return set()
    rule = base.layer_rule
    named = {base.steps.marker_op, base.layer_opening_op, rule.first_opening_op, rule.opening_followed_by,
             rule.closing_op, *base.steps.exclude_ops}
    return {op for op in named if op}


def _group_of(in_layer: float | None, layer_group: str | None, base_group: str | None) -> str:
    if in_layer is not None and in_layer >= 0.5:
        return layer_group or base_group or IN_LAYER_GROUP
    return OUTSIDE_LAYERS_GROUP if base_group in (None, IN_LAYER_GROUP) else base_group


def _derive(name: str) -> tuple[tuple, str, list[str], tuple[GemmShape, ...]]:
    """(grouping key, op name, patterns, GEMM shapes) of a name no specific base op claims."""
    signature = gemm_signature(name)
    shape = signature.probable_shape() if signature else None
    if signature is not None and shape is not None:
        kind = signature.kind or "normal"
        suffix = "" if kind == "normal" else f"_{kind}"
        return ("gemm", *shape, kind), f"gemm_{shape[0]}x{shape[1]}{suffix}", [], (GemmShape(*shape, kind),)
    if signature is not None and signature.kind in GROUPED_KINDS:
        kind = signature.kind
        return ("gemm", None, None, kind), f"gemm_{kind}", [], (GemmShape(None, None, kind),)
    function = function_name(name) or name
    return ("function", function), _op_name(function), [_function_pattern(function)], ()


def _function_pattern(function: str) -> str:
    """The function name as a whole word of the demangled name (`RMSNormKernel` does not match
    `FusedAddRMSNormKernel`); no look-around, so polars can run it too."""
    return rf"(?:^|[^A-Za-z0-9_]){re.escape(function)}(?:[^A-Za-z0-9_]|$)"


def _op_name(function: str) -> str:
    """`FusedAddRMSNormKernel` -> `fused_add_rms_norm_kernel`, valid as a TOML ledger key."""
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", function).lower()
    snake = re.sub(r"[^a-z0-9_]+", "_", snake).strip("_")
    if not snake or not snake[0].isalpha():
        snake = f"k_{snake}"
    return snake[:MAX_OP_NAME].rstrip("_")


def _unique_name(name: str, used: set[str]) -> str:
    if name not in used:
        return name
    n = 2
    while f"{name}_{n}" in used:
        n += 1
    return f"{name}_{n}"


def bare_ledger(options: LearnOptions) -> Expectations:
    """Pass 1 without a base ledger: no op and nothing to check, but the layer regex and the
    sub-module groups, so that kernels get their layer and group from layer-wise NVTX. Steps
    are found exactly as `check` without a ledger finds them (with the same --step-nvtx and
    --step-method): the default rule for the trace's kind."""
    steps = dataclasses.replace(DEFAULT_STEP_RULE, default_for_trace=True)
    return Expectations(
        path="(learning)", name="learning", description="", params={}, ops={}, anchors=(), total=Range(None, None),
        total_hint_low=None, total_hint_high=None, steps=steps, gap_threshold_ns=DEFAULT_GAP_THRESHOLD_NS,
        h2d=H2DRule(Range(None, None), None, True), graph_launches_per_step=None, batch=None,
        layer_regex=DEFAULT_LAYER_REGEX, layer_rule=LayerRule(modules=dict(DEFAULT_MODULE_GROUPS)),
    )


def provisional_ledger(first: Result, ops: dict[str, OpDef], options: LearnOptions) -> Expectations:
    """The base ledger's rules (or, without one, the bare ledger's) with the learned ops and
    nothing to check yet: no anchors, total, layer classes, H2D or graph-launch bounds."""
    base = options.base
    if base is None:
        bare = bare_ledger(options)
        steps = _learned_step_rule(first, options)
        return dataclasses.replace(
            bare, path="(learned)", name=options.name or "learned", ops=ops, steps=steps,
            gap_threshold_ns=first.gap_threshold_ns, layer_rule=LayerRule(modules=_modules_of(ops)),
        )
    # the base's formulas stay (moe_layers = "layers - dense_layers", k = "hidden")
    kept = tuple(f"ops.{name}." for name in ops if name in base.ops)
    params_written = {k: v for k, v in base.written.items() if k.startswith(("params.", *kept))}
    return dataclasses.replace(
        base, ops=ops, anchors=(), total=Range(None, None), layer_classes=(), written=params_written,
        comments={}, h2d=H2DRule(Range(None, None), None, True), graph_launches_per_step=None,
    )


def _learned_step_rule(first: Result, options: LearnOptions) -> StepRule:
    """The rule pass 1 found its steps with, pinned to the method it chose: the learned ledger
    finds the same steps in the same traces."""
    rule = first.steps.rule or DEFAULT_STEP_RULE
    used = dataclasses.replace(rule, method=first.steps.method, default_for_trace=False,
                               nvtx_regex=options.step_nvtx or rule.nvtx_regex)
    if used.method in ("nvtx", "capture"):
        used = dataclasses.replace(used, marker_regex=None)
    if used.method != "nvtx":
        used = dataclasses.replace(used, nvtx_regex=None)
    return used


def _modules_of(ops: dict[str, OpDef]) -> dict[str, tuple[str, ...]]:
    """The default sub-module groups that the learned ops use (a ledger declares no others)."""
    groups = {op.group for op in ops.values()}
    return {module: g for module, g in DEFAULT_MODULE_GROUPS.items() if set(g) <= groups}


# ---- pass 2: counts into the ledger ---------------------------------------------------------


def final_ledger(provisional: Expectations, result: Result, options: LearnOptions, paths: list[str]) -> Expectations:
    table = _in_steps(result.step_table, options)
    steps = table.height
    comments: dict[str, str] = {}
    written: dict[str, object] = dict(provisional.written)
    classes, class_comments = layer_classes(result, options)
    classes, sequence_comments = with_sequences(classes, result, options)
    class_comments |= sequence_comments
    params, param_comments = learned_params(provisional, classes, options)
    comments |= class_comments | param_comments
    candidates = _formula_candidates(params, options)

    anchors = []
    op_table = _in_steps(result.op_table, options)
    for op in provisional.ops:
        if op not in op_table.columns:
            continue
        counts = op_table[op]
        low, high = int(counts.min()), int(counts.max())
        if high == 0:
            continue
        anchor, anchor_written, comment = _learned_count(f"anchors.{op}", low, high, steps, candidates, options)
        base_anchor = next((a for a in (options.base.anchors if options.base else ()) if a.op == op), None)
        anchors.append(dataclasses.replace(
            anchor, op=op, hint_low=base_anchor.hint_low if base_anchor else None,
            hint_high=base_anchor.hint_high if base_anchor else None,
        ))
        written |= anchor_written
        exact = f"anchors.{op}.expected" in anchor_written
        comments[f"anchors.{op}.expected" if exact else f"anchors.{op}.min"] = comment

    kinds, kind_written, kind_comments = _learned_kinds(provisional, result, options, candidates)
    written |= kind_written
    comments |= kind_comments

    kernels = table["kernels"]
    total = Range(max(0, int(kernels.min()) - options.tolerance), int(kernels.max()) + options.tolerance)
    comments["total.min" if total.low != total.high else "total.expected"] = _observed(kernels, steps, "kernels per step")

    h2d, h2d_comments = _learned_h2d(table, steps, options)
    comments |= h2d_comments
    graphs = None
    if result.steps.method == "graph":
        launches = table["graph_launches"]
        graphs = Range(int(launches.min()), int(launches.max()))
        comments["graphs.launches_per_step"] = _observed(launches, steps, "graph launches per step")
    threshold_ns, gaps_allowed, step_entry, gap_comments = _learned_gaps(provisional, result, options)
    comments |= gap_comments
    imbalance, rank_comments = _learned_imbalance(provisional, result)
    comments |= rank_comments
    comments["model"] = (f"learned by nsys-ledger learn from {', '.join(os.path.basename(p) for p in paths)}: "
                         f"{steps} decode steps on {table['rank'].n_unique()} rank(s)")
    base = options.base
    return dataclasses.replace(
        provisional,
        path="(learned)",
        name=options.name or (f"{base.name} (learned)" if base else "learned from " + os.path.basename(paths[0])),
        description=(base.description if base else ""),
        params=params,
        anchors=tuple(anchors),
        total=total,
        total_hint_low=base.total_hint_low if base else None,
        total_hint_high=base.total_hint_high if base else None,
        gap_threshold_ns=threshold_ns,
        gaps_allowed_per_step=gaps_allowed,
        step_entry_gaps=step_entry,
        rank_imbalance_pct=imbalance,
        h2d=h2d,
        graph_launches_per_step=graphs,
        layer_classes=classes,
        layer_rule=dataclasses.replace(provisional.layer_rule, uniform=bool(classes)),
        kinds=kinds,
        written=written,
        comments=comments,
    )


def _learned_kinds(provisional: Expectations, result: Result, options: LearnOptions,
                   candidates: list[tuple[str, int]]) -> tuple[dict[str, KindSection], dict[str, object], dict[str, str]]:
    """A [kinds.KIND] section for every kind other than decode that the traces show: its kernels
    per step and the per-step counts of the learned ops its steps launch."""
    kinds: dict[str, KindSection] = {}
    written: dict[str, object] = {}
    comments: dict[str, str] = {}
    for kind in SECTION_KINDS:
        table = steps_of_kind(result.kind_table, kind, list(provisional.ops))
        if table.height == 0:
            continue
        steps = table.height
        anchors = []
        for op in provisional.ops:
            low, high = int(table[op].min()), int(table[op].max())
            if high == 0:
                continue
            key = f"kinds.{kind}.anchors.{op}"
            anchor, anchor_written, comment = _learned_count(key, low, high, steps, candidates, options)
            anchors.append(dataclasses.replace(anchor, op=op))
            written |= anchor_written
            comments[f"{key}.expected" if f"{key}.expected" in anchor_written else f"{key}.min"] = \
                comment.replace("decode steps", f"{kind} steps")
        key = f"kinds.{kind}.total"
        kernels = table["kernels"]
        total, total_written, comment = _learned_count(key, int(kernels.min()), int(kernels.max()), steps, [], options)
        written |= total_written
        comments[f"{key}.expected" if f"{key}.expected" in total_written else f"{key}.min"] = \
            comment.replace("decode steps", f"{kind} steps").replace("observed", "kernels per step: observed", 1)
        kinds[kind] = KindSection(kind=kind, total=total.expected, anchors=tuple(anchors), total_formula=total.formula,
                                  source=f"kinds.{kind}")
    return kinds, written, comments


def _observed(values: pl.Series, steps: int, what: str) -> str:
    low, high = values.min(), values.max()
    if low == high:
        return f"observed {low} {what} in each of {steps} decode steps {_stability(steps)}"
    return f"observed {low}-{high} {what} over {steps} decode steps (unstable: a range)"


def _stability(steps: int) -> str:
    """'(stable)' for a count seen equal in enough steps, else why it is not called stable."""
    if steps >= MIN_STABLE_STEPS:
        return "(stable)"
    return f"(too few steps to call it stable: {MIN_STABLE_STEPS} or more needed)"


def _formula_candidates(params: dict[str, float], options: LearnOptions) -> list[tuple[str, int]]:
    """Parameters that count layers, for writing anchors as formulas: `layers` first, then the
    names given with --params, then the other `*layers` parameters."""
    ordered = ["layers", *options.named_params, *sorted(p for p in params if "layers" in p)]
    seen: list[tuple[str, int]] = []
    for name in ordered:
        if name in params and name not in {n for n, _ in seen} and params[name] >= 2:
            seen.append((name, int(params[name])))
    return seen


def _formula(count: int, candidates: list[tuple[str, int]]) -> str | None:
    for multiple in (1, 2, 3, 4):
        for name, value in candidates:
            if count == multiple * value:
                return name if multiple == 1 else f"{multiple} * {name}"
    return None


def _learned_count(key: str, low: int, high: int, steps: int, candidates: list[tuple[str, int]],
                   options: LearnOptions) -> tuple[Anchor, dict[str, object], str]:
    """An anchor for a count seen as `low`-`high`: exact (with --tolerance) when stable, else
    a min/max range; its written keys and its comment."""
    tolerance = options.tolerance
    if low == high and steps >= MIN_STABLE_STEPS:
        formula = _formula(low, candidates)
        expected = formula or str(low)
        written: dict[str, object] = {f"{key}.expected": formula or low}
        if tolerance:
            written[f"{key}.tolerance"] = tolerance
        shown = f"{expected} ± {tolerance}" if tolerance else expected
        comment = f"observed {low} in each of {steps} decode steps (stable)" + (f" = {formula}" if formula else "")
        return Anchor(op="", formula=shown, expected=Range(max(0, low - tolerance), low + tolerance),
                      hint_low=None, hint_high=None, source=key), written, comment
    lo, hi = max(0, low - tolerance), high + tolerance
    if low == high:
        comment = (f"observed {low} in each of {steps} decode steps {_stability(steps)}: "
                   "a range, not an anchor value")
    else:
        comment = f"observed {low}-{high} over {steps} decode steps (unstable: a range, not an anchor value)"
    return (Anchor(op="", formula=f"min {lo}, max {hi}", expected=Range(lo, hi), hint_low=None, hint_high=None,
                   source=key), {f"{key}.min": lo, f"{key}.max": hi}, comment)


def _learned_h2d(table: pl.DataFrame, steps: int, options: LearnOptions) -> tuple[H2DRule, dict[str, str]]:
    copies = table["h2d"]
    largest = table["h2d_max_bytes"].max()
    pageable = int(table["h2d_pageable"].max() or 0)
    comments = {
        "h2d.per_step": _observed(copies, steps, "H2D copies per step"),
        "h2d.pageable_allowed": f"{pageable} pageable copies at most per step in the known-good capture",
    }
    max_bytes = None
    if largest is not None and largest > 0:
        max_bytes = int(largest)
        comments["h2d.max_bytes"] = f"the largest H2D copy observed: {max_bytes} bytes"
    return H2DRule(Range(int(copies.min()), int(copies.max())), max_bytes, pageable > 0), comments


def _learned_gaps(provisional: Expectations, result: Result, options: LearnOptions
                  ) -> tuple[int, int, StepEntryGaps | None, dict[str, str]]:
    """The gap threshold, the gaps beyond it a step may show, and the step-entry allowance (the
    launch gaps seen at graph replays' entries).

    The threshold comes from the healthy gap distribution, never from the worst gap: GAP_MARGIN
    times the GAP_QUANTILE quantile of the idle gaps above the base threshold inside the known-
    good steps, the longest one left out. The known-good gaps beyond it (outliers: a profiler
    start, a one-off stall) are counted, and a step may show as many as the worst known-good
    step did (`allowed_per_step`), so the ledger passes the capture it came from while a longer
    stall than the healthy ones is still counted against every step."""
    gaps = _in_steps(result.gaps, options)
    base = provisional.gap_threshold_ns
    threshold, allowed = base, 0
    comments = {}
    launch = gaps.filter(is_step_entry_candidate())
    inside = gaps.filter(~is_step_entry_candidate())
    if inside.height:
        durations = inside["duration"].sort()
        typical = int(durations[:-1].quantile(GAP_QUANTILE, "lower")) if len(durations) > 1 else None
        if typical is not None:
            threshold = max(base, int(math.ceil(typical * GAP_MARGIN / 1000)) * 1000)
        beyond = inside.filter(pl.col("duration") > threshold)
        allowed = int(beyond.group_by(STEP_KEY).len()["len"].max()) if beyond.height else 0
        seen = (f"{inside.height} idle gaps above {base / 1000:g} us inside the known-good steps "
                f"(causes {', '.join(sorted(set(inside['cause'])))})")
        if typical is None:
            comments["gaps.threshold_us"] = f"kept: only one gap to learn from ({seen})"
        else:
            comments["gaps.threshold_us"] = (
                f"x{GAP_MARGIN:g} the {GAP_QUANTILE * 100:g}th percentile of the {seen}, the longest left out: "
                f"{typical / 1000:.1f} us")
        if allowed:
            comments["gaps.allowed_per_step"] = (
                f"{beyond.height} known-good gap(s) beyond the threshold (the longest "
                f"{int(beyond['duration'].max()) / 1000:.1f} us, {', '.join(sorted(set(beyond['cause'])))}); "
                f"at most {allowed} in one step")
    else:
        comments["gaps.threshold_us"] = f"no idle gap above {threshold / 1000:g} us inside the known-good steps"
    step_entry = provisional.step_entry_gaps
    if launch.height:
        per_step = launch.group_by(STEP_KEY).agg(pl.len().alias("n"))
        launches = result.step_table.select(*STEP_KEY, "graph_launches")
        per_launch = per_step.join(launches, on=STEP_KEY).select(
            (pl.col("n") / pl.col("graph_launches").clip(lower_bound=1)).ceil().max()).item()
        longest = int(launch["duration"].max())
        step_entry = StepEntryGaps(per_launch=int(per_launch), max_ns=int(math.ceil(longest * STEP_ENTRY_MARGIN / 1000)) * 1000)
        comments["gaps.step_entry_max_us"] = (
            f"the longest step-entry launch gap observed: {longest / 1000:.1f} us (x{STEP_ENTRY_MARGIN:g})")
    return threshold, allowed, step_entry, comments


def _learned_imbalance(provisional: Expectations, result: Result) -> tuple[float | None, dict[str, str]]:
    """The busy-time spread between ranks a known-good rank set shows, with headroom: kept at
    the base's limit when within it, raised above what was seen when not."""
    limit = provisional.rank_imbalance_pct
    if result.ranks is None:
        return limit, {}
    seen = result.ranks.imbalance_pct
    if limit is not None and seen <= limit:
        return limit, {"ranks.max_imbalance_pct": f"the known-good ranks differ by {seen:.1f}% in busy time"}
    raised = float(max(math.ceil(seen * IMBALANCE_MARGIN), IMBALANCE_FLOOR_PCT))
    return raised, {"ranks.max_imbalance_pct": f"the known-good ranks differ by {seen:.1f}% in busy time "
                                               f"(x{IMBALANCE_MARGIN:g}); a larger spread fails"}


# ---- layers ----------------------------------------------------------------------------------


def layer_classes(result: Result, options: LearnOptions) -> tuple[tuple[LayerClass, ...], dict[str, str]]:
    """Layers that launch the same kernels per group in every step form a class."""
    if result.layers is None or result.layers.counts.height == 0:
        return (), {}
    counts = _in_steps(result.layers.counts, options)
    groups = sorted(counts["group"].drop_nulls().unique().to_list())
    # group names are the ledger's (a group may be called "layer"): prefixed as columns
    per_layer = (
        counts.filter(pl.col("group").is_not_null())
        .with_columns(pl.concat_str(pl.lit("g:"), pl.col("group")).alias("group"))
        .pivot(on="group", index=["rank", "step", "layer"], values="count", aggregate_function="sum")
        .fill_null(0)
    )
    steps = per_layer.select(STEP_KEY).n_unique()
    signature = per_layer.group_by("layer").agg(
        *[pl.col(f"g:{g}").min().alias(f"{g}__min") for g in groups],
        *[pl.col(f"g:{g}").max().alias(f"{g}__max") for g in groups],
    ).sort("layer")
    by_signature: dict[tuple, list[int]] = {}
    for row in signature.iter_rows(named=True):
        key = tuple((g, row[f"{g}__min"], row[f"{g}__max"]) for g in groups)
        by_signature.setdefault(key, []).append(row["layer"])
    classes, comments, used = [], {}, set()
    for key, layers in sorted(by_signature.items(), key=lambda item: item[1][0]):
        present = [g for g, _, high in key if high > 0]
        name = _unique_name("_".join(present) or "empty", used)
        used.add(name)
        ranges = {g: Range(max(0, low - options.tolerance), high + options.tolerance) for g, low, high in key}
        classes.append(LayerClass(name=name, layers=tuple(layers), groups=ranges, source=f"layers.classes.{name}"))
        unstable = [g for g, low, high in key if low != high]
        comments[f"layers.classes.{name}.groups"] = (
            f"{len(layers)} layers launch these per group in each of {steps} decode steps"
            + (f"; varies across steps: {', '.join(unstable)}" if unstable else f" {_stability(steps)}"))
    return tuple(classes), comments


def with_sequences(classes: tuple[LayerClass, ...], result: Result, options: LearnOptions
                   ) -> tuple[tuple[LayerClass, ...], dict[str, str]]:
    """Each class with the kernel sequence its layers launched, in issue order, repeats of one
    op written once with their count, when every layer of the class launched that same
    sequence in every step. A class whose sequence holds a kernel no op claims gets none (an
    entry names an op)."""
    if not classes or result.layers is None:
        return classes, {}
    kernels = _in_steps(
        result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel")), options
    ).select("rank", "step", "row", "op", "api_start", "start")
    placed = result.layers.assignments.select("rank", "row", "layer", "capture_time").filter(pl.col("layer").is_not_null())
    layered = kernels.join(placed, on=["rank", "row"])
    sequences = (
        layered.with_columns(pl.coalesce("api_start", "start").alias("_launched"))
        .sort("rank", "step", "layer", "_launched", "capture_time", "start", nulls_last=True, maintain_order=True)
        .group_by("rank", "step", "layer", maintain_order=True)
        .agg(pl.col("op").fill_null(UNMATCHED_OP))
    )
    by_layer: dict[int, Counter[tuple[str, ...]]] = {}
    for _rank, _step, layer, ops in sequences.iter_rows():
        by_layer.setdefault(layer, Counter())[tuple(ops)] += 1
    out, comments = [], {}
    for layer_class in classes:
        seen: Counter[tuple[str, ...]] = Counter()
        for layer in layer_class.layers:
            seen.update(by_layer.get(layer, Counter()))
        if not seen:
            out.append(layer_class)
            continue
        commonest, times = min(seen.items(), key=lambda item: (-item[1], item[0]))
        key = f"layers.classes.{layer_class.name}.sequence"
        unwritten = f"layers.classes.{layer_class.name}"  # above the table: no sequence key to put it after
        if UNMATCHED_OP in commonest:
            comments[unwritten] = "no sequence: its layers launch a kernel no op of the ledger claims"
            out.append(layer_class)
            continue
        entries = []
        for op in commonest:
            if entries and entries[-1].op == op:
                entries[-1] = dataclasses.replace(entries[-1], low=entries[-1].low + 1, high=entries[-1].high + 1)
            else:
                entries.append(SequenceEntry(op=op, fills=(op,)))
        total = sum(seen.values())
        if times != total:
            # a sequence is a claim about every layer of the class: learned only when all agree
            comments[unwritten] = (f"no sequence: the commonest one is launched by {times} of {total} layer-steps, "
                             f"{len(seen)} different ones in all")
            out.append(layer_class)
            continue
        comments[key] = f"all {total} layer-steps of the class launch exactly this sequence"
        out.append(dataclasses.replace(layer_class, sequence=tuple(entries)))
    return tuple(out), comments


def learned_params(provisional: Expectations, classes: tuple[LayerClass, ...], options: LearnOptions
                   ) -> tuple[dict[str, float], dict[str, str]]:
    """The base ledger's parameters, `layers` as observed, the names given with --params."""
    params = dict(provisional.params)
    comments = {}
    observed_layers = len({layer for c in classes for layer in c.layers})
    if observed_layers:
        if params.get("layers") not in (None, observed_layers):
            comments["params.layers"] = f"observed {observed_layers} layers (the base ledger said {params['layers']:g})"
        else:
            comments["params.layers"] = f"observed {observed_layers} layers"
        params["layers"] = observed_layers
    for name, value in options.named_params.items():
        params[name] = value
        comments[f"params.{name}"] = "named with --params"
    return params, comments
