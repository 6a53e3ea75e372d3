"""The verdict of `check` on every bundled sample trace, with the seed's literal figures."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

import nsys_ledger

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


def run(name: str, expectations, **options):
    return nsys_ledger.check(SAMPLES / name, expectations, **options)


def op_column(result, op: str) -> list[int]:
    return result.op_table[op].to_list()


def failing_checks(result) -> set[str]:
    return {f.check for f in result.findings}


def test_healthy_graph_sample_passes_with_the_seed_figures(expectations):
    result = run("glm5-graph-healthy.sqlite", expectations)
    assert result.verdict == "pass"
    assert result.exit_code == 0
    assert result.findings == []
    assert result.steps.method == "graph"
    assert result.step_table.height == 4
    assert result.step_table["kernels"].to_list() == [2077] * 4
    assert op_column(result, "fused_add_rmsnorm") == [156] * 4
    assert op_column(result, "sparse_mla") == [78] * 4
    assert op_column(result, "paged_mqa_logits") == [21] * 4
    assert op_column(result, "per_token_group_quant") == [75] * 4
    assert op_column(result, "sampling") == [1] * 4
    assert result.step_table["graph_launches"].to_list() == [1] * 4
    assert result.step_table["h2d"].to_list() == [3] * 4
    assert result.step_table["gaps"].to_list() == [0] * 4
    assert all(1800 <= k <= 2200 for k in result.step_table["kernels"])
    # eager prefill, warm-up and capture are not decode steps, and are counted as excluded
    assert result.steps.excluded.height >= 1
    assert set(result.steps.excluded["reason"].to_list()) == {
        "eager work without a graph launch (prefill, warm-up or capture)"
    }


def test_every_healthy_kernel_has_an_op(expectations):
    result = run("glm5-graph-healthy.sqlite", expectations)
    assert op_column(result, "other") == [0] * 4


def test_broken_fusion_names_the_quant_anchor_and_the_fusion_hint(expectations):
    result = run("glm5-graph-broken-fusion.sqlite", expectations)
    assert result.verdict == "fail" and result.exit_code == 1
    anchors = [f for f in result.findings if f.check == "anchor"]
    assert len(anchors) == 1
    finding = anchors[0]
    assert (finding.check, finding.subject, finding.source) == (
        "anchor", "per_token_group_quant", "anchors.per_token_group_quant"
    )
    assert finding.observed == "231"  # 75 + one extra after each of the 156 norms
    assert finding.expected.startswith("75")
    assert finding.steps == "0-3"
    assert "fusion broke" in finding.hint
    # the per-layer ledger: one extra quant after each norm, at its place in the sequence
    # (layer 0 opens with a plain RMSNorm, so only its post-attention norm gets one): the two
    # faults of each class, each once, not an ffn count per layer set
    layers = [(f.check, f.layers, f.subject, f.observed) for f in result.findings if f.check.startswith("layer")]
    assert layers == [("layer_sequence", "0-2", "per_token_group_quant", "+ per_token_group_quant"),
                      ("layer_sequence", "1-2", "per_token_group_quant", "+ per_token_group_quant"),
                      ("layer_sequence", "3-77", "per_token_group_quant", "+ per_token_group_quant"),
                      ("layer_sequence", "3-77", "per_token_group_quant", "+ per_token_group_quant")]
    messages = [f.message for f in result.findings if f.check == "layer_sequence"]
    assert messages[2].startswith("layers 3-77: + `per_token_group_quant` after `fused_add_rmsnorm` "
                                  "(after moe sequence entry 1 of 27)")
    assert messages[3].startswith("layers 3-77: + `per_token_group_quant` after `fused_add_rmsnorm` "
                                  "(after moe sequence entry 15 of 27)")


def test_chunked_indexer_names_paged_mqa_logits(expectations):
    result = run("glm5-graph-chunked-indexer.sqlite", expectations)
    assert [(f.subject, f.observed) for f in result.findings] == [("paged_mqa_logits", "63"), ("indexer", "9")]
    assert "chunked" in result.findings[0].hint
    # per layer: the 21 full indexer layers launch 9 indexer kernels instead of 6-7
    per_layer = result.findings[1]
    assert per_layer.layers == "0-2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, 70, 74"
    assert "`paged_mqa_logits` x3" in per_layer.message


def test_extra_gaps_are_found_in_every_step(expectations):
    result = run("glm5-graph-extra-gaps.sqlite", expectations)
    assert failing_checks(result) == {"gaps"}
    assert result.step_table["gaps"].to_list() == [3] * 4
    # the three injected idle intervals are 6.5, 17 and 36 us long (plus the normal 0.5-1 us)
    inside = result.gaps.filter((pl.col("step") == 0) & ~pl.col("step_entry"))  # not the allowed launch gap
    durations = sorted(inside["duration"].to_list())
    assert [round(d / 1000) for d in durations] == [7, 18, 37]


def test_extra_h2d_copy_is_a_finding(expectations):
    result = run("glm5-graph-extra-h2d.sqlite", expectations)
    assert [(f.check, f.observed, f.expected) for f in result.findings] == [("h2d", "4", "3")]


def test_pageable_h2d_copy_is_a_finding(expectations):
    result = run("glm5-graph-pageable-h2d.sqlite", expectations)
    assert "h2d_pageable" in failing_checks(result)
    assert result.step_table["h2d_pageable"].to_list() == [1] * 4


def test_split_graph_is_two_launches_in_one_step(expectations):
    result = run("glm5-graph-split-graph.sqlite", expectations)
    assert "graph_break" in failing_checks(result)  # too many launches: a graph break (checks.timeline)
    assert result.step_table.height == 4  # still four steps, not eight half steps
    assert result.step_table["graph_launches"].to_list() == [2] * 4
    assert result.step_table["kernels"].to_list() == [2077] * 4


def test_two_rank_sample_has_steps_per_rank(expectations):
    result = run("glm5-graph-2ranks-slow-rank1.sqlite", expectations)
    # every per-step count passes; rank 1's 20% slower kernels are the one finding ([ranks])
    assert [f.check for f in result.findings] == ["rank_imbalance"]
    assert result.step_table.group_by("rank").len().sort("rank")["len"].to_list() == [3, 3]
    assert result.totals.kernels_by_device.keys() == {0, 1}


def test_eager_sample_steps_by_marker_and_is_host_bound(expectations):
    result = run("glm5-eager-healthy.sqlite", expectations)
    assert result.steps.method == "marker"
    assert result.step_table.height == 4
    assert result.steps.excluded["reason"].to_list() == ["contains prefill_attention (not a decode step)"]
    assert op_column(result, "fused_add_rmsnorm") == [156] * 4
    # eager decode: one launch call per kernel plus the three copies
    assert result.step_table["cpu_submissions"].to_list() == [2080] * 4
    assert failing_checks(result) == {"gaps"}  # the GPU waits for the host between kernels
    assert min(result.step_table["gaps"]) > 1000


def test_eager_sample_steps_by_nvtx_range(expectations):
    result = run("glm5-eager-healthy.sqlite", expectations, step_nvtx=r"^decode")
    assert result.steps.method == "nvtx"
    assert result.step_table.height == 4
    assert result.step_table["kernels"].to_list() == [2077] * 4


def test_eager_prefill_range_is_excluded_by_the_nvtx_rule(expectations):
    result = run("glm5-eager-healthy.sqlite", expectations, step_nvtx=r"^(decode|prefill)")
    assert result.step_table.height == 4
    reasons = result.steps.excluded["reason"].to_list()
    assert len(reasons) == 1 and reasons[0].startswith("contains prefill_attention")


def test_layer_fault_shows_one_extra_kernel_per_step(expectations):
    result = run("glm5-graph-layer41.sqlite", expectations)
    assert result.step_table["kernels"].to_list() == [2078] * 4
    # 2078 is inside the 1800-2200 total and every anchor holds: only the per-layer ledger sees
    # it. Layer 41 launches 15 attention kernels (inside 12-16) where its peers launch 14; its
    # kernel sequence says where: one finding, at the place after the output absorption bmm
    # (moe entry 12), not one per group count it shifts.
    assert result.verdict == "fail"
    assert [(f.check, f.layers, f.subject, f.observed, f.steps) for f in result.findings] == [
        ("layer_sequence", "41", "elementwise_kernel", "+ elementwise_kernel", "0-3")
    ]
    assert result.findings[0].message.startswith(
        "layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12 of 27), in 4 of 4 steps")
