"""Bad inputs: every one raises TraceError("<path>: <problem>") and leaves the file as it was."""

from __future__ import annotations

import gzip
import hashlib
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from nsys_ledger.errors import TraceError
from nsys_ledger.trace import Trace, load_trace
from nsys_ledger.trace import sqlite_reader

REPO = Path(__file__).resolve().parents[1]
from shared_data import REAL_TRACES as TRACES_DIR, skip_without_shared  # noqa: E402


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _raises(path: Path, *fragments: str) -> TraceError:
    """load_trace(path) must raise TraceError naming `path`, with every fragment in it,
    and must not change the file."""
    before = _sha(path) if path.is_file() else None
    with pytest.raises(TraceError) as info:
        load_trace(path)
    err = info.value
    assert str(err).startswith(f"{path}: "), str(err)
    assert err.path == str(path)
    assert "\n" not in str(err)
    for fragment in fragments:
        assert fragment in err.problem, err.problem
    if before is not None:
        assert _sha(path) == before
    return err


def _smallest_real_trace() -> Path:
    files = []
    if TRACES_DIR.is_dir():
        files = sorted(TRACES_DIR.glob("*.sqlite"), key=lambda p: p.stat().st_size)
    if not files:
        skip_without_shared()
    return files[0]


def _make_db(path: Path, *statements: str, rows: dict[str, list[tuple]] | None = None) -> Path:
    conn = sqlite3.connect(path)
    for s in statements:
        conn.execute(s)
    for table, values in (rows or {}).items():
        if values:
            marks = ",".join("?" * len(values[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", values)
    conn.commit()
    conn.close()
    return path


STRING_IDS = "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)"
KERNEL = (
    "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
    "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, "
    "shortName INTEGER)"
)
RUNTIME = (
    "CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER, end INTEGER, eventClass INTEGER, "
    "globalTid INTEGER, correlationId INTEGER, nameId INTEGER)"
)
GPID = (1 << 48) | (77 << 24)


def _minimal_export(path: Path, kernel_rows: list[tuple]) -> Path:
    return _make_db(
        path, STRING_IDS, KERNEL,
        rows={"StringIds": [(1, "void k()"), (2, "k")], "CUPTI_ACTIVITY_KIND_KERNEL": kernel_rows},
    )


# --------------------------------------------------------------------------------------
# Not a file / not SQLite
# --------------------------------------------------------------------------------------


def test_missing_path(tmp_path):
    _raises(tmp_path / "nope.sqlite", "no such file")


def test_directory(tmp_path):
    _raises(tmp_path, "is a directory")


def test_empty_file(tmp_path):
    p = tmp_path / "empty.sqlite"
    p.write_bytes(b"")
    _raises(p, "empty file")


def test_text_file(tmp_path):
    p = tmp_path / "notes.sqlite"
    p.write_text("start,end,name\n1,2,k\n")
    _raises(p, "not an SQLite database", "text")


def test_gzip_file(tmp_path):
    p = tmp_path / "trace.sqlite.gz"
    p.write_bytes(gzip.compress(b"SQLite format 3\x00" + bytes(4096)))
    _raises(p, "not an SQLite database (gzip data)")


def test_gzip_named_sqlite(tmp_path):
    p = tmp_path / "trace.sqlite"
    p.write_bytes(gzip.compress(b"SQLite format 3\x00" + bytes(4096)))
    _raises(p, "gzip data")


def test_nsys_rep_without_nsys(tmp_path, monkeypatch):
    p = tmp_path / "report1.nsys-rep"
    p.write_bytes(b"\x00\x01NSYS-REPORT-LIKE\xff" * 64)
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    monkeypatch.setenv("PATH", str(empty_bin))
    _raises(p, "this is an .nsys-rep report", "nsys export --type sqlite", "nsys is not on PATH")


def _fake_nsys(bin_dir: Path, body: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def test_nsys_rep_converted_with_nsys(tmp_path, monkeypatch):
    """With `nsys` on PATH the report is exported to a temporary SQLite file and loaded."""
    src = _smallest_real_trace()
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00not sqlite\x00" * 32)
    before = _sha(rep)
    # A stand-in for nsys: copies a real export to the path given after --output.
    _fake_nsys(
        tmp_path / "bin",
        'while [ "$#" -gt 0 ]; do if [ "$1" = "--output" ]; then out="$2"; fi; shift; done\n'
        f'cp "{src}" "$out"\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ.get("PATH", ""))
    trace = load_trace(rep)
    assert isinstance(trace, Trace)
    assert trace.path == str(rep)
    assert trace.kernels.height > 0
    assert _sha(rep) == before


def test_nsys_rep_export_fails(tmp_path, monkeypatch):
    rep = tmp_path / "run.nsys-rep"
    rep.write_bytes(b"\x00not sqlite\x00" * 32)
    _fake_nsys(tmp_path / "bin", 'echo "ERROR: report is damaged" >&2\nexit 3\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    _raises(rep, "nsys export failed (exit 3)", "report is damaged")


def test_sqlite_named_nsys_rep_is_read_as_sqlite(tmp_path, monkeypatch):
    p = _minimal_export(tmp_path / "actually.nsys-rep", [(10, 20, 0, 7, 1, GPID, 1, 2)])
    monkeypatch.setenv("PATH", str(tmp_path))
    assert load_trace(p).kernels.height == 1


# --------------------------------------------------------------------------------------
# Damaged SQLite files
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", ["100", "4096", "half", "last-page", "minus-1"])
def test_truncated_real_export(tmp_path, cut):
    src = _smallest_real_trace()
    data = src.read_bytes()
    n = {"100": 100, "4096": 4096, "half": len(data) // 2, "last-page": len(data) - 4096,
         "minus-1": len(data) - 1}[cut]
    p = tmp_path / f"cut_{cut}.sqlite"
    p.write_bytes(data[:n])
    _raises(p, "truncated")


@pytest.mark.parametrize("fraction", [0.05, 0.25, 0.5, 0.75, 0.95])
def test_truncated_without_size_in_header(tmp_path, fraction):
    """With the header's page count cleared, SQLite cannot tell the file is short: the
    reader may load what is there or raise TraceError, but nothing else."""
    src = _smallest_real_trace()
    data = bytearray(src.read_bytes())
    data[28:32] = b"\x00\x00\x00\x00"
    p = tmp_path / "cut.sqlite"
    p.write_bytes(bytes(data[: int(len(data) * fraction)]))
    before = _sha(p)
    try:
        trace = load_trace(p)
    except TraceError as err:
        assert str(err).startswith(f"{p}: ")
    else:
        assert isinstance(trace, Trace)
    assert _sha(p) == before


@pytest.mark.parametrize("offset_fraction", [0.1, 0.4, 0.8])
def test_corrupted_pages(tmp_path, offset_fraction):
    src = _smallest_real_trace()
    data = bytearray(src.read_bytes())
    start = max(4096, int(len(data) * offset_fraction) // 4096 * 4096)
    data[start : start + 8192] = bytes((i * 131 + 7) % 256 for i in range(8192))
    p = tmp_path / "garbled.sqlite"
    p.write_bytes(bytes(data))
    before = _sha(p)
    try:
        load_trace(p)
    except TraceError as err:
        assert str(err).startswith(f"{p}: ")
    assert _sha(p) == before


def test_header_only(tmp_path):
    p = tmp_path / "header.sqlite"
    p.write_bytes(b"SQLite format 3\x00" + b"\x00" * 20)
    _raises(p, "truncated")


def test_locked_database(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_reader, "BUSY_TIMEOUT_S", 0.05)
    p = _minimal_export(tmp_path / "locked.sqlite", [(10, 20, 0, 7, 1, GPID, 1, 2)])
    holder = sqlite3.connect(p, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")
        _raises(p, "locked")
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert load_trace(p).kernels.height == 1


# --------------------------------------------------------------------------------------
# SQLite, but not a usable Nsight Systems export
# --------------------------------------------------------------------------------------


def test_sqlite_without_nsys_tables(tmp_path):
    p = _make_db(tmp_path / "other.sqlite", "CREATE TABLE t (a INTEGER)", rows={"t": [(1,)]})
    _raises(p, "not an Nsight Systems export (no StringIds table)")


def test_empty_sqlite_database(tmp_path):
    p = tmp_path / "blank.sqlite"
    conn = sqlite3.connect(p)
    conn.execute("CREATE TABLE x (a)")
    conn.execute("DROP TABLE x")
    conn.commit()
    conn.close()
    _raises(p, "not an Nsight Systems export")


def test_nsys_export_without_kernel_table(tmp_path):
    p = _make_db(
        tmp_path / "nokernels.sqlite", STRING_IDS, RUNTIME,
        rows={"StringIds": [(1, "cudaMalloc_v3020")],
              "CUPTI_ACTIVITY_KIND_RUNTIME": [(1, 2, 0, GPID + 5, 1, 1)]},
    )
    _raises(p, "no CUDA kernels: was the capture made with -t cuda?")


def test_kernel_rows_with_null_timestamps(tmp_path):
    rows = [
        (10, 20, 0, 7, 1, GPID, 1, 2),
        (None, 30, 0, 7, 2, GPID, 1, 2),
        (40, None, 0, 7, 3, GPID, 1, 2),
    ]
    p = _minimal_export(tmp_path / "nulls.sqlite", rows)
    _raises(p, "2 of 3 kernel rows", "NULL or inverted")


def test_kernel_rows_with_inverted_timestamps(tmp_path):
    rows = [(10, 20, 0, 7, 1, GPID, 1, 2), (50, 40, 0, 7, 2, GPID, 1, 2)]
    p = _minimal_export(tmp_path / "inverted.sqlite", rows)
    _raises(p, "1 of 2 kernel rows")


def test_text_in_integer_column(tmp_path):
    rows = [(10, 20, 0, 7, 1, GPID, 1, 2), (30, 40, "zero", 7, 2, GPID, 1, 2)]
    p = _minimal_export(tmp_path / "texty.sqlite", rows)
    _raises(p, "unexpected data in table CUPTI_ACTIVITY_KIND_KERNEL")


# --------------------------------------------------------------------------------------
# Minimal but valid exports: lazily missing tables and columns are not errors
# --------------------------------------------------------------------------------------


def test_minimal_export_loads(tmp_path):
    p = _minimal_export(tmp_path / "min.sqlite", [(10, 20, 0, 7, 1, GPID, 1, 2)])
    before = _sha(p)
    t = load_trace(p)
    assert _sha(p) == before
    assert t.kernels.row(0, named=True) == {
        "start": 10, "end": 20, "device": 0, "stream": 7, "global_pid": GPID, "pid": 77,
        "correlation": 1, "name": "void k()", "short_name": "k", "graph_node_id": None,
        "graph_id": None,
    }
    assert t.meta.version_source == "none"
    assert t.meta.nsys_version is None and t.meta.cuda_graph_trace is None
    assert t.devices.rows() == [(0, None, None, None, None)]
    for kind in ("api_calls", "memcpys", "memsets", "syncs", "nvtx", "graph_nodes",
                 "graph_replays", "profiler_overhead"):
        assert getattr(t, kind).height == 0


def test_newer_schema_warns(tmp_path):
    p = _minimal_export(tmp_path / "future.sqlite", [(10, 20, 0, 7, 1, GPID, 1, 2)])
    _make_db(
        p, "CREATE TABLE META_DATA_EXPORT (name TEXT, value TEXT)",
        rows={"META_DATA_EXPORT": [("EXPORT_PRODUCT_VERSION", "2031.1.1.1"),
                                   ("EXPORT_SCHEMA_VERSION", "4.0.0")]},
    )
    t = load_trace(p)
    assert t.meta.schema_version == "4.0.0"
    assert t.meta.warnings == ("schema version 4.0.0 is newer than tested; continuing",)


def test_path_with_uri_characters(tmp_path):
    d = tmp_path / "odd dir #1 ?x=%20"
    d.mkdir()
    p = _minimal_export(d / "a b.sqlite", [(10, 20, 0, 7, 1, GPID, 1, 2)])
    assert load_trace(p).kernels.height == 1
    assert load_trace(str(p)).path == str(p)


def test_invalid_utf8_text_is_replaced(tmp_path):
    p = _minimal_export(tmp_path / "latin1.sqlite", [(10, 20, 0, 7, 1, GPID, 3, 2)])
    conn = sqlite3.connect(p)
    conn.execute("INSERT INTO StringIds VALUES (3, CAST(x'6bff6b' AS TEXT))")
    conn.commit()
    conn.close()
    t = load_trace(p)
    assert t.kernels["name"].to_list() == ["k\ufffdk"]
    assert t.meta.warnings == ("invalid UTF-8 in StringIds replaced with U+FFFD",)


# ---- issue 20: bounded reads, linear-time regexes, values no profiler writes (in-process) -------

def test_fifo_is_refused_without_blocking(tmp_path):
    for name in ("t.sqlite", "t.json", "t.trace.json.gz", "t.nsys-rep"):
        fifo = tmp_path / name
        os.mkfifo(fifo)  # a blocking open would wait for a writer forever
        _raises(fifo, "is a FIFO (named pipe), not a regular file")


def test_character_device_is_refused(tmp_path):
    with pytest.raises(TraceError, match=r"^/dev/zero: is a character device, not a regular file$"):
        load_trace("/dev/zero")


def test_sqlite_named_json_is_read_as_sqlite(tmp_path):
    trace = _smallest_real_trace()
    renamed = tmp_path / "export.json"
    renamed.write_bytes(trace.read_bytes())
    conn = sqlite3.connect(f"file:{trace}?mode=ro", uri=True)
    kernels = conn.execute("SELECT COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    conn.close()
    assert load_trace(renamed).kernels.height == kernels


def test_gzip_is_inflated_in_bounded_chunks(tmp_path):
    from nsys_ledger.safety import inflate_bounded

    packed = gzip.compress(b" " * (8 * 1024 * 1024))
    assert len(inflate_bounded(packed, "x", 8 * 1024 * 1024)) == 8 * 1024 * 1024
    with pytest.raises(TraceError, match=r"^x: gzip data inflates to more than 4\.0 MiB"):
        inflate_bounded(packed, "x", 4 * 1024 * 1024, TraceError)
    # two members back to back (a concatenated gzip) inflate to both
    assert inflate_bounded(gzip.compress(b"ab") + gzip.compress(b"cd"), "x", 10) == b"abcd"
    with pytest.raises(TraceError, match="truncated gzip file"):
        inflate_bounded(packed[:-20], "x", 16 * 1024 * 1024, TraceError)


def test_op_patterns_run_in_linear_time():
    """`(a+)+$` needs 2**n steps in Python's re on n a's and a mismatch; polars answers at once."""
    from nsys_ledger.safety import regex_hits, regex_problem

    name = "a" * 50_000 + "!"
    assert regex_hits(["(a+)+$", "a!$", "^b"], [name, "aaa"]) == [[False, True], [True, False], [False, False]]
    assert regex_problem("(a+)+$") is None
    assert regex_problem("(") == "invalid regex (error: unclosed group)"


def test_kineto_ids_past_64_bits_are_refused_with_the_field(tmp_path):
    import json

    def trace(pid):
        return {"traceEvents": [
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": 1, "ts": 5, "dur": 2,
             "args": {"correlation": 1}},
            {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
             "args": {"device": 0, "stream": 7, "correlation": 1}}]}

    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace(2**64)))
    _raises(path, f"pid value {2**64} does not fit 64 bits")
    path.write_text(json.dumps(trace(2**63 - 1)))  # the largest that fits is read as it is
    assert load_trace(path).api_calls["pid"].to_list() == [2**63 - 1]


def test_kineto_number_past_64_bits_as_a_name_is_read_as_text(tmp_path):
    """Found by the fuzzer: a name of 2**128 (a number, not a string) overflowed polars."""
    import json

    events = [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11, "ts": 5,
               "dur": 2, "args": {"correlation": 1}},
              {"ph": "X", "cat": "kernel", "name": 2**128, "pid": 0, "tid": 7, "ts": 10, "dur": 5,
               "args": {"device": 0, "stream": 7, "correlation": 1}},
              {"ph": "X", "cat": "user_annotation", "name": 2**128, "pid": 11, "tid": 11, "ts": 1, "dur": 50}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(path)
    assert trace.kernels["name"].to_list() == [str(2**128)]
    assert trace.nvtx["name"].to_list() == [str(2**128)]


def test_string_ids_repeating_an_id(tmp_path):
    """StringIds' id is its primary key in every export; a damaged page that repeats ids (the
    fuzzer's case 8524 on the llama3 export) would give a name two values and repeat kernel rows:
    one line naming the repeated id, not a polars ShapeError."""
    path = tmp_path / "repeated.sqlite"
    path.write_bytes((REPO / "sample_traces" / "glm5-graph-healthy.sqlite").read_bytes())
    with sqlite3.connect(path) as db:
        db.executescript(
            "CREATE TABLE repeated AS SELECT * FROM StringIds UNION ALL SELECT * FROM StringIds WHERE id IN (1, 2);"
            "DROP TABLE StringIds; ALTER TABLE repeated RENAME TO StringIds;")
    _raises(path, "damaged export: StringIds repeats id 1 (2 ids appear more than once)")
