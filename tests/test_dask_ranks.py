"""Rank files checked on a Dask cluster merge exactly as the local process pool's.

A LocalCluster in this process (threads, no worker processes to start) stands in for a
remote cluster: the client reaches it by its scheduler address, as `--dask ADDRESS` does.
The 2-process sample gives ranks 0 and 1, the broken-fusion sample rank 2. Without `--dask`
nothing of Dask may be imported (checked in a fresh interpreter).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.pipeline import dask_cluster
from nsys_ledger.errors import InputError, TraceError
from nsys_ledger.pipeline.multifile import check_many
from nsys_ledger.progress import PROGRESS_ENV
from nsys_ledger.report.json_report import result_document

distributed = pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
TWO_RANKS = SAMPLES / "glm5-graph-2ranks-slow-rank1.sqlite"
BROKEN_FUSION = SAMPLES / "glm5-graph-broken-fusion.sqlite"
FILES = [str(TWO_RANKS), str(BROKEN_FUSION)]


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=":0") as local:
        yield local


@pytest.fixture(scope="module")
def on_pool(expectations):
    return check_many(FILES, expectations)


@pytest.fixture(scope="module")
def on_dask(cluster, expectations):
    patch = pytest.MonkeyPatch()
    patch.setenv(PROGRESS_ENV, "0")  # the in-process workers share this process's environment
    try:
        yield check_many(FILES, expectations, dask=cluster.scheduler_address)
    finally:
        patch.undo()


def test_dask_gives_the_process_pool_result(on_pool, on_dask):
    assert on_dask.verdict == on_pool.verdict == "fail"
    assert [f.message for f in on_dask.findings] == [f.message for f in on_pool.findings]
    assert on_dask.step_table.equals(on_pool.step_table)
    assert on_dask.op_table.select(sorted(on_dask.op_table.columns)).equals(
        on_pool.op_table.select(sorted(on_pool.op_table.columns)))
    assert on_dask.totals == on_pool.totals
    assert json.dumps(result_document(on_dask), sort_keys=True) == json.dumps(result_document(on_pool), sort_keys=True)


def test_dask_stacks_the_ranks_in_file_order(on_dask):
    assert [(Path(f.path).name, f.ranks) for f in on_dask.files] == [
        ("glm5-graph-2ranks-slow-rank1.sqlite", (0, 1)),
        ("glm5-graph-broken-fusion.sqlite", (2,)),
    ]
    assert on_dask.step_table.height == 10  # 3 steps on each of the two ranks, 4 on the third
    assert on_dask.step_table["rank"].to_list() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert on_dask.trace.kernels.height == 0  # per-event frames stay on the workers


def test_a_bad_file_on_dask_names_that_file(cluster, expectations, tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    bad = tmp_path / "rank1.sqlite"
    bad.write_text("not a trace\n")
    with pytest.raises(TraceError) as error:
        check_many([str(TWO_RANKS), str(bad)], expectations, dask=cluster.scheduler_address)
    assert error.value.path == str(bad)
    assert "not an SQLite database (text file)" in error.value.problem


def test_an_unreachable_scheduler_is_an_input_error(expectations, monkeypatch):
    monkeypatch.setattr(dask_cluster, "CONNECT_TIMEOUT_S", 1)
    with pytest.raises(InputError) as error:
        check_many(FILES, expectations, dask="tcp://127.0.0.1:9")
    assert error.value.path == "tcp://127.0.0.1:9"
    assert "cannot reach the Dask scheduler" in error.value.problem


def test_without_dask_nothing_of_dask_is_imported():
    code = (
        "import sys, nsys_ledger\n"
        "from nsys_ledger.cli import main\n"
        "from nsys_ledger.pipeline.multifile import check_many\n"
        f"nsys_ledger.check({str(TWO_RANKS)!r}, {str(GLM)!r})\n"
        f"check_many([{str(TWO_RANKS)!r}, {str(BROKEN_FUSION)!r}], {str(GLM)!r})\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "print('LOADED', loaded)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "LOADED []" in run.stdout


def test_cli_dask_local_starts_a_cluster_and_writes_the_same_json(on_pool, tmp_path, monkeypatch):
    monkeypatch.setenv(PROGRESS_ENV, "0")
    out = tmp_path / "result.json"
    run = CliRunner().invoke(main, ["check", *FILES, "--expect", str(GLM), "--dask", "local", "-j", "2",
                                    "--json", str(out)])
    assert run.exit_code == 1, run.output  # the broken-fusion file fails the ledger
    assert json.loads(out.read_text()) == json.loads(json.dumps(result_document(on_pool)))


def test_one_file_in_step_windows_on_dask_gives_the_local_json(cluster, expectations, monkeypatch):
    """One big file: its windows (here 3 of one step each) are the Dask tasks."""
    monkeypatch.setenv(PROGRESS_ENV, "0")
    local = nsys_ledger.check(TWO_RANKS, expectations, window_steps=0)
    on_dask = check_many([str(TWO_RANKS)], expectations, dask=cluster.scheduler_address, window_steps=1)
    assert on_dask.windows == 3
    assert on_dask.step_table.height == 6
    assert json.dumps(result_document(on_dask)) == json.dumps(result_document(local))
