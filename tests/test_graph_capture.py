"""Capture-time origin of CUDA-graph kernels (attribution.graph_capture) against SQL.

The synthetic graph traces carry what nsys writes with --cuda-graph-trace=node: kernel rows
with the exec graph's node ids, CUDA_GRAPH_NODE_EVENTS rows for the nodes created during
stream capture and for their clones made at instantiation (originalGraphNodeId). A recursive
SQL query written here follows the clone links and finds the capturing API call; the
attribution must agree node for node. Then the cases where the chain leads nowhere.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

import nsys_ledger
from nsys_ledger.attribution.graph_capture import (
    BROKEN_CHAIN,
    NO_CAPTURE_CALL,
    NO_NODE_ROW,
    RESOLVED,
    TOO_LONG,
    capture_origins,
    follow_clone_chains,
    node_creations,
)
from nsys_ledger.report.terminal import render
from nsys_ledger.synth import generate
from nsys_ledger.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())

# kernel graph node -> end of its clone chain -> the runtime call running on that thread then.
# Temp tables with indexes keep the recursive join and the call lookup from scanning.
CHAIN_SETUP = [
    "CREATE TEMP TABLE nodes AS SELECT graphNodeId AS id, originalGraphNodeId AS original, globalTid, start "
    "FROM {node_table}",
    "CREATE INDEX temp.nodes_id ON nodes(id)",
    "CREATE TEMP TABLE calls AS SELECT globalTid, start, end, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME "
    "WHERE eventClass IN (0, 1)",
    "CREATE INDEX temp.calls_thread_start ON calls(globalTid, start)",
]
CHAIN_SQL = """
WITH RECURSIVE
chain(kernel_node, id, links) AS (
    SELECT DISTINCT graphNodeId, graphNodeId, 0 FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT NULL
    UNION ALL
    SELECT chain.kernel_node, nodes.original, chain.links + 1
    FROM chain JOIN nodes ON nodes.id = chain.id WHERE nodes.original IS NOT NULL
),
roots AS (
    SELECT chain.kernel_node, chain.id, chain.links, nodes.globalTid, nodes.start AS created,
           (SELECT c.start FROM calls c WHERE c.globalTid = nodes.globalTid AND c.start <= nodes.start
            ORDER BY c.start DESC LIMIT 1) AS call_start
    FROM chain JOIN nodes ON nodes.id = chain.id WHERE nodes.original IS NULL
)
SELECT roots.kernel_node, roots.id, roots.links, c.start, c.end, s.value
FROM roots
JOIN calls c ON c.globalTid = roots.globalTid AND c.start = roots.call_start AND c.end >= roots.created
JOIN StringIds s ON s.id = c.nameId
"""


def _sql(path: Path, query: str, setup: list[str] = ()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for statement in setup:
            conn.execute(statement)
        return conn.execute(query).fetchall()
    finally:
        conn.close()


def _chains_sql(path: Path, node_table: str) -> list[tuple]:
    return _sql(path, CHAIN_SQL, [statement.format(node_table=node_table) for statement in CHAIN_SETUP])


def _origins(trace) -> pl.DataFrame:
    kernels = trace.kernels.select("pid", "graph_node_id")
    return capture_origins(kernels, trace.graph_nodes, trace.api_calls)


@pytest.mark.parametrize("sample", ["glm5-graph-healthy.sqlite", "glm5-graph-multi-capture.sqlite"])
def test_capture_origins_equal_the_recursive_sql(sample):
    path = SAMPLES / sample
    origins = _origins(load_trace(path))
    ours = sorted(
        origins.select("graph_node_id", "capture_node_id", "clone_links", "capture_call_start",
                       "capture_call_end", "capture_call").iter_rows()
    )
    theirs = sorted(_chains_sql(path, "CUDA_GRAPH_NODE_EVENTS"))
    # the SQL keeps the raw API name (version suffix), the Trace strips it as nsys does
    assert [row[:5] for row in ours] == [row[:5] for row in theirs]
    assert {row[5] for row in ours} == {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx"}
    assert origins["status"].unique().to_list() == [RESOLVED]
    assert origins.height == 2076  # the decode graph's nodes (the sampling kernel runs eagerly)
    assert set(origins["clone_links"]) == {MANIFEST[sample]["clone_links"]}


def test_replays_resolve_to_the_capture_of_their_batch_size():
    """Three graphs were captured (batch 32, 16, 8); the replays must lead to the batch-32 one,
    whose layer-wise NVTX text says so in its inputs."""
    trace = load_trace(SAMPLES / "glm5-graph-multi-capture.sqlite")
    origins = _origins(trace)
    assert MANIFEST["glm5-graph-multi-capture.sqlite"]["captured_batch_sizes"] == [32, 16, 8]
    nvtx = trace.nvtx.filter(pl.col("name").str.contains(r"layers\.41\.self_attn\.o_proj'"))
    # the same module was entered once per capture (3), in the warm-up and in the prefill
    assert nvtx.height == 5
    captured = nvtx.join_asof(
        origins.sort("capture_time").select("capture_time"), left_on="start", right_on="capture_time",
        strategy="forward",
    ).filter(pl.col("capture_time") <= pl.col("end"))
    assert captured["name"].str.extract(r"'Inputs': \[\[(\d+),", 1).to_list() == ["32"]


def test_old_node_table_name_and_long_clone_chains(tmp_path):
    """nsys <= 2023.3 kept the nodes in CUDA_GRAPH_EVENTS; chains of 4 clone links."""
    path = tmp_path / "old.sqlite"
    summary = generate(path, mode="graph", steps=2, nsys_version="2023.3", clone_links=4)
    tables = {row[0] for row in _sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "CUDA_GRAPH_EVENTS" in tables and "CUDA_GRAPH_NODE_EVENTS" not in tables
    origins = _origins(load_trace(path))
    assert set(origins["clone_links"]) == {4}
    assert sorted(origins.select("graph_node_id", "capture_node_id", "clone_links", "capture_call_start").iter_rows()) \
        == sorted(row[:4] for row in _chains_sql(path, "CUDA_GRAPH_EVENTS"))
    result = nsys_ledger.check(path, GLM)
    assert result.layers.kernels_by_how() == {"replay_nvtx": 0, "capture_nvtx": 2 * 2073, "inferred": 0, "none": 8}
    assert summary.step_outside_layer_kernels == 4


def test_nodes_that_resolve_to_nothing_are_counted(tmp_path):
    path = tmp_path / "broken.sqlite"
    shutil.copy(SAMPLES / "glm5-graph-healthy.sqlite", path)
    conn = sqlite3.connect(path)
    kernel_nodes = """SELECT k.graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s
                      ON s.id = k.demangledName WHERE s.value LIKE ? AND k.graphNodeId IS NOT NULL"""
    # the exec node rows of the 21 paged_mqa_logits kernels are gone ...
    conn.execute(f"DELETE FROM CUDA_GRAPH_NODE_EVENTS WHERE graphNodeId IN ({kernel_nodes})", ("%paged_mqa_logits%",))
    # ... and the capture node rows behind the 78 sparse MLA kernels
    conn.execute(
        "DELETE FROM CUDA_GRAPH_NODE_EVENTS WHERE graphNodeId IN (SELECT originalGraphNodeId FROM "
        f"CUDA_GRAPH_NODE_EVENTS WHERE graphNodeId IN ({kernel_nodes}))", ("%splitkv_mla%",),
    )
    conn.commit()
    conn.close()
    result = nsys_ledger.check(path, GLM)
    assert result.layers.unresolved_graph_nodes.rows() == [
        (0, BROKEN_CHAIN, 78, 312),
        (0, NO_NODE_ROW, 21, 84),
    ]
    assert result.layers.kernels_by_how() == {
        "replay_nvtx": 0, "capture_nvtx": 4 * (2073 - 99), "inferred": 0, "none": 4 * (4 + 99),
    }
    text = render(result, width=1000)  # unwrapped: the sentences whole
    assert "312 graph kernels (78 nodes) without a capture origin: " + BROKEN_CHAIN in text
    assert "84 graph kernels (21 nodes) without a capture origin: " + NO_NODE_ROW in text
    # every layer then lacks its sparse MLA kernel (13 attention kernels, still inside 12-16)
    attention = result.layers.counts.filter(pl.col("group") == "attention")
    assert attention["count"].unique().to_list() == [13]
    assert attention.height == 4 * 78


def test_no_capturing_call_falls_back_to_the_node_instant():
    """Without the launch calls made during capture, the node's creation time still finds the
    NVTX ranges open on its thread, so the layers stay right."""
    trace = load_trace(SAMPLES / "glm5-graph-healthy.sqlite")
    begin = trace.api_calls.filter(pl.col("name") == "cudaStreamBeginCapture")["start"].min()
    end = trace.api_calls.filter(pl.col("name") == "cudaStreamEndCapture")["end"].max()
    during_capture = pl.col("start").is_between(begin, end) & (pl.col("kind") == "kernel_launch")
    without = dataclasses.replace(trace, api_calls=trace.api_calls.filter(~during_capture))
    result = nsys_ledger.check(without, GLM)
    assert result.layers.unresolved_graph_nodes.rows() == [(0, NO_CAPTURE_CALL, 2076, 8304)]
    assert result.layers.kernels_by_how()["capture_nvtx"] == 4 * 2073
    per_layer = result.layers.counts.group_by("step", "layer").agg(pl.col("count").sum()).sort("step", "layer")
    truth = MANIFEST["glm5-graph-healthy.sqlite"]["step_layer_kernels"]
    assert per_layer.filter(pl.col("step") == 0)["count"].to_list() == truth


def test_clone_chain_cycles_and_gaps_stop():
    nodes = pl.DataFrame(
        {"pid": [1] * 5, "graph_node_id": [10, 11, 20, 21, 30], "original_graph_node_id": [11, 10, 21, None, 99],
         "global_tid": [7] * 5, "start": [100, 101, 102, 103, 104], "event_class": [77] * 5},
    )
    wanted = pl.DataFrame({"pid": [1, 1, 1, 1], "graph_node_id": [10, 20, 30, 40]})
    chains = follow_clone_chains(wanted, node_creations(nodes)).sort("graph_node_id")
    assert chains.select("graph_node_id", "capture_node_id", "clone_links", "status").rows() == [
        (10, None, 33, TOO_LONG),
        (20, 21, 1, RESOLVED),
        (30, None, 1, BROKEN_CHAIN),
        (40, None, 0, NO_NODE_ROW),
    ]
