"""Align each observed layer's kernels to its layer class's declared kernel sequence.

The ledger's per-layer table is an ordered list (``[layers.classes.NAME] sequence``). A kernel
name that several ops share (o_proj's and the replicated shared expert's down GEMM have the
same shape; the router, the absorption bmm and the LM head are all tile-named cuBLAS/nvjet
kernels) cannot be told apart by name, only by its place in the layer. So every layer's kernels,
in issue order, are aligned to the expected sequence by a small edit distance:

* a kernel may fill an entry when one of the entry's ops claims its name (any op whose pattern
  or GEMM shape matches, not only the first one in the ledger's order); it then counts as the
  entry's op, unless its own op is a specific one the entry names (`placed_op`);
* a GEMM that only generic (fallback) ops claim, whose name states no shape (B200 DeepGEMM
  spells `0u, 0u, 0u`; cuBLAS names state a tile), may fill the place of any op that declares
  GEMM shapes;
* an entry ``op a-b`` stands for `a` required and `b - a` optional places;
* a kernel that fills no entry is an extra kernel (cost 1), a required place nobody fills a
  missing kernel (cost 1); the alignment of least cost wins, ties go to filling places early.

A healthy layer aligns at cost 0. A layer that differs is described by its edits at positions
(``+ per_token_group_quant after o_proj``, ``missing rmsnorm after qkv_a_proj``): one edit per
fault, where counting kernels per group would report the same fault in every group it shifts.

The alignment runs once per distinct (expected sequence, observed name sequence): a healthy
step of 78 layers has a handful of distinct layers, so its cost does not grow with the steps.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.ops import UNMATCHED_OP, OpClassifier
from nsys_ledger.frames import packed_key
from nsys_ledger.ledger.model import Expectations, LayerClass, SequenceEntry

GENERIC_GEMM = "<a GEMM only a generic op claims>"  # a candidate token, never an op name
EXTRA = "extra"
MISSING = "missing"
EDIT_SCHEMA = {
    "rank": pl.Int64,
    "step": pl.Int64,
    "layer": pl.Int64,
    "class_name": pl.Utf8,  # the class whose whole sequence the layer follows
    "kind": pl.Utf8,  # EXTRA or MISSING
    "label": pl.Utf8,  # the op (or the bare kernel name of a kernel no op claims)
    "position": pl.Int64,  # 1-based in `entry_class`'s sequence: the missing entry, or the entry after which the extra kernel ran (0: the layer's start)
    "after": pl.Utf8,  # the op of the entry before (None at the start of the layer)
    "entry_class": pl.Utf8,  # the class whose sequence `position` counts in (an inserted class's own)
    "entries": pl.Int64,  # entries in `entry_class`'s sequence
}


@dataclass(frozen=True)
class Plan:
    """The expected sequence of one set of layers: the base class's entries with the inserted
    classes' entries in place."""

    class_name: str
    entries: tuple[SequenceEntry, ...]
    origin: tuple[tuple[str, int, int], ...]  # per entry: its class, 1-based index there, that class's length


def layer_plans(expectations: Expectations) -> dict[int, Plan]:
    """Layer -> its expected sequence, for the layers of a class that declares one."""
    classes = expectations.layer_classes
    plans: dict[int, Plan] = {}
    for base in classes:
        if not base.sequence or base.insert_before is not None:
            continue
        for layer in base.layers:
            inserted = [c for c in classes if c.insert_before is not None and layer in c.layers]
            entries, origin = _with_insertions(base, inserted)
            plans[layer] = Plan(base.name, entries, origin)
    return plans


def _with_insertions(base: LayerClass, inserted: list[LayerClass]
                     ) -> tuple[tuple[SequenceEntry, ...], tuple[tuple[str, int, int], ...]]:
    def own(layer_class: LayerClass) -> list[tuple[str, int, int]]:
        n = len(layer_class.sequence)
        return [(layer_class.name, index + 1, n) for index in range(n)]

    entries, origin = list(base.sequence), own(base)
    for layer_class in inserted:
        at = next(i for i, e in enumerate(entries) if e.op == layer_class.insert_before)
        entries[at:at] = layer_class.sequence
        origin[at:at] = own(layer_class)
    return tuple(entries), tuple(origin)


@dataclass(frozen=True)
class Alignment:
    """Per observed kernel: the entry it fills (index, or -1 for an extra kernel); and the
    edits `(kind, label, position, after)`."""

    filled: tuple[int, ...]
    edits: tuple[tuple[str, str, int, str | None], ...]


def align(entries: tuple[SequenceEntry, ...], streams: list[list[tuple[frozenset[str], str]]],
          fill_sets: list[frozenset[str]] | None = None) -> Alignment:
    """Least-cost alignment of the kernels of `streams` to `entries`.

    Each stream is a list of (candidate ops, label) in its issue order; kernels of different
    streams may take their places in any interleaving (a stream runs its kernels in order, but
    two streams' kernels can be observed in either order when nothing records how they were
    issued: graph replays in a profiler trace). Places: entry e expands to e.high places, the
    first e.low required. Cost: 1 per extra kernel, 1 per unfilled required place.
    `fill_sets`: what each entry accepts, when more than its ops (see `place_ops`).

    `filled` is indexed by the kernels' order in `streams`, stream after stream."""
    places: list[tuple[int, bool]] = []  # (entry index, required)
    for index, entry in enumerate(entries):
        places += [(index, k < entry.low) for k in range(entry.high)]
    fills = [frozenset(e.fills) for e in entries] if fill_sets is None else fill_sets
    n_places = len(places)
    lengths = tuple(len(stream) for stream in streams)
    # cost[(i, at)]: least cost of places[i:] against every stream's kernels from `at` on,
    # filled bottom-up: (i + 1, at) and (i, at + one kernel of a stream) come before (i, at)
    # (descending product order puts every `at + e_s` before `at`)
    positions = list(itertools.product(*(range(n, -1, -1) for n in lengths)))
    moves = {at: [(s, at[:s] + (at[s] + 1,) + at[s + 1:]) for s, n in enumerate(lengths) if at[s] < n]
             for at in positions}
    cost: dict[tuple[int, tuple[int, ...]], int] = {}
    for at in positions:
        cost[(n_places, at)] = sum(n - a for n, a in zip(lengths, at))
    # which kernels each entry accepts, once per entry and kernel rather than per grid cell
    fits = [[[bool(accepts & candidates) for candidates, _ in stream] for stream in streams] for accepts in fills]
    for i in range(n_places - 1, -1, -1):
        entry_index, required = places[i]
        fit = fits[entry_index]
        skip = 1 if required else 0
        for at in positions:
            value = cost[(i + 1, at)] + skip
            for s, moved in moves[at]:
                extra = cost[(i, moved)] + 1
                if extra < value:
                    value = extra
                if fit[s][at[s]]:
                    matched = cost[(i + 1, moved)]
                    if matched < value:
                        value = matched
            cost[(i, at)] = value

    def best(i: int, at: tuple[int, ...]) -> int:
        return cost[(i, at)]

    offsets = [sum(lengths[:s]) for s in range(len(lengths))]
    filled = [-1] * sum(lengths)
    edits: list[tuple[str, str, int, str | None]] = []
    i, at = 0, tuple(0 for _ in lengths)
    last_entry = -1
    while i < n_places or any(a < n for a, n in zip(at, lengths)):
        here = best(i, at)
        step = _walk_step(i, at, here, best, places, fills, streams, lengths)
        kind, s = step
        if kind == "match":
            entry_index = places[i][0]
            filled[offsets[s] + at[s]] = entry_index
            last_entry = entry_index
            i, at = i + 1, at[:s] + (at[s] + 1,) + at[s + 1:]
        elif kind == "skip":
            entry_index, required = places[i]
            if required:
                before = entries[entry_index - 1].op if entry_index else None
                edits.append((MISSING, entries[entry_index].op, entry_index + 1, before))
            i += 1
        else:
            edits.append((EXTRA, streams[s][at[s]][1], last_entry + 1,
                          entries[last_entry].op if last_entry >= 0 else None))
            at = at[:s] + (at[s] + 1,) + at[s + 1:]
    return Alignment(tuple(filled), tuple(edits))


def _walk_step(i, at, here, best, places, fills, streams, lengths) -> tuple[str, int]:
    """The move of least cost from (i, at): fill a place first, then skip a place, then take
    an extra kernel; among streams, the first."""
    n_places = len(places)
    for s, n in enumerate(lengths):
        if i < n_places and at[s] < n:
            moved = at[:s] + (at[s] + 1,) + at[s + 1:]
            if fills[places[i][0]] & streams[s][at[s]][0] and best(i + 1, moved) == here:
                return "match", s
    if i < n_places and best(i + 1, at) + (1 if places[i][1] else 0) == here:
        return "skip", -1
    for s, n in enumerate(lengths):
        if at[s] < n and best(i, at[:s] + (at[s] + 1,) + at[s + 1:]) + 1 == here:
            return "extra", s
    raise AssertionError("no move reaches the least cost")  # the costs above are consistent


def placed_op(entry: SequenceEntry, op: str | None, generic: set[str]) -> str:
    """The op a kernel counts as in the place it fills: its own when the entry names it and it
    is a specific op (`fused_add_rmsnorm|rmsnorm`: layer 0's plain norm stays rmsnorm), else
    the entry's op (a generic cuBLAS GEMM in the router's place is the router; o_proj's shape
    in the shared expert's place is the shared expert's GEMM)."""
    if op in entry.fills and op not in generic:
        return op
    return entry.op


def place_ops(kernels: pl.DataFrame, expectations: Expectations) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Align the layers of `kernels` to their plans.

    `kernels`: `_position, rank, step, layer, stream, name, op` in issue order (within a
    stream). An edit's label is
    the kernel's op, or its name when no op claims it. Returns `_position, placed_op` for every
    kernel that filled an entry, and the edits (EDIT_SCHEMA)."""
    plans = layer_plans(expectations)
    empty = (pl.DataFrame(schema={"_position": pl.UInt32, "placed_op": pl.Utf8}), pl.DataFrame(schema=EDIT_SCHEMA))
    if not plans or kernels.height == 0:
        return empty
    plan_ids = {plan: index for index, plan in enumerate(dict.fromkeys(plans.values()))}
    plan_of = pl.DataFrame({"layer": list(plans), "_plan": [plan_ids[p] for p in plans.values()]},
                           schema={"layer": pl.Int64, "_plan": pl.Int64})
    classifier = OpClassifier(expectations)
    generic = {name for name, op in expectations.ops.items() if op.fallback}
    names = kernels.select(pl.col("name").unique()).drop_nulls()["name"].to_list()
    candidates = {name: frozenset(ops) for name, ops in zip(names, classifier.all_matches_many(names))}
    key = ["rank", "step", "layer"]
    # each layer's kernels stream by stream (streams in the order of their first kernel), each
    # stream in issue order. The names and ops travel as their hashes (a sort and a group-by
    # of strings copy them, and a hash of lists of strings costs three times that of lists of
    # integers); the distinct layers' own names and ops are gathered back below by `_order`
    planned = kernels.select(
        "_position", *key, "stream", pl.col("name").hash(seed=0).alias("_name_hash"),
        pl.col("op").hash(seed=0).alias("_op_hash"),
    ).with_row_index("_order").join(plan_of, on="layer", how="inner", maintain_order="left")
    # one packed Int64 (frames.packed_key) stands for several key columns where they fit: a
    # window or group-by on one integer column is cheaper than on several, and on a column
    # flagged sorted it takes runs of rows instead of hashing
    stream_of_layer = packed_key(planned, [*key, "stream"])
    stream_first = pl.col("_order").min().over(stream_of_layer if stream_of_layer is not None else [*key, "stream"])
    planned = planned.with_columns(stream_first.alias("_stream_first"))
    # the rows are in issue order, so a stable sort on the layer and its stream's first kernel
    # is the sort on them and the issue order
    stream_key = packed_key(planned, [*key, "_stream_first"])
    if stream_key is None:
        ordered, by = planned.sort(*key, "_stream_first", "_order"), [*key, "_plan"]
    else:
        # the layer key is the high bits of the stream key (packed over the same rows), so rows
        # sorted by one are sorted by the other; the plan is the layer's
        ordered = (
            planned.with_columns(stream_key.alias("_stream_key"), packed_key(planned, key).alias("_layer_key"))
            .sort("_stream_key", maintain_order=True)
            .with_columns(pl.col("_layer_key").set_sorted())
        )
        by = ["_layer_key"]
    layers = ordered.group_by(by, maintain_order=True).agg(
        *[pl.col(k).first() for k in (*key, "_plan") if k not in by],
        "_position", "_order", "_name_hash", "_op_hash", pl.col("stream").fill_null(-1),
    ).drop("_layer_key", strict=False)
    by_plan = {index: plan for plan, index in plan_ids.items()}
    # a GEMM that only a generic op claims (its name states no shape: B200 DeepGEMM `0u, 0u, 0u`,
    # or a tile-named cuBLAS GEMM) may fill the place of any op that declares GEMM shapes
    shaped = {name for name, op in expectations.ops.items() if op.gemm}
    fill_sets = {index: [frozenset(e.fills) | ({GENERIC_GEMM} if set(e.fills) & shaped else set())
                         for e in plan.entries] for plan, index in plan_ids.items()}
    candidates = {name: ops | ({GENERIC_GEMM} if ops and ops <= generic else set())
                  for name, ops in candidates.items()}
    # one alignment per distinct layer (plan, names, ops, streams), not per layer and step: a
    # healthy trace has a handful however many steps it holds
    layers = layers.with_columns(
        pl.struct("_plan", "_name_hash", "_op_hash", "stream").hash(seed=0).alias("_sig"))
    placed_parts: list[pl.DataFrame] = []
    edit_parts: list[pl.DataFrame] = []
    for signature, plan_index, order, stream_ids in (
        layers.unique(subset="_sig", keep="first", maintain_order=True)
        .select("_sig", "_plan", "_order", "stream").iter_rows()
    ):
        kernel_names = kernels["name"].gather(order).to_list()
        ops = kernels["op"].gather(order).to_list()
        plan = by_plan[plan_index]
        streams: list[list[tuple[frozenset[str], str]]] = []
        previous = None
        for name, op, stream in zip(kernel_names, ops, stream_ids):
            if stream != previous:
                streams.append([])
                previous = stream
            own = {op} if op and op != UNMATCHED_OP else set()
            streams[-1].append((candidates.get(name, frozenset()) | own, op if own else (name or "?")))
        alignment = align(plan.entries, streams, fill_sets[plan_index])
        placed_parts.append(pl.DataFrame({
            "_sig": [signature],
            "placed_op": [[placed_op(plan.entries[e], op, generic) if e >= 0 else None
                           for e, op in zip(alignment.filled, ops)]],
        }, schema={"_sig": pl.UInt64, "placed_op": pl.List(pl.Utf8)}))
        rows = []
        for kind, label, where, after in alignment.edits:
            # `where` counts in the layer's whole plan; findings count in the entry's own class,
            # so that one fault reads the same in layers with and without an inserted class
            entry_class, position, entries = (plan.origin[where - 1] if where else
                                              (plan.class_name, 0, len(plan.origin)))
            rows.append((signature, plan.class_name, kind, label, position, after, entry_class, entries))
        if rows:
            edit_parts.append(pl.DataFrame(rows, orient="row", schema={
                "_sig": pl.UInt64, **{k: v for k, v in EDIT_SCHEMA.items() if k not in ("rank", "step", "layer")}}))
    placed = (
        layers.select("_sig", "_position").join(pl.concat(placed_parts), on="_sig", how="left")
        .explode("_position", "placed_op")
        .filter(pl.col("placed_op").is_not_null())
        .select(pl.col("_position").cast(pl.UInt32), "placed_op")
    )
    edits = pl.DataFrame(schema=EDIT_SCHEMA)
    if edit_parts:
        edits = (layers.select("rank", "step", "layer", "_sig").join(pl.concat(edit_parts), on="_sig", how="inner")
                 .select(list(EDIT_SCHEMA)).cast(EDIT_SCHEMA))
    return placed, edits
