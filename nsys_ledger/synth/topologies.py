"""The deployments the generator can simulate: model facts and parallel layout, as data.

Each `Topology` is the generator's own statement of one SGLang deployment, written from the
seed article (shared/seed/000_064538f63a4364f6.txt), shared/reference/glm-decode-ledger.md and
the public model configs cited at each number, never from the expectation files (see
ARCHITECTURE.md: the generator and the ledger are two independent statements of the seed).

| topology | what changes against the reference GLM-5.3 TP8 + EP8 schedule |
|---|---|
| `glm-5.3-tp8-ep8` | nothing: the reference schedule (2002 kernels per step) |
| `glm-5.3-dp8-ep8` | `--attn-dp-size 8`: attention at full heads (attn_tp 1), no attention AllReduce, an AllGather before and a ReduceScatter after every layer's FFN |
| `glm-5.3-tp8-ep8-mtp` | MTP on: each step replays draft, verify and draft_extend graphs |
| `deepseek-v3.2-tp8-ep8` | the same DeepseekV2 layers at DeepSeek-V3.2's shapes: 61 layers, hidden 7168, the indexer on every layer |
| `glm-5.3-vllm-tp8-ep8` | vLLM V1 instead of SGLang (synth/vllm.py): its kernels, FULL CUDA graph for decode, Triton fused MoE without all-to-all, a second all-reduce after every FFN |
| `glm-5.3-vllm-tp8-ep8-piecewise` | the same under `cudagraph_mode=PIECEWISE`: one graph per piece, the MLA attention and the indexer's custom ops eager between them |
| `deepseek-v3.2-vllm-tp8-ep8` | vLLM V1 serving DeepSeek-V3.2 (61 layers, the indexer on all), FULL CUDA graph |

Per-rank GEMM shapes follow from the config and the attention TP size (the number of query
heads a rank holds: num_attention_heads / attn_tp):

* q_b_proj   N = local heads x (qk_nope_head_dim + qk_rope_head_dim), K = q_lora_rank
* o_proj     N = hidden, K = local heads x v_head_dim
* query absorption (per head) qk_nope_head_dim -> kv_lora_rank, output absorption
  kv_lora_rank -> v_head_dim: one batched GEMM over the local heads each
* qkv_a      N = q_lora_rank + kv_lora_rank + qk_rope_head_dim, K = hidden (replicated)
* indexer wq_b N = index_n_heads x index_head_dim, K = q_lora_rank (replicated, the seed: "索引器
  能复制权重复用")
* MoE (EP8): 256 / 8 = 32 local experts, gate_up N = 2 x moe_intermediate_size, K = hidden;
  down N = hidden, K = moe_intermediate_size; the shared expert is replicated under DeepEP
  (SGLang python/sglang/srt/models/deepseek_v2.py, DeepseekV2MoE.__init__: `tp_rank=0,
  tp_size=1` when the MoE all-to-all backend is DeepEP): gate_up N = 2 x 2048, K = hidden;
  down N = hidden, K = 2048 (o_proj's shape at TP8)
* dense MLP (TP8): gate_up N = 2 x intermediate_size / 8, down K = intermediate_size / 8
"""

from __future__ import annotations

from dataclasses import dataclass

from nsys_ledger.synth.deepgemm import GEMM_CONTIGUOUS, GEMM_MASKED, GLM_GEMMS, GlmGemm

GLM_TP8 = "glm-5.3-tp8-ep8"
GLM_DP8 = "glm-5.3-dp8-ep8"
GLM_TP8_MTP = "glm-5.3-tp8-ep8-mtp"
DEEPSEEK_V32_TP8 = "deepseek-v3.2-tp8-ep8"


@dataclass(frozen=True)
class Topology:
    """One model at one parallel layout, as the generator needs it."""

    name: str
    model: str  # for the description line
    num_layers: int
    dense_layers: tuple[int, ...]
    full_indexer_layers: tuple[int, ...]  # layers that run the DSA indexer
    hidden: int
    heads: int  # num_attention_heads
    attn_tp: int  # attention tensor parallel size: 8 (TP8) or 1 (DP attention)
    q_lora_rank: int
    qk_nope_head_dim: int
    v_head_dim: int
    index_heads: int  # index_n_heads
    vocab: int
    intermediate: int  # dense MLP intermediate_size
    gemms: tuple[GlmGemm, ...]  # the DeepGEMM GEMMs of one rank
    dp_attention: bool = False  # --attn-dp-size 8: gather before / reduce-scatter after each FFN
    mtp: bool = False  # speculative decoding with the model's MTP layer (EAGLE worker)
    ep: int = 8
    tp: int = 8
    # the serving engine whose launches the generator writes: "sglang" (schedule.py) or "vllm"
    # (synth/vllm.py: its kernels, its step annotation, no SGLang layer-wise markers)
    framework: str = "sglang"
    # vLLM's CUDA-graph mode for decode: FULL (one graph) or PIECEWISE (one graph per piece
    # between the attention custom ops, which run eagerly)
    piecewise: bool = False

    @property
    def local_heads(self) -> int:
        return self.heads // self.attn_tp

    @property
    def moe_layers(self) -> tuple[int, ...]:
        return tuple(layer for layer in range(self.num_layers) if layer not in self.dense_layers)


# ---- GLM-5.3 (shared/reference/glm-decode-ledger.md "Model facts"; GLM-5 keeps the shape) ----
# 78 layers, 0-2 dense; hidden 6144; 64 heads; q_lora 2048, kv_lora 512, rope 64;
# qk_nope_head_dim 192 and v_head_dim 256 (16384 = 64 x 256 is the doc's q_b_proj width and
# o_proj input); indexer 32 heads x 128; full indexer layers 0, 1, 2, 6, 10, ..., 74.
_GLM_FULL_INDEXER = (0, 1, 2) + tuple(range(6, 75, 4))
_GLM = dict(model="GLM-5.3", num_layers=78, dense_layers=(0, 1, 2),
            full_indexer_layers=_GLM_FULL_INDEXER, hidden=6144, heads=64, q_lora_rank=2048,
            qk_nope_head_dim=192, v_head_dim=256, index_heads=32, vocab=154880,
            intermediate=12288)


def _with_shapes(base: tuple[GlmGemm, ...], **shapes: tuple[int, int, int]) -> tuple[GlmGemm, ...]:
    """`base` with the GEMMs named in `shapes` (key=(n, k, block_n)) replaced."""
    out = []
    for g in base:
        if g.key in shapes:
            n, k, block_n = shapes[g.key]
            g = GlmGemm(g.key, n, k, g.groups, g.gemm_type, block_n=block_n)
        out.append(g)
    return tuple(out)


# DP attention: attn_tp 1, all 64 heads on every rank, so q_b_proj is 64 x 256 = 16384 wide and
# o_proj reads 64 x 256 = 16384 (the TP8 shapes were 2048 and 2048). The FFN keeps TP8 / EP8
# over the gathered batch, so its GEMMs keep their TP8 shapes.
_GLM_DP8_GEMMS = _with_shapes(GLM_GEMMS, gemm_q_b=(16384, 2048, 128), gemm_o_proj=(6144, 16384, 96))

# ---- DeepSeek-V3.2 -------------------------------------------------------------------------
# From the public config of deepseek-ai/DeepSeek-V3.2-Exp (config.json, as copied by public
# code found with the `search` tool: e.g. a `deepseek_v32_config()` test fixture and a
# `DSA_MODEL_DIMS["DeepseekV32ForCausalLM"]` table): hidden_size 7168, q_lora_rank 1536,
# kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128,
# num_attention_heads 128, n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
# moe_intermediate_size 2048, intermediate_size 18432, first_k_dense_replace 3, n_group 8,
# topk_group 4, index_n_heads 64, index_head_dim 128, index_topk 2048, vocab_size 129280.
# num_hidden_layers 61: DeepSeek-V3's config.json (V3.2-Exp "builds upon V3.1-Terminus", README
# of deepseek-ai/DeepSeek-V3.2-Exp, and keeps its layer stack).
# Indexer layout: every layer. The reference inference code (deepseek-ai/DeepSeek-V3.2-Exp,
# inference/model.py) builds `Block(layer_id, args)` with an `MLA` for every layer and MLA.forward
# calls `self.indexer(...)` on every call: there are no "shared" layers as in GLM-5.
# Per rank at TP8: 16 heads; q_b_proj N = 16 x 192 = 3072, K = 1536; o_proj N = 7168,
# K = 16 x 128 = 2048; qkv_a N = 1536 + 512 + 64 = 2112 (real-kernel-names.md: "DeepSeek-V3
# qkv_a is N=2112, K=7168"); indexer wq_b N = 64 x 128 = 8192, K = 1536; dense MLP
# gate_up N = 2 x 18432 / 8 = 4608, down K = 2304; MoE gate_up N = 4096, K = 7168 and down
# N = 7168, K = 2048 (TSV rows of the DeepSeek-V3 masked grouped GEMMs show exactly these).
_DSV32_GEMMS: tuple[GlmGemm, ...] = (
    GlmGemm("gemm_qkv_a", 2112, 7168, block_n=48),
    GlmGemm("gemm_q_b", 3072, 1536, block_n=32),
    GlmGemm("gemm_o_proj", 7168, 2048, block_n=112),
    GlmGemm("gemm_indexer_wq_b", 8192, 1536, block_n=64),
    # shared expert replicated under DeepEP (see the module docstring): 2 x 2048 over 7168, and
    # a down of 7168 x 2048, o_proj's shape here too
    GlmGemm("gemm_shared_gate_up", 4096, 7168, block_n=64),
    GlmGemm("gemm_shared_down", 7168, 2048, block_n=112),
    GlmGemm("gemm_dense_gate_up", 4608, 7168, block_n=48),
    GlmGemm("gemm_dense_down", 7168, 2304, block_n=112),
    GlmGemm("gemm_moe_gate_up_masked", 4096, 7168, 32, GEMM_MASKED, block_n=128),
    GlmGemm("gemm_moe_down_masked", 7168, 2048, 32, GEMM_MASKED, block_n=128),
    GlmGemm("gemm_moe_gate_up_contig", 4096, 7168, 32, GEMM_CONTIGUOUS, block_n=128),
    GlmGemm("gemm_moe_down_contig", 7168, 2048, 32, GEMM_CONTIGUOUS, block_n=128),
)

# ---- vLLM ------------------------------------------------------------------------------------
# The same two models as vLLM V1 serves them at TP8 + EP8 (`--tensor-parallel-size 8
# --enable-expert-parallel`, data parallel 1): see synth/vllm.py for the launches. What changes
# in the GEMM shapes: vLLM shards the shared expert over the TP group like any MLP
# (vllm/model_executor/models/deepseek_v2.py, DeepseekV2MoE: the shared experts are a
# DeepseekV2MLP with `reduce_results=False`, tensor parallel; there is no DeepEP tp_size=1 rule
# here because DP is 1 and no all-to-all backend runs), so its gate_up is 2 x 2048 / 8 = 512 wide
# over the hidden size and its down reads 2048 / 8 = 256.
GLM_VLLM = "glm-5.3-vllm-tp8-ep8"
GLM_VLLM_PIECEWISE = "glm-5.3-vllm-tp8-ep8-piecewise"
DEEPSEEK_V32_VLLM = "deepseek-v3.2-vllm-tp8-ep8"
_GLM_VLLM_GEMMS = _with_shapes(GLM_GEMMS, gemm_shared_gate_up=(512, 6144, 32),
                               gemm_shared_down=(6144, 256, 96))
_DSV32_VLLM_GEMMS = _with_shapes(_DSV32_GEMMS, gemm_shared_gate_up=(512, 7168, 32),
                                 gemm_shared_down=(7168, 256, 112))
_DSV32 = dict(model="DeepSeek-V3.2", num_layers=61, dense_layers=(0, 1, 2),
              full_indexer_layers=tuple(range(61)), hidden=7168, heads=128, q_lora_rank=1536,
              qk_nope_head_dim=128, v_head_dim=128, index_heads=64, vocab=129280,
              intermediate=18432)

TOPOLOGIES: dict[str, Topology] = {
    GLM_TP8: Topology(GLM_TP8, attn_tp=8, gemms=GLM_GEMMS, **_GLM),
    GLM_DP8: Topology(GLM_DP8, attn_tp=1, gemms=_GLM_DP8_GEMMS, dp_attention=True, **_GLM),
    GLM_TP8_MTP: Topology(GLM_TP8_MTP, attn_tp=8, gemms=GLM_GEMMS, mtp=True, **_GLM),
    DEEPSEEK_V32_TP8: Topology(
        DEEPSEEK_V32_TP8, model="DeepSeek-V3.2", num_layers=61, dense_layers=(0, 1, 2),
        full_indexer_layers=tuple(range(61)), hidden=7168, heads=128, attn_tp=8, q_lora_rank=1536,
        qk_nope_head_dim=128, v_head_dim=128, index_heads=64, vocab=129280, intermediate=18432,
        gemms=_DSV32_GEMMS),
    GLM_VLLM: Topology(GLM_VLLM, attn_tp=8, gemms=_GLM_VLLM_GEMMS, framework="vllm", **_GLM),
    GLM_VLLM_PIECEWISE: Topology(GLM_VLLM_PIECEWISE, attn_tp=8, gemms=_GLM_VLLM_GEMMS,
                                 framework="vllm", piecewise=True, **_GLM),
    DEEPSEEK_V32_VLLM: Topology(DEEPSEEK_V32_VLLM, attn_tp=8, gemms=_DSV32_VLLM_GEMMS,
                                framework="vllm", **_DSV32),
}
DEFAULT_TOPOLOGY = GLM_TP8


def get_topology(name: str) -> Topology:
    """The topology called `name`, else ValueError naming the known ones."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology {name!r}; known: {', '.join(TOPOLOGIES)}") from None
