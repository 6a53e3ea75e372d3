"""The Kineto (PyTorch profiler) reader against the seven real traces in
../shared/real_traces/kineto/ (see its README).

The figures below were counted from each file's JSON with the standard library's `json`
(with `Decimal` timestamps), not with the reader: kernels, copies by kind, memsets, runtime and
driver calls, kernel-launch calls, graph launches and the kernels carrying a graph launch's
correlation id, annotations, cpu ops and `nn.Module` ranges. The README's own table gives
several of them (SGLang Qwen3 decode: 555 kernels, 3 copies, 1 graph launch).
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from nsys_ledger.api import check
from nsys_ledger.errors import TraceError
from nsys_ledger.trace import load_trace
from nsys_ledger.trace.kineto_reader import decimal_text_to_ns, float_to_ns
from nsys_ledger.trace.model import FRAME_SCHEMAS

REPO = Path(__file__).resolve().parents[1]


from shared_data import KINETO_TRACES as KINETO_DIR, needs_shared  # noqa: E402

needs_traces = needs_shared(KINETO_DIR)

B200 = "AMD-AGI__TraceLens__b200_eager_trace.json.gz"
H100 = "AMD-AGI__TraceLens__h100_Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
SGLANG_CAPTURE = "AMD-AGI__TraceLens__inference_sglang_decode_capture_traces_bs_32_rank0.json.gz"
SGLANG_DECODE = "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
VLLM_CAPTURE = ("AMD-AGI__TraceLens__inference_vllm_decode_full_capture_traces_graph_capture_rank_0"
                ".1773709742341309550.pt.trace.json.gz")
VLLM_DECODE = "AMD-AGI__TraceLens__inference_vllm_decode_full_graph_execution.json.gz"
ALEXNET = "HTA__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz"
NCCL = "HTA__nccl_parser_config__nccl_data.json.gz"

# Counted from the JSON (module docstring). runtime/driver: events of cat cuda_runtime /
# cuda_driver; launches: their kernel-launch calls; graph_kernels: kernels whose correlation is
# a graph launch's; ranges: user_annotation, gpu_user_annotation, cpu_op, nn.Module.
FACTS = {
    B200: dict(kernels=768, memcpy={"HtoD": 15, "DtoD": 146}, memsets=0, syncs=0, runtime=1151, driver=221,
               launches=768, graph_launches=0, graph_kernels=0,
               ranges={"user_annotation": 3, "gpu_user_annotation": 3, "cpu_op": 4809, "nn.Module": 436},
               first_kernel_ns=(1365627866520196, 2080), rank=0, world_size=8),
    H100: dict(kernels=1465, memcpy={"DtoH": 1}, memsets=241, syncs=0, runtime=1921, driver=1,
               launches=1029, graph_launches=0, graph_kernels=0,
               ranges={"user_annotation": 1, "gpu_user_annotation": 1, "cpu_op": 4186, "nn.Module": 316},
               first_kernel_ns=(1428625731622250, 18112), rank=None, world_size=None),
    SGLANG_CAPTURE: dict(kernels=2, memcpy={}, memsets=0, syncs=0, runtime=1500, driver=0,
                         launches=546, graph_launches=0, graph_kernels=0,
                         ranges={"user_annotation": 2, "gpu_user_annotation": 1, "cpu_op": 3556, "nn.Module": 508},
                         first_kernel_ns=(4909733316061579, 5367), rank=0, world_size=1),
    SGLANG_DECODE: dict(kernels=555, memcpy={"DtoH": 1, "DtoD": 2}, memsets=0, syncs=0, runtime=29, driver=0,
                        launches=11, graph_launches=1, graph_kernels=544,
                        ranges={"user_annotation": 2, "cpu_op": 61, "nn.Module": 1},
                        first_kernel_ns=(4909914216285224, 4246), rank=0, world_size=1),
    VLLM_CAPTURE: dict(kernels=7, memcpy={"DtoD": 2, "HtoD": 1}, memsets=0, syncs=0, runtime=3128, driver=0,
                       launches=428, graph_launches=0, graph_kernels=0,
                       ranges={"user_annotation": 26, "gpu_user_annotation": 1, "cpu_op": 3819, "nn.Module": 26},
                       first_kernel_ns=(6520430065016281, 2239), rank=0, world_size=1),
    VLLM_DECODE: dict(kernels=425, memcpy={"DtoD": 9}, memsets=0, syncs=0, runtime=20, driver=0,
                      launches=4, graph_launches=1, graph_kernels=421,
                      ranges={"user_annotation": 1, "cpu_op": 100, "nn.Module": 1},
                      first_kernel_ns=(6520618861901761, 4439), rank=0, world_size=1),
    ALEXNET: dict(kernels=79, memcpy={"HtoD": 16}, memsets=3, syncs=41, runtime=361, driver=0,
                  launches=79, graph_launches=0, graph_kernels=0,
                  ranges={"user_annotation": 8, "cpu_op": 359},
                  first_kernel_ns=(1695835573023613000, 71000), rank=0, world_size=None),
    # launches: 2550 cudaLaunchKernel + 150 cudaLaunchKernelExC
    NCCL: dict(kernels=2700, memcpy={"DtoD": 960}, memsets=114, syncs=0, runtime=8740, driver=0,
               launches=2700, graph_launches=0, graph_kernels=0,
               ranges={"user_annotation": 42, "gpu_user_annotation": 30, "cpu_op": 14346},
               first_kernel_ns=(4458676422880181, 3744), rank=0, world_size=2),
}


@pytest.fixture(scope="module")
def traces():
    return {name: load_trace(KINETO_DIR / name) for name in FACTS}


@needs_traces
def test_every_file_in_the_directory_is_covered():
    assert sorted(p.name for p in KINETO_DIR.glob("*.json.gz")) == sorted(FACTS)


@needs_traces
@pytest.mark.parametrize("name", sorted(FACTS))
def test_counts_match_the_json(traces, name):
    trace, facts = traces[name], FACTS[name]
    for kind, schema in FRAME_SCHEMAS.items():
        assert dict(getattr(trace, kind).schema) == schema, kind
    assert trace.kernels.height == facts["kernels"]
    copies = dict(trace.memcpys.group_by("copy_kind").len().iter_rows())
    assert copies == facts["memcpy"]
    assert trace.memsets.height == facts["memsets"]
    assert trace.syncs.height == facts["syncs"]
    by_class = dict(trace.api_calls.group_by("event_class").len().iter_rows())
    assert by_class.get(0, 0) == facts["runtime"] and by_class.get(1, 0) == facts["driver"]
    kinds = dict(trace.api_calls.group_by("kind").len().iter_rows())
    assert kinds.get("kernel_launch", 0) == facts["launches"]
    assert kinds.get("graph_launch", 0) == facts["graph_launches"]
    assert trace.kernels["graph_node_id"].is_not_null().sum() == facts["graph_kernels"]
    ranges = dict(trace.nvtx.group_by("domain").len().iter_rows())
    assert ranges == facts["ranges"]
    assert (trace.meta.rank, trace.meta.world_size) == (facts["rank"], facts["world_size"])
    assert trace.meta.version_source == "kineto"


@needs_traces
@pytest.mark.parametrize("name", sorted(FACTS))
def test_timestamps_keep_every_digit(traces, name):
    """The earliest kernel's ts/dur, as integer ns from the decimal text of the JSON."""
    first = traces[name].kernels.sort("start").row(0, named=True)
    start, duration = FACTS[name]["first_kernel_ns"]
    assert (first["start"], first["end"] - first["start"]) == (start, duration)


@needs_traces
def test_gpu_rows_join_their_launching_call(traces):
    """GPU rows take the launching process, so kernels and calls join on (pid, correlation)."""
    trace = traces[SGLANG_DECODE]
    assert trace.kernels["pid"].unique().to_list() == [251]
    joined = trace.kernels.join(trace.api_calls.select("pid", "correlation", "kind"), on=["pid", "correlation"])
    assert dict(joined.group_by("kind").len().iter_rows()) == {"graph_launch": 544, "kernel_launch": 11}


@needs_traces
@pytest.mark.parametrize("name, graph_kernels", [(SGLANG_DECODE, 544), (VLLM_DECODE, 421)])
def test_graph_replays_count_as_node_level_replays(traces, name, graph_kernels):
    """One replay: one graph, node ids 0..n-1 in time order, and one replay in the check."""
    trace = traces[name]
    nodes = trace.kernels.filter(pl.col("graph_node_id").is_not_null()).sort("start")
    assert nodes["graph_id"].unique().to_list() == [1]
    assert (nodes["graph_node_id"] - (1 << 20)).to_list() == list(range(graph_kernels))
    assert trace.meta.cuda_graph_trace == "node"
    assert trace.meta.warnings == (
        f"{graph_kernels} kernels were replayed from CUDA/HIP graphs: the trace does not say which module or layer "
        "captured them; give the capture traces (SGLang --enable-profile-cuda-graph, vLLM) with --capture",
    )
    result = check(trace)
    assert result.totals.graph_replays == 1
    assert result.step_table["graph_launches"].to_list() == [1]


@needs_traces
def test_sglang_decode_step_from_its_annotation(traces):
    result = check(traces[SGLANG_DECODE])
    assert result.steps.method == "nvtx"
    assert result.step_table["kernels"].to_list() == [555]
    assert result.steps.decode["label"].to_list() == [
        "execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk32785sqsq32sqsk32785)"
    ]


@needs_traces
def test_vllm_prefill_step_is_not_decode(traces):
    """The B200 trace's one engine step is an 888-token prefill: found, and excluded."""
    result = check(traces[B200])
    assert result.steps.method == "nvtx"
    assert result.step_table.height == 0
    assert result.steps.excluded["reason"].to_list() == [
        "a prefill step, by annotation 'execute_context_1(888_788544)_generation_0(0)'"
    ]


@needs_traces
def test_copies_keep_their_memory_kinds(traces):
    b200 = traces[B200].memcpys
    pinned = b200.filter(pl.col("copy_kind") == "HtoD")
    assert dict(pinned.group_by("src_kind").len().iter_rows()) == {"Pinned": 13, "Pageable": 2}
    alexnet = traces[ALEXNET]
    assert alexnet.memcpys["src_kind"].unique().to_list() == ["Pageable"]
    # cuda_sync_kind: 20 "Stream Wait Event", 16 "Stream Sync", 5 "Context Sync"
    assert dict(alexnet.syncs.group_by("sync_type").len().iter_rows()) == {
        "Stream wait event": 20, "Stream sync": 16, "Context sync": 5}


@needs_traces
def test_devices_from_device_properties(traces):
    devices = traces[B200].devices
    assert devices.height == 8
    assert devices.row(0, named=True) == {
        "device": 0, "name": "NVIDIA B200", "sm_count": 148, "total_memory": 191503138816,
        "compute_capability": "10.0",
    }


# ---- exact times --------------------------------------------------------------------------


def test_decimal_text_to_ns_is_exact():
    text = pl.Series("ts", ["4909914216204.635", "1695835573023613", "12.5", "-3.25", "7.1234"])
    assert decimal_text_to_ns(text, 1000).to_list() == [4909914216204635, 1695835573023613000, 12500, -3250, 7123]
    assert decimal_text_to_ns(pl.Series("ts", ["123", "45.0"]), 1).to_list() == [123, 45]


def test_float_path_is_exact_below_two_to_the_43_microseconds():
    values = pl.Series("ts", [4909914216204.635, 6520618861901.761, 8796093022207.999])
    assert float_to_ns(values, 1000).to_list() == [4909914216204635, 6520618861901761, 8796093022207999]


def test_huge_fractional_timestamps_are_read_as_text(tmp_path):
    """Epoch microseconds with nanosecond decimals do not fit a double: read from the text."""
    path = tmp_path / "epoch.json"
    path.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7,'
        ' "ts": 1767189312123456.789, "dur": 3.001, "args": {"correlation": 5}},'
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1767189312123460.123,'
        ' "dur": 1.999, "args": {"device": 0, "stream": 7, "correlation": 5}}]}'
    )
    trace = load_trace(path)
    assert trace.api_calls.select("start", "end").row(0) == (1767189312123456789, 1767189312123459790)
    assert trace.kernels.select("start", "end", "pid").row(0) == (1767189312123460123, 1767189312123462122, 7)


# ---- bad input ----------------------------------------------------------------------------


def _write_bad(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    good = b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1, "dur": 1}]}'
    cases = {
        "truncated-gzip": ("t.json.gz", gzip.compress(good * 50)[:40], "truncated gzip file"),
        "not-json": ("n.json", b"{this is not json", "not valid JSON"),
        "no-trace-events": ("m.json", b'{"schemaVersion": 1}', "JSON without a traceEvents list"),
        "events-not-a-list": ("l.json", b'{"traceEvents": 3}', "traceEvents is not a list"),
        "empty-events": ("e.json.gz", gzip.compress(b'{"traceEvents": []}'), "the trace holds no events"),
        "other-json": ("o.json", b'{"traceEvents": [{"ph": "X", "cat": "foo", "name": "a", "ts": 1}]}',
                       "not a PyTorch profiler (Kineto) trace"),
        "json-array-not-trace": ("a.json", b"[1, 2, 3]", "not a PyTorch profiler (Kineto) trace"),
    }
    written = {}
    for key, (file_name, data, problem) in cases.items():
        path = tmp_path / file_name
        path.write_bytes(data)
        written[key] = (path, problem)
    return written


def test_bad_kineto_inputs_raise_one_line_trace_errors(tmp_path):
    for key, (path, problem) in _write_bad(tmp_path).items():
        with pytest.raises(TraceError) as error:
            load_trace(path)
        assert error.value.path == str(path), key
        assert problem in error.value.problem, (key, error.value.problem)
        assert "\n" not in str(error.value), key


def test_bad_kineto_input_through_the_console_entry(tmp_path):
    """Exit code 2, one line on stderr naming the file, nothing on stdout, no traceback."""
    path, problem = _write_bad(tmp_path)["truncated-gzip"]
    script = Path(sys.executable).with_name("nsys-ledger")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "nsys_ledger.cli"]
    run = subprocess.run([*argv, "check", str(path)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and problem in lines[0], run.stderr


def test_odd_field_types_take_the_generic_path(tmp_path):
    """Quoted numbers, an `args` that is not an object and a string pid do not stop the reader."""
    path = tmp_path / "odd.json"
    path.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": "7", "tid": 7,'
        ' "ts": "100.5", "dur": 2, "args": {"correlation": "5"}},'
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 101.25, "dur": 1,'
        ' "args": {"device": 0, "stream": 7, "correlation": 5}},'
        '{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 100, "dur": 4, "args": "none"},'
        '{"ph": "M", "name": "process_name", "pid": "Spans", "tid": "PyTorch Profiler", "args": {"name": 3}}]}'
    )
    trace = load_trace(path)
    assert trace.api_calls.select("start", "end", "pid", "correlation").row(0) == (100500, 102500, 7, 5)
    assert trace.kernels.select("start", "end", "pid").row(0) == (101250, 102250, 7)
    assert trace.nvtx.select("name", "start", "end").row(0) == ("aten::mm", 100000, 104000)


def test_display_time_unit_does_not_change_the_unit(tmp_path):
    """libkineto writes `ts` in µs even with `displayTimeUnit: "ns"` (a viewer setting)."""
    path = tmp_path / "ns.json"
    path.write_text(
        '{"displayTimeUnit": "ns", "baseTimeNanoseconds": 1767189312000000000, "traceEvents": ['
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1365627866520.196, "dur": 2.08,'
        ' "args": {"device": 0, "stream": 7, "correlation": 5}}]}'
    )
    assert load_trace(path).kernels.select("start", "end").row(0) == (1365627866520196, 1365627866522276)


QWEN2_LEDGER = r"""
[model]
name = "Qwen1.5-0.5B generate, Hugging Face eager"

[params]
layers = 24

[steps]
method = "nvtx"
nvtx = '^ProfilerStep#\d+$'

[ops.rmsnorm]
patterns = ['rms', 'norm']

[layers]
regex = 'nn\.Module: Qwen2DecoderLayer_(\d+)'
"""


@needs_traces
def test_module_ranges_give_layers_to_eager_kernels(traces, tmp_path):
    """`with_modules` traces: NVTX projection through the `nn.Module: Qwen2DecoderLayer_<n>`
    ranges gives the eager kernels of the H100 step their layer. 1,029 of the 1,465 kernels
    have their launch call in the trace (436 were launched before the recorded calls begin);
    all 1,029 run inside `ProfilerStep#6`."""
    ledger = tmp_path / "qwen2.toml"
    ledger.write_text(QWEN2_LEDGER)
    result = check(traces[H100], ledger)
    assert result.step_table["kernels"].to_list() == [1029]
    assert result.layers.kernels_by_how()["replay_nvtx"] == 1008
    assert result.layers.assignments["layer"].drop_nulls().unique().sort().to_list() == list(range(24))
    launched = traces[H100].kernels.join(traces[H100].api_calls, on=["pid", "correlation"], how="semi")
    assert launched.height == 1029


@needs_traces
def test_every_report_renders_from_kineto_input(traces, tmp_path):
    """The terminal, JSON, HTML, JUnit, Markdown and Chrome-trace outputs of a Kineto check."""
    import json

    from nsys_ledger.report.chrome_trace import write_chrome_trace
    from nsys_ledger.report.html import write_html
    from nsys_ledger.report.json_report import write_json
    from nsys_ledger.report.junit import write_junit
    from nsys_ledger.report.markdown import write_markdown
    from nsys_ledger.report.terminal import render

    result = check(traces[SGLANG_DECODE])
    assert "555 kernels" in render(result)
    for name, writer in (("r.json", write_json), ("r.html", write_html), ("r.xml", write_junit),
                         ("r.md", write_markdown), ("t.json", write_chrome_trace)):
        writer(result, tmp_path / name)
        assert (tmp_path / name).stat().st_size > 0, name
    document = json.loads((tmp_path / "r.json").read_text())
    assert document["trace"]["version_source"] == "kineto"
    assert document["trace"]["nsys_version"] is None


@needs_traces
@pytest.mark.parametrize("seed", range(12))
def test_damaged_events_give_a_trace_error_or_a_result(tmp_path, seed):
    """Fields removed, retyped (null, text, lists, 1e300, 2**70) or events dropped, at random:
    the check either runs or stops with a TraceError, never another exception."""
    import json
    import random

    document = json.loads(gzip.decompress((KINETO_DIR / VLLM_DECODE).read_bytes()))
    rng = random.Random(seed)
    events = document["traceEvents"]
    for _ in range(rng.randint(5, 40)):
        event = rng.choice(events)
        action = rng.random()
        if action < 0.3 and event:
            event.pop(rng.choice(sorted(event)), None)
        elif action < 0.5 and isinstance(event.get("args"), dict) and event["args"]:
            event["args"].pop(rng.choice(sorted(event["args"])), None)
        elif action < 0.65:
            event[rng.choice(["ts", "dur", "pid", "tid", "name", "cat"])] = rng.choice(
                [None, "x", -5, 1e300, [], {}, True, "12.5"])
        elif action < 0.8 and isinstance(event.get("args"), dict):
            event["args"][rng.choice(["correlation", "device", "stream", "bytes", "kind"])] = rng.choice(
                [None, "x", -1, 2**70, [], "7"])
        else:
            events.remove(event)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(document))
    try:
        check(path)
    except TraceError:
        pass


@needs_traces
def test_flow_events_link_gpu_rows_without_a_correlation(tmp_path):
    """With `args.correlation` removed from every GPU row, the `ac2g` flows still link the
    SGLang step's kernels to their launches: 544 to the hipGraphLaunch, 11 to kernel launches."""
    import json

    document = json.loads(gzip.decompress((KINETO_DIR / SGLANG_DECODE).read_bytes()))
    for event in document["traceEvents"]:
        if event.get("cat") in ("kernel", "gpu_memcpy"):
            event["args"].pop("correlation", None)
    path = tmp_path / "no-correlation.json"
    path.write_text(json.dumps(document))
    trace = load_trace(path)
    joined = trace.kernels.join(trace.api_calls.select("pid", "correlation", "kind"), on=["pid", "correlation"])
    assert dict(joined.group_by("kind").len().iter_rows()) == {"graph_launch": 544, "kernel_launch": 11}
    assert trace.kernels["graph_node_id"].is_not_null().sum() == 544


@needs_traces
def test_found_by_content_whatever_the_name(tmp_path):
    """gzip JSON and plain JSON under names without .json: recognized by their bytes."""
    gz = tmp_path / "decode.bin"
    gz.write_bytes((KINETO_DIR / SGLANG_DECODE).read_bytes())
    assert load_trace(gz).kernels.height == 555
    plain = tmp_path / "decode.trace"
    plain.write_bytes(gzip.decompress(gz.read_bytes()))
    assert load_trace(plain).kernels.height == 555
