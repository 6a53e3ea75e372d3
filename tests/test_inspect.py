"""`nsys-ledger inspect`: what an SQLite export holds, read-only, checked against plain SQL on a
bundled sample (literal figures) and on every real export of ../shared."""

from __future__ import annotations

import hashlib
import json
import shutil
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from nsys_ledger.cli import main
from nsys_ledger.trace.sqlite_reader import load_sqlite
from tests.shared_data import real_params, real_sqlite_exports

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "glm5-graph-healthy.sqlite"
LEDGER = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"


def run(*args: object, columns: int = 100):
    return CliRunner(env={"COLUMNS": str(columns)}).invoke(main, ["inspect", *map(str, args)])


def inspect_json(path: Path) -> dict:
    result = run(path, "--json", "-")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["schema_version"] == "1.0"
    (inventory,) = document["files"]
    return inventory


def sql_counts(path: Path) -> tuple[int, int]:
    """(tables, kernel rows) by plain SQL over a read-only connection."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'").fetchone()[0]
        kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    finally:
        conn.close()
    return tables, kernels


def fingerprint(path: Path) -> tuple[str, int, list[str]]:
    """The file's bytes, its mtime and what lies beside it: all three must stay as they were."""
    return (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns,
            sorted(p.name for p in path.parent.iterdir()))


# -- the bundled sample: literal figures -------------------------------------------------


def test_sample_inventory_figures():
    doc = inspect_json(SAMPLE)
    assert doc["nsys_version"] == "2026.2.1.210"
    assert doc["schema_version"] == "3.25.0"
    assert doc["version_source"] == "META_DATA_EXPORT"
    assert doc["cuda_graph_trace"] == "node"
    assert doc["kernels"] == 12383
    assert len(doc["tables"]) == 43
    tables = {t["name"]: t for t in doc["tables"]}
    assert tables["CUPTI_ACTIVITY_KIND_KERNEL"] == {"name": "CUPTI_ACTIVITY_KIND_KERNEL", "rows": 12383,
                                                    "columns": 40, "read": True}
    assert tables["StringIds"]["rows"] == 118
    assert tables["NVTX_EVENTS"]["rows"] == 4677
    assert tables["ThreadNames"]["read"] is False
    assert doc["missing_needed"] == []
    assert doc["missing_optional"] == ["EXPORT_META_DATA", "CUPTI_ACTIVITY_KIND_MEMSET",
                                       "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", "TARGET_INFO_CUDA_GPU"]
    # the same figures plain SQL gives
    assert sql_counts(SAMPLE) == (43, 12383)


def test_sample_text_verdict_first_and_fits_the_terminal():
    result = run(SAMPLE, columns=60)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    verdict = lines[:next(i for i, line in enumerate(lines) if line.startswith("nsys "))]
    assert " ".join(line.strip() for line in verdict) == f"{SAMPLE}: nsys-ledger can read it: 12,383 kernels in 43 tables"
    assert all(len(line) <= 60 for line in lines)
    assert "2026.2.1.210, export schema 3.25.0" in result.output
    assert "traced per node" in result.output
    kernel_row = next(line for line in lines if line.split()[:1] == ["CUPTI_ACTIVITY_KIND_KERNEL"])
    assert kernel_row.split()[1:] == ["12,383", "40", "yes"]


def test_sample_is_not_changed_and_nothing_is_written_beside_it(tmp_path):
    (tmp_path / "trace").mkdir()
    trace = tmp_path / "trace" / SAMPLE.name
    shutil.copy2(SAMPLE, trace)
    before = fingerprint(trace)
    out = tmp_path / "out"
    out.mkdir()
    assert run(trace, "--json", out / "inventory.json").exit_code == 0
    assert fingerprint(trace) == before  # no -wal, -shm or -journal beside it
    assert json.loads((out / "inventory.json").read_text())["files"][0]["kernels"] == 12383


def test_the_connection_is_read_only_and_a_wal_mode_file_gets_no_side_files(tmp_path):
    """inspect opens exports as check does: `mode=ro` (a write is refused), and a file whose
    header says WAL is opened `immutable=1`, so no -shm or -wal appears beside it."""
    from nsys_ledger.errors import TraceError
    from nsys_ledger.trace.sqlite_reader import read_only_export

    (tmp_path / "trace").mkdir()
    trace = tmp_path / "trace" / SAMPLE.name
    header = bytearray(SAMPLE.read_bytes())
    header[18], header[19] = 2, 2  # WAL mode, as a copy from a WAL-mode tool may be
    trace.write_bytes(bytes(header))
    before = fingerprint(trace)
    with pytest.raises(TraceError, match="readonly|read-only"):
        with read_only_export(trace) as conn:
            conn.execute("CREATE TABLE written_by_inspect (a)")
    assert run(trace).exit_code == 0
    assert fingerprint(trace) == before


def test_two_files_in_one_document(tmp_path):
    eager = REPO / "sample_traces" / "glm5-eager-healthy.sqlite"
    result = run(SAMPLE, eager, "--json", "-")
    assert result.exit_code == 0, result.output
    files = json.loads(result.stdout)["files"]
    assert [(f["path"], f["kernels"]) for f in files] == [(str(SAMPLE), 12383), (str(eager), 10307)]
    assert sql_counts(eager)[1] == 10307


def test_an_export_without_kernels_names_the_needed_table(tmp_path):
    trace = tmp_path / "no-cuda.sqlite"
    shutil.copy2(SAMPLE, trace)
    conn = sqlite3.connect(trace)
    conn.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
    conn.commit()
    conn.close()
    doc = inspect_json(trace)
    assert doc["missing_needed"] == ["CUPTI_ACTIVITY_KIND_KERNEL"]
    assert doc["kernels"] == 0
    assert len(doc["tables"]) == 42
    lines = run(trace, columns=300).output.splitlines()
    assert lines[0] == (f"{trace}: 42 tables; nsys-ledger lacks what it needs: no CUPTI_ACTIVITY_KIND_KERNEL "
                        "(no kernels to check: was the capture made with -t cuda?)")
    kernel_row = next(line for line in lines if line.split()[:1] == ["CUPTI_ACTIVITY_KIND_KERNEL"])
    assert kernel_row.split()[1:] == ["-", "-", "NEEDED,", "absent"]


# -- every real export of ../shared -------------------------------------------------------


@pytest.mark.parametrize("trace", real_params(real_sqlite_exports()))
def test_real_export_counts_match_plain_sql(trace):
    doc = inspect_json(trace)
    tables, kernels = sql_counts(trace)
    assert len(doc["tables"]) == tables
    assert doc["kernels"] == kernels
    assert {t["name"]: t["rows"] for t in doc["tables"]}["CUPTI_ACTIVITY_KIND_KERNEL"] == kernels
    # versions and graph mode as the reader itself finds them
    meta = load_sqlite(trace).meta
    assert (doc["nsys_version"], doc["schema_version"], doc["cuda_graph_trace"]) == (
        meta.nsys_version, meta.schema_version, meta.cuda_graph_trace)


@pytest.mark.parametrize("trace", real_params(real_sqlite_exports()))
def test_real_export_is_not_changed(trace):
    before = fingerprint(trace)
    result = run(trace, columns=80)
    assert result.exit_code == 0, result.output
    assert all(len(line) <= 80 for line in result.output.splitlines())
    assert fingerprint(trace) == before


# -- bad input: one line, exit 2 ----------------------------------------------------------


def _plain_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "notes.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE notes (text TEXT)")
    conn.commit()
    conn.close()
    return path


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "trace.sqlite"
    path.write_text("not a database\n")
    return path


def _report(tmp_path: Path) -> Path:
    path = tmp_path / "run.nsys-rep"
    path.write_bytes(b"\x00\x01nsys report")
    return path


def _damaged_schema(tmp_path: Path) -> Path:
    """The sample with its first page (the schema) zeroed after the 100-byte header."""
    data = bytearray(SAMPLE.read_bytes())
    data[100:4096] = bytes(3996)
    path = tmp_path / "damaged.sqlite"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("make, problem", [
    (_damaged_schema, "corrupt or truncated SQLite database (database disk image is malformed)"),
    (lambda tmp: tmp, "is a directory, not a trace file"),
    (lambda tmp: LEDGER, "this is a ledger (expectations TOML), not a trace: "
                         "`nsys-ledger expectations show FILE` prints it"),
    (_text_file, "not an SQLite database (text file)"),
    (_plain_sqlite, "not an Nsight Systems export (no StringIds table)"),
    (_report, "this is an .nsys-rep report, not an SQLite export; convert it with "
              "`nsys export --type sqlite FILE`"),
    (lambda tmp: tmp / "absent.sqlite", "no such file"),
], ids=["damaged", "directory", "ledger", "text", "other-sqlite", "nsys-rep", "missing"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, make, problem):
    path = make(tmp_path)
    before = fingerprint(path) if path.is_file() else None
    result = run(path)
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [f"nsys-ledger: error: {path}: {problem}"]
    assert (fingerprint(path) if path.is_file() else None) == before


def test_json_onto_the_input_is_refused(tmp_path):
    trace = tmp_path / SAMPLE.name
    shutil.copy2(SAMPLE, trace)
    before = fingerprint(trace)
    result = run(trace, "--json", trace)
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [f"nsys-ledger: error: {trace}: cannot write output (--json): "
                                          f"it is the input {trace}"]
    assert fingerprint(trace) == before
