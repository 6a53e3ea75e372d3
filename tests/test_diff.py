"""`nsys-ledger diff BEFORE AFTER`: the healthy sample against each faulted one names the fault."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.diff import WorseningRule, diff_results
from nsys_ledger.report.diff_report import diff_document, render_diff, render_diff_html

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

# The reasons `diff healthy faulted` must give: each names the injected fault.
FAULT_REASONS = {
    "glm5-graph-broken-fusion.sqlite": [
        "kernels per step: 2077 -> 2233 (new launches per step)",
        "op per_token_group_quant: 75 -> 231 (new launches per step)",
        "layers 3-77 ffn: 9 -> 11 (new launches per step)",
        "newly failing check anchors.per_token_group_quant",
    ],
    "glm5-graph-chunked-indexer.sqlite": [
        "kernels per step: 2077 -> 2119 (new launches per step)",
        "op paged_mqa_logits: 21 -> 63 (new launches per step)",
    ],
    "glm5-graph-extra-gaps.sqlite": ["newly failing check gaps.threshold_us"],
    "glm5-graph-extra-h2d.sqlite": ["H2D copies per step: 3 -> 4 (more H2D copies)", "newly failing check h2d"],
    "glm5-graph-split-graph.sqlite": [
        "graph launches per step: 1 -> 2 (more graph launches)",
        "H2D copies per step: 3 -> 4 (more H2D copies)",
        "newly failing check graphs.launches_per_step",
    ],
    "glm5-graph-layer41.sqlite": [
        "kernels per step: 2077 -> 2078 (new launches per step)",
        "op other: 0 -> 1 (new launches per step)",
        "layer 41 attention: 14 -> 15 (new launches per step)",
        "newly failing check layers.classes.moe.sequence",
    ],
    "glm5-graph-boundary-gap.sqlite": [
        "graph launches per step: 1 -> 2 (more graph launches)",
        "new idle-gap cause 'graph_boundary'",
        "newly failing check gaps.threshold_us",
    ],
    "glm5-graph-pageable-h2d.sqlite": [
        "pageable H2D copies per step: 0 -> 1 (more pageable H2D copies)",
        "newly failing check h2d.pageable_allowed",
        # the copy delays the graph launch (cause launch, as the healthy step entry's): no new cause
        "newly failing check gaps.threshold_us",
    ],
}


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def healthy(expectations):
    return nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations)


@pytest.mark.parametrize("sample", sorted(FAULT_REASONS))
def test_diff_against_the_healthy_sample_names_the_fault(sample, healthy, expectations):
    diff = diff_results(healthy, nsys_ledger.check(SAMPLES / sample, expectations))
    assert diff.worse and diff.exit_code == 1
    for reason in FAULT_REASONS[sample]:
        assert reason in diff.reasons
    text = render_diff(diff, width=1000)  # unwrapped: each reason on one line
    assert "WORSE" in text and all(reason in text for reason in FAULT_REASONS[sample])


def test_layer41_diff_lists_the_stray_kernel_as_new(healthy, expectations):
    diff = diff_results(healthy, nsys_ledger.check(SAMPLES / "glm5-graph-layer41.sqlite", expectations))
    assert diff.new_kernels.select("op", "per_step").rows() == [("other", 1.0)]
    assert "elementwise_kernel" in diff.new_kernels["name"][0]
    assert diff.vanished_kernels.height == 0


def test_extra_gaps_diff_counts_the_three_injected_gaps(healthy, expectations):
    diff = diff_results(healthy, nsys_ledger.check(SAMPLES / "glm5-graph-extra-gaps.sqlite", expectations))
    gaps = next(c for c in diff.step_figures if c.name == "idle gaps per step")
    assert (gaps.before, gaps.after) == (0.0, 3.0)
    # per step: the launch gap at the step entry in both, three device-side delays after
    assert diff.gap_causes.select("cause", "before_gaps", "after_gaps").rows() == [
        ("launch", 1.0, 1.0), ("unknown", 0.0, 3.0)]
    assert diff.reasons == ("new idle-gap cause 'unknown'", "newly failing check gaps.threshold_us")


def test_slow_rank_diff_reports_the_step_time_and_gates_it_only_when_asked(healthy, expectations):
    slow = nsys_ledger.check(SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite", expectations)
    diff = diff_results(healthy, slow)
    median = next(c for c in diff.step_figures if c.name == "step time median (ms)")
    assert round(median.change_pct) == 19  # the slow rank's 20% slower kernels make every step wait
    assert diff.rank_step_time["rank"].to_list() == [0, 1]
    assert not any("step time" in reason for reason in diff.reasons)
    gated = diff_results(healthy, slow, WorseningRule(step_time_slowdown_pct=10))
    assert any(reason.startswith("step time p90 (ms): ") and reason.endswith("(slower than 10%)")
               for reason in gated.reasons)
    assert diff_results(healthy, slow, WorseningRule(step_time_slowdown_pct=25)).reasons == diff.reasons


def test_a_trace_against_itself_is_not_worse(healthy):
    diff = diff_results(healthy, healthy)
    assert not diff.worse and diff.exit_code == 0
    assert diff.op_changes == () and diff.layer_changes == ()
    assert diff.new_kernels.height == 0 and diff.vanished_kernels.height == 0
    last_line = click.unstyle(render_diff(diff, width=1000).splitlines()[-1])  # unwrapped
    assert last_line.startswith("NOT WORSE under the rule: more kernel launches per step")


def test_a_fix_is_not_worse(healthy, expectations):
    broken = nsys_ledger.check(SAMPLES / "glm5-graph-broken-fusion.sqlite", expectations)
    diff = diff_results(broken, healthy)
    assert not diff.worse
    assert diff.resolved_findings[0] == "anchors.per_token_group_quant"


def test_allowance_for_extra_launches(healthy, expectations):
    layer41 = nsys_ledger.check(SAMPLES / "glm5-graph-layer41.sqlite", expectations)
    diff = diff_results(healthy, layer41, WorseningRule(extra_launches_per_step=1, new_failing_check=False))
    assert not diff.worse


def test_diff_document_and_page(healthy, expectations):
    diff = diff_results(healthy, nsys_ledger.check(SAMPLES / "glm5-graph-extra-h2d.sqlite", expectations))
    document = json.loads(json.dumps(diff_document(diff)))
    assert document["schema_version"] == "1.1"
    assert document["worse"] is True
    assert document["before"]["decode_steps"] == document["after"]["decode_steps"] == 4
    h2d = next(f for f in document["step_figures"] if f["name"] == "H2D copies per step")
    assert (h2d["before"], h2d["after"], h2d["change"], h2d["worse_by"]) == (3.0, 4.0, 1.0, "more H2D copies")
    page = render_diff_html(diff)
    assert '<header class="banner worse" id="verdict"><h1>WORSE: ' in page
    assert "H2D copies per step: 3 -&gt; 4 (more H2D copies)" in page


def test_diff_command_exit_codes_and_outputs(tmp_path):
    out_json, out_html = tmp_path / "diff.json", tmp_path / "diff.html"
    worse = CliRunner().invoke(main, [
        "diff", str(SAMPLES / "glm5-graph-healthy.sqlite"), str(SAMPLES / "glm5-graph-split-graph.sqlite"),
        "--expect", str(GLM), "--json", str(out_json), "--html", str(out_html),
    ])
    assert worse.exit_code == 1, worse.output
    assert "graph launches per step: 1 -> 2 (more graph launches)" in worse.output
    assert json.loads(out_json.read_text())["worse"] is True
    assert out_html.read_text().startswith("<!DOCTYPE html>")
    same = CliRunner().invoke(main, [
        "diff", str(SAMPLES / "glm5-graph-healthy.sqlite"), str(SAMPLES / "glm5-graph-healthy.sqlite"),
        "--expect", str(GLM),
    ])
    assert same.exit_code == 0 and "NOT WORSE" in same.output
    healthy_path = str(SAMPLES / "glm5-graph-healthy.sqlite")
    missing = CliRunner().invoke(main, ["diff", str(tmp_path / "nope.sqlite"), healthy_path])
    assert missing.exit_code == 2 and missing.output.count("\n") == 1


def test_diff_schema_doc_names_every_field(healthy):
    document = diff_document(diff_results(healthy, healthy))
    schema_doc = (ROOT / "docs" / "json-schema.md").read_text()
    section = schema_doc[schema_doc.index("nsys-ledger diff BEFORE AFTER --json FILE"):]
    for name in document:
        assert f"`{name}`" in section, name
    figures_row = next(line for line in section.splitlines() if line.startswith("| `step_figures` |"))
    assert "{" + ", ".join(document["step_figures"][0]) + "}" in figures_row
