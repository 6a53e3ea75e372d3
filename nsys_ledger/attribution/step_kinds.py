"""Step kinds: is a step window decode, prefill (extend) or mixed?

The engine says so itself where it annotates its steps (a `record_function` range in a PyTorch
profiler trace, an NVTX range in an nsys capture):

* vLLM V1: ``execute_context_{n}({tokens})_generation_{m}({tokens})`` (SGLang's profiler writes
  the same with the batch size in front, ``execute_32_context_0(...)_generation_32(...)``):
  prefill requests only (m = 0) is a prefill step, decode requests only (n = 0) a decode step,
  both a mixed step (vLLM V1 schedules chunked prefill into decode steps).
* SGLang: ``step[DECODE bs=32]``, ``step[EXTEND ...]``, ``step[MIXED ...]``: the batch's forward
  mode.

The window's own range name is read first, then the first such range that starts inside the
window. A window without either is told by its kernels: TensorRT-LLM's fused MHA kernels (the
attention of vLLM and SGLang on Blackwell) end their names in ``Context`` for prefill and
``ForGen`` for generation, so a step with a context kernel is a prefill step, or a mixed step when
it also runs a generation kernel; any other step is a decode step, today's meaning. FlashInfer's
``BatchPrefillWith*`` kernels tell nothing: FlashInfer decodes with them too (tensor-core decode).
"""

from __future__ import annotations

import re

import polars as pl

STEP_KINDS = ("decode", "prefill", "mixed")
DEFAULT_KIND = "decode"

VLLM_STEP_ANNOTATION = re.compile(r"execute_(?:\d+_)?context_(\d+)\(.*\)_generation_(\d+)\(")
SGLANG_STEP_ANNOTATION = re.compile(r"^step\[([A-Z_]+)\b")
# SGLang's ForwardMode names; TARGET_VERIFY is the verify pass of speculative decoding, the
# decode step of an MTP cycle. Modes not listed (IDLE, DRAFT_EXTEND, ...) fall back to kernels.
SGLANG_MODE_KINDS = {"DECODE": "decode", "TARGET_VERIFY": "decode", "EXTEND": "prefill",
                     "SPLIT_PREFILL": "prefill", "MIXED": "mixed"}
# either engine's step annotation, for polars (the kind is then read with annotation_kind)
STEP_ANNOTATION_REGEX = r"execute_(?:\d+_)?context_\d+\(.*\)_generation_\d+\(|^step\[[A-Z_]+\b"

# TensorRT-LLM fmha kernel names (real: fmhaSm100aKernel_...PersistentContext,
# fmhaSm100fKernel_...StaticSwapsAbForGen in ../shared)
PREFILL_ATTENTION_REGEX = r"^fmhaSm\d+[a-z]?Kernel_\w*Context$"
DECODE_ATTENTION_REGEX = r"^fmhaSm\d+[a-z]?Kernel_\w*ForGen$"

KIND_SCHEMA = {"key": pl.Int64, "window": pl.Int64, "kind": pl.Utf8, "kind_source": pl.Utf8}


def annotation_kind(name: str | None) -> str | None:
    """The step kind an engine's step annotation names, or None for any other range."""
    if not name:
        return None
    vllm = VLLM_STEP_ANNOTATION.search(name)
    if vllm:
        prefill, decode = int(vllm[1]) > 0, int(vllm[2]) > 0
        if prefill and decode:
            return "mixed"
        if prefill:
            return "prefill"
        return "decode" if decode else None
    sglang = SGLANG_STEP_ANNOTATION.search(name)
    return SGLANG_MODE_KINDS.get(sglang[1]) if sglang else None


def kind_by_kernels(names: list[str]) -> str:
    """A step's kind from its kernel names: prefill attention present or not."""
    prefill = any(re.search(PREFILL_ATTENTION_REGEX, n) for n in names)
    decode = any(re.search(DECODE_ATTENTION_REGEX, n) for n in names)
    if prefill:
        return "mixed" if decode else "prefill"
    return DEFAULT_KIND


def window_kinds(windows: pl.DataFrame, attention: pl.DataFrame, contained_annotations: pl.DataFrame) -> pl.DataFrame:
    """`key, window, kind, kind_source` for every window.

    `attention`: `key, window, _prefill, _decode`, whether the window's kernels include
    prefill or decode attention (attribution.steps.window_summary); `contained_annotations`:
    step annotations placed in windows (`key, window, name`), in start order."""
    by_label = windows.select("key", "window", pl.col("label").alias("name")).filter(pl.col("name").is_not_null())
    annotated = pl.concat([by_label, contained_annotations.select("key", "window", "name")], how="vertical")
    named = (
        annotated.with_columns(pl.col("name").map_elements(annotation_kind, return_dtype=pl.Utf8).alias("kind"))
        .filter(pl.col("kind").is_not_null())
        .group_by("key", "window", maintain_order=True)
        .first()
        .select("key", "window", "kind", pl.concat_str(pl.lit("annotation '"), pl.col("name"), pl.lit("'"))
                .alias("kind_source"))
    )
    by_kernels = (
        windows.select("key", "window")
        .join(attention, on=["key", "window"], how="left")
        .select(
            "key", "window",
            pl.when(pl.col("_prefill") & pl.col("_decode")).then(pl.lit("mixed"))
            .when(pl.col("_prefill")).then(pl.lit("prefill"))
            .otherwise(pl.lit(DEFAULT_KIND)).alias("_kernel_kind"),
            pl.when(pl.col("_prefill")).then(pl.lit("kernels: prefill attention"))
            .otherwise(pl.lit("kernels: no prefill attention")).alias("_kernel_source"),
        )
    )
    return (
        by_kernels.join(named, on=["key", "window"], how="left")
        .select("key", "window", pl.coalesce("kind", "_kernel_kind").alias("kind"),
                pl.coalesce("kind_source", "_kernel_source").alias("kind_source"))
        .cast(KIND_SCHEMA)
    )
