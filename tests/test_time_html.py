"""The HTML report's time: the 'Where the time goes' section, the layer heatmap's launches/µs
switch, and the offending kernel marked in the step timeline (report/time_html.py)."""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
from functools import cache
from pathlib import Path

import polars as pl

from nsys_ledger.api import check
from nsys_ledger.report.html import render_html
from nsys_ledger.report.time_html import offending_kernels

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GLM = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"
LAYER41 = SAMPLES / "glm5-graph-layer41.sqlite"


@cache
def checked(path: Path):
    return check(path, GLM)


@cache
def page(path: Path) -> str:
    return render_html(checked(path))


def _figure(html: str, figure_id: str) -> dict:
    match = re.search(rf'<script type="application/json" data-figure="{figure_id}">(.*?)</script>', html, re.S)
    assert match, figure_id
    return json.loads(match.group(1))


def test_time_section_with_per_step_table_and_top_kernels():
    html = page(LAYER41)
    section = html.split('<h2 id="time">Where the time goes</h2>')[1].split("<h2 ")[0]
    assert "<h3>The seed's three columns in time, communication, launch delay and copies</h3>" in section
    assert "4 decode step(s)" in section
    assert "one row per full name" in section


def test_layer_heatmap_switches_between_launches_and_us():
    result = checked(LAYER41)
    fig = _figure(page(LAYER41), "layer-time")
    buttons = fig["layout"]["updatemenus"][0]["buttons"]
    assert [b["label"] for b in buttons] == ["launches per step", "µs per step"]
    heatmap = fig["data"][0]
    groups, layers = heatmap["y"], heatmap["x"]
    attention, layer41 = groups.index("attention"), layers.index(41)
    launches = buttons[0]["args"][0]["z"][0]
    micros = buttons[1]["args"][0]["z"][0]
    assert launches[attention][layer41] == 15 and launches[attention][layers.index(40)] == 14
    # µs: the median over the steps of the layer's attention kernels, summed from the raw rows
    kernels = result.steps.activities.filter(pl.col("decode") & (pl.col("activity") == "kernel")).join(
        result.layers.assignments.select("row", "layer", "layer_group"), on="row")
    per_step = [
        int((part["end"] - part["start"]).sum())
        for _, part in kernels.filter((pl.col("layer") == 41) & (pl.col("layer_group") == "attention"))
        .group_by("step", maintain_order=True)
    ]
    assert micros[attention][layer41] == statistics.median(per_step) / 1000
    assert heatmap["z"] == launches  # launches first


def test_op_time_chart_against_sql():
    path = SAMPLES / "glm5-graph-healthy.sqlite"
    result = checked(path)
    fig = _figure(page(path), "time-per-op")
    bars = dict(zip(fig["data"][0]["y"], fig["data"][0]["x"]))
    names = result.time_use.kernels.filter(pl.col("op") == "moe_gemm")["name"].to_list()
    low, high = result.step_table["host_start"].min(), result.step_table["host_end"].max()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (total,) = con.execute(
        'SELECT sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName '
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = "
        f"(k.globalPid >> 24) WHERE r.start BETWEEN ? AND ? AND s.value IN ({','.join('?' * len(names))})",
        (low, high, *names)).fetchone()
    con.close()
    assert bars["moe_gemm"] == total / 4 / 1000
    assert max(bars, key=bars.get) == "moe_gemm"
    hover = dict(zip(fig["data"][0]["y"], fig["data"][0]["hovertext"]))
    assert hover["bmm"].startswith("bmm (role mla_absorb): ")  # the op's role from the ledger


def test_offending_kernel_of_the_layer41_fault_is_marked():
    """glm5-graph-layer41 adds one copy kernel to layer 41's attention: that kernel, and only
    it, is marked in the step timeline."""
    result = checked(LAYER41)
    step0 = result.steps.activities.filter(pl.col("decode") & (pl.col("step") == 0))
    marks = offending_kernels(result, step0)
    assert marks.height == 1
    marked = step0.join(marks, on="row").join(result.layers.assignments.select("row", "layer"), on="row").row(
        0, named=True)
    assert marked["layer"] == 41
    assert "direct_copy_kernel_cuda" in marked["name"]
    assert marks["finding"][0].startswith("layer 41: + `elementwise_kernel` after `bmm`")
    fig = _figure(page(LAYER41), "timeline-representative")
    traces = [t for t in fig["data"] if t.get("name") == "offending kernel"]
    assert len(traces) == 1 and len(traces[0]["x"]) == 1


def test_healthy_step_timeline_marks_nothing():
    path = SAMPLES / "glm5-graph-healthy.sqlite"
    fig = _figure(page(path), "timeline-representative")
    assert not [t for t in fig["data"] if t.get("name") == "offending kernel"]
