"""The optional ADBC reader gives exactly the Trace of the sqlite3 reader, and never writes.

The sqlite3 module stays the reference: for every bundled sample and real export both readers
must produce equal frames; whatever the driver cannot vouch for (a type that changed, text
that is not UTF-8) falls back to sqlite3, whose errors and warnings the user sees.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from nsys_ledger.trace import load_trace
from nsys_ledger.trace import arrow_fetch
from nsys_ledger.trace.arrow_fetch import READER_ENV, ArrowSource, _conform
from nsys_ledger.trace.model import FRAME_SCHEMAS
from shared_data import real_params, real_sqlite_exports

pytest.importorskip("adbc_driver_sqlite")

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.sqlite"))
REAL = real_sqlite_exports()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in SAMPLES] + real_params(REAL))
def test_both_readers_give_the_same_trace(path, monkeypatch):
    monkeypatch.delenv(READER_ENV, raising=False)
    assert arrow_fetch.reader_name() == "adbc"
    fast = load_trace(path)
    monkeypatch.setenv(READER_ENV, "sqlite3")
    assert arrow_fetch.reader_name() == "sqlite3"
    reference = load_trace(path)
    assert fast.meta == reference.meta
    for kind in FRAME_SCHEMAS:
        assert getattr(fast, kind).equals(getattr(reference, kind)), kind


def test_the_fast_reader_opens_read_only_and_leaves_no_file(tmp_path):
    copy = tmp_path / "trace.sqlite"
    copy.write_bytes((ROOT / "sample_traces" / "glm5-graph-healthy.sqlite").read_bytes())
    before = _sha(copy)
    source = ArrowSource(f"file:{copy}?mode=ro")
    frame = source.frame("SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL", {"start": pl.Int64})
    assert frame is not None and frame.height == 12_383
    # a write through the same connection is refused by SQLite, not just not attempted
    assert source.frame("CREATE TABLE t (a INTEGER)", {}) is None
    source.close()
    assert _sha(copy) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.sqlite"]


def _table_with(tmp_path: Path, rows: list[tuple]) -> ArrowSource:
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (a INTEGER, s TEXT)")
    conn.executemany("INSERT INTO t VALUES (?, ?)", rows)
    conn.commit()
    conn.close()
    return ArrowSource(f"file:{path}?mode=ro")


def test_text_in_an_integer_column_is_declined(tmp_path):
    # the driver would return the column as text ("1", "x"); sqlite3 must judge it instead
    source = _table_with(tmp_path, [(1, "a"), ("x", "b")])
    assert source.frame("SELECT a FROM t", {"a": pl.Int64}) is None


def test_invalid_utf8_is_declined(tmp_path):
    source = _table_with(tmp_path, [(1, "a")])
    path = tmp_path / "t.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO t VALUES (2, CAST(x'6bff6b' AS TEXT))")
    conn.commit()
    conn.close()
    assert source.frame("SELECT s FROM t", {"s": pl.Utf8}) is None


def test_a_text_column_of_nulls_only_is_accepted_as_text():
    # the driver types a column without any value as int64
    table = pa.table({"s": pa.array([None, None], pa.int64()), "a": pa.array([1, 2], pa.int64())})
    frame = _conform(table, {"s": pl.Utf8, "a": pl.Int64})
    assert frame is not None
    assert frame.schema == pl.Schema({"s": pl.Utf8, "a": pl.Int64})
    assert frame["a"].to_list() == [1, 2]


def test_switched_off_it_declines_everything(tmp_path, monkeypatch):
    monkeypatch.setenv(READER_ENV, "sqlite3")
    source = _table_with(tmp_path, [(1, "a")])
    assert source.frame("SELECT a FROM t", {"a": pl.Int64}) is None
