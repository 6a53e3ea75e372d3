"""The expectations (ledger) loader, the safe formula evaluator, and the GLM-5.3 ledger."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from nsys_ledger.attribution.ops import BY_NOTHING, OpClassifier

from nsys_ledger.errors import ExpectationsError
from nsys_ledger.ledger import (
    Expectations,
    FormulaError,
    Range,
    compact_layers,
    evaluate,
    evaluate_params,
    load_expectations,
    render_expectations,
)

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

GLM_FULL_INDEXER_LAYERS = [0, 1, 2] + list(range(6, 75, 4))


@pytest.fixture(scope="module")
def glm() -> Expectations:
    return load_expectations(GLM)


# ---- the GLM-5.3 ledger -------------------------------------------------------------------


def test_glm_loads_with_evaluated_params(glm):
    assert glm.params["layers"] == 78
    assert glm.params["dense_layers"] == 3
    assert glm.params["moe_layers"] == 75
    assert glm.params["full_indexer_layers"] == 21
    assert glm.batch == 32
    assert glm.path == str(GLM)
    assert "GLM-5.3" in glm.name


def test_glm_anchors_are_literal_numbers(glm):
    anchors = {a.op: a for a in glm.anchors}
    assert anchors["fused_add_rmsnorm"].expected == Range(156, 156)
    assert anchors["fused_add_rmsnorm"].formula == "2 * layers"
    assert anchors["sparse_mla"].expected == Range(78, 78)
    assert anchors["paged_mqa_logits"].expected == Range(21, 21)
    assert anchors["per_token_group_quant"].expected == Range(75, 75)
    assert anchors["deepep_dispatch"].expected == Range(75, 75)
    assert anchors["sampling"].expected == Range(1, 1)
    assert "chunked" in anchors["paged_mqa_logits"].hint_high
    assert "fusion broke" in anchors["per_token_group_quant"].hint_high
    assert "--cuda-graph-trace=node" in anchors["fused_add_rmsnorm"].hint_low
    assert anchors["fused_add_rmsnorm"].source == "anchors.fused_add_rmsnorm"
    for a in glm.anchors:
        assert a.op in glm.ops


def test_glm_total_gaps_h2d_graphs_steps(glm):
    assert glm.total == Range(1800, 2200)
    assert "--cuda-graph-trace=node" in glm.total_hint_low
    assert "MTP" in glm.total_hint_high
    assert glm.gap_threshold_ns == 2000
    assert glm.h2d.per_step == Range(3, 3)
    assert glm.h2d.max_bytes == 1024 * 1024
    assert glm.h2d.pageable_allowed is False
    assert glm.graph_launches_per_step == Range(1, 1)
    assert glm.steps.method == "auto"
    assert glm.steps.exclude_ops == ("prefill_attention",)
    assert re.search(glm.steps.marker_regex, "void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u>()")
    assert re.search(glm.steps.exclude_nvtx_regex, "Warmup capture")
    assert re.search(glm.steps.exclude_nvtx_regex, "PREFILL bs=4")
    assert not re.search(glm.steps.exclude_nvtx_regex, "decode bs=32")


def test_glm_layer_classes(glm):
    classes = {c.name: c for c in glm.layer_classes}
    assert classes["dense"].layers == (0, 1, 2)
    assert classes["moe"].layers == tuple(range(3, 78))
    assert list(classes["full_indexer"].layers) == GLM_FULL_INDEXER_LAYERS
    assert len(classes["full_indexer"].layers) == 21
    assert classes["full_indexer"].groups == {"indexer": Range(6, 7)}
    assert classes["moe"].groups["deepep"] == Range(2, 2)
    assert classes["moe"].groups["ffn"] == Range(8, 10)
    assert classes["dense"].groups["ffn"] == Range(3, 3)
    assert classes["moe"].groups["attention"].contains(14)
    assert glm.layer_opening_op == "fused_add_rmsnorm"
    # every group a class counts is declared by some op
    groups = {op.group for op in glm.ops.values()}
    for c in glm.layer_classes:
        assert set(c.groups) <= groups


def test_glm_seed_totals_fit(glm):
    """The seed's per-layer counts (attention 14, indexer 6-7, MoE 8 + DeepEP 2, dense 3,
    about 4 outside, optional MTP about 20) fit both the classes and the total."""
    classes = {c.name: c for c in glm.layer_classes}
    assert classes["dense"].groups["attention"].contains(14)
    assert classes["moe"].groups["ffn"].contains(8)
    for indexer in (6, 7):
        assert classes["full_indexer"].groups["indexer"].contains(indexer)
        base = 14 * 78 + indexer * 21 + 8 * 75 + 2 * 75 + 3 * 3 + 4
        assert glm.total.contains(base)
        assert glm.total.contains(base + 20)  # with the MTP draft layer


def test_glm_layer_regex(glm):
    rx = re.compile(glm.layer_regex)
    assert rx.groups == 1
    text = "{'Module': 'model.model.layers.12.self_attn', 'TrainableParams': 0, 'Inputs': []}"
    assert rx.search(text).group(1) == "12"
    assert rx.search("{'Module': 'model.model.layers.3.mlp.experts'}").group(1) == "3"
    assert rx.search("layers.77.input_layernorm").group(1) == "77"
    assert rx.search("layer_5").group(1) == "5"
    assert rx.search("{'Module': 'model.model.norm'}") is None


# Real kernel names (demangled) from the reference doc, with the op each must fall into.
KERNELS = [
    # the indexer's k_norm is an nn.LayerNorm, so ATen's kernel
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>"
     "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, "
     "c10::BFloat16*)", "indexer_k_norm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
     "__nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)", "fused_add_rmsnorm"),
    ("void flashinfer::norm::RMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
     "__nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)", "rmsnorm"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)0, 0u, 2624u, 6144u, 128u, 64u, 128u, "
     "1u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "qkv_a_proj"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)0, 0u, 2048u, 2048u, 128u, 64u, 128u, "
     "1u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "q_b_proj"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)0, 0u, 6144u, 2048u, 128u, 64u, 128u, "
     "1u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "o_proj"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)0, 0u, 4096u, 2048u, 128u, 64u, 128u, "
     "1u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "indexer_gemm"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)0, 0u, 4096u, 6144u, 128u, 64u, 128u, "
     "1u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "deepgemm_dense"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)2, 0u, 4096u, 6144u, 128u, 64u, 128u, "
     "32u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "moe_gemm"),
    ("void deep_gemm::sm90_fp8_gemm_1d2d_impl<(deep_gemm::GemmType)2, 0u, 512u, 192u, 128u, 64u, 128u, "
     "8u, 128u, 128u, 1u, 4u, 2u, 1u, 1u, false, deep_gemm::EpilogueIdentity>(float*, int*, unsigned int, "
     "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)", "bmm"),
    ("void flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel<true, 64u, 8u, 16u, "
     "__nv_bfloat16, long>(__nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, __nv_bfloat16*, float*, long*, "
     "unsigned int, unsigned int, unsigned int, unsigned int, unsigned long, unsigned long)", "rope"),
    ("fused_rope_store_kernel", "rope"),
    # declared after [ops.embedding]: "embedding_kernel" inside a word must not count as embedding
    ("void vllm::rotary_embedding_kernel<c10::BFloat16, true>(long const*, c10::BFloat16*, c10::BFloat16*, "
     "c10::BFloat16 const*, int, long, long, int, int, int)", "rope"),
    ("_per_tensor_quant_mla_fp8_stage1", "mla_absorb_quant"),
    ("_per_tensor_quant_mla_fp8_stage2", "mla_absorb_quant"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "cublas_gemm"),
    ("nvjet_hsh_64x8_64x16_2x1_v_bz_TNN", "cublas_gemm"),
    ("set_mla_kv_buffer_kernel", "kv_write"),
    ("void transform_index_page_table_decode_kernel<64>(int const*, int const*, int*, int, int)", "page_table"),
    ("void flash_fwd_splitkv_mla_fp8_sparse_kernel<cutlass::bfloat16_t, 64, 2>(DecodingParams)", "sparse_mla"),
    ("void flash_fwd_mla_combine_kernel<cutlass::bfloat16_t, 512, 64, 8>(DecodingParams)", "mla_combine"),
    ("void sparse_attn_fwd_kernel<cutlass::bfloat16_t, 64>(SparsePrefillParams)", "prefill_attention"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
    ("void sglang::cross_device_reduce_1stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, "
     "sglang::Signal*, __nv_bfloat16*, int, int)", "allreduce"),
    ("void sglang::cross_device_reduce_2stage<__nv_bfloat16, 8>(sglang::RankData*, sglang::RankSignals, "
     "sglang::Signal*, __nv_bfloat16*, int, int)", "allreduce"),
    ("void all_reduce_two_shot_kernel<__nv_bfloat16, 8>(AllReduceParams)", "allreduce"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<__nv_bfloat16, 8>"
     "(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)", "allreduce"),
    ("_act_quant_kernel", "indexer_act_quant"),
    ("void fused_store_indexer_cache<__nv_bfloat16>(IndexerStoreParams)", "indexer_cache_store"),
    ("_set_k_and_s_triton_kernel", "indexer_cache_store"),
    ("void deep_gemm::sm90_fp8_paged_mqa_logits<64u, 128u, 64u, 2u, 4u, 2u, 256u, 128u>(unsigned int, "
     "unsigned long, unsigned int, unsigned int*, unsigned int*, CUtensorMap_st, CUtensorMap_st, "
     "CUtensorMap_st, CUtensorMap_st, float*, int*)", "paged_mqa_logits"),
    ("void deep_gemm::smxx_paged_mqa_logits_metadata<64u, 32u>(unsigned int, unsigned int, unsigned int*, "
     "unsigned int*)", "paged_mqa_logits_metadata"),
    ("void topk_transform_decode_kernel<2048>(TopKTransformParams)", "topk_transform"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x64x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "router_gemm"),
    ("ampere_sgemm_32x128_tn", "router_gemm"),
    ("void deepseek_v3_topk_kernel<float, 8, 32>(float const*, float const*, float*, int*, int)", "moe_topk"),
    ("void moe_fused_gate_kernel<float, 8, 32>(void*, void*, float*, int*, long, long, long, long, long)", "moe_topk"),
    ("void per_token_group_quant_8bit_kernel<__nv_bfloat16, __nv_fp8_e4m3, false, false>(__nv_bfloat16 const*, "
     "void*, float*, int, int, int, float, float, float, int, int)", "per_token_group_quant"),
    ("fused_moe_kernel", "moe_gemm"),
    ("void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &silu<float>>(__nv_bfloat16*, "
     "__nv_bfloat16 const*, int)", "act_and_mul"),
    ("silu_mul_quant_varlen_kernel", "act_and_mul"),
    ("void moe_sum_reduce_kernel<__nv_bfloat16, 8>(__nv_bfloat16 const*, __nv_bfloat16*, int, int, float)", "moe_sum"),
    ("triton_red_fused_add_mul_sum_0", "moe_sum"),
    ("void deep_ep::internode_ll::dispatch<false, false, 6144>(void*, float*, int*, long*, void*, int*, "
     "void*, int*, void*, void const*, long const*, int*, int*, int, int, int, int, int, int, int, bool)",
     "deepep_dispatch"),
    ("void deep_ep::internode_ll::combine<false, 6144, 9>(void*, void*, int*, void*, void const*, "
     "long const*, int const*, int const*, int*, int*, int, int, int, int, int, int, int, int, bool)",
     "deepep_combine"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, "
     "int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int, int, int, "
     "int, int, int, void**, int, int, int)", "deepep_dispatch"),
    ("void deep_ep::intranode::notify_dispatch<8>(int const*, int*, int, int const*, int*, int, int, int, "
     "bool const*, int*, int*, int, void**, int**, int)", "deepep_other"),
    ("void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, "
     "-2, true>(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo"
     "<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, "
     "unsigned int, unsigned int, long)", "embedding"),
    ("void flashinfer::sampling::TopKTopPSamplingFromProbKernel<1024u, (cub::BlockScanAlgorithm)0, "
     "(cub::BlockReduceAlgorithm)2, 4u, true, float, int>(float*, int*, unsigned long*, unsigned long*, "
     "int*, unsigned int, float*, float, float*, int, unsigned int, unsigned long, unsigned long)", "sampling"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "logits_all_gather"),
    # not in the ledger: falls through every op
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)", None),
]


def classify(exp: Expectations, name: str) -> str | None:
    match = OpClassifier(exp).classify(name)
    return match.op if match.matched_by != BY_NOTHING else None


@pytest.mark.parametrize(("name", "op"), KERNELS, ids=[f"{i}-{op}" for i, (_, op) in enumerate(KERNELS)])
def test_glm_ops_classify_real_kernel_names(glm, name, op):
    assert classify(glm, name) == op


def test_glm_every_op_is_exercised():
    exercised = {op for _, op in KERNELS}
    ops = set(load_expectations(GLM).ops)
    # lm_head is only a hook for named kernels; real LM heads are generic cuBLAS GEMMs
    assert ops - exercised == {"lm_head"}


def test_glm_regexes_also_run_in_polars(glm):
    pl = pytest.importorskip("polars")
    names = pl.Series([name for name, _ in KERNELS])
    for op_name, op in glm.ops.items():
        via_polars = names.str.contains(op.regex).to_list()
        via_re = [re.search(op.regex, n) is not None for n in names.to_list()]
        assert via_polars == via_re, op_name
    nvtx = pl.Series(["{'Module': 'model.model.layers.12.self_attn'}"])
    assert nvtx.str.extract(glm.layer_regex, 1).to_list() == ["12"]


def test_render_glm(glm):
    text = render_expectations(glm)
    assert "fused_add_rmsnorm" in text
    assert "156" in text
    assert "2 * layers" in text
    assert "1800-2200" in text
    assert "2 µs" in text
    assert "0-2, 6-74/4" in text
    assert "3-77" in text
    assert "pageable not allowed" in text
    assert "1 MiB" in text
    assert "chunked" in text


# ---- the formula evaluator -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("2 * layers", 156),
        ("layers - dense", 75),
        ("-(layers) + 80", 2),
        ("layers / 2", 39),
        ("layers / 4", 19.5),
        ("layers // 4", 19),
        ("layers % 4", 2),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("min(layers, 100, 3 * dense)", 9),
        ("max(1, 2.5)", 2.5),
        ("ceil(layers / 4)", 20),
        ("floor(layers / 4)", 19),
        ("((layers))", 78),
        (7, 7),
        (2.0, 2),
    ],
)
def test_evaluate(expr, value):
    assert evaluate(expr, {"layers": 78, "dense": 3}) == value


@pytest.mark.parametrize(
    ("expr", "construct"),
    [
        ("__import__('os')", "__import__"),
        ("layers.__class__", "attribute access"),
        ("2 ** 10000", "exponent"),
        ("10 ** 60", "too large"),
        ("open('x')", "open"),
        ("'a'", "string"),
        ("[1]", "list"),
        ("(1, 2)", "tuple"),
        ("{1: 2}", "dict"),
        ("foo + 1", "unknown name 'foo'"),
        ("layers[0]", "subscript"),
        ("lambda: 1", "lambda"),
        ("[x for x in (1, 2)]", "comprehension"),
        ("layers if layers else 1", "conditional"),
        ("layers > 1", "comparison"),
        ("layers and 1", "boolean operator"),
        ("True", "boolean"),
        ("1j", "complex"),
        ("layers << 2", "<<"),
        ("~layers", "~"),
        ("1 / 0", "division by zero"),
        ("layers // (dense - 3)", "division by zero"),
        ("layers % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("(-8) ** 0.5", "complex"),
        ("min", "must be called"),
        ("max(x=1)", "keyword"),
        ("ceil(1, 2)", "ceil() takes 1"),
        ("min()", "at least 1"),
        ("layers.bit_length()", "call of"),
        ("(lambda: 1)()", "call of"),
        ("f'{layers}'", "f-string"),
        ("(y := 2)", "assignment"),
        ("2 *", "not a valid formula"),
        ("", "empty"),
        ("1e308 * 10", "too large"),
        ("(" * 200 + "1" + ")" * 200, ""),  # nesting: refused or evaluated, never a crash
    ],
)
def test_evaluate_refuses(expr, construct):
    if construct == "":
        try:
            evaluate(expr, {})
        except FormulaError:
            pass
        return
    with pytest.raises(FormulaError) as info:
        evaluate(expr, {"layers": 78, "dense": 3})
    assert construct in str(info.value)


def test_evaluate_never_runs_code(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(FormulaError):
        evaluate(f"__import__('pathlib').Path({str(marker)!r}).touch()", {})
    assert not marker.exists()


def test_evaluate_params_dependency_order_and_errors():
    params = evaluate_params({"moe": "layers - dense", "layers": 78, "dense": "min(3, layers)", "x": "moe * 2"})
    assert params == {"moe": 75, "layers": 78, "dense": 3, "x": 150}
    assert list(params) == ["moe", "layers", "dense", "x"]

    with pytest.raises(FormulaError) as info:
        evaluate_params({"a": "b + 1", "b": "c", "c": "a"})
    assert info.value.key in {"a", "b", "c"}
    assert "cycle" in info.value.message and "->" in info.value.message

    with pytest.raises(FormulaError) as info:
        evaluate_params({"a": "a + 1"})
    assert "cycle" in info.value.message

    with pytest.raises(FormulaError) as info:
        evaluate_params({"a": 1, "b": "c * 2"})
    assert info.value.key == "b" and "unknown parameter 'c'" in info.value.message

    with pytest.raises(FormulaError) as info:
        evaluate_params({"min": 1})
    assert info.value.key == "min"


# ---- layer lists -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("layers", "text"),
    [
        ([0, 1, 2] + list(range(6, 75, 4)), "0-2, 6-74/4"),
        ([3, 4, 5, 7, 8, 9], "3-5, 7-9"),
        ([1], "1"),
        ([1, 3], "1, 3"),
        ([0, 2, 4, 6, 7, 8], "0-4/2, 6-8"),
        ([5, 9, 20, 21, 22, 40], "5, 9, 20-22, 40"),
    ],
)
def test_compact_layers_round_trips(tmp_path, layers, text):
    assert compact_layers(layers) == text
    f = tmp_path / "e.toml"
    f.write_text(
        BASE + f'[layers.classes.c]\nlayers = "{text}"\ngroups = {{ attention = 1 }}\n', encoding="utf-8"
    )
    assert list(load_expectations(f).layer_classes[0].layers) == layers


@pytest.mark.parametrize(
    ("spec", "layers"),
    [
        ('"FFFSSSF"', [0, 1, 2, 6]),
        ('"XX.. ..X"', [0, 1, 6]),
        ("[0, 2, \"4-6\"]", [0, 2, 4, 5, 6]),
        ('{ first = "dense", last = "layers - 1", step = 2 }', [3, 5]),
        ('[{ first = 0, last = 1 }, 6]', [0, 1, 6]),
    ],
)
def test_layer_specs(tmp_path, spec, layers):
    f = tmp_path / "e.toml"
    f.write_text(
        BASE.replace("layers = 78", "layers = 7")
        + f"[layers.classes.c]\nlayers = {spec}\ngroups = {{ attention = 1 }}\n",
        encoding="utf-8",
    )
    assert list(load_expectations(f).layer_classes[0].layers) == layers


# ---- malformed files -----------------------------------------------------------------------

BASE = """\
[model]
name = "test"

[params]
layers = 78
dense = 3

[ops.fused_add_rmsnorm]
patterns = ["FusedAddRMSNormKernel"]
group = "attention"

[ops.rmsnorm]
patterns = ["RMSNormKernel"]
group = "attention"

"""


def test_minimal_file_and_range_forms(tmp_path):
    f = tmp_path / "e.toml"
    f.write_text(
        BASE
        + """
[anchors.fused_add_rmsnorm]
expected = "2 * layers"
tolerance_pct = 10

[anchors.rmsnorm]
min = "layers"
max = "2 * layers"

[total]
expected = "1000-2000"
tolerance = 100

[h2d]
per_step = { min = 1 }

[graphs]
launches_per_step = [1, "dense"]
""",
        encoding="utf-8",
    )
    exp = load_expectations(f)
    a = {x.op: x for x in exp.anchors}
    assert a["fused_add_rmsnorm"].expected.low == pytest.approx(140.4)
    assert a["fused_add_rmsnorm"].expected.high == pytest.approx(171.6)
    assert a["fused_add_rmsnorm"].formula == "2 * layers ± 10%"
    assert a["rmsnorm"].expected == Range(78, 156)
    assert exp.total == Range(900, 2100)
    assert exp.h2d.per_step == Range(1, None)
    assert exp.graph_launches_per_step == Range(1, 3)
    assert exp.gap_threshold_ns == 2000  # default
    assert exp.batch is None
    assert list(exp.ops) == ["fused_add_rmsnorm", "rmsnorm"]
    assert "fused_add_rmsnorm" in render_expectations(exp)


def _err(tmp_path: Path, text: str) -> str:
    f = tmp_path / "bad.toml"
    f.write_text(text, encoding="utf-8")
    with pytest.raises(ExpectationsError) as info:
        load_expectations(f)
    assert info.value.path == str(f)
    assert str(info.value).startswith(f"{f}: ")
    return info.value.problem


def test_missing_file(tmp_path):
    with pytest.raises(ExpectationsError) as info:
        load_expectations(tmp_path / "nope.toml")
    assert info.value.problem == "no such file"
    assert info.value.path == str(tmp_path / "nope.toml")


def test_directory_and_binary(tmp_path):
    with pytest.raises(ExpectationsError):
        load_expectations(tmp_path)
    f = tmp_path / "bin.toml"
    f.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ExpectationsError) as info:
        load_expectations(f)
    assert "UTF-8" in info.value.problem


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        # not TOML: tomllib's line is kept
        ('[model]\nname = "x"\nbroken = = 3\n', ["not valid TOML", "line 3"]),
        (BASE + "[modle]\nname = 1\n", ["modle", "unknown top-level table", "line 16"]),
        (BASE.replace('name = "test"', 'title = "test"'), ["model.title", "unknown key"]),
        (BASE.replace('name = "test"\n', ""), ["model.name", "missing required key"]),
        ('[model]\nname = "x"\n', ["ops", "missing required table"]),
        (BASE.replace('name = "test"', "name = 5"), ["model.name", "wrong type", "string", "integer"]),
        (BASE + "[ops.x]\npatterns = 5\n", ["ops.x.patterns", "wrong type"]),
        (BASE + "[ops.x]\ngroup = \"a\"\n", ["ops.x.patterns", "no patterns and no gemm shape"]),
        (BASE + "[ops.x]\ngemm = { n = 1 }\n", ["ops.x.gemm", "give both n and k"]),
        (BASE + "[ops.x]\ngemm = { n = 1, k = 2, kind = \"sparse\" }\n", ["ops.x.gemm.kind", "unknown GEMM kind"]),
        (BASE + "[ops.x]\ngemm = { kind = \"any\" }\n", ["ops.x.gemm", "match every GEMM"]),
        (BASE + "[ops.x]\ngemm = []\n", ["ops.x.gemm", "empty gemm array"]),
        (BASE + "[ops.x]\npatterns = [\"RMS(Norm\"]\n", ["ops.x.patterns", "op 'x'", "RMS(Norm", "invalid regex", "line 17"]),
        (BASE + "[ops.x]\npatterns = [\"(?<!Fused)RMSNorm\"]\n", ["ops.x.patterns", "look-around"]),
        (BASE + "[ops.x]\npatterns = [\"(?i)rms\"]\n", ["ops.x.patterns", "(?i:"]),
        (BASE + "[ops.x]\npatterns = [\"\"]\n", ["ops.x.patterns", "empty regex"]),
        (BASE + "[anchors.nope]\nexpected = 1\n", ["anchors.nope", "unknown op 'nope'"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"layers.__class__\"\n",
         ["anchors.rmsnorm.expected", "line 17", "attribute access", "layers.__class__"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"2 * layer\"\n", ["anchors.rmsnorm.expected", "unknown name 'layer'"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"__import__('os')\"\n", ["anchors.rmsnorm.expected", "__import__"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"2 ** 10000\"\n", ["anchors.rmsnorm.expected", "exponent"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"layers / (dense - 3)\"\n", ["anchors.rmsnorm.expected", "division by zero"]),
        (BASE + "[anchors.rmsnorm]\nexpected = true\n", ["anchors.rmsnorm.expected", "wrong type"]),
        (BASE + "[anchors.rmsnorm]\nmin = 10\nmax = 5\n", ["anchors.rmsnorm", "contradictory", "10 > max 5"]),
        (BASE + "[anchors.rmsnorm]\nexpected = \"9-3\"\n", ["anchors.rmsnorm.expected", "contradictory"]),
        (BASE + "[anchors.rmsnorm]\nexpected = 3\nmin = 1\n", ["anchors.rmsnorm.expected", "not both"]),
        (BASE + "[anchors.rmsnorm]\nexpected = 3\ntolerence = 1\n", ["anchors.rmsnorm.tolerence", "unknown key"]),
        (BASE + "[anchors.rmsnorm]\nhint_low = \"x\"\n", ["anchors.rmsnorm.expected", "missing required key"]),
        (BASE + "[anchors.rmsnorm]\nexpected = 3\ntolerance = -1\n", ["anchors.rmsnorm.tolerance", "negative"]),
        (BASE + "[total]\nmin = 2200\nmax = 1800\n", ["total", "contradictory"]),
        (BASE + "[total]\nmin = \"sum(1)\"\n", ["total.min", "call of 'sum'"]),
        (BASE.replace("dense = 3", "dense = \"layers - moe\""), ["params.dense", "unknown parameter 'moe'", "line 6"]),
        (BASE.replace("dense = 3", "dense = \"dense + 1\""), ["params.dense", "cycle"]),
        (BASE.replace("dense = 3", "dense = [3]"), ["params.dense", "wrong type"]),
        (BASE.replace("dense = 3", "dense = \"open('x')\""), ["params.dense", "call of 'open'"]),
        (BASE + "[steps]\nmethod = \"magic\"\n", ["steps.method", "unknown method"]),
        (BASE + "[steps]\nmethod = \"nvtx\"\n", ["steps.nvtx", "missing required key"]),
        (BASE + "[steps]\nexclude_ops = [\"prefill\"]\n", ["steps.exclude_ops", "unknown op 'prefill'"]),
        (BASE + "[steps]\nmarker = \"Sampling[\"\n", ["steps.marker", "invalid regex"]),
        (BASE + "[steps]\nmarker_op = \"nope\"\n", ["steps.marker_op", "unknown op"]),
        (BASE + "[gaps]\nthreshold_us = 0\n", ["gaps.threshold_us", "positive"]),
        (BASE + "[gaps]\nthreshold_us = \"2 us\"\n", ["gaps.threshold_us", "not a valid formula"]),
        (BASE + "[h2d]\npageable_allowed = \"no\"\n", ["h2d.pageable_allowed", "wrong type", "boolean"]),
        (BASE + "[h2d]\nper_step = [1, 2, 3]\n", ["h2d.per_step", "exactly 2"]),
        (BASE + "[h2d]\nmax_bytes = 1.5\n", ["h2d.max_bytes", "whole number"]),
        (BASE + "[graphs]\nlaunches_per_step = { min = 3, max = 1 }\n", ["graphs.launches_per_step", "contradictory"]),
        (BASE + "[layers]\nregex = \"layers\\\\.\\\\d+\"\n", ["layers.regex", "one capturing group"]),
        (BASE + "[layers]\nopening_op = \"norm\"\n", ["layers.opening_op", "unknown op 'norm'"]),
        (BASE + "[layers.classes.c]\nlayers = \"70-80\"\ngroups = { attention = 1 }\n",
         ["layers.classes.c.layers", "layer 78 is outside 0-77", "line 17"]),
        (BASE + "[layers.classes.c]\nlayers = [-1]\n", ["layers.classes.c.layers", "outside"]),
        (BASE + "[layers.classes.c]\nlayers = \"5-3\"\n", ["layers.classes.c.layers", "contradictory"]),
        (BASE + "[layers.classes.c]\nlayers = \"FFS\"\n", ["layers.classes.c.layers", "one per layer (78)"]),
        (BASE + "[layers.classes.c]\nlayers = \"0-2\"\ngroups = { moe = 3 }\n",
         ["layers.classes.c.groups.moe", "not declared by any op", "attention"]),
        (BASE + "[layers.classes.c]\nlayers = \"0-2\"\ngroups = { attention = \"3-1\" }\n",
         ["layers.classes.c.groups.attention", "contradictory"]),
        (BASE + "[layers.classes.c]\nlayers = \"0-2\"\ncount = \"dense + 1\"\n", ["layers.classes.c.layers", "count", "= 4"]),
        (BASE + "[layers.classes.a]\nlayers = \"0-2\"\ngroups = { attention = 1 }\n"
         "[layers.classes.b]\nlayers = \"2-4\"\ngroups = { attention = 1 }\n",
         ["layers.classes.b.groups.attention", "layer 2", "'a'", "'b'"]),
        (BASE + "[layers.classes.c]\ngroups = { attention = 1 }\n", ["layers.classes.c.layers", "missing required key"]),
        (BASE.replace("layers = 78\n", "") + "[layers.classes.c]\nlayers = \"0-2\"\n", ["params.layers", "missing"]),
        (BASE + "[total]\nmax = 100\n[layers.classes.c]\nlayers = \"0-77\"\ngroups = { attention = 2 }\n",
         ["total.max", "contradictory", "156"]),
    ],
)
def test_malformed(tmp_path, text, needles):
    problem = _err(tmp_path, text)
    for needle in needles:
        assert needle in problem, (needle, problem)
