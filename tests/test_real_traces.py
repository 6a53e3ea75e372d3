"""The importer against five real Nsight Systems exports (nsys 2022.2 - 2026.2).

Every number the Trace gives is checked against plain SQL over the same file, opened
read-only here; numbers stated in ../shared/real_traces/README.md are also asserted
literally. The files are read-only inputs: their sha256 must not change.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

import polars as pl
import pytest

from nsys_ledger.trace import Trace, load_trace
from nsys_ledger.trace.model import FRAME_SCHEMAS

REPO = Path(__file__).resolve().parents[1]


from shared_data import REAL_TRACES as TRACES_DIR, skip_without_shared  # noqa: E402

FILES = sorted(TRACES_DIR.glob("*.sqlite")) if TRACES_DIR.is_dir() else []

# File-name prefix -> facts stated in the README (and checked by SQL below).
NSYS_AI = "GindaChen__nsys-ai"
MEMFUSION = "LeiWang1999__memfusion_artifact"
LLAMA3 = "Sh1mwww__llama3-inference"
PIPIT = "hpcgroup__pipit"
FLAMEOX = "morluto__flameox"

VERSIONS = {
    NSYS_AI: ("2026.2.1.210", "3.25.0", "META_DATA_EXPORT", "graph"),
    MEMFUSION: ("2023.1.2.43", "3.1.2", "EXPORT_META_DATA", None),
    LLAMA3: ("2024.6.2.225", "3.16.1", "META_DATA_EXPORT", "graph"),
    PIPIT: ("2022.2.1.31", "2.9.1", "EXPORT_META_DATA", None),
    FLAMEOX: ("2025.5.2.266", "3.24.0", "META_DATA_EXPORT", "graph"),
}

LAUNCH_GLOBS = (
    "cudaLaunchKernel*", "cudaLaunchCooperativeKernel*", "cuLaunchKernel*",
    "cuLaunchCooperativeKernel*", "cudaLaunch", "cudaLaunch_v*",
)
GRAPH_LAUNCH_GLOBS = ("cudaGraphLaunch*", "cuGraphLaunch*")


def _params():
    if not FILES:
        return [pytest.param(None, id="no-real-traces")]
    return [pytest.param(p, id=p.name.split("__")[0] + "/" + p.name.split("__")[1]) for p in FILES]


@pytest.fixture(params=_params())
def path(request) -> Path:
    if request.param is None:
        skip_without_shared()
    return request.param


def _which(path: Path) -> str | None:
    for key in VERSIONS:
        if path.name.startswith(key):
            return key
    return None


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.lru_cache(maxsize=None)
def _load(path: Path) -> tuple[Trace, str, str]:
    before = _sha256(path)
    trace = load_trace(path)
    return trace, before, _sha256(path)


def _sql(path: Path, query: str, params: tuple = ()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def _one(path: Path, query: str, params: tuple = ()) -> int:
    return _sql(path, query, params)[0][0]


def _has_table(path: Path, table: str) -> bool:
    query = "SELECT count(*) FROM sqlite_master WHERE type='table' AND name=?"
    return bool(_one(path, query, (table,)))


def _count(path: Path, table: str, where: str = "1") -> int:
    if not _has_table(path, table):
        return 0
    return _one(path, f"SELECT count(*) FROM {table} WHERE {where}")


def _api_name_count(path: Path, globs: tuple[str, ...]) -> int:
    cond = " OR ".join("s.value GLOB ?" for _ in globs)
    return _one(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        f"WHERE r.eventClass IN (0, 1) AND ({cond})",
        globs,
    )


# --------------------------------------------------------------------------------------
# Checks that hold for every file
# --------------------------------------------------------------------------------------


def test_file_bytes_unchanged(path):
    _, before, after = _load(path)
    assert before == after


def test_frames_have_the_model_schemas(path):
    trace, _, _ = _load(path)
    assert trace.path == str(path)
    for kind, schema in FRAME_SCHEMAS.items():
        assert dict(getattr(trace, kind).schema) == schema, kind


def test_version_detection(path):
    trace, _, _ = _load(path)
    key = _which(path)
    if key is None:
        pytest.skip("no known version for this file")
    nsys, schema, source, graph_mode = VERSIONS[key]
    assert trace.meta.nsys_version == nsys
    assert trace.meta.schema_version == schema
    assert trace.meta.version_source == source
    assert trace.meta.cuda_graph_trace == graph_mode
    assert trace.meta.warnings == ()


def test_kernels_per_device(path):
    trace, _, _ = _load(path)
    expected = dict(
        _sql(path, "SELECT deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1")
    )
    got = dict(trace.kernels.group_by("device").len().iter_rows())
    assert got == expected
    durations = dict(
        _sql(path, 'SELECT deviceId, sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY 1')
    )
    got_d = dict(
        trace.kernels.group_by("device")
        .agg((pl.col("end") - pl.col("start")).sum())
        .iter_rows()
    )
    assert got_d == durations


def test_kernel_names_resolved(path):
    trace, _, _ = _load(path)
    assert trace.kernels["name"].null_count() == 0
    assert trace.kernels["short_name"].null_count() == 0
    expected = dict(
        _sql(
            path,
            "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN StringIds s ON s.id = k.demangledName GROUP BY 1",
        )
    )
    assert dict(trace.kernels.group_by("name").len().iter_rows()) == expected


def test_memcpy_counts(path):
    trace, _, _ = _load(path)
    m = trace.memcpys
    t = "CUPTI_ACTIVITY_KIND_MEMCPY"
    assert m.height == _count(path, t)
    assert m.filter(pl.col("copy_kind") == "HtoD").height == _count(path, t, "copyKind = 1")
    assert m.filter(
        (pl.col("copy_kind") == "HtoD") & (pl.col("src_kind") == "Pageable")
    ).height == _count(path, t, "copyKind = 1 AND srcKind = 0")
    assert m.filter(
        (pl.col("copy_kind") == "HtoD") & (pl.col("src_kind") == "Pinned")
    ).height == _count(path, t, "copyKind = 1 AND srcKind = 1")
    assert m.filter(pl.col("copy_kind") == "DtoD").height == _count(path, t, "copyKind = 8")
    if m.height:
        assert m["bytes"].sum() == _one(path, f"SELECT sum(bytes) FROM {t}")


def test_memset_and_sync_counts(path):
    trace, _, _ = _load(path)
    assert trace.memsets.height == _count(path, "CUPTI_ACTIVITY_KIND_MEMSET")
    assert trace.syncs.height == _count(path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    assert trace.syncs.filter(pl.col("sync_type") == "Stream sync").height == _count(
        path, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "syncType = 3"
    )


def test_nvtx_ranges(path):
    trace, _, _ = _load(path)
    n = trace.nvtx
    t = "NVTX_EVENTS"
    assert n.filter(pl.col("event_type") == 59).height == _count(path, t, "eventType = 59")
    assert n.filter(pl.col("event_type") == 60).height == _count(path, t, "eventType = 60")
    assert n["end"].null_count() == _count(path, t, 'eventType IN (59, 60) AND "end" IS NULL')
    assert n["name"].null_count() == 0


def test_api_calls(path):
    trace, _, _ = _load(path)
    a = trace.api_calls
    t = "CUPTI_ACTIVITY_KIND_RUNTIME"
    assert a.height == _count(path, t, "eventClass <> 67")
    assert set(a["event_class"].unique()) <= {0, 1}
    assert a.filter(pl.col("kind") == "kernel_launch").height == _api_name_count(path, LAUNCH_GLOBS)
    graph_launches = _api_name_count(path, GRAPH_LAUNCH_GLOBS)
    assert a.filter(pl.col("kind") == "graph_launch").height == graph_launches
    assert not a["name"].str.contains(r"_v\d{4,}$").any()
    assert a["name"].null_count() == 0


def test_kernel_to_launch_join(path):
    """Our pid/correlation columns join kernels to launches as the SQL bit arithmetic does."""
    trace, _, _ = _load(path)
    joined = trace.kernels.join(
        trace.api_calls.select("pid", "correlation", "kind"), on=["pid", "correlation"], how="inner"
    )
    expected = _one(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid & -16777216) "
        "WHERE r.eventClass IN (0, 1)",
    )
    assert joined.height == expected
    assert set(joined["kind"].unique()) <= {"kernel_launch", "graph_launch"}


def test_graph_replays(path):
    trace, _, _ = _load(path)
    assert trace.graph_replays.height == _count(path, "CUPTI_ACTIVITY_KIND_GRAPH_TRACE")
    replay_launches = trace.graph_replays.join(
        trace.api_calls, on=["pid", "correlation"], how="left"
    )
    assert (replay_launches["kind"] == "graph_launch").all()


def test_devices_and_overhead(path):
    trace, _, _ = _load(path)
    kernel_devices = set(trace.kernels["device"].unique())
    assert kernel_devices <= set(trace.devices["device"])
    if _has_table(path, "TARGET_INFO_GPU"):
        assert trace.devices.height == _one(path, "SELECT count(DISTINCT id) FROM TARGET_INFO_GPU")
        assert trace.devices["name"].null_count() == 0
    assert trace.profiler_overhead.height == _count(path, "PROFILER_OVERHEAD")


# --------------------------------------------------------------------------------------
# Literal numbers from the README, per file
# --------------------------------------------------------------------------------------


def _find(prefix: str) -> Path:
    for p in FILES:
        if p.name.startswith(prefix):
            return p
    skip_without_shared()


def test_nsys_ai_h100():
    p = _find(NSYS_AI)
    trace, _, _ = _load(p)
    assert trace.kernels.height == 3442
    assert dict(trace.kernels.group_by("device").len().iter_rows()) == {0: 1721, 1: 1721}
    m = trace.memcpys
    assert m.height == 904
    counts = dict(m.group_by("copy_kind", "src_kind").len().select(
        pl.concat_str("copy_kind", "src_kind", separator="/"), "len").iter_rows())
    assert counts == {"HtoD/Pageable": 4, "HtoD/Pinned": 446, "DtoH/Device": 4, "DtoD/Device": 450}
    assert trace.memsets.height == 22
    assert trace.syncs.height == 244
    assert trace.nvtx.height == 16782
    # The README says "16782 `aten::` ranges"; in fact 16542 are aten::, 236 FSDP::, 4 detach_.
    names = trace.nvtx["name"]
    assert names.str.starts_with("aten::").sum() == 16542
    assert names.str.starts_with("FSDP::").sum() == 236
    assert names.str.starts_with("detach_").sum() == 4
    assert trace.nvtx["domain"].null_count() == 16782
    # StringIds pruned and TARGET_INFO_GPU absent: devices come from the kernels, unnamed.
    assert trace.devices["device"].to_list() == [0, 1]
    assert trace.devices["name"].null_count() == 2
    # A 1 s window: the GPU runs behind the CPU, so many launches lie before the window.
    launched = trace.kernels.join(trace.api_calls, on=["pid", "correlation"], how="semi")
    assert launched.height == 1632


def test_pipit_saxpy():
    p = _find(PIPIT)
    trace, _, _ = _load(p)
    assert trace.kernels.height == 5
    assert trace.memcpys.height == 15
    assert _count(p, "CUPTI_ACTIVITY_KIND_RUNTIME") == 95
    assert _count(p, "CUPTI_ACTIVITY_KIND_RUNTIME", "eventClass = 67") == 38
    assert trace.api_calls.height == 57
    assert trace.api_calls.filter(pl.col("kind") == "kernel_launch").height == 5
    assert trace.api_calls.filter(pl.col("kind") == "memcpy").height == 15
    # 24 NVTX rows: 22 push/pop ranges, one domain creation, one thread name.
    assert trace.nvtx.height == 22
    by_domain = dict(trace.nvtx.group_by("domain").len().iter_rows())
    assert by_domain == {"MPI": 17, None: 5}
    assert set(trace.nvtx.filter(pl.col("domain").is_null())["name"]) == {"saxpy"}
    assert trace.devices.row(0, named=True) == {
        "device": 0, "name": "NVIDIA A100-SXM4-40GB", "sm_count": 108,
        "total_memory": 42297524224, "compute_capability": "8.0",
    }
    # The 2022 CUDA_GRAPH_EVENTS table is the node table (graphNodeId columns), empty here.
    assert trace.graph_nodes.height == 0


def test_memfusion_report1():
    p = _find(MEMFUSION)
    trace, _, _ = _load(p)
    assert trace.kernels.height == 36
    launches = trace.api_calls.filter(pl.col("kind") == "kernel_launch")
    assert dict(launches.group_by("name").len().iter_rows()) == {
        "cuLaunchKernelEx": 22, "cudaLaunchKernel": 14,
    }
    assert dict(launches.group_by("event_class").len().iter_rows()) == {1: 22, 0: 14}
    assert trace.memcpys["copy_kind"].to_list() == ["DtoD"] * 4
    assert trace.nvtx.height == 59
    assert set(trace.nvtx["domain"]) == {"TensorRT"}
    assert trace.devices.height == 4
    assert set(trace.devices["compute_capability"]) == {"8.6"}


def test_llama3_inference():
    p = _find(LLAMA3)
    trace, _, _ = _load(p)
    assert trace.kernels.height == 1536
    assert trace.memsets.height == 512
    assert trace.nvtx.height == 1601
    assert trace.nvtx.filter(pl.col("event_type") == 59).height == 1601
    assert trace.nvtx["domain"].null_count() == 1601
    assert trace.nvtx.filter(pl.col("name") == "layer_processing_simulation").height == 1
    assert trace.api_calls.filter(pl.col("kind") == "kernel_launch").height == 1536
    # cudaDeviceSynchronize rows: 512 syncs recorded with syncType 0 (Unknown).
    assert dict(trace.syncs.group_by("sync_type").len().iter_rows()) == {"Unknown": 512}


def test_flameox_graph_trace():
    p = _find(FLAMEOX)
    trace, _, _ = _load(p)
    assert trace.kernels.height == 3
    assert trace.meta.cuda_graph_trace == "graph"
    r = trace.graph_replays
    assert r.height == 2
    assert r.select("graph_id", "graph_exec_id").unique().rows() == [(1, 2)]
    assert trace.api_calls.filter(pl.col("kind") == "graph_launch").height == 2
    assert trace.api_calls.filter(pl.col("kind") == "graph_capture")["name"].sort().to_list() == [
        "cudaGraphInstantiate", "cudaStreamBeginCapture", "cudaStreamEndCapture",
    ]
    # CUDA_GRAPH_EVENTS holds graph-level rows here (graphId, no graphNodeId): not nodes.
    assert _count(p, "CUDA_GRAPH_EVENTS") == 4
    assert trace.graph_nodes.height == 0
    assert trace.nvtx.height == 0
    # Graph replays are not kernels: no kernel carries a graph node id.
    assert trace.kernels["graph_node_id"].null_count() == 3
