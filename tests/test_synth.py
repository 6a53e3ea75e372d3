"""The synthetic trace generator: schema fidelity, graph bookkeeping, per-step counts, timing.

Every check here is plain SQL or plain Python over the written file; the generator's summary is
used as the truth it claims, and the file must agree with it. Counts are literal numbers from
the reference ledger (glm-decode-ledger.md), not read back from the schedule module.
"""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from nsys_ledger.synth import FAULTS, GAP_SITES, generate

from shared_data import REAL_TRACES, REFERENCE, needs_shared  # noqa: E402
REAL_2026 = REAL_TRACES / "GindaChen__nsys-ai__h100_2gpu_1s.sqlite"
REAL_2025 = REAL_TRACES / "morluto__flameox__nsight-2025.5.2.sqlite"
SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"

STEPS = 3
LAUNCH_NAMES = ("cudaLaunchKernel_v7000", "cudaLaunchKernelExC_v11060", "cuLaunchKernelEx",
                "cuLaunchKernel")


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    """Generate (once per module) and open traces by configuration name."""
    cache: dict[str, tuple] = {}
    base = tmp_path_factory.mktemp("synth")

    def get(name: str, **kw):
        if name not in cache:
            path = base / f"{name}.sqlite"
            kw.setdefault("steps", STEPS)
            summary = generate(path, **kw)
            cache[name] = (path, summary)
        return cache[name]

    return get


@pytest.fixture(scope="module")
def healthy(gen):
    return gen("graph-healthy", mode="graph")


def _api_rows(con, names):
    q = ("SELECT r.start, r.end, r.globalTid, r.correlationId, s.value FROM "
         "CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
         f"WHERE s.value IN ({','.join('?' * len(names))}) AND r.eventClass IN (0, 1)")
    return con.execute(q, names).fetchall()


def _graph_launches(con):
    return sorted(_api_rows(con, ("cudaGraphLaunch_v10000",)))


def _kernels_by_corr(con, corr, gpid):
    return con.execute(
        "SELECT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
        "ON s.id = k.demangledName "
        "WHERE k.correlationId = ? AND k.globalPid = ?", (corr, gpid)).fetchall()


def _per_launch_counts(path):
    """Per cudaGraphLaunch: Counter of demangled kernel names of the kernels it fanned out to."""
    con = _ro(path)
    out = []
    for _s, _e, gtid, corr, _n in _graph_launches(con):
        gpid = gtid & 0xFFFFFFFFFF000000
        out.append(Counter(r[0] for r in _kernels_by_corr(con, corr, gpid)))
    con.close()
    return out


def _count(c: Counter, pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(v for k, v in c.items() if rx.search(k))


# --------------------------------------------------------------------------------------------
# (a) schema fidelity
# --------------------------------------------------------------------------------------------
def _table_info(con, table):
    return [(r[1], r[2], r[3], r[5]) for r in con.execute(f"PRAGMA table_info({table})")]


def _tables(con):
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


@needs_shared(REAL_2026)
@pytest.mark.parametrize("config", ["graph-healthy", "eager", "graph-level"])
def test_tables_match_real_exports(gen, config):
    kw = {"graph-healthy": {"mode": "graph"}, "eager": {"mode": "eager", "step_nvtx": True},
          "graph-level": {"mode": "graph", "cuda_graph_trace": "graph"}}[config]
    path, _ = gen(config, **kw)
    ours = _ro(path)
    reals = [_ro(REAL_2026)] + ([_ro(REAL_2025)] if REAL_2025.exists() else [])
    compared = 0
    for table in sorted(_tables(ours)):
        for real in reals:
            if table in _tables(real):
                assert _table_info(ours, table) == _table_info(real, table), table
                compared += 1
                break
        else:
            assert table == "CUDA_GRAPH_NODE_EVENTS", f"{table} is in no real export"
            assert [c[:2] for c in _table_info(ours, table)] == [
                ("start", "INTEGER"), ("end", "INTEGER"), ("eventClass", "INTEGER"),
                ("globalTid", "INTEGER"), ("nameId", "INTEGER"), ("graphNodeId", "INTEGER"),
                ("originalGraphNodeId", "INTEGER")]
    assert compared >= 30
    # the ENUM tables carry the real rows
    real = reals[0]
    for table in ("ENUM_NSYS_EVENT_CLASS", "ENUM_CUDA_MEMCPY_OPER", "ENUM_CUDA_MEM_KIND"):
        assert ours.execute(f"SELECT * FROM {table} ORDER BY id").fetchall() == \
            real.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()


def test_meta_and_ids_look_like_nsys(healthy):
    path, s = healthy
    con = _ro(path)
    meta = dict(con.execute("SELECT name, value FROM META_DATA_EXPORT"))
    assert meta["EXPORT_PRODUCT_VERSION"] == "2026.2.1.210"
    assert meta["EXPORT_SCHEMA_VERSION"] == "3.25.0"
    assert meta["EXPORT_PARAM_INPUT_FILE"] == "nsys-ledger-synth"
    cap = dict(con.execute("SELECT name, value FROM META_DATA_CAPTURE"))
    assert cap["PROCESS_0:CUDA_GRAPH_TRACE_OPTIONS:MODE"] == "Node"
    assert cap["CUDA_GRAPH_TRACE_OPTIONS:MODE"] == "Node"
    # globalTid = <HW 0><VM 1><pid 24><tid 24>; GPU rows carry globalPid (tid bits zero)
    (gtid,) = con.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()
    assert gtid >> 48 == 1 and (gtid >> 24) & 0xFFFFFF == s.pids[0]
    gpids = {r[0] for r in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    assert gpids == {gtid & 0xFFFFFFFFFF000000}
    assert con.execute("SELECT name FROM PROCESSES WHERE pid = ?", (s.pids[0],)).fetchone()
    gpu = con.execute("SELECT name, smCount, computeMajor, computeMinor, totalMemory "
                      "FROM TARGET_INFO_GPU").fetchall()
    assert gpu == [("NVIDIA H200", 132, 9, 0, 150_754_820_096)]
    # every name column resolves through StringIds
    assert con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k LEFT JOIN StringIds s "
        "ON s.id = k.demangledName WHERE s.id IS NULL").fetchone() == (0,)


# --------------------------------------------------------------------------------------------
# (b) graph-mode bookkeeping
# --------------------------------------------------------------------------------------------
def test_one_graph_launch_per_step_and_correlation(healthy):
    path, s = healthy
    con = _ro(path)
    launches = _graph_launches(con)
    assert len(launches) == STEPS == s.steps
    assert all(len(t.graph_launch_correlation_ids) == 1 for t in s.step_truth)
    launch_corr = {(gtid & 0xFFFFFFFFFF000000, corr) for _s, _e, gtid, corr, _n in launches}
    graph_kernels = con.execute(
        "SELECT globalPid, correlationId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "WHERE graphNodeId IS NOT NULL GROUP BY 1, 2").fetchall()
    assert {(g, c) for g, c, _n in graph_kernels} == launch_corr
    assert [n for _g, _c, n in graph_kernels] == [2076] * STEPS
    # graph kernels carry the graph id of the captured graph (CUDA_GRAPH_EVENTS 95 / 94)
    (gid,) = con.execute("SELECT DISTINCT graphId FROM CUPTI_ACTIVITY_KIND_KERNEL "
                         "WHERE graphNodeId IS NOT NULL").fetchone()
    (exec_gid,) = con.execute("SELECT graphId FROM CUDA_GRAPH_EVENTS WHERE eventClass = 94"
                              ).fetchone()
    assert gid == exec_gid
    # eager kernels (prefill, warm-up, sampling) have their own launch call each
    eager = con.execute("SELECT count(*), count(DISTINCT correlationId) FROM "
                        "CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NULL").fetchone()
    assert eager[0] == eager[1]


def test_graph_nodes_lead_back_to_capture_launches(healthy):
    path, _ = healthy
    con = _ro(path)
    nodes = {n: (st, ec, tid, orig) for st, ec, tid, n, orig in con.execute(
        "SELECT start, eventClass, globalTid, graphNodeId, originalGraphNodeId "
        "FROM CUDA_GRAPH_NODE_EVENTS")}
    launches = defaultdict(list)
    for st, en, tid, _c, _n in _api_rows(con, LAUNCH_NAMES):
        launches[tid].append((st, en))
    begin = _api_rows(con, ("cudaStreamBeginCapture_v10000",))
    end = _api_rows(con, ("cudaStreamEndCapture_v10000",))
    assert len(begin) == len(end) == 1
    cap_lo, cap_hi, cap_tid = begin[0][0], end[0][1], begin[0][2]
    # no kernel executes during capture
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE start BETWEEN ? "
                       "AND ?", (cap_lo, cap_hi)).fetchone() == (0,)
    starts = {tid: sorted(v) for tid, v in launches.items()}
    kernel_nodes = [r[0] for r in con.execute(
        "SELECT DISTINCT graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "WHERE graphNodeId IS NOT NULL")]
    assert len(kernel_nodes) == 2076
    for nid in kernel_nodes:
        seen = set()
        cur = nid
        while nodes[cur][3] is not None:  # follow the clone chain
            assert cur not in seen
            seen.add(cur)
            cur = nodes[cur][3]
        assert seen, "a replayed node must be a clone of a capture node"
        st, ec, tid, _ = nodes[cur]
        assert ec == 77 and tid == cap_tid and cap_lo <= st <= cap_hi
        calls = starts[tid]
        i = bisect.bisect_right(calls, (st, 1 << 62)) - 1
        assert i >= 0 and calls[i][0] <= st <= calls[i][1], "node not inside a launch call"


def test_capture_time_nvtx_names_the_layer(healthy):
    """The capture node of every graph kernel lies inside the layerwise NVTX range of its layer:
    paged_mqa_logits replays map to exactly the 21 full indexer layers."""
    path, _ = healthy
    con = _ro(path)
    orig = dict(con.execute("SELECT graphNodeId, originalGraphNodeId FROM CUDA_GRAPH_NODE_EVENTS"))
    node_start = dict(con.execute("SELECT graphNodeId, start FROM CUDA_GRAPH_NODE_EVENTS"))
    ranges = con.execute("SELECT start, end, text FROM NVTX_EVENTS WHERE eventType = 59").fetchall()
    rx = re.compile(r"'Module': 'model\.model\.layers\.(\d+)\.")
    layer_ranges = sorted((s, e, int(m.group(1))) for s, e, t in ranges if (m := rx.search(t)))
    rows = con.execute(
        "SELECT DISTINCT k.graphNodeId FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
        "ON s.id = k.demangledName WHERE s.value LIKE '%sm90_fp8_paged_mqa_logits%' "
        "AND k.graphNodeId IS NOT NULL").fetchall()
    layers = []
    for (nid,) in rows:
        cap = orig[nid]
        while orig[cap] is not None:
            cap = orig[cap]
        t = node_start[cap]
        inside = {L for s, e, L in layer_ranges if s <= t <= e}
        assert len(inside) == 1
        layers.append(inside.pop())
    assert sorted(layers) == [0, 1, 2] + list(range(6, 75, 4))


# --------------------------------------------------------------------------------------------
# (c) per-step counts
# --------------------------------------------------------------------------------------------
FUSED = r"FusedAddRMSNormKernel<"
SPARSE_MLA = r"flash_fwd_splitkv_mla_fp8_sparse_kernel"
PAGED_LOGITS = r"sm90_fp8_paged_mqa_logits"
GROUP_QUANT = r"per_token_group_quant_8bit_kernel"


def test_healthy_step_counts(healthy):
    path, s = healthy
    for c in _per_launch_counts(path):
        total = sum(c.values()) + 1  # + the eager sampling kernel
        assert 1800 <= total <= 2200
        assert total == 2077
        assert _count(c, FUSED) == 156
        assert _count(c, SPARSE_MLA) == 78
        assert _count(c, PAGED_LOGITS) == 21
        assert _count(c, GROUP_QUANT) == 75
        assert _count(c, r"cross_device_reduce_1stage") == 78
        assert _count(c, r"deep_ep::internode_ll::(dispatch|combine)") == 150
        assert _count(c, r"TopKTopPSamplingFromProbKernel") == 0  # sampling is not in the graph
    assert s.kernels_per_step == 2077
    assert s.step_group_counts == {"attention": 1092, "indexer": 147, "moe": 675, "deepep": 150,
                                   "dense_mlp": 9, "outside": 4}
    con = _ro(path)
    n_sampling = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
        "k.demangledName WHERE s.value LIKE '%TopKTopPSamplingFromProbKernel%' "
        "AND k.graphNodeId IS NULL").fetchone()[0]
    assert n_sampling == STEPS + 1  # one per decode step + the prefill's


def test_broken_fusion_adds_one_quant_per_norm(gen, healthy):
    path, s = gen("broken-fusion", faults=("broken_fusion",))
    base = _per_launch_counts(healthy[0])[0]
    for c in _per_launch_counts(path):
        assert _count(c, GROUP_QUANT) - _count(base, GROUP_QUANT) == 156
        assert _count(c, FUSED) == 156
    assert s.kernels_per_step == 2077 + 156


def test_chunked_indexer_triples_logits(gen):
    path, s = gen("chunked-indexer", faults=("chunked_indexer",))
    for c in _per_launch_counts(path):
        assert _count(c, PAGED_LOGITS) == 63
    assert s.step_short_counts["sm90_fp8_paged_mqa_logits"] == 63


def test_layer_fault_adds_one_kernel(gen):
    path, s = gen("layer41", faults=("layer_fault",))
    for c in _per_launch_counts(path):
        assert sum(c.values()) == 2077
    assert s.kernels_per_step == 2078


def test_split_graph_two_launches_every_kernel_once(gen, healthy):
    path, s = gen("split", faults=("split_graph",))
    con = _ro(path)
    assert len(_graph_launches(con)) == 2 * STEPS
    counts = _per_launch_counts(path)
    per_step = [counts[i] + counts[i + 1] for i in range(0, len(counts), 2)]
    base = _per_launch_counts(healthy[0])[0]
    assert all(c == base for c in per_step)
    assert con.execute("SELECT count(*) FROM CUDA_GRAPH_EVENTS WHERE eventClass = 94"
                       ).fetchone() == (2,)
    assert s.h2d_per_step == 4


# --------------------------------------------------------------------------------------------
# (d) determinism
# --------------------------------------------------------------------------------------------
def _kernel_rows(path):
    con = _ro(path)
    rows = con.execute("SELECT k.*, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                       "ON s.id = k.demangledName ORDER BY k.start, k.streamId").fetchall()
    con.close()
    return rows


def test_same_seed_same_rows(tmp_path):
    a = generate(tmp_path / "a.sqlite", steps=2, seed=7, faults=("extra_gaps",))
    b = generate(tmp_path / "b.sqlite", steps=2, seed=7, faults=("extra_gaps",))
    c = generate(tmp_path / "c.sqlite", steps=2, seed=8, faults=("extra_gaps",))
    ra, rb, rc = (_kernel_rows(tmp_path / f"{x}.sqlite") for x in "abc")
    assert ra == rb
    assert ra != rc
    assert a.step_truth == b.step_truth and a.injected_gaps == b.injected_gaps
    assert len(ra) == len(rc)
    assert c.kernels_per_step == a.kernels_per_step


# --------------------------------------------------------------------------------------------
# (e) timing
# --------------------------------------------------------------------------------------------
def _gpu_intervals(con, gpid):
    rows = con.execute(
        "SELECT start, end, 'k', correlationId, graphNodeId, demangledName FROM "
        "CUPTI_ACTIVITY_KIND_KERNEL WHERE globalPid = ? UNION ALL SELECT start, end, 'c', "
        "correlationId, NULL, NULL FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE globalPid = ?",
        (gpid, gpid)).fetchall()
    return sorted(rows)


def _step_windows(con, gpid):
    """[first H2D start, sampling end] per decode step, found from the trace alone: a step's
    window opens at the first copy after the previous sampling kernel and closes at the first
    sampling kernel after its graph kernels."""
    (sampling_id,) = con.execute("SELECT id FROM StringIds WHERE value LIKE "
                                 "'%TopKTopPSamplingFromProbKernel%'").fetchone()
    acts = _gpu_intervals(con, gpid)
    samplings = [(s, e) for s, e, kind, _c, _n, name in acts if name == sampling_id]
    launches = [c for _s, _e, gtid, c, _n in _graph_launches(con)
                if gtid & 0xFFFFFFFFFF000000 == gpid]
    windows = []
    for corr in launches:
        gk = [(s, e) for s, e, kind, c, _n, _nm in acts if kind == "k" and c == corr]
        g0 = min(s for s, _ in gk)
        prev_end = max([e for s, e in samplings if e <= g0], default=0)
        first_copy = min(s for s, e, kind, *_ in acts if kind == "c" and prev_end <= s < g0)
        end = min(e for s, e in samplings if s >= max(e2 for _s2, e2 in gk))
        windows.append((first_copy, end))
    return acts, windows


def _max_idle(acts, lo, hi):
    cur, worst = lo, 0
    for s, e, *_ in acts:
        if e <= lo or s >= hi:
            continue
        if s > cur:
            worst = max(worst, s - cur)
        cur = max(cur, e)
    return worst


def test_healthy_graph_waits_only_for_the_launch(healthy):
    """A healthy graph step idles once, 3-8 us between its last pinned H2D copy and the first
    replayed kernel, because cudaGraphLaunch returns only after the GPU drained the copies;
    inside the replay (up to the sampling kernel) no gap exceeds 2 us."""
    path, s = healthy
    con = _ro(path)
    gpid = (1 << 48) | (s.pids[0] << 24)
    acts, windows = _step_windows(con, gpid)
    launches = {c: (st, en) for st, en, _t, c, _n in _graph_launches(con)}
    assert len(windows) == STEPS
    entry_gaps = []
    for (lo, hi), truth in zip(windows, s.steps_of(0)):
        assert (lo, hi) == (truth.start, truth.end)
        (corr,) = truth.graph_launch_correlation_ids
        first = min(st for st, _e, kind, c, *_ in acts if kind == "k" and c == corr)
        last_copy_end = max(e for st, e, kind, *_ in acts if kind == "c" and lo <= st < first)
        assert 3_000 <= first - last_copy_end <= 8_000
        assert first - last_copy_end == truth.entry_gap_ns
        entry_gaps.append(truth.entry_gap_ns)
        # the launch call returned after the copies had run, shortly before the first node
        launch_start, launch_end = launches[corr]
        assert last_copy_end < launch_end < first
        assert 300 <= first - launch_end <= 900
        assert 7_500 <= launch_end - launch_start <= 9_100  # 2.5 us + 2.5 ns per node
        assert _max_idle(acts, first, hi) <= 2_000
        assert truth.max_gap_after_entry_ns == _max_idle(acts, first, hi)
        # the launch gap is the step's largest, and no fault: no gap over 2 us counts
        assert truth.max_gap_ns == truth.entry_gap_ns and truth.gaps_over_threshold == 0
    assert s.step_entry_gaps_ns == tuple(entry_gaps) == (6_820, 5_705, 3_463)
    # the step is about 29 ms of GPU work and the MoE grouped GEMMs dominate it
    moe = con.execute(
        "SELECT sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
        "s.id = k.demangledName WHERE k.graphNodeId IS NOT NULL AND "
        "s.value LIKE '%GemmType)2%'").fetchone()[0] / STEPS
    assert 17e6 < moe < 21e6
    for t in s.steps_of(0):
        assert 25e6 < t.end - t.start < 34e6


def test_extra_gaps_are_where_the_summary_says(gen):
    path, s = gen("extra-gaps", faults=("extra_gaps",))
    con = _ro(path)
    gpid = (1 << 48) | (s.pids[0] << 24)
    acts, windows = _step_windows(con, gpid)
    assert len(s.injected_gaps) == 3 * STEPS
    for step, (lo, hi) in enumerate(windows):
        cur, big = lo, []
        for st, en, *_ in acts:
            if en <= lo or st >= hi:
                continue
            if st - cur > 2_000:
                big.append((cur, st))
            cur = max(cur, en)
        truth = [(g.idle_start, g.idle_end) for g in s.injected_gaps if g.step == step]
        # the first gap is the step-entry launch gap; the injected ones follow
        entry = s.steps_of(0)[step].entry_gap_ns
        assert 3_000 <= big[0][1] - big[0][0] == entry <= 8_000
        assert big[1:] == truth
        assert s.steps_of(0)[step].gaps_over_threshold == 3  # the injected ones only
        assert all(5_000 <= e - s_ <= 40_000 for s_, e in big[1:])
    assert [(g.layer, g.op) for g in s.injected_gaps[:3]] == [(L, op) for L, op, _ in GAP_SITES]


def test_h2d_copies_per_step(gen, healthy):
    for name, kw, n, pageable in (("graph-healthy", {"mode": "graph"}, 3, 0),
                                  ("extra-h2d", {"faults": ("extra_h2d",)}, 4, 0),
                                  ("pageable", {"faults": ("pageable_h2d",)}, 3, 1)):
        path, s = gen(name, **kw)
        con = _ro(path)
        gpid = (1 << 48) | (s.pids[0] << 24)
        acts, windows = _step_windows(con, gpid)
        for lo, hi in windows:
            rows = con.execute("SELECT copyKind, srcKind, dstKind, bytes FROM "
                               "CUPTI_ACTIVITY_KIND_MEMCPY WHERE start >= ? AND end <= ?",
                               (lo, hi)).fetchall()
            assert len(rows) == n == s.h2d_per_step
            assert all(r[0] == 1 and r[2] == 2 for r in rows)
            assert sum(r[1] == 0 for r in rows) == pageable == s.pageable_h2d_per_step
        if pageable:  # a pageable copy blocks the host: the step gets a host-bound gap
            assert all(t.gaps_over_threshold >= 1 for t in s.step_truth)


def test_eager_one_launch_call_per_kernel(gen):
    path, s = gen("eager", mode="eager", step_nvtx=True)
    con = _ro(path)
    launches = _api_rows(con, LAUNCH_NAMES)
    n_kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert len(launches) == n_kernels
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS "
                       "NOT NULL").fetchone() == (0,)
    assert not _graph_launches(con)
    kcorr = {r[0] for r in con.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
    assert kcorr == {c for _s, _e, _t, c, _n in launches}
    # the step ranges exist and each holds one decode pass
    steps = con.execute("SELECT start, end FROM NVTX_EVENTS WHERE text = 'decode bs=32' "
                        "ORDER BY start").fetchall()
    assert len(steps) == STEPS
    assert con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'prefill bs=32'"
                       ).fetchone() == (1,)
    for lo, hi in steps:
        n = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s "
                        "ON s.id = r.nameId WHERE r.start >= ? AND r.end <= ? AND s.value IN "
                        f"({','.join('?' * len(LAUNCH_NAMES))})", (lo, hi, *LAUNCH_NAMES)
                        ).fetchone()[0]
        assert n == 2077
    # host bound: many small gaps in every decode step
    assert all(t.gaps_over_threshold > 500 for t in s.step_truth)


def test_two_ranks_slow_rank(gen):
    path, s = gen("2ranks", ranks=2, slow_rank=1, steps=2)
    con = _ro(path)
    assert con.execute("SELECT count(DISTINCT globalPid), count(DISTINCT deviceId) FROM "
                       "CUPTI_ACTIVITY_KIND_KERNEL").fetchone() == (2, 2)
    assert len(_graph_launches(con)) == 2 * 2

    def mean_dur(pattern, dev):
        return con.execute(
            "SELECT avg(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON "
            "s.id = k.demangledName WHERE s.value LIKE ? AND k.deviceId = ? AND "
            "k.graphNodeId IS NOT NULL", (pattern, dev)).fetchone()[0]

    ratio = mean_dur("%GemmType)2%", 1) / mean_dur("%GemmType)2%", 0)
    assert 1.15 < ratio < 1.25
    # the fast rank waits for the slow one inside its collectives
    assert mean_dur("%cross_device_reduce_1stage%", 0) > mean_dur("%cross_device_reduce_1stage%", 1)


def test_graph_level_trace_mode(gen):
    path, s = gen("graph-level", mode="graph", cuda_graph_trace="graph")
    con = _ro(path)
    rows = con.execute("SELECT correlationId, graphId, graphExecId FROM "
                       "CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchall()
    assert len(rows) == STEPS
    assert {r[0] for r in rows} == {c for _s, _e, _t, c, _n in _graph_launches(con)}
    assert con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS NOT "
                       "NULL").fetchone() == (0,)
    assert dict(con.execute("SELECT name, value FROM META_DATA_CAPTURE"))[
        "CUDA_GRAPH_TRACE_OPTIONS:MODE"] == "Graph"


def test_unknown_fault_rejected(tmp_path):
    with pytest.raises(ValueError):
        generate(tmp_path / "x.sqlite", faults=("nope",))
    assert set(FAULTS) == {"broken_fusion", "chunked_indexer", "extra_gaps", "extra_h2d",
                           "split_graph", "layer_fault", "pageable_h2d", "extra_gaps_host",
                           "extra_gaps_sync", "extra_gaps_collective", "extra_gaps_graph", "missing_kernel"}


def test_graph_boundary_fault_needs_graph_mode(tmp_path):
    with pytest.raises(ValueError, match="extra_gaps_graph needs mode='graph'"):
        generate(tmp_path / "x.sqlite", mode="eager", faults=("extra_gaps_graph",))


@pytest.mark.skipif(not (SAMPLES / "manifest.json").exists(), reason="samples not generated")
def test_bundled_samples_small_and_consistent():
    manifest = json.loads((SAMPLES / "manifest.json").read_text())
    assert "glm5-graph-healthy.sqlite" in manifest
    for name, entry in manifest.items():
        p = SAMPLES / name
        assert p.stat().st_size < 5_000_000, name
        if name.endswith(".trace.json.gz"):  # a Kineto twin: replayed kernels share a graph launch's id
            events = json.loads(gzip.decompress(p.read_bytes()))["traceEvents"]
            launches = {e["args"]["correlation"] for e in events
                        if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"}
            n = sum(1 for e in events if e.get("cat") == "kernel" and e["args"]["correlation"] in launches)
        else:
            n = _ro(p).execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE graphNodeId IS "
                               "NOT NULL").fetchone()[0]
        steps = entry["generate_kwargs"]["steps"]
        assert n == entry["graph_kernels_per_step"] * steps * entry["ranks"], name


def test_timeline_is_physically_consistent(gen):
    """No two activities overlap on one stream, no two API calls overlap on one thread, NVTX
    push/pop ranges nest, and every kernel starts after its launch call started."""
    path, _ = gen("2ranks", ranks=2, slow_rank=1, steps=2)
    con = _ro(path)
    prev = None
    for dev, stream, st, en in con.execute(
            "SELECT deviceId, streamId, start, end FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL "
            "SELECT deviceId, streamId, start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY "
            "ORDER BY 1, 2, 3"):
        assert en > st
        if prev and prev[0] == (dev, stream):
            assert st >= prev[1]
        prev = ((dev, stream), en)
    rows = con.execute("SELECT globalTid, start, end FROM CUPTI_ACTIVITY_KIND_RUNTIME "
                       "ORDER BY 1, 2").fetchall()
    assert all(not (a[0] == b[0] and b[1] < a[2]) for a, b in zip(rows, rows[1:]))
    stack, last_tid = [], None
    for tid, st, en in con.execute("SELECT globalTid, start, end FROM NVTX_EVENTS "
                                   "ORDER BY 1, 2, 3 DESC"):
        if tid != last_tid:
            stack, last_tid = [], tid
        while stack and stack[-1] <= st:
            stack.pop()
        assert not stack or en <= stack[-1]
        stack.append(en)
    assert con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
        "ON r.correlationId = k.correlationId AND k.globalPid = (r.globalTid & 0xFFFFFFFFFF000000) "
        "WHERE k.start < r.start").fetchone() == (0,)


# --------------------------------------------------------------------------------------------
# (f) real kernel names: the DeepGEMM layouts and the rows of real-kernel-names.tsv
# --------------------------------------------------------------------------------------------
REAL_NAMES = REFERENCE / "real-kernel-names.tsv"


def _tsv_rows() -> dict[int, str]:
    """TSV line number (as `cat -n` shows it, header = 1) -> kernel_name."""
    lines = REAL_NAMES.read_text().splitlines()
    return {i: line.split("\t")[3] for i, line in enumerate(lines, start=1) if i > 1}


# the qkv_a projection (N=2624, K=6144) of GLM-5.3 in each layout, as nsys demangles it
QKV_A_BY_LAYOUT = {
    "sglang-2026":
        "void deep_gemm::sm90_fp8_gemm_1d2d_impl<(cute::UMMA::Major)0, (unsigned int)0, "
        "(unsigned int)2624, (unsigned int)6144, (unsigned int)1, (unsigned int)16, "
        "(unsigned int)48, (unsigned int)128, (unsigned int)128, (unsigned int)128, "
        "(unsigned int)32, (unsigned int)27, (unsigned int)21, (unsigned int)128, "
        "(unsigned int)128, (unsigned int)1, (bool)0, (unsigned int)110, (deep_gemm::GemmType)0, "
        "deep_gemm::EpilogueIdentity, (bool)0>(float *, int *, int *, unsigned int, "
        "unsigned int, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "
        "CUtensorMap_st)",
    "2025-07":
        "void deep_gemm::sm90_fp8_gemm_1d2d_impl<(unsigned int)0, (unsigned int)2624, "
        "(unsigned int)6144, (unsigned int)1, (unsigned int)16, (unsigned int)48, "
        "(unsigned int)128, (unsigned int)128, (unsigned int)128, (unsigned int)32, "
        "(unsigned int)27, (unsigned int)21, (unsigned int)128, (unsigned int)128, "
        "(unsigned int)1, (bool)0, (unsigned int)110, (deep_gemm::GemmType)0, "
        "deep_gemm::EpilogueIdentity>(float *, int *, unsigned int, unsigned int, unsigned int, "
        "CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st)",
    "2025-02":
        "void deep_gemm::fp8_gemm_kernel<(unsigned int)2624, (unsigned int)6144, "
        "(unsigned int)64, (unsigned int)48, (unsigned int)128, (unsigned int)0, "
        "(unsigned int)32, (unsigned int)1, (unsigned int)8, (unsigned int)128, "
        "(unsigned int)128, (unsigned int)1, (bool)1, (deep_gemm::GemmType)0>(__nv_bfloat16 *, "
        "float *, int *, unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "
        "CUtensorMap_st)",
    # B200 compiles dense GEMMs for a runtime shape: M, N, K are all 0 (TSV rows 64, 69)
    "b200":
        "void deep_gemm::sm100_fp8_fp4_gemm_1d1d_impl<(cute::UMMA::Major)0, "
        "(cute::UMMA::Major)0, (unsigned int)128, (unsigned int)128, (unsigned int)0, "
        "(unsigned int)0, (unsigned int)0, (unsigned int)32, (unsigned int)32, "
        "(unsigned int)128, (unsigned int)1, (unsigned int)128, (unsigned int)128, "
        "(unsigned int)64, (unsigned int)24, (unsigned int)128, (unsigned int)128, "
        "(unsigned int)1, (bool)0, (unsigned int)148, (bool)0, (deep_gemm::GemmType)0, (bool)0, "
        "cutlass::float_e4m3_t, cutlass::float_e4m3_t, cutlass::bfloat16_t, "
        "deep_gemm::epilogue::transform::EpilogueIdentity>(int *, unsigned int, unsigned int, "
        "unsigned int, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, CUtensorMap_st, "
        "CUtensorMap_st)",
}


@pytest.mark.parametrize("layout", ["sglang-2026", "2025-07", "2025-02", "b200"])
def test_deepgemm_layout_names_in_the_trace(gen, layout):
    """Every layout: 2077 kernels per healthy step, the layout's own qkv_a name (78 per step),
    150 masked grouped GEMMs (GemmType 2, the shape N, K in the name), 411 dense ones, and
    GemmType never the first template argument."""
    if layout == "sglang-2026":
        path, s = gen("graph-healthy", mode="graph")  # the default layout
    else:
        path, s = gen(f"layout-{layout}", deepgemm_layout=layout)
    assert s.deepgemm_layout == layout
    assert s.kernels_per_step == 2077
    for c in _per_launch_counts(path):
        assert sum(c.values()) + 1 == 2077
        # B200's narrow dense GEMMs share one name: qkv_a, q_b and the dense gate_up (the
        # replicated shared expert's gate_up, N=4096, takes the wide configuration)
        assert c[QKV_A_BY_LAYOUT[layout]] == (78 + 78 + 3 if layout == "b200" else 78)
        assert _count(c, r"\(deep_gemm::GemmType\)2") == 150
        assert _count(c, r"\(deep_gemm::GemmType\)0") == 411  # 78 x 3 + 21 + 75 x 2 + 3 x 2
        assert _count(c, r"\(deep_gemm::GemmType\)1") == 0  # contiguous: prefill only
        assert _count(c, r"<\(deep_gemm::GemmType\)") == 0
        # the routed gate_up (N=4096, K=6144) over the 32 local experts, in every layout
        gate_up = {"2025-02": "<(unsigned int)4096, (unsigned int)6144, ",
                   "b200": "(unsigned int)0, (unsigned int)4096, (unsigned int)6144, "}.get(
            layout, "(unsigned int)0, (unsigned int)4096, (unsigned int)6144, (unsigned int)32, ")
        # 2025-02 names lead with N, K only, so the replicated shared expert's gate_up (the same
        # N=4096, K=6144, ungrouped) reads the same there
        assert _count(c, re.escape(gate_up)) == (150 if layout == "2025-02" else 75)
    # the prefill runs the contiguous grouped GEMMs (GemmType 1)
    con = _ro(path)
    n_contig = con.execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = "
        "k.demangledName WHERE s.value LIKE '%(deep_gemm::GemmType)1%'").fetchone()[0]
    assert n_contig == 150


def test_unknown_deepgemm_layout_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown DeepGEMM layout 'v3'"):
        generate(tmp_path / "x.sqlite", deepgemm_layout="v3")


@needs_shared(REAL_NAMES)
def test_names_reproduce_the_real_rows():
    """The generator's names are the real ones: DeepGEMM configurations rebuilt from the rows'
    N, K and tiles give the rows exactly (nsys style for the nsys rows 2-7, c++filt style for
    the torch-profiler rows), the B200 layout gives GLM's own rows 64-69, and the other kernels
    the generator launches spell as their rows in the TSV."""
    from nsys_ledger.synth import schedule as S
    from nsys_ledger.synth.deepgemm import (
        GLM_GEMMS,
        deepgemm_name,
        glm_config,
        sm90_config,
        sm90_legacy_config,
    )
    from nsys_ledger.synth.names import CXXFILT, NSYS

    rows = _tsv_rows()
    # sglang-2026, nsys demangler (SGLang v0.5.9 on H100, DeepSeek-V3 TP1)
    for line, (n, k, block_n, sms) in {
            3: (2112, 7168, 16, 132), 5: (7168, 16384, 64, 112), 6: (36864, 7168, 144, 128),
            7: (7168, 18432, 64, 112)}.items():
        cfg = sm90_config(n, k, block_m=16, block_n=block_n, num_sms=sms)
        assert deepgemm_name(cfg, "sglang-2026").render(NSYS) == rows[line], line
    # 2025-02, c++filt (torch profiler): dense and masked grouped (4 local experts)
    for line, (n, k, block_m, block_n, groups, gemm_type) in {
            20: (2112, 7168, 64, 32, 1, 0), 22: (7168, 16384, 64, 112, 1, 0),
            23: (4096, 7168, 64, 64, 1, 0), 24: (7168, 2048, 64, 112, 1, 0),
            13: (4096, 7168, 256, 128, 4, 2), 14: (7168, 2048, 256, 112, 4, 2)}.items():
        cfg = sm90_legacy_config(n, k, groups=groups, gemm_type=gemm_type, block_m=block_m,
                                 block_n=block_n)
        assert deepgemm_name(cfg, "2025-02").render(CXXFILT) == rows[line], line
    # b200: GLM-5.2 on B200 has GLM-5.3's shapes; our GLM GEMMs spell as its rows
    by_key = {g.key: deepgemm_name(glm_config(g, "b200"), "b200").render(CXXFILT)
              for g in GLM_GEMMS}
    assert by_key["gemm_o_proj"] == rows[64]
    assert by_key["gemm_moe_gate_up_masked"] == rows[65]
    assert by_key["gemm_moe_down_masked"] == rows[66]
    assert by_key["gemm_moe_gate_up_contig"] == rows[67]
    assert by_key["gemm_moe_down_contig"] == rows[68]
    assert by_key["gemm_qkv_a"] == rows[69]
    # the other kernels, in the style their row was captured in
    assert S.GROUP_QUANT.name == rows[2]
    for kt, line in ((S.Q_ABSORB_BMM, 8), (S.O_ABSORB_BMM, 9), (S.KV_WRITE, 10),
                     (S.ACT_AND_MUL, 31), (S.DEEPEP_DISPATCH, 58), (S.DEEPEP_COMBINE, 59),
                     (S.DEEPEP_DISPATCH_NORMAL, 61), (S.DEEPEP_COMBINE_NORMAL, 62),
                     (S.RMSNORM, 80), (S.FUSED_ADD_RMSNORM, 81), (S.ALLREDUCE, 82)):
        assert kt.name_in(CXXFILT) == rows[line], (kt.key, line)
    # and their nsys spelling of the same: casts, placeholders, spaced pointers
    assert S.DEEPEP_COMBINE.name == (
        "void deep_ep::internode_ll::combine<(bool)0, (int)6144, (int)11, (int)4>(void *, "
        "void *, int *, void *, const void *, const long *, const float *, const int *, "
        "const long *, long *, int *, int, int *, int, int, int, int, int, int, int, int, int, "
        "int, bool)")


def test_template_arguments_in_both_demangler_styles():
    from nsys_ledger.synth.names import (
        CXXFILT,
        NSYS,
        bool_,
        enum,
        int_,
        render_template_args,
        type_,
        uint,
    )

    args = (uint(2624), int_(8), bool_(True), bool_(False), enum("deep_gemm::GemmType", 2),
            type_("std::array<int, 8>"))
    assert render_template_args(args, NSYS) == (
        "<(unsigned int)2624, (int)8, (bool)1, (bool)0, (deep_gemm::GemmType)2, "
        "std::array<int, 8>>")
    assert render_template_args(args, CXXFILT) == (
        "<2624u, 8, true, false, (deep_gemm::GemmType)2, std::array<int, 8> >")
    with pytest.raises(ValueError):
        render_template_args(args, "msvc")


# --------------------------------------------------------------------------------------------
# (g) row order: nsys 2025.6+ may write activity rows in any order
# --------------------------------------------------------------------------------------------
def test_newest_layout_writes_rows_out_of_time_order(gen, healthy):
    """The 2026 export holds the kernel and runtime rows in buffer-interleaved order, not by
    start; the same timeline written in the 2025.5 layout holds the same rows."""
    path, _ = healthy
    older, _ = gen("graph-healthy-2025", mode="graph", nsys_version="2025")

    def by_rowid(p, table, cols, order="rowid"):
        con = _ro(p)
        rows = con.execute(f"SELECT {cols} FROM {table} ORDER BY {order}").fetchall()
        con.close()
        return rows

    kcols = "k.start, k.end, k.streamId, k.correlationId, s.value"
    kq = "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
    new_kernels = by_rowid(path, kq, kcols, "k.rowid")
    starts = [r[0] for r in new_kernels]
    assert starts != sorted(starts)
    descents = sum(b < a for a, b in zip(starts, starts[1:]))
    assert descents >= 30  # buffers of 24-160 rows, 9931 rows
    runtime = [r[0] for r in by_rowid(path, "CUPTI_ACTIVITY_KIND_RUNTIME", "start")]
    assert runtime != sorted(runtime)
    assert sorted(new_kernels) == sorted(by_rowid(older, kq, kcols, "k.rowid"))


# --------------------------------------------------------------------------------------------
# (h) the synth command
# --------------------------------------------------------------------------------------------
def test_synth_command_prints_one_line(tmp_path):
    from click.testing import CliRunner

    from nsys_ledger.cli import main
    from nsys_ledger.synth.deepgemm import DEEPGEMM_LAYOUTS

    out = tmp_path / "t.sqlite"
    result = CliRunner().invoke(main, ["synth", str(out), "--steps", "2", "--fault",
                                       "layer_fault", "--deepgemm-layout", "2025-02"])
    assert result.exit_code == 0, result.output
    assert result.output.count("\n") == 1
    line = result.output.strip()
    assert line.startswith(f"wrote {out}: graph mode, 2 decode steps, 2078 kernels per step "
                           "(2077 replayed + sampling), step-entry launch gap ")
    assert line.endswith(" us, faults: layer_fault, DeepGEMM layout 2025-02, nsys-2026.2 export")
    assert "deep_gemm::" not in line
    con = _ro(out)
    assert con.execute("SELECT count(*) FROM StringIds WHERE value LIKE "
                       "'void deep_gemm::fp8_gemm_kernel<(unsigned int)2624, %'").fetchone() == (1,)
    # the command offers exactly the generator's layouts
    option = next(p for p in main.commands["synth"].params if p.name == "deepgemm_layout")
    assert tuple(option.type.choices) == DEEPGEMM_LAYOUTS


def test_checker_reads_unsorted_rows_as_sorted_ones(gen, healthy):
    """The checker sorts what it reads: the 2026 export (rows buffer-interleaved) and the 2025.5
    export of the same timeline (rows in time order) give the same steps, ops and gaps."""
    from nsys_ledger import check

    ledger = Path(__file__).resolve().parent.parent / "expectations" / "glm-5.3-tp8-ep8.toml"
    newest, _ = healthy
    older, _ = gen("graph-healthy-2025", mode="graph", nsys_version="2025")
    a, b = check(newest, ledger), check(older, ledger)
    assert a.step_table.height == b.step_table.height == STEPS
    assert a.step_table.equals(b.step_table)
    assert a.op_table.equals(b.op_table)
    assert [f.message for f in a.findings] == [f.message for f in b.findings]
    assert a.verdict == b.verdict
