"""Timeline checks on the bundled samples: gaps and their cause against the generator's truth
(sample_traces/manifest.json), H2D copies and their position, graph breaks, the three-column
ledger, the step time budget, and the rank comparison."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import click
import polars as pl
import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.checks.budget import BUDGET_COLUMNS
from nsys_ledger.checks.gaps import SEGMENT_KIND, SPLIT_FIELDS, _overhead_runs, find_gaps, step_spans
from nsys_ledger.checks.host_time import host_record, host_split
from nsys_ledger.checks.ranks import compare_ranks
from nsys_ledger.cli import main
from nsys_ledger.ledger.model import Range

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def checked(expectations):
    cache: dict[str, nsys_ledger.Result] = {}

    def run(name: str) -> nsys_ledger.Result:
        if name not in cache:
            cache[name] = nsys_ledger.check(SAMPLES / name, expectations)
        return cache[name]

    return run


def checks_of(result) -> list[str]:
    return [f.check for f in result.findings]


# ---------------------------------------------------------------------------------------------
# Gaps and their cause
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name", ["glm5-graph-caused-gaps.sqlite", "glm5-graph-extra-gaps.sqlite", "glm5-graph-boundary-gap.sqlite"]
)
def test_every_injected_gap_is_found_with_its_step_and_cause(checked, name):
    result = checked(name)
    truth = MANIFEST[name]["injected_gaps"]
    found = {(g["rank"], g["step"], g["start"], g["end"]): g["cause"] for g in result.gaps.to_dicts()}
    for gap in truth:
        key = (gap["rank"], gap["step"], gap["idle_start"], gap["idle_end"])
        # the generator's "sync" gap: its cudaStreamSynchronize returns 1-3 us into the gap and
        # the host then works 4 us more before it begins the graph launch, so by time the host's
        # own work is the larger part of the late launch (test_injected_gap_causes_follow_who_was_late)
        assert found.get(key) == {"sync": "host"}.get(gap["cause"], gap["cause"]), gap
    # and nothing else than the generator's own count of device idle gaps above 2 us
    assert result.step_table["gaps"].to_list() == [s["gaps_over_2us"] for s in MANIFEST[name]["steps"]]


def test_injected_gap_causes_follow_who_was_late(checked):
    gaps = checked("glm5-graph-caused-gaps.sqlite").gaps
    late = pl.col("call_start") - pl.col("start")  # when the host began the ending call, from the gap's start
    # the late collectives were queued long before the GPU went idle: device side, their peers
    collective = gaps.filter(pl.col("cause") == "collective")
    assert collective.height == 8 and set(collective["side"]) == {"device"}
    assert set(collective["after_op"]) == {"allreduce", "deepep_dispatch"}
    assert sorted(set(collective["after_layer"])) == [20, 50]
    assert (collective["call_end"] < collective["start"]).all()
    assert (collective["device_ns"] == collective["duration"]).all()
    # the sampling launch begins 12 us after the forward pass ran dry, with no CUDA call or NVTX
    # range on the thread in between: plain host time
    sampling = gaps.filter(pl.col("after_op") == "sampling")
    assert sampling["cause"].to_list() == ["host"] * 4
    assert (sampling["host_host_ns"] == sampling.select(late).to_series()).all()
    assert (sampling.select(late).to_series() > sampling["duration"] // 2).all()
    # the graph launch after a stream sync: the sync returned inside the gap (its share is
    # counted), then the host worked longer than that before it began the launch
    after_sync = gaps.filter(pl.col("after_op") == "embedding")
    assert after_sync["cause"].to_list() == ["host"] * 4 and set(after_sync["before"]) == {"memcpy HtoD"}
    assert (after_sync["host_sync_ns"] > 0).all()
    assert (after_sync["host_host_ns"] > after_sync["host_sync_ns"]).all()
    # every gap's parts add up to its duration
    parts = pl.sum_horizontal(*SPLIT_FIELDS)
    assert (gaps.select(parts).to_series() == gaps["duration"]).all()


def test_late_second_replay_is_a_graph_boundary_gap(checked):
    result = checked("glm5-graph-boundary-gap.sqlite")
    gaps = result.gaps.filter(~pl.col("step_entry"))  # not the allowed launch gap at each step's entry
    assert gaps.select("step", "cause", "before_op", "before_layer", "after_op", "after_layer").rows() == [
        (step, "graph_boundary", "moe_sum", 38, "fused_add_rmsnorm", 39) for step in range(4)
    ]
    # the generator delays the second replay by 5 us after a 0.5-1 us node gap
    assert all(5_000 < d < 6_100 for d in gaps["duration"].to_list())
    # the time budget counts it among the other gaps (not host, not collective)
    assert result.step_table["other_gap_ns"].to_list() == gaps["duration"].to_list()
    assert result.step_table["host_ns"].to_list() == result.step_table["step_entry_gap_ns"].to_list()  # the launch waits only
    assert checks_of(result) == ["graph_break", "gaps"]
    assert "by cause: graph_boundary 4" in result.findings[1].message


def test_device_side_delays_have_no_visible_cause(checked):
    result = checked("glm5-graph-extra-gaps.sqlite")
    inside = result.gaps.filter(~pl.col("step_entry"))
    assert inside["cause"].to_list() == ["unknown"] * 12
    assert inside.filter(pl.col("step") == 0)["after_layer"].to_list() == [12, 40, 68]


def test_healthy_graph_sample_has_no_gap_at_2us(checked):
    result = checked("glm5-graph-healthy.sqlite")
    # only the allowed wait for cudaGraphLaunch at each step's entry (tests/test_real_layouts.py)
    assert result.gaps.select("cause", "step_entry").rows() == [("launch", True)] * 4
    assert result.gap_threshold_ns == 2000
    assert result.findings == []
    assert result.timeline.stream_gaps is None  # only on request


def test_eager_sample_is_host_bound_with_most_gaps_caused_by_host(checked):
    result = checked("glm5-eager-healthy.sqlite")
    table = result.step_table
    assert table["gaps"].to_list() == [1087, 1076, 1080, 1106]
    # eager decode: every gap is the host's, late (the launching thread was still in its layer
    # NVTX ranges) or in its launch call; never the device's
    assert set(result.gaps["side"]) == {"host", "launch"}
    host_side = result.gaps.filter(pl.col("side") == "host")
    assert (host_side["call_start"] > host_side["start"]).all()
    assert table["bound"].to_list() == ["host"] * 4
    assert (table["host_ns"] > table["busy_ns"]).all()
    finding = next(f for f in result.findings if f.check == "gaps")
    main = result.gaps.group_by("cause").agg(pl.col("duration").sum()).sort("duration")["cause"][-1]
    assert main == "nvtx" and finding.hint.startswith("mostly nvtx: ") and "NVTX range '" in finding.hint


def test_pageable_copy_delays_the_graph_launch(checked):
    result = checked("glm5-graph-pageable-h2d.sqlite")
    assert checks_of(result) == ["h2d_pageable", "gaps"]
    # the host stages the pageable copy inside its call, then begins cudaGraphLaunch, which is
    # still in flight for most of the gap: launch latency, with the copy call's share counted
    assert result.gaps.select("step", "cause", "before", "after_op").rows() == [
        (step, "launch", "memcpy HtoD", "embedding") for step in range(4)
    ]
    assert (result.gaps["host_copy_call_ns"] > 0).all()
    assert (result.gaps["launch_ns"] > result.gaps["duration"] // 2).all()


def test_a_higher_threshold_keeps_only_the_longer_gaps(expectations):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-extra-gaps.sqlite", expectations, gap_us=10)
    # the 6.5 us site drops out; the 17 and 36 us ones stay (about 17.6 and 36.6 us idle)
    assert result.step_table["gaps"].to_list() == [2] * 4
    assert result.gap_threshold_ns == 10_000


def test_per_stream_gaps_on_request(expectations):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations, per_stream_gaps=True)
    stream_gaps = result.timeline.stream_gaps
    assert result.gaps.filter(~pl.col("step_entry")).height == 0  # inside the replay the device is never idle ...
    # ... but each stream is, while the other one works: the alt stream between its kv_a
    # norm and indexer kernels of successive layers, the main stream while the alt stream
    # catches up (the shared expert runs on the main stream, as forward_deepep issues it)
    assert set(stream_gaps["stream"]) == {20, 24}
    assert stream_gaps["stream"].is_not_null().all()
    per_step = stream_gaps.group_by("step").len().sort("step")["len"].to_list()
    assert per_step == [99] * 4


# ---------------------------------------------------------------------------------------------
# H2D copies, graph breaks: exactly those findings
# ---------------------------------------------------------------------------------------------
def test_healthy_sample_h2d_copies_are_three_small_pinned_before_the_launch(checked):
    result = checked("glm5-graph-healthy.sqlite")
    copies = result.timeline.h2d
    assert copies.height == 12
    assert copies.group_by("step").len().sort("step")["len"].to_list() == [3] * 4
    assert set(copies["memory"]) == {"pinned"} and set(copies["position"]) == {"before"}
    assert copies.filter(pl.col("step") == 0)["bytes"].to_list() == [8192, 256, 512]  # batch 32 * 256, 8, 16
    assert result.step_table["h2d_before"].to_list() == [3] * 4


def test_extra_h2d_sample_gives_exactly_the_h2d_finding(checked):
    result = checked("glm5-graph-extra-h2d.sqlite")
    assert checks_of(result) == ["h2d"]
    assert result.findings[0].message.endswith("too many; per step: 4 before the graph launch")


def test_split_graph_sample_gives_exactly_the_break_and_its_copy(checked):
    result = checked("glm5-graph-split-graph.sqlite")
    assert checks_of(result) == ["h2d", "graph_break"]
    h2d, graph_break = result.findings
    assert h2d.message.endswith("per step: 3 before the graph launch, 1 between graph launches")
    assert (graph_break.observed, graph_break.expected, graph_break.steps) == ("2", "1", "0-3")
    breaks = result.timeline.breaks
    assert breaks.select("step", "replay", "kernel_index", "before_op", "after_op").rows() == [
        (step, 1, 1036, "moe_sum", "fused_add_rmsnorm") for step in range(4)
    ]
    # the second graph starts at layer 39 (the generator's SPLIT_GRAPH_LAYER)
    assert breaks["after_layer"].to_list() == [39] * 4 and breaks["before_layer"].to_list() == [38] * 4
    assert "replay 2 starts at layer 39 fused_add_rmsnorm (kernel 1036 of the step), after layer 38 moe_sum" in (
        graph_break.message
    )
    assert result.step_table["replays"].to_list() == [2] * 4


def test_graph_launch_shortfall_is_not_a_break(expectations, checked):
    healthy = checked("glm5-graph-healthy.sqlite")
    strict = nsys_ledger.check(healthy.trace, dataclasses.replace(expectations, graph_launches_per_step=Range(2, 2)))
    launches = next(o for o in strict.outcomes if o.name == "graph launches per step")
    assert [f.check for f in launches.findings] == ["graph_launches"]
    assert launches.findings[0].message.endswith("too few")


# ---------------------------------------------------------------------------------------------
# The three-column ledger and the step time budget
# ---------------------------------------------------------------------------------------------
def test_three_columns_and_kernels_per_token_at_the_seeds_batch(checked):
    table = checked("glm5-graph-healthy.sqlite").step_table
    assert table["cpu_submissions"].to_list() == [5] * 4  # 3 copies, 1 graph launch, 1 sampling launch
    assert table["kernels"].to_list() == [2077] * 4
    assert table["gaps"].to_list() == [0] * 4 and table["gap_ns"].to_list() == [0] * 4
    assert table["kernels_per_token"].to_list() == [64.91] * 4  # the seed: "about 62 at batch 32", + the shared expert's SiluAndMul


def test_batch_option_overrides_the_expectations(expectations):
    result = nsys_ledger.check(SAMPLES / "glm5-graph-healthy.sqlite", expectations, batch=128)
    assert result.batch == 128
    assert result.step_table["kernels_per_token"].to_list() == [16.23] * 4  # the seed: 16 at batch 128


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_budget_terms_add_up_to_the_step_time(checked, name):
    table = checked(name).step_table
    terms = ["busy_ns", "small_gap_ns", "collective_ns", "host_ns", "other_gap_ns", "overhead_ns"]
    assert (table.select(pl.sum_horizontal(terms).alias("total"))["total"] == table["step_ns"]).all()
    # consecutive steps do not overlap on the device in the samples: the budget spans the step
    assert (table["step_ns"] == table["duration_ns"]).all()
    by_cause = table.select(pl.sum_horizontal(pl.col("^gap_ns_.*$")).alias("total"))["total"]
    assert (table["gap_ns"] + table["step_entry_gap_ns"] == by_cause).all()


def test_healthy_graph_budget_is_gpu_bound_with_sub_us_node_gaps(checked):
    table = checked("glm5-graph-healthy.sqlite").step_table
    assert table["bound"].to_list() == ["gpu"] * 4
    # T_host is the wait for cudaGraphLaunch at each step's entry (3-8 us), nothing else
    assert (table["host_ns"] == table["step_entry_gap_ns"]).all() and table["host_ns"].is_between(3_000, 8_000).all()
    assert (table["other_gap_ns"] == 0).all()
    # N·g: about 1875 node-to-node gaps of 0.5-1 us (the seed: 1-2 ms per step)
    assert table["small_gaps"].is_between(1850, 1900).all()
    assert (table["small_gap_ns"] / table["small_gaps"]).is_between(500, 1000).all()
    # C_comm: 78 allreduce + 150 DeepEP kernels, the only time when just collectives run
    assert table["collective_ns"].is_between(3_000_000, 4_000_000).all()


# ---------------------------------------------------------------------------------------------
# Ranks
# ---------------------------------------------------------------------------------------------
def test_the_slow_rank_is_named(checked):
    result = checked("glm5-graph-2ranks-slow-rank1.sqlite")
    ranks = result.ranks
    assert ranks.slowest_rank == 1
    assert ranks.per_step["slowest_rank"].to_list() == [1, 1, 1]
    assert 19 < ranks.imbalance_pct < 21  # the generator's slow_factor 1.2
    # rank 1 arrives last at every collective: it never waits, rank 0 waits for it
    waits = dict(ranks.per_rank.select("rank", "collective_wait_ns").iter_rows())
    assert waits[1] == 0 and waits[0] > 4_000_000
    # in lock step the step times hardly differ (collectives end together)
    assert ranks.max_spread_ns < 200_000
    (finding,) = result.findings
    assert (finding.check, finding.subject, finding.source) == ("rank_imbalance", "rank 1", "ranks.max_imbalance_pct")
    assert finding.message.startswith("rank 1 is the slowest")


def test_rank_comparison_of_per_rank_tables_from_separate_results(checked):
    """The multi-file path: one step table per rank, stacked with file order as the rank."""
    columns = ["rank", "step", "step_ns", "busy_ns", "collective_ns"]
    table = checked("glm5-graph-2ranks-slow-rank1.sqlite").step_table.select(columns)
    # as if the slow process had been exported to the first file: it becomes rank 0
    slow_first = [table.filter(pl.col("rank") == r).with_columns(pl.lit(i, pl.Int64).alias("rank"))
                  for i, r in enumerate((1, 0))]
    assert compare_ranks(pl.concat(slow_first)).slowest_rank == 0
    assert compare_ranks(slow_first[0]) is None  # one rank: nothing to compare


def test_one_rank_has_no_rank_comparison(checked):
    assert checked("glm5-graph-healthy.sqlite").ranks is None


# ---------------------------------------------------------------------------------------------
# Cause rules on a hand-made timeline (the graph boundary has no sample of its own)
# ---------------------------------------------------------------------------------------------
THREAD = (1 << 24) | 11  # globalTid of pid 1, tid 11


def _activities(rows: list[tuple]) -> pl.DataFrame:
    """(start, end, name, graph_node_id, correlation, api_start, api_end) per kernel, one step;
    launched from THREAD (a graph launch when the kernel is a graph node)."""
    frame = pl.DataFrame(
        rows, orient="row",
        schema={"start": pl.Int64, "end": pl.Int64, "name": pl.Utf8, "graph_node_id": pl.Int64,
                "correlation": pl.Int64, "api_start": pl.Int64, "api_end": pl.Int64},
    )
    return frame.with_row_index("row").with_columns(
        pl.lit("kernel").alias("activity"), pl.lit(0, pl.Int64).alias("device"), pl.lit(7, pl.Int64).alias("stream"),
        pl.lit(1, pl.Int64).alias("pid"), pl.lit(None, pl.Utf8).alias("copy_kind"), pl.lit(0, pl.Int64).alias("rank"),
        pl.lit(0, pl.Int64).alias("step"), pl.lit(True).alias("decode"), pl.lit(THREAD, pl.Int64).alias("api_tid"),
        pl.when(pl.col("graph_node_id").is_null()).then(pl.lit("kernel_launch")).otherwise(pl.lit("graph_launch"))
        .alias("api_kind"),
    )


def _gaps(rows: list[tuple], calls: list[tuple] = (), ranges: list[tuple] = (), overhead: list[tuple] = (),
          syncs: list[tuple] = ()) -> pl.DataFrame:
    """Gaps above 2 us of the kernels `rows`, with the launching thread's other CUDA calls
    (start, end, kind, name), its NVTX ranges (start, end, name), profiler overhead (start,
    end) and CUPTI sync rows (start, stream, sync_type)."""
    acts = _activities(rows)
    api = pl.DataFrame(list(calls), orient="row", schema={"start": pl.Int64, "end": pl.Int64, "kind": pl.Utf8,
                                                          "name": pl.Utf8}).with_columns(
        pl.lit(THREAD, pl.Int64).alias("global_tid"))
    nvtx = pl.DataFrame(list(ranges), orient="row", schema={"start": pl.Int64, "end": pl.Int64, "name": pl.Utf8})
    nvtx = nvtx.with_columns(
        pl.lit(THREAD, pl.Int64).alias("global_tid"), pl.lit(None, pl.Int64).alias("end_global_tid"),
        pl.lit(59, pl.Int64).alias("event_type"), pl.lit(None, pl.Utf8).alias("domain"))
    overhead_rows = pl.DataFrame(list(overhead), orient="row", schema={"start": pl.Int64, "end": pl.Int64})
    overhead_rows = overhead_rows.with_columns(pl.lit(THREAD, pl.Int64).alias("global_tid"), pl.lit(1, pl.Int64).alias("pid"))
    sync_rows = pl.DataFrame(list(syncs), orient="row", schema={"start": pl.Int64, "stream": pl.Int64,
                                                                "sync_type": pl.Utf8}).with_columns(
        pl.lit(1, pl.Int64).alias("pid"))
    return find_gaps(acts, step_spans(acts), overhead_rows, host_record(api, nvtx), sync_rows, 2_000)


def _causes(rows: list[tuple], **host) -> list[tuple]:
    return _gaps(rows, **host).select("start", "end", "cause").rows()


def test_gap_between_two_replays_with_the_host_ahead_is_a_graph_boundary():
    rows = [
        (10_000, 20_000, "k_a", 1, 100, 0, 5_000),       # replay 1 (launched early)
        (25_000, 30_000, "k_b", 2, 200, 1_000, 6_000),   # replay 2, launched early too
        (40_000, 45_000, "k_c", 3, 200, 1_000, 6_000),   # same replay: nothing explains the wait
    ]
    assert _causes(rows) == [(20_000, 25_000, "graph_boundary"), (30_000, 40_000, "unknown")]


LATE = [
    (10_000, 20_000, "k_a", None, 1, 0, 5_000),
    (30_000, 31_000, "k_b", None, 2, 27_000, 29_000),  # launch began 7 us after the GPU went idle
]


def test_a_launch_begun_after_the_gpu_went_idle_is_host_time_split_by_what_the_thread_did():
    gaps = _gaps(LATE)
    assert gaps.select("cause", "side", "host_host_ns", "launch_ns", "device_ns").rows() == [
        ("host", "host", 7_000, 2_000, 1_000)]
    # the thread was blocked in a synchronize that returned 6 us into the gap: sync
    sync = _gaps(LATE, calls=[(8_000, 26_000, "sync", "cudaStreamSynchronize")])
    assert sync.select("cause", "host_sync_ns", "host_host_ns").rows() == [("sync", 6_000, 1_000)]
    # ... one that returned 1 us into it, the host then working 6 us on its own: not the sync
    short = _gaps(LATE, calls=[(8_000, 21_000, "sync", "cudaStreamSynchronize")])
    assert short.select("cause", "host_sync_ns", "host_host_ns").rows() == [("host", 1_000, 6_000)]
    # a copy call and cudaMalloc calls (driver calls nested inside count once)
    calls = [(20_500, 22_000, "memcpy", "cudaMemcpy"), (22_000, 26_000, "other", "cudaMalloc"),
             (22_100, 25_000, "other", "cuMemAlloc")]
    mixed = _gaps(LATE, calls=calls)
    assert mixed.select("cause", "host_copy_call_ns", "host_cuda_call_ns", "host_host_ns").rows() == [
        ("cuda_call", 1_500, 4_000, 1_500)]


def test_host_time_in_an_nvtx_range_is_named_after_the_innermost_range():
    ranges = [(0, 100_000, "token_5_processing"), (21_000, 26_500, "ensure_layer_3_weights")]
    gaps = _gaps(LATE, ranges=ranges, calls=[(22_000, 23_000, "memcpy", "cudaMemcpy")])
    # 7 us late: 1 us in the copy call; the rest inside NVTX ranges (the outer one covers it all)
    assert gaps.select("cause", "host_copy_call_ns", "host_nvtx_ns", "host_host_ns", "nvtx_range").rows() == [
        ("nvtx", 1_000, 6_000, 0, "ensure_layer_3_weights")]


def test_a_launch_in_flight_when_the_gpu_went_idle_is_launch_latency():
    rows = [(10_000, 20_000, "k_a", None, 1, 0, 5_000), (30_000, 31_000, "k_b", None, 2, 18_000, 28_000)]
    gaps = _gaps(rows)
    assert gaps.select("cause", "side", "host_host_ns", "launch_ns", "device_ns").rows() == [
        ("kernel_launch", "launch", 0, 8_000, 2_000)]


def test_work_queued_before_the_gpu_went_idle_is_the_device_side():
    # returned 1 us before idle; a gap of 493 us: whatever the host did, the GPU waited on something else
    rows = [(10_000, 20_000, "k_a", None, 1, 0, 5_000), (513_000, 514_000, "k_b", None, 2, 18_000, 19_000)]
    assert _causes(rows, calls=[(20_000, 400_000, "sync", "cudaDeviceSynchronize")]) == [
        (20_000, 513_000, "unknown")]
    # its stream was told to wait on an event after k_a was launched: a cross-stream wait
    assert _causes(rows, syncs=[(6_000, 7, "Stream wait event")]) == [(20_000, 513_000, "event_wait")]
    # a wait recorded before k_a's launch is not this one
    assert _causes(rows, syncs=[(-1_000, 7, "Stream wait event")]) == [(20_000, 513_000, "unknown")]


def test_late_collective_with_an_early_launch_is_collective():
    rows = [
        (10_000, 20_000, "gemm", 1, 100, 0, 5_000),
        (29_000, 35_000, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 2, 100, 0, 5_000),
    ]
    assert _causes(rows) == [(20_000, 29_000, "collective")]


def test_idle_time_with_profiler_overhead_inside_is_no_gap():
    rows = [(10_000, 20_000, "k_a", None, 1, 0, 1), (40_000, 45_000, "k_b", None, 2, 0, 1),
            (50_000, 55_000, "k_c", None, 3, 0, 1)]
    # 20-40 us: 18 us of profiler flush with 1 us idle either side is one idle period, left out
    # whole (nsys's gpu_gaps does the same); 45-50 us has no overhead and stays a gap
    assert _gaps(rows, overhead=[(21_000, 39_000)]).select("start", "end").rows() == [(45_000, 50_000)]
    assert _gaps(rows).select("start", "end").rows() == [(20_000, 40_000), (45_000, 50_000)]



def test_every_idle_segment_of_a_quiet_run_with_overhead_becomes_overhead():
    """Runs of idle and overhead segments at the timeline's start, middle and end, and one
    without overhead: only the runs holding overhead turn overhead, whole."""
    kinds = ["overhead", "idle", "busy", "idle", "idle", "busy", "idle", "overhead", "idle", "collective", "idle"]
    segments = pl.DataFrame({"kind": pl.Series(kinds, dtype=SEGMENT_KIND)})
    assert _overhead_runs(segments.lazy()).collect()["kind"].to_list() == [
        "overhead", "overhead", "busy", "idle", "idle", "busy", "overhead", "overhead", "overhead", "collective",
        "idle"]

# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------
def test_cli_prints_the_budget_and_writes_the_timeline_json(tmp_path):
    out = tmp_path / "result.json"
    run = CliRunner().invoke(main, ["check", str(SAMPLES / "glm5-graph-caused-gaps.sqlite"), "--expect", str(GLM),
                                    "--per-stream-gaps", "--batch", "64", "--json", str(out)],
                             env={"COLUMNS": "1000"})  # unwrapped: the sentences below whole
    assert run.exit_code == 1, run.output
    assert "kernels/token: kernels per step / 64 tokens of the batch" in run.output
    assert "32.5" in run.output  # 2077 / 64
    assert "step time budget (us)" in run.output and "gpu-bound" in run.output
    assert "by cause: host 12 (169.6 us), collective 8 (97.9 us), copy_launch 2 (5.8 us)" in run.output
    assert "per-stream gaps above 2 us: device 0 stream 20" in run.output
    doc = json.loads(out.read_text())
    timeline = doc["timeline"]
    assert timeline["batch"] == 64
    assert timeline["gap_causes"] == ["sync", "copy_call", "cuda_call", "nvtx", "host", "launch", "kernel_launch",
                                      "copy_launch", "collective", "graph_boundary", "event_wait", "copy", "unknown"]
    assert timeline["gap_sides"] == {"host": ["sync", "copy_call", "cuda_call", "nvtx", "host"],
                                     "launch": ["launch", "kernel_launch", "copy_launch"],
                                     "device": ["collective", "graph_boundary", "event_wait", "copy", "unknown"]}
    assert timeline["gaps_total"] == len(timeline["gaps"]) == 22 and timeline["stream_gaps"] and timeline["ranks"] is None
    assert {g["cause"] for g in timeline["gaps"]} == {"host", "copy_launch", "collective"}
    # each gap documents who was late and the time split, which adds up to its duration
    first = timeline["gaps"][0]
    assert (first["side"], first["call_kind"], first["after_op"]) == ("host", "graph_launch", "embedding")
    for gap in timeline["gaps"]:
        assert sum(gap[field] for field in SPLIT_FIELDS) == gap["duration"]
        assert gap["call_start"] is not None and gap["call_end"] >= gap["call_start"]
    assert len(timeline["h2d_copies"]) == 12 and timeline["graph_breaks"] == []
    step = doc["steps"][1]
    assert step["kernels_per_token"] == 32.45 and step["replays"] == 1
    assert step["h2d_positions"] == {"before": 3, "between": 0, "after": 0, "in_graph": 0, "no_graph": 0, "unknown": 0}
    assert set(step["budget"]) == {*BUDGET_COLUMNS, "bound"}
    assert step["gaps_by_cause"] == {
        "host": {"count": 3, "ns": step["gaps_by_cause"]["host"]["ns"]},
        "copy_launch": {"count": 1, "ns": step["gaps_by_cause"]["copy_launch"]["ns"]},
        "collective": {"count": 2, "ns": step["gaps_by_cause"]["collective"]["ns"]},
    }
    assert sum(v["ns"] for v in step["gaps_by_cause"].values()) == step["gap_ns"]


def test_json_names_the_slow_rank(tmp_path):
    out = tmp_path / "result.json"
    run = CliRunner().invoke(main, ["check", str(SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite"), "--expect",
                                    str(GLM), "--json", str(out)])
    assert run.exit_code == 1
    assert "1 slowest" in click.unstyle(run.output)
    ranks = json.loads(out.read_text())["timeline"]["ranks"]
    assert ranks["slowest_rank"] == 1 and [r["rank"] for r in ranks["per_rank"]] == [0, 1]


def test_json_lists_the_longest_gaps_and_counts_them_all(checked):
    from nsys_ledger.report.json_report import result_document

    result = checked("glm5-eager-healthy.sqlite")
    timeline = result_document(result)["timeline"]
    assert (timeline["gaps_total"], timeline["list_limit"], len(timeline["gaps"])) == (4349, 1000, 1000)
    listed = [g["duration"] for g in timeline["gaps"]]
    assert min(listed) >= result.gaps["duration"].sort(descending=True)[999]  # the longest ones
    assert [(g["step"], g["start"]) for g in timeline["gaps"]] == sorted((g["step"], g["start"]) for g in timeline["gaps"])
    assert timeline["h2d_copies_total"] == 12 and timeline["stream_gaps_total"] is None


def test_injected_gaps_are_found_on_every_rank(tmp_path, expectations):
    from nsys_ledger.synth import generate

    path = tmp_path / "two-ranks.sqlite"
    summary = generate(path, mode="graph", steps=2, ranks=2, seed=3,
                       faults=("extra_gaps_collective", "extra_gaps_host"))
    result = nsys_ledger.check(path, expectations)
    found = {(g["rank"], g["step"], g["start"], g["end"]): g["cause"] for g in result.gaps.to_dicts()}
    truth = {(g.rank, g.step, g.idle_start, g.idle_end): g.cause for g in summary.injected_gaps}
    assert len(truth) == 2 * 2 * 3  # ranks x steps x (two collectives, one late sampling launch)
    assert {key: found.get(key) for key in truth} == truth
    truth_per_step = sorted((t.rank, t.index, t.gaps_over_threshold) for t in summary.step_truth)
    # the planned launch gap at each step's entry is allowed (cause launch), not counted
    assert result.step_table.select("rank", "step", "gaps").rows() == truth_per_step
    assert set(result.gaps.filter(pl.col("step_entry"))["cause"]) == {"launch"}


def test_host_split_counts_only_the_launching_threads_own_calls_and_ranges():
    other = THREAD + 1
    api = pl.DataFrame({
        "start": [1_000, 2_000, 5_000], "end": [4_000, 9_000, 6_000], "global_tid": [THREAD, other, THREAD],
        "kind": ["sync", "memcpy", "other"], "name": ["cudaStreamSynchronize", "cudaMemcpy", "cudaMalloc"],
    })
    nvtx = pl.DataFrame({"start": [0, 6_500], "end": [10_000, 7_500], "global_tid": [other, THREAD],
                         "end_global_tid": [None, None], "event_type": [59, 59], "name": ["elsewhere", "mine"],
                         "domain": [None, None]}, schema_overrides={"end_global_tid": pl.Int64, "domain": pl.Utf8})
    windows = pl.DataFrame({"id": [0, 1], "global_tid": [THREAD, other], "from": [2_000, 3_000], "to": [8_000, 8_000]})
    split = host_split(windows, host_record(api, nvtx)).sort("id")
    # thread THREAD, 2-8 us: 2 us of its sync, 1 us of cudaMalloc, 1 us in its range, 2 us plain
    # thread `other`, 3-8 us: all inside its cudaMemcpy (the range around it is not counted twice)
    assert split.rows() == [(0, 2_000, 0, 1_000, 1_000, 2_000, "mine"), (1, 0, 5_000, 0, 0, 0, None)]
