"""The GLM-5.3 ledger against kernel names copied from real SGLang / vLLM profiles.

`shared/reference/real-kernel-names.tsv` holds 82 real names with the op of our ledger each
belongs to. Every row whose op the ledger declares must map to that op through `expectations
match`; GEMM rows come from DeepSeek-V3 (other N, K), so they are re-shaped to GLM-5.3's N, K
first, in the spelling of their own demangler. Rows the ledger cannot map are listed below
with the reason, so a change in what maps is a visible decision.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_ledger.attribution.kernel_names import function_name, gemm_signature, template_args
from nsys_ledger.attribution.ops import BY_GEMM, BY_NOTHING, OpClassifier
from nsys_ledger.ledger import load_expectations

REPO = Path(__file__).resolve().parents[1]
GLM = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"
from shared_data import REFERENCE, skip_without_shared  # noqa: E402

TSV = REFERENCE / "real-kernel-names.tsv"

# DeepSeek-V3 (TP1) shape of the row -> the GLM-5.3 (TP8) shape the ledger declares for the op.
GLM_SHAPES = {
    "qkv_a_proj": ((2112, 7168), (2624, 6144)),
    "q_b_proj": ((24576, 1536), (2048, 2048)),
    "o_proj": ((7168, 16384), (6144, 2048)),
}

# TSV line number (header = line 1) -> (what the ledger gives, why).
KNOWN_EXCEPTIONS = {
    8: ("cublas_gemm", "cuBLAS nvjet names carry the tile, not the problem: the absorption bmm counts as the "
                       "generic GEMM, in the same attention group"),
    9: ("cublas_gemm", "cuBLAS nvjet absorption bmm: tile only in the name (see line 8)"),
    25: ("cublas_gemm", "CUTLASS absorption bmm: tile only in the name"),
    26: ("cublas_gemm", "CUTLASS absorption bmm: tile only in the name"),
    43: (None, "NVFP4 activation quantization of an FP4 deployment: the FP8 ledger has no such op"),
    48: (None, "NVFP4 activation quantization of an FP4 deployment (see line 43)"),
    53: ("cublas_gemm", "router GEMM through cuBLAS nvjet on B200: tile only in the name"),
    71: ("cublas_gemm", "router GEMM through cuBLAS nvjet on B200: tile only in the name"),
    60: ("deepep_other", "DeepEP normal-mode notify kernel (prefill): kept out of the decode dispatch anchor"),
    63: ("deepep_other", "DeepEP normal-mode cached notify (prefill): kept out of the decode combine count"),
    64: ("deepgemm_dense", "sm100 dense DeepGEMM with a runtime shape (0u, 0u, 0u): the name cannot tell o_proj "
                           "from other GEMMs, so it counts as the generic fallback"),
    77: (None, "vLLM's sampler is generic ATen kernels (exponential noise + argmax), not a sampling kernel"),
    78: (None, "vLLM's sampler: an ATen argmax reduction (see line 77)"),
}


def _rows() -> list[tuple[int, dict[str, str]]]:
    if not TSV.is_file():
        skip_without_shared()
    with open(TSV, newline="") as fh:
        return [(i, row) for i, row in enumerate(csv.DictReader(fh, delimiter="\t"), start=2)]


def reshape(name: str, old: tuple[int, int], new: tuple[int, int]) -> str:
    """Replace the neighbouring template arguments N, K = `old` by `new`, keeping the spelling
    (`(unsigned int)2112` or `2112u` or `2112`)."""
    pattern = re.compile(
        rf"(\((?:unsigned )?int\))?{old[0]}(u?)(, )(\((?:unsigned )?int\))?{old[1]}(u?)(?=[,>])"
    )
    replaced, count = pattern.subn(
        lambda m: f"{m.group(1) or ''}{new[0]}{m.group(2)}{m.group(3)}{m.group(4) or ''}{new[1]}{m.group(5)}", name
    )
    assert count == 1, (old, name)
    return replaced


@pytest.fixture(scope="module")
def classifier() -> OpClassifier:
    return OpClassifier(load_expectations(GLM))


def test_every_declared_row_maps_to_its_op(classifier):
    declared = set(load_expectations(GLM).ops)
    rows = [(line, row) for line, row in _rows() if row["op"] in declared]
    assert len(rows) == 74  # 82 rows, 8 of them `other`
    wrong = {}
    for line, row in rows:
        name = row["kernel_name"]
        if row["op"] in GLM_SHAPES and line not in KNOWN_EXCEPTIONS:
            name = reshape(name, *GLM_SHAPES[row["op"]])
        match = classifier.classify(name)
        got = match.op if match.matched_by != BY_NOTHING else None
        if line in KNOWN_EXCEPTIONS:
            assert got == KNOWN_EXCEPTIONS[line][0], (line, got)
        elif got != row["op"]:
            wrong[line] = (row["op"], got)
    assert wrong == {}
    assert len(KNOWN_EXCEPTIONS) == 13


def test_every_deepgemm_layout_matches_by_shape(classifier):
    """Each DeepGEMM layout of the TSV, re-shaped, reaches qkv_a_proj through its shape."""
    layouts = {}
    for line, row in _rows():
        if row["op"] == "qkv_a_proj":
            name = reshape(row["kernel_name"], *GLM_SHAPES["qkv_a_proj"])
            layouts[function_name(name)] = classifier.classify(name)
    assert set(layouts) == {"sm90_fp8_gemm_1d2d_impl", "fp8_gemm_kernel", "fused_a_gemm_kernel"}
    for match in layouts.values():
        assert (match.op, match.matched_by, match.detail) == ("qkv_a_proj", BY_GEMM, "normal GEMM N=2624 K=6144")


def test_unseen_layouts_still_match_by_shape(classifier):
    """Not tuned to the TSV: another argument count, another epilogue, DeepSeek's own namespace,
    a named GemmType and c++filt spelling all reach the op by N, K and kind."""
    unseen = {
        # one more argument before K's neighbours shift, a new epilogue, no trailing flag
        "void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, (cute::UMMA::Major)1, (unsigned int)0, "
        "(unsigned int)6144, (unsigned int)2048, (unsigned int)1, (unsigned int)64, (deep_gemm::GemmType)0, "
        "deep_gemm::EpilogueScaled<float>>(float *, int *)": "o_proj",
        "void dpsk::gemm::fp8_gemm_kernel<2048u, 2048u, 64u, 64u, 128u, 0u, 128u, 1u, 8u, 128u, 128u, 1u, true, "
        "deep_gemm::GemmType::Normal>(__nv_bfloat16*, float*, int*, unsigned int)": "q_b_proj",
        "void deep_gemm::sm90_bf16_gemm_impl<0u, 4096u, 2048u, 1u, 64u, 128u, (deep_gemm::GemmType)0>(int*)": "indexer_gemm",
        # masked absorption (N, K = 512, 192) before the routed MoE's any-shape grouped GEMM
        "void deep_gemm::sm100_fp8_gemm_1d1d_impl<(cute::UMMA::Major)0, 128u, 128u, 0u, 512u, 192u, 16u, "
        "(deep_gemm::GemmType)2>(int*)": "bmm",
        "void deep_gemm::sm100_fp8_gemm_1d1d_impl<(cute::UMMA::Major)0, 128u, 128u, 0u, 4096u, 6144u, 32u, "
        "(deep_gemm::GemmType)2>(int*)": "moe_gemm",
        # the same shape as o_proj but grouped: not o_proj
        "void deep_gemm::sm90_fp8_gemm_1d2d_impl<(unsigned int)0, (unsigned int)6144, (unsigned int)2048, "
        "(unsigned int)32, (deep_gemm::GemmType)1>(float *)": "moe_gemm",
    }
    got = {name: classifier.classify(name).op for name in unseen}
    assert got == unseen


def test_template_arguments_in_both_demangler_styles():
    nsys = ("void deep_gemm::fp8_gemm_kernel<(unsigned int)2624, (unsigned int)6144, (bool)1, "
            "(deep_gemm::GemmType)2>(float *)")
    cxxfilt = "void deep_gemm::fp8_gemm_kernel<2624u, 6144u, true, (deep_gemm::GemmType)2>(float*)"
    for name in (nsys, cxxfilt):
        sig = gemm_signature(name)
        assert (sig.ints, sig.kind, sig.probable_shape()) == ((2624, 6144), "masked", (2624, 6144))
    assert template_args("void (anonymous namespace)::k<std::array<int, 8>, 8u>(int)") == ("std::array<int, 8>", "8u")
    assert template_args("void k<1, 2") == ()  # a name cut by its source
    # sm100 dense GEMMs do not state their shape
    runtime = "void deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl<(cute::UMMA::Major)0, 128u, 128u, 0u, 0u, 0u, 16u>(int*)"
    assert gemm_signature(runtime).probable_shape() is None
    assert gemm_signature("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(float*)") is None


def test_expectations_match_command():
    names = [
        "void deep_gemm::fp8_gemm_kernel<2624u, 6144u, 64u, (deep_gemm::GemmType)0>(float*)",
        "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*)",
        "nvjet_tst_256x8_64x6_2x1_v_bz_TNT",
        "my_custom_kernel",
    ]
    cmd = [sys.executable, "-m", "nsys_ledger.cli", "expectations", "match", str(GLM)]
    text = subprocess.run(cmd, input="\n".join(names) + "\n", capture_output=True, text=True, check=True).stdout
    lines = text.splitlines()
    assert len(lines) == 4
    assert lines[0].startswith("qkv_a_proj\tattention\tgemm: normal GEMM N=2624 K=6144\t")
    assert lines[1].startswith("fused_add_rmsnorm\tattention\tpattern: FusedAddRMSNormKernel\t")
    assert lines[2].startswith("cublas_gemm\tattention\tpattern: nvjet_ (generic fallback)\t")
    assert lines[3] == "no op\t-\t-\tmy_custom_kernel"
    text = subprocess.run(cmd + ["--json"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    docs = [json.loads(line) for line in text.splitlines()]
    assert [d["op"] for d in docs] == ["qkv_a_proj", "fused_add_rmsnorm", "cublas_gemm", None]
    assert [d["matched_by"] for d in docs] == ["gemm", "pattern", "pattern", "none"]
    assert docs[2]["fallback"] is True


SHARED = TSV.parent.parent
B200 = SHARED / "real_traces" / "kineto" / "AMD-AGI__TraceLens__b200_eager_trace.json.gz"
LEDGERS = sorted((REPO / "expectations").glob("*.toml"))

# Names of real builds the ledgers did not know, as the demangler prints them; each from the
# kernel's definition in its project's source (file named), with the template arguments of
# its launch there.
FROM_SOURCE = {
    # FlashMLA's first release (and the builds vendoring it, e.g. vLLM's): csrc/flash_fwd_mla_kernel.h,
    # flash::flash_fwd_splitkv_mla_combine_kernel<Kernel_traits, kMaxSplits>
    "void flash::flash_fwd_splitkv_mla_combine_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, "
    "cutlass::bfloat16_t, 512>, 32>(Flash_fwd_mla_params)": "mla_combine",
    # FlashMLA today: csrc/cuda_kernels/smxx/decode/combine/combine.cu (sparse decode split-KV combine)
    "void smxx::decode::flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 8, 32, 256, false>"
    "(SparseAttnDecodeParams)": "mla_combine",
    # PyTorch symmetric memory (vLLM's symm-mem all-reduce):
    # torch/csrc/distributed/c10d/symm_mem/CUDASymmetricMemoryOps.cu
    "void (anonymous namespace)::multimem_one_shot_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, "
    "c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)": "allreduce",
    "void (anonymous namespace)::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, "
    "c10::BFloat16*, c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long, "
    "unsigned long)": "allreduce",
    "void (anonymous namespace)::two_shot_all_reduce_kernel_inplace<c10::BFloat16, 16, 8>(c10::BFloat16**, "
    "unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)": "allreduce",
}


@pytest.mark.parametrize("ledger", LEDGERS, ids=lambda p: p.stem)
def test_flashmla_combine_and_symmetric_memory_all_reduce_names_from_their_sources(ledger):
    classifier = OpClassifier(load_expectations(ledger))
    assert {name: classifier.classify(name).op for name in FROM_SOURCE} == FROM_SOURCE


@pytest.mark.skipif(not B200.is_file(), reason=f"no real Kineto traces at {B200.parent}")
@pytest.mark.parametrize("ledger", LEDGERS, ids=lambda p: p.stem)
def test_pytorch_symmetric_memory_all_reduce_of_a_real_vllm_b200_trace(ledger):
    """vLLM on B200 (TP8) all-reduces through PyTorch's multimem kernel: every all-reduce
    kernel of the trace, counted in the JSON, is the ledger's allreduce, and nothing else is."""
    events = json.loads(gzip.decompress(B200.read_bytes()))["traceEvents"]
    names = [e["name"] for e in events if e.get("cat") == "kernel"]
    all_reduce = [n for n in names if re.search(r"all_?reduce", n, re.IGNORECASE)]
    assert len(all_reduce) == 73
    assert {function_name(n) for n in all_reduce} == {"multimem_all_reduce_kernel"}
    classifier = OpClassifier(load_expectations(ledger))
    ops = {name: classifier.classify(name).op for name in set(names)}
    assert sum(ops[n] == "allreduce" for n in names) == 73


@pytest.mark.parametrize("ledger", LEDGERS, ids=lambda p: p.stem)
def test_inductor_rms_norm_reduction_is_not_moe_sum(ledger):
    """vLLM under torch.compile: the RMSNorm is an Inductor reduction named after what it fused
    (the name below is quoted by the shared reference); only a fused `sum` is moe_sum."""
    reference = (TSV.parent / "real-kernel-names.md")
    if not reference.is_file():
        pytest.skip(f"{reference} not present (shared reference files)")
    rms_norm = "triton_red_fused__to_copy_embedding_rms_norm_0"
    assert f"`{rms_norm}`" in reference.read_text()
    classifier = OpClassifier(load_expectations(ledger))
    assert classifier.classify(rms_norm).op != "moe_sum"
    if "vllm" in ledger.stem:  # vLLM's merge of shared and routed output: an Inductor pointwise kernel
        assert classifier.classify("triton_poi_fused_add_mul_2").op == "moe_sum"
    else:  # sgl-kernel's
        assert classifier.classify("moe_sum_reduce_kernel").op == "moe_sum"
