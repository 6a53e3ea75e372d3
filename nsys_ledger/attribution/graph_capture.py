"""Capture-time origin of CUDA-graph kernels: which host call, on which thread, created each node.

Under CUDA graphs the host code that issued a kernel ran once, at capture; every replay only
calls `cudaGraphLaunch`. With `--cuda-graph-trace=node` each replayed kernel row carries the
`graphNodeId` of the executable graph's node, and nsys records node creation and cloning in
`CUDA_GRAPH_NODE_EVENTS` (`CUDA_GRAPH_EVENTS` up to nsys 2023.3; the reader merges both into
`Trace.graph_nodes`):

    kernel.graphNodeId -> node row -> originalGraphNodeId -> ... -> the node created during
    stream capture (no original) -> its globalTid and start -> the API call that was running
    on that thread then (the launch captured into the graph) -> the NVTX ranges open then.

Instantiation clones the captured nodes, and clones of clones make chains of several links;
they are followed with a bounded loop of joins over the distinct node ids (thousands, not the
millions of kernel rows), never a recursion per row. Nodes that lead nowhere keep a `status`
saying why, so the report can count them instead of silently dropping them.
"""

from __future__ import annotations

import polars as pl

MAX_CLONE_LINKS = 32  # a longer chain is a cycle or a broken table

RESOLVED = "resolved"
NO_NODE_ROW = "node id not in the graph node table"
BROKEN_CHAIN = "clone chain leads to a node id not in the graph node table"
TOO_LONG = f"clone chain longer than {MAX_CLONE_LINKS} links"
NO_CAPTURE_CALL = "no API call on the capturing thread at the node's creation"

EC_NODE_CREATION = 77  # ENUM_NSYS_EVENT_CLASS: CUDA graph node creation

ORIGIN_SCHEMA = {
    "pid": pl.Int64,
    "graph_node_id": pl.Int64,  # the node id the GPU rows carry
    "capture_node_id": pl.Int64,  # the node created at capture (end of the clone chain)
    "clone_links": pl.Int64,  # links followed (0: the row's node was itself created at capture)
    "capture_tid": pl.Int64,  # globalTid of the capturing thread
    "capture_time": pl.Int64,  # when the capture node was created
    "capture_call_start": pl.Int64,  # the capturing API call's interval (the node instant if none)
    "capture_call_end": pl.Int64,
    "capture_call": pl.Utf8,  # its name, e.g. cudaLaunchKernel
    "status": pl.Utf8,  # RESOLVED or why not
}


def node_creations(graph_nodes: pl.DataFrame) -> pl.DataFrame:
    """One row per (pid, graph_node_id): its creation (eventClass 77 first, then the earliest)."""
    return (
        graph_nodes.filter(pl.col("graph_node_id").is_not_null())
        .sort(pl.col("event_class") != EC_NODE_CREATION, "start", nulls_last=True)
        .unique(subset=["pid", "graph_node_id"], keep="first", maintain_order=True)
        .select("pid", "graph_node_id", "original_graph_node_id", "global_tid", "start")
    )


def capture_origins(node_ids: pl.DataFrame, graph_nodes: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """For each distinct `(pid, graph_node_id)` of `node_ids`: its capture origin (ORIGIN_SCHEMA)."""
    wanted = node_ids.select("pid", "graph_node_id").drop_nulls().unique()
    if wanted.height == 0:
        return pl.DataFrame(schema=ORIGIN_SCHEMA)
    chains = follow_clone_chains(wanted, node_creations(graph_nodes))
    return _with_capture_calls(chains, api_calls).select(list(ORIGIN_SCHEMA))


def follow_clone_chains(wanted: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """Walk `originalGraphNodeId` links until a node without one (created during capture).

    Returns `wanted` + `capture_node_id, clone_links, capture_tid, capture_time, status`.
    One join per link over the chains still open; at most MAX_CLONE_LINKS rounds.
    """
    links = nodes.select("pid", "graph_node_id", "original_graph_node_id", "global_tid", "start")
    state = wanted.with_columns(
        pl.col("graph_node_id").alias("_at"), pl.lit(0, pl.Int64).alias("clone_links")
    )
    done: list[pl.DataFrame] = []
    for _ in range(MAX_CLONE_LINKS + 1):
        step = state.join(
            links.rename({"graph_node_id": "_at"}), on=["pid", "_at"], how="left"
        ).with_columns(pl.col("start").is_not_null().alias("_known"))
        missing = step.filter(~pl.col("_known")).with_columns(
            pl.when(pl.col("clone_links") == 0).then(pl.lit(NO_NODE_ROW)).otherwise(pl.lit(BROKEN_CHAIN)).alias("status")
        )
        roots = step.filter(pl.col("_known") & pl.col("original_graph_node_id").is_null()).with_columns(
            pl.lit(RESOLVED).alias("status")
        )
        done += [_finish(missing, resolved=False), _finish(roots, resolved=True)]
        state = step.filter(pl.col("_known") & pl.col("original_graph_node_id").is_not_null()).select(
            "pid", "graph_node_id", pl.col("original_graph_node_id").alias("_at"),
            (pl.col("clone_links") + 1).alias("clone_links"),
        )
        if state.height == 0:
            break
    if state.height:
        done.append(_finish(state.with_columns(pl.lit(TOO_LONG).alias("status")), resolved=False))
    return pl.concat(done, how="vertical")


def _finish(frame: pl.DataFrame, *, resolved: bool) -> pl.DataFrame:
    none = pl.lit(None, pl.Int64)
    return frame.select(
        "pid",
        "graph_node_id",
        (pl.col("_at") if resolved else none).alias("capture_node_id"),
        "clone_links",
        (pl.col("global_tid") if resolved else none).alias("capture_tid"),
        (pl.col("start") if resolved else none).alias("capture_time"),
        "status",
    )


def _with_capture_calls(chains: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """Add the API call that was running on the capturing thread when each node was created.

    A node created outside any recorded call (a runtime that records nodes lazily) keeps its
    creation instant as the interval and the status NO_CAPTURE_CALL: the NVTX ranges open at
    that instant still tell where it came from.
    """
    resolved = chains.filter(pl.col("status") == RESOLVED).sort("capture_tid", "capture_time")
    calls = (
        api_calls.filter(pl.col("start").is_not_null())
        .select(
            pl.col("global_tid").alias("capture_tid"),
            pl.col("start").alias("capture_call_start"),
            pl.col("end").alias("capture_call_end"),
            pl.col("name").alias("capture_call"),
        )
        .sort("capture_tid", "capture_call_start")
    )
    found = resolved.join_asof(
        calls,
        left_on="capture_time",
        right_on="capture_call_start",
        by="capture_tid",
        strategy="backward",
        check_sortedness=False,
    )
    inside = pl.col("capture_call_end").fill_null(-1) >= pl.col("capture_time")
    found = found.with_columns(
        pl.when(inside).then(pl.col("capture_call_start")).otherwise(pl.col("capture_time")).alias("capture_call_start"),
        pl.when(inside).then(pl.col("capture_call_end")).otherwise(pl.col("capture_time")).alias("capture_call_end"),
        pl.when(inside).then(pl.col("capture_call")).otherwise(None).alias("capture_call"),
        pl.when(inside).then(pl.col("status")).otherwise(pl.lit(NO_CAPTURE_CALL)).alias("status"),
    )
    unresolved = chains.filter(pl.col("status") != RESOLVED).with_columns(
        pl.lit(None, pl.Int64).alias("capture_call_start"),
        pl.lit(None, pl.Int64).alias("capture_call_end"),
        pl.lit(None, pl.Utf8).alias("capture_call"),
    )
    return pl.concat([found.select(unresolved.columns), unresolved], how="vertical")
