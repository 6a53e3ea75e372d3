"""The shared vocabulary of op roles: what an op does in the model, whichever framework runs it.

Two ledgers for different stacks name their ops after their own kernels (SGLang's
`fused_add_rmsnorm`, vLLM's Inductor `triton_red_fused_..._rms_norm`), so a comparison of two
captures cannot match ops by name. Every op of a ledger may carry `role = "..."` from this list,
and `compare` lines up two traces by role. The rows follow the seed article's per-layer tables
(shared/reference/glm-decode-ledger.md: the 14 attention rows, the indexer's 6-7 launches, the
MoE's 7-9) and its "outside the layers" list, in that order, so that tables sorted by role read
like the article.

A role describes the work, not the kernel: a framework that fuses two roles into one kernel
gives that kernel's op the first role of the pair (the one the article lists first), and the
second role then has no kernels there; `compare` shows both rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from nsys_ledger.ledger.model import Expectations


@dataclass(frozen=True)
class Role:
    name: str
    part: str  # where the article puts it: step, attention, indexer, ffn, comm, mtp, prefill, other
    description: str


def _roles(*rows: tuple[str, str, str]) -> dict[str, Role]:
    return {name: Role(name, part, description) for name, part, description in rows}


ROLES: dict[str, Role] = _roles(
    # outside the layers, once per step (doc "Per step, outside layers")
    ("embedding", "step", "token embedding lookup"),
    ("step_metadata", "step", "per-step scheduling metadata (DeepGEMM paged MQA logits metadata, attention plans)"),
    ("lm_head", "step", "LM head GEMM"),
    ("logits_gather", "step", "gather of the vocab-parallel logits"),
    ("sampling", "step", "sampling of the next token"),
    # attention, the article's 14 rows
    ("residual_norm", "attention", "rows 1 and 14: residual add + RMSNorm (input and post-attention norms)"),
    ("qkv_a_proj", "attention", "row 2: fused q_a / kv_a down-projection"),
    ("latent_norm", "attention", "rows 3-4: q_a_layernorm and kv_a_layernorm"),
    ("q_b_proj", "attention", "row 5: q_b up-projection"),
    ("rope", "attention", "row 6: rotary embedding of q_pe and k_pe"),
    ("attn_quant", "attention", "row 7: activation quantization inside attention (before the absorption GEMM)"),
    ("mla_absorb", "attention", "rows 7 and 11: query and output absorption (batched GEMM)"),
    ("kv_write", "attention", "row 8: KV-cache write (latent + rope part)"),
    ("page_table", "attention", "row 9: top-k indices to page table, when not fused into the top-k"),
    ("attention", "attention", "row 10: the decode attention kernel (sparse MLA)"),
    ("attention_combine", "attention", "row 10: split-KV combine after the attention kernel"),
    ("o_proj", "attention", "row 12: output projection"),
    ("allreduce", "comm", "row 13: tensor-parallel all-reduce (NCCL, custom, symmetric-memory or fused with the norm)"),
    # the DSA indexer, on the full layers
    ("indexer_proj", "indexer", "indexer projections (wq_b, wk, weights_proj)"),
    ("indexer_quant", "indexer", "FP8 quantization of the index key"),
    ("indexer_norm", "indexer", "LayerNorm of the index key"),
    ("indexer_cache", "indexer", "write of the index-key cache"),
    ("indexer_logits", "indexer", "paged MQA logits"),
    ("indexer_topk", "indexer", "top-k of the indexer logits (with or without the page-table transform)"),
    # the feed-forward part: router, experts, dense MLP
    ("router", "ffn", "router (gate) GEMM"),
    ("moe_topk", "ffn", "expert selection (grouped top-k, biased routing)"),
    ("ffn_quant", "ffn", "activation quantization before the FFN GEMMs"),
    ("moe_dispatch", "comm", "expert-parallel dispatch (DeepEP, all-to-all) or the local permutation"),
    ("moe_gemm", "ffn", "routed-expert grouped GEMMs"),
    ("ffn_act", "ffn", "SiLU-and-mul between the up and down GEMMs (dense, shared or routed)"),
    ("ffn_dense_gemm", "ffn", "dense GEMMs of the feed-forward part: the dense MLP layers and the shared experts"),
    ("moe_combine", "comm", "expert-parallel combine (DeepEP, all-to-all) or the local un-permutation"),
    ("moe_sum", "ffn", "weighted sum of the experts' outputs"),
    ("ep_other", "comm", "other expert-parallel communication kernels (layout, notify, barrier)"),
    ("dp_gather", "comm", "data-parallel attention: gather of the tokens before the MoE"),
    ("dp_scatter", "comm", "data-parallel attention: reduce-scatter after the MoE"),
    # speculative decoding
    ("mtp_draft", "mtp", "the draft model's (MTP / EAGLE) own kernels"),
    # never in a decode step
    ("prefill_attention", "prefill", "prefill (extend) attention"),
    # generic catch-alls
    ("gemm_other", "other", "a GEMM the ledger cannot place (generic cuBLAS/nvjet/CUTLASS fallback)"),
)


def role_names() -> tuple[str, ...]:
    return tuple(ROLES)


_ORDER = {name: i for i, name in enumerate(ROLES)}


def role_order(name: str | None) -> int:
    """Sort key: the article's order; ops without a role last."""
    return _ORDER.get(name, len(ROLES))


NO_ROLE = "(no role)"  # kernels of an op without a role, of no op, or of a trace checked without a ledger


def op_roles(expectations: Expectations | None) -> dict[str, str]:
    """`{op: role}` for the ops of a ledger (`ledger.model.Expectations`, or None) that carry one."""
    if expectations is None:
        return {}
    return {name: op.role for name, op in expectations.ops.items() if op.role}


def role_of(op_column: str, roles: dict[str, str]) -> pl.Expr:
    """The role of the op in `op_column`, NO_ROLE when it has none."""
    if not roles:
        return pl.lit(NO_ROLE)
    return pl.col(op_column).replace_strict(roles, default=None, return_dtype=pl.Utf8).fill_null(NO_ROLE)
