"""The small timeline tables: [gaps], [h2d], [graphs], [ranks].

Each may be left out; the readers then return what the checks take as "not declared"
(a 2 µs gap threshold, any H2D copies, graph launches and rank spread unchecked), and the
writers leave a table out when it holds only those defaults.
"""

from __future__ import annotations

from typing import Any

from nsys_ledger.ledger.model import Expectations, H2DRule, Range, StepEntryGaps
from nsys_ledger.ledger.reading import LedgerReader
from nsys_ledger.ledger.writing import LedgerWriter, range_value

DEFAULT_GAP_US = 2.0  # the seed's threshold
DEFAULT_H2D = H2DRule(Range(None, None), None, True)  # no [h2d]: any copies
GAPS_KEYS = ("threshold_us", "step_entry_per_launch", "step_entry_max_us", "allowed_per_step")
H2D_KEYS = ("per_step", "max_bytes", "pageable_allowed")
GRAPHS_KEYS = ("launches_per_step",)
RANKS_KEYS = ("max_imbalance_pct",)


def _us(ns: int) -> int | float:
    """Nanoseconds as the microseconds a ledger writes (2000 -> 2, 1500 -> 1.5)."""
    return ns // 1000 if ns % 1000 == 0 else ns / 1000


# ---- [gaps] -----------------------------------------------------------------------------


def read_gaps(reader: LedgerReader, doc: dict[str, Any]) -> tuple[int, StepEntryGaps | None]:
    """(gap threshold in ns, the step-entry gaps a graph launch may cause)."""
    return read_gap_threshold(reader, doc), read_step_entry_gaps(reader, doc)


def read_gaps_allowed(reader: LedgerReader, doc: dict[str, Any]) -> int:
    """[gaps] allowed_per_step: gaps above the threshold a step may have (default 0)."""
    table = reader.table(doc, "gaps", "gaps") or {}
    if "allowed_per_step" not in table:
        return 0
    reader.keep("gaps.allowed_per_step", table["allowed_per_step"])
    allowed = reader.whole(table["allowed_per_step"], "gaps.allowed_per_step")
    if allowed < 0:
        raise reader.fail("gaps.allowed_per_step", f"must be 0 or more, got {allowed}")
    return allowed


def read_gap_threshold(reader: LedgerReader, doc: dict[str, Any]) -> int:
    table = reader.table(doc, "gaps", "gaps")
    if table is None:
        return int(DEFAULT_GAP_US * 1000)
    reader.known(table, "gaps", GAPS_KEYS)
    if "threshold_us" not in table:
        raise reader.fail("gaps.threshold_us", "missing required key 'threshold_us' in [gaps]")
    reader.keep("gaps.threshold_us", table["threshold_us"])
    us = reader.number(table["threshold_us"], "gaps.threshold_us")
    if us <= 0:
        raise reader.fail("gaps.threshold_us", f"must be positive, got {us:g}")
    return int(round(us * 1000))


def read_step_entry_gaps(reader: LedgerReader, doc: dict[str, Any]) -> StepEntryGaps | None:
    table = reader.table(doc, "gaps", "gaps") or {}
    if "step_entry_per_launch" not in table:
        if "step_entry_max_us" in table:
            raise reader.fail("gaps.step_entry_max_us", "give step_entry_per_launch with it")
        return None
    reader.keep("gaps.step_entry_per_launch", table["step_entry_per_launch"])
    per_launch = reader.whole(table["step_entry_per_launch"], "gaps.step_entry_per_launch")
    max_ns = None
    if "step_entry_max_us" in table:
        reader.keep("gaps.step_entry_max_us", table["step_entry_max_us"])
        max_us = reader.number(table["step_entry_max_us"], "gaps.step_entry_max_us")
        if max_us <= 0:
            raise reader.fail("gaps.step_entry_max_us", f"must be positive, got {max_us:g}")
        max_ns = int(round(max_us * 1000))
    return StepEntryGaps(per_launch=per_launch, max_ns=max_ns)


def write_gaps(out: LedgerWriter, exp: Expectations) -> None:
    default = exp.gap_threshold_ns == int(DEFAULT_GAP_US * 1000) and not exp.gaps_allowed_per_step
    if default and exp.step_entry_gaps is None and not (out.has("gaps.threshold_us") or out.commented("gaps")):
        return
    out.table("gaps")

    def microseconds(key: str, ns: int) -> Any:
        return out.as_written(key, ns, lambda raw: int(round(out.reader.number(raw, key) * 1000)), _us(ns))

    out.value("gaps", "threshold_us", microseconds("gaps.threshold_us", exp.gap_threshold_ns))
    entry = exp.step_entry_gaps
    if entry is not None:
        key = "gaps.step_entry_per_launch"
        out.value("gaps", "step_entry_per_launch",
                  out.as_written(key, entry.per_launch, lambda raw: out.reader.whole(raw, key), entry.per_launch))
        if entry.max_ns is not None:
            out.value("gaps", "step_entry_max_us", microseconds("gaps.step_entry_max_us", entry.max_ns))
    if exp.gaps_allowed_per_step:
        out.value("gaps", "allowed_per_step", exp.gaps_allowed_per_step)


# ---- [h2d] ------------------------------------------------------------------------------


def read_h2d(reader: LedgerReader, doc: dict[str, Any]) -> H2DRule:
    table = reader.table(doc, "h2d", "h2d")
    if table is None:
        return DEFAULT_H2D
    reader.known(table, "h2d", H2D_KEYS)
    per_step = Range(None, None)
    if "per_step" in table:
        reader.keep("h2d.per_step", table["per_step"])
        per_step = reader.range_value(table["per_step"], "h2d.per_step")
    max_bytes = None
    if "max_bytes" in table:
        reader.keep("h2d.max_bytes", table["max_bytes"])
        max_bytes = reader.whole(table["max_bytes"], "h2d.max_bytes")
    pageable = reader.get(table, "pageable_allowed", "h2d", bool, default=True)
    return H2DRule(per_step, max_bytes, pageable)


def write_h2d(out: LedgerWriter, exp: Expectations) -> None:
    rule = exp.h2d
    if rule == DEFAULT_H2D and not out.commented("h2d"):
        return
    out.table("h2d")
    if rule.per_step != Range(None, None):
        out.value("h2d", "per_step", written_range(out, "h2d.per_step", rule.per_step))
    if rule.max_bytes is not None:
        out.value("h2d", "max_bytes", out.as_written(
            "h2d.max_bytes", rule.max_bytes, lambda raw: out.reader.whole(raw, "h2d.max_bytes"), rule.max_bytes))
    if not rule.pageable_allowed or out.has("h2d.pageable_allowed"):
        out.value("h2d", "pageable_allowed", rule.pageable_allowed)


def written_range(out: LedgerWriter, key: str, r: Range) -> Any:
    """A RANGE value: the file's own form where kept and still right, else compact numbers."""
    return out.as_written(key, r, lambda raw: out.reader.range_value(raw, key), range_value(r))


# ---- [graphs] ---------------------------------------------------------------------------


def read_graphs(reader: LedgerReader, doc: dict[str, Any]) -> Range | None:
    """Graph launches per step; None: not checked (eager deployments)."""
    table = reader.table(doc, "graphs", "graphs")
    if table is None:
        return None
    reader.known(table, "graphs", GRAPHS_KEYS)
    if "launches_per_step" not in table:
        return None
    reader.keep("graphs.launches_per_step", table["launches_per_step"])
    return reader.range_value(table["launches_per_step"], "graphs.launches_per_step")


def write_graphs(out: LedgerWriter, exp: Expectations) -> None:
    if exp.graph_launches_per_step is None:
        return
    out.table("graphs")
    out.value("graphs", "launches_per_step",
              written_range(out, "graphs.launches_per_step", exp.graph_launches_per_step))


# ---- [ranks] ----------------------------------------------------------------------------


def read_ranks(reader: LedgerReader, doc: dict[str, Any]) -> float | None:
    """The most the slowest rank's busy time may exceed the least busy one's, in %."""
    table = reader.table(doc, "ranks", "ranks")
    if table is None:
        return None
    reader.known(table, "ranks", RANKS_KEYS)
    if "max_imbalance_pct" not in table:
        return None
    reader.keep("ranks.max_imbalance_pct", table["max_imbalance_pct"])
    pct = reader.number(table["max_imbalance_pct"], "ranks.max_imbalance_pct")
    if pct < 0:
        raise reader.fail("ranks.max_imbalance_pct", f"must be >= 0, got {pct:g}")
    return float(pct)


def write_ranks(out: LedgerWriter, exp: Expectations) -> None:
    pct = exp.rank_imbalance_pct
    if pct is None:
        return
    out.table("ranks")
    key = "ranks.max_imbalance_pct"
    plain = int(pct) if float(pct).is_integer() else pct
    out.value("ranks", key.split(".")[1], out.as_written(key, pct, lambda raw: float(out.reader.number(raw, key)), plain))
