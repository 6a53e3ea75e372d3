"""A big SQLite export checked through a store on disk (pipeline.stream) gives the JSON document
the in-memory check gives.

Every bundled SQLite sample (against the ledger its manifest names) and every real export in
../shared is checked in memory as one window, and through the store in chunks of 1,000 rows
with windows of 1 and of 7 steps; the documents must be the same bytes. Also: the store is
removed afterwards, the Result holds no per-activity rows, `-j 2` gives the same document,
damaged rows are refused with the in-memory message, and `nsys-ledger check` streams a big
export on its own.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

import nsys_ledger.api as api
import nsys_ledger.pipeline.stream as stream
from nsys_ledger.api import check
from nsys_ledger.cli import main
from nsys_ledger.errors import TraceError
from nsys_ledger.pipeline.plan import WHOLE_TRACE
from nsys_ledger.report.json_report import dumps_indented, result_document
from shared_data import REPO, real_params, real_sqlite_exports
from test_windows import MANIFEST, SAMPLES, sample_ledger

SQLITE_SAMPLES = sorted(name for name in MANIFEST if name.endswith(".sqlite"))


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    """Chunks of 1,000 rows: every sample is read in 10-18 chunks, so that steps, buckets and
    windows all cross chunk edges."""
    monkeypatch.setattr(stream, "CHUNK_ROWS", 1000)


def document(result) -> str:
    return dumps_indented(result_document(result))


def assert_streamed_like_in_memory(path: Path, ledger: Path | None) -> None:
    whole = document(check(path, ledger, window_steps=WHOLE_TRACE))
    for window in (1, 7):
        streamed = check(path, ledger, window_steps=window, stream=True)
        assert streamed.steps.activities.height == 0, "the store was not used"
        assert document(streamed) == whole, f"through the store, windows of {window} step(s)"


@pytest.mark.parametrize("name", SQLITE_SAMPLES)
def test_sample_through_the_store_gives_the_in_memory_json(name):
    assert_streamed_like_in_memory(SAMPLES / name, sample_ledger(name))


@pytest.mark.parametrize("path", real_params(real_sqlite_exports()))
def test_real_export_through_the_store_gives_the_in_memory_json(path):
    assert_streamed_like_in_memory(path, None)


def test_the_store_holds_the_activities_in_chunks_and_buckets_and_is_removed(monkeypatch):
    seen = {}
    plan_store = api.plan_store

    def watched(store, stored, window_steps):
        seen["chunks"] = len(store.chunks)
        plan = plan_store(store, stored, window_steps)
        seen["buckets"] = len(store.buckets)
        seen["root"] = store.root
        return plan

    monkeypatch.setattr(api, "plan_store", watched)
    name = "glm5-graph-healthy.sqlite"
    result = check(SAMPLES / name, sample_ledger(name), window_steps=1, stream=True)
    # 12,383 kernels and 15 copies (SELECT count(*) of each table): 13 chunks of kernels, 1 of copies;
    # 4 windows of one step
    assert (result.totals.kernels, seen["chunks"], seen["buckets"], result.windows) == (12383, 14, 4, 4)
    assert result.step_table["kernels"].to_list() == [2077, 2077, 2077, 2077]
    assert not seen["root"].exists()
    assert result.layers.assignments.height == 0


def test_windows_from_the_store_in_two_processes_give_the_same_json():
    name = "glm5-graph-2ranks-slow-rank1.sqlite"
    ledger = sample_ledger(name)
    whole = document(check(SAMPLES / name, ledger, window_steps=WHOLE_TRACE))
    assert document(check(SAMPLES / name, ledger, window_steps=1, jobs=2, stream=True)) == whole


def test_damaged_rows_are_refused_with_the_in_memory_message(tmp_path, monkeypatch):
    damaged = tmp_path / "damaged.sqlite"
    shutil.copyfile(SAMPLES / "glm5-graph-healthy.sqlite", damaged)
    with sqlite3.connect(damaged) as conn:  # a copy: inputs are never written
        conn.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1 WHERE rowid % 997 = 0")
    stores = []
    create = stream.ActivityStore.create
    monkeypatch.setattr(stream.ActivityStore, "create", staticmethod(lambda: stores.append(create()) or stores[-1]))
    messages = []
    for streamed in (False, True):
        with pytest.raises(TraceError) as caught:
            check(damaged, window_steps=1, stream=streamed)
        messages.append(str(caught.value))
    assert messages[0] == messages[1]
    assert "12 of 12383 kernel rows have a NULL or inverted start/end timestamp" in messages[1]
    assert len(stores) == 1 and not stores[0].root.exists()  # the store is removed on the error too


def test_the_cli_streams_a_big_export_unless_a_report_needs_its_kernels(monkeypatch, tmp_path):
    monkeypatch.setattr(api, "STREAM_MIN_KERNELS", 10_000)  # the sample's 12,388 kernels are "big"
    used = []
    through_store = api._check_through_store

    def watched(*args, **kwargs):
        used.append(True)
        return through_store(*args, **kwargs)

    monkeypatch.setattr(api, "_check_through_store", watched)
    name = "glm5-graph-healthy.sqlite"
    ledger = str(sample_ledger(name))
    out = tmp_path / "streamed.json"
    runner = CliRunner()
    streamed = runner.invoke(main, ["check", str(SAMPLES / name), "--expect", ledger, "--json", str(out)])
    assert streamed.exit_code == 0, streamed.output
    assert used == [True]
    assert streamed.output.startswith("PASS all 20 checks passed on 4 decode steps")
    html = runner.invoke(main, ["check", str(SAMPLES / name), "--expect", ledger, "--html", str(tmp_path / "r.html")])
    assert html.exit_code == 0, html.output
    assert used == [True]  # the HTML report draws kernels: read in memory
    in_memory = document(check(SAMPLES / name, ledger))
    assert json.loads(out.read_text()) == json.loads(in_memory)


def test_top_kernels_of_a_streamed_check_without_a_ledger_come_from_the_time_use():
    from nsys_ledger.report.terminal import render

    name = "glm5-graph-healthy.sqlite"
    in_memory = render(check(SAMPLES / name))
    streamed = render(check(SAMPLES / name, window_steps=1, stream=True))
    top = in_memory[in_memory.index("most launched kernels per step:"):]
    assert top in streamed
    assert "156  flashinfer::norm::FusedAddRMSNormKernel" in top  # the seed's 156 per step
