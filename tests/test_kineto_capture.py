"""Capture attribution on the real SGLang and vLLM capture/replay pairs (../shared/real_traces/kineto).

SGLang Qwen3-8B: the HIP graph replays 544 kernels; the capture trace recorded 544 launches
between hipStreamBeginCapture and hipStreamEndCapture, with `nn.Module: Qwen3DecoderLayer_<n>`
ranges (36 layers) and `sglang_profiler::` / `aiter::` ops around them. vLLM (FULL graph,
torch.compile): 421 replayed kernels, 421 captured launches, but the compiled graph inlines the
decoder layers: the only module range is `GraphModule_0` (the whole model), and the custom ops
(`vllm::moe_forward`, ...) record no layer name (their string inputs are empty in
`Concrete Inputs`). The figures were counted by hand from the JSON of both files.
"""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest

from nsys_ledger.api import check
from nsys_ledger.attribution.capture_traces import attach_captures, captured_launches
from nsys_ledger.captures import check_with_captures
from nsys_ledger.errors import TraceError
from nsys_ledger.trace import load_trace
from nsys_ledger.trace.kineto_reader import load_kineto_capture

ROOT = Path(__file__).resolve().parents[1]


from shared_data import KINETO_TRACES as K, needs_shared  # noqa: E402

SGLANG_DECODE = K / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
SGLANG_CAPTURE = K / "AMD-AGI__TraceLens__inference_sglang_decode_capture_traces_bs_32_rank0.json.gz"
VLLM_DECODE = K / "AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution.json.gz"
VLLM_CAPTURE = K / ("AMD-AGI__TraceLens__inference_vllm_decode_full_capture_traces_graph_capture_rank_0"
                    ".1773709742341309550.pt.trace.json.gz")
pytestmark = needs_shared(K)

QWEN3_LEDGER = """
[model]
name = "Qwen3-8B decode, SGLang, HIP graph"

[params]
layers = 36

[ops.rmsnorm]
patterns = ['rmsnorm']

[layers]
regex = 'nn\\.Module: Qwen3DecoderLayer_(\\d+)'
"""


def test_capture_windows_hold_the_graphs_launches():
    """546 launch calls in the SGLang capture: 2 before hipStreamBeginCapture, 544 inside."""
    trace, named = load_kineto_capture(SGLANG_CAPTURE)
    assert named.height == 546
    launches = captured_launches(trace, named)
    assert launches.height == 544
    assert launches["window"].unique().to_list() == [0]
    assert launches["kernel"].null_count() == 0


def test_sglang_pair_gets_module_and_layer():
    attribution = attach_captures(load_trace(SGLANG_DECODE), [SGLANG_CAPTURE])
    assert attribution.graphs.select("graph_id", "nodes", "capture_window").rows() == [(1, 544, 0)]
    assert attribution.coverage() == {
        "replayed_kernels": 544, "paired": 544, "module": 544, "layer": 540, "op": 541, "module_or_layer": 544,
    }
    nodes = attribution.nodes
    assert nodes["layer"].drop_nulls().unique().sort().to_list() == list(range(36))
    # the four kernels outside the decoder layers: embedding, final norm, LM head (2 kernels)
    outside = nodes.filter(pl.col("layer").is_null()).sort("graph_node_id")["module"].to_list()
    assert outside == ["VocabParallelEmbedding_0", "RMSNorm_144", "LogitsProcessor_0", "LogitsProcessor_0"]
    # pairing by name and occurrence never pairs two different kernels
    assert attribution.nodes.filter(pl.col("capture_start").is_null()).height == 0


def test_vllm_pair_has_no_layer_in_the_capture():
    attribution = attach_captures(load_trace(VLLM_DECODE), [VLLM_CAPTURE])
    assert attribution.coverage() == {
        "replayed_kernels": 421, "paired": 421, "module": 0, "layer": 0, "op": 373, "module_or_layer": 0,
    }
    ops = dict(attribution.nodes.group_by("op").len().iter_rows())
    assert ops["vllm::moe_forward"] == 168 and ops["vllm::unified_attention_with_output"] == 36
    # what has no op: the 48 Triton kernels inductor generated between the custom ops
    assert attribution.nodes.filter(pl.col("op").is_null())["name"].str.starts_with("triton_").all()


def test_layer_attribution_reads_the_capture_time_ranges(tmp_path):
    """With the capture origins in the Trace, attribution.layers finds the 36 layers of the
    replayed kernels through its capture path, as it does for nsys node-level exports."""
    ledger = tmp_path / "qwen3.toml"
    ledger.write_text(QWEN3_LEDGER)
    result, attribution = check_with_captures(SGLANG_DECODE, [SGLANG_CAPTURE], ledger)
    assert result.layers.kernels_by_how()["capture_nvtx"] == 540
    assert result.layers.assignments["layer"].drop_nulls().n_unique() == 36
    assert result.notices[-1] == (
        "capture traces: 544 of 544 replayed graph kernels paired with their capture-time launch; "
        "100.0% have a module or layer (99.3% a layer, 99.4% a named op)"
    )
    assert not any("--capture" in notice for notice in result.notices)
    # the replay alone: the graph kernels have no capture origin
    alone = check(SGLANG_DECODE, ledger)
    assert alone.layers.kernels_by_how()["capture_nvtx"] == 0


def test_a_capture_directory_and_a_missing_capture(tmp_path):
    (tmp_path / "bs_32_rank0.json.gz").write_bytes(SGLANG_CAPTURE.read_bytes())
    attribution = attach_captures(load_trace(SGLANG_DECODE), [tmp_path])
    assert attribution.coverage()["paired"] == 544
    with pytest.raises(TraceError, match="no such file"):
        attach_captures(load_trace(SGLANG_DECODE), [tmp_path / "nope.json.gz"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TraceError, match="without capture traces"):
        attach_captures(load_trace(SGLANG_DECODE), [empty])


def test_capture_needs_a_pytorch_profiler_replay():
    nsys = ROOT / "sample_traces" / "glm5-graph-healthy.sqlite"
    with pytest.raises(TraceError, match="pairs a PyTorch profiler trace with its capture traces"):
        attach_captures(load_trace(nsys), [SGLANG_CAPTURE])
