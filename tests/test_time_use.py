"""Where the step time goes (checks/time_use.py), against plain SQL over the samples and the
real exports, plain JSON over a real PyTorch profiler trace, and hand-drawn timelines.

The oracles share no code with the checker: steps are taken as the checker found them (their
host windows), and everything inside a step is summed here from the raw tables, joined on
nsys's own rule (activity.correlationId = call.correlationId in the same process)."""

from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
from functools import cache
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

from nsys_ledger.api import check
from nsys_ledger.checks.time_use import communication, distinct_labels, function_label, top_kernels, union_ns
from nsys_ledger.cli import main
from nsys_ledger.report.json_report import result_document
from nsys_ledger.report.terminal import render

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
GLM = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"
REAL = Path(os.environ.get("NSYS_LEDGER_REAL_TRACES") or REPO.parent / "shared" / "real_traces")
NSYS_AI = REAL / "GindaChen__nsys-ai__h100_2gpu_1s.sqlite"
QWEN_DECODE = REAL / "kineto" / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
NCCL = REAL / "kineto" / "HTA__nccl_parser_config__nccl_data.json.gz"
needs_real = pytest.mark.skipif(not all(p.is_file() for p in (NSYS_AI, QWEN_DECODE, NCCL)),
                                reason="real traces not found (../shared/real_traces)")

# collectives as the test reads them: NCCL, SGLang's custom all-reduce, DeepEP
COLLECTIVE = re.compile(r"(?i)nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|deep_ep::")


@cache
def checked(name: str, expect: bool = True, **options):
    return check(SAMPLES / name if not name.startswith("/") else name, GLM if expect else None, **options)


def _sql(path: Path, query: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


# activities of a step: launched by a runtime call inside the step's host window, same process
_IN_STEP = (
    "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId "
    "AND (r.globalTid >> 24) = (a.globalPid >> 24) WHERE r.start BETWEEN ? AND ?"
)


def _windows(result) -> list[tuple[int, int, int, int]]:
    return result.step_table.select("rank", "step", "host_start", "host_end").rows()


def _union(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _intersection(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Length of (∪a) ∩ (∪b), by walking both merged lists."""
    def merged(intervals):
        out: list[list[int]] = []
        for start, end in sorted(intervals):
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        return out

    x, y, i, j, total = merged(a), merged(b), 0, 0, 0
    while i < len(x) and j < len(y):
        total += max(0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


# ---- the graph sample: every per-step figure against SQL -------------------------------------


def test_graph_sample_step_time_against_sql():
    path = SAMPLES / "glm5-graph-healthy.sqlite"
    result = checked("glm5-graph-healthy.sqlite")
    steps = result.time_use.steps
    assert steps.height == 4
    for rank, step, low, high in _windows(result):
        mine = steps.filter((pl.col("rank") == rank) & (pl.col("step") == step)).row(0, named=True)
        kernels = _sql(path, 'SELECT a.start, a."end", s.value FROM CUPTI_ACTIVITY_KIND_KERNEL a '
                       f"JOIN StringIds s ON s.id = a.demangledName {_IN_STEP}", (low, high))
        copies = _sql(path, f'SELECT a.start, a."end" FROM CUPTI_ACTIVITY_KIND_MEMCPY a {_IN_STEP}', (low, high))
        assert mine["kernels"] == len(kernels) == 2077
        assert mine["kernel_ns"] == sum(e - s for s, e, _ in kernels)
        assert mine["busy_ns"] == _union([(s, e) for s, e, _ in kernels] + copies)
        comm = [(s, e) for s, e, n in kernels if COLLECTIVE.search(n)]
        compute = [(s, e) for s, e, n in kernels if not COLLECTIVE.search(n)]
        assert mine["collective_ns"] == _union(comm)
        assert mine["overlapped_ns"] == _intersection(comm, compute) == 0  # one stream at a time here
        assert mine["exposed_ns"] == mine["collective_ns"]
        launches = _sql(
            path, "SELECT count(*), sum(r.\"end\" - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
            "ON s.id = r.nameId WHERE r.start BETWEEN ? AND ? AND (s.value GLOB 'cudaLaunchKernel*' OR s.value "
            "GLOB 'cudaGraphLaunch*' OR s.value GLOB 'cudaMemcpy*' OR s.value GLOB 'cudaMemset*')", (low, high))[0]
        assert (mine["launch_calls"], mine["launch_host_ns"]) == launches
    # the literal figures of step 0
    first = steps.row(0, named=True)
    assert (first["kernels"], first["kernel_ns"], first["busy_ns"]) == (2077, 28859943, 28480717)
    assert (first["launch_calls"], first["launch_host_ns"], first["collective_ns"]) == (5, 24030, 3480262)


def test_graph_sample_time_per_kernel_name_and_op_against_sql():
    path = SAMPLES / "glm5-graph-healthy.sqlite"
    result = checked("glm5-graph-healthy.sqlite")
    _, _, low, _ = _windows(result)[0]
    high = _windows(result)[-1][3]
    per_name = dict(_sql(path, 'SELECT s.value, sum(a."end" - a.start) FROM CUPTI_ACTIVITY_KIND_KERNEL a '
                         f"JOIN StringIds s ON s.id = a.demangledName {_IN_STEP} GROUP BY 1", (low, high)))
    kernels = result.time_use.kernels
    assert dict(kernels.select("name", "kernel_ns").iter_rows()) == per_name
    top = top_kernels(result.time_use, 3)
    assert top["kernel_ns"].to_list() == sorted(per_name.values(), reverse=True)[:3] == [49828463, 25844057, 6602258]
    assert top["per_step_ns"].to_list() == [12457116, 6461014, 1650564]
    # an op's time is the time of the kernel names it claims, step by step
    ops = result.time_use.ops
    for op in ("moe_gemm", "fused_add_rmsnorm", "sparse_mla"):
        names = kernels.filter(pl.col("op") == op)["name"].to_list()
        assert ops.filter(pl.col("op") == op)["kernel_ns"].sum() == sum(per_name[n] for n in names)
    _, _, low, high = _windows(result)[0]
    moe_names = kernels.filter(pl.col("op") == "moe_gemm")["name"].to_list()
    step0 = _sql(path, 'SELECT count(*), sum(a."end" - a.start) FROM CUPTI_ACTIVITY_KIND_KERNEL a JOIN StringIds s '
                 f"ON s.id = a.demangledName {_IN_STEP} AND s.value IN ({','.join('?' * len(moe_names))})",
                 (low, high, *moe_names))[0]
    moe = ops.filter((pl.col("op") == "moe_gemm") & (pl.col("step") == 0)).row(0, named=True)
    assert (moe["kernels"], moe["kernel_ns"]) == step0 == (150, 19004845)
    assert moe["share"] == pytest.approx(19004845 / 28480717)
    # the deepep group is DeepEP's dispatch and combine kernels
    deepep = _sql(path, 'SELECT count(*), sum(a."end" - a.start) FROM CUPTI_ACTIVITY_KIND_KERNEL a JOIN StringIds s '
                  f"ON s.id = a.demangledName {_IN_STEP} AND s.value GLOB '*deep_ep::*'", (low, high))[0]
    group = result.time_use.groups.filter((pl.col("group") == "deepep") & (pl.col("step") == 0))
    assert group.select("kernels", "kernel_ns").row(0) == deepep == (150, 3005434)


def test_graph_sample_launch_delay_and_copies_against_sql():
    path = SAMPLES / "glm5-graph-healthy.sqlite"
    result = checked("glm5-graph-healthy.sqlite")
    delay = result.time_use.launch_delay
    copies = result.time_use.copies
    for rank, step, low, high in _windows(result):
        replays = _sql(path, "SELECT min(a.start) - r.start FROM CUPTI_ACTIVITY_KIND_KERNEL a JOIN "
                       "CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = a.correlationId AND (r.globalTid >> 24) "
                       "= (a.globalPid >> 24) JOIN StringIds s ON s.id = r.nameId WHERE r.start BETWEEN ? AND ? "
                       "AND s.value GLOB 'cudaGraphLaunch*' GROUP BY r.correlationId", (low, high))
        graph = delay.filter((pl.col("step") == step) & (pl.col("mode") == "graph")).row(0, named=True)
        assert (graph["count"], graph["min_ns"], graph["max_ns"]) == (len(replays), min(replays)[0], max(replays)[0])
        h2d = _sql(path, f'SELECT count(*), sum(a.bytes), sum(a."end" - a.start) FROM CUPTI_ACTIVITY_KIND_MEMCPY a '
                   f"{_IN_STEP} AND a.copyKind = 1", (low, high))[0]
        mine = copies.filter((pl.col("step") == step) & (pl.col("kind") == "HtoD"))
        assert mine.select("count", "bytes", "time_ns").row(0) == h2d
    assert delay.filter(pl.col("mode") == "graph")["min_ns"].to_list() == [9312, 9211, 9121, 9617]
    assert copies.filter(pl.col("step") == 0).select("kind", "count", "bytes").rows() == [
        ("HtoD", 3, 8960), ("DtoH", 0, 0), ("DtoD", 0, 0), ("PtoP", 0, 0), ("memset", 0, 0)]
    assert result.time_use.streams.select("device", "streams").rows() == [(0, 2)]


def test_eager_sample_launch_delay_per_kernel_against_sql():
    path = SAMPLES / "glm5-eager-healthy.sqlite"
    result = checked("glm5-eager-healthy.sqlite")
    eager = result.time_use.launch_delay.filter(pl.col("mode") == "eager")
    assert eager["count"].to_list() == [2077] * 4
    for rank, step, low, high in _windows(result):
        delays = sorted(d for (d,) in _sql(path, "SELECT a.start - r.start FROM CUPTI_ACTIVITY_KIND_KERNEL a "
                                              f"{_IN_STEP}", (low, high)))
        mine = eager.filter(pl.col("step") == step).row(0, named=True)
        assert (mine["count"], mine["min_ns"], mine["max_ns"]) == (len(delays), delays[0], delays[-1])
        assert mine["mean_ns"] == round(sum(delays) / len(delays))
    steps = result.time_use.steps
    assert steps["launch_calls"].to_list() == [2080] * 4  # eager: a launch call per kernel, plus the copies


def test_layer_time_of_the_faulty_layer():
    """glm5-graph-layer41: layer 41 launches one extra kernel per step; its time is the time of
    the kernels that the layer attribution put in it, and every layered kernel counts once."""
    healthy = checked("glm5-graph-healthy.sqlite").time_use.layers
    result = checked("glm5-graph-layer41.sqlite")
    faulty = result.time_use.layers
    assert healthy.filter(pl.col("layer") == 41)["kernels"].to_list() == [25] * 4
    assert faulty.filter(pl.col("layer") == 41)["kernels"].to_list() == [26] * 4
    assert faulty.filter(pl.col("layer") == 40)["kernels"].to_list() == [25] * 4
    assert faulty.filter(pl.col("step") == 0)["layer"].to_list() == list(range(78))
    kernels = result.steps.activities.filter(pl.col("decode") & (pl.col("activity") == "kernel")).join(
        result.layers.assignments.select("row", "layer"), on="row")
    layer41 = kernels.filter((pl.col("step") == 0) & (pl.col("layer") == 41))
    mine = faulty.filter((pl.col("step") == 0) & (pl.col("layer") == 41)).row(0, named=True)
    assert mine["kernel_ns"] == int((layer41["end"] - layer41["start"]).sum()) == 384853


# ---- hand-drawn timelines ----------------------------------------------------------------------


def test_overlap_of_a_collective_with_compute():
    """compute |==0-100==|    |==150-300==|
       nccl        |====50-200====|
       collective 150 ns: 50-100 and 150-200 overlapped (100 ns), 100-150 exposed (50 ns)."""
    kernels = pl.DataFrame({
        "rank": [0, 0, 0], "step": [0, 0, 0], "activity": ["kernel"] * 3, "start": [0, 150, 50],
        "end": [100, 300, 200], "name": ["gemm", "gemm", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"],
    })
    assert communication(kernels).rows() == [(0, 0, 150, 100, 50)]
    assert union_ns(kernels, ["rank", "step"]).rows() == [(0, 0, 300)]



def test_union_per_step_of_interleaved_rows_and_of_a_text_key():
    """Rows of several steps interleaved, out of start order: rank 0 step 1 is 0-150 and
    400-410 (160 ns), rank 0 step 2 200-300 (100 ns), rank 1 step 1 50-90 (40 ns); the same
    with a text key (compare's step kinds), which takes the unpacked path."""
    intervals = pl.DataFrame({
        "rank": [0, 1, 0, 0, 1, 0, 0], "step": [1, 1, 1, 2, 1, 2, 1],
        "start": [0, 50, 50, 200, 70, 250, 400], "end": [100, 80, 150, 300, 90, 260, 410],
    })
    assert union_ns(intervals, ["rank", "step"]).rows() == [(0, 1, 160), (0, 2, 100), (1, 1, 40)]
    named = intervals.with_columns(pl.format("s{}", "step").alias("kind"))
    assert union_ns(named, ["rank", "kind"]).rows() == [(0, "s1", 160), (0, "s2", 100), (1, "s1", 40)]

def test_distinct_labels_for_names_that_shorten_alike():
    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >"
        "(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, "
        "3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)",
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
        "true>(int)",
    ]
    assert len(set(distinct_labels(names))) == 3  # at the default 60 characters too
    labels = distinct_labels(names, 100)
    assert labels == [
        "at::native::vectorized_elementwise_kernel<…, FillFunctor<float>, array<char*, 1ul>>",
        "at::native::vectorized_elementwise_kernel<…, CUDAFunctor_add<float>, array<char*, 3ul>>",
        "at::native::(anon)::indexSelectLargeIndex",
    ]
    assert function_label("void (anonymous namespace)::elementwise_kernel_with_index<int>(int)") == \
        "(anon)::elementwise_kernel_with_index"


# ---- reports -----------------------------------------------------------------------------------


def test_terminal_block_fits_100_columns_and_reads_the_figures():
    result = checked("glm5-graph-healthy.sqlite")
    text = click.unstyle(render(result))
    block = text.split("where the time goes")[1].split("\n\n")[0]
    assert "(median per decode step over 4 steps):" in block
    assert all(len(line) <= 100 for line in block.splitlines())
    assert "CPU submission 5 launch calls" in block
    assert "GPU execution 2,077 kernels" in block
    assert "0 us overlapped with compute" in block
    assert "HtoD 3 (8,960 B, 4.1 us)" in block
    assert "device 0: 2 streams" in block
    assert "78 layers" in block
    # the ops by role (ledger.roles): bmm's 601 us is the role mla_absorb
    assert "roles     moe_gemm 18,918 us (66.6%)" in block and "mla_absorb 601 us" in block
    top = block.split("one row per kernel name):\n")[1].splitlines()
    assert len(top) == 8 and len({line.split("x  ")[1] for line in top}) == 8
    assert top[0].split()[:2] == ["12,457", "us"]
    assert ".0 " not in block.replace("4.1 us", "")  # counts print as integers


def test_json_time_use_section_matches_the_frames():
    result = checked("glm5-graph-healthy.sqlite")
    doc = json.loads(json.dumps(result_document(result)))
    assert doc["schema_version"] == "2.1"
    section = doc["time_use"]
    assert section["steps_total"] == 4
    first = section["steps"][0]
    assert (first["rank"], first["step"], first["kernels"], first["kernel_ns"]) == (0, 0, 2077, 28859943)
    assert first["ops"]["moe_gemm"] == {"kernels": 150, "ns": 19004845, "share": round(19004845 / 28480717, 4)}
    # by role (ledger.roles): the two MLA absorption ops (bmm) are one role, every kernel has a role
    assert first["roles"]["moe_gemm"]["kernels"] == 150 and first["roles"]["mla_absorb"]["kernels"] == 156
    assert sum(r["kernels"] for r in first["roles"].values()) == 2077 and "(no role)" not in first["roles"]
    assert section["top_kernels"][0]["role"] == "moe_gemm"
    assert first["copies"]["HtoD"] == {"count": 3, "bytes": 8960, "ns": 3885}
    assert first["launch_delay"]["graph"]["count"] == 1
    assert set(first["layers"]) == {str(n) for n in range(78)}
    assert sum(g["ns"] for g in first["groups"].values()) == 28859943
    assert section["top_kernels"][0]["kernel_ns"] == 49828463
    assert section["streams"] == [{"rank": 0, "pid": 2841, "device": 0, "streams": 2}]


# ---- real exports ------------------------------------------------------------------------------


@needs_real
def test_real_two_gpu_export_time_against_sql():
    """nsys-ai's 2-GPU export, each process's capture taken as one step."""
    result = checked(str(NSYS_AI), expect=False, step_method="capture")
    use = result.time_use
    per_pid = _sql(NSYS_AI, 'SELECT globalPid >> 24, count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL '
                   "GROUP BY 1 ORDER BY 1")
    assert use.steps.select("kernels", "kernel_ns").rows() == [(n, ns) for _, n, ns in per_pid]
    assert use.steps.select("kernels", "kernel_ns").rows() == [(1721, 22385163), (1721, 22444359)]
    copies = use.copies.group_by("kind").agg(pl.col("count", "bytes", "time_ns").sum())
    kinds = {1: "HtoD", 2: "DtoH", 8: "DtoD"}
    for kind, n, moved, ns in _sql(NSYS_AI, 'SELECT copyKind, count(*), sum(bytes), sum("end" - start) '
                                   "FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY 1"):
        assert copies.filter(pl.col("kind") == kinds[kind]).select("count", "bytes", "time_ns").row(0) == (n, moved, ns)
    memset = _sql(NSYS_AI, 'SELECT count(*), sum(bytes), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMSET')[0]
    assert copies.filter(pl.col("kind") == "memset").select("count", "bytes", "time_ns").row(0) == memset == (
        22, 17672, 29216)
    streams = _sql(NSYS_AI, "SELECT deviceId, count(DISTINCT streamId) FROM (SELECT deviceId, streamId FROM "
                   "CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                   "UNION ALL SELECT deviceId, streamId FROM CUPTI_ACTIVITY_KIND_MEMSET) GROUP BY 1 ORDER BY 1")
    assert use.streams.select("device", "streams").rows() == streams
    per_name = _sql(NSYS_AI, 'SELECT s.value, sum(k."end" - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN '
                    "StringIds s ON s.id = k.demangledName GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 10")
    top = top_kernels(use, 10)
    assert top.select("name", "kernel_ns").rows() == per_name
    assert top["label"].n_unique() == 10  # ten distinct rows, none of them `at::native::::`
    assert not any("::::" in label for label in top["label"])
    delays = sorted(d for (d,) in _sql(
        NSYS_AI, "SELECT k.start - r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON "
        "r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)"))
    eager = use.launch_delay.filter(pl.col("mode") == "eager")
    assert eager["count"].sum() == len(delays) == 1632
    assert (eager["min_ns"].min(), eager["max_ns"].max()) == (delays[0], delays[-1])


@needs_real
def test_real_export_terminal_lists_distinct_kernels_within_100_columns():
    out = CliRunner().invoke(main, ["check", str(NSYS_AI), "--step-method", "capture"])
    text = click.unstyle(out.output)
    block = text.split("where the time goes")[1].split("\n\n")[0]
    assert all(len(line) <= 100 for line in block.splitlines())
    assert "copies    HtoD 225 (25,475,253,792 B" in block  # the median of the two ranks' 225 copies
    top = block.split("one row per kernel name):\n")[1].splitlines()
    assert len({line.split("x  ")[1] for line in top}) == len(top) == 8
    assert "::::" not in text


def _kineto_events(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return json.load(handle)["traceEvents"]


@needs_real
def test_real_kineto_decode_step_time_against_json():
    """SGLang Qwen3-8B decode (TraceLens's fixture): one step; every kernel and copy in it."""
    result = checked(str(QWEN_DECODE), expect=False)
    use = result.time_use
    events = _kineto_events(QWEN_DECODE)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    step = use.steps.row(0, named=True)
    assert step["kernels"] == len(kernels)
    assert step["kernel_ns"] == sum(round(e["dur"] * 1000) for e in kernels)
    copies = [e for e in events if e.get("cat") == "gpu_memcpy"]
    by_kind = {"DtoH": 0, "DtoD": 0}
    for e in copies:
        by_kind[e["name"].split()[1]] += 1
    mine = dict(use.copies.select("kind", "count").iter_rows())
    assert (mine["DtoH"], mine["DtoD"]) == (by_kind["DtoH"], by_kind["DtoD"]) == (1, 2)
    assert use.streams.select("streams").item() == len({e["args"]["stream"] for e in kernels + copies}) == 2


@needs_real
def test_real_kineto_nccl_collective_time_against_json():
    """HTA's NCCL fixture: collective time per step is the union of the NCCL kernels launched,
    on any thread, during the step's ProfilerStep range; the overlapped part its intersection
    with the other kernels launched then (DDP overlaps all-reduce with backward)."""
    result = checked(str(NCCL), expect=False)
    use = result.time_use
    events = _kineto_events(NCCL)
    steps = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert use.steps.height == len(steps) == 3
    launches = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    kernels = [e for e in events if e.get("cat") == "kernel"]

    def interval(e: dict) -> tuple[int, int]:
        start = round(e["ts"] * 1000)
        return start, start + round(e["dur"] * 1000)

    for (low, high), row in zip(steps, use.steps.iter_rows(named=True)):
        inside = [e for e in kernels if low <= launches.get(e["args"]["correlation"], -1) <= high]
        comm = [interval(e) for e in inside if COLLECTIVE.search(e["name"])]
        compute = [interval(e) for e in inside if not COLLECTIVE.search(e["name"])]
        assert row["collective_ns"] == _union(comm)
        assert row["overlapped_ns"] == _intersection(comm, compute)
        assert row["exposed_ns"] == row["collective_ns"] - row["overlapped_ns"]
    assert use.steps["overlapped_ns"].to_list() == [1825259, 1760420, 3731346]
    # 15 of the 21 NCCL kernels come from DDP's own thread, outside the step's range, and count
    assert use.steps["collective_ns"].to_list() == [11989021, 12300029, 22587443]


def test_a_kernel_without_a_name_gets_a_label_not_a_crash():
    """A damaged export can leave a kernel's name id unresolved (the fuzzer's case 5836, a
    parquetdir with swapped tables): its time still counts, under `(no name)`."""
    assert distinct_labels([None, "void k<float, 4>(int)"]) == ["(no name)", "k"]
