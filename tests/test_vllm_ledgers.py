"""The vLLM ledgers (expectations/*-vllm-*.toml) against their samples, the generator's role
counts, and the real vLLM kernel names in ../shared.

* Each healthy vLLM sample passes its ledger with the literal step and kernel counts; the
  broken-fusion sample fails with the findings that name the fault.
* `role_counts_per_step` is what the generator launches (the roles set where the schedule adds
  each launch): literal per-role figures for GLM-5.3 on vLLM and SGLang and their difference,
  the figure `compare` must reproduce.
* Every real vLLM kernel name of the shared reference TSV and of the real vLLM Kineto traces
  goes to the op a literal table says (or to no op, with the reason), so a pattern that only
  fits our synthetic names shows here.
"""

from __future__ import annotations

import csv
import gzip
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from nsys_ledger.attribution.ops import OpClassifier
from nsys_ledger.ledger import load_expectations
from nsys_ledger.ledger.roles import ROLES
from nsys_ledger.synth.schedule import decode_schedule, role_counts_per_step
from nsys_ledger.synth.topologies import TOPOLOGIES

from shared_data import KINETO_TRACES, REFERENCE, needs_shared

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GLM_VLLM = REPO / "expectations" / "glm-5.3-vllm-tp8-ep8.toml"
DSV32_VLLM = REPO / "expectations" / "deepseek-v3.2-vllm-tp8-ep8.toml"
VLLM_LEDGERS = (GLM_VLLM, DSV32_VLLM)
TSV = REFERENCE / "real-kernel-names.tsv"
B200 = KINETO_TRACES / "AMD-AGI__TraceLens__b200_eager_trace.json.gz"
AMD_FULL_GRAPH = KINETO_TRACES / "AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution.json.gz"


def _check(sample: str, ledger: Path, tmp_path: Path) -> tuple[int, dict, str]:
    out = tmp_path / "check.json"
    proc = subprocess.run(
        [sys.executable, "-m", "nsys_ledger.cli", "check", str(SAMPLES / sample), "--expect", str(ledger),
         "--json", str(out)],
        capture_output=True, text=True, cwd=REPO,
    )
    return proc.returncode, json.loads(out.read_text()), proc.stdout


# ---- samples ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sample", "ledger", "kernels", "graph_launches", "method"),
    [
        ("glm5-vllm-graph-healthy.sqlite", GLM_VLLM, 2737, 1, "nvtx"),
        ("glm5-vllm-piecewise-healthy.sqlite", GLM_VLLM, 2737, 100, "graph"),
        ("dsv32-vllm-graph-healthy.sqlite", DSV32_VLLM, 2536, 1, "nvtx"),
    ],
)
def test_healthy_vllm_samples_pass(sample, ledger, kernels, graph_launches, method, tmp_path):
    rc, doc, _ = _check(sample, ledger, tmp_path)
    assert rc == 0
    assert doc["verdict"] == "pass"
    assert doc["findings"] == []
    assert doc["step_detection"]["method"] == method
    assert doc["step_detection"]["decode_steps"] == 4
    assert [s["kernels"] for s in doc["steps"]] == [kernels] * 4
    assert [s["graph_launches"] for s in doc["steps"]] == [graph_launches] * 4
    # every kernel of the step is claimed by an op of the ledger
    assert doc["op_coverage"]["no_op"]["kernels"] == 0


def test_piecewise_launches_attention_eagerly(tmp_path):
    """PIECEWISE: 100 graph replays per step and the 535 eager launches between and around
    them (6 MLA-attention kernels x 78 layers, 3 indexer kernels x 21, the indexer metadata,
    the row gather, the LM head, the logits all-gather) plus the argmax; FULL: 1 replay and
    those 4 + 1."""
    _, piecewise, _ = _check("glm5-vllm-piecewise-healthy.sqlite", GLM_VLLM, tmp_path)
    assert [s["cpu_submissions"] for s in piecewise["steps"]] == [100 + 535 + 1 + 3] * 4
    _, full, _ = _check("glm5-vllm-graph-healthy.sqlite", GLM_VLLM, tmp_path)
    assert [s["cpu_submissions"] for s in full["steps"]] == [1 + 4 + 1 + 3] * 4


def test_broken_inductor_fusion_is_named(tmp_path):
    """The RMSNorm + FP8 quant fusion broken at its 159 sites: the fused kernels are gone, the
    unfused norms and a group quant each take their place."""
    rc, doc, text = _check("glm5-vllm-graph-broken-fusion.sqlite", GLM_VLLM, tmp_path)
    assert rc == 1
    assert doc["verdict"] == "fail"
    assert [s["kernels"] for s in doc["steps"]] == [2896] * 4  # 2737 + 159
    sources = {f["source"] for f in doc["findings"]}
    assert {"anchors.rms_norm_quant", "anchors.rms_norm_quant_latent", "anchors.fused_add_rmsnorm",
            "total"} <= sources
    flat = " ".join(text.split())
    assert "rms_norm_quant kernels: 0 per step, expected 80 (= layers - 1 + dense_layers)" in flat
    assert "rms_norm_quant_latent kernels: 0 per step, expected 79 (= layers + 1)" in flat
    assert "fused_add_rmsnorm kernels: 156 per step, expected 76 (= moe_layers + 1)" in flat
    assert "kernels: 2896 per step, expected 2737" in flat
    assert "the RMSNorm + quant fusion did not happen (a broken torch.compile fusion" in flat



@pytest.mark.parametrize(
    ("sample", "ledger", "kernels", "messages"),
    [
        # the same 159 fused sites broken inside PIECEWISE graphs: the same findings as in FULL
        ("glm5-vllm-piecewise-broken-fusion.sqlite", GLM_VLLM, 2896, [
            "rms_norm_quant kernels: 0 per step, expected 80 (= layers - 1 + dense_layers)",
            "fused_add_rmsnorm kernels: 156 per step, expected 76 (= moe_layers + 1)",
            "kernels: 2896 per step, expected 2737"]),
        # DeepSeek-V3.2's 61 layers: 125 sites (63 + 62), 2536 + 125 kernels
        ("dsv32-vllm-graph-broken-fusion.sqlite", DSV32_VLLM, 2661, [
            "rms_norm_quant kernels: 0 per step, expected 63 (= layers - 1 + dense_layers)",
            "rms_norm_quant_latent kernels: 0 per step, expected 62 (= layers + 1)",
            "fused_add_rmsnorm kernels: 122 per step, expected 59 (= moe_layers + 1)",
            "kernels: 2661 per step, expected 2536"]),
    ],
    ids=["glm-piecewise", "dsv32"],
)
def test_every_vllm_topology_has_a_faulted_sample_the_ledger_names(sample, ledger, kernels, messages, tmp_path):
    rc, doc, text = _check(sample, ledger, tmp_path)
    assert rc == 1 and doc["verdict"] == "fail"
    assert [s["kernels"] for s in doc["steps"]] == [kernels] * 4
    flat = " ".join(text.split())
    for message in messages:
        assert message in flat

# ---- declared role counts ----------------------------------------------------------------------
GLM_VLLM_ROLES = {
    "allreduce": 157, "attention": 78, "attention_combine": 78, "attn_quant": 78, "embedding": 3,
    "ffn_act": 153, "ffn_dense_gemm": 156, "ffn_quant": 303, "indexer_cache": 21,
    "indexer_logits": 21, "indexer_norm": 21, "indexer_proj": 63, "indexer_quant": 21,
    "indexer_topk": 21, "kv_write": 78, "latent_norm": 156, "lm_head": 2, "logits_gather": 1,
    "mla_absorb": 156, "moe_combine": 75, "moe_dispatch": 150, "moe_gemm": 150, "moe_sum": 75,
    "moe_topk": 75, "o_proj": 78, "page_table": 78, "q_b_proj": 78, "qkv_a_proj": 78,
    "residual_norm": 157, "rope": 99, "router": 75, "sampling": 1, "step_metadata": 1,
}
# vLLM minus SGLang, GLM-5.3 TP8/EP8 decode (roles where they differ)
GLM_VLLM_MINUS_SGLANG = {
    "allreduce": 79,        # the FFN's all-reduce of every layer + the embedding's
    "attn_quant": 78,       # o_proj's input quantization
    "embedding": 2,         # the vocab mask and masked_fill around the lookup
    "ffn_act": 75,          # the routed experts' SiLU-and-mul (SGLang's DeepGEMM path fuses it)
    "ffn_quant": 228,       # shared and routed quantization before each GEMM
    "indexer_proj": 21,     # weights_proj apart from wk
    "lm_head": 1,           # the gather of the sampled tokens' rows before it
    "logits_gather": 1,
    "moe_combine": 0,       # moe_sum_kernel in place of DeepEP's combine
    "moe_dispatch": 75,     # moe_align_block_size + count_and_sort in place of DeepEP's dispatch
    "page_table": 78,       # the request-to-global index conversion
    "rope": 21,             # the indexer's own RoPE
    "step_metadata": 1,
}


def test_role_counts_of_the_vllm_glm_step():
    counts = role_counts_per_step("glm-5.3-vllm-tp8-ep8")
    assert counts == GLM_VLLM_ROLES
    assert sum(counts.values()) == 2737
    # PIECEWISE moves launches out of the graphs; what runs does not change
    assert role_counts_per_step("glm-5.3-vllm-tp8-ep8-piecewise") == GLM_VLLM_ROLES


def test_vllm_minus_sglang_role_counts():
    vllm = role_counts_per_step("glm-5.3-vllm-tp8-ep8")
    sglang = role_counts_per_step("glm-5.3-tp8-ep8")
    assert sum(sglang.values()) == 2077
    delta = {role: vllm.get(role, 0) - sglang.get(role, 0) for role in set(vllm) | set(sglang)}
    assert {r: d for r, d in delta.items() if d or r == "moe_combine"} == GLM_VLLM_MINUS_SGLANG
    assert sum(delta.values()) == 2737 - 2077


@pytest.mark.parametrize("topology", sorted(TOPOLOGIES))
def test_every_launch_has_a_role_of_the_vocabulary(topology):
    """Counted from the launches: the per-role counts add up to the step's kernels, and every
    healthy launch has a role of the shared vocabulary."""
    schedule = decode_schedule(topology=topology)
    counts = role_counts_per_step(topology)
    assert sum(counts.values()) == len(schedule.kernels) + 1
    assert set(counts) <= set(ROLES)


def test_role_counts_are_not_read_from_kernel_names():
    """Two launches of one kernel with different roles: the router and the absorption bmm are
    tile-named cuBLAS GEMMs, the group quant serves three roles."""
    schedule = decode_schedule(topology="glm-5.3-vllm-tp8-ep8")
    roles_by_kernel: dict[str, set[str]] = {}
    for k in schedule.kernels:
        roles_by_kernel.setdefault(k.kernel.key, set()).add(k.role)
    assert roles_by_kernel["vllm_group_quant"] == {"attn_quant", "indexer_quant", "ffn_quant"}
    assert roles_by_kernel["vllm_multimem_all_reduce"] == {"allreduce"}
    assert roles_by_kernel["gemm_indexer_wk_weights"] == {"indexer_proj"}
    assert roles_by_kernel["vllm_rotary"] == {"rope"}
    assert Counter(k.role for k in schedule.kernels if k.eager) == Counter(
        {"step_metadata": 1, "lm_head": 2, "logits_gather": 1})


# ---- real vLLM names -----------------------------------------------------------------------------
# real-kernel-names.tsv line (header = line 1) -> the op of both vLLM ledgers
TSV_VLLM_ROWS = {
    73: "allreduce",          # flashinfer's fused all-reduce (one-shot lamport)
    74: "allreduce",          # NCCL ring-LL all-reduce
    75: "logits_all_gather",  # the logits all-gather after the LM head
    76: "fused_add_rmsnorm",  # vLLM's fused_add_rms_norm_kernel
    77: "sampling",           # the sampler's exponential noise
    78: "sampling",           # the sampler's argmax
}


@needs_shared(TSV)
@pytest.mark.parametrize("ledger", VLLM_LEDGERS, ids=lambda p: p.stem)
def test_every_vllm_row_of_the_tsv(ledger):
    classifier = OpClassifier(load_expectations(ledger))
    with open(TSV, newline="") as fh:
        rows = {line: row for line, row in enumerate(csv.DictReader(fh, delimiter="\t"), start=2)
                if row["framework"] == "vllm"}
    assert set(rows) == set(TSV_VLLM_ROWS)
    assert {line: classifier.classify(row["kernel_name"]).op for line, row in rows.items()} == TSV_VLLM_ROWS
    # the TSV's own op names agree with ours (the TSV says `allreduce`, `sampling`, ...)
    assert {line: row["op"] for line, row in rows.items()} == TSV_VLLM_ROWS


# A fragment of each distinct kernel name of the two real vLLM Kineto traces -> the op both
# vLLM ledgers give it, or None with the reason in the comment. Every name must hit exactly one
# fragment, so a new name in the traces fails the test until it is placed here.
REAL_VLLM_NAMES = {
    # vLLM on B200, TP8, a 36-layer MoE (MXFP4 experts through trtllm-gen), eager prefill
    "multimem_all_reduce_kernel": "allreduce",
    "fused_add_rms_norm_kernel": "fused_add_rmsnorm",
    "vllm::rms_norm_kernel": "rmsnorm",
    "vllm::rotary_embedding_kernel": "rope",
    "vllm::reshape_and_cache_flash_kernel": "kv_write",
    "vllm::scaled_fp8_quant_kernel_strided": "per_token_group_quant",
    "tensorrt_llm::kernels::quantize_with_block_size": "per_token_group_quant",
    "routingIndicesHistogramScoresKernel": "moe_topk",
    "routingIndicesHistogramKernel": "moe_align",
    "routingIndicesOffsetsKernel": "moe_align",
    "bmm_MxE4m3_MxE2m1MxE4m3": "moe_gemm",
    "bmm_Bfloat16_MxE2m1MxE4m3": "moe_gemm",
    "finalizeKernelVecLoad": "moe_topk_sum",
    "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvCausal": "prefill_attention",
    "fmhaSm100aKernel_QkvE4m3OBfloat16H64PagedKvSlidingOrChunkedCausal": "prefill_attention",
    "ncclDevKernel_AllGather_RING_LL": "logits_all_gather",
    "triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0": "embedding",
    "masked_fill_kernel": "embedding",
    "nvjet_tst_": "cublas_gemm",  # 4 tile-named cuBLAS GEMMs (qkv, o_proj, router, LM head)
    "_copy_page_indices_kernel": None,  # trtllm-gen attention's page-table copy of a GQA model
    "direct_copy_kernel_cuda": None,  # ATen copies (2 names)
    "index_elementwise_kernel": None,  # ATen indexing
    "CUDAFunctorOnSelf_add": None,  # ATen in-place add of positions
    "FillFunctor": None,  # ATen fill (2 names across the traces)
    "vectorized_gather_kernel": "logits_rows",  # ATen gather of the sampled tokens' rows
    # vLLM V1 on an AMD GPU, a 24-layer MoE, FULL graph decode
    "Cijk_": "cublas_gemm",  # hipBLASLt GEMMs (4 names)
    "ck_tile6kentry": None,  # ROCm ck_tile RMSNorm (2 names): a ROCm kernel, not this H200 ledger's
    "_topk_forward": "moe_topk",  # OpenAI triton_kernels routing (vLLM's MXFP4 MoE)
    "_sum_bitmatrix_rows": "moe_align",
    "_combined_routing_compute": "moe_align",
    "_combined_routing_memset": "moe_align",
    "_matmul_ogs_": "moe_gemm",  # 2 names: gate_up with SwiGLU, down
    "_finalize_matmul_scatter_bf16": "moe_topk_sum",
    "kernel_unified_attention_": None,  # vLLM's Triton attention of a GQA model (2 names): no MLA
    "reduce_segments": None,  # its split reduction
    "triton_poi_fused_0": None,  # Inductor pointwise glue
    "triton_poi_fused__to_copy_1": None,
    "triton_poi_fused_constant_pad_nd_moe_forward_0": None,
    "elementwise_kernel_manual_unroll": None,  # ATen copy
}


def _real_vllm_names() -> list[str]:
    names: set[str] = set()
    for path in (B200, AMD_FULL_GRAPH):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        names |= {e["name"] for e in events if e.get("cat") == "kernel"}
    return sorted(names)


@needs_shared(B200, AMD_FULL_GRAPH)
@pytest.mark.parametrize("ledger", VLLM_LEDGERS, ids=lambda p: p.stem)
def test_every_real_vllm_kineto_name(ledger):
    classifier = OpClassifier(load_expectations(ledger))
    names = _real_vllm_names()
    assert len(names) == 50  # 29 + 24 distinct kernel names, 3 in both traces
    got, expected = {}, {}
    for name in names:
        # fragments may overlap (`fused_add_rms_norm_kernel` is not `vllm::rms_norm_kernel`);
        # the longest fragment in the name decides
        hits = [f for f in REAL_VLLM_NAMES if f in name]
        assert hits, name
        fragment = max(hits, key=len)
        match = classifier.classify(name)
        got[name] = None if match.matched_by == "none" else match.op
        expected[name] = REAL_VLLM_NAMES[fragment]
    assert got == expected


@needs_shared(B200)
def test_b200_all_reduces_and_norms_counted_by_the_ledger():
    """The counts the ledger's anchors reason with, from the JSON itself: 73 all-reduces (2 per
    layer + 1) and 72 fused_add_rms_norm (2 per layer), all claimed by the expected ops."""
    events = json.loads(gzip.decompress(B200.read_bytes()))["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "kernel"]
    classifier = OpClassifier(load_expectations(GLM_VLLM))
    ops = Counter(classifier.classify(n).op for n in names)
    assert sum("multimem_all_reduce_kernel" in n for n in names) == 73
    assert ops["allreduce"] == 73
    assert sum("fused_add_rms_norm_kernel" in n for n in names) == 72
    assert ops["fused_add_rmsnorm"] == 72


@pytest.mark.parametrize("ledger", VLLM_LEDGERS, ids=lambda p: p.stem)
def test_inductor_norms_when_custom_ops_are_off(ledger):
    """torch.compile with vLLM's custom ops off: the norms are Inductor reductions named after
    their aten ops (real-kernel-names.md quotes `triton_red_fused__to_copy_embedding_rms_norm_0`:
    the embedding fused into layer 0's norm); the fused norm + quant keeps vLLM's kernel."""
    classifier = OpClassifier(load_expectations(ledger))
    assert classifier.classify("triton_red_fused__to_copy_embedding_rms_norm_0").op == "embedding"
    assert classifier.classify("triton_red_fused__to_copy_add_rms_norm_2").op == "fused_add_rmsnorm"
    assert classifier.classify("triton_per_fused__to_copy_rms_norm_1").op == "rmsnorm"
    # nsys and c++filt spellings of the fused kernel's has_residual argument
    residual = ("void vllm::rms_norm_per_block_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn, (bool)1, (bool)1, "
                "(int)128>(T2 *, float *, const T1 *, const T1 *, const float *, float, int, T1 *)")
    plain = residual.replace("(bool)1, (bool)1", "(bool)0, (bool)1")
    assert classifier.classify(residual).op == "rms_norm_quant"
    assert classifier.classify(plain).op == "rms_norm_quant_latent"
    cxxfilt = ("void vllm::rms_norm_per_block_quant_kernel<c10::BFloat16, c10::Float8_e4m3fn, true, true, 128>"
               "(c10::Float8_e4m3fn*, float*, c10::BFloat16 const*)")
    assert classifier.classify(cxxfilt).op == "rms_norm_quant"
    assert classifier.classify(cxxfilt.replace("true, true", "false, true")).op == "rms_norm_quant_latent"


def test_synth_cli_writes_a_piecewise_vllm_step(tmp_path):
    out = tmp_path / "pw.sqlite"
    proc = subprocess.run(
        [sys.executable, "-m", "nsys_ledger.cli", "synth", str(out), "--topology", "glm-5.3-vllm-tp8-ep8-piecewise",
         "--steps", "1"],
        capture_output=True, text=True, cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    assert ("glm-5.3-vllm-tp8-ep8-piecewise, graph mode, 1 decode steps, 2737 kernels per step (2201 replayed "
            "in 100 graph launches, 535 eager + sampling)") in proc.stdout
    assert "DeepGEMM layout 2025-07" in proc.stdout


def _ledger_role_tally(sample: str, ledger: Path, tmp_path: Path) -> Counter:
    """Kernels of the first decode step by the role of the ledger op that claims them (each
    kernel's op as the check places it, layer sequences included)."""
    _, doc, _ = _check(sample, ledger, tmp_path)
    roles = {name: op.role for name, op in load_expectations(ledger).ops.items()}
    tally: Counter = Counter()
    for op, row in doc["time_use"]["steps"][0]["ops"].items():
        tally[roles[op]] += row["kernels"]
    return tally


def test_ledgers_and_generator_agree_on_the_role_deltas(tmp_path):
    """What `compare` of the two samples must find per role: the vLLM ledger's tally minus the
    SGLang ledger's equals the generator's role_counts difference, role by role. The ledgers
    see two launches differently from the generator, the same way on both stacks: layer 0's
    input norm (its plain norm takes the latent-norm op's place) and the LM head GEMM (a
    tile-named cuBLAS GEMM outside the layers: the generic GEMM)."""
    vllm = _ledger_role_tally("glm5-vllm-graph-healthy.sqlite", GLM_VLLM, tmp_path)
    sglang = _ledger_role_tally("glm5-graph-healthy.sqlite", REPO / "expectations" / "glm-5.3-tp8-ep8.toml", tmp_path)
    declared_vllm = role_counts_per_step("glm-5.3-vllm-tp8-ep8")
    declared_sglang = role_counts_per_step("glm-5.3-tp8-ep8")
    seen_differently = {"latent_norm": 1, "residual_norm": -1, "lm_head": -1, "gemm_other": 1}
    for tally, declared in ((vllm, declared_vllm), (sglang, declared_sglang)):
        off = {r: tally.get(r, 0) - declared.get(r, 0) for r in set(tally) | set(declared)}
        assert {r: d for r, d in off.items() if d} == seen_differently
    roles = set(vllm) | set(sglang) | set(declared_vllm) | set(declared_sglang)
    assert ({r: vllm.get(r, 0) - sglang.get(r, 0) for r in roles}
            == {r: declared_vllm.get(r, 0) - declared_sglang.get(r, 0) for r in roles})
