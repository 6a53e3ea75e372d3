"""`nsys-ledger compare` for the terminal, and the tables every text form shares.

`sections(comparison)` lays the comparison out as titled tables of formatted cells (units on
every number, integers as integers, deltas signed, B - A); the terminal, Markdown and HTML
renderers only typeset them. The headline comes first: what B changes per step, and the roles
that explain it.
"""

from __future__ import annotations

from dataclasses import dataclass

import click

from nsys_ledger.compare import STEP_FIGURES, Comparison, RoleRow
from nsys_ledger.report.layout import fit_lines, fit_table, terminal_width
from nsys_ledger.report.text import printable


@dataclass(frozen=True)
class Section:
    title: str
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]
    note: str | None = None  # said instead of (or under) the table


# ---- numbers with their units --------------------------------------------------------------

def count(value: float | None) -> str:
    """2,077 (an integer as an integer), 12.5 for a median between two steps, – for none."""
    if value is None:
        return "–"
    return f"{int(value):,}" if float(value).is_integer() else f"{value:,.1f}"


def signed_count(value: float | None) -> str:
    if value is None:
        return "–"
    return "0" if value == 0 else ("+" if value > 0 else "-") + count(abs(value))


def duration(ns: float | None) -> str:
    """A time with its unit: 812 ns, 389.70 µs, 28.31 ms, 1.47 s."""
    if ns is None:
        return "–"
    magnitude = abs(ns)
    if magnitude < 1_000:
        return f"{ns:,.0f} ns" if float(ns).is_integer() or magnitude >= 10 else f"{ns:,.2f} ns"
    if magnitude < 1_000_000:
        return f"{ns / 1e3:,.2f} µs"
    if magnitude < 1_000_000_000:
        return f"{ns / 1e6:,.2f} ms"
    return f"{ns / 1e9:,.2f} s"


def signed_duration(ns: float | None) -> str:
    if ns is None:
        return "–"
    return "0 ns" if ns == 0 else ("+" if ns > 0 else "-") + duration(abs(ns))


def figure_value(unit: str, value: float | None, *, signed: bool = False) -> str:
    if unit == "ns":
        return signed_duration(value) if signed else duration(value)
    return signed_count(value) if signed else count(value)


def percent(delta: float | None, base: float | None) -> str:
    if delta is None or not base or delta == 0:
        return ""
    return f" ({delta / base * 100:+.1f}%)"


# ---- what every text form shows -------------------------------------------------------------

def headline(comparison: Comparison) -> str:
    """One sentence, first: what B changes per step of the first kind, and which roles explain it."""
    if not comparison.kinds:
        return "nothing to compare: the two traces have no step kind (decode, prefill, mixed) in common"
    kind = comparison.kinds[0]
    kernels_a, _, kernels_delta = comparison.figure("kernels", kind)
    ns_a, _, ns_delta = comparison.figure("kernel_ns", kind)
    busy_a, _, busy_delta = comparison.figure("busy_ns", kind)
    explaining = comparison.explaining_roles(kind, limit=3)
    roles = "; ".join(_explaining_phrase(r) for r in explaining) or "no role differs"
    return (f"B - A per {kind} step (median, rank {comparison.ranks[0]}): {signed_count(kernels_delta)} kernels"
            f"{percent(kernels_delta, kernels_a)}, {signed_duration(ns_delta)} summed kernel time"
            f"{percent(ns_delta, ns_a)}, {signed_duration(busy_delta)} GPU busy{percent(busy_delta, busy_a)}. "
            f"Largest role differences: {roles}")


def _explaining_phrase(row: RoleRow) -> str:
    return f"{row.role} {signed_duration(row.ns_delta)} ({signed_count(row.delta)} kernels)"


def side_lines(comparison: Comparison) -> list[str]:
    lines = []
    for side in (comparison.a, comparison.b):
        ledger = (f"ledger {side.ledger} ({side.ledger_path})" if side.ledger
                  else "no ledger (every kernel in (no role))")
        ranks = f" over {len(side.ranks)} ranks" if len(side.ranks) > 1 else ""
        steps = ", ".join(f"{kind}: {found} step{'s' * (found != 1)} ({steady} steady){ranks}"
                          for kind, (found, steady) in side.steps.items())
        lines.append(f"{side.label}  {side.path}; {ledger}; {steps or 'no step found'}")
    return lines


def sections(comparison: Comparison, *, layer_detail: bool = False) -> list[Section]:
    """Per compared kind and rank: the step figures, the roles that explain the difference,
    every role, and the layers (`layer_detail`: one row per layer; else consecutive layers with
    the same kernel counts on both sides share a row)."""
    out: list[Section] = []
    for kind in comparison.kinds:
        for rank in comparison.ranks:
            where = f"{kind} steps, rank {rank}"
            out.append(_figures_section(comparison, kind, rank, where))
            explaining = comparison.explaining_roles(kind, rank)
            out.append(Section(
                f"{where}: the roles that explain the difference (largest time delta first)",
                ("role", "Δ time", "Δ kernels", "time A", "time B"),
                [(printable(r.role), signed_duration(r.ns_delta), signed_count(r.delta), duration(r.ns_a),
                  duration(r.ns_b)) for r in explaining],
                None if explaining else "no role differs in kernels or time",
            ))
            out.append(Section(
                f"{where}: per role (median per step)",
                ("role", "kernels A", "kernels B", "Δ kernels", "time A", "time B", "Δ time"),
                [(printable(r.role), count(r.kernels_a), count(r.kernels_b), signed_count(r.delta), duration(r.ns_a),
                  duration(r.ns_b), signed_duration(r.ns_delta)) for r in comparison.role_rows(kind, rank)],
            ))
            out.append(_layers_section(comparison, kind, rank, where, detail=layer_detail))
    return out


def _figures_section(comparison: Comparison, kind: str, rank: int, where: str) -> Section:
    rows = []
    for name, label, unit in STEP_FIGURES:
        a, b, delta = comparison.figure(name, kind, rank)
        rows.append((label, figure_value(unit, a), figure_value(unit, b), figure_value(unit, delta, signed=True)))
    return Section(f"{where}: per step (median over the steady-state steps)", ("figure", "A", "B", "B - A"), rows)


def _layers_section(comparison: Comparison, kind: str, rank: int, where: str, *, detail: bool) -> Section:
    frame = comparison.layer_rows(kind, rank)
    if frame.height == 0:
        return Section(f"{where}: per layer", (), [], "no kernel has a layer in both traces (no layer attribution)")
    layers_a = frame.filter(frame["kernels_a"].is_not_null()).height
    layers_b = frame.filter(frame["kernels_b"].is_not_null()).height
    rows: list[tuple[str, ...]] = []
    groups = _layer_groups(frame.rows(named=True), detail)
    for first, last, members in groups:
        label = str(first) if first == last else f"{first}-{last}"
        row = members[0]
        mean = (lambda key: None if row[key] is None else sum(m[key] for m in members) / len(members))
        rows.append((label, count(row["kernels_a"]), count(row["kernels_b"]), signed_count(row["delta"]),
                     duration(mean("ns_a")), duration(mean("ns_b"))))
    note = (f"{layers_a} layers in A, {layers_b} in B; kernels per layer, time per layer "
            f"{'(median per step)' if detail else '(mean over the layers of a row, median per step)'}")
    return Section(f"{where}: per layer", ("layers", "kernels A", "kernels B", "Δ kernels", "time A", "time B"),
                   rows, note)


def _layer_groups(rows: list[dict], detail: bool) -> list[tuple[int, int, list[dict]]]:
    """Consecutive layers with the same kernels on both sides, as (first, last, rows)."""
    groups: list[tuple[int, int, list[dict]]] = []
    for row in rows:
        if groups and not detail:
            first, last, members = groups[-1]
            same = (members[0]["kernels_a"], members[0]["kernels_b"]) == (row["kernels_a"], row["kernels_b"])
            if same and row["layer"] == last + 1:
                groups[-1] = (first, row["layer"], [*members, row])
                continue
        groups.append((row["layer"], row["layer"], [row]))
    return groups


# ---- terminal --------------------------------------------------------------------------------

def render_compare(comparison: Comparison, width: int | None = None) -> str:
    """The comparison for the terminal, every line at most `width` columns (default: the terminal's)."""
    width = width or terminal_width()
    lines = [click.style(headline(comparison), bold=True), *side_lines(comparison),
             comparison.steady_rule + "; deltas are B - A"]
    lines += [f"note: {n}" for n in comparison.notes]
    prose = fit_lines(lines, width)
    for section in sections(comparison):
        prose += ["", *fit_lines([click.style(section.title, bold=True)], width)]
        if section.rows:
            prose += fit_table([section.header, *section.rows], width, keys=1)
        if section.note:
            prose += fit_lines(["  " + section.note], width)
    return "\n".join(prose)
