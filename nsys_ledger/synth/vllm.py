"""What vLLM V1 launches for one forward pass of GLM-5.3 or DeepSeek-V3.2 at TP8 + EP8.

The generator's own statement of a vLLM deployment (topologies `glm-5.3-vllm-tp8-ep8`,
`glm-5.3-vllm-tp8-ep8-piecewise`, `deepseek-v3.2-vllm-tp8-ep8`), written from vLLM's source
(paths below are in github.com/vllm-project/vllm) and from the real vLLM profiles in
/work/shared, never from the ledgers in expectations/ (ARCHITECTURE.md: two statements that
check each other). The deployment: `vllm serve --tensor-parallel-size 8
--enable-expert-parallel --kv-cache-dtype fp8` on H200 (SM90), FP8 block-quantized weights,
torch.compile at its default level, decode in a FULL CUDA graph (the decode half of vLLM's
default FULL_AND_PIECEWISE) or, with `-cc.cudagraph_mode=PIECEWISE`, in pieces.

Choices, each with its source:

* Attention backend FLASHMLA_SPARSE (vllm/v1/attention/backends/mla/flashmla_sparse.py,
  FlashMLASparseBackend: the only sparse MLA backend for SM90, head size 576, kv cache
  `fp8_ds_mla`). At TP8 a rank holds 8 (GLM) or 16 (DeepSeek) heads, under
  MIN_HEADS_FOR_BF16_PREFILL = 32, so the builder runs the FP8 decode kernel for every token
  ("mixed batch mode", the module's first comment): FlashMLA's
  `flash_fwd_splitkv_mla_fp8_sparse_kernel` plus its split-KV combine, the heads padded to 64
  (`fp8_decode_padded_heads`: "FP8 decode kernel only supports h_q = 64 or 128"). Before it,
  the top-k indices of the request are turned into global cache slots by the Triton kernel
  `_convert_req_index_to_global_index_kernel` (vllm/v1/attention/backends/mla/sparse_utils.py,
  triton_convert_req_index_to_global_index): the page-table row of the seed.
  KV write: `concat_and_cache_ds_mla_kernel` (csrc/cache_kernels.cu, the 656-byte fp8_ds_mla
  record the backend docstring describes). Query and output absorption: `torch.bmm` against
  W_UK_T and W_UV inside the MLA impl's forward, cuBLAS batched GEMMs (nvjet names, as SGLang's).
* The DSA indexer (vllm/model_executor/models/deepseek_v2.py, class Indexer; its custom op
  vllm/model_executor/layers/sparse_attn_indexer.py, sparse_attn_indexer): wq_b (FP8 linear
  on the normalized q latent), wk and weights_proj (two bf16 ReplicatedLinear GEMMs), k_norm
  (an nn.LayerNorm: Inductor generates it), RoPE of the index q/k, FP8 quantization of the
  index q (per_token_group_quant_fp8), then inside the op `indexer_k_quant_and_cache_kernel`
  (csrc/cache_kernels.cu), DeepGEMM's `fp8_paged_mqa_logits` and the top-2048 kernel
  `topKPerRowDecode` (csrc/sampler.cu; ops.top_k_per_row_decode). The paged MQA logits
  schedule is computed once per step by the indexer's metadata builder
  (vllm/v1/attention/backends/mla/indexer.py: get_paged_mqa_logits_metadata), before the
  graph is launched: an eager kernel.
* MoE: Triton fused MoE, no all-to-all. With data parallel 1 the MoE layer runs no
  all-to-all kernels at all (vllm/model_executor/layers/fused_moe/config.py,
  FusedMoEParallelConfig.use_all2all_kernels: `use_ep and dp_size > 1` (or PCP / sequence
  parallel)): every rank holds all tokens after the attention all-reduce, computes its 32
  local experts through the expert map, and the FFN output is summed by a second all-reduce
  (DeepseekV2MoE.forward: tensor_model_parallel_all_reduce when tp_size > 1). DeepEP is the
  DP-attention setup (`--data-parallel-size 8 --all2all-backend deepep_low_latency`), not this
  one. The expert GEMMs are Triton's `fused_moe_kernel`, not DeepGEMM: the block-FP8 experts
  take DeepGEMM only when M reaches the contiguous layout's alignment of 128 rows
  (fused_moe.py / deep_gemm_moe.py, _valid_deep_gemm: `M < align` falls back), and a decode
  batch of 32 does not. Around them: `moe_align_block_size_kernel` and
  `count_and_sort_expert_tokens_kernel` (csrc/moe/moe_align_sum_kernels.cu; the small-batch
  variant needs at most 64 experts, GLM has 256), the activation quantization before each
  GEMM, SiLU-and-mul, and `moe_sum_kernel` over the top-8 rows. Routing:
  `grouped_topk_fused_kernel` (csrc/moe/grouped_topk_kernels.cu, the noaux_tc grouped top-k
  with the correction bias). The shared expert is an ordinary TP-sharded MLP (FP8 linears on
  DeepGEMM). The routed and shared outputs are merged (`shared + routed * scale`) in the
  compiled graph: one Inductor pointwise kernel.
* Dense FP8 linears: DeepGEMM `fp8_gemm_nt` after per_token_group_quant_fp8 (vLLM's
  W8A8BlockFp8LinearOp on SM90 with VLLM_USE_DEEP_GEMM; upstream DeepGEMM, layout 2025-07).
* torch.compile fusions (vllm/compilation/passes/fusion/rms_quant_fusion.py): an RMSNorm whose
  output feeds an FP8 block-quantized linear becomes one CUDA kernel,
  `rms_norm_per_block_quant_kernel` (csrc/.../fused_layernorm_dynamic_per_token_quant.cu),
  with or without the residual add. tests/compile/fusions_e2e/models.py states how many such
  fusions a MoE model gets: `rms_quant_fusion=n_layers` for Qwen3-30B-A3B-FP8, because "MoEs
  also only expose 1 rms+quant fusion because the quant for up_proj is hidden" (the FFN's
  quantization happens inside the MoE custom op). Here: the input norm of every layer (with
  qkv_a's quant) fuses, the post-attention norm of a MoE layer does not (a plain
  `fused_add_rms_norm_kernel`, the name of real-kernel-names.tsv's vLLM row and of the B200
  trace), the post-attention norm of the 3 dense layers fuses (their gate_up is a visible FP8
  linear), and q_a_layernorm fuses with the quant of q_b_proj's (and the indexer wq_b's) input;
  kv_a_layernorm feeds no FP8 linear and stays `rms_norm_kernel` (B200 trace). Per layer: 2
  fusions on a MoE layer, 3 on a dense one. A broken fusion (fault `broken_fusion`) puts back
  the unfused pair: `fused_add_rms_norm_kernel` (or `rms_norm_kernel`) + a
  `per_token_group_quant_8bit_kernel`, per fused site.
* All-reduce: PyTorch symmetric memory's `multimem_all_reduce_kernel` (vLLM's
  SymmMemCommunicator, vllm/distributed/device_communicators/symm_mem.py, taken first for
  small messages when VLLM_ALLREDUCE_USE_SYMM_MEM is on, its default). The real vLLM TP8 trace
  in /work/shared (B200, `AMD-AGI__TraceLens__b200_eager_trace`) runs it 73 times for 36
  layers: 2 per layer (attention and MoE) + 1 (the vocab-parallel embedding).
* Outside the layers: the vocab-parallel embedding (a masked lookup: Inductor's mask kernel,
  the ATen index_select and masked_fill, then an all-reduce: vllm/model_executor/layers/
  vocab_parallel_embedding.py; the mask kernel's name and the masked_fill are in the B200
  trace), the final norm in the graph; after the graph, eagerly, the gather of the sampled
  tokens' rows and the LM head (the real vLLM FULL-graph trace in shared/real_traces/kineto,
  `..._vllm_decode_full_graph_execution`, runs exactly these after its one graph launch: a
  `vectorized_gather_kernel` and the LM head GEMM), the logits all-gather (NCCL,
  real-kernel-names.tsv's vLLM row: LogitsProcessor gathers with all-gather on CUDA) and greedy
  sampling's argmax (TSV vLLM row).
* CUDA graphs (vllm/config/compilation.py): FULL decode is one graph over the whole forward;
  PIECEWISE splits the compiled graph at the splitting ops (`_attention_ops`, which include
  `vllm::unified_mla_attention_with_output` and `vllm::sparse_attn_indexer`) and runs those
  ops eagerly between the pieces: per layer the 6 kernels of the MLA attention op, and on
  each indexer layer the 3 of the indexer op. GLM-5.3: 78 + 21 = 99 eager regions, 100 graphs.

Per decode step at batch 32 (healthy):
  | | GLM-5.3 | DeepSeek-V3.2 |
  | attention 16 per layer | 1248 | 976 |
  | indexer 9 per indexer layer | 189 (21 layers) | 549 (61) |
  | MoE 17 per MoE layer | 1275 (75) | 986 (58) |
  | dense MLP 5 per dense layer | 15 | 15 |
  | outside, in the graph | 5 | 5 |
  | eager (metadata, row gather, LM head, logits all-gather, argmax) | 5 | 5 |
  | total | 2737 | 2536 |
PIECEWISE (GLM-5.3): 100 graph launches and 468 + 63 eager attention/indexer kernels per step
(535 eager launches with the 4 around the graphs, + the argmax).

Kernel names: the real name where /work/shared holds one (cited); else the name vLLM's (or
the library's) source gives the kernel, in nsys's demangler spelling (synth/names.py), with
template arguments as the launch would instantiate them.
"""

from __future__ import annotations

from nsys_ledger.synth.names import KernelName, bool_, enum, int_, plain, type_, uint
from nsys_ledger.synth.schedule import (
    ARGMAX,
    DP_GATHER,
    DRV_LAUNCH_EX,
    EMBEDDING,
    MLA_COMBINE,
    RT_LAUNCH,
    SPARSE_MLA_DECODE,
    KernelSpec,
    KernelType,
    Schedule,
    _Builder,
    topology_kernels,
)
from nsys_ledger.synth.topologies import Topology

_BF16 = type_("c10::BFloat16")
_NV_BF16 = type_("__nv_bfloat16")
_FP8 = type_("c10::Float8_e4m3fn")
_FP8_DS_MLA = enum("vllm::Fp8KVCacheDataType", 1)  # kFp8E4M3


def _k(qualname: str, args: tuple | None, params: str | None):
    return KernelName(qualname, args, params)


def _rms_block_quant(key: str, residual: bool) -> KernelType:
    # csrc/.../fused_layernorm_dynamic_per_token_quant.cu: template <scalar_t, scalar_out_t,
    # has_residual, is_scale_transposed, group_size>; DeepGEMM wants column-major (transposed)
    # scales, the group is 128
    return KernelType(key, _k("vllm::rms_norm_per_block_quant_kernel",
                              (_BF16, _FP8, bool_(residual), bool_(True), int_(128)),
                              "T2 *, float *, const T1 *, const T1 *, const float *, float, int, T1 *"),
                      "rms_norm_per_block_quant_kernel", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 40)


VLLM_KERNELS: dict[str, KernelType] = {kt.key: kt for kt in (
    # ---- norms ----
    _rms_block_quant("vllm_rms_norm_block_quant_residual", True),
    _rms_block_quant("vllm_rms_norm_block_quant", False),
    # real: real-kernel-names.tsv vLLM row fused_add_rmsnorm (c++filt spelling there)
    KernelType("vllm_fused_add_rms_norm",
               _k("vllm::fused_add_rms_norm_kernel", (_BF16, int_(8)),
                  "T1 *, T1 *, const T1 *, float, int, int"),
               "fused_add_rms_norm_kernel", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 32),
    # real: the B200 trace's `vllm::rms_norm_kernel<c10::BFloat16, 8, 2>(...)`
    KernelType("vllm_rms_norm",
               _k("vllm::rms_norm_kernel", (_BF16, int_(8), int_(2)),
                  "T1 *, const T1 *, long, long, long, long, long, const T1 *, float, int, int"),
               "rms_norm_kernel", RT_LAUNCH, (32, 1, 1), (512, 1, 1), 32),
    # Inductor's kernel for the indexer's nn.LayerNorm (Inductor names a kernel after the aten
    # ops it fuses: triton_{per,red,poi}_fused_<ops>_<n>)
    KernelType("vllm_inductor_layer_norm", plain("triton_per_fused_native_layer_norm_1"),
               "triton_per_fused_native_layer_norm_1", DRV_LAUNCH_EX, (32, 1, 1), (64, 1, 1), 24),
    # ---- quantization: csrc per_token_group_quant.cu, the kernel SGLang's row of the TSV also
    # names (per_token_group_quant_8bit_kernel), with torch's element types
    KernelType("vllm_group_quant",
               _k("per_token_group_quant_8bit_kernel",
                  (_BF16, _FP8, bool_(True), bool_(False), type_("float")),
                  "const T1 *, void *, T5 *, int, int, int, float, float, float, int, int"),
               "per_token_group_quant_8bit_kernel", RT_LAUNCH, (96, 1, 1), (256, 1, 1), 30),
    # ---- attention ----
    # real: the B200 trace's `vllm::rotary_embedding_kernel<c10::BFloat16, true>`; DeepSeek's
    # rotary is not neox-style (is_neox_style=False in deepseek_v2.py), so the bool is 0
    KernelType("vllm_rotary",
               _k("vllm::rotary_embedding_kernel", (_BF16, bool_(False)),
                  "const long *, T1 *, T1 *, const T1 *, int, long, long, long, int, int, int"),
               "rotary_embedding_kernel", RT_LAUNCH, (32, 1, 1), (256, 1, 1), 32),
    KernelType("vllm_concat_and_cache_ds_mla",
               _k("vllm::concat_and_cache_ds_mla_kernel", (_NV_BF16, type_("unsigned char"), _FP8_DS_MLA),
                  "const T1 *, const T1 *, T2 *, const long *, int, int, int, int, int"),
               "concat_and_cache_ds_mla_kernel", RT_LAUNCH, (32, 1, 1), (96, 1, 1), 32),
    KernelType("vllm_convert_req_index",
               plain("_convert_req_index_to_global_index_kernel"),
               "_convert_req_index_to_global_index_kernel", DRV_LAUNCH_EX, (32, 16, 1), (128, 1, 1), 26),
    # ---- indexer ----
    KernelType("vllm_indexer_k_quant_and_cache",
               _k("vllm::indexer_k_quant_and_cache_kernel", (_NV_BF16, type_("unsigned char"), _FP8_DS_MLA),
                  "const T1 *, T2 *, const long *, int, int, int, int, bool"),
               "indexer_k_quant_and_cache_kernel", RT_LAUNCH, (32, 1, 1), (128, 1, 1), 32),
    KernelType("vllm_topk_per_row_decode",
               _k("vllm::topKPerRowDecode", (int_(512),),
                  "const float *, const int *, int *, int, int, int"),
               "topKPerRowDecode", RT_LAUNCH, (32, 1, 1), (512, 1, 1), 64, 0, 33_024),
    # DeepGEMM's scheduling metadata of fp8_paged_mqa_logits, once per step (eager)
    KernelType("vllm_paged_mqa_logits_metadata",
               _k("deep_gemm::smxx_paged_mqa_logits_metadata", (uint(64), uint(132)),
                  "unsigned int, unsigned int, const unsigned int *, unsigned int *"),
               "smxx_paged_mqa_logits_metadata", DRV_LAUNCH_EX, (1, 1, 1), (160, 1, 1), 32),
    # ---- MoE ----
    KernelType("vllm_grouped_topk",
               _k("vllm::moe::grouped_topk_fused_kernel",
                  (type_("float"), type_("float"), type_("int"), enum("vllm::moe::ScoringFunc", 1)),
                  "T1 *, float *, T3 *, const T2 *, long, long, long, long, long, bool, double"),
               "grouped_topk_fused_kernel", RT_LAUNCH, (32, 1, 1), (256, 1, 1), 48),
    KernelType("vllm_moe_align",
               _k("vllm::moe::moe_align_block_size_kernel", (type_("int"),),
                  "const T1 *, int *, int *, int *, int, int, int, int, unsigned long, int *"),
               "moe_align_block_size_kernel", RT_LAUNCH, (2, 1, 1), (1024, 1, 1), 40),
    KernelType("vllm_count_and_sort",
               _k("vllm::moe::count_and_sort_expert_tokens_kernel", (type_("int"),),
                  "const T1 *, int *, int *, unsigned long, int"),
               "count_and_sort_expert_tokens_kernel", RT_LAUNCH, (4, 1, 1), (256, 1, 1), 24),
    # Triton's fused MoE (vllm/model_executor/layers/fused_moe/fused_moe.py, fused_moe_kernel)
    KernelType("vllm_fused_moe_gate_up", plain("fused_moe_kernel"), "fused_moe_kernel",
               DRV_LAUNCH_EX, (96, 1, 1), (128, 1, 1), 168, 0, 98_304),
    KernelType("vllm_fused_moe_down", plain("fused_moe_kernel"), "fused_moe_kernel",
               DRV_LAUNCH_EX, (96, 1, 1), (128, 1, 1), 168, 0, 98_304),
    KernelType("vllm_act_and_mul",
               _k("vllm::act_and_mul_kernel",
                  (_BF16, type_("&vllm::silu_kernel<c10::BFloat16>"), bool_(True)),
                  "T1 *, const T1 *, int"),
               "act_and_mul_kernel", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 28),
    KernelType("vllm_moe_sum",
               _k("vllm::moe::moe_sum_kernel", (_BF16, int_(8)), "T1 *, const T1 *, int"),
               "moe_sum_kernel", RT_LAUNCH, (32, 1, 1), (1024, 1, 1), 24),
    # Inductor: `shared + routed * routed_scaling_factor` after the MoE custom op
    KernelType("vllm_inductor_moe_merge", plain("triton_poi_fused_add_mul_2"),
               "triton_poi_fused_add_mul_2", DRV_LAUNCH_EX, (96, 1, 1), (128, 1, 1), 20),
    # ---- all-reduce: real, the B200 trace (c++filt there: `(anonymous namespace)::`) ----
    KernelType("vllm_multimem_all_reduce",
               _k("<unnamed>::multimem_all_reduce_kernel", (_BF16, int_(16)),
                  "T1 *, unsigned long, unsigned int **, unsigned long, unsigned long"),
               "multimem_all_reduce_kernel", RT_LAUNCH, (8, 1, 1), (512, 1, 1), 40, collective=True),
    # ---- before the LM head: ATen's gather of the sampled tokens' rows; real, as nsys 2026.2
    # spells it in shared/real_traces (schedule.py's docstring), and after the graph replay in
    # the real vLLM FULL-graph trace (AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution)
    KernelType("vllm_logits_rows",
               _k("at::native::vectorized_gather_kernel", (int_(16), type_("long")),
                  "char *, char *, T2 *, int, long, long, long, long, bool"),
               "vectorized_gather_kernel", RT_LAUNCH, (32, 1, 1), (128, 1, 1), 24),
    # ---- the vocab-parallel embedding: real names, the B200 trace ----
    KernelType("vllm_embedding_mask",
               plain("triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0"),
               "triton_poi_fused_add_bitwise_and_bitwise_not_bitwise_or_ge_lt_mul_sub_0",
               DRV_LAUNCH_EX, (1, 1, 1), (128, 1, 1), 16),
    KernelType("vllm_embedding_masked_fill",
               _k("at::native::elementwise_kernel",
                  (int_(128), int_(4), type_(
                      "void at::native::gpu_kernel_impl_nocast<at::native::<unnamed>::masked_fill_kernel("
                      "at::TensorIterator &, const c10::Scalar &)::[lambda() (instance 1)]::operator ()() const::"
                      "[lambda() (instance 7)]::operator ()() const::[lambda(c10::BFloat16, bool) (instance 1)]>("
                      "at::TensorIteratorBase &, const T1 &)::[lambda(int) (instance 1)]")),
                  "int, T3"),
               "elementwise_kernel", RT_LAUNCH, (96, 1, 1), (128, 1, 1), 20),
)}

# The DeepGEMM layout vLLM's kernels are named in: upstream DeepGEMM (vLLM installs it from
# the DeepGEMM repository, tools/install_deepgemm.sh), not SGLang's fork
VLLM_DEEPGEMM_LAYOUT = "2025-07"


def _attention(b: _Builder, K: dict, V: dict, topo: Topology, L: int, p: str) -> None:  # noqa: N803
    """vLLM's DeepseekV2MLAAttention through the MultiHeadLatentAttentionWrapper, one layer."""
    a = f"{p}.self_attn"
    piecewise = topo.piecewise
    if L == 0:  # no residual yet
        b.add("input_norm", V["vllm_rms_norm_block_quant"], "input_norm", "attention",
              f"{p}.input_layernorm", L, role="residual_norm")
    else:
        b.add("input_norm", V["vllm_rms_norm_block_quant_residual"], "input_norm", "attention",
              f"{p}.input_layernorm", L, role="residual_norm")
    b.add("qkv_a", K["gemm_qkv_a"], "qkv_a_proj", "attention", f"{a}.fused_qkv_a_proj", L,
          role="qkv_a_proj")
    b.add("q_a_norm", V["vllm_rms_norm_block_quant"], "q_a_norm", "attention", f"{a}.q_a_layernorm",
          L, role="latent_norm")
    b.add("kv_a_norm", V["vllm_rms_norm"], "kv_a_norm", "attention", f"{a}.kv_a_layernorm", L,
          role="latent_norm")
    b.add("q_b", K["gemm_q_b"], "q_b_proj", "attention", f"{a}.q_b_proj", L, role="q_b_proj")
    if L in topo.full_indexer_layers:
        ix = f"{a}.indexer"
        b.add("ix_wq_b", K["gemm_indexer_wq_b"], "indexer.wq_b", "indexer", f"{ix}.wq_b", L,
              role="indexer_proj")
        b.add("ix_wk", K["gemm_indexer_wk_weights"], "indexer.wk", "indexer", f"{ix}.wk", L,
              role="indexer_proj")
        b.add("ix_k_norm", V["vllm_inductor_layer_norm"], "indexer.k_norm", "indexer",
              f"{ix}.k_norm", L, role="indexer_norm")
        b.add("ix_weights", K["gemm_indexer_wk_weights"], "indexer.weights_proj", "indexer",
              f"{ix}.weights_proj", L, role="indexer_proj")
        b.add("ix_rope", V["vllm_rotary"], "indexer.rope", "indexer", f"{ix}.rotary_emb", L,
              role="rope")
        b.add("ix_q_quant", V["vllm_group_quant"], "indexer.q_quant", "indexer", ix, L,
              role="indexer_quant")
        # the sparse_attn_indexer custom op: eager between two pieces in PIECEWISE mode
        b.add("ix_k_cache", V["vllm_indexer_k_quant_and_cache"], "indexer.k_cache", "indexer",
              ix, L, role="indexer_cache", eager=piecewise)
        b.add("ix_logits", K["paged_mqa_logits"], "indexer.logits", "indexer", ix, L,
              role="indexer_logits", eager=piecewise)
        b.add("ix_topk", V["vllm_topk_per_row_decode"], "indexer.topk", "indexer", ix, L,
              role="indexer_topk", eager=piecewise)
    b.add("rope", V["vllm_rotary"], "rope", "attention", f"{a}.rotary_emb", L, role="rope")
    # the unified MLA attention custom op: eager in PIECEWISE mode
    mla = f"{a}.mla_attn"
    b.add("kv_write", V["vllm_concat_and_cache_ds_mla"], "kv_write", "attention", mla, L,
          role="kv_write", eager=piecewise)
    b.add("q_absorb", K["bmm_q_absorb"], "q_absorb", "attention", mla, L, role="mla_absorb",
          eager=piecewise)
    b.add("page_table", V["vllm_convert_req_index"], "page_table", "attention", mla, L,
          role="page_table", eager=piecewise)
    b.add("sparse_mla", SPARSE_MLA_DECODE, "sparse_mla", "attention", mla, L, role="attention",
          eager=piecewise)
    b.add("mla_combine", MLA_COMBINE, "sparse_mla.combine", "attention", mla, L,
          role="attention_combine", eager=piecewise)
    b.add("o_absorb", K["bmm_o_absorb"], "o_absorb", "attention", mla, L, role="mla_absorb",
          eager=piecewise)
    b.add("o_quant", V["vllm_group_quant"], "o_proj.quant", "attention", f"{a}.o_proj", L,
          role="attn_quant")
    b.add("o_proj", K["gemm_o_proj"], "o_proj", "attention", f"{a}.o_proj", L, role="o_proj")
    b.add("allreduce", V["vllm_multimem_all_reduce"], "attn_allreduce", "attention",
          f"{a}.o_proj", L, role="allreduce")


def _ffn(b: _Builder, K: dict, V: dict, topo: Topology, L: int, p: str) -> None:  # noqa: N803
    """The post-attention norm and the FFN: a dense MLP (layers 0-2) or DeepseekV2MoE."""
    m = f"{p}.mlp"
    if L in topo.dense_layers:
        # its gate_up is a visible FP8 linear: the norm fuses with its quantization
        b.add("post_norm", V["vllm_rms_norm_block_quant_residual"], "post_attn_norm", "attention",
              f"{p}.post_attention_layernorm", L, role="residual_norm")
        _gated_mlp(b, V, L, "mlp_", "mlp.", "dense_mlp", (f"{m}.gate_up_proj", f"{m}.act_fn", f"{m}.down_proj"),
                   K["gemm_dense_gate_up"], K["gemm_dense_down"], "ffn_dense_gemm")
        b.add("mlp_allreduce", V["vllm_multimem_all_reduce"], "mlp_allreduce", "dense_mlp",
              f"{m}.down_proj", L, role="allreduce")
        return
    # MoE: the norm's quantization is inside the MoE op, so the norm stays unfused
    b.add("post_norm", V["vllm_fused_add_rms_norm"], "post_attn_norm", "attention",
          f"{p}.post_attention_layernorm", L, role="residual_norm")
    b.add("router", K["gemm_router"], "moe.router", "moe", f"{m}.gate", L, role="router")
    b.add("topk", V["vllm_grouped_topk"], "moe.topk", "moe", f"{m}.experts", L, role="moe_topk")
    se = f"{m}.shared_experts"
    b.add("shared_quant", V["vllm_group_quant"], "moe.shared_quant", "moe", f"{se}.gate_up_proj",
          L, role="ffn_quant")
    _gated_mlp(b, V, L, "shared_", "moe.shared_", "moe", (f"{se}.gate_up_proj", f"{se}.act_fn", f"{se}.down_proj"),
               K["gemm_shared_gate_up"], K["gemm_shared_down"], "ffn_dense_gemm")
    e = f"{m}.experts"
    b.add("align", V["vllm_moe_align"], "moe.align", "moe", e, L, role="moe_dispatch")
    b.add("sort", V["vllm_count_and_sort"], "moe.sort", "moe", e, L, role="moe_dispatch")
    b.add("quant", V["vllm_group_quant"], "moe.quant", "moe", e, L, role="ffn_quant")
    _gated_mlp(b, V, L, "", "moe.", "moe", (e, e, e), V["vllm_fused_moe_gate_up"], V["vllm_fused_moe_down"],
               "moe_gemm")
    b.add("moe_sum", V["vllm_moe_sum"], "moe.sum", "moe", e, L, role="moe_combine")
    b.add("merge", V["vllm_inductor_moe_merge"], "moe.scale_shared_add", "moe", m, L,
          role="moe_sum")
    b.add("moe_allreduce", V["vllm_multimem_all_reduce"], "moe_allreduce", "moe", m, L,
          role="allreduce")


def _gated_mlp(b: _Builder, V: dict, L: int, key: str, op: str, group: str,  # noqa: N803
               modules: tuple[str, str, str], gate_up, down, gemm_role: str) -> None:
    """The four launches every gated MLP of the model makes after its input is quantized (the
    dense MLP, the shared expert, the routed experts): the gate_up GEMM, SiluAndMul, the FP8
    group quantization of the down projection's input, the down GEMM. `modules` are the
    gate_up, act and down modules' names; `key` and `op` prefix the launch keys and op names."""
    gate_up_module, act_module, down_module = modules
    b.add(f"{key}gate_up", gate_up, f"{op}gate_up", group, gate_up_module, L, role=gemm_role)
    b.add(f"{key}act", V["vllm_act_and_mul"], f"{op}act", group, act_module, L, role="ffn_act")
    b.add(f"{key}down_quant", V["vllm_group_quant"], f"{op}down_quant", group, down_module, L, role="ffn_quant")
    b.add(f"{key}down", down, f"{op}down", group, down_module, L, role=gemm_role)


def _unfuse_norms(specs: list[KernelSpec], V: dict, cost) -> list[KernelSpec]:  # noqa: N803
    """Fault `broken_fusion`: every fused RMSNorm + quant becomes the unfused norm followed by
    its own group quantization (the fusion pass did not match: a pattern change, a custom-op
    setting, or `-cc.pass_config.fuse_norm_quant=false`)."""
    out = []
    for k in specs:
        if k.kernel.key.startswith("vllm_rms_norm_block_quant"):
            residual = k.kernel.key.endswith("_residual")
            norm = V["vllm_fused_add_rms_norm"] if residual else V["vllm_rms_norm"]
            out.append(KernelSpec(norm, k.op, k.group, k.module, k.layer, k.stream, cost(norm),
                                  role=k.role, eager=k.eager))
            quant = V["vllm_group_quant"]
            out.append(KernelSpec(quant, "broken_fusion.quant", "fault", k.module, k.layer,
                                  k.stream, cost(quant), role="ffn_quant", eager=k.eager))
        else:
            out.append(k)
    return out


def build_vllm_pass(kind: str, batch: int, faults: frozenset[str], topo: Topology,
                    deepgemm_layout: str) -> Schedule:
    """One vLLM forward pass of `topo` with its eager launches around (and, PIECEWISE, inside)
    the CUDA graphs, plus the eager argmax that samples the next token."""
    # no alt streams: these launches all go to the forward's stream; the SGLang-only faults
    # (broken_fusion's hook on SGLang's norm) are handled here
    b = _Builder(kind, batch, frozenset(), False)
    K = topology_kernels(topo.name, deepgemm_layout)  # noqa: N806 - DeepGEMM, cuBLAS, FlashMLA
    V = VLLM_KERNELS  # noqa: N806
    decode = kind == "decode"
    # the indexer metadata builder, before the graph launch (eager)
    b.add("ix_metadata", V["vllm_paged_mqa_logits_metadata"], "indexer.metadata", "outside", "",
          None, role="step_metadata", eager=True)
    b.add("embed_mask", V["vllm_embedding_mask"], "embedding", "outside", "model.embed_tokens",
          None, role="embedding")
    b.add("embed", EMBEDDING, "embedding", "outside", "model.embed_tokens", None, role="embedding")
    b.add("embed_fill", V["vllm_embedding_masked_fill"], "embedding", "outside",
          "model.embed_tokens", None, role="embedding")
    b.add("embed_allreduce", V["vllm_multimem_all_reduce"], "embed_allreduce", "outside",
          "model.embed_tokens", None, role="allreduce")
    for L in range(topo.num_layers):  # noqa: N806
        p = f"model.layers.{L}"
        _attention(b, K, V, topo, L, p)
        _ffn(b, K, V, topo, L, p)
    b.add("final_norm", V["vllm_fused_add_rms_norm"], "final_norm", "outside", "model.norm", None,
          role="residual_norm")
    # compute_logits runs outside the model's graph (gpu_model_runner: the graph holds the
    # model forward only): the rows of the sampled tokens are gathered (`hidden_states[
    # logits_indices]`), then the LM head and the logits all-gather run, all eagerly
    b.add("logits_rows", V["vllm_logits_rows"], "lm_head.rows", "outside", "lm_head", None,
          role="lm_head", eager=True)
    b.add("lm_head", K["gemm_lm_head"], "lm_head", "outside", "lm_head", None, role="lm_head",
          eager=True)
    b.add("logits_gather", DP_GATHER, "logits_gather", "outside", "logits_processor", None,
          role="logits_gather", eager=True)
    specs = b.specs
    if "broken_fusion" in faults:
        specs = _unfuse_norms(specs, V, b.cost)
    sampling = KernelSpec(ARGMAX, "sampling", "outside", "", None, "main", b.cost(ARGMAX),
                          role="sampling", eager=True)
    tokens = batch if decode else batch * 512
    return Schedule(kind, batch, tokens, tuple(specs), sampling, faults & VLLM_FAULTS,
                    num_layers=topo.num_layers, topology=topo.name)


VLLM_FAULTS = frozenset({"broken_fusion"})
