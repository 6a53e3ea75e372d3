"""Give every GPU activity its decoder layer and sub-module, and say how it was found.

Three sources, tried in this order for each activity (the `how` column):

* ``capture_nvtx`` (CUDA-graph kernels): the layer-wise NVTX ranges that were open when the
  kernel's graph node was captured (`graph_capture.capture_origins`). Under CUDA graphs this is
  the only place the ranges exist: nsys and its peers stop at the range around
  `cudaGraphLaunch`.
* ``replay_nvtx``: the ranges enclosing the launching call at run time (an eager launch, or
  the `cudaGraphLaunch` of a replay), nsys's own projection.
* ``inferred``: no layer range in the whole step. The kernel sequence of the step is cut into
  layers from what the ledger knows (`infer_layers`): the op that runs once per layer, the
  opening op, the layer classes' sizes.

Everything else is ``none`` (embedding, final norm, LM head, sampling: outside the layers).

A range names a layer when the expectations' layer regex (one group: the index) matches its
text; the dotted module path after the match (``self_attn.indexer.wq_b``) gives the
sub-module, which the expectations map to ledger groups ([layers.modules]).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from nsys_ledger.attribution.graph_capture import NO_CAPTURE_CALL, RESOLVED, capture_origins
from nsys_ledger.attribution.nvtx_projection import innermost_range_ids, projectable_ranges
from nsys_ledger.attribution.sequence import EDIT_SCHEMA, place_ops
from nsys_ledger.frames import left_join_keys, packed_key
from nsys_ledger.ledger.model import Expectations, LayerRule
from nsys_ledger.trace.model import Trace

# SGLang's --enable-layerwise-nvtx-marker text ({'Module': 'model.model.layers.12.self_attn',
# ...}), plain `layers.12` / `layers_12` / `layer_12` names, and the PyTorch profiler's module
# ranges (`with_modules=True`: `nn.Module: Qwen3DecoderLayer_12`, `nn.Module: Block_3`).
DEFAULT_LAYER_REGEX = (
    r"""(?:'Module': 'model\.model\.layers\.|\blayers[._]|\blayer_|nn\.Module: \w*(?:DecoderLayer|Block)_)(\d+)"""
)

REPLAY_NVTX = "replay_nvtx"
CAPTURE_NVTX = "capture_nvtx"
INFERRED = "inferred"
NO_LAYER = "none"
HOW = (REPLAY_NVTX, CAPTURE_NVTX, INFERRED, NO_LAYER)

INFERRED_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "segments": pl.Int64,  # layers the step was cut into
    "repaired_after": pl.Int64,  # one boundary lost or gained: layers after this segment numbered from the end
    "cut_by": pl.Utf8,  # CUT_BY_ANCHOR or CUT_BY_OPENING: which rule placed the boundaries
    "confidence": pl.Utf8,  # one of CONFIDENCE
}
# How a step's boundaries were placed: around the op that runs once per layer, or at the
# opening op followed by `opening_followed_by`.
CUT_BY_ANCHOR = "anchor"
CUT_BY_OPENING = "opening"
# exact: as many layers as the model has; repaired: one boundary lost or gained, the layers
# after the odd segment numbered from the end; partial: only the layers before the first and
# after the last segment of an unexpected size got a layer.
CONFIDENCE = ("exact", "repaired", "partial")

LAYER_COLUMNS = {
    "layer": pl.Int64,  # null outside the layers
    "submodule": pl.Utf8,  # innermost sub-module named in [layers.modules], e.g. "indexer"
    "layer_group": pl.Utf8,  # the ledger group the activity counts in inside its layer
    "how": pl.Utf8,  # one of HOW
    "capture_time": pl.Int64,  # graph kernels: when their node was captured (their issue order)
}


@dataclass(frozen=True)
class LayerAttribution:
    regex: str
    activities: pl.DataFrame  # the input activities, same rows in the same order, + LAYER_COLUMNS
    capture: pl.DataFrame  # capture origin of every graph node id seen (graph_capture.ORIGIN_SCHEMA)
    inferred: pl.DataFrame  # INFERRED_SCHEMA: the steps whose layers were inferred
    notes: tuple[str, ...]
    edits: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=EDIT_SCHEMA))  # sequence.EDIT_SCHEMA: how layers differ from their sequence


def attribute_layers(
    trace: Trace,
    activities: pl.DataFrame,
    expectations: Expectations | None,
) -> LayerAttribution:
    """Layer, sub-module, group and `how` for every activity of `activities`.

    `activities` are `Steps.activities`: GPU activities with their launching call
    (`api_start, api_end, api_tid`), `op`, `group`, and `rank, step, decode`. The result keeps
    them row for row (the joins keep the left order), so no stage joins back on a row id.
    """
    regex = (expectations.layer_regex if expectations else None) or DEFAULT_LAYER_REGEX
    rule = expectations.layer_rule if expectations else LayerRule()
    ranges = layer_ranges(trace.nvtx, regex, tuple(rule.modules))

    capture = capture_origins(activities, trace.graph_nodes, trace.api_calls)
    replay = _replay_layers(activities, ranges)
    at_capture = _capture_layers(capture, ranges, activities)
    from_capture = at_capture["capture_layer"].is_not_null()
    how = (
        pl.when(from_capture).then(pl.lit(CAPTURE_NVTX))
        .when(replay["replay_layer"].is_not_null()).then(pl.lit(REPLAY_NVTX))
        .otherwise(pl.lit(NO_LAYER))
    )
    attributed = activities.with_columns(
        pl.when(from_capture).then(at_capture["capture_layer"]).otherwise(replay["replay_layer"]).alias("layer"),
        pl.when(from_capture).then(at_capture["capture_submodule"]).otherwise(replay["replay_submodule"])
        .alias("submodule"),
        how.alias("how"),
        at_capture["capture_time"].alias("capture_time"),
    )
    inferred_steps = pl.DataFrame(schema=INFERRED_SCHEMA)
    notes: list[str] = []
    if expectations is not None and expectations.layer_opening_op:
        attributed, inferred_steps, notes = _infer_where_missing(attributed, expectations)
    edits = pl.DataFrame(schema=EDIT_SCHEMA)
    if expectations is not None and any(c.sequence for c in expectations.layer_classes):
        attributed, edits = _place_by_sequence(attributed, expectations)
    attributed = attributed.with_columns(layer_group(rule).alias("layer_group")).with_columns(
        pl.col(name).cast(dtype) for name, dtype in LAYER_COLUMNS.items()
    )
    return LayerAttribution(
        regex=regex,
        activities=attributed,
        capture=capture,
        inferred=inferred_steps.select(list(INFERRED_SCHEMA)).cast(INFERRED_SCHEMA),
        notes=tuple(notes),
        edits=edits,
    )


def _place_by_sequence(activities: pl.DataFrame, expectations: Expectations) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Each decode kernel of a layer whose class declares a sequence gets the op of the place
    it fills (attribution.sequence), and its group with it; kernels that fill no place keep
    their op. Returns the activities and the layers' edits (sequence.EDIT_SCHEMA)."""
    kernels = (  # lazy: only the columns read are filtered and sorted, not every column
        activities.lazy().with_row_index("_position")
        .filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel") & pl.col("layer").is_not_null())
        .select("_position", "rank", "step", "layer", "stream", "name", "op",
                pl.coalesce("api_start", "start").alias("_launched"), "capture_time", "start")
        .collect()
    )
    # by layer on one packed Int64 (frames.packed_key: the same order as the three columns)
    layer_key = packed_key(kernels, ["rank", "step", "layer"])
    by_layer = [layer_key] if layer_key is not None else ["rank", "step", "layer"]
    in_layers = (
        kernels.sort(*by_layer, "_launched", "capture_time", "start", nulls_last=True, maintain_order=True)
        .select("_position", "rank", "step", "layer", "stream", "name", "op")
    )
    placed, edits = place_ops(in_layers, expectations)
    if placed.height == 0:
        return activities, edits
    group_of = {name: op.group for name, op in expectations.ops.items()}
    positions = placed["_position"].cast(pl.Int64)
    groups = placed["placed_op"].replace_strict(group_of, default=None, return_dtype=pl.Utf8)
    return activities.with_columns(
        activities["op"].scatter(positions, placed["placed_op"]).alias("op"),
        activities["group"].scatter(positions, groups).alias("group"),
    ), edits


# ---- NVTX ---------------------------------------------------------------------------------


def layer_ranges(nvtx: pl.DataFrame, regex: str, submodules: tuple[str, ...] = ()) -> pl.DataFrame:
    """The projectable ranges whose text names a layer, with `layer` and `submodule`.

    The regex runs once per distinct text. The sub-module is the innermost of `submodules`
    in the dotted path right after the match (`12.self_attn.indexer.wq_b` -> `indexer`).
    """
    ranges = projectable_ranges(nvtx)
    texts = ranges.select(pl.col("name").unique()).drop_nulls()
    path = pl.col("name").str.extract(rf"(?:{regex})\.?([A-Za-z0-9_.]*)", 2)
    named = texts.with_columns(
        pl.col("name").str.extract(regex, 1).cast(pl.Int64, strict=False).alias("layer"),
        path.str.split(".")
        .list.eval(pl.element().filter(pl.element().is_in(list(submodules))))
        .list.last()
        .alias("submodule"),
    ).filter(pl.col("layer").is_not_null())
    return ranges.join(named, on="name", how="inner")


def _replay_layers(activities: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """`replay_layer, replay_submodule` row for row with `activities`: the innermost layer
    range around each launching call."""
    if ranges.height == 0:
        return pl.DataFrame({"replay_layer": pl.Series([None] * activities.height, dtype=pl.Int64),
                             "replay_submodule": pl.Series([None] * activities.height, dtype=pl.Utf8)})
    launch = ["api_tid", "api_start", "api_end"]
    graph_rows = int(activities["graph_node_id"].is_not_null().sum())
    if graph_rows * 2 < activities.height:
        # eager: about one call per activity, so each row is its own probe, found in place
        probes = activities.select(launch).with_row_index("call")
        found = innermost_range_ids(probes, ranges, thread_col="api_tid", start_col="api_start", end_col="api_end")
        layer, submodule = _layer_of(found, ranges, activities.height)
    else:
        # graph replays: a few launches fan out to millions of kernels, so project each launch once
        call_key = packed_key(activities, ["pid", "correlation"], nulls_never_match=True)
        if call_key is None:
            calls = activities.select("pid", "correlation", *launch).unique(subset=["pid", "correlation"])
        else:  # deduplicated on one packed Int64 (see frames.left_join_keys); rows with a null key match nothing below
            calls = (activities.select("pid", "correlation", *launch, call_key.alias("_call"))
                     .unique(subset="_call").drop("_call"))
        found = innermost_range_ids(calls.with_row_index("call"), ranges, thread_col="api_tid",
                                    start_col="api_start", end_col="api_end")
        per_call = calls.select("pid", "correlation").with_columns(*_layer_of(found, ranges, calls.height))
        matched = left_join_keys(activities, per_call, ["pid", "correlation"])
        layer, submodule = matched["layer"], matched["submodule"]
    return pl.DataFrame([layer.alias("replay_layer"), submodule.alias("replay_submodule")])


def _capture_layers(capture: pl.DataFrame, ranges: pl.DataFrame, activities: pl.DataFrame) -> pl.DataFrame:
    """`capture_layer, capture_submodule, capture_time` row for row with `activities`: the
    innermost layer range open on the capturing thread when each graph node was captured."""
    usable = capture.filter(pl.col("status").is_in([RESOLVED, NO_CAPTURE_CALL]))
    found = innermost_range_ids(usable.with_row_index("call"), ranges, thread_col="capture_tid",
                                start_col="capture_call_start", end_col="capture_call_end")
    layer, submodule = _layer_of(found, ranges, usable.height)
    per_node = usable.select(
        "pid", "graph_node_id", layer.alias("capture_layer"), submodule.alias("capture_submodule"), "capture_time",
    )
    return left_join_keys(activities, per_node, ["pid", "graph_node_id"]).drop("pid", "graph_node_id")



def _layer_of(found: pl.DataFrame, ranges: pl.DataFrame, calls: int) -> tuple[pl.Series, pl.Series]:
    """`layer, submodule` per call id 0..calls-1 (null where no range was found), by gathers
    through range_id-indexed arrays rather than joins on a million rows."""
    size = int(ranges["range_id"].max()) + 1 if ranges.height else 0
    by_range = [
        pl.Series([None] * size, dtype=dtype).scatter(ranges["range_id"], ranges[column])
        for column, dtype in (("layer", pl.Int64), ("submodule", pl.Utf8))
    ]
    layer, submodule = (pl.Series(column, [None] * calls, dtype=series.dtype) for column, series in
                        zip(("layer", "submodule"), by_range))
    if found.height:
        layer = layer.scatter(found["call"], by_range[0].gather(found["range_id"]))
        submodule = submodule.scatter(found["call"], by_range[1].gather(found["range_id"]))
    return layer.alias("layer"), submodule.alias("submodule")


def layer_group(rule: LayerRule) -> pl.Expr:
    """The ledger group an activity counts in inside its layer.

    A sub-module named in [layers.modules] decides among its groups: the op's own group when
    it is one of them (DeepEP dispatch under `mlp.experts` stays `deepep`), else the
    sub-module's first group (a generic GEMM under `self_attn.indexer` counts as `indexer`).
    Without a sub-module the op's group stands.
    """
    expr = pl.col("group")
    for submodule, groups in rule.modules.items():
        keep = pl.col("group").is_in(list(groups))
        expr = pl.when((pl.col("submodule") == submodule) & ~keep.fill_null(False)).then(pl.lit(groups[0])).otherwise(expr)
    return expr


# ---- inference ----------------------------------------------------------------------------


def _infer_where_missing(
    activities: pl.DataFrame, expectations: Expectations
) -> tuple[pl.DataFrame, pl.DataFrame, list[str]]:
    """Infer layers in the decode steps where no kernel got one from NVTX."""
    decode_kernels = pl.col("decode").fill_null(False) & pl.col("op").is_not_null()
    without_nvtx = (  # lazy: only the four columns read are filtered, not every column
        activities.lazy()
        .filter(decode_kernels)
        .group_by("rank", "step")
        .agg(pl.col("layer").is_not_null().any().alias("_named"))
        .filter(~pl.col("_named"))
        .select("rank", "step")
        .collect()
    )
    if without_nvtx.height == 0:
        return activities, pl.DataFrame(schema=INFERRED_SCHEMA), []
    candidates = (
        activities.with_row_index("_position")
        .filter(decode_kernels)
        .join(without_nvtx, on=["rank", "step"], how="semi")
    )
    inferred, per_step = infer_layers(candidates, expectations)
    # write the inferred layers in place: a scatter by position, not a join on a million rows
    found = inferred.filter(pl.col("layer").is_not_null())
    positions = found["_position"].cast(pl.Int64)
    merged = activities.with_columns(
        activities["layer"].scatter(positions, found["layer"]).alias("layer"),
        activities["how"].scatter(positions, pl.Series([INFERRED] * found.height, dtype=pl.Utf8)).alias("how"),
    )
    return merged, per_step, inference_notes(per_step, expectations)


def infer_layers(kernels: pl.DataFrame, expectations: Expectations) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Cut each step's kernel sequence into layers: `_position, layer` and INFERRED_SCHEMA.

    `kernels` carry `_position` (their index in the caller's frame), `rank, step, stream, op`,
    `api_start, capture_time, start`.

    Kernels are taken in issue order (launch time; graph kernels by the capture time of their
    node). On the step's main stream (the one running the opening op) two rules place the
    boundaries, and per step the first that yields as many layers as the model has wins (else
    the one closest to it):

    * around the anchor: the op the ledger expects once per layer (`sparse_mla` = layers). A
      layer opens at the last opening-op kernel before its anchor (the input norm comes after
      the previous layer's post-attention norm); layer 0 at the first kernel of either opening
      op (a plain or a fused norm); after the last anchor, the last norm of either kind ends
      the layers when there are two (post-attention and final norm). It needs no projection
      to be recognised, so a GEMM whose shape is not in its name does not break it.
    * at the opening op followed by `opening_followed_by` before the next opening kernel (the
      input norm, not the post-attention or q/kv norms); the step's last `closing_op` kernel
      after the last opening ends the layers.

    Kernels of other streams belong to the layer open on the main stream at their issue
    position. A step cut into one layer too many or too few is repaired at the segment whose
    size is furthest from what the layer classes expect; one further off keeps only the layers
    it can place (`confidence` partial).
    """
    rule = expectations.layer_rule
    n_layers = int(expectations.params.get("layers", 0)) or None
    opening_ops = [op for op in (expectations.layer_opening_op, rule.first_opening_op) if op]
    key = ["rank", "step"]
    # issue order within each step: the launch time, then the capture time for the kernels of
    # one graph replay (positions are numbered per step, so other steps may interleave)
    ordered = (
        kernels.with_columns(pl.coalesce("api_start", "start").alias("_launched"))
        .sort("rank", "_launched", "capture_time", nulls_last=True)
        .with_columns(pl.int_range(pl.len()).over(key).cast(pl.Int64).alias("position"))
    )
    main_stream = (
        ordered.group_by(*key, "stream")
        .agg(pl.col("op").is_in(opening_ops).sum().alias("_openers"), pl.len().alias("_n"))
        .sort("_openers", "_n", "stream", descending=[True, True, False])
        .unique(subset=key, keep="first")
        .select(*key, pl.col("stream").alias("_main"))
    )
    main = ordered.join(main_stream, on=key, how="inner").filter(pl.col("stream") == pl.col("_main"))
    main = main.sort(*key, "position")

    cuts = []
    anchor = per_layer_anchor(expectations)
    if anchor is not None:
        cuts.append((CUT_BY_ANCHOR, *_anchor_cut(main, anchor, expectations.layer_opening_op, opening_ops,
                                                 rule.closing_op)))
    cuts.append((CUT_BY_OPENING, *_opening_cut(main, rule, opening_ops)))
    boundaries, closing, chosen = _choose_cut(cuts, n_layers)

    placed = ordered.select("_position", *key, "position").sort("position").join_asof(
        boundaries.sort("position"), on="position", by=key, strategy="backward", check_sortedness=False
    )
    placed = placed.join(closing, on=key, how="left").with_columns(
        pl.when(pl.col("position") >= pl.col("_closing").fill_null(2**62)).then(None)
        .otherwise(pl.col("segment")).alias("segment")
    )
    numbered, per_step = _number_segments(placed, n_layers, _expected_layer_sizes(expectations))
    per_step = per_step.join(chosen, on=key, how="left")
    return numbered.select("_position", "layer"), per_step


def per_layer_anchor(expectations: Expectations) -> str | None:
    """The op the ledger expects exactly once per layer per step (GLM-5.3: `sparse_mla` =
    layers), other than the opening ops; None when the ledger has none."""
    n_layers = expectations.params.get("layers")
    if not n_layers:
        return None
    openers = {expectations.layer_opening_op, expectations.layer_rule.first_opening_op}
    for anchor in expectations.anchors:
        if anchor.expected.low == anchor.expected.high == n_layers and anchor.op not in openers:
            return anchor.op
    return None


def _anchor_cut(main: pl.DataFrame, anchor: str, opening_op: str | None,
                opening_ops: list[str], closing_op: str | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Boundaries around the once-per-layer anchor (see infer_layers): `rank, step, position,
    segment` and the closing position `rank, step, _closing`. The norms after the last anchor
    are those of the opening ops and the closing op (vLLM: the post-attention norm of a MoE
    layer and the final norm are unfused `fused_add_rms_norm` kernels, the opening input norm a
    fused norm + quant)."""
    key = ["rank", "step"]
    either = pl.col("op").is_in(opening_ops)
    counted = main.with_columns(
        (pl.col("op") == anchor).cum_sum().over(key).alias("_anchors_before"),
        (pl.col("op") == anchor).sum().over(key).alias("_anchors"),
    )
    first = counted.filter(either & (pl.col("_anchors_before") == 0) & (pl.col("_anchors") > 0)).group_by(key).agg(
        pl.col("position").min()
    )
    between = counted.filter(
        (pl.col("op") == opening_op) & (pl.col("_anchors_before") >= 1) & (pl.col("_anchors_before") < pl.col("_anchors"))
    ).group_by(*key, "_anchors_before").agg(pl.col("position").max()).drop("_anchors_before")
    boundaries = _numbered_boundaries(pl.concat([first, between], how="vertical_relaxed"))
    norm = either | (pl.col("op") == closing_op) if closing_op else either
    after_last = counted.filter(norm & (pl.col("_anchors_before") == pl.col("_anchors")) & (pl.col("_anchors") > 0))
    closing = after_last.group_by(key).agg(pl.len().alias("_norms"), pl.col("position").max().alias("_closing")).filter(
        pl.col("_norms") >= 2  # the last layer's post-attention norm, then the final norm
    ).select(*key, "_closing")
    return boundaries, closing.cast({"_closing": pl.Int64})


def _opening_cut(main: pl.DataFrame, rule: LayerRule, opening_ops: list[str]) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Boundaries at the opening op followed by `opening_followed_by` (see infer_layers)."""
    opens = main.with_columns(_opens_layer(rule, opening_ops).alias("_opens"))
    boundaries = _numbered_boundaries(opens.filter(pl.col("_opens")).select("rank", "step", "position"))
    return boundaries, _closing_positions(opens, boundaries, rule.closing_op)


def _numbered_boundaries(openings: pl.DataFrame) -> pl.DataFrame:
    key = ["rank", "step"]
    return openings.select(*key, pl.col("position").cast(pl.Int64)).sort(*key, "position").with_columns(
        pl.int_range(pl.len()).over(key).cast(pl.Int64).alias("segment")
    )


def _choose_cut(
    cuts: list[tuple[str, pl.DataFrame, pl.DataFrame]], n_layers: int | None
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Per step, the first cut that yields `n_layers` segments, else the one closest to it:
    its boundaries, its closing positions, and `rank, step, cut_by`."""
    key = ["rank", "step"]
    counts = pl.concat([
        boundaries.group_by(key).agg(pl.len().alias("_segments")).with_columns(
            pl.lit(name).alias("cut_by"), pl.lit(order).alias("_order"))
        for order, (name, boundaries, _) in enumerate(cuts)
    ], how="vertical_relaxed")
    off = (pl.col("_segments") - n_layers).abs() if n_layers else pl.lit(0)
    chosen = counts.with_columns(off.alias("_off")).sort("_off", "_order").unique(subset=key, keep="first").select(
        *key, "cut_by"
    )
    picked = [
        (boundaries.join(chosen.filter(pl.col("cut_by") == name), on=key, how="semi"),
         closing.join(chosen.filter(pl.col("cut_by") == name), on=key, how="semi"))
        for name, boundaries, closing in cuts
    ]
    return (pl.concat([b for b, _ in picked], how="vertical_relaxed"),
            pl.concat([c for _, c in picked], how="vertical_relaxed"), chosen)


def _opens_layer(rule: LayerRule, opening_ops: list[str]) -> pl.Expr:
    """On the main stream in issue order: does this kernel open a layer?"""
    key = ["rank", "step"]
    is_opener = pl.col("op").is_in(opening_ops)
    if not rule.opening_followed_by:
        return is_opener
    def next_position(condition: pl.Expr) -> pl.Expr:
        # the position of the next row (strictly after this one) where `condition` holds
        return pl.when(condition).then(pl.col("position")).shift(-1).backward_fill().over(key)
    next_opener = next_position(is_opener)
    next_follower = next_position(pl.col("op") == rule.opening_followed_by)
    return is_opener & next_follower.is_not_null() & (next_opener.is_null() | (next_follower < next_opener))


def _closing_positions(main: pl.DataFrame, boundaries: pl.DataFrame, closing_op: str | None) -> pl.DataFrame:
    """`rank, step, _closing`: position of the step's last closing-op kernel after its last opening."""
    key = ["rank", "step"]
    if not closing_op:
        return pl.DataFrame(schema={"rank": pl.Int64, "step": pl.Int64, "_closing": pl.Int64})
    last_opening = boundaries.group_by(key).agg(pl.col("position").max().alias("_last_open"))
    last_closing = main.filter(pl.col("op") == closing_op).group_by(key).agg(pl.col("position").max().alias("_closing"))
    return last_closing.join(last_opening, on=key, how="inner").filter(
        pl.col("_closing") > pl.col("_last_open")
    ).select(*key, "_closing")


def _expected_layer_sizes(expectations: Expectations) -> pl.DataFrame:
    """`layer, expected`: kernels the layer classes expect in each layer (range midpoints)."""
    sizes: dict[int, float] = {}
    for layer_class in expectations.layer_classes:
        middle = sum(((r.low or 0) + (r.high if r.high is not None else (r.low or 0))) / 2
                     for r in layer_class.groups.values())
        for layer in layer_class.layers:
            sizes[layer] = sizes.get(layer, 0.0) + middle
    return pl.DataFrame(
        {"layer": list(sizes), "expected": list(sizes.values())},
        schema={"layer": pl.Int64, "expected": pl.Float64},
    )


# A segment is "of an unexpected size" when it is off its class's expected size by more than
# this share (or by more than MIN_SIZE_SLACK kernels): a merged or a split layer, not an extra
# quantization kernel.
SIZE_SLACK = 0.25
MIN_SIZE_SLACK = 3


def _number_segments(
    placed: pl.DataFrame, n_layers: int | None, expected: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Segment index -> layer index, repairing steps with too many or too few segments.

    One segment more or fewer than `n_layers`: the boundary was gained or lost at the segment
    furthest from its expected size; the segments after it are numbered from the end. Further
    off: the segments before the first and after the last segment of an unexpected size are
    numbered from the start and from the end, the ones between get no layer."""
    key = ["rank", "step"]
    sizes = placed.filter(pl.col("segment").is_not_null()).group_by(*key, "segment").agg(pl.len().alias("_size"))
    per_step = sizes.group_by(key).agg(pl.len().cast(pl.Int64).alias("segments")).sort(key)
    if n_layers is None:
        return placed.with_columns(pl.col("segment").alias("layer")), per_step.with_columns(
            pl.lit(None, pl.Int64).alias("repaired_after"), pl.lit("exact").alias("confidence")
        )
    typical = expected if expected.height else sizes.select(
        pl.lit(None, pl.Int64).alias("layer"), pl.col("_size").median().alias("expected")
    )
    deviation = (
        sizes.join(per_step, on=key)
        .filter(pl.col("segments") != n_layers)
        .join(typical.rename({"layer": "segment"}), on="segment", how="left")
        .with_columns(pl.col("expected").fill_null(typical["expected"].median()))
        .with_columns((pl.col("_size") - pl.col("expected")).abs().alias("_off"))
    )
    # where the boundary was lost or gained: the segment furthest from its expected size
    repair = deviation.filter((pl.col("segments") - n_layers).abs() == 1).sort(
        "_off", "segment", descending=[True, False]
    ).unique(subset=key, keep="first").select(
        *key, pl.col("segment").alias("_anomaly"), (n_layers - pl.col("segments")).alias("_shift")
    )
    # further off: keep the segments before the first one of an unexpected size (read from the
    # start) and after the last one (read from the end, where segment s is layer s + shift)
    partial = _partial_bounds(deviation.filter((pl.col("segments") - n_layers).abs() > 1), typical, n_layers)
    numbered = placed.join(repair, on=key, how="left").join(partial, on=key, how="left").with_columns(
        pl.when(pl.col("_anomaly").is_not_null() & (pl.col("segment") > pl.col("_anomaly")))
        .then(pl.col("segment") + pl.col("_shift"))
        .when(pl.col("_first_odd").is_not_null() & (pl.col("segment") > pl.col("_last_odd")))
        .then(pl.col("segment") + pl.col("_tail_shift"))
        .when(pl.col("_first_odd").is_not_null() & (pl.col("segment") >= pl.col("_first_odd")))
        .then(None)
        .otherwise(pl.col("segment"))
        .alias("layer")
    ).with_columns(
        pl.when((pl.col("layer") >= 0) & (pl.col("layer") < n_layers)).then(pl.col("layer")).alias("layer")
    )
    confidence = (
        pl.when(pl.col("segments") == n_layers).then(pl.lit("exact"))
        .when(pl.col("repaired_after").is_not_null()).then(pl.lit("repaired"))
        .otherwise(pl.lit("partial"))
    )
    per_step = per_step.join(repair, on=key, how="left").rename({"_anomaly": "repaired_after"}).drop("_shift")
    return numbered, per_step.with_columns(confidence.alias("confidence"))


def _partial_bounds(deviation: pl.DataFrame, typical: pl.DataFrame, n_layers: int) -> pl.DataFrame:
    """`rank, step, _first_odd, _last_odd, _tail_shift` for steps cut far from `n_layers`."""
    key = ["rank", "step"]
    median = typical["expected"].median()
    tail = deviation.with_columns((pl.col("segment") + n_layers - pl.col("segments")).alias("_tail_layer")).join(
        typical.select(pl.col("layer").alias("_tail_layer"), pl.col("expected").alias("_tail_expected")),
        on="_tail_layer", how="left",
    ).with_columns(pl.col("_tail_expected").fill_null(median))

    def odd(expected: str) -> pl.Expr:
        off = (pl.col("_size") - pl.col(expected)).abs()
        return off > pl.max_horizontal(pl.col(expected) * SIZE_SLACK, pl.lit(MIN_SIZE_SLACK))

    return tail.group_by(key).agg(
        pl.col("segment").filter(odd("expected")).min().fill_null(pl.col("segment").max() + 1).alias("_first_odd"),
        pl.col("segment").filter(odd("_tail_expected")).max().fill_null(-1).alias("_last_odd"),
        (n_layers - pl.col("segments").first()).alias("_tail_shift"),
    )


def inference_notes(per_step: pl.DataFrame, expectations: Expectations) -> list[str]:
    """One note per kind of repaired or partial step: cut into more or fewer layers than the model has."""
    n_layers = int(expectations.params.get("layers", 0)) or None
    if n_layers is None:
        return []
    notes = []
    off = per_step.filter(pl.col("segments") != n_layers)
    for (segments, after, confidence), group in off.group_by(
        "segments", "repaired_after", "confidence", maintain_order=True
    ):
        steps = ", ".join(str(s) for s in group["step"].head(8).to_list())
        cut = f"layer inference cut {group.height} step(s) ({steps}{', ...' if group.height > 8 else ''}) into " \
              f"{segments} layers instead of {n_layers}"
        if confidence == "repaired":
            notes.append(f"{cut}: the layers after layer {after} were numbered from the end")
        else:
            notes.append(f"{cut}: confidence partial, only the layers before the first and after the last segment "
                         "of an unexpected size got a layer")
    return notes


def inference_rule_text(expectations: Expectations) -> str:
    """The cutting rules in words, for reports."""
    rule = expectations.layer_rule
    anchor = per_layer_anchor(expectations)
    opening = expectations.layer_opening_op
    text = ""
    if anchor is not None:
        text = (f"each layer holds one {anchor} and opens at the last {opening} before it"
                + (f" (layer 0 at the first {opening} or {rule.first_opening_op})" if rule.first_opening_op else "")
                + "; else ")
    text += f"a layer opens at {opening}"
    if rule.first_opening_op:
        text += f" (or {rule.first_opening_op})"
    if rule.opening_followed_by:
        text += f" followed by {rule.opening_followed_by}"
    if rule.closing_op:
        text += f"; the last {rule.closing_op} ends the layers"
    return text
