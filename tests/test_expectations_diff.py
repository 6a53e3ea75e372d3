"""`nsys-ledger expectations diff A B`: what two ledgers disagree on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_ledger.ledger import diff_expectations, load_expectations

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"


def edited_glm(tmp_path: Path, *edits: tuple[str, str], name: str = "edited.toml") -> Path:
    """A copy of the GLM ledger with each (old, new) text replaced exactly once."""
    text = GLM.read_text(encoding="utf-8")
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def lines(a: Path, b: Path) -> list[str]:
    return [change.describe() for change in diff_expectations(load_expectations(a), load_expectations(b))]


# 61 layers (the full-indexer class shrunk to fit) and the page-table op renamed.
GLM_61_LAYERS = (
    ("layers = 78 ", "layers = 61 "),
    ("full_indexer_layers = 21 ", "full_indexer_layers = 17 "),
    ('layers = "0-2, 6-74/4"', 'layers = "0-2, 6-58/4"'),
    ("patterns = ['transform_index_page_table']", "patterns = ['transform_index_page_table_decode']"),
)


def test_glm_against_61_layers_and_one_pattern(tmp_path):
    assert lines(GLM, edited_glm(tmp_path, *GLM_61_LAYERS)) == [
        "~ params.layers: 78 -> 61",
        "~ params.moe_layers: 75 (= layers - dense_layers) -> 58 (= layers - dense_layers)",
        "~ params.full_indexer_layers: 21 -> 17",
        "- ops.page_table.patterns: 'transform_index_page_table'",
        "+ ops.page_table.patterns: 'transform_index_page_table_decode'",
        "~ anchors.fused_add_rmsnorm: 156 (= 2 * layers) -> 122 (= 2 * layers)",
        "~ anchors.sparse_mla: 78 (= layers) -> 61 (= layers)",
        "~ anchors.paged_mqa_logits: 21 (= full_indexer_layers) -> 17 (= full_indexer_layers)",
        "~ anchors.per_token_group_quant: 75 (= moe_layers) -> 58 (= moe_layers)",
        "~ anchors.deepep_dispatch: 75 (= moe_layers) -> 58 (= moe_layers)",
        "~ layers.classes.moe.layers: 3-77 (75 layers) -> 3-60 (58 layers)",
        "~ layers.classes.full_indexer.layers: 0-2, 6-74/4 (21 layers) -> 0-2, 6-58/4 (17 layers)",
    ]


def test_same_ledger_and_a_reformatted_copy_agree(tmp_path):
    assert lines(GLM, GLM) == []
    # other forms of the same values: no difference in what the checks enforce
    same = edited_glm(
        tmp_path,
        ('max_bytes = "1024 * 1024"', "max_bytes = 1048576"),
        ("threshold_us = 2 ", "threshold_us = 2.0 "),
        ('groups = { indexer = "6-7" }', "groups = { indexer = [6, 7] }"),
    )
    assert lines(GLM, same) == []


def test_ops_added_removed_moved_and_changed(tmp_path):
    edited = edited_glm(
        tmp_path,
        # moe_sum removed; a new op added
        ('[ops.moe_sum]\ngroup = "ffn"\n', '[ops.shared_add]\ngroup = "ffn"\n'),
        ('"moe_sum 0-1",', '"shared_add 0-1",'),
        # a GEMM shape and a group changed, fallback dropped
        ('gemm = { n = 2048, k = 2048 }', 'gemm = { n = 2048, k = 1536 }'),
        ('[ops.rope]\ngroup = "attention"', '[ops.rope]\ngroup = "rotary"'),
        ("[ops.cublas_gemm]\ngroup = \"attention\"\nrole = \"gemm_other\"\ndescription = \"\"\"generic GEMM: in a layer these are the "
         "absorption GEMMs of rows 7 and 11 when\ncuBLAS names them (bf16 path); outside the layers the LM "
         "head\"\"\"\nfallback = true\n",
         "[ops.cublas_gemm]\ngroup = \"attention\"\nrole = \"gemm_other\"\ndescription = \"generic GEMM\"\n"),
    )
    assert lines(GLM, edited) == [
        "- ops.moe_sum: group ffn, 'moe_sum', 'triton_(?:red|per)_fused_(?:\\w+_)?sum_'",
        "+ ops.shared_add: group ffn, 'moe_sum', 'triton_(?:red|per)_fused_(?:\\w+_)?sum_'",
        "- ops.q_b_proj.gemm: normal GEMM N=2048 K=2048",
        "+ ops.q_b_proj.gemm: normal GEMM N=2048 K=1536",
        "~ ops.rope.group: attention -> rotary",
        "~ ops.cublas_gemm.fallback: true -> false",
        "~ ops.cublas_gemm.description: generic GEMM: in a layer these are the absorption GEMMs of rows 7 and "
        "11 when cuBLAS names them (bf16 path); outside the layers the LM head -> generic GEMM",
        # the renamed op in the MoE sequence: its place, removed and added
        "- layers.classes.moe.sequence: moe_sum 0-1 (entry 27)",
        "+ layers.classes.moe.sequence: shared_add 0-1 (entry 27)",
    ]


def test_match_priority_moved(tmp_path):
    # declaration order is match priority: with rmsnorm above fused_add_rmsnorm, its pattern
    # 'RMSNormKernel' would claim every FusedAddRMSNormKernel too, so a review must see the move
    text = GLM.read_text(encoding="utf-8")
    start = text.index("[ops.rmsnorm]")
    end = text.index("# DeepGEMM GEMMs by shape")
    block = text[start:end]
    moved = text[:start] + text[end:]
    moved = moved.replace("[ops.fused_add_rmsnorm]", block + "[ops.fused_add_rmsnorm]", 1)
    path = tmp_path / "moved.toml"
    path.write_text(moved, encoding="utf-8")
    assert lines(GLM, path) == ["~ ops.rmsnorm: match priority 7 -> match priority 6"]


def test_timeline_steps_model_and_class_changes(tmp_path):
    edited = edited_glm(
        tmp_path,
        ('name = "GLM-5.3 decode, SGLang TP8 + EP8 (DeepEP), flashmla_kv, CUDA graphs"', 'name = "GLM-5.3 MTP"'),
        ('exclude_ops = ["prefill_attention"]', "exclude_ops = []"),
        ("[total]\nmin = 1800\nmax = 2200", "[total]\nmin = 1900\nmax = 2300"),
        ("threshold_us = 2 ", "threshold_us = 3 "),
        ("step_entry_max_us = 10", "step_entry_max_us = 12.5"),
        ("per_step = 3\n", "per_step = \"3-4\"\n"),
        ("pageable_allowed = false", "pageable_allowed = true"),
        ("launches_per_step = 1 ", "launches_per_step = 3 "),
        ("max_imbalance_pct = 10 ", "max_imbalance_pct = 15 "),
        ("uniform = true", "uniform = false"),
        ('shared_experts = "ffn"', 'shared_experts = ["ffn", "deepep"]'),
        ('groups = { attention = "12-16", ffn = "8-10", deepep = 2 }', 'groups = { attention = "12-16", ffn = "7-10" }'),
        ("[anchors.sampling]\nexpected = 1 ", "[anchors.sampling]\nexpected = 3 "),
    )
    assert lines(GLM, edited) == [
        "~ model.name: GLM-5.3 decode, SGLang TP8 + EP8 (DeepEP), flashmla_kv, CUDA graphs -> GLM-5.3 MTP",
        "- steps.exclude_ops: prefill_attention",
        "~ anchors.sampling: 1 -> 3",
        "~ total: 1800-2200 -> 1900-2300",
        "~ gaps.threshold_us: 2 µs -> 3 µs",
        "~ gaps.step_entry_max_us: 10 µs -> 12.5 µs",
        "~ h2d.per_step: 3 -> 3-4",
        "~ h2d.pageable_allowed: false -> true",
        "~ graphs.launches_per_step: 1 -> 3",
        "~ ranks.max_imbalance_pct: 10% -> 15%",
        "~ layers.uniform: true -> false",
        "~ layers.modules.shared_experts: ffn -> ffn/deepep",
        "~ layers.classes.moe.groups.ffn: 8-10 -> 7-10",
        "- layers.classes.moe.groups.deepep: 2",
    ]


def test_sections_added_and_removed(tmp_path):
    a = tmp_path / "a.toml"
    a.write_text('[model]\nname = "a"\n[params]\nlayers = 2\n[ops.x]\npatterns = ["x"]\ngroup = "g"\n'
                 "[graphs]\nlaunches_per_step = 1\n"
                 '[layers.classes.all]\nlayers = "0-1"\ngroups = { g = 1 }\n', encoding="utf-8")
    b = tmp_path / "b.toml"
    b.write_text('[model]\nname = "a"\n[params]\nlayers = 2\nbatch = 8\n[ops.x]\npatterns = ["x"]\ngroup = "g"\n'
                 "[anchors.x]\nmin = 1\n[ranks]\nmax_imbalance_pct = 5\n"
                 '[layers.classes.odd]\nlayers = [1]\n', encoding="utf-8")
    assert lines(a, b) == [
        "+ params.batch: 8",
        "+ anchors.x: >= 1 (= min 1)",
        "- graphs.launches_per_step: 1",
        "+ ranks.max_imbalance_pct: 5%",
        "- layers.classes.all: 0-1 (2 layers)",
        "+ layers.classes.odd: 1 (1 layers)",
    ]


# ---- the command ---------------------------------------------------------------------------


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # wide enough that the checkout's path does not wrap the lines compared below
    return subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "expectations", "diff", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env={**os.environ, "COLUMNS": "1000"})


def test_command_exit_codes_text_and_json(tmp_path):
    edited = edited_glm(tmp_path, *GLM_61_LAYERS)

    same = run(str(GLM), str(GLM))
    assert same.returncode == 0, same.stderr
    assert same.stdout == f"the ledgers agree: {GLM} and {GLM} declare the same expectations\n"

    differ = run(str(GLM), str(edited))
    assert differ.returncode == 1, differ.stderr
    out = differ.stdout.splitlines()
    assert out[0] == f"12 difference(s) from {GLM} to {edited}"
    assert out[1] == "  ~ params.layers: 78 -> 61"
    assert len(out) == 13

    as_json = run("--json", str(GLM), str(edited))
    assert as_json.returncode == 1
    doc = json.loads(as_json.stdout)
    assert doc["equal"] is False and doc["a"] == str(GLM) and doc["b"] == str(edited)
    assert len(doc["changes"]) == 12
    assert doc["changes"][3] == {"section": "ops", "key": "ops.page_table.patterns", "change": "removed",
                                 "before": "'transform_index_page_table'", "after": None}
    assert json.loads(run("--json", str(GLM), str(GLM)).stdout) == {
        "a": str(GLM), "b": str(GLM), "equal": True, "changes": []}


@pytest.mark.parametrize("bad", ["missing.toml", "broken.toml"])
def test_command_bad_file_exits_2(tmp_path, bad):
    (tmp_path / "broken.toml").write_text('[model]\nname = "x"\n[ops.x]\npatterns = ["RMS(Norm"]\n', encoding="utf-8")
    result = run(str(GLM), str(tmp_path / bad))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith(f"nsys-ledger: error: {tmp_path / bad}: ")
    assert len(result.stderr.splitlines()) == 1
