"""Several exports checked together: paths, parallel processes, stacked ranks, CLI and JSON.

The bundled samples stand in for per-rank exports: the 2-process file gives ranks 0 and 1,
the next files one rank each. Runs that start worker processes are shared per module
(each start costs an interpreter and its imports).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.errors import InputError, TraceError
from nsys_ledger.pipeline.multifile import check_many, expand_trace_paths

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
TWO_RANKS = SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite"
HEALTHY = SAMPLES / "glm5-graph-healthy.sqlite"
BROKEN_FUSION = SAMPLES / "glm5-graph-broken-fusion.sqlite"
FILES = [str(TWO_RANKS), str(HEALTHY), str(BROKEN_FUSION)]


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def stacked(expectations):
    return check_many(FILES, expectations)


@pytest.fixture(scope="module")
def singles(expectations):
    return [nsys_ledger.check(path, expectations) for path in FILES]


# --------------------------------------------------------------------------------------
# Stacking
# --------------------------------------------------------------------------------------


def test_ranks_follow_file_order_then_process_order(stacked):
    assert [(Path(f.path).name, f.ranks) for f in stacked.files] == [
        ("glm5-graph-2ranks-slow-rank1.sqlite", (0, 1)),
        ("glm5-graph-healthy.sqlite", (2,)),
        ("glm5-graph-broken-fusion.sqlite", (3,)),
    ]
    steps_per_rank = stacked.step_table.group_by("rank").agg(pl.len()).sort("rank").rows()
    assert steps_per_rank == [(0, 3), (1, 3), (2, 4), (3, 4)]


def test_stacked_tables_are_the_single_file_tables_with_ranks_shifted(stacked, singles):
    for table in ("step_table", "op_table", "gaps"):
        expected = pl.concat(
            [getattr(r, table).with_columns(pl.col("rank") + offset) for r, offset in zip(singles, (0, 2, 3))],
            how="diagonal_relaxed",
        )
        assert stacked.__getattribute__(table).select(expected.columns).equals(expected), table
    assert stacked.steps.windows.height == sum(r.steps.windows.height for r in singles)
    assert stacked.timeline.budget.height == sum(r.timeline.budget.height for r in singles)


def test_findings_are_judged_over_all_ranks(stacked):
    assert stacked.verdict == "fail"
    quant = next(f for f in stacked.findings if f.subject == "per_token_group_quant")
    assert quant.steps == "rank 3: 0-3"
    assert quant.failing_steps == 4
    assert quant.observed == "231"
    # the rank comparison sees the four ranks: the slow rank of the 2-process file stays rank 1
    assert stacked.ranks is not None and stacked.ranks.slowest_rank == 1
    assert stacked.ranks.per_rank["rank"].to_list() == [0, 1, 2, 3]


def test_totals_add_up_and_events_stay_in_the_workers(stacked, singles):
    assert stacked.totals.kernels == sum(r.totals.kernels for r in singles) == 46_314
    assert stacked.totals.h2d_copies == 54
    assert stacked.step_table.height == 14
    assert stacked.steps.activities.height == 0 and stacked.trace.kernels.height == 0
    assert stacked.trace.devices["device"].to_list() == [0, 1]


def test_events_travel_back_when_asked_for(expectations, singles):
    kept = check_many(FILES[1:], expectations, keep_events=True)
    activities = kept.steps.activities
    assert activities.height == singles[1].steps.activities.height + singles[2].steps.activities.height == 25_732
    assert activities["rank"].drop_nulls().unique().sort().to_list() == [0, 1]
    assert kept.trace.kernels.height == 12_383 + 13_319
    assert kept.step_table.equals(pl.concat([singles[1].step_table, singles[2].step_table.with_columns(
        pl.col("rank") + 1)]))


def test_one_file_is_a_plain_check(expectations, singles):
    one = check_many([FILES[1]], expectations)
    assert one.files == ()
    assert one.step_table.equals(singles[1].step_table)
    assert one.trace.kernels.height == singles[1].trace.kernels.height == 12_383


def test_a_bad_file_among_good_ones_names_that_file(tmp_path, expectations):
    empty = tmp_path / "rank1.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(TraceError) as error:
        check_many([str(HEALTHY), str(empty)], expectations, workers=1)
    assert error.value.path == str(empty)
    assert error.value.problem == "empty file"


# --------------------------------------------------------------------------------------
# Which files: directories, patterns, mistakes
# --------------------------------------------------------------------------------------


def _touch(directory: Path, *names: str) -> None:
    for name in names:
        (directory / name).write_bytes(b"x")


def test_a_directory_gives_its_traces_in_natural_order(tmp_path):
    _touch(tmp_path, "rank10.sqlite", "rank2.sqlite", "rank1.sqlite", "notes.txt", "rank1.nsys-rep",
           "rank3.nsys-rep")
    names = [Path(p).name for p in expand_trace_paths([tmp_path])]
    # rank1.nsys-rep is left out: its export rank1.sqlite is there
    assert names == ["rank1.sqlite", "rank2.sqlite", "rank3.nsys-rep", "rank10.sqlite"]


def test_a_pattern_gives_its_matches_in_natural_order(tmp_path):
    _touch(tmp_path, "r10.sqlite", "r9.sqlite", "other.sqlite")
    names = [Path(p).name for p in expand_trace_paths([str(tmp_path / "r*.sqlite")])]
    assert names == ["r9.sqlite", "r10.sqlite"]


@pytest.mark.parametrize(
    "make_paths, problem",
    [
        (lambda tmp: [str(tmp / "none*.sqlite")], "no file matches this pattern"),
        (lambda tmp: [str(tmp)], "is a directory without trace files"),
        (lambda tmp: [str(HEALTHY), os.path.relpath(HEALTHY)], "given twice"),
    ],
)
def test_path_mistakes_are_input_errors(tmp_path, make_paths, problem):
    with pytest.raises(InputError, match=problem):
        expand_trace_paths(make_paths(tmp_path))


# --------------------------------------------------------------------------------------
# Command line and JSON
# --------------------------------------------------------------------------------------


def test_cli_checks_several_files_and_lists_them(tmp_path):
    out = tmp_path / "result.json"
    run = CliRunner().invoke(main, ["check", str(HEALTHY), str(BROKEN_FUSION), "--expect", str(GLM),
                                    "--json", str(out), "--jobs", "2"])
    assert run.exit_code == 1, run.output
    assert f"file      rank 0: {HEALTHY}" in run.output
    assert f"file      rank 1: {BROKEN_FUSION}" in run.output
    assert "(steps rank 1: 0-3): too many" in run.output
    doc = json.loads(out.read_text())
    assert doc["files"] == [{"path": str(HEALTHY), "ranks": [0]}, {"path": str(BROKEN_FUSION), "ranks": [1]}]
    assert [(s["rank"], s["index"]) for s in doc["steps"]] == [(r, i) for r in (0, 1) for i in range(4)]
    assert doc["totals"]["kernels"] == 12_383 + 13_319


def test_json_of_one_file_lists_it_with_its_ranks(tmp_path):
    out = tmp_path / "result.json"
    run = CliRunner().invoke(main, ["check", str(TWO_RANKS), "--expect", str(GLM), "--json", str(out)])
    assert run.exit_code == 1, run.output  # rank 1 is slow
    assert json.loads(out.read_text())["files"] == [{"path": str(TWO_RANKS), "ranks": [0, 1]}]
