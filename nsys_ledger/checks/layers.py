"""The per-layer ledger: kernels per layer and group against the layer classes' ranges.

Input are the decode kernels with their layer and group (attribution.layers). Two checks:

* range (``layers.classes.CLASS.groups.GROUP``): every layer of a class launches, per step,
  a count of its group's kernels inside the declared range; a group no class declares for a
  layer is expected to launch nothing there.
* uniform (``layers.uniform``): layers of the same classes run the same code, so within a step
  they launch the same count per group. A layer that differs from the majority of its peers is
  a finding even inside the range (the seed's ranges are wide; one stray kernel is not).

A finding names the layers, the group, observed against expected and the extra or missing op:
the layer's kernel sequence is compared with the commonest sequence of its peers
(`difflib`, once per distinct sequence, not per row); where no peer launches the expected count
the group's ops are listed with the op before each repeated one.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import dataclass, field

import polars as pl

from nsys_ledger.attribution.graph_capture import RESOLVED
from nsys_ledger.attribution.layers import HOW, NO_LAYER, LayerAttribution
from nsys_ledger.attribution.sequence import EDIT_SCHEMA, EXTRA
from nsys_ledger.checks.ledger import CheckOutcome, Finding, compact_ranges, describe_steps, short_kernel_name
from nsys_ledger.frames import group_agg, packed_key
from nsys_ledger.ledger.model import Expectations, LayerClass, Range

UNGROUPED = "ungrouped"  # kernels whose op has no group and no sub-module decides one
UNDECLARED_SOURCE = "layers.classes"
UNIFORM_SOURCE = "layers.uniform"
STEP_KEY = ["rank", "step"]
_SEPARATOR = "\x1f"  # between the items of a layer sequence
_RECORD = "\x1e"  # between an item's label and its group

HINT_HIGH = ("extra kernels inside the layer: a fusion broke, a stray copy or cast, or a kernel split "
             "into several launches")
HINT_LOW = "kernels missing from the layer: a fused kernel, a skipped branch, or nodes the capture dropped"
HINT_UNIFORM = "one layer runs different code than its peers: a stray op, a layer-specific fallback or a graph break"


@dataclass(frozen=True)
class LayerSummary:
    """Layers of the decode kernels: how they were found, counts per layer and group.

    Every frame carries `rank`, so summaries of several exports stack (multifile)."""

    regex: str  # the layer regex used on NVTX range names
    coverage: pl.DataFrame  # rank, how, kernels: decode kernels by how their layer was found
    counts: pl.DataFrame  # rank, step, layer, group, count (layer_figures)
    sequences: pl.DataFrame  # rank, step, layer, sequence_id: each layer's kernel sequence (layer_figures)
    sequence_texts: pl.DataFrame  # sequence_id, sequence: the distinct sequences spelled out
    inferred: pl.DataFrame  # rank, step, segments, repaired_after: steps whose layers were inferred
    unresolved_graph_nodes: pl.DataFrame  # rank, status, nodes, kernels: decode graph kernels without capture origin
    assignments: pl.DataFrame  # rank, step, row, layer, submodule, layer_group, how, capture_time: every GPU activity
    notes: tuple[str, ...] = ()
    # rank, step, layer, class_name, kind, label, position, after, entries: how layers differ
    # from their class's kernel sequence (attribution.sequence.EDIT_SCHEMA)
    edits: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=EDIT_SCHEMA))

    def kernels_by_how(self) -> dict[str, int]:
        """Decode kernels by how their layer was found, every key of attribution.layers.HOW."""
        totals = dict(self.coverage.group_by("how").agg(pl.col("kernels").sum()).iter_rows())
        return {how: int(totals.get(how, 0)) for how in HOW}

    @property
    def share_with_layer(self) -> float:
        """Share of decode kernels that got a layer (0 when there are none)."""
        by_how = self.kernels_by_how()
        total = sum(by_how.values())
        return (total - by_how[NO_LAYER]) / total if total else 0.0

    @property
    def inferred_steps(self) -> int:
        return self.inferred.height


def summarize_layers(attribution: LayerAttribution) -> LayerSummary:
    """Figures of the decode kernels from the per-activity attribution."""
    activities = attribution.activities
    # lazy, so that each figure gathers only the columns it reads: a filter copies every
    # column it keeps, and the decode kernels are nearly all of millions of rows
    kernels = activities.lazy().filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
    coverage = kernels.group_by("rank", "how").agg(pl.len().cast(pl.Int64).alias("kernels")).sort("rank", "how")
    unresolved_nodes = attribution.capture.filter(pl.col("status") != RESOLVED).select("pid", "graph_node_id", "status")
    unresolved = (
        kernels.filter(pl.col("graph_node_id").is_not_null())
        .join(unresolved_nodes.lazy(), on=["pid", "graph_node_id"], how="inner")
        .group_by("rank", "status")
        .agg(pl.col("graph_node_id").n_unique().cast(pl.Int64).alias("nodes"), pl.len().cast(pl.Int64).alias("kernels"))
        .sort("rank", "status")
    )
    coverage, unresolved = pl.collect_all([coverage, unresolved])
    counts, sequences, texts = layer_figures(kernels)
    return LayerSummary(
        regex=attribution.regex,
        coverage=coverage,
        counts=counts,
        sequences=sequences,
        sequence_texts=texts,
        inferred=attribution.inferred,
        unresolved_graph_nodes=unresolved,
        assignments=layer_assignments(attribution),
        notes=attribution.notes,
        edits=attribution.edits,
    )


def layer_assignments(attribution: LayerAttribution) -> pl.DataFrame:
    """The layer of every activity (LayerSummary.assignments) without the summary's figures."""
    return attribution.activities.select("rank", "step", "row", "layer", "submodule", "layer_group", "how",
                                         "capture_time")


def compact_layer_counts(counts: pl.DataFrame) -> pl.DataFrame:
    """Per-layer counts, compact: one row per (rank, groups signature, step set, layer set).

    Layers whose group counts are equal in the same steps share a row; a healthy trace
    collapses to a handful of rows (one per layer class) however many steps it has.
    Columns: `rank, layers (list), steps (list), groups (struct-like dict list), kernels`.
    """
    if counts.height == 0:
        return pl.DataFrame(schema={"rank": pl.Int64, "layers": pl.List(pl.Int64), "steps": pl.List(pl.Int64),
                                    "groups": pl.Utf8, "kernels": pl.Int64})
    signature = pl.concat_str(pl.col("group"), pl.lit("="), pl.col("count").cast(pl.Utf8)).sort().str.join(",")
    per_layer = group_agg(counts, [*STEP_KEY, "layer"], signature.alias("groups"), pl.col("count").sum().alias("kernels"))
    by_steps = per_layer.group_by("rank", "layer", "groups", "kernels").agg(pl.col("step").sort().alias("steps"))
    return (
        by_steps.with_columns(pl.col("steps").list.eval(pl.element().cast(pl.Utf8)).list.join(",").alias("_steps_key"))
        .group_by("rank", "groups", "kernels", "_steps_key")
        .agg(pl.col("layer").sort().alias("layers"), pl.col("steps").first())
        .with_columns(pl.col("layers").list.first().alias("_first"))
        .sort("rank", "_first", "_steps_key")
        .select("rank", "layers", "steps", "groups", "kernels")
    )


def layer_figures(kernels: pl.DataFrame | pl.LazyFrame) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Per (rank, step, layer), in one grouped pass over the kernels that have a layer:

    * counts `rank, step, layer, group, count` (`ungrouped` for kernels of no group);
    * sequences `rank, step, layer, sequence_id`: a hash of the layer's kernels in issue
      order, (op, group) each, so equal layers share an id without any string being built;
    * texts `sequence_id, sequence`: one layer per distinct id spelled out, items
      `label<RS>group` joined by <US> (ASCII record and unit separators), the label being the
      op name, or the bare kernel name for kernels no op matches.

    Issue order is the launch time (the GPU start for a kernel without a launch call), and for
    CUDA-graph kernels the capture time of their node (all kernels of one replay share the
    launch).
    """
    key = [*STEP_KEY, "layer"]
    order = ["_launched", "capture_time"]
    unmatched = pl.col("op").is_null() | (pl.col("op") == "other")
    in_layers = kernels.lazy().filter(pl.col("layer").is_not_null()).with_columns(
        pl.col("layer_group").fill_null(UNGROUPED), pl.coalesce("api_start", "start").alias("_launched"),
    )
    item = pl.struct(pl.col("op"), pl.when(unmatched).then(pl.col("name")), pl.col("layer_group")).hash()
    # one narrow row per kernel: the item hash stands for op, name and group, and the group is
    # categorical, whose integer code makes every key an integer (frames.group_agg)
    group = pl.col("layer_group").cast(pl.Categorical)
    layered = in_layers.select(*key, *order, item.alias("_item"), group.alias("group"),
                               group.to_physical().alias("_group")).collect()
    # one pass for both: each layer's sequence hash and its count of every group (by code)
    group_names = layered.group_by("_group").agg(pl.col("group").first().cast(pl.Utf8))
    codes = group_names["_group"].to_list()
    per_layer = _items_and_counts(layered, key, order, codes).with_columns(pl.col("_items").hash().alias("sequence_id"))
    del layered
    counts = (
        per_layer.unpivot(index=key, on=[f"_count{code}" for code in codes], variable_name="_code", value_name="count")
        .filter(pl.col("count") > 0)
        .join(group_names.select(pl.format("_count{}", "_group").alias("_code"), "group"), on="_code", how="left")
        .select(*key, "group", pl.col("count").cast(pl.Int64))
        .sort(*key, "group")
    )
    sequences = per_layer.select(*key, "sequence_id").sort(key)
    spelled = sequences.unique(subset="sequence_id", keep="first")
    examples = (
        in_layers.join(spelled.lazy(), on=key, how="inner")
        .select(*key, *order, "sequence_id", "op", "name", "layer_group").collect()
    )
    names = examples.filter(unmatched).select(pl.col("name").unique()).drop_nulls()
    bare = names.with_columns(pl.Series("_bare", [_bare_name(n) for n in names["name"]], dtype=pl.Utf8))
    label = pl.when(unmatched).then(pl.col("_bare")).otherwise(pl.col("op"))
    text_item = pl.concat_str(label.fill_null("?"), pl.lit(_RECORD), pl.col("layer_group"))
    texts = (
        examples.join(bare, on="name", how="left")
        .sort(*key, *order, nulls_last=True)
        .group_by("sequence_id", maintain_order=True)
        .agg(text_item.str.join(_SEPARATOR).alias("sequence"))
    )
    return counts, sequences, texts


def _items_and_counts(layered: pl.DataFrame, key: list[str], order: list[str], codes: list[int]) -> pl.DataFrame:
    """Per layer (`key`): `_items`, its kernels' item hashes in issue order (`order`), and
    `_count<code>`, its kernels of each group code.

    The rows are sorted once by the layer (packed into one Int64, frames.packed_key) and the
    issue order, so the group-by takes runs of rows; without ties in the issue order that is
    the order a sort within each layer gives (measured: 0.19 against 0.26 s for 1M kernels).
    With ties, or keys that do not pack, each layer's items are sorted on their own."""
    counts = [(pl.col("_group") == code).sum().alias(f"_count{code}") for code in codes]
    packed = packed_key(layered, key)
    if packed is not None:
        ordered = layered.with_columns(packed.alias("_layer")).sort("_layer", *order, nulls_last=True)
        tied = (pl.col("_layer") == pl.col("_layer").shift(1)) & pl.all_horizontal(
            pl.col(c).eq_missing(pl.col(c).shift(1)) for c in order)
        if not ordered.select(tied.any()).item():
            return (
                ordered.with_columns(pl.col("_layer").set_sorted())
                .group_by("_layer", maintain_order=True)
                .agg(*[pl.col(k).first() for k in key], pl.col("_item").alias("_items"), *counts)
                .drop("_layer")
            )
    return group_agg(layered, key, pl.col("_item").sort_by(order, nulls_last=True).alias("_items"), *counts)

def check_layers(expectations: Expectations, summary: LayerSummary, decode_steps: int) -> list[CheckOutcome]:
    """The per-layer outcomes for the decode steps where some kernel has a layer.

    `decode_steps` is the number of decode steps, for the message when no layer was found.
    """
    counts = summary.counts
    classes = expectations.layer_classes
    if not classes:
        return []
    checked_steps = counts.select(STEP_KEY).unique().sort(STEP_KEY)
    if checked_steps.height == 0:
        return [_no_layers_outcome(decode_steps)]
    expected = _expected_counts(expectations)
    class_set_of = expected.select("layer", "class_set").unique()
    sequences = _Sequences(summary.sequences, summary.sequence_texts, class_set_of)
    n_steps = checked_steps.height
    # a layer that differs from its class's sequence is reported once, by its edits; the
    # counts it shifts are not reported again per group
    edited = summary.edits.select(*STEP_KEY, "layer").unique()
    judged = _judged_counts(checked_steps, expected, counts, edited, class_set_of, expectations.layer_rule.uniform)

    outcomes: list[CheckOutcome] = []
    for layer_class in classes:
        if layer_class.sequence and layer_class.insert_before is None:
            outcomes.append(_sequence_outcome(layer_class, summary.edits, n_steps, set(expectations.ops)))
    range_failing = judged.range_failing
    for layer_class in classes:
        for group, expected_range in layer_class.groups.items():
            source = f"{layer_class.source}.groups.{group}"
            failing = range_failing.filter(pl.col("source") == source)
            findings = _range_findings(failing, expected_range, sequences, n_steps)
            outcomes.append(
                CheckOutcome(f"layers {layer_class.name}: {group} per layer", source, expected_range.describe(),
                             judged.observed(source), tuple(findings))
            )
    outcomes.append(
        CheckOutcome("layer kernels in undeclared groups", UNDECLARED_SOURCE, "0", judged.observed(UNDECLARED_SOURCE, "0"),
                     tuple(_range_findings(range_failing.filter(pl.col("source") == UNDECLARED_SOURCE),
                                           Range(0, 0), sequences, n_steps)))
    )
    if expectations.layer_rule.uniform:
        deviating = judged.deviating
        findings = _uniform_findings(deviating, sequences, n_steps)
        outcomes.append(
            CheckOutcome("layers launch like their peers", UNIFORM_SOURCE, "equal per group within a class",
                         f"{deviating.select('layer').n_unique()} layers differ" if deviating.height else "equal",
                         tuple(findings))
        )
    return outcomes


# ---- sequences ----------------------------------------------------------------------------

HINT_EXTRA = "a kernel the layer's sequence does not have: a broken fusion, a stray copy or cast, or a split launch"
HINT_MISSING = "a kernel of the layer's sequence did not run: a fused kernel, a skipped branch, or a node the capture dropped"


def _sequence_outcome(layer_class: LayerClass, edits: pl.DataFrame, n_steps: int, op_names: set[str]) -> CheckOutcome:
    """One finding per fault: the same edit (kind, kernel, position) in a set of layers and steps."""
    source = f"{layer_class.source}.sequence"
    mine = edits.filter(pl.col("class_name") == layer_class.name)
    findings = []
    keys = ("kind", "label", "position", "after", "entry_class", "entries")
    for (kind, label, position, after, entry_class, entries), rows in sorted(
        mine.group_by(*keys, maintain_order=True), key=lambda g: (g[1]["layer"].min(), g[0][2], g[0][0])
    ):
        layers = compact_ranges(rows["layer"].unique().sort().to_list())
        steps_text = describe_steps(rows.select(STEP_KEY).unique().sort(STEP_KEY))
        n_failing = rows.select(STEP_KEY).n_unique()
        shown = label if label in op_names else _bare_name(label)  # a kernel no op claims: its bare name
        # names in backticks, as the group findings quote them: code in Markdown and HTML
        where = f"after `{after}`" if after else "at the start of the layer"
        place = f"{entry_class} sequence entry {position} of {entries}"
        if kind == EXTRA:
            what = f"+ `{shown}` {where} (after {place})" if position else f"+ `{shown}` {where}"
        else:
            what = f"missing `{shown}` {where} ({place})"
        message = f"{_layers_word(layers)}: {what}, in {n_failing} of {n_steps} steps (steps {steps_text})"
        findings.append(Finding(
            check="layer_sequence", subject=shown, source=source, message=message, steps=steps_text,
            failing_steps=n_failing, observed=("+ " if kind == EXTRA else "- ") + shown,
            expected=f"the {layer_class.name} sequence", hint=HINT_EXTRA if kind == EXTRA else HINT_MISSING,
            layers=layers,
        ))
    n_layers = mine.select("layer").n_unique()
    observed = f"{n_layers} layers differ" if n_layers else "as declared"
    return CheckOutcome(f"layers {layer_class.name}: kernel sequence", source,
                        f"{len(layer_class.sequence)} entries", observed, tuple(findings))


# ---- expectations -------------------------------------------------------------------------


# Checked steps judged at once: every step is crossed with every declared (layer, group), ~1,500
# rows a step for GLM-5.3, so 5,000 steps at once held ~400 MiB (docs/performance.md)
STEPS_PER_JUDGEMENT = 256


@dataclass(frozen=True)
class _JudgedCounts:
    """The per-layer counts of every checked step against the ledger, kept small: the rows
    outside their range, the rows unlike their peers, and each source's lowest and highest count."""

    range_failing: pl.DataFrame
    deviating: pl.DataFrame
    spread: pl.DataFrame  # source, low, high

    def observed(self, source: str, empty: str = "-") -> str:
        row = self.spread.filter(pl.col("source") == source)
        if row.height == 0:
            return empty
        low, high = row["low"][0], row["high"][0]
        return f"{low}" if low == high else f"{low}-{high}"


def _judged_counts(checked_steps: pl.DataFrame, expected: pl.DataFrame, counts: pl.DataFrame, edited: pl.DataFrame,
                   class_set_of: pl.DataFrame, uniform: bool) -> _JudgedCounts:
    """Every checked step's count of every declared (layer, group) (0 where none ran) and of the
    undeclared ones it ran, judged STEPS_PER_JUDGEMENT steps at a time (a layer's peers are in
    its own step). The rows come out in the order one judgement of all steps gives: the
    declared rows of every step, then the undeclared ones."""
    failing: dict[bool, list[pl.DataFrame]] = {True: [], False: []}
    deviating: dict[bool, list[pl.DataFrame]] = {True: [], False: []}
    spreads = []
    for first in range(0, checked_steps.height, STEPS_PER_JUDGEMENT):
        steps = checked_steps.slice(first, STEPS_PER_JUDGEMENT)
        step_counts = counts.join(steps, on=STEP_KEY, how="semi", maintain_order="left")
        grid = (
            steps.join(expected, how="cross")
            .join(step_counts, on=[*STEP_KEY, "layer", "group"], how="left")
            .with_columns(pl.col("count").fill_null(0))
        )
        undeclared = (
            step_counts.join(expected.select("layer", "group"), on=["layer", "group"], how="anti")
            .join(class_set_of, on="layer", how="left")
            .with_columns(
                pl.lit(0.0).alias("low"), pl.lit(0.0).alias("high"), pl.lit(UNDECLARED_SOURCE).alias("source"),
                pl.lit(None, pl.Utf8).alias("class_name"), pl.col("class_set").fill_null("no class"),
            )
            .select(grid.columns)
        )
        table = pl.concat([grid, undeclared], how="vertical").join(edited, on=[*STEP_KEY, "layer"], how="anti")
        spreads.append(table.group_by("source").agg(pl.col("count").min().alias("low"),
                                                    pl.col("count").max().alias("high")))
        outside = table.filter(_outside_range())
        declared = pl.col("source") != UNDECLARED_SOURCE
        for is_declared in (True, False):
            failing[is_declared].append(outside.filter(declared == is_declared))
        if uniform:
            odd = _uniform_deviations(table, outside)
            for is_declared in (True, False):
                deviating[is_declared].append(odd.filter(declared == is_declared))
    spread = pl.concat(spreads).group_by("source").agg(pl.col("low").min(), pl.col("high").max())
    return _JudgedCounts(
        range_failing=pl.concat(failing[True] + failing[False], how="vertical"),
        deviating=pl.concat(deviating[True] + deviating[False], how="vertical") if uniform else pl.DataFrame(),
        spread=spread,
    )


def _expected_counts(expectations: Expectations) -> pl.DataFrame:
    """`layer, group, low, high, source, class_name, class_set` for every declared (layer, group)."""
    classes_of: dict[int, list[str]] = {}
    for layer_class in expectations.layer_classes:
        for layer in layer_class.layers:
            classes_of.setdefault(layer, []).append(layer_class.name)
    rows = []
    for layer_class in expectations.layer_classes:
        for group, expected_range in layer_class.groups.items():
            for layer in layer_class.layers:
                rows.append((layer, group, expected_range.low, expected_range.high,
                             f"{layer_class.source}.groups.{group}", layer_class.name, " + ".join(classes_of[layer])))
    return pl.DataFrame(
        rows, orient="row",
        schema={"layer": pl.Int64, "group": pl.Utf8, "low": pl.Float64, "high": pl.Float64, "source": pl.Utf8,
                "class_name": pl.Utf8, "class_set": pl.Utf8},
    )


def _outside_range() -> pl.Expr:
    return (pl.col("count") < pl.col("low").fill_null(float("-inf"))) | (
        pl.col("count") > pl.col("high").fill_null(float("inf"))
    )


# ---- kernel sequences of each layer -------------------------------------------------------


class _Sequences:
    """The issue-ordered kernel sequence of every (rank, step, layer) and each class set's
    commonest one, the reference a deviating layer is compared with."""

    def __init__(self, sequences: pl.DataFrame, texts: pl.DataFrame, class_set_of: pl.DataFrame):
        self.by_layer = sequences.join(class_set_of, on="layer", how="left")
        self.texts = dict(texts.unique(subset="sequence_id").iter_rows())
        commonest = (
            self.by_layer.group_by("class_set", "sequence_id").len()
            .sort("len", "sequence_id", descending=[True, False])
            .unique(subset="class_set", keep="first", maintain_order=True)
        )
        self.reference = {class_set: self.texts.get(seq) for class_set, seq in
                          commonest.select("class_set", "sequence_id").iter_rows()}
        self._cache: dict[tuple, str] = {}

    def of(self, rows: pl.DataFrame) -> pl.DataFrame:
        """`rows` + `sequence` (joined on rank, step, layer)."""
        with_ids = rows.join(self.by_layer.select(*STEP_KEY, "layer", "sequence_id"), on=[*STEP_KEY, "layer"],
                             how="left")
        texts = pl.DataFrame({"sequence_id": list(self.texts), "sequence": list(self.texts.values())},
                             schema={"sequence_id": pl.UInt64, "sequence": pl.Utf8})
        return with_ids.join(texts, on="sequence_id", how="left").drop("sequence_id")

    def describe(self, sequence: str | None, class_set: str, group: str, expected: Range | None) -> str:
        """What differs in `group` from the peers' sequence, or the group's ops when no peer
        launches an expected count."""
        key = (sequence, class_set, group, expected)
        if key not in self._cache:
            self._cache[key] = self._describe(sequence, class_set, group, expected)
        return self._cache[key]

    def _describe(self, sequence: str | None, class_set: str, group: str, expected: Range | None) -> str:
        observed = _items(sequence)
        reference = _items(self.reference.get(class_set))
        reference_count = sum(1 for _, g in reference if g == group)
        usable = reference and (expected is None or expected.contains(reference_count))
        if usable:
            text = _difference(reference, observed, group)
            if text:
                return text
        return _listing(observed, group)


def _bare_name(name: str | None) -> str:
    """`void at::native::elementwise_kernel<...>(...)` -> `elementwise_kernel`."""
    return short_kernel_name(name, 200).split("::")[-1]


def _items(sequence: str | None) -> list[tuple[str, str]]:
    if not sequence:
        return []
    return [tuple(item.split(_RECORD, 1)) for item in sequence.split(_SEPARATOR)]  # type: ignore[misc]


def _difference(reference: list[tuple[str, str]], observed: list[tuple[str, str]], group: str) -> str:
    """"one extra `elementwise_kernel` after `cublas_gemm`; `mla_combine` missing after ..."."""
    matcher = difflib.SequenceMatcher(a=reference, b=observed, autojunk=False)
    extra: Counter[tuple[str, str]] = Counter()
    missing: Counter[tuple[str, str]] = Counter()
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag in ("insert", "replace"):
            for j in range(j1, j2):
                if observed[j][1] == group:
                    extra[(observed[j][0], _before(observed, j))] += 1
        if tag in ("delete", "replace"):
            for i in range(i1, i2):
                if reference[i][1] == group:
                    missing[(reference[i][0], _before(reference, i))] += 1
    parts = [f"{_count_word(n)} extra `{label}` {where}" for (label, where), n in extra.items()]
    parts += [f"{_count_word(n)} missing `{label}` {where}" for (label, where), n in missing.items()]
    return "; ".join(parts)


def _before(items: list[tuple[str, str]], index: int) -> str:
    return f"after `{items[index - 1][0]}`" if index > 0 else "at the start of the layer"


def _listing(observed: list[tuple[str, str]], group: str) -> str:
    """`{group} ops: per_token_group_quant x3 (after fused_add_rmsnorm x2, moe_topk), ...`."""
    counts: Counter[str] = Counter()
    before: dict[str, Counter[str]] = {}
    for index, (label, item_group) in enumerate(observed):
        if item_group != group:
            continue
        counts[label] += 1
        before.setdefault(label, Counter())[observed[index - 1][0] if index else "start"] += 1
    if not counts:
        return f"no {group} kernel in the layer"
    parts = []
    for label, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if n == 1:
            parts.append(f"`{label}`")
            continue
        after = ", ".join(f"{prev}" + (f" x{k}" if k > 1 else "") for prev, k in before[label].most_common())
        parts.append(f"`{label}` x{n} (after {after})")
    return f"{group} ops: " + ", ".join(parts)


def _count_word(n: int) -> str:
    return "one" if n == 1 else str(n)


# ---- findings -----------------------------------------------------------------------------


def _described(rows: pl.DataFrame, sequences: _Sequences, expected: Range | None) -> pl.DataFrame:
    """`rows` (layers of one step and group) with their kernel sequence and its `description`
    against the peers (and `expected`, for a range finding)."""
    described = sequences.of(rows)
    descriptions = [
        sequences.describe(seq, class_set, group, expected)
        for seq, class_set, group in described.select("sequence", "class_set", "group").iter_rows()
    ]
    return described.with_columns(pl.Series("description", descriptions, dtype=pl.Utf8))


def _range_findings(failing: pl.DataFrame, expected: Range, sequences: _Sequences, n_steps: int) -> list[Finding]:
    if failing.height == 0:
        return []
    described = _described(failing, sequences, expected)
    findings = []
    groups = described.group_by("source", "group", "count", "description", maintain_order=True)
    for (source, group, count, description), rows in sorted(groups, key=lambda g: (g[1]["layer"].min(), g[0][2])):
        side = "too many" if count > (expected.high if expected.high is not None else float("inf")) else "too few"
        layers = compact_ranges(rows["layer"].to_list())
        steps_text = describe_steps(rows.select(STEP_KEY).unique().sort(STEP_KEY))
        n_failing = rows.select(STEP_KEY).n_unique()
        declared = source != UNDECLARED_SOURCE
        expected_text = expected.describe() if declared else f"0 (no class declares {group} for these layers)"
        what = f"{group} {count} launches per layer"
        if group == UNGROUPED:
            what, expected_text = f"{count} kernel(s) per layer matching no op of the ledger", "0"
        message = (
            f"{_layers_word(layers)}: {what}, expected {expected_text}, in {n_failing} of "
            f"{n_steps} steps (steps {steps_text}): {description}"
        )
        findings.append(Finding(
            check="layer", subject=group, source=source, message=message, steps=steps_text,
            failing_steps=n_failing, observed=str(count), expected=expected_text,
            hint=HINT_HIGH if side == "too many" else HINT_LOW, layers=layers,
        ))
    return findings


def _uniform_deviations(table: pl.DataFrame, range_failing: pl.DataFrame) -> pl.DataFrame:
    """(rank, step, layer, group) rows whose count differs from the count most of their peers
    (same class set, same step) launch; rows already outside their range are left to that check."""
    peers = ["rank", "step", "class_set", "group"]
    modal = (
        table.group_by(*peers, "count").agg(pl.len().alias("_with"))
        .with_columns(pl.col("_with").sum().over(peers).alias("_peers"))
        .sort("_with", "count", descending=[True, False])
        .unique(subset=peers, keep="first")
        .filter(pl.col("_with") * 2 > pl.col("_peers"))  # a strict majority, else nobody is odd
        .select(*peers, pl.col("count").alias("modal"), pl.col("_with").alias("agreeing"))
    )
    return (
        table.join(modal, on=peers, how="inner")
        .filter(pl.col("count") != pl.col("modal"))
        .join(range_failing.select(*STEP_KEY, "layer", "group"), on=[*STEP_KEY, "layer", "group"], how="anti")
    )


def _uniform_findings(deviating: pl.DataFrame, sequences: _Sequences, n_steps: int) -> list[Finding]:
    if deviating.height == 0:
        return []
    described = _described(deviating, sequences, None)
    findings = []
    keys = ("group", "class_set", "count", "modal", "description")
    for (group, class_set, count, modal, description), rows in sorted(
        described.group_by(*keys, maintain_order=True), key=lambda g: g[1]["layer"].min()
    ):
        layers = compact_ranges(rows["layer"].to_list())
        steps_text = describe_steps(rows.select(STEP_KEY).unique().sort(STEP_KEY))
        n_failing = rows.select(STEP_KEY).n_unique()
        peers = int(rows["agreeing"].min())
        declared = rows["source"][0]
        allowed = (
            f" (the ledger allows {_range_text(rows['low'][0], rows['high'][0])})" if declared != UNDECLARED_SOURCE else ""
        )
        message = (
            f"{_layers_word(layers)}: {group} {count} launches per layer, expected {modal} like the other {peers} "
            f"layers of class {class_set}{allowed}, in {n_failing} of {n_steps} steps (steps {steps_text}): {description}"
        )
        findings.append(Finding(
            check="layer_uniform", subject=group, source=UNIFORM_SOURCE, message=message, steps=steps_text,
            failing_steps=n_failing, observed=str(count), expected=str(modal), hint=HINT_UNIFORM, layers=layers,
        ))
    return findings


def _range_text(low: float | None, high: float | None) -> str:
    return Range(low, high).describe()


def _layers_word(layers: str) -> str:
    single = "," not in layers and "-" not in layers
    return f"layer {layers}" if single else f"layers {layers}"


def _no_layers_outcome(decode_steps: int) -> CheckOutcome:
    message = (
        f"no decode kernel could be given a layer in any of the {decode_steps} decode steps: the trace has no "
        "layer-wise NVTX ranges matching [layers] regex, and layer inference found neither the op that runs once "
        "per layer nor the opening op"
    )
    finding = Finding(
        check="layer", subject="layers", source="layers", message=message, steps="all", failing_steps=decode_steps,
        observed="no layers", expected="layers by NVTX or inference",
        hint="record with SGLang --enable-layerwise-nvtx-marker, or check [layers] opening_op in the expectations",
    )
    return CheckOutcome("decode kernels have layers", "layers", "layers found", "none", (finding,))
