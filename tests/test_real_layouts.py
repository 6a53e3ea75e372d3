"""The GLM-5.3 ledger on captures written with real kernel names and real launch timing.

The samples' DeepGEMM GEMMs are spelled as real builds spell them (one of four layouts, see
shared/reference/real-kernel-names.md), a graph step waits 3-8 µs for cudaGraphLaunch after
its pinned H2D copies, and SGLang's default captures carry no layer-wise NVTX. These tests
hold the checker to what a user of such a capture must see.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.ledger import load_expectations
from nsys_ledger.report.json_report import result_document
from nsys_ledger.report.terminal import render
from nsys_ledger.synth import generate

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())


@pytest.fixture(scope="module")
def glm():
    return load_expectations(GLM)


def test_healthy_graph_sample_passes_with_its_step_entry_gap_caused_by_the_launch(glm):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", glm)
    assert result.verdict == "pass", [f.message for f in result.findings]
    entry = result.gaps.filter(pl.col("step_entry"))
    # one per step, after the step's last pinned H2D copy, before the first replayed kernel
    assert entry.select("step", "cause", "before", "after_op").rows() == [
        (step, "launch", "memcpy HtoD", "embedding") for step in range(4)
    ]
    truth = [s["entry_gap_ns"] for s in MANIFEST["glm5-graph-healthy.sqlite"]["steps"]]
    assert all(3_000 <= ns <= 8_000 for ns in truth)
    assert entry["duration"].to_list() == truth
    assert result.gaps.filter(~pl.col("step_entry")).height == 0
    table = result.step_table
    assert table["gaps"].to_list() == [0] * 4 and table["step_entry_gaps"].to_list() == [1] * 4
    # the launch wait is host time in the step budget
    assert (table["host_ns"] == table["step_entry_gap_ns"]).all()
    text = click.unstyle(render(result, width=1000))  # unwrapped: the sentences whole
    lo, hi = min(truth) / 1000, max(truth) / 1000
    assert f"0 (+1 step-entry gap, {lo:.1f}-{hi:.1f} us)" in text
    doc = result_document(result)
    assert [g["cause"] for g in doc["timeline"]["gaps"]] == ["launch"] * 4
    assert [g["step_entry"] for g in doc["timeline"]["gaps"]] == [True] * 4


@pytest.mark.parametrize(
    ("sample", "cause"), [("glm5-graph-extra-gaps.sqlite", "unknown"), ("glm5-graph-boundary-gap.sqlite", "graph_boundary")]
)
def test_a_gap_inside_the_replay_still_fails(glm, sample, cause):
    """Device-side delays of 6.5-36 µs inside the replay, and a ~5 µs wait between the two
    replays of a split graph: not the step entry, so findings."""
    result = nsys_ledger.check(SAMPLES / sample, glm)
    finding = next(f for f in result.findings if f.check == "gaps")
    inside = result.gaps.filter(~pl.col("step_entry"))
    assert set(inside["cause"]) == {cause}
    assert inside["duration"].min() > 5_000
    assert f"by cause: {cause}" in finding.message
    assert result.gaps.filter(pl.col("step_entry")).height == 4  # the entry gaps stay allowed


def test_without_the_allowance_the_entry_gap_is_a_launch_finding(glm):
    import dataclasses

    strict = dataclasses.replace(glm, step_entry_gaps=None)
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", strict)
    finding = next(f for f in result.findings if f.check == "gaps")
    assert "by cause: launch 4" in finding.message
    assert finding.hint.startswith("mostly launch: the GPU waited for the host's cudaGraphLaunch")


@pytest.mark.parametrize("layout", ["2025-02", "2025-07", "sglang-2026"])
def test_layers_inferred_without_nvtx_for_each_deepgemm_layout(tmp_path, glm, layout):
    """SGLang's default capture has no layer NVTX: with real GEMM names every step still gets
    all 78 layers, and the layer-41 fault is named by layer and op."""
    healthy = tmp_path / "healthy.sqlite"
    generate(healthy, mode="graph", steps=2, layerwise_nvtx=False, deepgemm_layout=layout)
    result = nsys_ledger.check(healthy, glm)
    assert result.verdict == "pass", [f.message for f in result.findings]
    counts = result.layers.counts
    assert counts.group_by("step").agg(pl.col("layer").n_unique()).sort("step")["layer"].to_list() == [78, 78]
    assert result.layers.inferred.select("confidence", "cut_by").rows() == [("exact", "anchor")] * 2
    assert result.coverage.kernels("no_op") == 0

    faulted = tmp_path / "layer41.sqlite"
    generate(faulted, mode="graph", steps=2, layerwise_nvtx=False, deepgemm_layout=layout, faults=("layer_fault",))
    result = nsys_ledger.check(faulted, glm)
    assert [(f.check, f.layers, f.subject) for f in result.findings] == [("layer_sequence", "41", "elementwise_kernel")]
    assert result.findings[0].message.startswith(
        "layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12 of 27), in 2 of 2 steps")


def test_b200_dense_gemms_fall_back_and_say_so(tmp_path, glm):
    """sm100 dense DeepGEMM names show `0u, 0u, 0u`: the projections cannot be told apart by
    name, so the generic fallback claims them and their place in the layer's sequence gives
    them their op; the op coverage counts what stays generic (the shared expert's and the dense
    MLP's GEMMs, which the sequence itself calls deepgemm_dense)."""
    path = tmp_path / "b200.sqlite"
    generate(path, mode="graph", steps=2, deepgemm_layout="b200")
    result = nsys_ledger.check(path, glm)
    coverage = result.coverage
    fallback = coverage.top("fallback", 20)
    dense = fallback.filter(pl.col("op") == "deepgemm_dense")
    assert dense["per_step"].sum() == 2 * 75 + 2 * 3  # shared gate_up/down, dense gate_up/down
    ops = result.op_table
    assert set(ops["qkv_a_proj"]) == set(ops["q_b_proj"]) == set(ops["o_proj"]) == {78}
    assert result.layers.kernels_by_how()["capture_nvtx"] > 0
    # with the capture-time module NVTX the fallback GEMMs still count in their layer's group
    assert result.verdict == "pass", [f.message for f in result.findings]


def test_op_coverage_in_terminal_json_and_html(glm):
    """How much of the step the ledger names: 1920 kernels per step by a specific op, 157 only by
    a fallback (the shared expert's and dense MLP's DeepGEMM GEMMs, 75 + 75 + 3 + 3, and the LM
    head), none unnamed. The cuBLAS absorption bmms, the router and the indexer's wk GEMM
    (tile-named) get their op from their place in the layer's sequence."""
    from nsys_ledger.report.html import render_html

    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", glm)
    cov = result.coverage
    assert (cov.kernels("specific"), cov.kernels("fallback"), cov.kernels("no_op")) == (4 * 1920, 4 * 157, 0)
    text = click.unstyle(render(result, width=1000))  # unwrapped: the sentences whole
    # integers as integers: the counts per step are whole here
    assert ("ops       2,077 decode kernels per step: specific op 1,920 (92.4%), generic fallback 157 (7.6%), "
            "no op 0 (0.0%)") in text
    assert "fallback      75/step  deepgemm_dense: deep_gemm::sm90_fp8_gemm_1d2d_impl (N=4096 K=6144, normal)" in text
    doc = result_document(result)["op_coverage"]
    assert (doc["decode_kernels"], doc["steps"]) == (8308, 4)
    assert doc["specific"] == {"kernels": 7680, "per_step": 1920.0, "share": 0.9244}
    assert doc["no_op"]["kernels"] == 0 and doc["top_no_op"] == []
    assert [(t["op"], t["per_step"]) for t in doc["top_fallback"][:2]] == [("deepgemm_dense", 75.0)] * 2
    page = render_html(result)
    assert '<h2 id="op-coverage">Op coverage</h2>' in page and "only a generic fallback op" in page

    # a kernel no op names shows up as such, per step
    layer41 = nsys_ledger.check(SAMPLES / "glm5-graph-layer41.sqlite", glm)
    assert layer41.coverage.to_dict()["top_no_op"][0]["per_step"] == 1.0
    assert "no op          1/step  at::native::elementwise_kernel" in click.unstyle(render(layer41, width=1000))
