"""Where the time of each decode step goes: GPU time by op, group, layer and kernel name, the
host time of the launch calls, communication and its overlap with compute, launch delay, and
every kind of copy.

The ledger counts launches; these frames say how long they ran. Every function is a plain
frame -> frame over the `Steps` of attribution (activities and API calls carrying `rank,
step, decode`); the reports read the frames of `time_use`, kept in `Result.time_use`.

Busy time is the union of the step's GPU activity intervals (kernels, copies, memsets, all
streams merged): a nanosecond in which two streams run counts once. A share is an item's
summed duration over that busy time, so the shares of a step with concurrent streams may add
up to more than 100%.

Communication and overlap (HTA's comm/comp overlap, TraceLens's exposed communication)::

    compute stream  |==gemm==|      |==gemm==|
    comm stream         |===nccl===|
                        ^^^^ overlapped  (collective time while compute runs)
                             ^^^^^^ exposed (collective time nothing else hides)

`collective_ns` is the union of collective kernels (gaps.COLLECTIVE_REGEX), `overlapped_ns`
its intersection with the union of the other kernels, `exposed_ns` the difference:
|C ∩ K| = |C| + |K| - |C ∪ K|, three unions and no interval join. Unlike the other figures,
these take every kernel that starts in the step's GPU span on its device, whichever thread
launched it: DDP and FSDP launch their all-reduces from a thread of their own, outside the
step's range (HTA's NCCL fixture: 15 of its 21 NCCL kernels).

Launch delay is `kernel start - launch call start`: for an eager kernel its own
cudaLaunchKernel, for a graph replay the first kernel of the replay and its cudaGraphLaunch.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import polars as pl

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.checks.gaps import COLLECTIVE_REGEX
from nsys_ledger.checks.stats import SUBMISSION_KINDS
from nsys_ledger.frames import packed_key
from nsys_ledger.ledger.roles import role_of, role_order

STEP_KEY = ["rank", "step"]
NO_OP = "other"  # kernels no op of the ledger claims (as in the op table)
NO_GROUP = "ungrouped"
# copy kinds the reports always list (zeros included), then any other kind the trace has
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "PtoP", "memset")
DELAY_MODES = ("eager", "graph")
DELAY_QUANTILES = {"p50_ns": 0.5, "p90_ns": 0.9, "p99_ns": 0.99}


@dataclass(frozen=True)
class TimeUse:
    """Per decode step, keyed by `rank, step`; durations in ns, integers."""

    steps: pl.DataFrame  # rank, step, device, busy_ns, kernel_ns, STEP_COLUMNS of submission and comm
    ops: pl.DataFrame  # rank, step, op, kernels, kernel_ns, share (of busy_ns)
    groups: pl.DataFrame  # rank, step, group, kernels, kernel_ns, share
    layers: pl.DataFrame  # rank, step, layer, kernels, kernel_ns, share (kernels with a layer)
    layer_groups: pl.DataFrame  # rank, step, layer, group, kernels, kernel_ns, share (the per-layer heatmap)
    kernels: pl.DataFrame  # rank, name, op, kernels, kernel_ns, steps: every decode kernel name (top_kernels)
    launch_delay: pl.DataFrame  # rank, step, mode, count, min_ns, p50_ns, p90_ns, p99_ns, max_ns, mean_ns
    copies: pl.DataFrame  # rank, step, kind, count, bytes, time_ns (every kind of COPY_KINDS, zeros kept)
    streams: pl.DataFrame  # rank, pid, device, streams: streams with decode activity per device


def time_use(steps: Steps, layer_assignments: pl.DataFrame | None = None) -> TimeUse:
    """All time frames of the decode steps. `layer_assignments`: `row, layer, layer_group`
    of every activity (LayerSummary.assignments), for time per layer and per layer group."""
    activities = decode_activities(steps, layer_assignments)
    busy = busy_time(activities)
    # two group-bys of the kernels instead of five: the step, op and group figures add up the
    # rows per op and group, the layer figures those per layer and group (integer sums: the
    # same figures)
    by_op = kernel_time_parts(activities, ["op", "group"])
    by_layer = kernel_time_parts(activities.lazy().filter(pl.col("layer").is_not_null()), ["layer", "group"])
    step_rows = (
        busy.join(kernel_time(by_op), on=STEP_KEY, how="left")
        .join(launch_calls(steps.api_calls), on=STEP_KEY, how="left")
        .join(communication(kernels_in_spans(steps.activities, activities)), on=STEP_KEY, how="left")
        .with_columns(pl.col(c).fill_null(0) for c in STEP_TIME_COLUMNS)
        .sort(STEP_KEY)
    )
    return TimeUse(
        steps=step_rows,
        ops=time_by(by_op, "op", busy),
        groups=time_by(by_op, "group", busy),
        layers=time_by(by_layer, "layer", busy),
        layer_groups=time_by(by_layer, ["layer", "group"], busy),
        kernels=kernel_names_by_time(activities),
        launch_delay=launch_delay(activities),
        copies=copies(activities, steps.decode.select(STEP_KEY)),
        streams=streams_per_device(activities),
    )


STEP_TIME_COLUMNS = ["kernels", "kernel_ns", "launch_calls", "launch_host_ns", "collective_ns", "overlapped_ns",
                     "exposed_ns"]


def decode_activities(steps: Steps, layer_assignments: pl.DataFrame | None) -> pl.DataFrame:
    """The decode-step activities with `op` (NO_OP when none), `group` and `layer`."""
    acts = steps.activities.filter(pl.col("decode").fill_null(False)).select(
        *STEP_KEY, "row", "activity", "start", "end", "device", "stream", "pid", "correlation", "name",
        "graph_node_id", "bytes", "copy_kind", "api_start", "api_kind",
        pl.col("op").fill_null(NO_OP), pl.col("group").alias("_op_group"),
    )
    if layer_assignments is not None and layer_assignments.height:
        acts = acts.join(layer_assignments.select("row", "layer", "layer_group"), on="row", how="left")
    else:
        acts = acts.with_columns(pl.lit(None, pl.Int64).alias("layer"), pl.lit(None, pl.Utf8).alias("layer_group"))
    # the group a layer's attribution gave (a sub-module may decide it), else the op's own
    group = pl.coalesce("layer_group", "_op_group").fill_null(NO_GROUP)
    return acts.with_columns(group.alias("group")).drop("_op_group", "layer_group")


def union_ns(intervals: pl.DataFrame, key: list[str]) -> pl.DataFrame:
    """`key..., union_ns`: the length of the union of `[start, end)` per key.

    Sorted by start, each interval adds what reaches past the furthest end before it.
    """
    ordered, by = _in_start_order(intervals.lazy().select(*key, "start", "end").collect(), key)
    return ordered.with_columns(_added_to_union(by).alias("_added")).pipe(
        _per_key, by, key, pl.col("_added").sum().cast(pl.Int64).alias("union_ns"))


def _added_to_union(partition: list[str]) -> pl.Expr:
    """What each interval adds to the union of its `partition`'s intervals (rows sorted by
    start within it): its part past the furthest end before it."""
    reach = pl.col("end").cum_max().shift(1).over(partition)
    return (pl.col("end") - pl.max_horizontal("start", reach.fill_null(pl.col("start")))).clip(lower_bound=0)


def _in_start_order(intervals: pl.DataFrame, key: list[str]) -> tuple[pl.DataFrame, list[str]]:
    """`intervals` sorted by `key`, then start, and the columns that tell the keys apart: the
    keys packed into one Int64 `_key` where they fit (frames.packed_key), which the sort leaves
    flagged sorted, so that a window or group-by over it takes runs of rows instead of hashing
    (three times cheaper over 1M rows than over the key columns), else the key columns.

    The sort is eager: polars' default (streaming) engine sorts presorted rows by several
    columns several times slower than the in-memory sort (0.21 against 0.03 s for 1M rows)."""
    packed = packed_key(intervals, key)
    if packed is None:
        return intervals.sort(*key, "start"), key
    return intervals.with_columns(packed.alias("_key")).sort("_key", "start"), ["_key"]


def _per_key(frame: pl.DataFrame, by: list[str], key: list[str], *aggs: pl.Expr) -> pl.DataFrame:
    """`key..., aggs...` per value of `by` (from _in_start_order), in key order."""
    if by == key:
        return frame.group_by(key, maintain_order=True).agg(*aggs)
    return frame.group_by(by, maintain_order=True).agg(*[pl.col(k).first() for k in key], *aggs).drop(by)


def busy_time(activities: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, device, busy_ns`: the union of the step's GPU activity on its device."""
    busy = union_ns(activities, STEP_KEY).rename({"union_ns": "busy_ns"})
    device = activities.lazy().group_by(STEP_KEY).agg(pl.col("device").mode().first()).collect()
    return device.join(busy, on=STEP_KEY, how="left").select(*STEP_KEY, "device", "busy_ns")


def kernel_time_parts(activities: pl.DataFrame | pl.LazyFrame, columns: list[str]) -> pl.DataFrame:
    """`rank, step, <columns>, kernels, kernel_ns`: the kernels and their summed durations
    (Σ t_i) per step and value of `columns`, what `kernel_time` and `time_by` add up."""
    return activities.lazy().filter(pl.col("activity") == "kernel").group_by(*STEP_KEY, *columns).agg(
        pl.len().cast(pl.Int64).alias("kernels"), _duration().sum().cast(pl.Int64).alias("kernel_ns")
    ).collect()


def kernel_time(parts: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, kernels, kernel_ns` from any `kernel_time_parts`."""
    return parts.group_by(STEP_KEY).agg(pl.col("kernels").sum(), pl.col("kernel_ns").sum())


def time_by(parts: pl.DataFrame, columns: str | list[str], busy: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, <columns>, kernels, kernel_ns, share`: kernel time per value of `columns`
    (`parts`: kernel_time_parts), `share` of the step's busy time (0 when the step has none)."""
    columns = [columns] if isinstance(columns, str) else columns
    per = parts.group_by(*STEP_KEY, *columns).agg(pl.col("kernels").sum(), pl.col("kernel_ns").sum())
    return per.join(busy.select(*STEP_KEY, "busy_ns"), on=STEP_KEY, how="left").select(
        *STEP_KEY, *columns, "kernels", "kernel_ns",
        pl.when(pl.col("busy_ns") > 0).then(pl.col("kernel_ns") / pl.col("busy_ns")).otherwise(0.0).alias("share"),
    ).sort(*STEP_KEY, *columns)


def time_by_role(ops: pl.DataFrame, roles: dict[str, str]) -> pl.DataFrame:
    """`rank, step, role, kernels, kernel_ns, share`: TimeUse.ops summed by the role of each op
    (`roles`: op -> role, ledger.roles.op_roles); ops without a role, and `other`, in NO_ROLE.
    Shares add up: each is a kernel time over the same busy time."""
    return ops.with_columns(role_of("op", roles).alias("role")).group_by(*STEP_KEY, "role").agg(
        pl.col("kernels").sum(), pl.col("kernel_ns").sum(), pl.col("share").sum()
    ).sort(*STEP_KEY, pl.col("role").map_elements(role_order, return_dtype=pl.Int64))


def launch_calls(api_calls: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, launch_calls, launch_host_ns`: the step's CPU submissions (kernel and graph
    launches, memcpy and memset calls) and the host time spent inside them."""
    calls = api_calls.filter(pl.col("decode").fill_null(False) & pl.col("kind").is_in(SUBMISSION_KINDS))
    return calls.group_by(STEP_KEY).agg(
        pl.len().cast(pl.Int64).alias("launch_calls"), _duration().sum().cast(pl.Int64).alias("launch_host_ns")
    )


def kernels_in_spans(all_activities: pl.DataFrame, decode: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, activity, start, end, name`: every kernel of the trace that starts inside a
    decode step's GPU span on its process and device (the span of the step's own activities),
    its end cut at the span's end; where spans overlap, the later step takes it."""
    spans = decode.lazy().group_by(*STEP_KEY, "pid", "device").agg(
        pl.col("start").min().alias("gpu_start"), pl.col("end").max().alias("gpu_end")
    ).collect().sort("gpu_start")
    kernels = all_activities.lazy().filter(pl.col("activity") == "kernel").select(
        "pid", "device", "activity", "start", "end", "name"
    ).collect().sort("start")
    placed = kernels.join_asof(
        spans, left_on="start", right_on="gpu_start", by=["pid", "device"], strategy="backward",
        check_sortedness=False,  # both sorted by start above
    ).filter(pl.col("start") < pl.col("gpu_end"))
    return placed.select(*STEP_KEY, "activity", "start", pl.min_horizontal("end", "gpu_end").alias("end"), "name")


def communication(activities: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, collective_ns, overlapped_ns, exposed_ns` (see the module docstring).

    The three unions come from one sort: each kernel adds to the union of all kernels and to
    that of its own kind (collective or compute)."""
    kernels = activities.lazy().filter(pl.col("activity") == "kernel")
    names = kernels.select(pl.col("name").unique().drop_nulls()).collect().to_series()
    collectives = names.filter(names.str.contains(COLLECTIVE_REGEX))  # the regex once per distinct name
    ordered, by = _in_start_order(kernels.select(
        *STEP_KEY, "start", "end", pl.col("name").is_in(collectives.implode()).fill_null(False).alias("_collective"),
    ).collect(), STEP_KEY)
    added = ordered.with_columns(
        _added_to_union(by).alias("_both"), _added_to_union([*by, "_collective"]).alias("_own"),
    )
    per_step = _per_key(
        added, by, STEP_KEY,
        pl.col("_own").filter(pl.col("_collective")).sum().cast(pl.Int64).alias("collective_ns"),
        pl.col("_own").filter(~pl.col("_collective")).sum().cast(pl.Int64).alias("_compute"),
        pl.col("_both").sum().cast(pl.Int64).alias("_both"),
        pl.col("_collective").any().alias("_has_collective"),
    ).filter(pl.col("_has_collective"))  # the steps with a collective, as the union of collectives gives them
    overlapped = pl.col("collective_ns") + pl.col("_compute") - pl.col("_both")
    return per_step.select(
        *STEP_KEY, "collective_ns", overlapped.alias("overlapped_ns"),
        (pl.col("collective_ns") - overlapped).alias("exposed_ns"),
    )


def launch_delay(activities: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, mode, count, min_ns, p50_ns, p90_ns, p99_ns, max_ns, mean_ns`: kernel start
    minus launch call start, `eager` per kernel launch, `graph` per replay (its first kernel)."""
    kernels = activities.lazy().filter((pl.col("activity") == "kernel") & pl.col("api_start").is_not_null())
    eager = kernels.filter(pl.col("api_kind") == "kernel_launch").select(
        *STEP_KEY, pl.lit("eager").alias("mode"), (pl.col("start") - pl.col("api_start")).alias("delay")
    )
    graph = (
        kernels.filter(pl.col("api_kind") == "graph_launch")
        .group_by(*STEP_KEY, "pid", "correlation")
        .agg((pl.col("start").min() - pl.col("api_start").first()).alias("delay"))
        .select(*STEP_KEY, pl.lit("graph").alias("mode"), "delay")
    )
    delays = pl.concat([eager, graph])
    stats = [pl.len().cast(pl.Int64).alias("count"), pl.col("delay").min().alias("min_ns")]
    stats += [pl.col("delay").quantile(q, interpolation="nearest").alias(name) for name, q in DELAY_QUANTILES.items()]
    stats += [pl.col("delay").max().alias("max_ns"), pl.col("delay").mean().round(0).alias("mean_ns")]
    columns = ["min_ns", *DELAY_QUANTILES, "max_ns", "mean_ns"]
    return delays.group_by(*STEP_KEY, "mode").agg(stats).with_columns(
        pl.col(c).cast(pl.Int64) for c in columns
    ).collect().sort(*STEP_KEY, "mode")


def copies(activities: pl.DataFrame, decode_steps: pl.DataFrame) -> pl.DataFrame:
    """`rank, step, kind, count, bytes, time_ns`: copies by kind (`HtoD`, `DtoH`, ..., as the
    trace labels them) and memsets (`memset`), every kind of COPY_KINDS in every step."""
    moved = activities.filter(pl.col("activity").is_in(["memcpy", "memset"])).select(
        *STEP_KEY,
        pl.when(pl.col("activity") == "memset").then(pl.lit("memset"))
        .otherwise(pl.col("copy_kind").fill_null("Unknown")).alias("kind"),
        "bytes", _duration().alias("time_ns"),
    )
    per = moved.group_by(*STEP_KEY, "kind").agg(
        pl.len().cast(pl.Int64).alias("count"), pl.col("bytes").sum().cast(pl.Int64).alias("bytes"),
        pl.col("time_ns").sum().cast(pl.Int64).alias("time_ns"),
    )
    kinds = [*COPY_KINDS, *sorted(set(per["kind"].to_list()) - set(COPY_KINDS))]
    grid = decode_steps.join(pl.DataFrame({"kind": kinds}), how="cross")
    order = {kind: i for i, kind in enumerate(kinds)}
    return grid.join(per, on=[*STEP_KEY, "kind"], how="left").with_columns(
        pl.col(c).fill_null(0) for c in ("count", "bytes", "time_ns")
    ).sort(*STEP_KEY, pl.col("kind").replace_strict(order, return_dtype=pl.Int64))


def streams_per_device(activities: pl.DataFrame) -> pl.DataFrame:
    """`rank, pid, device, streams`: distinct streams that ran decode-step work on each device."""
    return activities.lazy().group_by("rank", "pid", "device").agg(
        pl.col("stream").n_unique().cast(pl.Int64).alias("streams")
    ).collect().sort("rank", "pid", "device")


def kernel_names_by_time(activities: pl.DataFrame) -> pl.DataFrame:
    """`rank, name, op, kernels, kernel_ns, steps`: every decode kernel name (in full) per rank
    with its launches and summed time over the rank's decode steps, longest first."""
    kernels = activities.lazy().filter(pl.col("activity") == "kernel")
    steps = activities.lazy().group_by("rank").agg(pl.struct("step").n_unique().cast(pl.Int64).alias("steps"))
    return kernels.group_by("rank", "name").agg(
        pl.col("op").first(), pl.len().cast(pl.Int64).alias("kernels"),
        _duration().sum().cast(pl.Int64).alias("kernel_ns"),
    ).join(steps, on="rank", how="left").collect().sort("rank", "kernel_ns", "name", descending=[False, True, False])


def top_kernels(use: TimeUse, limit: int | None = 10, label_width: int = 60) -> pl.DataFrame:
    """`name, label, op, kernels, kernel_ns, per_step_ns, share`: the kernel names that took the
    most GPU time over all ranks' decode steps (`limit` of them, None for all), one row per
    full name; `label` a short name distinct among them (distinct_labels), `per_step_ns` the
    time per decode step (rounded), `share` of the steps' summed busy time."""
    steps = use.steps.height
    busy = int(use.steps["busy_ns"].sum() or 0) if steps else 0
    per = use.kernels.group_by("name").agg(
        pl.col("op").first(), pl.col("kernels").sum(), pl.col("kernel_ns").sum()
    ).sort("kernel_ns", "name", descending=[True, False])
    per = per.head(limit) if limit is not None else per
    return per.with_columns(
        pl.Series("label", distinct_labels(per["name"].to_list(), label_width), dtype=pl.Utf8),
        (pl.col("kernel_ns") / max(steps, 1)).round(0).cast(pl.Int64).alias("per_step_ns"),
        (pl.col("kernel_ns") / busy if busy else pl.lit(0.0)).alias("share"),
    ).select("name", "label", "op", "kernels", "kernel_ns", "per_step_ns", "share")


def _duration() -> pl.Expr:
    return pl.col("end") - pl.col("start")


# --- short names that stay distinct ---------------------------------------------------------

_ANONYMOUS = re.compile(r"\(anonymous namespace\)|<unnamed>")
_NAMESPACES = re.compile(r"\b[A-Za-z_]\w*::")  # `at::native::` in a template argument: the type says enough


NO_NAME = "(no name)"


def function_label(name: str) -> str:
    """The function of a demangled kernel name: no return type, template arguments or
    parameters; anonymous namespaces kept as `(anon)`, so that no `at::native::::` appears.

    >>> function_label("void at::native::(anonymous namespace)::cat_batched_copy<float, 4>(int)")
    'at::native::(anon)::cat_batched_copy'
    """
    # a kernel returns void: the only return type a demangled kernel name carries
    text = _ANONYMOUS.sub("\x00", name.strip().removeprefix("void "))
    head, depth = [], 0
    for ch in text:
        if ch in "<(":
            if depth == 0 and ch == "(":
                break
            depth += 1
        elif ch in ">)":
            depth = max(depth - 1, 0)
        elif depth == 0:
            head.append(ch)
    return "".join(head).strip().replace("\x00", "(anon)") or name


def _template_text(name: str) -> str:
    """The text inside the function's outermost template brackets ('' when it has none)."""
    text = _ANONYMOUS.sub("(anon)", name)
    start, end = text.find("<"), text.find("(", text.find(")") + 1 if text.startswith("(") else 0)
    if start < 0 or (0 <= end < start):
        return ""
    depth = 0
    for i in range(start, len(text)):
        depth += {"<": 1, ">": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + 1:i]
    return text[start + 1:]


def distinct_labels(names: list[str], limit: int = 60) -> list[str]:
    """A short label per name (function_label), made distinct where several names share one:
    the template arguments in which they differ (`<…, 7168, 2048, …>`); a label over `limit`
    characters keeps its start and, where labels would collide, the place where they differ
    (cuBLAS and cuDNN names tell tile and stage apart deep inside); `#2`, `#3` where even
    the full names agree in all that.

    >>> distinct_labels(["k<float, 4>(int)", "k<half, 4>(int)", "other(int)"])
    ['k<float, …>', 'k<half, …>', 'other']
    """
    # a kernel whose name id a damaged export does not resolve has no name, but still has time
    names = [NO_NAME if n is None else n for n in names]
    labels = [function_label(n) for n in names]
    for indexes in _collisions(labels):
        differing = _differing_arguments([_template_arguments(names[i]) for i in indexes])
        for i, shown in zip(indexes, differing):
            labels[i] = f"{labels[i]}<{shown}>"
    clipped = [_clip(label, limit) for label in labels]
    for indexes in _collisions(clipped):
        first_difference = min(_common_length(labels[i], labels[j]) for i in indexes for j in indexes if i != j)
        for i in indexes:
            clipped[i] = _clip_around(labels[i], first_difference, limit)
    for indexes in _collisions(clipped):
        for number, i in enumerate(indexes[1:], start=2):
            suffix = f" #{number}"
            clipped[i] = _clip(clipped[i], limit - len(suffix)) + suffix
    return clipped


def _collisions(labels: list[str]) -> list[list[int]]:
    """The indexes of each label that occurs more than once."""
    by_label: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    return [indexes for indexes in by_label.values() if len(indexes) > 1]


def _template_arguments(name: str) -> list[str]:
    """The top-level template arguments of the kernel function ([] when it has none)."""
    text = _ANONYMOUS.sub("(anon)", name)
    start = text.find("<")
    if start < 0:
        return []
    args, depth, current = [], 0, []
    for ch in text[start + 1:]:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    return [*args, "".join(current).strip()]


def _differing_arguments(argument_lists: list[list[str]], width: int = 24) -> list[str]:
    """For each list, its arguments at the positions where the lists differ, `…` for runs of
    equal ones, each argument clipped to `width`."""
    longest = max(len(args) for args in argument_lists)
    padded = [args + [""] * (longest - len(args)) for args in argument_lists]
    differs = [len({args[k] for args in padded}) > 1 for k in range(longest)]
    shown = []
    for args in padded:
        parts: list[str] = []
        for k, arg in enumerate(args):
            if differs[k]:
                parts.append(_clip(_NAMESPACES.sub("", arg), width))
            elif not parts or parts[-1] != "…":
                parts.append("…")
        shown.append(", ".join(parts))
    return shown


def _common_length(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _clip_around(text: str, at: int, limit: int) -> str:
    """`text` in at most `limit` characters: its start, then from a little before `at` on."""
    if len(text) <= limit:
        return text
    head = limit // 4
    from_ = max(min(at - 6, len(text) - (limit - head - 1)), head)
    body = text[from_:]
    room = limit - head - 1
    return text[:head] + "…" + (body if len(body) <= room else body[: room - 1] + "…")


def _clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters, cut at the end with a `…`."""
    return text if len(text) <= limit else text[: limit - 1] + "…"
