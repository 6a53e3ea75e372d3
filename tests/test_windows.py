"""The step-window pipeline gives the JSON document of the whole trace, whatever the window.

Every bundled sample (SQLite and Kineto JSON), every real export and every real Kineto trace
in ../shared is checked with windows of 1 step, 7 steps and the whole trace (window_steps=0),
and the three JSON documents must be the same bytes. The samples are checked against the
ledger of the topology their manifest names, so the findings are part of the comparison.
"""

from __future__ import annotations

import json

import pytest

from nsys_ledger.api import check
from nsys_ledger.pipeline.plan import WHOLE_TRACE
from nsys_ledger.report.json_report import dumps_indented, result_document
from nsys_ledger.synth.topologies import DEFAULT_TOPOLOGY
from shared_data import KINETO_TRACES, REPO, real_params, real_sqlite_exports

SAMPLES = REPO / "sample_traces"
MANIFEST = json.loads((SAMPLES / "manifest.json").read_text())
WINDOWS = (1, 7, WHOLE_TRACE)


def sample_ledger(name: str):
    topology = MANIFEST[name].get("generate_kwargs", {}).get("topology") or DEFAULT_TOPOLOGY
    # vLLM's PIECEWISE graphs launch the same kernels as its FULL graph: one ledger for both
    return REPO / "expectations" / f"{topology.removesuffix('-piecewise')}.toml"


def documents(path, ledger, **options) -> dict[int, tuple[str, int]]:
    """window size -> (JSON document, windows planned)."""
    out = {}
    for window in WINDOWS:
        result = check(path, ledger, window_steps=window, **options)
        out[window] = (dumps_indented(result_document(result)), result.windows)
    return out


def assert_same_documents(found: dict[int, tuple[str, int]]) -> None:
    whole = found[WHOLE_TRACE][0]
    for window in (1, 7):
        assert found[window][0] == whole, f"window of {window} step(s) differs from the whole trace"


@pytest.mark.parametrize("name", sorted(MANIFEST))
def test_sample_json_is_the_same_for_every_window(name):
    ledger = sample_ledger(name)
    assert ledger.is_file(), ledger
    found = documents(SAMPLES / name, ledger)
    assert_same_documents(found)
    # the windows were used: one per decode step of a rank with windows of 1 (ranks step in
    # lockstep), one for 7 steps or the whole trace (the samples hold 3-4 steps per rank)
    steps = json.loads(found[WHOLE_TRACE][0])["steps"]
    per_rank = max((sum(1 for s in steps if s["rank"] == rank) for rank in {s["rank"] for s in steps}), default=0)
    assert found[WHOLE_TRACE][1] == 1
    assert found[7][1] == 1
    assert found[1][1] == max(per_rank, 1)


def test_four_step_sample_runs_in_four_windows_of_one_step():
    result = check(SAMPLES / "glm5-graph-healthy.sqlite", sample_ledger("glm5-graph-healthy.sqlite"), window_steps=1)
    assert result.windows == 4
    assert result.step_table.height == 4
    assert result.step_table["kernels"].to_list() == [2077, 2077, 2077, 2077]


def test_two_rank_sample_windows_hold_both_ranks():
    name = "glm5-graph-2ranks-slow-rank1.sqlite"
    result = check(SAMPLES / name, sample_ledger(name), window_steps=1)
    assert result.windows == 3
    assert result.step_table.select("rank", "step").rows() == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize("name", ["glm5-graph-2ranks-slow-rank1.sqlite", "glm5-eager-healthy.sqlite"])
def test_windows_in_two_processes_give_the_same_json(name):
    ledger = sample_ledger(name)
    whole = check(SAMPLES / name, ledger, window_steps=WHOLE_TRACE)
    parallel = check(SAMPLES / name, ledger, window_steps=1, jobs=2)
    assert parallel.windows > 1
    assert dumps_indented(result_document(parallel)) == dumps_indented(result_document(whole))


@pytest.mark.parametrize("path", real_params(real_sqlite_exports()))
def test_real_export_json_is_the_same_for_every_window(path):
    assert_same_documents(documents(path, None))


@pytest.mark.parametrize("path", real_params(sorted(KINETO_TRACES.glob("*.json.gz")) if KINETO_TRACES.is_dir() else []))
def test_real_kineto_json_is_the_same_for_every_window(path):
    found = documents(path, None)
    assert_same_documents(found)
    if path.name.startswith("HTA__nccl_parser_config"):  # 3 decode steps (ProfilerStep#N): 3 windows of 1
        assert found[1][1] == 3
