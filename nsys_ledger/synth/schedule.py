"""The reference GLM-5.3 schedules (decode and prefill) as data.

This is the generator's own statement of what SGLang launches for one forward pass of GLM-5.3
(78 layers, TP8 + EP8, FP8 block weights, FP8 KV cache, DSA indexer on 21 full layers,
`flashmla_kv` decode backend, fused top-k, DeepEP low-latency MoE), written from
/work/shared/reference/glm-decode-ledger.md and the seed article. It is deliberately NOT derived
from the expectation file (see ARCHITECTURE.md): the checker judges the generator's output
against the expectations, and two artifacts written from the same seed catch each other.

Kernel names are structure (`KernelName`, synth/names.py), spelled by the writer: an SQLite
export gets nsys's demangler (`(unsigned int)2624`, `(bool)0`, `T2 *` placeholders, `float *`),
as the real 2026.2 export in /work/shared/real_traces shows, e.g.
`void at::native::vectorized_gather_kernel<(int)16, long>(char *, char *, T2 *, int, ...)`;
a Kineto trace would get c++filt's (`2624u`, `true`, `float*`). Where
/work/shared/reference/real-kernel-names.tsv holds a real name for a kernel, the name here is
that one (rows cited at each kernel). The DeepGEMM GEMMs come in the layout of a chosen build
(synth/deepgemm.py; default the January 2026 SGLang fork's).

Per decode pass (batch 32), healthy:
  attention   14 x 78 = 1092  (sparse MLA = split-KV kernel + combine kernel, query absorption
                               = one cuBLAS batched GEMM, no page-table kernel: top-k is fused)
  indexer      7 x 21 =  147
  MoE          8 x 75 =  600
  DeepEP       2 x 75 =  150
  dense MLP    3 x  3 =    9
  outside              =    4  (embedding, final norm, LM head in the graph; sampling eager)
  total                = 2002
Layer 0 has no residual yet, so its input norm is a plain RMSNormKernel (as in SGLang); the
final norm `model.model.norm` is a fused add + RMSNorm. FusedAddRMSNormKernel still counts
156 per pass (77 input norms + 78 post-attention norms + the final norm).

Other deployments (synth/topologies.py, `topology=`) run the same DeepseekV2 layer code
(`_decoder_layer`) at their own shapes and layouts, per decode step:
  glm-5.3-dp8-ep8        2080: no attention AllReduce (-78), an AllGather before and a
                         ReduceScatter after every layer's FFN (+156, the seed's figure)
  glm-5.3-tp8-ep8-mtp    2044 in three graphs: draft 2, verify 2001 (the target over 2 tokens
                         per request), draft_extend 40 (the MTP layer), and the eager verification
  deepseek-v3.2-tp8-ep8  1874: 61 layers (3 dense), the indexer on all 61
The vLLM topologies (glm-5.3-vllm-tp8-ep8 and its -piecewise variant: 2737, deepseek-v3.2-
vllm-tp8-ep8: 2536) run vLLM's own launches, built in synth/vllm.py from the kernel types here.
Every launch carries its op role (KernelSpec.role, OP_ROLES for this schedule's ops), and
`role_counts_per_step(topology)` counts a decode step's kernels by role.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache

from nsys_ledger.synth.deepgemm import (
    DEFAULT_DEEPGEMM_LAYOUT,
    GLM_GEMMS,
    GlmGemm,
    check_layout,
    deepgemm_name,
    glm_config,
)
from nsys_ledger.synth.topologies import DEFAULT_TOPOLOGY, Topology, get_topology
from nsys_ledger.synth.deepgemm import short_name as deepgemm_short_name
from nsys_ledger.synth.names import NSYS, KernelName, bool_, enum, int_, plain, type_, uint

# --------------------------------------------------------------------------------------------
# Model facts
# --------------------------------------------------------------------------------------------
NUM_LAYERS = 78
DENSE_LAYERS = (0, 1, 2)
MOE_LAYERS = tuple(range(3, NUM_LAYERS))
FULL_INDEXER_LAYERS = (0, 1, 2) + tuple(range(6, 75, 4))  # 21 layers: 0, 1, 2, 6, 10, ..., 74
assert len(FULL_INDEXER_LAYERS) == 21 and len(MOE_LAYERS) == 75

HIDDEN = 6144
TP = 8
SPLIT_GRAPH_LAYER = 39  # "split_graph": the second graph starts at this layer
FAULT_LAYER = 41  # "layer_fault": this layer gets one extra kernel
MISSING_KERNEL_LAYER = 7  # "missing_kernel": this layer launches no kv_a_layernorm

# Launch APIs as nsys names them in CUPTI_ACTIVITY_KIND_RUNTIME (runtime calls carry the
# `_vNNNNN` suffix, driver calls do not).
RT_LAUNCH = "cudaLaunchKernel_v7000"
RT_LAUNCH_EX = "cudaLaunchKernelExC_v11060"
DRV_LAUNCH_EX = "cuLaunchKernelEx"
LAUNCH_APIS = (RT_LAUNCH, RT_LAUNCH_EX, DRV_LAUNCH_EX)


def _pseudo_mangled(name: str) -> str:
    """A mangled-looking name: `_Z` + the nested qualified name. C-style names stay as they are.

    nsys stores the raw mangled name next to the demangled one; generating exact Itanium
    manglings of these templates is not worth it, so synthetic exports carry this simplified
    form (qualified name only, `v` for the parameter list)."""
    if not name.startswith("void "):
        return name
    qual = name[5:].split("<", 1)[0].split("(", 1)[0]
    parts = [p if p != "<unnamed>" else "_GLOBAL__N_1" for p in qual.split("::")]
    if len(parts) == 1:
        return f"_Z{len(parts[0])}{parts[0]}v"
    return "_ZN" + "".join(f"{len(p)}{p}" for p in parts) + "Ev"


@dataclass(frozen=True)
class KernelType:
    """One distinct GPU kernel with its launch configuration.

    `spelled` is the name as structure; `name` is its nsys spelling (what an SQLite export's
    demangledName holds, and what the generator's truth reports). A writer for another format
    asks `name_in(style)`."""

    key: str
    spelled: KernelName
    short: str  # shortName
    api: str  # launch API name (CUPTI_ACTIVITY_KIND_RUNTIME nameId value)
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    regs: int
    static_smem: int = 0
    dyn_smem: int = 0
    cluster: tuple[int, int, int] = (0, 0, 0)
    collective: bool = False  # waits for its peers on the other ranks
    mangled: str = ""
    name: str = field(init=False, default="")  # demangledName, nsys style

    def __post_init__(self) -> None:
        object.__setattr__(self, "name", self.spelled.render(NSYS))
        if not self.mangled:
            object.__setattr__(self, "mangled", _pseudo_mangled(self.name))

    def name_in(self, style: str) -> str:
        """The demangled name as the demangler of `style` spells it ("nsys" or "cxxfilt")."""
        return self.name if style == NSYS else self.spelled.render(style)

    @property
    def event_class(self) -> int:
        """0 for runtime API launches, 1 for driver API launches (ENUM_NSYS_EVENT_CLASS)."""
        return 1 if self.api.startswith("cu") and not self.api.startswith("cuda") else 0


def _k(qualname: str, args: tuple | None, params: str | None) -> KernelName:
    return KernelName(qualname, args, params)


_K: dict[str, KernelType] = {}


def _reg(kt: KernelType) -> KernelType:
    assert kt.key not in _K, kt.key
    _K[kt.key] = kt
    return kt


_BF16 = type_("__nv_bfloat16")

# ---- norms (flashinfer via sgl-kernel; TSV rows 80, 81) --------------------------------------
FUSED_ADD_RMSNORM = _reg(KernelType(
    "fused_add_rmsnorm",
    _k("flashinfer::norm::FusedAddRMSNormKernel", (uint(8), _BF16),
       "T2 *, T2 *, T2 *, unsigned int, unsigned int, unsigned int, float, float"),
    "FusedAddRMSNormKernel", RT_LAUNCH_EX, (32, 1, 1), (32, 24, 1), 40, 0, 24_672))
RMSNORM = _reg(KernelType(
    "rmsnorm",
    _k("flashinfer::norm::RMSNormKernel", (uint(8), _BF16),
       "T2 *, T2 *, T2 *, unsigned int, unsigned int, unsigned int, float, float"),
    "RMSNormKernel", RT_LAUNCH_EX, (32, 1, 1), (32, 8, 1), 32, 0, 0))
LAYERNORM = _reg(KernelType(
    "layernorm",
    _k("at::native::<unnamed>::vectorized_layer_norm_kernel",
       (type_("c10::BFloat16"), type_("float"), bool_(False)),
       "int, T2, const T1 *, const T1 *, const T1 *, T2 *, T2 *, T1 *"),
    "vectorized_layer_norm_kernel", RT_LAUNCH, (32, 1, 1), (32, 4, 1), 38))

# ---- DeepGEMM GEMMs: names from the layout of the build (synth/deepgemm.py) -----------------
# Each layout spells the same GEMMs differently; `deepgemm_kernels(layout)` makes them.
def _deepgemm_kernel(g: GlmGemm, layout: str) -> KernelType:
    cfg = glm_config(g, layout)
    block = (384, 1, 1) if cfg.math_threads == 256 else (256, 1, 1)
    return KernelType(g.key, deepgemm_name(cfg, layout), deepgemm_short_name(layout),
                      DRV_LAUNCH_EX, (cfg.num_sms, 1, 1), block, 168, 0, 205_856,
                      cluster=(cfg.multicast, 1, 1))


@lru_cache(maxsize=None)
def deepgemm_kernels(layout: str = DEFAULT_DEEPGEMM_LAYOUT,
                     gemms: tuple[GlmGemm, ...] = GLM_GEMMS) -> dict[str, KernelType]:
    """The DeepGEMM kernels of a forward pass (default GLM-5.3 TP8's `GLM_GEMMS`; a topology
    passes its own shapes), spelled in `layout`, by schedule key."""
    check_layout(layout)
    return {g.key: _deepgemm_kernel(g, layout) for g in gemms}


# cuBLAS (C-style kernel names: demangled == short == mangled). The absorption GEMMs are the
# torch.bmm -> cuBLAS nvjet kernels of an SGLang v0.5.9 MLA decode (TSV rows 8, 9).
_NVJET_Q_ABSORB = "nvjet_tst_256x8_64x6_2x1_v_bz_TNT"
_NVJET_O_ABSORB = "nvjet_tst_128x8_64x12_1x1_h_bz_TNT"
_NVJET_WK = "nvjet_tst_64x8_64x16_2x1_v_bz_splitK_TNT"
_NVJET_LM_HEAD = "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT"
# The router GEMM: SGLang's MoEGate.forward (python/sglang/srt/models/deepseek_v2.py) takes
# sgl-kernel's dsv3_router_gemm only at hidden 7168 (and at most 16 tokens); GLM-5.3's hidden
# 6144 falls to `F.linear(hidden_states, self.weight, None)` on the bf16 gate weight: a cuBLAS
# GEMM whose name states only a tile. The name is the real GLM-5.1 FP8 router GEMM
# (real-kernel-names.tsv, router_gemm row, aten::mm [16,6144]x[6144,256] on B200:
# `nvjet_sm100_tst_32x64_64x16_4x1_v_bz_splitK_TNN`) as cuBLAS spells it on Hopper, where nvjet
# names carry no architecture (the absorption bmm rows 8-9 of the TSV, H100).
_CUBLAS_ROUTER = "nvjet_tst_32x64_64x16_4x1_v_bz_splitK_TNN"
Q_ABSORB_BMM = _reg(KernelType("bmm_q_absorb", plain(_NVJET_Q_ABSORB), _NVJET_Q_ABSORB, RT_LAUNCH,
                               (4, 1, 8), (128, 1, 1), 168, 0, 49_152))
O_ABSORB_BMM = _reg(KernelType("bmm_o_absorb", plain(_NVJET_O_ABSORB), _NVJET_O_ABSORB, RT_LAUNCH,
                               (4, 1, 8), (128, 1, 1), 168, 0, 65_536))
INDEXER_WK_GEMM = _reg(KernelType("gemm_indexer_wk_weights", plain(_NVJET_WK), _NVJET_WK,
                                  RT_LAUNCH, (3, 1, 8), (128, 1, 1), 154, 0, 98_304))
LM_HEAD_GEMM = _reg(KernelType("gemm_lm_head", plain(_NVJET_LM_HEAD), _NVJET_LM_HEAD, RT_LAUNCH,
                               (76, 1, 1), (384, 1, 1), 168, 0, 213_248, cluster=(2, 1, 1)))
ROUTER_GEMM = _reg(KernelType("gemm_router", plain(_CUBLAS_ROUTER), _CUBLAS_ROUTER, RT_LAUNCH,
                              (8, 1, 12), (64, 1, 1), 126, 0, 16_896))

# ---- attention -------------------------------------------------------------------------------
ROPE = _reg(KernelType(
    "rope",
    _k("flashinfer::BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel",
       (bool_(False), uint(64), uint(8), uint(16), _BF16, type_("long")),
       "T5 *, T5 *, T5 *, T5 *, float *, T6 *, unsigned int, unsigned int, unsigned int, "
       "unsigned int, unsigned long, unsigned long, unsigned long, unsigned long, unsigned long, "
       "unsigned long, unsigned long, unsigned long"),
    "BatchQKApplyRotaryPosIdsCosSinCacheHeadParallelismKernel", RT_LAUNCH_EX, (32, 9, 1),
    (8, 16, 1), 40))
KV_WRITE = _reg(KernelType("set_mla_kv_buffer", plain("set_mla_kv_buffer_kernel"),
                           "set_mla_kv_buffer_kernel", DRV_LAUNCH_EX, (32, 1, 1), (128, 1, 1), 24))
SPARSE_MLA_DECODE = _reg(KernelType(
    "sparse_mla_decode",
    _k("sm90::decode::sparse_fp8::flash_fwd_splitkv_mla_fp8_sparse_kernel",
       (type_("cutlass::bfloat16_t"), int_(64), int_(512), int_(576), int_(2048)),
       "flash::DecodingParams, sm90::decode::sparse_fp8::TmaParams"),
    "flash_fwd_splitkv_mla_fp8_sparse_kernel", RT_LAUNCH_EX, (2, 1, 66), (384, 1, 1), 168, 0,
    214_016, cluster=(1, 1, 1)))
MLA_COMBINE = _reg(KernelType(
    "mla_combine",
    _k("flash::flash_fwd_mla_combine_kernel",
       (type_("cutlass::bfloat16_t"), int_(512), int_(64), int_(32)), "flash::DecodingParams"),
    "flash_fwd_mla_combine_kernel", RT_LAUNCH_EX, (32, 1, 64), (128, 1, 1), 64, 0, 4_352))
SPARSE_ATTN_PREFILL = _reg(KernelType(
    "sparse_attn_prefill",
    _k("sm90::prefill::sparse::sparse_attn_fwd_kernel",
       (int_(64), int_(512), int_(576), bool_(True)),
       "flash::SparseAttnFwdParams, sm90::prefill::sparse::TmaParams"),
    "sparse_attn_fwd_kernel", RT_LAUNCH_EX, (132, 1, 1), (384, 1, 1), 168, 0, 225_280,
    cluster=(1, 1, 1)))
# sgl-kernel custom all-reduce, TP8 (TSV row 82)
ALLREDUCE = _reg(KernelType(
    "custom_allreduce",
    _k("sglang::cross_device_reduce_1stage", (_BF16, int_(8)),
       "sglang::RankData *, sglang::RankSignals, sglang::Signal *, T1 *, int, int"),
    "cross_device_reduce_1stage", RT_LAUNCH, (36, 1, 1), (512, 1, 1), 56, collective=True))

# ---- DSA indexer -----------------------------------------------------------------------------
ACT_QUANT = _reg(KernelType("indexer_act_quant", plain("_act_quant_kernel"), "_act_quant_kernel",
                            DRV_LAUNCH_EX, (32, 32, 1), (128, 1, 1), 30))
STORE_INDEXER_CACHE = _reg(KernelType(
    "indexer_store_cache",
    _k("fused_store_indexer_cache_kernel", (_BF16, int_(128), int_(64)),
       "const T1 *, unsigned char *, const long *, int, int"),
    "fused_store_indexer_cache_kernel", RT_LAUNCH, (32, 1, 1), (128, 1, 1), 32))
PAGED_MQA_LOGITS = _reg(KernelType(
    "paged_mqa_logits",
    _k("deep_gemm::sm90_fp8_paged_mqa_logits",
       (uint(1), uint(32), uint(128), uint(64), bool_(False), uint(4), uint(128), uint(128)),
       "unsigned int, unsigned long, unsigned int, unsigned int *, const unsigned int *, "
       "float *, unsigned int, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap"),
    "sm90_fp8_paged_mqa_logits", DRV_LAUNCH_EX, (132, 1, 1), (384, 1, 1), 128, 0, 196_608))
MQA_LOGITS_PREFILL = _reg(KernelType(
    "mqa_logits_prefill",
    _k("deep_gemm::sm90_fp8_mqa_logits",
       (uint(32), uint(128), uint(128), uint(4), uint(128), uint(128)),
       "unsigned int, unsigned int, unsigned int, unsigned int, unsigned long, unsigned int *, "
       "unsigned int *, float *, CUtensorMap, CUtensorMap, CUtensorMap, CUtensorMap"),
    "sm90_fp8_mqa_logits", DRV_LAUNCH_EX, (132, 1, 1), (384, 1, 1), 128, 0, 196_608))
TOPK_DECODE = _reg(KernelType(
    "topk_transform_decode",
    _k("<unnamed>::topk_transform_decode_kernel", (int_(2048),),
       "const float *, int *, const int *, const int *, int, int"),
    "topk_transform_decode_kernel", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 64, 32_768))
TOPK_PREFILL = _reg(KernelType(
    "topk_transform_prefill",
    _k("<unnamed>::topk_transform_prefill_kernel", (int_(2048),),
       "const float *, int *, const int *, const int *, const int *, int, int"),
    "topk_transform_prefill_kernel", RT_LAUNCH, (4096, 1, 1), (1024, 1, 1), 64, 32_768))

# ---- MoE -------------------------------------------------------------------------------------
MOE_TOPK = _reg(KernelType(
    "deepseek_v3_topk",
    _k("deepseek_v3_topk_kernel", (type_("float"), int_(256), int_(8), int_(4)),
       "const T1 *, const T1 *, T1 *, int *, int, int, float"),
    "deepseek_v3_topk_kernel", RT_LAUNCH, (32, 1, 1), (256, 1, 1), 40))
# the SGLang v0.5.9 decode's activation quantization before a DeepGEMM GEMM (TSV row 2, as nsys
# wrote it)
GROUP_QUANT = _reg(KernelType(
    "per_token_group_quant",
    _k("per_token_group_quant_8bit_kernel",
       (_BF16, type_("__nv_fp8_e4m3"), bool_(True), bool_(False), type_("float")),
       "const T1 *, void *, T5 *, int, int, int, float, float, float, int, int"),
    "per_token_group_quant_8bit_kernel", RT_LAUNCH, (96, 1, 1), (256, 1, 1), 30))
# DeepEP low latency, hidden 6144 (GLM-5.2 on DeepEP EP8, TSV rows 58, 59)
DEEPEP_DISPATCH = _reg(KernelType(
    "deepep_dispatch",
    _k("deep_ep::internode_ll::dispatch", (bool_(True), bool_(True), int_(6144)),
       "void *, void *, int *, long *, int *, int *, long *, void *, int *, void *, "
       "const void *, const long *, int *, int *, int *, int, int, int, int, int, int, int, int, "
       "int, bool, int"),
    "dispatch", RT_LAUNCH_EX, (132, 1, 1), (960, 1, 1), 80, collective=True))
DEEPEP_COMBINE = _reg(KernelType(
    "deepep_combine",
    _k("deep_ep::internode_ll::combine", (bool_(False), int_(6144), int_(11), int_(4)),
       "void *, void *, int *, void *, const void *, const long *, const float *, const int *, "
       "const long *, long *, int *, int, int *, int, int, int, int, int, int, int, int, int, "
       "int, bool"),
    "combine", RT_LAUNCH_EX, (132, 1, 1), (960, 1, 1), 96, collective=True))
# DeepEP normal mode (prefill), intranode EP8 (TSV rows 61, 62)
DEEPEP_DISPATCH_NORMAL = _reg(KernelType(
    "deepep_dispatch_normal",
    _k("deep_ep::intranode::dispatch", (int_(8), int_(768), int_(8192)),
       "int4 *, float *, int *, long *, float *, int *, int *, const int4 *, const float *, "
       "const long *, const float *, const bool *, const int *, int, int, int, int, int, int, "
       "int, int, void **, int, int, int"),
    "dispatch", RT_LAUNCH_EX, (24, 1, 1), (768, 1, 1), 96, collective=True))
DEEPEP_COMBINE_NORMAL = _reg(KernelType(
    "deepep_combine_normal",
    _k("deep_ep::intranode::combine", (_BF16, int_(8), int_(768), int_(4096)),
       "T1 *, float *, const T1 *, const float *, const T1 *, const T1 *, const int *, "
       "const int *, const int *, int *, int, int, int, int, void **, int, int, int"),
    "combine", RT_LAUNCH_EX, (24, 1, 1), (768, 1, 1), 96, collective=True))
MOE_SUM_REDUCE = _reg(KernelType(
    "moe_sum_reduce",
    _k("moe_sum_reduce_kernel", (_BF16, int_(2)),
       "const T1 *, T1 *, long, long, long, long, long, long, double"),
    "moe_sum_reduce_kernel", RT_LAUNCH, (32, 1, 1), (256, 1, 1), 32))
# flashinfer SiLU * mul (TSV row 31). c++filt prints the function-pointer argument as
# `&(silu(float const&))`; no nsys export in hand shows how nsys spells it.
ACT_AND_MUL = _reg(KernelType(
    "act_and_mul",
    _k("flashinfer::activation::act_and_mul_kernel",
       (_BF16, type_("&silu", "&(silu(float const&))")), "T1 *, const T1 *, int"),
    "act_and_mul_kernel", RT_LAUNCH_EX, (32, 1, 1), (1024, 1, 1), 28))

# ---- outside the layers ----------------------------------------------------------------------
EMBEDDING = _reg(KernelType(
    "embedding",
    _k("at::native::<unnamed>::indexSelectSmallIndex",
       (type_("c10::BFloat16"), type_("long"), type_("unsigned int"), int_(2), int_(2),
        int_(-2)),
       "at::cuda::detail::TensorInfo<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, "
       "at::cuda::detail::TensorInfo<const T2, T3>, int, int, T3, long"),
    "indexSelectSmallIndex", RT_LAUNCH, (128, 1, 1), (128, 1, 1), 30))
SAMPLING = _reg(KernelType(
    "sampling",
    _k("flashinfer::sampling::TopKTopPSamplingFromProbKernel",
       (uint(1024), enum("cub::CUB_200800_900_NS::BlockScanAlgorithm", 2),
        enum("cub::CUB_200800_900_NS::BlockReduceAlgorithm", 2), uint(4), bool_(False),
        type_("float"), type_("int")),
       "T6 *, T7 *, T7 *, T7 *, T6 *, T7 *, T6 *, unsigned int, unsigned long, unsigned long"),
    "TopKTopPSamplingFromProbKernel", RT_LAUNCH_EX, (32, 1, 1), (1024, 1, 1), 64, 0, 30_720))

# ---- fault-only kernel -----------------------------------------------------------------------
STRAY_COPY = _reg(KernelType(
    "stray_copy",
    _k("at::native::elementwise_kernel",
       (int_(128), int_(2), type_(
           "void at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda("
           "at::TensorIteratorBase &)::[lambda() (instance 3)]::operator ()() const::[lambda() "
           "(instance 7)]::operator ()() const::[lambda(c10::BFloat16) (instance 1)]>("
           "at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]",
           "at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda("
           "at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::"
           "operator()() const::{lambda(c10::BFloat16)#1}>(at::TensorIteratorBase&, "
           "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
           "operator()() const::{lambda()#7}::operator()() const::{lambda(c10::BFloat16)#1} "
           "const&)::{lambda(int)#1}")),
       "int, T3"),
    "elementwise_kernel", RT_LAUNCH, (384, 1, 1), (128, 1, 1), 18))

# ---- DP attention collectives (topology glm-5.3-dp8-ep8) ---------------------------------------
# The seed: under DP attention "每层多出一次 dp_gather(AllGather)与一次 ReduceScatter" (every
# layer gets one more AllGather and one ReduceScatter; 78 layers: 156 more collectives). NCCL
# names as a real trace shows them (TSV: `ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage
# <4096ul>)` in c++filt spelling; nsys casts the argument instead).
_NCCL_ARGS = "ncclDevKernelArgsStorage<(unsigned long)4096>"
DP_GATHER = _reg(KernelType(
    "nccl_allgather", KernelName("ncclDevKernel_AllGather_RING_LL", None, _NCCL_ARGS),
    "ncclDevKernel_AllGather_RING_LL", RT_LAUNCH_EX, (8, 1, 1), (544, 1, 1), 96, collective=True))
DP_REDUCE_SCATTER = _reg(KernelType(
    "nccl_reduce_scatter", KernelName("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", None, _NCCL_ARGS),
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", RT_LAUNCH_EX, (8, 1, 1), (544, 1, 1), 96,
    collective=True))

# ---- MTP (topology glm-5.3-tp8-ep8-mtp): SGLang's EAGLE worker with the model's MTP layer ------
# draft graph (one speculative step, top-1): the previous draft_extend's top-1 token becomes the
# verify input: the tree positions/mask (sgl-kernel build_tree_kernel_efficient) and the KV slots
# of the draft token (the Triton kernel assign_draft_cache_locs). Both plain names.
DRAFT_BUILD_TREE = _reg(KernelType("eagle_build_tree", plain("build_tree_efficient"),
                                   "build_tree_efficient", RT_LAUNCH, (32, 1, 1), (64, 1, 1), 32))
DRAFT_CACHE_LOCS = _reg(KernelType("eagle_assign_cache_locs", plain("assign_draft_cache_locs"),
                                   "assign_draft_cache_locs", DRV_LAUNCH_EX, (32, 1, 1), (128, 1, 1), 24))
# draft_extend graph, around the MTP decoder layer (SGLang DeepseekModelNextN): torch.cat of
# enorm(embedding) and hnorm(target hidden) (ATen, as the TSV's CatArrayBatchedCopy row), eh_proj
# 2 x hidden -> hidden in bf16 (an nn.Linear: cuBLAS), softmax + top-1 of the draft logits.
MTP_CAT = _reg(KernelType(
    "cat_batched_copy",
    _k("at::native::<unnamed>::CatArrayBatchedCopy",
       (type_("at::native::<unnamed>::OpaqueType<(unsigned int)2>",
              "at::native::(anonymous namespace)::OpaqueType<2u>"), type_("unsigned int"), int_(2),
        int_(64), int_(64)),
       "T1 *, at::native::<unnamed>::CatArrInputTensorMetadata<T1, T2, (int)64, (int)64>, "
       "at::native::<unnamed>::TensorSizeStride<T2, (unsigned int)4>, int, T2"),
    "CatArrayBatchedCopy", RT_LAUNCH, (48, 1, 2), (512, 1, 1), 32))
_NVJET_EH_PROJ = "nvjet_tst_128x8_64x8_2x1_v_bz_splitK_TNT"
MTP_EH_PROJ = _reg(KernelType("gemm_mtp_eh_proj", plain(_NVJET_EH_PROJ), _NVJET_EH_PROJ, RT_LAUNCH,
                              (48, 1, 4), (128, 1, 1), 168, 0, 98_304))
SOFTMAX = _reg(KernelType(
    "softmax",
    _k("<unnamed>::cunn_SoftMaxForward",
       (int_(4), type_("float"), type_("float"), type_("float"),
        type_("<unnamed>::SoftMaxForwardEpilogue", "(anonymous namespace)::SoftMaxForwardEpilogue")),
       "T3 *, const T2 *, int"),
    "cunn_SoftMaxForward", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 40))
# the argmax of the TSV's `sampling` row (at::native::reduce_kernel with ArgMaxOps), as nsys spells it
ARGMAX = _reg(KernelType(
    "argmax_reduce",
    _k("at::native::reduce_kernel",
       (int_(512), int_(1), type_("at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
                                  "unsigned int, long, (int)4>",
                                  "at::native::ReduceOp<float, at::native::ArgMaxOps<float>, "
                                  "unsigned int, long, 4>")),
       "T3"),
    "reduce_kernel", RT_LAUNCH, (32, 1, 1), (32, 16, 1), 32))
# verify: the target's tokens checked against the draft, outside the graphs (it reads the
# verify logits; the step's marker kernel). sgl-kernel's port of flashinfer's tree speculative
# sampling (top-k/top-p renormalization of the probabilities not modelled apart).
VERIFY_SAMPLING = _reg(KernelType(
    "tree_speculative_sampling",
    _k("flashinfer::sampling::TreeSpeculativeSamplingTargetOnly",
       (uint(1024), enum("cub::CUB_200800_900_NS::BlockScanAlgorithm", 2),
        enum("cub::CUB_200800_900_NS::BlockReduceAlgorithm", 2), uint(1), bool_(False),
        type_("float"), type_("int"), type_("long")),
       "T7 *, T7 *, T7 *, T8 *, T8 *, T8 *, T6 *, T6 *, T6 *, unsigned int, unsigned int, "
       "unsigned int, unsigned int, T6, T6, bool"),
    "TreeSpeculativeSamplingTargetOnly", RT_LAUNCH_EX, (32, 1, 1), (1024, 1, 1), 64, 0, 30_720))

# ---- DeepSeek-V3.2 (topology deepseek-v3.2-tp8-ep8) --------------------------------------------
# glm-decode-ledger.md: the router GEMM is cuBLAS except "router_gemm_kernel_float_output only for
# hidden 7168" (sgl-kernel's DeepSeek-V3 router GEMM: 256 experts, K=7168). Template arguments
# after flashinfer's port of the same kernel (TSV row router_gemm, DeepSeek-V3.2 on B200:
# `router_gemm_kernel<__nv_bfloat16, float, 128, 8, 16, 256, 7168>`).
ROUTER_GEMM_DSV3 = _reg(KernelType(
    "gemm_router_dsv3",
    _k("router_gemm_kernel_float_output",
       (_BF16, int_(128), int_(8), int_(16), int_(256), int_(7168)),
       "float *, const T1 *, const T1 *"),
    "router_gemm_kernel_float_output", RT_LAUNCH_EX, (256, 1, 1), (128, 1, 1), 64))


@lru_cache(maxsize=None)
def topology_kernels(name: str, layout: str = DEFAULT_DEEPGEMM_LAYOUT) -> dict[str, KernelType]:
    """The kernel of each schedule key for topology `name`: the reference GLM-5.3 TP8 kernels,
    with the ones whose name or launch holds a model or layout number spelled for the topology
    (the same objects for GLM-5.3 TP8, so its output does not move)."""
    topo = get_topology(name)
    kernels: dict[str, KernelType] = {**_K, **deepgemm_kernels(layout, topo.gemms)}
    heads = topo.local_heads
    if heads != 8:
        # the absorption bmms batch over the local heads (grid z): 64 under DP attention
        # (64 heads, attn_tp 1), 16 for DeepSeek-V3.2 at TP8 (128 / 8)
        for key in ("bmm_q_absorb", "bmm_o_absorb"):
            kt = kernels[key]
            kernels[key] = replace(kt, grid=(kt.grid[0], kt.grid[1], heads), mangled="")
    if topo.index_heads != 32:
        # DeepGEMM's paged MQA logits is compiled for the indexer's head count (GLM: 32)
        base = PAGED_MQA_LOGITS
        args = list(base.spelled.args)
        args[1] = uint(topo.index_heads)
        kernels["paged_mqa_logits"] = replace(
            base, spelled=KernelName(base.spelled.qualname, tuple(args), base.spelled.params),
            mangled="")
    if topo.hidden != 6144:
        # DeepEP's low-latency kernels are compiled for the hidden size (TSV: `<..., 7168>` for
        # DeepSeek-V3); the router GEMM is sgl-kernel's dedicated kernel at hidden 7168
        for key, base, at in (("deepep_dispatch", DEEPEP_DISPATCH, 2), ("deepep_combine", DEEPEP_COMBINE, 1)):
            args = list(base.spelled.args)
            args[at] = int_(topo.hidden)
            kernels[key] = replace(
                base, spelled=KernelName(base.spelled.qualname, tuple(args), base.spelled.params),
                mangled="")
        kernels["gemm_router"] = ROUTER_GEMM_DSV3
    return kernels


# every kernel of the schedules, with the DeepGEMM GEMMs in the default layout
KERNEL_TYPES: dict[str, KernelType] = {**_K, **deepgemm_kernels()}

# --------------------------------------------------------------------------------------------
# Cost model: decode durations at batch 32 (µs) on one H200 rank, and how they move with batch.
# Bandwidth: 4.8 TB/s. MoE routed weights: 32 local experts x 3 x 6144 x 2048 B = 1.21 GB per
# layer, ~250 µs per layer, ~19 ms over 75 layers (the seed's number). Indexer logits at 128K
# context: 131072 x 132 B = 17.3 MB -> 3.6 µs. Small kernels: a few µs.
# Each entry: (µs at batch 32, batch elasticity: 0 = flat (weight bound), 1 = linear in batch).
# --------------------------------------------------------------------------------------------
DECODE_COST_US: dict[str, tuple[float, float]] = {
    "fused_add_rmsnorm": (3.0, 0.5),
    "rmsnorm": (2.3, 0.5),
    "layernorm": (2.1, 0.5),
    "gemm_qkv_a": (7.6, 0.1),
    "gemm_q_b": (4.4, 0.1),
    "gemm_o_proj": (5.8, 0.1),
    "gemm_indexer_wq_b": (4.6, 0.1),
    "gemm_shared_gate_up": (3.6, 0.1),
    "gemm_shared_down": (2.9, 0.1),
    "gemm_dense_gate_up": (6.4, 0.1),
    "gemm_dense_down": (4.7, 0.1),
    "gemm_moe_gate_up_masked": (166.0, 0.05),
    "gemm_moe_down_masked": (86.0, 0.05),
    "bmm_q_absorb": (4.1, 0.3),
    "bmm_o_absorb": (3.6, 0.3),
    "gemm_indexer_wk_weights": (3.2, 0.1),
    "gemm_lm_head": (52.0, 0.1),
    "gemm_router": (4.2, 0.2),
    "rope": (2.2, 0.5),
    "set_mla_kv_buffer": (2.0, 0.5),
    "sparse_mla_decode": (10.2, 0.8),
    "mla_combine": (2.6, 0.6),
    "custom_allreduce": (6.1, 0.4),
    "indexer_act_quant": (2.0, 0.5),
    "indexer_store_cache": (2.2, 0.5),
    "paged_mqa_logits": (3.6, 0.9),
    "topk_transform_decode": (7.8, 0.8),
    "deepseek_v3_topk": (3.1, 0.4),
    "per_token_group_quant": (2.5, 0.5),
    "deepep_dispatch": (18.0, 0.3),
    "deepep_combine": (22.0, 0.3),
    "moe_sum_reduce": (2.4, 0.5),
    "act_and_mul": (2.2, 0.5),
    "embedding": (2.0, 0.5),
    "sampling": (31.0, 0.5),
    "stray_copy": (2.8, 0.5),
    # DP attention: gather the DP ranks' tokens before each FFN, reduce-scatter after it
    # (8 x 32 rows x 6144 x 2 B = 3.1 MB gathered per layer on NVLink)
    "nccl_allgather": (9.5, 0.6),
    "nccl_reduce_scatter": (11.0, 0.6),
    # MTP
    "eagle_build_tree": (3.4, 0.3),
    "eagle_assign_cache_locs": (2.6, 0.3),
    "cat_batched_copy": (2.1, 0.5),
    "gemm_mtp_eh_proj": (6.8, 0.1),  # 12288 x 6144 bf16 = 151 MB would be 31 us: replicated
    "softmax": (4.6, 0.8),           # over the 154880 / 8 vocabulary columns of a rank
    "argmax_reduce": (3.9, 0.8),
    "tree_speculative_sampling": (24.0, 0.5),
    # DeepSeek-V3.2
    "gemm_router_dsv3": (3.6, 0.2),
    # vLLM (synth/vllm.py): its own norms, quantization, indexer, MoE and all-reduce kernels
    "vllm_rms_norm_block_quant_residual": (3.6, 0.5),
    "vllm_rms_norm_block_quant": (2.8, 0.5),
    "vllm_fused_add_rms_norm": (3.1, 0.5),
    "vllm_rms_norm": (2.3, 0.5),
    "vllm_inductor_layer_norm": (2.0, 0.5),
    "vllm_group_quant": (2.4, 0.5),
    "vllm_rotary": (2.3, 0.5),
    "vllm_concat_and_cache_ds_mla": (2.1, 0.5),
    "vllm_convert_req_index": (2.6, 0.6),
    "vllm_indexer_k_quant_and_cache": (2.2, 0.5),
    "vllm_topk_per_row_decode": (8.4, 0.8),
    "vllm_paged_mqa_logits_metadata": (2.2, 0.2),
    "vllm_grouped_topk": (3.3, 0.4),
    "vllm_moe_align": (3.0, 0.3),
    "vllm_count_and_sort": (2.2, 0.3),
    # Triton fused MoE over the 32 local experts' FP8 weights: weight bound like DeepGEMM's
    "vllm_fused_moe_gate_up": (178.0, 0.05),
    "vllm_fused_moe_down": (92.0, 0.05),
    "vllm_act_and_mul": (2.2, 0.5),
    "vllm_moe_sum": (2.3, 0.5),
    "vllm_inductor_moe_merge": (1.9, 0.5),
    "vllm_multimem_all_reduce": (5.2, 0.4),
    "vllm_embedding_mask": (1.6, 0.3),
    "vllm_embedding_masked_fill": (1.5, 0.3),
    "vllm_logits_rows": (1.6, 0.3),
}
# Prefill kernels (batch x PREFILL_TOKENS_PER_REQ tokens) run this many times longer than the
# decode kernel of the same op; prefill-only kernels get their own base.
PREFILL_TOKENS_PER_REQ = 512
PREFILL_FACTOR = {"gemm": 9.0, "small": 24.0, "attn": 40.0, "comm": 14.0, "moe": 2.2}
PREFILL_ONLY_US = {
    "sparse_attn_prefill": 420.0,
    "mqa_logits_prefill": 95.0,
    "topk_transform_prefill": 140.0,
    "gemm_moe_gate_up_contig": 380.0,
    "gemm_moe_down_contig": 190.0,
    "deepep_dispatch_normal": 260.0,
    "deepep_combine_normal": 310.0,
}
_FAMILY = {
    "gemm": ("gemm_", "bmm_"),
    "attn": ("sparse_mla", "mla_combine", "paged_mqa", "topk_transform"),
    "comm": ("custom_allreduce", "deepep"),
}


def _family(key: str) -> str:
    if key.startswith(("gemm_moe", "vllm_fused_moe")):
        return "moe"
    if key == "vllm_multimem_all_reduce":
        return "comm"
    for fam, prefixes in _FAMILY.items():
        if key.startswith(prefixes):
            return fam
    return "small"


def decode_cost_ns(key: str, batch: int) -> int:
    base, elasticity = DECODE_COST_US[key]
    scale = 1.0 + elasticity * (batch / 32.0 - 1.0)
    return max(800, int(round(base * max(scale, 0.25) * 1000)))


def prefill_cost_ns(key: str, batch: int) -> int:
    if key in PREFILL_ONLY_US:
        return int(PREFILL_ONLY_US[key] * max(batch / 32.0, 0.25) * 1000)
    return int(decode_cost_ns(key, batch) * PREFILL_FACTOR[_family(key)] * max(batch / 32.0, 0.25))


# --------------------------------------------------------------------------------------------
# Module paths (SGLang --enable-layerwise-nvtx-marker) and their marker payloads
# --------------------------------------------------------------------------------------------
def layer_prefix(layer: int) -> str:
    return f"model.model.layers.{layer}"


# direct trainable parameters of each module kind (shape lists, per rank), for the NVTX text
_PARAMS: dict[str, dict[str, list[int]]] = {
    "input_layernorm": {"weight": [HIDDEN]},
    "post_attention_layernorm": {"weight": [HIDDEN]},
    "self_attn.fused_qkv_a_proj_with_mqa": {"weight": [2624, HIDDEN], "weight_scale_inv": [21, 48]},
    "self_attn.q_a_layernorm": {"weight": [2048]},
    "self_attn.kv_a_layernorm": {"weight": [512]},
    "self_attn.q_b_proj": {"weight": [2048, 2048], "weight_scale_inv": [16, 16]},
    "self_attn.o_proj": {"weight": [HIDDEN, 2048], "weight_scale_inv": [48, 16]},
    "self_attn.attn_mqa": {"k_scale": [], "v_scale": []},
    "self_attn.indexer.wq_b": {"weight": [4096, 2048], "weight_scale_inv": [32, 16]},
    "self_attn.indexer.wk": {"weight": [160, HIDDEN]},
    "self_attn.indexer.k_norm": {"weight": [128], "bias": [128]},
    "mlp.gate": {"weight": [256, HIDDEN], "e_score_correction_bias": [256]},
    "mlp.experts": {"w13_weight": [32, 4096, HIDDEN], "w2_weight": [32, HIDDEN, 2048]},
    # replicated under DeepEP (deepseek_v2.py DeepseekV2MoE.__init__: tp_size=1)
    "mlp.shared_experts.gate_up_proj": {"weight": [4096, HIDDEN], "weight_scale_inv": [32, 48]},
    "mlp.shared_experts.down_proj": {"weight": [HIDDEN, 2048], "weight_scale_inv": [48, 16]},
    "mlp.gate_up_proj": {"weight": [3072, HIDDEN], "weight_scale_inv": [24, 48]},
    "mlp.down_proj": {"weight": [HIDDEN, 1536], "weight_scale_inv": [48, 12]},
}
_INPUT_WIDTH: dict[str, list[list[int]]] = {
    "input_layernorm": [[HIDDEN], [HIDDEN]],
    "post_attention_layernorm": [[HIDDEN], [HIDDEN]],
    "self_attn": [[HIDDEN]],
    "self_attn.fused_qkv_a_proj_with_mqa": [[HIDDEN]],
    "self_attn.q_a_layernorm": [[2048]],
    "self_attn.kv_a_layernorm": [[512]],
    "self_attn.q_b_proj": [[2048]],
    "self_attn.rotary_emb": [[], [8, 64], [1, 64]],
    "self_attn.attn_mqa": [[8, 576], [1, 576], [8, 512]],
    "self_attn.o_proj": [[2048]],
    "self_attn.indexer": [[HIDDEN], [2048]],
    "self_attn.indexer.wq_b": [[2048]],
    "self_attn.indexer.wk": [[HIDDEN]],
    "self_attn.indexer.k_norm": [[128]],
    "mlp": [[HIDDEN]],
    "mlp.gate": [[HIDDEN]],
    "mlp.topk": [[HIDDEN], [256]],
    "mlp.experts": [[HIDDEN]],
    "mlp.shared_experts": [[HIDDEN]],
    "mlp.shared_experts.gate_up_proj": [[HIDDEN]],
    "mlp.shared_experts.act_fn": [[4096]],
    "mlp.shared_experts.down_proj": [[2048]],
    "mlp.gate_up_proj": [[HIDDEN]],
    "mlp.act_fn": [[3072]],
    "mlp.down_proj": [[1536]],
}


@lru_cache(maxsize=None)
def _module_tables(topology: str) -> tuple[dict, dict]:
    """(direct parameter shapes, input widths) per module kind for `topology`: the GLM-5.3 TP8
    tables above, or the same modules at the topology's shapes (see synth/topologies.py)."""
    if topology == DEFAULT_TOPOLOGY:
        return _PARAMS, _INPUT_WIDTH
    t = get_topology(topology)
    h, q, heads = t.hidden, t.q_lora_rank, t.local_heads
    qk = heads * (t.qk_nope_head_dim + 64)
    o_in = heads * t.v_head_dim
    kv_a = q + 512 + 64
    inter = t.intermediate // t.tp

    def blocks(n: int, k: int) -> list[int]:  # FP8 128 x 128 block scales
        return [-(-n // 128), -(-k // 128)]

    params = {**_PARAMS,
              "input_layernorm": {"weight": [h]}, "post_attention_layernorm": {"weight": [h]},
              "self_attn.fused_qkv_a_proj_with_mqa": {"weight": [kv_a, h],
                                                     "weight_scale_inv": blocks(kv_a, h)},
              "self_attn.q_a_layernorm": {"weight": [q]},
              "self_attn.q_b_proj": {"weight": [qk, q], "weight_scale_inv": blocks(qk, q)},
              "self_attn.o_proj": {"weight": [h, o_in], "weight_scale_inv": blocks(h, o_in)},
              "self_attn.indexer.wq_b": {"weight": [t.index_heads * 128, q],
                                         "weight_scale_inv": blocks(t.index_heads * 128, q)},
              "self_attn.indexer.wk": {"weight": [128 + t.index_heads, h]},
              "mlp.gate": {"weight": [256, h], "e_score_correction_bias": [256]},
              "mlp.experts": {"w13_weight": [32, 4096, h], "w2_weight": [32, h, 2048]},
              "mlp.shared_experts.gate_up_proj": {"weight": [4096, h], "weight_scale_inv": blocks(4096, h)},
              "mlp.shared_experts.down_proj": {"weight": [h, 2048], "weight_scale_inv": blocks(h, 2048)},
              "mlp.gate_up_proj": {"weight": [2 * inter, h], "weight_scale_inv": blocks(2 * inter, h)},
              "mlp.down_proj": {"weight": [h, inter], "weight_scale_inv": blocks(h, inter)}}
    widths = {key: [[h if w == HIDDEN else w for w in shape] for shape in shapes]
              for key, shapes in _INPUT_WIDTH.items()}
    widths.update({"self_attn.q_a_layernorm": [[q]], "self_attn.q_b_proj": [[q]],
                   "self_attn.rotary_emb": [[], [heads, 64], [1, 64]],
                   "self_attn.attn_mqa": [[heads, 576], [1, 576], [heads, 512]],
                   "self_attn.o_proj": [[o_in]], "self_attn.indexer": [[h], [q]],
                   "self_attn.indexer.wq_b": [[q]], "mlp.act_fn": [[2 * inter]],
                   "mlp.down_proj": [[inter]]})
    return params, widths


def nvtx_marker_text(module: str, tokens: int, topology: str = DEFAULT_TOPOLOGY) -> str:
    """The range text SGLang's layerwise NVTX marker pushes for `module` (a Python dict repr).

    Format as seen in real SGLang DeepSeek traces: {'Module': 'model.model.layers.0.self_attn.
    q_a_layernorm', 'TrainableParams': {'weight': [1536]}, 'Inputs': [[2048, 1536]]}.
    Shapes are those of `topology`; the MTP layer (`model.model.decoder`) reads as a layer."""
    table_params, input_width = _module_tables(topology)
    hidden = get_topology(topology).hidden
    rel = module
    if module.startswith("model.model.layers."):
        parts = module.split(".", 4)
        rel = parts[4] if len(parts) == 5 else "<layer>"
    elif module.startswith(f"{MTP_PREFIX}.decoder"):
        rel = module[len(f"{MTP_PREFIX}.decoder."):] or "<layer>"
    params = table_params.get(rel, {})
    if rel == "<layer>":
        inputs: list[list[int]] = [[tokens], [tokens, hidden], [tokens, hidden]]
    elif module == "model.model.embed_tokens":
        params = {"weight": [get_topology(topology).vocab // TP, hidden]}
        inputs = [[tokens]]
    elif module == "model.model.norm":
        params = {"weight": [hidden]}
        inputs = [[tokens, hidden], [tokens, hidden]]
    elif module in ("model", "model.model"):
        inputs = [[tokens], [tokens]]
    elif module == "model.logits_processor":
        inputs = [[tokens], [tokens, hidden]]
    else:
        inputs = [[tokens] + w if w else [tokens] for w in input_width.get(rel, [[hidden]])]
    return repr({"Module": module, "TrainableParams": params, "Inputs": inputs})


def module_chain(module: str) -> tuple[str, ...]:
    """The nested modules whose forward hooks are open while a kernel of `module` launches.

    `model.model.layers.12.self_attn.q_a_layernorm` ->
    (model, model.model, model.model.layers.12, model.model.layers.12.self_attn, ...q_a_layernorm).
    `model.model.layers` itself is a ModuleList and has no forward, so no range."""
    if not module:
        return ()
    parts = module.split(".")
    chain = []
    i = 1
    while i <= len(parts):
        if parts[i - 1] == "layers" and i < len(parts):
            i += 1  # merge 'layers' with its index
        chain.append(".".join(parts[:i]))
        i += 1
    return tuple(chain)


# --------------------------------------------------------------------------------------------
# Schedules
# --------------------------------------------------------------------------------------------
GROUPS = ("attention", "indexer", "moe", "deepep", "dense_mlp", "outside", "fault", "dp_comm", "mtp")


@dataclass(frozen=True)
class KernelSpec:
    """One launch in a forward pass, in issue order."""

    kernel: KernelType
    op: str  # ledger entry, e.g. "input_norm", "indexer.logits", "moe.gate_up"
    group: str  # one of GROUPS
    module: str  # layerwise NVTX module path the launch happens under ('' = none)
    layer: int | None  # decoder layer, None outside the layers
    stream: str  # "main" or "alt" (alt only exists in CUDA-graph capture mode)
    dur_ns: int  # mean GPU duration
    deps: tuple[int, ...] = ()  # indices of earlier specs on the other stream this one waits on
    # what the launch does in the model, from the shared vocabulary (ledger/roles.py); "" for a
    # fault's stray kernel, which does nothing the model asks for
    role: str = ""
    # launched by the host even in graph mode: outside the CUDA graphs (vLLM's piecewise
    # attention, its logits and metadata kernels); the graph parts are the runs between these
    eager: bool = False

    @property
    def name(self) -> str:
        return self.kernel.name


@dataclass(frozen=True)
class Schedule:
    kind: str  # "decode" or "prefill"
    batch: int
    tokens: int
    kernels: tuple[KernelSpec, ...]  # the forward pass: what goes in the decode graph
    sampling: KernelSpec  # launched eagerly after the forward pass
    faults: frozenset[str] = field(default_factory=frozenset)
    num_layers: int = NUM_LAYERS  # decoder layers of the model (layer_counts' length)
    topology: str = DEFAULT_TOPOLOGY
    # MTP: indices of `kernels` where the second, third ... graph of the step begins (empty:
    # one graph), and the graph after whose replay the sampling kernel runs (None: the last)
    graph_starts: tuple[int, ...] = ()
    sampling_after_graph: int | None = None

    def __len__(self) -> int:
        return len(self.kernels)

    def counts_by_group(self) -> dict[str, int]:
        c = Counter(k.group for k in self.kernels)
        c[self.sampling.group] += 1
        return {g: c[g] for g in GROUPS if c[g]}

    def name_counts(self, *, with_sampling: bool = True) -> dict[str, int]:
        c = Counter(k.kernel.name for k in self.kernels)
        if with_sampling:
            c[self.sampling.kernel.name] += 1
        return dict(c)

    def layer_counts(self) -> list[int]:
        """Kernels launched in each decoder layer (index = layer; sampling is outside)."""
        c = Counter(k.layer for k in self.kernels if k.layer is not None)
        return [c[layer] for layer in range(self.num_layers)]

    def segments(self) -> list[tuple[int, int, bool]]:
        """The pass in launch order as (lo, hi, in_graph) runs of `kernels`: the graph parts
        (`graph_starts` splits them further) and the eager launches between them."""
        cuts = set(self.graph_starts)
        out: list[tuple[int, int, bool]] = []
        lo = 0
        for i in range(1, len(self.kernels) + 1):
            if (i == len(self.kernels) or i in cuts
                    or self.kernels[i].eager != self.kernels[lo].eager):
                out.append((lo, i, not self.kernels[lo].eager))
                lo = i
        return out

    def role_counts(self) -> dict[str, int]:
        """Kernels of the step by role (the sampling kernel included; roleless fault kernels
        under "")."""
        c = Counter(k.role for k in self.kernels)
        c[self.sampling.role] += 1
        return dict(c)

    def split_index(self, layer: int = SPLIT_GRAPH_LAYER) -> int:
        """Index of the first kernel of `layer` (where a split graph starts its second part)."""
        for i, k in enumerate(self.kernels):
            if k.layer == layer:
                return i
        raise ValueError(layer)


# The role of every op the SGLang schedule launches (the generator's op names, the second field
# of KernelSpec; roles from nsys_ledger/ledger/roles.py, as the SGLang ledgers give them to the
# ledger ops that claim these launches: a cuBLAS GEMM gets the role of the place it fills, the
# router's, the indexer's or the absorption's, as the ledgers' layer sequences place it).
OP_ROLES: dict[str, str] = {
    "embedding": "embedding", "final_norm": "residual_norm", "lm_head": "lm_head",
    "sampling": "sampling",
    # layer 0's plain RMSNorm is still its input norm (the ledgers' "fused_add_rmsnorm|rmsnorm")
    "input_norm": "residual_norm", "post_attn_norm": "residual_norm",
    "qkv_a_proj": "qkv_a_proj", "q_a_norm": "latent_norm", "kv_a_norm": "latent_norm",
    "q_b_proj": "q_b_proj", "rope": "rope", "q_absorb": "mla_absorb", "o_absorb": "mla_absorb",
    "kv_write": "kv_write", "sparse_mla": "attention", "sparse_mla.combine": "attention_combine",
    "o_proj": "o_proj", "attn_allreduce": "allreduce",
    "indexer.wq_b": "indexer_proj", "indexer.wk_weights_proj": "indexer_proj",
    "indexer.k_norm": "indexer_norm", "indexer.act_quant": "indexer_quant",
    "indexer.store_cache": "indexer_cache", "indexer.logits": "indexer_logits",
    "indexer.topk": "indexer_topk",
    "mlp.gate_up": "ffn_dense_gemm", "mlp.act": "ffn_act", "mlp.down": "ffn_dense_gemm",
    "moe.router": "router", "moe.shared_gate_up": "ffn_dense_gemm", "moe.shared_act": "ffn_act",
    "moe.shared_down": "ffn_dense_gemm", "moe.topk": "moe_topk", "moe.quant": "ffn_quant",
    "deepep.dispatch": "moe_dispatch", "moe.gate_up": "moe_gemm", "moe.down": "moe_gemm",
    "deepep.combine": "moe_combine", "moe.scale_shared_add": "moe_sum",
    "dp_gather": "dp_gather", "dp_reduce_scatter": "dp_scatter",
    "layer_fault.copy": "",  # a fault's stray copy: no role
    # MTP: the draft model's own plumbing (its decoder layer keeps the layer roles above)
    "mtp.embedding": "mtp_draft", "mtp.enorm": "mtp_draft", "mtp.hnorm": "mtp_draft",
    "mtp.cat": "mtp_draft", "mtp.eh_proj": "mtp_draft", "mtp.shared_head_norm": "mtp_draft",
    "mtp.lm_head": "mtp_draft", "mtp.draft_probs": "mtp_draft", "mtp.draft_top1": "mtp_draft",
    "mtp.draft_tree": "mtp_draft", "mtp.draft_cache_locs": "mtp_draft",
}


class _Builder:
    def __init__(self, kind: str, batch: int, faults: frozenset[str], alt_streams: bool):
        self.kind = kind
        self.batch = batch
        self.faults = faults
        self.alt = alt_streams
        self.specs: list[KernelSpec] = []
        self.keys: dict[tuple[int | None, str], int] = {}

    def cost(self, kt: KernelType) -> int:
        if self.kind == "decode":
            return decode_cost_ns(kt.key, self.batch)
        return prefill_cost_ns(kt.key, self.batch)

    def add(self, key: str, kt: KernelType, op: str, group: str, module: str, layer: int | None,
            stream: str = "main", deps: tuple[str, ...] = (), dur_ns: int | None = None,
            *, role: str | None = None, eager: bool = False) -> None:
        """Append one launch; its role is `role`, else the role of the schedule op `op`
        (OP_ROLES: every op the SGLang schedule launches)."""
        if not self.alt:
            stream, deps = "main", ()
        dep_idx = tuple(self.keys[(layer, d)] for d in deps if (layer, d) in self.keys)
        idx = len(self.specs)
        self.specs.append(KernelSpec(kt, op, group, module, layer, stream,
                                     dur_ns if dur_ns is not None else self.cost(kt), dep_idx,
                                     role=OP_ROLES[op] if role is None else role, eager=eager))
        self.keys[(layer, key)] = idx
        if kt is FUSED_ADD_RMSNORM and "broken_fusion" in self.faults:
            # the norm + FP8 quant fusion is lost: a separate group quant follows every norm
            self.specs.append(KernelSpec(GROUP_QUANT, "broken_fusion.quant", "fault", module,
                                         layer, "main", self.cost(GROUP_QUANT), (),
                                         role="ffn_quant"))


def _build(kind: str, batch: int, faults: frozenset[str], alt_streams: bool,
           deepgemm_layout: str, topology: str = DEFAULT_TOPOLOGY) -> Schedule:
    """One forward pass of the target model of `topology` (GLM-5.3 TP8 by default)."""
    topo = get_topology(topology)
    b = _Builder(kind, batch, faults, alt_streams)
    K = topology_kernels(topo.name, deepgemm_layout)  # noqa: N806 - the kernels, by schedule key
    decode = kind == "decode"
    b.add("embed", K["embedding"], "embedding", "outside", "model.model.embed_tokens", None)
    for L in range(topo.num_layers):
        _decoder_layer(b, K, topo, L, layer_prefix(L), decode, faults)
    b.add("final_norm", FUSED_ADD_RMSNORM, "final_norm", "outside", "model.model.norm", None)
    b.add("lm_head", K["gemm_lm_head"], "lm_head", "outside", "model.logits_processor", None)
    sampling = KernelSpec(SAMPLING, "sampling", "outside", "", None, "main", b.cost(SAMPLING),
                          role="sampling")
    tokens = batch if decode else batch * PREFILL_TOKENS_PER_REQ
    return Schedule(kind, batch, tokens, tuple(b.specs), sampling, faults,
                    num_layers=topo.num_layers, topology=topo.name)


def _decoder_layer(b: _Builder, K: dict[str, KernelType], topo: Topology, L: int | None,  # noqa: N803
                   p: str, decode: bool, faults: frozenset[str]) -> None:
    """The launches of one DeepseekV2DecoderLayer (`L` None: the MTP layer, a MoE layer with
    its indexer and no residual yet) under module prefix `p`."""
    a = f"{p}.self_attn"
    mtp_layer = L is None
    if L == 0 or mtp_layer:
        b.add("input_norm", RMSNORM, "input_norm", "attention", f"{p}.input_layernorm", L)
    else:
        b.add("input_norm", FUSED_ADD_RMSNORM, "input_norm", "attention",
              f"{p}.input_layernorm", L)
    b.add("qkv_a", K["gemm_qkv_a"], "qkv_a_proj", "attention",
          f"{a}.fused_qkv_a_proj_with_mqa", L)
    b.add("q_a_norm", RMSNORM, "q_a_norm", "attention", f"{a}.q_a_layernorm", L)
    if not (L == MISSING_KERNEL_LAYER and "missing_kernel" in faults):
        b.add("kv_a_norm", RMSNORM, "kv_a_norm", "attention", f"{a}.kv_a_layernorm", L,
              stream="alt", deps=("qkv_a",))
    # the MTP layer always builds its indexer (the seed: `if not self.skip_topk or is_nextn`)
    if mtp_layer or L in topo.full_indexer_layers:
        ix = f"{a}.indexer"
        b.add("ix_wq_b", K["gemm_indexer_wq_b"], "indexer.wq_b", "indexer", f"{ix}.wq_b", L,
              "alt", deps=("q_a_norm",))
        b.add("ix_wk", K["gemm_indexer_wk_weights"], "indexer.wk_weights_proj", "indexer",
              f"{ix}.wk", L, "alt")
        b.add("ix_k_norm", LAYERNORM, "indexer.k_norm", "indexer", f"{ix}.k_norm", L, "alt")
        b.add("ix_act_quant", ACT_QUANT, "indexer.act_quant", "indexer", ix, L, "alt")
        b.add("ix_store", STORE_INDEXER_CACHE, "indexer.store_cache", "indexer", ix, L, "alt")
        logits = K["paged_mqa_logits"]
        if decode:
            if "chunked_indexer" in faults:
                chunk = b.cost(logits) // 3 + 700
                for c in range(3):
                    b.add(f"ix_logits{c}", logits, "indexer.logits", "indexer", ix,
                          L, "alt", dur_ns=chunk)
            else:
                b.add("ix_logits", logits, "indexer.logits", "indexer", ix, L, "alt")
            b.add("ix_topk", TOPK_DECODE, "indexer.topk", "indexer", ix, L, "alt")
        else:
            b.add("ix_logits", MQA_LOGITS_PREFILL, "indexer.logits", "indexer", ix, L, "alt")
            b.add("ix_topk", TOPK_PREFILL, "indexer.topk", "indexer", ix, L, "alt")
    b.add("q_b", K["gemm_q_b"], "q_b_proj", "attention", f"{a}.q_b_proj", L,
          deps=("kv_a_norm",))
    b.add("rope", ROPE, "rope", "attention", f"{a}.rotary_emb", L)
    b.add("q_absorb", K["bmm_q_absorb"], "q_absorb", "attention", a, L)
    b.add("kv_write", KV_WRITE, "kv_write", "attention", f"{a}.attn_mqa", L)
    if decode:
        b.add("sparse_mla", SPARSE_MLA_DECODE, "sparse_mla", "attention", f"{a}.attn_mqa", L,
              deps=("ix_topk",))
        b.add("mla_combine", MLA_COMBINE, "sparse_mla.combine", "attention", f"{a}.attn_mqa", L)
    else:
        # prefill: one sparse attention kernel, no split-KV combine
        b.add("sparse_mla", SPARSE_ATTN_PREFILL, "sparse_mla", "attention", f"{a}.attn_mqa",
              L, deps=("ix_topk",))
    b.add("o_absorb", K["bmm_o_absorb"], "o_absorb", "attention", a, L)
    if L == FAULT_LAYER and "layer_fault" in faults:
        b.add("stray", STRAY_COPY, "layer_fault.copy", "fault", a, L)
    b.add("o_proj", K["gemm_o_proj"], "o_proj", "attention", f"{a}.o_proj", L)
    if not topo.dp_attention:
        # TP8: o_proj is row parallel and sums its partial outputs over the attention TP group.
        # DP attention (attn_tp 1): the whole o_proj is local, nothing to reduce.
        b.add("allreduce", ALLREDUCE, "attn_allreduce", "attention", f"{a}.o_proj", L)
    b.add("post_norm", FUSED_ADD_RMSNORM, "post_attn_norm", "attention",
          f"{p}.post_attention_layernorm", L)
    ffn_input = "post_norm"
    if topo.dp_attention:
        # the seed: the FFN runs on the global batch, so every layer gathers the DP ranks'
        # tokens first (dp_gather, an AllGather) and hands each rank its rows back after
        # (a ReduceScatter). SGLang's LayerCommunicator does this in the decoder layer's own
        # forward, so no sub-module range encloses them.
        b.add("dp_gather", DP_GATHER, "dp_gather", "dp_comm", p, L)
        ffn_input = "dp_gather"
    m = f"{p}.mlp"
    if not mtp_layer and L in topo.dense_layers:
        b.add("mlp_gate_up", K["gemm_dense_gate_up"], "mlp.gate_up", "dense_mlp",
              f"{m}.gate_up_proj", L)
        b.add("mlp_act", ACT_AND_MUL, "mlp.act", "dense_mlp", f"{m}.act_fn", L)
        b.add("mlp_down", K["gemm_dense_down"], "mlp.down", "dense_mlp", f"{m}.down_proj", L)
    else:
        # DeepseekV2MoE.forward_deepep (python/sglang/srt/models/deepseek_v2.py), in its
        # order: router logits (self.gate), then the shared expert (_forward_shared_experts ->
        # DeepseekV2MLP.forward: gate_up_proj, act_fn = SiluAndMul, down_proj), then
        # select_experts (grouped top-k), the routed experts between DeepEP dispatch and
        # combine, and the shared output plus the scaled routed output. One stream: forward_deepep
        # issues everything on the current stream.
        b.add("router", K["gemm_router"], "moe.router", "moe", f"{m}.gate", L, deps=(ffn_input,))
        b.add("shared_gate_up", K["gemm_shared_gate_up"], "moe.shared_gate_up", "moe",
              f"{m}.shared_experts.gate_up_proj", L)
        b.add("shared_act", ACT_AND_MUL, "moe.shared_act", "moe", f"{m}.shared_experts.act_fn", L)
        b.add("shared_down", K["gemm_shared_down"], "moe.shared_down", "moe",
              f"{m}.shared_experts.down_proj", L)
        b.add("topk", MOE_TOPK, "moe.topk", "moe", f"{m}.topk", L)
        # the DeepGEMM path quantizes the dispatched activations per token group (FP8)
        b.add("quant", GROUP_QUANT, "moe.quant", "moe", f"{m}.experts", L)
        if decode:
            b.add("dispatch", K["deepep_dispatch"], "deepep.dispatch", "deepep", f"{m}.experts", L)
            b.add("gate_up", K["gemm_moe_gate_up_masked"], "moe.gate_up", "moe", f"{m}.experts", L)
            b.add("down", K["gemm_moe_down_masked"], "moe.down", "moe", f"{m}.experts", L)
            b.add("combine", K["deepep_combine"], "deepep.combine", "deepep", f"{m}.experts", L)
        else:
            b.add("dispatch", DEEPEP_DISPATCH_NORMAL, "deepep.dispatch", "deepep", f"{m}.experts",
                  L)
            b.add("gate_up", K["gemm_moe_gate_up_contig"], "moe.gate_up", "moe", f"{m}.experts", L)
            b.add("down", K["gemm_moe_down_contig"], "moe.down", "moe", f"{m}.experts", L)
            b.add("combine", DEEPEP_COMBINE_NORMAL, "deepep.combine", "deepep", f"{m}.experts", L)
        # `x = shared_output; x.add_(final_hidden_states, alpha=routed_scaling_factor)`: the
        # ledger's one merge kernel (moe_sum row); the generator keeps sgl-kernel's
        # moe_sum_reduce name for it, which the ledgers know
        b.add("sum_reduce", MOE_SUM_REDUCE, "moe.scale_shared_add", "moe", m, L)
    if topo.dp_attention:
        b.add("dp_reduce_scatter", DP_REDUCE_SCATTER, "dp_reduce_scatter", "dp_comm", p, L)


SCHEDULE_FAULTS = frozenset({"broken_fusion", "chunked_indexer", "layer_fault", "missing_kernel"})
# MTP only: the draft stage's graph is never replayed (its kernels are missing from every step)
MTP_FAULTS = frozenset({"missing_draft_replay"})
# the MTP layer's module path in SGLang's draft model (DeepseekModelNextN: embed_tokens, enorm,
# hnorm, eh_proj, decoder, shared_head.norm) and the verify width: one draft token per request
MTP_PREFIX = "model.model"
MTP_TOKENS_PER_REQ = 2  # --speculative-num-steps 1 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2


def _mtp_layer_pass(kind: str, batch: int, faults: frozenset[str], alt_streams: bool,
                    deepgemm_layout: str, topo: Topology) -> list[KernelSpec]:
    """The MTP layer's forward (SGLang DeepseekModelNextN): embedding, enorm + hnorm of the
    token and the target's hidden state, their concatenation through eh_proj, one decoder
    layer (MoE with its indexer), shared_head.norm and the LM head; decode adds the draft's
    softmax + top-1 (fast_topk with topk 1 is a max reduction)."""
    b = _Builder(kind, batch, faults, alt_streams)
    K = topology_kernels(topo.name, deepgemm_layout)  # noqa: N806
    b.add("mtp_embed", K["embedding"], "mtp.embedding", "mtp", f"{MTP_PREFIX}.embed_tokens", None)
    b.add("mtp_enorm", RMSNORM, "mtp.enorm", "mtp", f"{MTP_PREFIX}.enorm", None)
    b.add("mtp_hnorm", RMSNORM, "mtp.hnorm", "mtp", f"{MTP_PREFIX}.hnorm", None)
    b.add("mtp_cat", MTP_CAT, "mtp.cat", "mtp", MTP_PREFIX, None)
    b.add("mtp_eh_proj", MTP_EH_PROJ, "mtp.eh_proj", "mtp", f"{MTP_PREFIX}.eh_proj", None)
    _decoder_layer(b, K, topo, None, f"{MTP_PREFIX}.decoder", kind == "decode", faults)
    b.add("mtp_head_norm", FUSED_ADD_RMSNORM, "mtp.shared_head_norm", "mtp",
          f"{MTP_PREFIX}.shared_head.norm", None)
    b.add("mtp_lm_head", K["gemm_lm_head"], "mtp.lm_head", "mtp", "model.logits_processor", None)
    if kind == "decode":
        b.add("mtp_softmax", SOFTMAX, "mtp.draft_probs", "mtp", "", None)
        b.add("mtp_top1", ARGMAX, "mtp.draft_top1", "mtp", "", None)
    return b.specs


def _shifted(specs, offset: int) -> list[KernelSpec]:
    return [replace(k, deps=tuple(d + offset for d in k.deps)) for k in specs]


def _build_mtp_decode(batch: int, faults: frozenset[str], alt_streams: bool,
                      deepgemm_layout: str, topo: Topology) -> Schedule:
    """One MTP decode step: the three graphs the EAGLE worker replays, in order, as one kernel
    list whose `graph_starts` say where the verify and draft_extend graphs begin.

    draft         (one speculative step, top-1) the draft token of the previous draft_extend
                  becomes the verify input: tree positions and its KV slots, 2 kernels
    verify        the target model over 2 tokens per request (the draft + the next), 2001 kernels
    (sampling)    the verification of the draft against the target's logits, eager, after the
                  verify replay: the step's marker kernel
    draft_extend  the MTP layer over the accepted tokens, 40 kernels: the next draft token
    The seed's row "MTP 草稿层与索引器 约 20" is the MTP layer's attention (14) and indexer (7);
    its MoE (8), DeepEP (2), input/head plumbing (9) and the draft graph (2) come on top."""
    verify_batch = batch * MTP_TOKENS_PER_REQ
    verify = _build("decode", verify_batch, faults, alt_streams, deepgemm_layout, topo.name)
    draft = _Builder("decode", batch, faults, alt_streams)
    draft.add("build_tree", DRAFT_BUILD_TREE, "mtp.draft_tree", "mtp", "", None)
    draft.add("cache_locs", DRAFT_CACHE_LOCS, "mtp.draft_cache_locs", "mtp", "", None)
    extend = _mtp_layer_pass("decode", verify_batch, faults, alt_streams, deepgemm_layout, topo)
    parts = [] if "missing_draft_replay" in faults else [draft.specs]
    parts += [list(verify.kernels), extend]
    kernels: list[KernelSpec] = []
    starts = []
    for part in parts:
        if kernels:
            starts.append(len(kernels))
        kernels += _shifted(part, len(kernels))
    sampling = KernelSpec(VERIFY_SAMPLING, "sampling", "outside", "", None, "main",
                          decode_cost_ns(VERIFY_SAMPLING.key, batch), role="sampling")
    return Schedule("decode", batch, verify_batch, tuple(kernels), sampling, faults,
                    num_layers=topo.num_layers, topology=topo.name, graph_starts=tuple(starts),
                    sampling_after_graph=len(parts) - 2)


def decode_schedule(batch: int = 32, faults: frozenset[str] | set[str] | tuple = (),
                    *, alt_streams: bool = True,
                    deepgemm_layout: str = DEFAULT_DEEPGEMM_LAYOUT,
                    topology: str = DEFAULT_TOPOLOGY) -> Schedule:
    """The decode forward pass (what the decode CUDA graph holds) plus the eager sampling kernel.

    alt_streams=False puts everything on the main stream (SGLang forks to the alt stream only
    in capture mode, so eager decode runs single-stream). deepgemm_layout: how the DeepGEMM
    kernels are named (one of synth.deepgemm.DEEPGEMM_LAYOUTS). topology: one of
    synth.topologies.TOPOLOGIES; with MTP the pass is three graphs (`Schedule.graph_starts`)."""
    topo = get_topology(topology)
    if topo.framework == "vllm":
        from nsys_ledger.synth.vllm import build_vllm_pass  # it builds on this module

        return build_vllm_pass("decode", batch, frozenset(faults), topo, deepgemm_layout)
    if topo.mtp:
        return _build_mtp_decode(batch, frozenset(faults) & (SCHEDULE_FAULTS | MTP_FAULTS),
                                 alt_streams, deepgemm_layout, topo)
    return _build("decode", batch, frozenset(faults) & SCHEDULE_FAULTS, alt_streams,
                  deepgemm_layout, topology)


def prefill_schedule(batch: int = 32, faults: frozenset[str] | set[str] | tuple = (),
                     *, deepgemm_layout: str = DEFAULT_DEEPGEMM_LAYOUT,
                     topology: str = DEFAULT_TOPOLOGY) -> Schedule:
    """The eager prefill pass: sparse_attn_fwd_kernel instead of the split-KV decode kernel,
    non-paged indexer logits, DeepEP normal mode, contiguous grouped GEMMs; single stream.
    A vLLM topology runs its decode kernels over the prompt (FlashMLA sparse at TP8 treats
    prefill tokens as one mixed batch for the FP8 decode kernel: synth/vllm.py)."""
    topo = get_topology(topology)
    if topo.framework == "vllm":
        from nsys_ledger.synth.vllm import build_vllm_pass

        return build_vllm_pass("prefill", batch, frozenset(faults), topo, deepgemm_layout)
    return _build("prefill", batch, frozenset(faults) & SCHEDULE_FAULTS, False, deepgemm_layout,
                  topology)


def mtp_prefill_extend(batch: int = 32, faults: frozenset[str] | set[str] | tuple = (),
                       *, deepgemm_layout: str = DEFAULT_DEEPGEMM_LAYOUT,
                       topology: str = DEFAULT_TOPOLOGY) -> tuple[KernelSpec, ...]:
    """MTP: the draft model's eager extend over the prompt, after the prefill's sampling (its
    prefill attention kernel marks the window it lands in as not a decode step)."""
    topo = get_topology(topology)
    return tuple(_mtp_layer_pass("prefill", batch, frozenset(faults) & SCHEDULE_FAULTS, False,
                                 deepgemm_layout, topo))


def role_counts_per_step(topology: str = DEFAULT_TOPOLOGY, batch: int = 32) -> dict[str, int]:
    """Kernels per healthy decode step of `topology`, by role (ledger/roles.py), as the
    generator launches them: each launch's role is set where the schedule adds it, never read
    back from a kernel name. The sampling kernel (or MTP's verification) counts as `sampling`."""
    return dict(sorted(decode_schedule(batch, topology=topology).role_counts().items()))


def with_durations(s: Schedule, scale: float) -> Schedule:
    """The same schedule with every duration multiplied (used for a slow rank)."""
    ks = tuple(replace(k, dur_ns=int(k.dur_ns * scale)) for k in s.kernels)
    sampling = replace(s.sampling, dur_ns=int(s.sampling.dur_ns * scale))
    return replace(s, kernels=ks, sampling=sampling)
