"""`check --trace-out`: the drawn decode steps as a Chrome trace, from SQLite and Kineto input.

Each file is loaded back with `json` and its events are counted against the Result they came
from (the kernels of the drawn steps, their copies, launch calls, gaps and findings), and for
the real SGLang trace against literal figures counted from its JSON.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from nsys_ledger.api import check
from nsys_ledger.report.chrome_trace import GAPS_TID, STEPS_TID, chrome_trace_document, gpu_pid, host_pid
from nsys_ledger.report.selection import parse_step_list, select_steps
from shared_data import KINETO_TRACES, needs_shared

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"


def _kineto_dir() -> Path:
    return KINETO_TRACES


SGLANG_DECODE = _kineto_dir() / "AMD-AGI__TraceLens__inference_sglang_decode_sglang_Qwen3-8B_decode.json.gz"
SGLANG_CAPTURE = _kineto_dir() / "AMD-AGI__TraceLens__inference_sglang_decode_capture_traces_bs_32_rank0.json.gz"


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    script = Path(sys.executable).with_name("nsys-ledger")
    argv = [str(script)] if script.is_file() else [sys.executable, "-m", "nsys_ledger.cli"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, timeout=300)


def _kinds(document: dict) -> collections.Counter:
    return collections.Counter((e["ph"], e.get("cat")) for e in document["traceEvents"])


def test_broken_fusion_sample_from_the_command_line(tmp_path):
    """The worst step (named by the findings) and the representative one, every kernel of both.
    The samples are regenerated now and then: their figures are taken from the Result."""
    trace = SAMPLES / "glm5-graph-broken-fusion.sqlite"
    out = tmp_path / "steps.json"
    run = _run_cli("check", str(trace), "--expect", str(GLM), "--trace-out", str(out))
    assert run.returncode == 1, run.stderr
    assert f"trace-out {out}" in run.stdout
    result = check(trace, GLM)
    drawn = pl.DataFrame([(s.rank, s.step) for s in select_steps(result)], schema=["rank", "step"], orient="row")
    document = json.loads(out.read_text())
    kinds = _kinds(document)
    assert kinds[("X", "kernel")] == result.step_table.join(drawn, on=["rank", "step"])["kernels"].sum()
    assert kinds[("X", "step")] == 2
    named = sum(parse_step_list(f.steps, result.step_table).join(drawn, on=["rank", "step"]).height
                for f in result.findings)
    assert kinds[("i", "finding")] == named > 0
    assert kinds[("X", "api_graph_launch")] == result.step_table.join(drawn, on=["rank", "step"])[
        "graph_launches"].sum()
    steps = sorted(e["args"]["role"] for e in document["traceEvents"] if e.get("cat") == "step")
    assert steps == ["representative", "worst"]
    worst = [s for s in select_steps(result) if s.role == "worst"][0]
    assert f"worst rank {worst.rank} step {worst.step}" in document["otherData"]["nsys_ledger"]


def test_events_match_the_result_of_a_gap_sample():
    result = check(SAMPLES / "glm5-graph-caused-gaps.sqlite", GLM)
    document = json.loads(json.dumps(chrome_trace_document(result)))
    drawn = {(e["args"]["rank"], e["args"]["step"]) for e in document["traceEvents"] if e.get("cat") == "step"}
    assert drawn == {(s.rank, s.step) for s in select_steps(result)}
    steps = pl.DataFrame(sorted(drawn), schema={"rank": pl.Int64, "step": pl.Int64}, orient="row")
    activities = result.steps.activities.join(steps, on=["rank", "step"])
    kinds = _kinds(document)
    assert kinds[("X", "kernel")] == activities.filter(pl.col("activity") == "kernel").height > 0
    assert kinds[("X", "memcpy")] == activities.filter(pl.col("activity") == "memcpy").height
    gaps = result.gaps.join(steps, on=["rank", "step"])
    assert kinds[("X", "gap")] == gaps.height > 0
    gap_events = [e for e in document["traceEvents"] if e.get("cat") == "gap"]
    assert {e["args"]["cause"] for e in gap_events} == set(gaps["cause"].to_list())
    assert all(e["tid"] == GAPS_TID and e["name"] == f"gap: {e['args']['cause']}" for e in gap_events)
    kernels = [e for e in document["traceEvents"] if e.get("cat") == "kernel"]
    assert sum(1 for e in kernels if "op" in e["args"]) == activities.filter(
        (pl.col("activity") == "kernel") & pl.col("op").is_not_null()).height
    with_layer = sum(1 for e in kernels if "layer" in e["args"])
    assert with_layer == result.layers.assignments.join(steps, on=["rank", "step"]).filter(
        pl.col("layer").is_not_null() & pl.col("row").is_in(
            activities.filter(pl.col("activity") == "kernel")["row"].implode())).height
    assert {e["pid"] for e in kernels} <= {gpu_pid(0, d) for d in range(8)}
    names = {e["args"]["name"] for e in document["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert "rank 0 host" in names


@needs_shared(SGLANG_DECODE)
def test_kineto_replay_with_its_capture(tmp_path):
    """The SGLang Qwen3 decode step: 555 kernels, 544 of them replayed from the graph, whose
    slices carry the module and layer paired from the capture trace."""
    out = tmp_path / "sglang.json"
    run = _run_cli("check", str(SGLANG_DECODE), "--capture", str(SGLANG_CAPTURE), "--trace-out", str(out))
    assert run.returncode == 0, run.stderr
    assert "capture traces: 544 of 544 replayed graph kernels paired" in run.stdout
    document = json.loads(out.read_text())
    kinds = _kinds(document)
    assert kinds[("X", "kernel")] == 555
    assert kinds[("X", "memcpy")] == 3
    assert kinds[("X", "api_graph_launch")] == 1
    assert kinds[("X", "api_kernel_launch")] == 11
    kernels = [e for e in document["traceEvents"] if e.get("cat") == "kernel"]
    assert sum(1 for e in kernels if "graph_node_id" in e["args"]) == 544
    host = [e for e in document["traceEvents"] if e.get("cat") == "step"]
    assert len(host) == 1 and host[0]["pid"] == host_pid(0) and host[0]["tid"] == STEPS_TID


def test_no_decode_step_gives_an_empty_trace():
    result = check(SAMPLES / "glm5-graph-healthy.sqlite", GLM, step_nvtx="no such range", step_method="nvtx")
    document = chrome_trace_document(result)
    assert document["traceEvents"] == []
    assert document["otherData"]["nsys_ledger"] == "no decode step to draw"
