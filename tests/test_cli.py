"""The command line: exit codes, one-line errors, JSON output, expectations show."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsys_ledger.cli import main

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = str(ROOT / "expectations" / "glm-5.3-tp8-ep8.toml")
HEALTHY = str(SAMPLES / "glm5-graph-healthy.sqlite")


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def test_check_healthy_exits_0_and_says_what_it_checked():
    result = invoke("check", HEALTHY, "--expect", GLM)
    assert result.exit_code == 0, result.output
    # 10 per-step checks and 8 per-layer ones (6 class groups, undeclared groups, uniform)
    assert "PASS all 20 checks passed on 4 decode steps" in result.output
    assert "anchor fused_add_rmsnorm" in result.output and "156" in result.output


def test_check_faulted_exits_1_and_names_anchor_steps_and_hint():
    result = invoke("check", str(SAMPLES / "glm5-graph-chunked-indexer.sqlite"), "--expect", GLM)
    assert result.exit_code == 1
    assert "[anchors.paged_mqa_logits] paged_mqa_logits kernels: 63 per step, expected 21" in result.output
    assert "(steps 0-3)" in result.output
    assert "hint: indexer logits were chunked" in result.output


def test_check_without_expectations_prints_the_summary_and_exits_0():
    result = invoke("check", HEALTHY)
    assert result.exit_code == 0
    assert "4 decode steps by graph" in result.output
    assert "SUMMARY" in result.output


def test_json_output_follows_the_documented_schema(tmp_path):
    out = tmp_path / "result.json"
    result = invoke("check", str(SAMPLES / "glm5-graph-broken-fusion.sqlite"), "--expect", GLM, "--json", str(out))
    assert result.exit_code == 1
    doc = json.loads(out.read_text())
    assert doc["schema_version"] == "2.1"
    assert set(doc) >= {"schema_version", "trace", "totals", "steps", "findings", "verdict", "checks", "op_roles"}
    assert doc["op_roles"]["per_token_group_quant"] == "ffn_quant"
    assert doc["trace"]["path"].endswith("glm5-graph-broken-fusion.sqlite")
    assert doc["trace"]["nsys_version"].startswith("2026.2")
    assert set(doc["totals"]) >= {"kernels", "kernels_by_device", "h2d_copies", "h2d_pageable", "nvtx_ranges"}
    assert doc["verdict"] == "fail"
    assert len(doc["steps"]) == 4
    step = doc["steps"][0]
    assert step["index"] == 0 and step["kernels"] == 2233
    # the broken fusion's 156 extra quantization kernels per step, by op and by role (2.1)
    assert step["ops"]["per_token_group_quant"] == 231 and step["roles"]["ffn_quant"] == 231
    assert sum(step["roles"].values()) == 2233
    assert step["ops"]["fused_add_rmsnorm"] == 156
    assert step["ops"]["per_token_group_quant"] == 231
    assert [f["source"] for f in doc["findings"]] == [
        "anchors.per_token_group_quant",
        "total",
        "layers.classes.dense.sequence",  # after the post-attention norm of layers 0-2
        "layers.classes.dense.sequence",  # after the input norm of layers 1-2 (layer 0's is a plain RMSNorm)
        "layers.classes.moe.sequence",  # after the input norm of layers 3-77
        "layers.classes.moe.sequence",  # after their post-attention norm
    ]
    assert [f["layers"] for f in doc["findings"]] == [None, None, "0-2", "1-2", "3-77", "3-77"]
    assert doc["layers"]["kernels_by_how"]["capture_nvtx"] == 4 * (2073 + 155)


def test_json_schema_doc_names_every_top_level_field(tmp_path):
    out = tmp_path / "r.json"
    invoke("check", HEALTHY, "--expect", GLM, "--json", str(out))
    doc = json.loads(out.read_text())
    schema_doc = (ROOT / "docs" / "json-schema.md").read_text()
    for field in doc:
        assert f"`{field}`" in schema_doc, field
    for field in doc["steps"][0]:
        assert f"`{field}`" in schema_doc, field


@pytest.mark.parametrize(
    "make_path, problem",
    [
        (lambda tmp: tmp / "missing.sqlite", "no such file"),
        (lambda tmp: tmp, "directory"),
    ],
)
def test_bad_trace_is_one_line_and_exit_2(tmp_path, make_path, problem):
    path = make_path(tmp_path)
    result = invoke("check", str(path))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert str(path) in lines[0] and problem in lines[0]
    assert "Traceback" not in result.output


def test_unwritable_json_path_is_exit_2_before_any_work(tmp_path):
    result = invoke("check", HEALTHY, "--json", str(tmp_path / "no" / "such" / "dir" / "r.json"))
    assert result.exit_code == 2
    assert "cannot write output" in result.output


def test_bad_expectations_is_exit_2_naming_the_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[params]\nlayers = \n")
    result = invoke("check", HEALTHY, "--expect", str(bad))
    assert result.exit_code == 2
    assert str(bad) in result.output and len(result.output.strip().splitlines()) == 1


def test_check_leaves_the_trace_unchanged():
    before = hashlib.sha256(Path(HEALTHY).read_bytes()).hexdigest()
    invoke("check", HEALTHY, "--expect", GLM)
    assert hashlib.sha256(Path(HEALTHY).read_bytes()).hexdigest() == before


def test_expectations_show_prints_the_evaluated_ledger():
    result = invoke("expectations", "show", GLM)
    assert result.exit_code == 0
    assert "fused_add_rmsnorm" in result.output and "156" in result.output


def test_synth_writes_a_trace_that_checks(tmp_path):
    out = tmp_path / "t.sqlite"
    result = invoke("synth", str(out), "--steps", "2", "--fault", "chunked_indexer")
    assert result.exit_code == 0, result.output
    checked = invoke("check", str(out), "--expect", GLM)
    assert checked.exit_code == 1
    assert "paged_mqa_logits kernels: 63 per step" in checked.output


def test_synth_rejects_an_unknown_fault(tmp_path):
    result = invoke("synth", str(tmp_path / "t.sqlite"), "--fault", "gremlins")
    assert result.exit_code == 2
    assert "unknown fault" in result.output
