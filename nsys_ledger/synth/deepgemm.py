"""DeepGEMM kernel names in the layouts real builds launched (reference/real-kernel-names.md).

DeepGEMM puts the GEMM's shape into its template arguments, and the argument order changed
several times. A layout is one of those orders; `deepgemm_name(config, layout)` spells a GEMM
in it, and `GemmConfig` holds the values a real build would have chosen for GLM-5.3:

| layout | kernel | template arguments, in order | real rows (TSV) |
|---|---|---|---|
| `2025-02` | `deep_gemm::fp8_gemm_kernel` | N, K, BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_N padding, swizzle D, groups, stages, TMA threads, math threads, multicast, multicast on A, GemmType | 13, 14, 20-24, 30 |
| `2025-07` | `deep_gemm::sm90_fp8_gemm_1d2d_impl` | SHAPE_M (0: runtime), N, K, groups, BLOCK_M/N/K, swizzle A/B/D, stages, last stages, TMA threads, math threads, multicast, multicast on A, kNumSMs, GemmType, epilogue | none: the 2026 order without its first and last argument |
| `sglang-2026` | `deep_gemm::sm90_fp8_gemm_1d2d_impl` | `(cute::UMMA::Major)0`, then the 2025-07 order, then SGLang's trailing `(bool)` overlap flag | 3-7 |
| `b200` | `deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl` | two Major args, 128, 128, M, N, K (dense: `0, 0, 0`), BLOCK_M/N/K, groups, swizzles, stages, threads, multicast, ..., kNumSMs, ..., GemmType, ..., dtypes, epilogue | 64-69 |

GemmType: 0 normal (dense), 1 M-grouped contiguous (prefill MoE, DeepEP normal mode), 2
M-grouped masked (decode MoE under DeepEP low latency). The name's spelling (`2624u` or
`(unsigned int)2624`) is the writer's choice: see synth/names.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from nsys_ledger.synth.names import KernelName, bool_, enum, type_, uint

LAYOUT_2025_02 = "2025-02"
LAYOUT_2025_07 = "2025-07"
LAYOUT_SGLANG_2026 = "sglang-2026"
LAYOUT_B200 = "b200"
DEEPGEMM_LAYOUTS = (LAYOUT_2025_02, LAYOUT_2025_07, LAYOUT_SGLANG_2026, LAYOUT_B200)
DEFAULT_DEEPGEMM_LAYOUT = LAYOUT_SGLANG_2026  # what SGLang launches from January 2026

GEMM_NORMAL, GEMM_CONTIGUOUS, GEMM_MASKED = 0, 1, 2
_GEMM_TYPE = "deep_gemm::GemmType"
_MAJOR = "cute::UMMA::Major"
BLOCK_K = 128  # FP8 block scaling works on 128-wide K blocks in every layout
H200_SMS = 132
B200_SMS = 148
# shared memory a Hopper block may use (the 227 KB opt-in minus what the kernel keeps for
# barriers and scales), as the stage counts of the real rows imply
_SM90_SMEM = 225_280


def check_layout(layout: str) -> str:
    """`layout` if it is one of DEEPGEMM_LAYOUTS, else ValueError naming the known ones."""
    if layout not in DEEPGEMM_LAYOUTS:
        raise ValueError(f"unknown DeepGEMM layout {layout!r}; known: {', '.join(DEEPGEMM_LAYOUTS)}")
    return layout


@dataclass(frozen=True)
class GemmConfig:
    """One DeepGEMM launch: the GEMM (N, K, groups, kind) and the tiling the build chose."""

    n: int
    k: int
    groups: int
    gemm_type: int
    block_m: int
    block_n: int
    stages: int
    num_sms: int
    swizzle_d: int
    math_threads: int = 128
    multicast: int = 1
    multicast_on_a: bool = False

    @property
    def last_stages(self) -> int:
        """K blocks left for the last round of the pipeline (the 2025-07+ layouts carry it)."""
        return -(-self.k // BLOCK_K) % self.stages


def swizzle_d_for(block_n: int) -> int:
    """The output (BF16) tile's TMA swizzle: the widest of 128/64/32 bytes that divides a row
    of the tile (rows 3-7 and 13-24 of the TSV all follow this)."""
    row_bytes = block_n * 2
    return next(s for s in (128, 64, 32) if row_bytes % s == 0)


def waves_sms(tiles: int, sms: int = H200_SMS) -> int:
    """SMs a persistent DeepGEMM kernel launches: as few as keep the number of waves
    (DeepGEMM's heuristic; why real rows show 112 or 128 SMs on a 132-SM H100)."""
    waves = -(-tiles // sms)
    return -(-tiles // waves)


def sm90_config(n: int, k: int, *, groups: int = 1, gemm_type: int = GEMM_NORMAL,
                block_m: int, block_n: int, num_sms: int,
                stages: int | None = None) -> GemmConfig:
    """The 2025-07 / sglang-2026 tiling: stages fill the shared memory with (A + B) K-blocks,
    at most 32. Reproduces TSV rows 3, 5, 6 and 7 exactly (row 4, K=1536, shows 4 stages where
    this gives 8: the real heuristic also weighs short K)."""
    if stages is None:
        stages = min(32, _SM90_SMEM // ((block_m + block_n) * BLOCK_K))
    return GemmConfig(n, k, groups, gemm_type, block_m, block_n, stages, num_sms,
                      swizzle_d_for(block_n), 256 if block_m >= 128 else 128)


def sm90_legacy_config(n: int, k: int, *, groups: int = 1, gemm_type: int = GEMM_NORMAL,
                       block_m: int, block_n: int) -> GemmConfig:
    """The 2025-02 tiling: at most 8 stages, the BF16 output tile also in shared memory.
    Reproduces TSV rows 13, 14, 20, 22, 23 and 24 (rows 21 and 30 show 4 where this gives 7
    and 5). The old kernel always multicasts on A (the `true` before GemmType)."""
    stages = min(8, (_SM90_SMEM - block_m * block_n * 2) // ((block_m + block_n) * BLOCK_K))
    return GemmConfig(n, k, groups, gemm_type, block_m, block_n, stages, H200_SMS,
                      swizzle_d_for(block_n), 128, 1, True)


def deepgemm_name(c: GemmConfig, layout: str = DEFAULT_DEEPGEMM_LAYOUT) -> KernelName:
    """The demangled DeepGEMM kernel of `c` in `layout` (argument order as the real rows)."""
    gemm_type = enum(_GEMM_TYPE, c.gemm_type)
    if layout == LAYOUT_2025_02:
        args = (uint(c.n), uint(c.k), uint(c.block_m), uint(c.block_n), uint(BLOCK_K), uint(0),
                uint(c.swizzle_d), uint(c.groups), uint(c.stages), uint(128),
                uint(c.math_threads), uint(c.multicast), bool_(c.multicast_on_a), gemm_type)
        return KernelName("deep_gemm::fp8_gemm_kernel", args,
                          "__nv_bfloat16 *, float *, int *, unsigned int, " + _tensor_maps(4))
    if layout in (LAYOUT_2025_07, LAYOUT_SGLANG_2026):
        core = (uint(0), uint(c.n), uint(c.k), uint(c.groups), uint(c.block_m), uint(c.block_n),
                uint(BLOCK_K), uint(128), uint(128), uint(c.swizzle_d), uint(c.stages),
                uint(c.last_stages), uint(128), uint(c.math_threads), uint(c.multicast),
                bool_(c.multicast_on_a), uint(c.num_sms), gemm_type,
                type_("deep_gemm::EpilogueIdentity"))
        if layout == LAYOUT_2025_07:
            return KernelName("deep_gemm::sm90_fp8_gemm_1d2d_impl", core,
                              "float *, int *, unsigned int, unsigned int, unsigned int, "
                              + _tensor_maps(4))
        # SGLang's fork: the A/B major first, a trailing overlap flag, two layout pointers
        args = (enum(_MAJOR, 0), *core, bool_(False))
        return KernelName("deep_gemm::sm90_fp8_gemm_1d2d_impl", args,
                          "float *, int *, int *, unsigned int, unsigned int, unsigned int, "
                          + _tensor_maps(4))
    if layout == LAYOUT_B200:
        # dense GEMMs are compiled for a runtime shape: M, N, K all 0 (rows 64 and 69)
        grouped = c.gemm_type != GEMM_NORMAL
        n, k = (c.n, c.k) if grouped else (0, 0)
        wide = c.multicast > 1
        args = (enum(_MAJOR, 0), enum(_MAJOR, 0), uint(128), uint(128), uint(0), uint(n), uint(k),
                uint(c.block_m), uint(c.block_n), uint(BLOCK_K), uint(c.groups), uint(128),
                uint(128), uint(c.swizzle_d), uint(c.stages), uint(128), uint(128),
                uint(c.multicast), bool_(wide), uint(c.num_sms), bool_(wide), gemm_type,
                bool_(False), type_("cutlass::float_e4m3_t"), type_("cutlass::float_e4m3_t"),
                type_("cutlass::bfloat16_t"),
                type_("deep_gemm::epilogue::transform::EpilogueIdentity"))
        return KernelName("deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl", args,
                          "int *, unsigned int, unsigned int, unsigned int, " + _tensor_maps(5))
    raise ValueError(check_layout(layout))  # unreachable for a known layout


def _tensor_maps(n: int) -> str:
    return ", ".join(["CUtensorMap_st"] * n)


def short_name(layout: str) -> str:
    """shortName of the layout's kernel (the function name without namespace or arguments)."""
    return {LAYOUT_2025_02: "fp8_gemm_kernel", LAYOUT_B200: "sm100_fp8_fp4_gemm_1d1d_impl"}.get(
        layout, "sm90_fp8_gemm_1d2d_impl")


# ----------------------------------------------------------------------------------------------
# GLM-5.3 (TP8 + EP8, hidden 6144) per-rank GEMMs and the tiling each layout gets for them
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GlmGemm:
    """One GEMM of the GLM-5.3 forward pass on one rank."""

    key: str  # the schedule's kernel key (the cost model's row)
    n: int
    k: int
    groups: int = 1
    gemm_type: int = GEMM_NORMAL
    block_n: int = 64  # Hopper tile width chosen for batch-32 decode


GLM_GEMMS: tuple[GlmGemm, ...] = (
    GlmGemm("gemm_qkv_a", 2624, 6144, block_n=48),
    GlmGemm("gemm_q_b", 2048, 2048, block_n=32),
    GlmGemm("gemm_o_proj", 6144, 2048, block_n=96),
    GlmGemm("gemm_indexer_wq_b", 4096, 2048, block_n=64),
    # The shared expert is replicated under DeepEP, not sharded: SGLang's
    # python/sglang/srt/models/deepseek_v2.py, DeepseekV2MoE.__init__ ("disable tp for shared
    # experts when enable deepep moe": DeepseekV2MLP(..., tp_rank=0, tp_size=1)), so its
    # gate_up is the whole 2 x moe_intermediate_size (2 x 2048) wide over hidden 6144 and its
    # down reads 2048: exactly o_proj's N=6144, K=2048, and the same kernel name.
    GlmGemm("gemm_shared_gate_up", 4096, 6144, block_n=64),
    GlmGemm("gemm_shared_down", 6144, 2048, block_n=96),
    GlmGemm("gemm_dense_gate_up", 3072, 6144, block_n=48),
    GlmGemm("gemm_dense_down", 6144, 1536, block_n=96),
    # routed experts: 32 local experts (256 / EP8); decode masked, prefill contiguous
    GlmGemm("gemm_moe_gate_up_masked", 4096, 6144, 32, GEMM_MASKED, block_n=128),
    GlmGemm("gemm_moe_down_masked", 6144, 2048, 32, GEMM_MASKED, block_n=128),
    GlmGemm("gemm_moe_gate_up_contig", 4096, 6144, 32, GEMM_CONTIGUOUS, block_n=128),
    GlmGemm("gemm_moe_down_contig", 6144, 2048, 32, GEMM_CONTIGUOUS, block_n=128),
)


def glm_config(g: GlmGemm, layout: str, batch: int = 32) -> GemmConfig:
    """The tiling a build of `layout` would choose for GLM-5.3 GEMM `g` at decode batch `batch`.

    Hopper dense decode GEMMs use 16-row tiles (rows 3-7); grouped GEMMs 64 rows per expert
    (masked) or 128 (contiguous prefill). The 2025-02 kernel has no tile narrower than 64 rows.
    B200 takes the configurations of rows 64 (wide dense), 69 (narrow dense) and 65-68 (grouped)."""
    grouped = g.gemm_type != GEMM_NORMAL
    if layout == LAYOUT_B200:
        if grouped:
            return GemmConfig(g.n, g.k, g.groups, g.gemm_type, 128, 128, 8, B200_SMS, 128,
                              multicast=2)
        if g.n >= 4096:
            return GemmConfig(g.n, g.k, 1, GEMM_NORMAL, 16, 128, 12, B200_SMS, 128, multicast=2)
        return GemmConfig(g.n, g.k, 1, GEMM_NORMAL, 32, 32, 24, B200_SMS, 64)
    if g.gemm_type == GEMM_CONTIGUOUS:
        block_m = 128
    elif g.gemm_type == GEMM_MASKED:
        block_m = 64
    else:
        block_m = 64 if layout == LAYOUT_2025_02 else 16
    if layout == LAYOUT_2025_02:
        return sm90_legacy_config(g.n, g.k, groups=g.groups, gemm_type=g.gemm_type,
                                  block_m=block_m, block_n=g.block_n)
    check_layout(layout)
    # masked: one M block per expert (decode tokens per expert stay under 64); dense: the batch
    m_blocks = g.groups if grouped else -(-batch // block_m)
    if g.gemm_type == GEMM_CONTIGUOUS:
        m_blocks = g.groups * 8  # prefill: thousands of rows per rank, every SM busy
    tiles = m_blocks * -(-g.n // g.block_n)
    return sm90_config(g.n, g.k, groups=g.groups, gemm_type=g.gemm_type, block_m=block_m,
                       block_n=g.block_n, num_sms=waves_sms(tiles))
