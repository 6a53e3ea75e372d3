"""Terminal lines for where the step time goes (Result.time_use): the seed's three columns in
time, communication and its overlap, launch delay, copies and streams, GPU time by group, op
and layer, and the kernels that took the most time.

Figures are medians over the decode steps (all ranks), so one odd step does not move them;
`--json` has every step. Lines stay under WIDTH columns: lists wrap between items.
"""

from __future__ import annotations

import polars as pl

from nsys_ledger.api import Result
from nsys_ledger.checks.time_use import COPY_KINDS, TimeUse, time_by_role, top_kernels
from nsys_ledger.ledger.roles import op_roles
from nsys_ledger.report.text import printable

WIDTH = 98
INDENT = " " * 10
TOP_ITEMS = 6  # groups and ops listed by time
TOP_KERNELS = 8
LABEL_WIDTH = 60


def time_lines(result: Result) -> list[str]:
    use = result.time_use
    if use is None or use.steps.height == 0:
        return []
    steps = use.steps
    over = f"median per decode step over {steps.height} steps" if steps.height != 1 else "the one decode step"
    lines = [f"where the time goes ({over}):"]
    lines += _seed_columns(result, use)
    lines += _communication(use)
    lines += _launch_delay(use)
    lines += _copies(use)
    lines += _by(use.groups, "group", "groups", steps.height)
    lines += _by(use.ops, "op", "ops", steps.height)
    roles = op_roles(result.expectations)
    if roles:  # the ops by what they do in the model (ledger.roles), as `compare` lines them up
        lines += _by(time_by_role(use.ops, roles), "role", "roles", steps.height)
    lines += _layers(use)
    lines += _top_kernels(use)
    return lines


def us(ns: float | None) -> str:
    """A duration in µs with its unit: whole µs from 100 µs up, one decimal below."""
    if ns is None:
        return "- us"
    value = ns / 1000
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f} us"
    return f"{value:,.1f} us"


def _median(frame: pl.DataFrame, column: str) -> float:
    value = frame[column].median() if frame.height else None
    return float(value) if value is not None else 0.0


def _count(value: float) -> str:
    """A median count: an integer when it is one (2,002), else one decimal (2,002.5)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _seed_columns(result: Result, use: TimeUse) -> list[str]:
    steps = use.steps
    gaps = result.step_table
    submission = (f"CPU submission {_count(_median(steps, 'launch_calls'))} launch calls, "
                  f"{us(_median(steps, 'launch_host_ns'))} in them")
    execution = (f"GPU execution {_count(_median(steps, 'kernels'))} kernels, Σt {us(_median(steps, 'kernel_ns'))}, "
                 f"busy {us(_median(steps, 'busy_ns'))}")
    idle = f"GPU gaps {_count(_median(gaps, 'gaps'))}, {us(_median(gaps, 'gap_ns'))}"
    return _wrap("time      ", [submission, execution, idle], "; ")


def _communication(use: TimeUse) -> list[str]:
    steps = use.steps
    if not steps["collective_ns"].sum():
        return ["comm      no collective kernel in the decode steps"]
    per_rank = steps.group_by("rank").agg(pl.col("collective_ns", "overlapped_ns", "exposed_ns").median()).sort("rank")
    items = [
        (f"rank {rank}: " if per_rank.height > 1 else "")
        + f"collectives {us(c)}, {us(o)} overlapped with compute, {us(e)} exposed"
        for rank, c, o, e in per_rank.iter_rows()
    ]
    return _wrap("comm      ", items, "; ")


def _launch_delay(use: TimeUse) -> list[str]:
    delays = use.launch_delay
    if delays.height == 0:
        return []
    items = []
    for mode, what in (("eager", "eager kernels"), ("graph", "graph replays")):
        mine = delays.filter(pl.col("mode") == mode)
        if mine.height:
            items.append(f"{what} {_count(_median(mine, 'count'))}: delay p50 {us(_median(mine, 'p50_ns'))}, "
                         f"p90 {us(_median(mine, 'p90_ns'))}, max {us(_median(mine, 'max_ns'))}")
    return ["launch    delay = kernel start - launch call start", *_wrap(INDENT, items, "; ")]


def _copies(use: TimeUse) -> list[str]:
    copies = use.copies
    per_kind = copies.group_by("kind").agg(pl.col("count", "bytes", "time_ns").median())
    order = {kind: i for i, kind in enumerate(COPY_KINDS)}
    items = []
    for kind, count, moved, ns in per_kind.sort(pl.col("kind").replace_strict(order, default=99), "kind").iter_rows():
        if count == 0 and kind not in COPY_KINDS:
            continue
        items.append(f"{kind} {_count(count)}" + (f" ({_count(moved)} B, {us(ns)})" if count else ""))
    streams = use.streams.group_by("device").agg(pl.col("streams").max()).sort("device")
    items += [f"device {device}: {n} stream{'s' * (n != 1)}" for device, n in streams.iter_rows()]
    return _wrap("copies    ", items, ", ")


def _by(frame: pl.DataFrame, column: str, label: str, steps: int) -> list[str]:
    """The TOP_ITEMS values of `column` with the most median time per step, with their share."""
    if frame.height == 0:
        return []
    per = frame.group_by(column).agg(
        (pl.col("kernel_ns").sum() / steps).alias("ns"), (pl.col("share").sum() / steps).alias("share")
    ).sort("ns", column, descending=[True, False])
    items = [f"{printable(value)} {us(ns)} ({share:.1%})" for value, ns, share in per.head(TOP_ITEMS).iter_rows()]
    if per.height > TOP_ITEMS:
        items.append(f"{per.height - TOP_ITEMS} more")
    return _wrap(f"{label:<10}", items, ", ")


def _layers(use: TimeUse) -> list[str]:
    layers = use.layers
    if layers.height == 0:
        return []
    per = layers.group_by("layer").agg(pl.col("kernel_ns").median()).sort("layer")
    slowest = per.sort("kernel_ns", "layer", descending=[True, False]).row(0)
    fastest = per.sort("kernel_ns", "layer").row(0)
    return _wrap("layers    ", [
        f"{per.height} layers, median {us(float(per['kernel_ns'].median()))} of GPU time per layer",
        f"slowest layer {slowest[0]} {us(slowest[1])}", f"fastest layer {fastest[0]} {us(fastest[1])}",
    ], ", ")


def _top_kernels(use: TimeUse) -> list[str]:
    top = top_kernels(use, TOP_KERNELS, LABEL_WIDTH)
    if top.height == 0:
        return []
    steps = use.steps.height
    lines = ["kernels by GPU time per step (one row per kernel name):"]
    for label, kernels, per_step_ns, share in top.select("label", "kernels", "per_step_ns", "share").iter_rows():
        launches = _count(kernels / steps if steps else kernels)
        lines.append(f"  {us(per_step_ns):>12} {share:>6.1%} {launches:>6}x  {printable(label)}".rstrip())
    return lines


def _wrap(head: str, items: list[str], separator: str) -> list[str]:
    """`head` and the items joined by `separator`, wrapped between items at WIDTH columns."""
    lines, current = [], head
    for index, item in enumerate(items):
        piece = item + (separator.rstrip() if index < len(items) - 1 else "")
        if current.strip() and len(current) + len(piece) + 1 > WIDTH and current != head:
            lines.append(current.rstrip())
            current = INDENT
        current += piece + " "
    lines.append(current.rstrip())
    return [line if len(line) <= WIDTH else line[: WIDTH - 1] + "…" for line in lines]
