"""Exports in every nsys layout from 2021 to 2026: the generator writes each one
(`generate(nsys_version=...)`, `nsys-ledger synth --nsys-version`), and the checker must give the
same per-step figures and verdict on all of them. The table layouts are compared with the real
export of the same era where one is at hand; the era's peculiarities are checked with plain SQL.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

from nsys_ledger import check
from nsys_ledger.cli import main
from nsys_ledger.synth import generate
from nsys_ledger.synth.schema_eras import ERAS_BY_VERSION, era_for_version
from nsys_ledger.trace import load_trace

ROOT = Path(__file__).resolve().parents[1]
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
from shared_data import REAL_TRACES, needs_shared  # noqa: E402
REAL_EXPORT = {
    "2022.2": "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
    "2023.1": "LeiWang1999__memfusion_artifact__report1.sqlite",
    "2024.6": "Sh1mwww__llama3-inference__real_inference_simulation.sqlite",
    "2025.5": "morluto__flameox__nsight-2025.5.2.sqlite",
    "2026.2": "GindaChen__nsys-ai__h100_2gpu_1s.sqlite",
}
# What each era's export says about itself: (EXPORT_PRODUCT_VERSION, schema version, table).
VERSION_FACTS = {
    "2021.3": (None, None, "none"),
    "2022.2": ("2022.2.1.31", "2.9.1", "EXPORT_META_DATA"),
    "2023.1": ("2023.1.2.43", "3.1.2", "EXPORT_META_DATA"),
    "2023.2": ("2023.2", "3.1.2", "EXPORT_META_DATA"),
    "2023.3": ("2023.3", "3.1.2", "META_DATA_EXPORT"),
    "2024.6": ("2024.6.2.225", "3.16.1", "META_DATA_EXPORT"),
    "2025.5": ("2025.5.2.266", "3.24.0", "META_DATA_EXPORT"),
    "2026.2": ("2026.2.1.210", "3.25.0", "META_DATA_EXPORT"),
}
STEPS = 2


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Generate (once per module) a 2-step graph-mode export in the layout of an nsys release."""
    cache: dict[str, tuple[Path, object]] = {}
    base = tmp_path_factory.mktemp("eras")

    def get(version: str, **kw) -> tuple[Path, object]:
        key = version + repr(sorted(kw.items()))
        if key not in cache:
            path = base / f"nsys-{version}-{len(cache)}.sqlite"
            cache[key] = (path, generate(path, steps=STEPS, nsys_version=version, **kw))
        return cache[key]

    return get


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _columns(con: sqlite3.Connection, table: str) -> list[str]:
    return [r[1] for r in con.execute(f"PRAGMA table_info({table})")]


def _layout(con: sqlite3.Connection, table: str) -> list[tuple]:
    """(name, type, notnull, pk) per column; pipit appends a `name TEXT` column to the files it
    reads (ALTER TABLE), which nsys never writes."""
    rows = [(r[1], r[2], r[3], r[5]) for r in con.execute(f"PRAGMA table_info({table})")]
    return [r for r in rows if r != ("name", "TEXT", 0, 0) or table in ("ThreadNames", "PROCESSES",
                                                                           "TARGET_INFO_GPU")]


# ---- the checker gives the same answer in every layout -----------------------------------------


@pytest.mark.parametrize("version", list(ERAS_BY_VERSION))
def test_every_layout_checks_the_same(exports, version):
    path, summary = exports(version)
    result = check(path, GLM)
    assert result.verdict == "pass", [f.message for f in result.findings]
    assert result.step_table["kernels"].to_list() == [2077, 2077]
    anchors = result.op_table.select("fused_add_rmsnorm", "sparse_mla", "paged_mqa_logits", "per_token_group_quant")
    assert anchors.rows() == [(156, 78, 21, 75), (156, 78, 21, 75)]
    assert result.step_table["graph_launches"].to_list() == [1, 1]
    assert result.step_table["h2d"].to_list() == [3, 3]
    assert summary.kernels_per_step == 2077
    meta = result.trace.meta
    assert (meta.nsys_version, meta.schema_version, meta.version_source) == VERSION_FACTS[version]
    assert meta.cuda_graph_trace == "node"
    assert meta.warnings == ()
    assert result.trace.devices.select("device", "name", "sm_count", "compute_capability").rows() == [
        (0, "NVIDIA H200", 132, "9.0")]
    # every capture-time node and every exec clone is in the node frame, whatever its table
    nodes = result.trace.graph_nodes
    assert nodes.filter(nodes["original_graph_node_id"].is_null()).height == summary.capture_nodes == 2076
    assert nodes.filter(nodes["original_graph_node_id"].is_not_null()).height == 2076


@pytest.mark.parametrize("version, fault, source, observed", [
    ("2021", "broken_fusion", "anchors.per_token_group_quant", 231),
    ("2022", "chunked_indexer", "anchors.paged_mqa_logits", 63),
    ("2023.1", "broken_fusion", "anchors.per_token_group_quant", 231),
])
def test_faults_are_found_in_old_layouts(exports, version, fault, source, observed):
    path, _ = exports(version, faults=(fault,))
    result = check(path, GLM)
    assert result.verdict == "fail"
    assert [f.source for f in result.findings if f.check == "anchor"] == [source]
    assert f"{observed} per step" in result.findings[0].message
    # the per-layer ledger names the layers too: capture-time attribution works in every layout
    per_layer = [f.layers for f in result.findings if f.check in ("layer", "layer_sequence")]
    assert per_layer == {"broken_fusion": ["0-2", "1-2", "3-77", "3-77"],
                         "chunked_indexer": ["0-2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62, 66, "
                                             "70, 74"]}[fault]


def test_eager_2021_with_driver_launches_checks(exports):
    path, summary = exports("2021", mode="eager", step_nvtx=True)
    result = check(path, GLM)
    assert result.steps.method == "marker"
    assert result.step_table["kernels"].to_list() == [2077, 2077]
    assert result.step_table["cpu_submissions"].to_list() == [2077 + 3, 2077 + 3]
    # as in the 2026 eager sample: every count is right, the GPU waits for the host
    assert {f.check for f in result.findings} == {"gaps"}
    assert summary.launch_calls_per_step == 2077


# ---- what makes each era different, in plain SQL ------------------------------------------------


def test_2021_layout(exports):
    path, _ = exports("2021")
    con = _ro(path)
    tables = _tables(con)
    assert "mangledName" not in _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert "demangledName" in _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert not tables & {"META_DATA_EXPORT", "EXPORT_META_DATA", "META_DATA_CAPTURE", "TARGET_INFO_GPU"}
    assert not [t for t in tables if t.startswith("ENUM_")]
    assert con.execute("SELECT deviceId, name, numMultiprocessors FROM TARGET_INFO_CUDA_GPU").fetchall() == [
        (0, "NVIDIA H200", 132)]
    launches = dict(con.execute(
        "SELECT s.value, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value LIKE '%Launch%' GROUP BY s.value"))
    # warm-up 2076 + capture 2076 + prefill + per step the sampling kernel: all through the driver
    assert set(launches) == {"cuLaunchKernel", "cuGraphLaunch"}
    assert launches["cuGraphLaunch"] == STEPS
    assert con.execute("SELECT DISTINCT r.eventClass FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                       "ON s.id = r.nameId WHERE s.value LIKE 'cu%Launch%'").fetchall() == [(1,)]


def test_2022_backtrace_rows_duplicate_every_runtime_call_and_are_dropped(exports):
    path, _ = exports("2022")
    con = _ro(path)
    by_class = dict(con.execute("SELECT eventClass, count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME GROUP BY 1"))
    assert by_class[67] == by_class[0] > 5000
    # each duplicate shares its call's correlationId, names it without the _vNNNN suffix and
    # spans it, as in the real 2022.2 export
    unmatched = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME b JOIN StringIds bn ON bn.id = b.nameId "
        "WHERE b.eventClass = 67 AND NOT EXISTS (SELECT 1 FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
        "JOIN StringIds rn ON rn.id = r.nameId WHERE r.eventClass = 0 AND r.correlationId = b.correlationId "
        "AND r.globalTid = b.globalTid AND b.start < r.start AND b.end > r.end "
        "AND (rn.value = bn.value || substr(rn.value, length(bn.value) + 1)) AND rn.value LIKE bn.value || '_v%')"
    ).fetchone()[0]
    assert unmatched == 0
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE eventClass = 67 "
                       "AND callchainId NOT IN (SELECT id FROM CUDA_CALLCHAINS)").fetchone()[0] == 0
    assert not [t for t in _tables(con) if t.startswith("ENUM_")]
    trace = load_trace(path)
    assert trace.api_calls.height == by_class[0] + by_class[1]
    assert set(trace.api_calls["event_class"].unique()) == {0, 1}


@pytest.mark.parametrize("version", ["2022", "2023.1", "2023.2", "2023.3"])
def test_node_table_is_cuda_graph_events_up_to_2023_3(exports, version):
    path, _ = exports(version)
    con = _ro(path)
    assert "CUDA_GRAPH_NODE_EVENTS" not in _tables(con)
    assert _columns(con, "CUDA_GRAPH_EVENTS") == ["start", "end", "eventClass", "globalTid", "nameId",
                                                  "graphNodeId", "originalGraphNodeId"]
    assert con.execute("SELECT count(*) FROM CUDA_GRAPH_EVENTS").fetchone()[0] == 2 * 2076


@pytest.mark.parametrize("version, green, graph_id, copy_count", [
    ("2023.3", False, False, False),
    ("2024", True, False, False),
    ("2025", True, True, True),
    ("2026", True, True, True),
])
def test_columns_added_from_2024(exports, version, green, graph_id, copy_count):
    path, _ = exports(version)
    con = _ro(path)
    kernel = _columns(con, "CUPTI_ACTIVITY_KIND_KERNEL")
    assert ("greenContextId" in kernel, "graphId" in kernel) == (green, graph_id)
    assert ("copyCount" in _columns(con, "CUPTI_ACTIVITY_KIND_MEMCPY")) == copy_count
    if version >= "2024":
        assert {"CUDA_GRAPH_NODE_EVENTS", "CUDA_GRAPH_EVENTS", "META_DATA_CAPTURE"} <= _tables(con)
        assert _columns(con, "CUDA_GRAPH_EVENTS")[5:] == ["graphId", "originalGraphId", "graphExecId"]
    replayed = load_trace(path).kernels.filter(pl.col("graph_node_id").is_not_null())
    assert replayed.height == STEPS * 2076
    assert replayed["graph_id"].null_count() == (0 if graph_id else replayed.height)


@needs_shared(REAL_TRACES)
@pytest.mark.parametrize("release", list(REAL_EXPORT))
def test_layouts_match_the_real_export_of_the_era(exports, release):
    path, _ = exports(release)
    ours, real = _ro(path), _ro(REAL_TRACES / REAL_EXPORT[release])
    shared = sorted(_tables(ours) & _tables(real))
    assert len(shared) >= {"2022.2": 12, "2023.1": 14, "2024.6": 14, "2025.5": 17, "2026.2": 14}[release]
    for table in shared:
        assert _layout(ours, table) == _layout(real, table), table


# ---- version handling -----------------------------------------------------------------------------


@pytest.mark.parametrize("text, name", [("2021", "nsys-2021.3"), ("2022.2", "nsys-2022.2"),
                                        ("2024.6.2.225", "nsys-2024.6"), (" 2026 ", "nsys-2026.2")])
def test_era_for_version(text, name):
    assert era_for_version(text).name == name


@pytest.mark.parametrize("text, message", [("2023", "2023.1, 2023.2 or 2023.3"), ("2019.1", "known: 2021.3")])
def test_era_for_unknown_version(text, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        era_for_version(text)


def test_graph_level_traces_need_a_2024_layout(tmp_path):
    with pytest.raises(ValueError, match="2024"):
        generate(tmp_path / "x.sqlite", steps=1, nsys_version="2022", cuda_graph_trace="graph")


def test_synth_cli_writes_the_layout(tmp_path):
    out = tmp_path / "old.sqlite"
    result = CliRunner().invoke(main, ["synth", str(out), "--steps", "1", "--nsys-version", "2023.2"])
    assert result.exit_code == 0, result.output
    assert "EXPORT_META_DATA" in _tables(_ro(out))
    bad = CliRunner().invoke(main, ["synth", str(out), "--nsys-version", "2023"])
    assert bad.exit_code == 2
    assert "2023.1, 2023.2 or 2023.3" in bad.output


def test_a_newer_schema_warns_once_and_continues(exports, tmp_path):
    src, _ = exports("2026")
    future = tmp_path / "future.sqlite"
    future.write_bytes(src.read_bytes())
    con = sqlite3.connect(future)
    con.execute("UPDATE META_DATA_EXPORT SET value = '4.0.0' WHERE name = 'EXPORT_SCHEMA_VERSION'")
    con.execute("UPDATE META_DATA_EXPORT SET value = '4' WHERE name = 'EXPORT_SCHEMA_VERSION_MAJOR'")
    con.commit()
    con.close()
    out = tmp_path / "r.json"
    result = CliRunner().invoke(main, ["check", str(future), "--expect", str(GLM), "--json", str(out)])
    assert result.exit_code == 0, result.output
    warning = "schema version 4.0.0 is newer than tested; continuing"
    assert result.output.count(warning) == 1
    assert "PASS" in result.output
    assert json.loads(out.read_text())["notices"].count(warning) == 1
