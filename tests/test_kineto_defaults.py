"""What `check` finds in a PyTorch profiler trace without a ledger: torch.profiler's own step
ranges, and layers from the `nn.Module: <Name>DecoderLayer_<i>` ranges of `with_modules=True`."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

import nsys_ledger
from nsys_ledger.pipeline.multifile import expand_trace_paths

from shared_data import KINETO_TRACES as KINETO, needs_shared

HF_H100 = KINETO / "AMD-AGI__TraceLens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"

pytestmark = needs_shared(HF_H100)


def _counted_from_json() -> tuple[int, int]:
    """Kernels launched inside the ProfilerStep annotation, and the decoder layers named by
    module ranges, counted with the standard json module."""
    events = json.loads(gzip.decompress(HF_H100.read_bytes()))["traceEvents"]
    step = next(e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    calls = {e["args"]["correlation"]: e["ts"] for e in events
             if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})}
    kernels = sum(
        1 for e in events
        if e.get("cat") == "kernel" and step["ts"] <= calls.get(e["args"].get("correlation"), -1) <= step["ts"] + step["dur"]
    )
    layers = {m.group(1) for e in events if (m := re.match(r"nn\.Module: \w*DecoderLayer_(\d+)$", e.get("name", "")))}
    return kernels, len(layers)


def test_profiler_step_and_module_ranges_without_a_ledger():
    kernels, layers = _counted_from_json()
    assert (kernels, layers) == (1029, 24)
    result = nsys_ledger.check(HF_H100)
    assert result.steps.method == "nvtx" and result.step_table["kernels"].to_list() == [kernels]
    assert result.layers.counts["layer"].n_unique() == layers
    assert result.layers.kernels_by_how()["replay_nvtx"] == 1008  # the rest: embedding, final norm, LM head


def test_a_directory_of_profiler_traces_is_a_rank_set(tmp_path):
    for rank in (0, 1):
        shutil.copy(HF_H100, tmp_path / f"1700000000-TP-{rank}.trace.json.gz")
    assert [Path(p).name for p in expand_trace_paths([tmp_path])] == [
        "1700000000-TP-0.trace.json.gz", "1700000000-TP-1.trace.json.gz"]


SGLANG_DECODE = KINETO / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"


def test_a_ledger_for_another_model_points_to_match_and_learn():
    """The GLM-5.3 ledger on a Qwen3-8B decode (AMD aiter kernels): most kernels have no op,
    and the check says how to get a ledger that describes the build."""
    import click

    from nsys_ledger.report.terminal import render

    glm = Path(__file__).resolve().parents[1] / "expectations" / "glm-5.3-tp8-ep8.toml"
    result = nsys_ledger.check(SGLANG_DECODE, glm)
    assert result.coverage.kernels("no_op") == 474 and result.coverage.total == 546
    text = click.unstyle(render(result, width=1000))  # unwrapped: the sentences whole
    assert "no op 474 (86.8%)" in text
    assert "hint: the ledger does not describe this build" in text and "`nsys-ledger learn`" in text
