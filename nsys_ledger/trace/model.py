"""The Trace: every reader produces one, every later stage reads only this.

All times are integer nanoseconds on the trace's own clock. Names are already resolved to
text (no StringIds left). Column names are snake_case and fixed by the schemas below, so a
stage downstream never needs to know which nsys version wrote the file.

Process and thread ids follow nsys's `globalTid` packing (`<HW:8><VM:8><PID:24><TID:24>`):
`pid = (globalTid >> 24) & 0xFFFFFF`, `tid = globalTid & 0xFFFFFF`. GPU rows carry
`global_pid` (the TID bits are zero), CPU rows `global_tid`; `pid` is on both so that a GPU
row and its launching call join on `(pid, correlation)`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

I64 = pl.Int64
STR = pl.Utf8

KERNEL_SCHEMA = {
    "start": I64,
    "end": I64,
    "device": I64,
    "stream": I64,
    "global_pid": I64,
    "pid": I64,
    "correlation": I64,
    "name": STR,  # demangled name (nsys `demangledName`)
    "short_name": STR,
    "graph_node_id": I64,  # null for eager kernels
    "graph_id": I64,  # null before nsys 2025.5 or for eager kernels
}

# kind: what the call submits to the GPU. Used for the "CPU submissions" column of the ledger.
API_KINDS = ("kernel_launch", "graph_launch", "memcpy", "memset", "sync", "graph_capture", "other")
API_SCHEMA = {
    "start": I64,
    "end": I64,
    "global_tid": I64,
    "pid": I64,
    "tid": I64,
    "correlation": I64,
    "name": STR,  # version suffix `_vNNNNN` stripped, as nsys does
    "event_class": I64,  # 0 runtime, 1 driver
    "kind": STR,  # one of API_KINDS
}

MEMCPY_SCHEMA = {
    "start": I64,
    "end": I64,
    "device": I64,
    "stream": I64,
    "global_pid": I64,
    "pid": I64,
    "correlation": I64,
    "bytes": I64,
    "copy_kind": STR,  # "HtoD", "DtoH", "DtoD", ... (ENUM_CUDA_MEMCPY_OPER labels, short form)
    "src_kind": STR,  # "Pageable", "Pinned", "Device", ... (ENUM_CUDA_MEM_KIND)
    "dst_kind": STR,
    "graph_node_id": I64,
}

MEMSET_SCHEMA = {
    "start": I64,
    "end": I64,
    "device": I64,
    "stream": I64,
    "global_pid": I64,
    "pid": I64,
    "correlation": I64,
    "bytes": I64,
    "mem_kind": STR,
    "graph_node_id": I64,
}

SYNC_SCHEMA = {
    "start": I64,
    "end": I64,
    "device": I64,
    "stream": I64,
    "global_pid": I64,
    "pid": I64,
    "correlation": I64,
    "sync_type": STR,  # "Event sync", "Stream wait event", "Stream sync", "Context sync", "Unknown"
}

# Only ranges: push/pop (eventType 59) and start/end (60). Marks, categories and domain
# creation rows are not ranges; domain names are resolved into `domain`.
NVTX_SCHEMA = {
    "start": I64,
    "end": I64,  # null when the range was still open when the capture stopped
    "global_tid": I64,
    "pid": I64,
    "tid": I64,
    "end_global_tid": I64,  # null unless a start/end range ended on another thread
    "event_type": I64,  # 59 push/pop, 60 start/end
    "name": STR,
    "domain": STR,  # null for the default domain
}

# CUDA_GRAPH_NODE_EVENTS (CUDA_GRAPH_EVENTS in nsys <= 2023.3): node creation and cloning.
GRAPH_NODE_SCHEMA = {
    "start": I64,
    "end": I64,
    "global_tid": I64,
    "pid": I64,
    "tid": I64,
    "event_class": I64,
    "name": STR,  # the creating API call
    "graph_node_id": I64,
    "original_graph_node_id": I64,  # null for nodes created during capture
}

# CUPTI_ACTIVITY_KIND_GRAPH_TRACE: one row per replay in `--cuda-graph-trace=graph` captures.
GRAPH_REPLAY_SCHEMA = {
    "start": I64,
    "end": I64,
    "device": I64,
    "stream": I64,
    "global_pid": I64,
    "pid": I64,
    "correlation": I64,
    "graph_id": I64,
    "graph_exec_id": I64,
}

DEVICE_SCHEMA = {
    "device": I64,
    "name": STR,
    "sm_count": I64,
    "total_memory": I64,
    "compute_capability": STR,  # "9.0"
}

OVERHEAD_SCHEMA = {
    "start": I64,
    "end": I64,
    "global_tid": I64,
    "pid": I64,
}

FRAME_SCHEMAS: dict[str, dict[str, pl.DataType]] = {
    "kernels": KERNEL_SCHEMA,
    "api_calls": API_SCHEMA,
    "memcpys": MEMCPY_SCHEMA,
    "memsets": MEMSET_SCHEMA,
    "syncs": SYNC_SCHEMA,
    "nvtx": NVTX_SCHEMA,
    "graph_nodes": GRAPH_NODE_SCHEMA,
    "graph_replays": GRAPH_REPLAY_SCHEMA,
    "devices": DEVICE_SCHEMA,
    "profiler_overhead": OVERHEAD_SCHEMA,
}


def empty_frame(kind: str) -> pl.DataFrame:
    """An empty frame with the columns and types of `kind` (a key of FRAME_SCHEMAS)."""
    return pl.DataFrame(schema=FRAME_SCHEMAS[kind])


@dataclass(frozen=True)
class TraceMeta:
    nsys_version: str | None  # "2026.2.1.210"; None when the export does not say
    schema_version: str | None  # "3.25.0"
    version_source: str  # "META_DATA_EXPORT", "EXPORT_META_DATA" or "none"
    # "node", "graph" or None (not recorded). From META_DATA_CAPTURE when present, else
    # inferred: GRAPH_TRACE rows mean "graph", kernels with graphNodeId mean "node".
    cuda_graph_trace: str | None
    warnings: tuple[str, ...] = ()
    # The process group rank and size a PyTorch profiler trace records (`distributedInfo`);
    # None for nsys exports, which do not know them.
    rank: int | None = None
    world_size: int | None = None


@dataclass(frozen=True)
class Trace:
    path: str
    meta: TraceMeta
    kernels: pl.DataFrame = field(default_factory=lambda: empty_frame("kernels"))
    api_calls: pl.DataFrame = field(default_factory=lambda: empty_frame("api_calls"))
    memcpys: pl.DataFrame = field(default_factory=lambda: empty_frame("memcpys"))
    memsets: pl.DataFrame = field(default_factory=lambda: empty_frame("memsets"))
    syncs: pl.DataFrame = field(default_factory=lambda: empty_frame("syncs"))
    nvtx: pl.DataFrame = field(default_factory=lambda: empty_frame("nvtx"))
    graph_nodes: pl.DataFrame = field(default_factory=lambda: empty_frame("graph_nodes"))
    graph_replays: pl.DataFrame = field(default_factory=lambda: empty_frame("graph_replays"))
    devices: pl.DataFrame = field(default_factory=lambda: empty_frame("devices"))
    profiler_overhead: pl.DataFrame = field(default_factory=lambda: empty_frame("profiler_overhead"))
