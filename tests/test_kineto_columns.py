"""How the Kineto reader turns events into columns: names kept as codes into a table of
distinct names, graph node ids of replays from several processes, correlations taken from
`ac2g` flows only where a GPU row lacks one. Small hand-written traces, literal figures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nsys_ledger.trace import json_stream, kineto_reader
from nsys_ledger.trace.kineto_reader import GRAPH_ID_SHIFT, load_kineto


def _kernel(name, ts: int, correlation: int | None = None) -> dict:
    args = {"device": 0, "stream": 7}
    if correlation is not None:
        args["correlation"] = correlation
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": 5, "args": args}


def _call(name: str, pid: int, ts: int, correlation: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": pid, "tid": pid, "ts": ts, "dur": 2,
            "args": {"correlation": correlation}}


def _write(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


NAMES = ["gemm", 7, 7.0, True, None, "7", "gemm", ["x", 1], {"k": "v"}, "norm", 2**70, "gemm"]
# a name that is not a string becomes its text; 7, 7.0 and True are one dict key, three texts;
# a list or an object is no dict key at all
TEXTS = ["gemm", "7", "7.0", "True", None, "7", "gemm", "['x', 1]", "{'k': 'v'}", "norm", str(2**70), "gemm"]


@pytest.mark.parametrize("batch_bytes", [json_stream.BATCH_BYTES, 256])
def test_names_of_every_json_type_keep_their_text(tmp_path: Path, monkeypatch, batch_bytes: int) -> None:
    monkeypatch.setattr(json_stream, "BATCH_BYTES", batch_bytes)  # 256: about one event per batch
    events = [_kernel(name, 10 * i, i) for i, name in enumerate(NAMES)]
    trace = load_kineto(_write(tmp_path, events))
    assert trace.kernels["name"].to_list() == TEXTS
    assert trace.kernels["short_name"].to_list() == TEXTS


def test_names_past_the_table_limit_stay_text(tmp_path: Path, monkeypatch) -> None:
    """With room for 2 distinct names, the batches that bring a third keep their names as
    text; batches of known names are still codes: both kinds of piece in one column."""
    monkeypatch.setattr(json_stream, "BATCH_BYTES", 256)
    monkeypatch.setattr(kineto_reader, "_MAX_NAMES", 2)
    names = ["a", "b", "a", "c", "b", "d", "a"]
    trace = load_kineto(_write(tmp_path, [_kernel(name, 10 * i, i) for i, name in enumerate(names)]))
    assert trace.kernels["name"].to_list() == names


def _graph_trace() -> list[dict]:
    """Process 100 replays kernels a, b, c (correlation 1), a, b (3), a, b, a copy, c (4) and
    a, b, c again (6); process 200 replays a, b, c (2); one kernel is launched on its own (5)."""
    events = [
        _call("cudaGraphLaunch", 100, 0, 1), _call("cudaGraphLaunch", 200, 1, 2),
        _call("cudaGraphLaunch", 100, 2, 3), _call("cudaGraphLaunch", 100, 3, 4),
        _call("cudaLaunchKernel", 100, 4, 5), _call("cudaGraphLaunch", 100, 5, 6),
    ]
    starts = {1: 100, 2: 200, 3: 300, 4: 400, 6: 600}
    for correlation, names in ((1, "abc"), (2, "abc"), (3, "ab"), (4, "abc"), (6, "abc")):
        for position, name in enumerate(names):
            events.append(_kernel(name, starts[correlation] + 10 * position, correlation))
    events.append({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 7,
                   "ts": 415, "dur": 1, "args": {"device": 0, "stream": 7, "correlation": 4, "bytes": 64}})
    events.append(_kernel("solo", 500, 5))
    return events


def test_graph_nodes_of_replays_from_two_processes(tmp_path: Path) -> None:
    trace = load_kineto(_write(tmp_path, _graph_trace()))
    kernels = trace.kernels.sort("start")
    assert kernels["pid"].to_list() == [100] * 3 + [200] * 3 + [100] * 9
    # process 100: abc is its graph 1, ab its graph 2, ab-copy-c its graph 3; process 200
    # numbers its own graphs; the kernel launched on its own is no node
    assert kernels["graph_id"].to_list() == [1, 1, 1, 1, 1, 1, 2, 2, 3, 3, 3, None, 1, 1, 1]
    node = 1 << GRAPH_ID_SHIFT
    # the copy is the third node of its replay: c is the fourth
    assert kernels["graph_node_id"].to_list() == [
        node, node + 1, node + 2, node, node + 1, node + 2, 2 * node, 2 * node + 1,
        3 * node, 3 * node + 1, 3 * node + 3, None, node, node + 1, node + 2,
    ]
    assert trace.memcpys["graph_node_id"].to_list() == [3 * node + 2]


def test_flows_fill_only_missing_correlations_and_the_first_flow_counts(tmp_path: Path) -> None:
    """Two flows end on the second kernel (ids 11 and 12): the first in the file counts; a
    flow start (`ph: s`) there is no end; the third kernel has neither."""
    flow = {"cat": "ac2g", "name": "ac2g", "pid": 0, "tid": 7, "bp": "e"}
    events = [
        _call("cudaLaunchKernel", 100, 0, 10), _call("cudaLaunchKernel", 100, 1, 11),
        _call("cudaLaunchKernel", 100, 2, 12),
        _kernel("a", 100, 10),
        {**flow, "ph": "s", "id": 12, "ts": 200},
        _kernel("b", 200),
        {**flow, "ph": "f", "id": 11, "ts": 200},
        {**flow, "ph": "f", "id": 12, "ts": 200},
        {**flow, "ph": "f", "id": 10, "ts": 100},  # a row that has its correlation keeps it
        _kernel("c", 300),
    ]
    trace = load_kineto(_write(tmp_path, events))
    kernels = trace.kernels.sort("start")
    assert kernels["correlation"].to_list() == [10, 11, None]
    assert kernels["pid"].to_list() == [100, 100, 100]
