"""Ops by their place in the layer: the ledger's per-class kernel sequences, the alignment of
each observed layer to them, and the findings as edits at positions.

The samples are written with SGLang's real shapes (synth/schedule.py cites deepseek_v2.py): the
replicated shared expert's down GEMM has o_proj's N=6144, K=2048 and the same kernel name; the
router, the two absorption bmms and the indexer's wk are tile-named cuBLAS (nvjet) kernels that
only the generic cublas_gemm claims by name. Without layer NVTX only the place tells them apart.
"""

from __future__ import annotations

import csv
import sqlite3
from pathlib import Path

import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.attribution.ops import OpClassifier
from nsys_ledger.attribution.sequence import EXTRA, MISSING, align, layer_plans
from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger.document import write_expectations
from nsys_ledger.ledger.model import SequenceEntry
from nsys_ledger.synth import generate

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
REAL_NAMES = ROOT.parent / "shared" / "reference" / "real-kernel-names.tsv"


@pytest.fixture(scope="module")
def glm():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def results(glm):
    cache: dict[str, nsys_ledger.Result] = {}

    def get(sample: str) -> nsys_ledger.Result:
        if sample not in cache:
            cache[sample] = nsys_ledger.check(SAMPLES / sample, glm)
        return cache[sample]

    return get


def _replayed(path: Path, pattern: str) -> int:
    """Graph-replayed kernels whose demangled name matches a SQL LIKE pattern, by plain SQL."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
                          "k.demangledName WHERE s.value LIKE ? AND k.graphNodeId IS NOT NULL",
                          (pattern,)).fetchone()[0]


# ---- the done-when samples -------------------------------------------------------------------


def test_healthy_glm_without_layer_nvtx_passes(results):
    """No NVTX range at all; the o_proj-shaped GEMM runs twice per MoE layer (o_proj and the
    shared expert's down) and the names alone would count 153 o_proj per step."""
    path = SAMPLES / "glm5-graph-no-nvtx-healthy.sqlite"
    o_proj_shape = ("%sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, (unsigned int)0, (unsigned int)6144, "
                    "(unsigned int)2048,%(deep_gemm::GemmType)0%")
    # 4 decode replays x (78 o_proj + 75 shared expert down): one name
    assert _replayed(path, o_proj_shape) == 4 * 153
    result = results("glm5-graph-no-nvtx-healthy.sqlite")
    assert result.totals.nvtx_ranges == 0
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert set(result.op_table["o_proj"]) == {78}
    assert set(result.op_table["router_gemm"]) == {75}
    assert set(result.op_table["bmm"]) == {156}
    assert result.layers.edits.height == 0
    per_layer = result.layers.counts.filter((pl.col("step") == 0) & (pl.col("layer") == 41))
    assert dict(per_layer.select("group", "count").iter_rows()) == {"attention": 14, "deepep": 2, "ffn": 9}


@pytest.mark.parametrize("layout", ["2025-07", "b200"])
def test_healthy_glm_without_layer_nvtx_passes_in_other_deepgemm_layouts(tmp_path, glm, layout):
    """2025-07 names state N, K in another order of template arguments; B200 states no shape
    at all (`0u, 0u, 0u`): its projections are placed by the sequence alone."""
    path = tmp_path / f"{layout}.sqlite"
    generate(path, mode="graph", steps=2, layerwise_nvtx=False, deepgemm_layout=layout)
    result = nsys_ledger.check(path, glm)
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert set(result.op_table["qkv_a_proj"]) == set(result.op_table["o_proj"]) == {78}
    assert set(result.op_table["deepgemm_dense"]) == {2 * 75 + 2 * 3}  # shared expert and dense MLP


def test_one_extra_kernel_is_one_finding(results):
    result = results("glm5-graph-no-nvtx-layer41.sqlite")
    assert [(f.check, f.layers, f.subject, f.observed, f.source) for f in result.findings] == [
        ("layer_sequence", "41", "elementwise_kernel", "+ elementwise_kernel", "layers.classes.moe.sequence")]
    assert result.findings[0].message == (
        "layer 41: + `elementwise_kernel` after `bmm` (after moe sequence entry 12 of 27), in 4 of 4 steps (steps 0-3)")


def test_one_missing_kernel_is_one_finding(results):
    result = results("glm5-graph-no-nvtx-missing-kernel.sqlite")
    assert [(f.check, f.layers, f.subject, f.observed) for f in result.findings] == [
        ("layer_sequence", "7", "rmsnorm", "- rmsnorm")]
    assert result.findings[0].message == (
        "layer 7: missing `rmsnorm` after `qkv_a_proj` (moe sequence entry 3 of 27), in 4 of 4 steps (steps 0-3)")
    # the other layers' groups are untouched: layer 7's attention count is not reported again
    assert [o.passed for o in result.outcomes if o.source == "layers.classes.moe.groups.attention"] == [True]


def test_with_layer_nvtx_the_same_faults_read_the_same(results):
    nvtx = results("glm5-graph-layer41.sqlite")
    inferred = results("glm5-graph-no-nvtx-layer41.sqlite")
    assert [f.message for f in nvtx.findings] == [f.message for f in inferred.findings]


# ---- the alignment ---------------------------------------------------------------------------


def _entries(*texts: str) -> tuple[SequenceEntry, ...]:
    out = []
    for text in texts:
        name, _, count = text.partition(" ")
        low, _, high = count.partition("-")
        fills = tuple(name.split("|"))
        out.append(SequenceEntry(fills[0], fills, int(low or 1), int(high or low or 1)))
    return tuple(out)


def _chain(*ops: str) -> list[tuple[frozenset[str], str]]:
    return [(frozenset(op.split("|")), op) for op in ops]


def test_align_optional_and_repeated_entries():
    entries = _entries("norm", "gemm", "quant 0-2", "bmm", "combine 0-1")
    assert align(entries, [_chain("norm", "gemm", "bmm")]).edits == ()
    assert align(entries, [_chain("norm", "gemm", "quant", "quant", "bmm", "combine")]).edits == ()
    # a third quant is one too many; a missing gemm is one edit, not a shift of everything after
    assert align(entries, [_chain("norm", "gemm", "quant", "quant", "quant", "bmm")]).edits == (
        (EXTRA, "quant", 3, "quant"),)
    assert align(entries, [_chain("norm", "bmm")]).edits == ((MISSING, "gemm", 2, "norm"),)


def test_align_gives_a_shared_name_the_op_of_its_place():
    """The same candidate set {o_proj, dense} fills o_proj's place and the shared expert's."""
    entries = _entries("o_proj", "norm", "dense")
    shared = frozenset({"o_proj", "dense"})
    alignment = align(entries, [[(shared, "o_proj"), (frozenset({"norm"}), "norm"), (shared, "o_proj")]])
    assert alignment.filled == (0, 1, 2) and alignment.edits == ()


def test_align_lets_streams_interleave_but_keeps_each_streams_order():
    entries = _entries("a", "b", "c", "d")
    # main stream a, d; alt stream b, c: any interleaving is the sequence
    assert align(entries, [_chain("a", "d"), _chain("b", "c")]).edits == ()
    # inside one stream the order counts: c before b is a fault
    assert align(entries, [_chain("a", "d"), _chain("c", "b")]).edits != ()


def test_plans_insert_the_indexer_before_q_b_proj(glm):
    plans = layer_plans(glm)
    full, shared = plans[6], plans[5]
    ops = [e.op for e in full.entries]
    assert len(full.entries) == len(shared.entries) + 6 == 33
    assert ops[ops.index("q_b_proj") - 6:ops.index("q_b_proj")] == [
        "indexer_gemm", "indexer_k_norm", "indexer_act_quant", "indexer_cache_store", "paged_mqa_logits",
        "topk_transform"]
    assert full.class_name == shared.class_name == "moe" and plans[0].class_name == "dense"


# ---- real kernel names -----------------------------------------------------------------------


@pytest.mark.skipif(not REAL_NAMES.is_file(), reason="shared reference not present")
def test_every_real_name_can_fill_the_place_of_its_op(glm):
    """Each real kernel name of the TSV whose op the GLM ledger declares: its candidate ops
    (every op that claims the name) include the op, or the name is a GEMM only a generic op
    claims (tile-named cuBLAS, sm100 DeepGEMM without a shape), which may fill the place of any
    op that declares GEMM shapes. So the real router GEMM (`nvjet_sm100_tst_..._splitK_TNN`) and
    the real absorption bmms fill their places."""
    classifier = OpClassifier(glm)
    generic = {name for name, op in glm.ops.items() if op.fallback}
    shaped = {name for name, op in glm.ops.items() if op.gemm}
    with REAL_NAMES.open(newline="") as handle:
        rows = [r for r in csv.DictReader(handle, delimiter="\t") if r["op"] in glm.ops]
    checked = 0
    for row in rows:
        candidates = set(classifier.all_matches(row["kernel_name"]))
        assert classifier.classify(row["kernel_name"]).op in candidates | {"other"}
        op = row["op"]
        fills = {op, "cublas_gemm"} if op in ("router_gemm", "bmm") else {op}
        by_generic = bool(candidates) and candidates <= generic and (op in shaped or op in ("router_gemm",))
        if candidates & fills or by_generic:
            checked += 1
    router_rows = [r for r in rows if r["op"] == "router_gemm" and "nvjet" in r["kernel_name"]]
    assert len(router_rows) >= 2
    for row in router_rows:
        assert set(classifier.all_matches(row["kernel_name"])) == {"cublas_gemm"}
    # the 7 others are names no op of the GLM ledger claims at all (DeepSeek-V3's fused_a_gemm
    # for qkv_a, NVFP4 quantization, DeepEP normal-mode notify kernels, ATen sampling): a gap of
    # the ops' patterns, not of the places
    assert (checked, len(rows)) == (67, 74)


# ---- the ledger format -----------------------------------------------------------------------


def _ledger_with(tmp_path, glm, class_text: str) -> Path:
    text = write_expectations(glm)
    cut = text.index("[layers.classes.dense]")
    path = tmp_path / "l.toml"
    path.write_text(text[:cut] + class_text, encoding="utf-8")
    return path


@pytest.mark.parametrize("class_text, problem", [
    ('[layers.classes.dense]\nlayers = "0-77"\nsequence = ["no_such_op"]\n', "unknown op 'no_such_op'"),
    ('[layers.classes.dense]\nlayers = "0-77"\nsequence = ["rope 3-1"]\n', "contradictory count"),
    ('[layers.classes.dense]\nlayers = "0-77"\nsequence = ["rope 0"]\n', "must be 1 to 64"),
    ('[layers.classes.dense]\nlayers = "0-77"\nsequence = ["rope x"]\n', "cannot read 'rope x'"),
    ('[layers.classes.dense]\nlayers = "0-77"\ninsert_before = "rope"\n', "insert_before needs a sequence"),
    ('[layers.classes.a]\nlayers = "0-77"\nsequence = ["rope"]\n[layers.classes.b]\nlayers = "5"\n'
     'sequence = ["rope"]\n', "layer 5 gets a whole sequence from both class 'a' and class 'b'"),
    ('[layers.classes.a]\nlayers = "0-77"\nsequence = ["rope"]\n[layers.classes.b]\nlayers = "5"\n'
     'sequence = ["kv_write"]\ninsert_before = "q_b_proj"\n', "layer 5 has no class sequence with op 'q_b_proj'"),
])
def test_bad_sequences_are_one_clear_error(tmp_path, glm, class_text, problem):
    with pytest.raises(ExpectationsError, match=problem.replace("(", r"\(")):
        nsys_ledger.load_expectations(_ledger_with(tmp_path, glm, class_text))


def test_sequences_round_trip(tmp_path, glm):
    path = tmp_path / "again.toml"
    path.write_text(write_expectations(glm), encoding="utf-8")
    again = nsys_ledger.load_expectations(path)
    assert [(c.name, c.sequence, c.insert_before) for c in again.layer_classes] == [
        (c.name, c.sequence, c.insert_before) for c in glm.layer_classes]
    moe = next(c for c in glm.layer_classes if c.name == "moe")
    assert [e.text() for e in moe.sequence[15:19]] == [
        "router_gemm|cublas_gemm", "deepgemm_dense", "act_and_mul", "deepgemm_dense"]
