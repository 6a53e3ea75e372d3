"""Layer attribution end to end: every decode kernel's layer against the generator's truth.

The truth is the generator's: `step_layer_kernels` in sample_traces/manifest.json (kernels per
decoder layer per decode step) and the reference schedule's own order of kernels, which is the
issue order of an eager step and the node order of the captured graph.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.checks.layers import layer_figures
from nsys_ledger.errors import ExpectationsError
from nsys_ledger.report.json_report import result_document
from nsys_ledger.report.terminal import render
from nsys_ledger.synth import generate
from nsys_ledger.synth.schedule import decode_schedule
from shared_data import REAL_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
LLAMA3 = REAL_TRACES / "Sh1mwww__llama3-inference__real_inference_simulation.sqlite"


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def results(expectations):
    cache: dict[str, nsys_ledger.Result] = {}

    def get(sample: str) -> nsys_ledger.Result:
        if sample not in cache:
            cache[sample] = nsys_ledger.check(SAMPLES / sample, expectations)
        return cache[sample]

    return get


def kernels_per_layer(result) -> dict[tuple[int, int], list[int]]:
    """(rank, step) -> kernels in each layer 0..77 (0 where a layer got none)."""
    totals = result.layers.counts.group_by("rank", "step", "layer").agg(pl.col("count").sum())
    out: dict[tuple[int, int], list[int]] = {}
    for rank, step in result.step_table.select("rank", "step").iter_rows():
        rows = dict(totals.filter((pl.col("rank") == rank) & (pl.col("step") == step)).select("layer", "count").iter_rows())
        out[(rank, step)] = [rows.get(layer, 0) for layer in range(78)]
    return out


def decode_kernel_layers(result) -> pl.DataFrame:
    """Decode kernels with their layer, graph node and launch time."""
    activities = result.steps.activities.filter(pl.col("decode").fill_null(False) & (pl.col("activity") == "kernel"))
    return activities.select("row", "rank", "step", "graph_node_id", "api_start", "start", "name").join(
        result.layers.assignments.select("row", "layer", "how"), on="row"
    )


# ---- NVTX: at capture time for graph kernels, at launch for eager ones --------------------


@pytest.mark.parametrize("sample, how, steps", [
    ("glm5-graph-healthy.sqlite", "capture_nvtx", 4),
    ("glm5-graph-multi-capture.sqlite", "capture_nvtx", 4),
    ("glm5-graph-split-graph.sqlite", "capture_nvtx", 4),
    ("glm5-graph-2ranks-slow-rank1.sqlite", "capture_nvtx", 6),
    ("glm5-eager-healthy.sqlite", "replay_nvtx", 4),
])
def test_per_layer_counts_equal_the_generator_truth(results, sample, how, steps):
    result = results(sample)
    truth = MANIFEST[sample]["step_layer_kernels"]
    assert len(truth) == 78 and sum(truth) == 2073
    per_layer = kernels_per_layer(result)
    assert len(per_layer) == steps
    assert all(counts == truth for counts in per_layer.values())
    outside = MANIFEST[sample]["step_outside_layer_kernels"]
    assert outside == 4  # embedding, final norm, LM head, sampling
    assert result.layers.kernels_by_how() == {
        "replay_nvtx": 0, "capture_nvtx": 0, "inferred": 0, how: 2073 * steps, "none": outside * steps,
    }
    assert result.layers.share_with_layer >= 0.99
    assert result.layers.inferred_steps == 0


def test_every_graph_kernel_gets_the_layer_it_was_captured_in(results):
    """Node by node: the exec nodes of the decode graph are the schedule's kernels in order."""
    result = results("glm5-graph-healthy.sqlite")
    kernels = decode_kernel_layers(result).filter(pl.col("graph_node_id").is_not_null())
    schedule_layers = [k.layer for k in decode_schedule(32).kernels]
    assert len(schedule_layers) == 2076
    for step in range(4):
        in_node_order = kernels.filter(pl.col("step") == step).sort("graph_node_id")["layer"].to_list()
        assert in_node_order == schedule_layers
    # in the graph but outside the layers: embedding, final norm, LM head
    assert dict(kernels.group_by("how").len().iter_rows()) == {"capture_nvtx": 4 * 2073, "none": 4 * 3}


def test_sub_modules_decide_the_group_of_generic_kernels(results):
    """The indexer's `wk` GEMM is a cuBLAS kernel (op cublas_gemm, group attention); under
    `self_attn.indexer.wk` it counts as indexer: 14 attention + 7 indexer on a full layer."""
    counts = results("glm5-graph-healthy.sqlite").layers.counts.filter((pl.col("step") == 0) & (pl.col("layer") == 6))
    assert dict(counts.select("group", "count").iter_rows()) == {"attention": 14, "deepep": 2, "ffn": 9, "indexer": 7}


def test_healthy_samples_pass_the_per_layer_ledger(results):
    for sample in ("glm5-graph-healthy.sqlite", "glm5-graph-multi-capture.sqlite", "glm5-eager-healthy.sqlite",
                   "glm5-eager-no-nvtx.sqlite", "glm5-graph-2ranks-slow-rank1.sqlite"):
        layer_outcomes = [o for o in results(sample).outcomes if o.source.startswith("layers")]
        assert len(layer_outcomes) == 10, sample  # 2 class sequences, 6 class groups, undeclared groups, uniform
        assert all(o.passed for o in layer_outcomes), sample


# ---- inference without NVTX --------------------------------------------------------------


def test_eager_trace_without_nvtx_infers_the_nvtx_truth(results):
    inferred = results("glm5-eager-no-nvtx.sqlite")
    assert inferred.totals.nvtx_ranges == 0
    assert inferred.layers.inferred_steps == 4
    assert inferred.layers.kernels_by_how() == {
        "replay_nvtx": 0, "capture_nvtx": 0, "inferred": 4 * 2073, "none": 4 * 4,
    }
    truth = MANIFEST["glm5-eager-no-nvtx.sqlite"]["step_layer_kernels"]
    assert all(counts == truth for counts in kernels_per_layer(inferred).values())
    # the same per-layer counts as the NVTX ranges of the eager sample give
    with_nvtx = kernels_per_layer(results("glm5-eager-healthy.sqlite"))
    assert kernels_per_layer(inferred) == with_nvtx
    # kernel by kernel: in launch order, the layers of the reference schedule
    schedule_layers = [k.layer for k in decode_schedule(32, alt_streams=False).kernels] + [None]
    kernels = decode_kernel_layers(inferred)
    for step in range(4):
        assert kernels.filter(pl.col("step") == step).sort("api_start")["layer"].to_list() == schedule_layers


def test_inference_without_nvtx_on_graph_replays(tmp_path, expectations):
    """Graph kernels are ordered by the capture time of their node, so the alt stream's kernels
    fall in the layer that issued them."""
    summary = generate(tmp_path / "g.sqlite", mode="graph", steps=2, layerwise_nvtx=False)
    result = nsys_ledger.check(tmp_path / "g.sqlite", expectations)
    assert result.layers.inferred_steps == 2
    kernels = decode_kernel_layers(result).filter(pl.col("graph_node_id").is_not_null())
    schedule_layers = [k.layer for k in decode_schedule(32).kernels]
    assert kernels.filter(pl.col("step") == 1).sort("graph_node_id")["layer"].to_list() == schedule_layers
    assert all(counts == list(summary.step_layer_kernels) for counts in kernels_per_layer(result).values())
    # without the sub-modules the names alone put the indexer's wk GEMM and the router (both
    # tile-named cuBLAS kernels) and the shared expert's down GEMM (o_proj's shape) in the
    # attention; their places in the layer's sequence give them their ops: the NVTX counts
    full_layer = result.layers.counts.filter((pl.col("step") == 0) & (pl.col("layer") == 6))
    assert dict(full_layer.select("group", "count").iter_rows()) == {"attention": 14, "deepep": 2, "ffn": 9, "indexer": 7}
    assert result.layers.edits.height == 0
    assert result.verdict == "pass"


@pytest.mark.parametrize("faults", [("broken_fusion",), ("layer_fault",), ("chunked_indexer",)])
def test_inference_tolerates_extra_kernels(tmp_path, expectations, faults):
    summary = generate(tmp_path / "f.sqlite", mode="eager", steps=2, layerwise_nvtx=False, faults=faults)
    result = nsys_ledger.check(tmp_path / "f.sqlite", expectations)
    assert all(counts == list(summary.step_layer_kernels) for counts in kernels_per_layer(result).values())
    assert sum(summary.step_layer_kernels) == {"broken_fusion": 2073 + 155, "layer_fault": 2074,
                                                "chunked_indexer": 2073 + 42}[faults[0]]


def _drop_kernels(trace, step: dict, patterns: list[str], layers: list[int]):
    """The trace without the kernels matching each pattern in the given layers of one step
    (the n-th match in issue order is layer n: each runs once per layer)."""
    kernels = trace.kernels.with_row_index("_i")
    dropped = []
    for pattern in patterns:
        hits = kernels.filter(pl.col("name").str.contains(pattern) & pl.col("start").is_between(step["start"], step["end"]))
        assert hits.height == 78, pattern
        dropped += [hits.sort("start")["_i"][layer] for layer in layers]
    return dataclasses.replace(trace, kernels=kernels.filter(~pl.col("_i").is_in(dropped)).drop("_i"))


QKV = r"\(unsigned int\)2624, \(unsigned int\)6144,"
SPARSE_MLA = r"flash_fwd_splitkv_mla_fp8_sparse_kernel"


def test_inference_survives_a_lost_projection(results, expectations):
    """Without layer 30's QKV projection in step 1 the opening rule loses a boundary, but the
    sparse MLA kernel (once per layer) still places every layer: only layer 30 is one short."""
    trace = results("glm5-eager-no-nvtx.sqlite").trace
    step1 = next(s for s in MANIFEST["glm5-eager-no-nvtx.sqlite"]["steps"] if s["index"] == 1)
    result = nsys_ledger.check(_drop_kernels(trace, step1, [QKV], [30]), expectations)
    truth = MANIFEST["glm5-eager-no-nvtx.sqlite"]["step_layer_kernels"]
    step = kernels_per_layer(result)[(0, 1)]
    assert step[:30] == truth[:30] and step[31:] == truth[31:] and step[30] == truth[30] - 1
    assert result.layers.inferred["cut_by"].to_list() == ["anchor"] * 4
    assert result.layers.inferred["confidence"].to_list() == ["exact"] * 4
    assert result.layers.notes == ()


def test_inference_repairs_a_lost_layer_boundary(results, expectations):
    """Without layer 30's QKV projection and sparse MLA kernel in step 1 both rules lose the
    boundary: layers 29 and 30 merge. The merged segment is the one furthest from its expected
    size, so the layers after it are numbered from the end and only 29/30 are off."""
    trace = results("glm5-eager-no-nvtx.sqlite").trace
    step1 = next(s for s in MANIFEST["glm5-eager-no-nvtx.sqlite"]["steps"] if s["index"] == 1)
    result = nsys_ledger.check(_drop_kernels(trace, step1, [QKV, SPARSE_MLA], [30]), expectations)
    truth = MANIFEST["glm5-eager-no-nvtx.sqlite"]["step_layer_kernels"]
    counts = kernels_per_layer(result)
    assert counts[(0, 0)] == truth and counts[(0, 2)] == truth
    step = counts[(0, 1)]
    assert step[:29] == truth[:29] and step[31:] == truth[31:]
    assert (step[29], step[30]) == (truth[29] + truth[30] - 2, 0)
    assert result.layers.inferred.filter(pl.col("step") == 1)["confidence"].to_list() == ["repaired"]
    assert result.layers.notes == (
        "layer inference cut 1 step(s) (1) into 77 layers instead of 78: the layers after layer 29 were "
        "numbered from the end",
    )


def test_inference_keeps_the_layers_it_can_place(results, expectations):
    """Three boundaries lost in step 1 (layers 10, 30 and 50 merge into their predecessors): no
    single repair fits, so the layers before the first and after the last merged segment keep
    their layer and the ones between get none, instead of no layer at all."""
    trace = results("glm5-eager-no-nvtx.sqlite").trace
    step1 = next(s for s in MANIFEST["glm5-eager-no-nvtx.sqlite"]["steps"] if s["index"] == 1)
    result = nsys_ledger.check(_drop_kernels(trace, step1, [QKV, SPARSE_MLA], [10, 30, 50]), expectations)
    truth = MANIFEST["glm5-eager-no-nvtx.sqlite"]["step_layer_kernels"]
    step = kernels_per_layer(result)[(0, 1)]
    assert step[:9] == truth[:9] and step[51:] == truth[51:]
    assert step[9:51] == [0] * 42
    assert kernels_per_layer(result)[(0, 2)] == truth
    inferred = result.layers.inferred.filter(pl.col("step") == 1)
    assert inferred.select("segments", "confidence").rows() == [(75, "partial")]
    assert result.layers.notes == (
        "layer inference cut 1 step(s) (1) into 75 layers instead of 78: confidence partial, only the layers "
        "before the first and after the last segment of an unexpected size got a layer",
    )


def test_layer_fault_found_by_inference(tmp_path, expectations):
    generate(tmp_path / "l41.sqlite", mode="graph", steps=2, layerwise_nvtx=False, faults=("layer_fault",))
    result = nsys_ledger.check(tmp_path / "l41.sqlite", expectations)
    # one finding for the one fault: the ungrouped, attention and uniform counts it shifts are
    # not reported again
    assert [(f.check, f.layers, f.subject) for f in result.findings] == [("layer_sequence", "41", "elementwise_kernel")]
    assert result.findings[0].message == (
        "layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12 of 27), in 2 of 2 steps (steps 0-1)"
    )


# ---- reports ------------------------------------------------------------------------------


def test_terminal_prints_coverage_and_inference(results):
    graph = click.unstyle(render(results("glm5-graph-healthy.sqlite"), width=1000))  # unwrapped
    assert ("layers    99.8% of 8,308 decode kernels have a layer, 78 layers (capture-time NVTX 8,292, "
            "outside any layer 16)") in graph
    assert "INFERRED" not in graph
    eager = click.unstyle(render(results("glm5-eager-no-nvtx.sqlite"), width=1000))
    assert "layers    99.8% of 8,308 decode kernels have a layer, 78 layers (inferred 8,292, outside any layer 16)" in eager
    assert ("layers INFERRED in 4 decode steps (no layer-wise NVTX range; 4 exact by anchor): each layer holds one "
            "sparse_mla and opens at the last fused_add_rmsnorm before it (layer 0 at the first fused_add_rmsnorm or "
            "rmsnorm); else a layer opens at fused_add_rmsnorm (or rmsnorm) followed by qkv_a_proj; the last "
            "fused_add_rmsnorm ends the layers") in eager


def test_json_per_layer_counts_are_compact(results):
    document = result_document(results("glm5-graph-layer41.sqlite"))["layers"]
    assert document["kernels_by_how"] == {"replay_nvtx": 0, "capture_nvtx": 8296, "inferred": 0, "none": 16}
    assert document["decode_kernels"] == 8312
    full = [0, 1, 2, *range(6, 75, 4)]
    moe_shared = [layer for layer in range(3, 78) if layer not in full and layer != 41]
    assert document["per_layer"] == [
        {"rank": 0, "layers": [0, 1, 2], "steps": "0-3", "step_count": 4, "kernels": 24,
         "groups": {"attention": 14, "ffn": 3, "indexer": 7}},
        {"rank": 0, "layers": moe_shared, "steps": "0-3", "step_count": 4, "kernels": 25,
         "groups": {"attention": 14, "deepep": 2, "ffn": 9}},
        {"rank": 0, "layers": full[3:], "steps": "0-3", "step_count": 4, "kernels": 32,
         "groups": {"attention": 14, "deepep": 2, "ffn": 9, "indexer": 7}},
        {"rank": 0, "layers": [41], "steps": "0-3", "step_count": 4, "kernels": 26,
         "groups": {"attention": 15, "deepep": 2, "ffn": 9}},
    ]
    finding = result_document(results("glm5-graph-layer41.sqlite"))["findings"][0]
    assert (finding["check"], finding["layers"]) == ("layer_sequence", "41")



def _layer_kernels(rows: list[tuple]) -> pl.LazyFrame:
    """(step, layer, op, api_start, capture_time) per kernel, of rank 0, all named `k`."""
    return pl.DataFrame(rows, orient="row", schema={
        "step": pl.Int64, "layer": pl.Int64, "op": pl.Utf8, "api_start": pl.Int64, "capture_time": pl.Int64,
    }).with_columns(pl.lit(0, pl.Int64).alias("rank"), pl.lit("k").alias("name"), pl.col("api_start").alias("start"),
                    pl.lit("ffn").alias("layer_group")).lazy()


def test_layer_sequences_follow_the_issue_order_with_and_without_ties():
    """Rows out of issue order: each layer's sequence is spelled in launch, then capture
    order. A second trace adds a layer whose two kernels tie in both (same op, so either
    order spells the same): the layers are then sorted one by one, with the same result."""
    rows = [(1, 0, "down", 100, 3), (1, 0, "gate_up", 100, 1), (1, 0, "act", 100, 2),
            (1, 1, "act", 200, None), (1, 1, "gate_up", 150, None)]
    tie = [(2, 0, "norm", 300, 5), (2, 0, "norm", 300, 5)]
    spelled = {}
    for extra in ([], tie):
        counts, sequences, texts = layer_figures(_layer_kernels(rows + extra))
        by_id = dict(texts.iter_rows())
        spelled[len(extra)] = [by_id[i].replace("\x1f", " ").replace("\x1effn", "")
                               for i in sequences.filter(pl.col("step") == 1)["sequence_id"]]
        assert counts.filter(pl.col("step") == 1)["count"].to_list() == [3, 2]
    assert spelled[0] == spelled[2] == ["gate_up act down", "gate_up act"]

@needs_shared(LLAMA3)
def test_default_layer_regex_on_a_real_trace():
    """No expectations: the default regex still names the `layer_M_token_N` ranges' layers."""
    result = nsys_ledger.check(LLAMA3, step_nvtx=r"^token_\d+_processing$")
    assert result.step_table.height == 64
    assert result.layers.kernels_by_how() == {"replay_nvtx": 1536, "capture_nvtx": 0, "inferred": 0, "none": 0}
    per_layer = result.layers.counts.group_by("layer").agg(
        pl.col("count").sum().alias("kernels"), pl.col("count").unique().alias("per_step")
    )
    assert per_layer.sort("layer").rows() == [(layer, 192, [3]) for layer in range(8)]


# ---- the [layers] keys of the expectations ------------------------------------------------


@pytest.mark.parametrize("edit, problem", [
    ('opening_followed_by = "qkv_a_proj"', 'opening_followed_by = "qkv_proj"'),
    ('self_attn = "attention"', 'self_attn = "attn"'),
    ("uniform = true", 'uniform = "yes"'),
])
def test_layer_rule_errors_name_the_key(tmp_path, edit, problem):
    text = GLM.read_text()
    assert edit in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(edit, problem))
    with pytest.raises(ExpectationsError) as error:
        nsys_ledger.load_expectations(bad)
    key = problem.split(" =")[0]
    assert f"{key} (line " in str(error.value)


def test_synth_command_writes_the_layer_attribution_cases(tmp_path, expectations):
    from click.testing import CliRunner

    from nsys_ledger.cli import main

    eager = tmp_path / "eager.sqlite"
    run = CliRunner().invoke(main, ["synth", str(eager), "--mode", "eager", "--steps", "1", "--no-layerwise-nvtx"])
    assert run.exit_code == 0, run.output
    assert nsys_ledger.check(eager, expectations).layers.kernels_by_how()["inferred"] == 2073
    graph = tmp_path / "graph.sqlite"
    run = CliRunner().invoke(main, ["synth", str(graph), "--steps", "1", "--capture-batch", "8", "--clone-links", "3"])
    assert run.exit_code == 0, run.output
    result = nsys_ledger.check(graph, expectations)
    assert result.layers.kernels_by_how()["capture_nvtx"] == 2073
    assert result.trace.graph_nodes.filter(pl.col("original_graph_node_id").is_null()).height == 2 * 2076


@pytest.mark.parametrize("name", ["glm5-graph-layer41.sqlite", "glm5-graph-broken-fusion.sqlite",
                                  "dsv32-graph-layer41.sqlite", "glm5-graph-no-nvtx-layer41.sqlite"])
def test_layer_findings_are_the_same_judged_one_step_at_a_time(name, monkeypatch):
    """check_layers judges the steps in slices (the grid of steps by declared layers and groups
    would otherwise grow with the trace): slices of one step give the findings of one slice."""
    import nsys_ledger.checks.layers as layers
    from test_windows import sample_ledger

    def layer_outcomes():
        result = nsys_ledger.check(SAMPLES / name, sample_ledger(name))
        return [(o.name, o.observed, [f.message for f in o.findings]) for o in result.outcomes
                if o.source.startswith(("layers.", "layer"))]

    whole = layer_outcomes()
    monkeypatch.setattr(layers, "STEPS_PER_JUDGEMENT", 1)
    assert layer_outcomes() == whole
    assert any(messages for _, _, messages in whole)  # the sample has per-layer findings to compare
