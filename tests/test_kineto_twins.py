"""The Kineto twins of the samples (`sample_traces/*.trace.json.gz`): the same timeline as the
SQLite sample of the same name, written as SGLang's PyTorch profiler trace. Each must give the
same verdict, findings and per-step table as its SQLite twin, and `diff` must work across the
two formats.

One thing cannot match and is compared apart: how decode kernels of graph replays get their
layer. The SQLite samples carry the capture pass's layer-wise NVTX, projected onto the replayed
nodes by their node ids; a Kineto replay has neither the capture nor node ids, so its layers are
inferred from the kernel sequence. The two rules may put a kernel in a different layer group
(in the indexer layers one kernel is indexer work by its NVTX module path and attention by its
op), so per-layer group counts differ while every per-step figure is equal.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.diff import diff_results, layer_source
from nsys_ledger.report.diff_report import render_diff
from nsys_ledger.synth import generate

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

# Kineto twin -> its SQLite sample, the verdict and the findings (check, subject, observed,
# expected) both give.
TWINS = {
    "glm5-graph-healthy.trace.json.gz": ("glm5-graph-healthy.sqlite", "pass", set()),
    "glm5-eager-healthy.trace.json.gz": ("glm5-eager-healthy.sqlite", "fail", {
        ("gaps", "gaps", "1076-1106", "0")}),
    "glm5-graph-broken-fusion.trace.json.gz": ("glm5-graph-broken-fusion.sqlite", "fail", {
        ("anchor", "per_token_group_quant", "231", "75 (= moe_layers)"),
        ("total", "kernels", "2233", "1800-2200"),
        # the extra quant after each norm, by its place in the layer's sequence (the twin's
        # graph kernels carry no capture order: each stream's kernels keep their own order)
        ("layer_sequence", "per_token_group_quant", "+ per_token_group_quant", "the dense sequence"),
        ("layer_sequence", "per_token_group_quant", "+ per_token_group_quant", "the moe sequence")}),
    "glm5-graph-extra-h2d.trace.json.gz": ("glm5-graph-extra-h2d.sqlite", "fail", {
        ("h2d", "h2d", "4", "3")}),
}
# Per decode step (4 steps each): kernels, H2D copies, graph launches, and some anchor op counts.
PER_STEP = {
    "glm5-graph-healthy.trace.json.gz": (2077, 3, 1, {"fused_add_rmsnorm": 156, "per_token_group_quant": 75}),
    "glm5-eager-healthy.trace.json.gz": (2077, 3, 0, {"fused_add_rmsnorm": 156, "per_token_group_quant": 75}),
    "glm5-graph-broken-fusion.trace.json.gz": (2233, 3, 1, {"fused_add_rmsnorm": 156, "per_token_group_quant": 231}),
    "glm5-graph-extra-h2d.trace.json.gz": (2077, 4, 1, {"fused_add_rmsnorm": 156, "per_token_group_quant": 75}),
}


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def results(expectations):
    """name -> Result, for every twin and its SQLite sample (each checked once)."""
    cache: dict[str, nsys_ledger.Result] = {}

    def result(name: str):
        if name not in cache:
            cache[name] = nsys_ledger.check(SAMPLES / name, expectations)
        return cache[name]

    return result


def _findings(result) -> set[tuple[str, str, str, str]]:
    return {(f.check, f.subject, f.observed, f.expected) for f in result.findings}


def _events(name: str) -> list[dict]:
    return json.loads(gzip.decompress((SAMPLES / name).read_bytes()))["traceEvents"]


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_twin_gives_the_same_verdict_findings_and_step_table(twin, results):
    sqlite_name, verdict, findings = TWINS[twin]
    kineto, sqlite = results(twin), results(sqlite_name)
    assert kineto.trace.meta.version_source == "kineto"
    assert (kineto.verdict, sqlite.verdict) == (verdict, verdict)
    assert _findings(kineto) == _findings(sqlite) == findings
    # every column of the per-step table: counts, gaps, step times to the nanosecond
    assert kineto.step_table.columns == sqlite.step_table.columns
    assert kineto.step_table.to_dicts() == sqlite.step_table.to_dicts()
    assert kineto.op_table.to_dicts() == sqlite.op_table.to_dicts()
    kernels, h2d, graph_launches, anchors = PER_STEP[twin]
    table = kineto.step_table
    assert table["kernels"].to_list() == [kernels] * 4
    assert table["h2d"].to_list() == [h2d] * 4
    assert table["graph_launches"].to_list() == [graph_launches] * 4
    for op, count in anchors.items():
        assert kineto.op_table[op].to_list() == [count] * 4


@pytest.mark.parametrize("twin, outside", [
    ("glm5-graph-healthy.trace.json.gz", 16), ("glm5-graph-broken-fusion.trace.json.gz", 20)])
def test_graph_twins_infer_the_layers_that_the_sqlite_samples_read_from_capture_nvtx(twin, outside, results):
    kineto, sqlite = results(twin), results(TWINS[twin][0])
    assert (layer_source(sqlite), layer_source(kineto)) == ("nvtx", "inferred")
    # decode kernels outside the 78 layers in 4 steps, the same either way: sampling, embedding,
    # final norm, LM head (and the group quant after the final norm of broken fusion)
    assert sqlite.layers.kernels_by_how()["none"] == outside
    assert kineto.layers.kernels_by_how()["none"] == outside
    if twin == "glm5-graph-broken-fusion.trace.json.gz":
        # the same four sequence findings (two faults per class, each at its place) whether
        # the layers come from capture NVTX or are inferred, told with the same layers
        def told(result):
            return [(f.layers, f.message) for f in result.findings if f.check == "layer_sequence"]
        assert len(told(kineto)) == 4 and told(kineto) == told(sqlite)


def test_the_eager_twin_finds_layers_from_its_module_ranges(results):
    """The twin's module ranges are `nn.Module: DeepseekV2DecoderLayer_N` (torch's with_modules):
    the default layer regex and the GLM ledger's both read them."""
    events = _events("glm5-eager-healthy.trace.json.gz")
    layers = [e["name"] for e in events if e.get("cat") == "python_function"
              and e["name"].startswith("nn.Module: DeepseekV2DecoderLayer_")]
    assert len(layers) == 78 * 5  # the prefill and 4 decode steps, each through all 78 layers
    assert Counter(layers)["nn.Module: DeepseekV2DecoderLayer_12"] == 5
    assert layer_source(results("glm5-eager-healthy.trace.json.gz")) == "nvtx"
    assert layer_source(results("glm5-eager-healthy.sqlite")) == "nvtx"
    no_ledger = nsys_ledger.check(SAMPLES / "glm5-eager-healthy.trace.json.gz")
    assert layer_source(no_ledger) == "nvtx"
    assert no_ledger.layers.kernels_by_how()["replay_nvtx"] == 4 * 2073


def test_graph_twin_event_shapes():
    events = _events("glm5-graph-healthy.trace.json.gz")
    by_cat = Counter(e.get("cat") for e in events)
    # prefill: 1999 kernels; decode: 4 x 2077. Module ranges only in the prefill (78 layers):
    # a graph replay runs no module code.
    assert by_cat["kernel"] == 1999 + 4 * 2077
    assert by_cat["gpu_memcpy"] == 5 * 3
    assert by_cat["user_annotation"] == by_cat["gpu_user_annotation"] == 5 * 2
    decoder_layers = [e for e in events if e.get("cat") == "python_function"
                      and e["name"].startswith("nn.Module: DeepseekV2DecoderLayer_")]
    assert len(decoder_layers) == 78
    launches = [e for e in events if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"]
    assert [e["args"]["cbid"] for e in launches] == [311] * 4
    replayed = Counter(e["args"]["correlation"] for e in events if e.get("cat") == "kernel")
    for launch in launches:
        # every replayed kernel carries the launch's correlation id, and no External id
        assert replayed[launch["args"]["correlation"]] == 2076
    graph_corrs = {e["args"]["correlation"] for e in launches}
    assert not any("External id" in e["args"] for e in events
                   if e.get("cat") == "kernel" and e["args"]["correlation"] in graph_corrs)
    names = {e["name"] for e in events if e.get("cat") == "kernel"}
    # c++filt spelling, as the profiler demangles: literal suffixes, no nsys casts
    assert any("2624u" in n for n in names)
    assert not any("(unsigned int)" in n or "(bool)" in n for n in names)
    steps = [e["name"] for e in events if e.get("cat") == "user_annotation"]
    assert steps[:2] == ["execute_32_context_32(sq16384sk16384sqsq8388608sqsk8388608)_generation_0(sq0sk0sqsq0sqsk0)",
                         "step[EXTEND bs=32]"]
    assert steps[2:4] == ["execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk16416sqsq32sqsk16416)",
                          "step[DECODE bs=32]"]


def test_without_a_ledger_the_twin_steps_come_from_its_engine_step_ranges():
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.trace.json.gz")
    assert result.steps.method == "nvtx"
    assert result.step_table["kernels"].to_list() == [2077] * 4
    assert result.step_table["h2d"].to_list() == [3] * 4


@pytest.mark.parametrize("after, reasons", [
    ("glm5-graph-broken-fusion.trace.json.gz", [
        "kernels per step: 2077 -> 2233 (new launches per step)",
        "op per_token_group_quant: 75 -> 231 (new launches per step)",
        "newly failing check anchors.per_token_group_quant"]),
    ("glm5-graph-extra-h2d.trace.json.gz", [
        "H2D copies per step: 3 -> 4 (more H2D copies)", "newly failing check h2d"]),
])
def test_diff_of_the_sqlite_healthy_sample_against_a_kineto_fault_names_the_fault(after, reasons, results):
    diff = diff_results(results("glm5-graph-healthy.sqlite"), results(after))
    assert diff.worse
    for reason in reasons:
        assert reason in diff.reasons


def test_diff_across_formats_of_the_same_timeline_is_not_worse(results):
    diff = diff_results(results("glm5-graph-healthy.sqlite"), results("glm5-graph-healthy.trace.json.gz"))
    assert not diff.worse and diff.reasons == ()
    assert all(change.before == change.after for change in diff.step_figures
               if change.name != "step time p90 (ms)")
    assert diff.op_changes == ()
    # layers found two ways: by NVTX sub-modules, and inferred with the ops of shared names
    # (the indexer's and the router's cuBLAS GEMMs) placed by the layer sequence: the same groups
    assert diff.layer_sources == ("nvtx", "inferred")
    assert diff.layer_changes == ()
    assert "layers found by nvtx in BEFORE, inferred in AFTER" in render_diff(diff)
    # the same kernels, spelled by two demanglers: listed as new and vanished names, not judged
    assert diff.new_kernels.height == diff.vanished_kernels.height
    assert diff.new_kernels["per_step"].sum() == diff.vanished_kernels["per_step"].sum()


@pytest.mark.parametrize("after, exit_code", [("glm5-graph-healthy.trace.json.gz", 0),
                                              ("glm5-graph-broken-fusion.trace.json.gz", 1)])
def test_cli_diff_of_an_sqlite_export_and_a_kineto_trace(after, exit_code):
    run = CliRunner().invoke(main, ["diff", str(SAMPLES / "glm5-graph-healthy.sqlite"), str(SAMPLES / after),
                                    "--expect", str(GLM)])
    assert run.exit_code == exit_code, run.output
    assert ("NOT WORSE" if exit_code == 0 else "WORSE") in run.output


def test_layer41_twin_finds_the_stray_kernel_but_cannot_place_it_in_a_group(tmp_path, results):
    """Not a bundled twin: the stray ATen copy kernel of layer 41, found by capture NVTX in the
    SQLite sample and by inference in the twin; either way the layer's sequence places it
    after the output absorption bmm: the same single finding."""
    twin = tmp_path / "glm5-graph-layer41.trace.json.gz"
    generate(twin, steps=4, seed=0, faults=("layer_fault",), format="kineto")
    kineto = nsys_ledger.check(twin, results("glm5-graph-healthy.sqlite").expectations)
    sqlite = results("glm5-graph-layer41.sqlite")
    assert kineto.verdict == sqlite.verdict == "fail"
    assert kineto.step_table.to_dicts() == sqlite.step_table.to_dicts()
    assert _findings(sqlite) == _findings(kineto) == {
        ("layer_sequence", "elementwise_kernel", "+ elementwise_kernel", "the moe sequence")}
    assert [f.message for f in kineto.findings] == [f.message for f in sqlite.findings]


def test_the_writer_is_deterministic_and_checks_its_arguments(tmp_path):
    first, second = tmp_path / "a" / "t.trace.json.gz", tmp_path / "b" / "t.trace.json.gz"
    for path in (first, second):
        path.parent.mkdir()
        summary = generate(path, steps=1, seed=3, format="kineto")
    assert first.read_bytes() == second.read_bytes()
    assert summary.schema_era == "kineto" and summary.describe().endswith("kineto export")
    assert summary.rows["kernel"] == 1999 + 2077
    with pytest.raises(ValueError, match="one rank.s profile"):
        generate(tmp_path / "r.trace.json.gz", steps=1, ranks=2, format="kineto")
    with pytest.raises(ValueError, match="format must be"):
        generate(tmp_path / "x.json", steps=1, format="chrome")


def test_cli_synth_writes_a_kineto_trace_that_check_reads(tmp_path):
    out = tmp_path / "decode.trace.json.gz"
    run = CliRunner().invoke(main, ["synth", str(out), "--format", "kineto", "--steps", "2", "--fault", "extra_h2d"])
    assert run.exit_code == 0, run.output
    assert run.output.endswith("faults: extra_h2d, DeepGEMM layout sglang-2026, kineto export\n")
    result = nsys_ledger.check(out, GLM)
    assert result.verdict == "fail" and _findings(result) == {("h2d", "h2d", "4", "3")}
    assert result.step_table["kernels"].to_list() == [2077, 2077]
    refused = CliRunner().invoke(main, ["synth", str(tmp_path / "two.trace.json.gz"), "--format", "kineto",
                                        "--ranks", "2"])
    assert refused.exit_code == 2 and "one rank's profile (ranks=1)" in refused.output
