"""`nsys-ledger diff` in time: GPU time per op and per layer, with a tolerance (diff_time.py).

Medians per step are recomputed here from plain SQL over the samples (step host windows as
the checker found them)."""

from __future__ import annotations

import json
import sqlite3
import statistics
from functools import cache
from pathlib import Path

import click
import polars as pl
from click.testing import CliRunner

from nsys_ledger.api import check
from nsys_ledger.cli import main
from nsys_ledger.diff import WorseningRule, diff_results
from nsys_ledger.report.diff_report import diff_document, render_diff

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GLM = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"
HEALTHY = SAMPLES / "glm5-graph-healthy.sqlite"
BROKEN = SAMPLES / "glm5-graph-broken-fusion.sqlite"


@cache
def checked(path: Path):
    return check(path, GLM)


def _median_op_us(path: Path, op: str) -> float:
    """Median over the decode steps of the summed durations of the op's kernel names, in µs."""
    result = checked(path)
    names = result.time_use.kernels.filter(pl.col("op") == op)["name"].to_list()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    per_step = []
    for low, high in result.step_table.select("host_start", "host_end").rows():
        (ns,) = con.execute(
            'SELECT coalesce(sum(k."end" - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON '
            "s.id = k.demangledName JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND "
            f"(r.globalTid >> 24) = (k.globalPid >> 24) WHERE r.start BETWEEN ? AND ? AND s.value IN "
            f"({','.join('?' * len(names))})", (low, high, *names)).fetchone()
        per_step.append(ns)
    con.close()
    return statistics.median(per_step) / 1000


def test_broken_fusion_op_time_against_sql():
    diff = diff_results(checked(HEALTHY), checked(BROKEN))
    quant = [c for c in diff.op_time_changes if c.name == "op per_token_group_quant (us)"]
    assert len(quant) == 1
    assert quant[0].before == round(_median_op_us(HEALTHY, "per_token_group_quant"), 3) == 187.132
    assert quant[0].after == round(_median_op_us(BROKEN, "per_token_group_quant"), 3) == 576.697
    assert quant[0].worse_by is None  # timing gates only with a slowdown limit
    assert not any("(us)" in reason for reason in diff.reasons)
    assert diff.layer_time_changes == ()  # no layer moved by over 10%


def test_op_time_slowdown_limit_makes_after_worse():
    rule = WorseningRule(op_time_slowdown_pct=50)
    diff = diff_results(checked(HEALTHY), checked(BROKEN), rule)
    assert "op per_token_group_quant (us): 187.132 -> 576.697 (slower than 50%)" in diff.reasons
    strict = diff_results(checked(HEALTHY), checked(BROKEN), WorseningRule(op_time_slowdown_pct=250))
    assert not any("(us)" in reason for reason in strict.reasons)  # +208% is within 250%


def test_same_trace_has_no_time_change_and_tolerance_lists_small_ones():
    same = diff_results(checked(HEALTHY), checked(HEALTHY))
    assert same.op_time_changes == () and same.layer_time_changes == ()
    layer41 = check(SAMPLES / "glm5-graph-layer41.sqlite", GLM)
    loose = diff_results(checked(HEALTHY), layer41)
    tight = diff_results(checked(HEALTHY), layer41, WorseningRule(time_tolerance_pct=2.5))
    assert loose.layer_time_changes == ()
    assert [c.name for c in tight.layer_time_changes] == ["layer 63 (us)", "layer 65 (us)"]
    assert all(abs(c.change_pct) > 2.5 for c in tight.layer_time_changes)


def test_diff_reports_show_time_next_to_counts(tmp_path):
    diff = diff_results(checked(HEALTHY), checked(BROKEN))
    text = click.unstyle(render_diff(diff))
    assert "GPU time per op (median us per step; changed by over 10%)" in text
    assert "op per_token_group_quant (us)             187.132 ->      576.697  +389.565 (+208%)" in text
    doc = json.loads(json.dumps(diff_document(diff)))
    assert doc["schema_version"] == "1.1"
    assert doc["time_tolerance_pct"] == 10.0
    assert {"name": "op per_token_group_quant (us)", "kind": "op_time", "before": 187.132, "after": 576.697}.items() \
        <= [e for e in doc["op_time"] if e["name"].startswith("op per_token")][0].items()
    assert doc["layer_time"] == []


def test_cli_max_op_slowdown_exit_code():
    runner = CliRunner()
    args = ["diff", str(HEALTHY), str(BROKEN), "--expect", str(GLM), "--allow-launches", "1000"]
    assert runner.invoke(main, args).exit_code == 1  # the newly failing ledger checks
    out = runner.invoke(main, args + ["--max-op-slowdown", "50"])
    assert "op per_token_group_quant (us): 187.132 -> 576.697 (slower than 50%)" in click.unstyle(out.output)
