"""Parquet and Arrow exports (`nsys export --type parquetdir` / `arrowdir`) check exactly like SQLite.

Every bundled sample and every real export is converted (synth/parquet_writer.py: one file
per table, the SQLite columns) in a temporary directory, and the check of each layout must
give the same verdict, findings, per-step tables and JSON document (less the paths) as the
SQLite file; the Trace read from the real exports must be frame for frame the same. Bad
directories give one line and exit 2; a report is exported once and reused from its cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import nsys_ledger
from nsys_ledger.cli import main
from nsys_ledger.pipeline.multifile import expand_trace_paths
from nsys_ledger.report.json_report import result_document
from nsys_ledger.synth.parquet_writer import write_columnar
from nsys_ledger.trace import load_trace
from nsys_ledger.trace.model import FRAME_SCHEMAS
from nsys_ledger.trace.report_export import cache_dir_for
from shared_data import real_params, real_sqlite_exports

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = sorted((ROOT / "sample_traces").glob("*.sqlite"))
REAL = real_sqlite_exports()
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
HEALTHY = ROOT / "sample_traces" / "glm5-graph-healthy.sqlite"
BROKEN_FUSION = ROOT / "sample_traces" / "glm5-graph-broken-fusion.sqlite"
FORMATS = ("parquetdir", "arrowdir")


@pytest.fixture(scope="module")
def expectations():
    return nsys_ledger.load_expectations(GLM)


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(sqlite path, format) -> the converted directory, made once per module."""
    base = tmp_path_factory.mktemp("columnar")
    made: dict[tuple[Path, str], Path] = {}

    def convert(path: Path, fmt: str) -> Path:
        key = (path, fmt)
        if key not in made:
            made[key] = base / f"{path.stem}.{fmt}"
            write_columnar(path, made[key], fmt)
        return made[key]

    return convert


def _without_paths(document: dict) -> dict:
    document = json.loads(json.dumps(document))  # a deep copy of plain values
    document["trace"].pop("path")
    for entry in document["files"]:
        entry.pop("path")
    return document


def _by_name(frame):
    """Columns in name order: the op table's op columns come in no defined order."""
    return frame.select(sorted(frame.columns))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("sample", SAMPLES, ids=lambda p: p.stem)
def test_every_sample_checks_the_same_from_each_layout(sample, fmt, converted, expectations):
    reference = nsys_ledger.check(sample, expectations)
    columnar = nsys_ledger.check(converted(sample, fmt), expectations)
    assert columnar.verdict == reference.verdict
    assert [f.message for f in columnar.findings] == [f.message for f in reference.findings]
    assert columnar.step_table.equals(reference.step_table)
    assert _by_name(columnar.op_table).equals(_by_name(reference.op_table))
    assert columnar.totals == reference.totals
    assert _without_paths(result_document(columnar)) == _without_paths(result_document(reference))


def test_the_healthy_and_broken_samples_give_their_figures_from_parquet(converted, expectations):
    healthy = nsys_ledger.check(converted(HEALTHY, "parquetdir"), expectations)
    assert (healthy.verdict, healthy.totals.kernels, healthy.step_table.height) == ("pass", 12_383, 4)
    broken = nsys_ledger.check(converted(BROKEN_FUSION, "parquetdir"), expectations)
    assert broken.verdict == "fail"
    assert broken.totals.kernels == 13_319
    assert "per_token_group_quant kernels: 231 per step" in broken.findings[0].message


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", real_params(REAL))
def test_real_exports_read_into_the_same_trace(path, fmt, converted):
    reference = load_trace(path)
    columnar = load_trace(converted(path, fmt))
    assert columnar.meta == reference.meta
    for kind in FRAME_SCHEMAS:
        assert getattr(columnar, kind).equals(getattr(reference, kind)), kind


def test_only_the_needed_columns_are_read_binary_data_as_large_string(tmp_path, converted):
    """nsys-ai met NVTX_EVENTS.binaryData as a large string in parquetdir exports: a column the
    Trace does not use is never decoded, whatever its type or content."""
    directory = tmp_path / "export"
    shutil.copytree(converted(HEALTHY, "parquetdir"), directory)
    nvtx_file = directory / "NVTX_EVENTS.parquet"
    table = pq.read_table(nvtx_file)
    junk = pa.array(["\x00payload " * 50] * table.num_rows, type=pa.large_string())
    index = table.schema.get_field_index("binaryData")
    table = table.set_column(index, "binaryData", junk) if index >= 0 else table.append_column("binaryData", junk)
    pq.write_table(table, nvtx_file)
    assert pq.read_schema(nvtx_file).field("binaryData").type == pa.large_string()
    assert load_trace(directory).nvtx.equals(load_trace(HEALTHY).nvtx)


def test_arrow_ipc_stream_files_are_read_too(tmp_path, converted):
    directory = tmp_path / "stream"
    directory.mkdir()
    for file in converted(HEALTHY, "arrowdir").iterdir():
        with pa.memory_map(str(file)) as source:
            table = ipc.open_file(source).read_all()
        with pa.OSFile(str(directory / file.name), "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    reference = load_trace(HEALTHY)
    streamed = load_trace(directory)
    for kind in FRAME_SCHEMAS:
        assert getattr(streamed, kind).equals(getattr(reference, kind)), kind


def test_text_that_is_not_utf8_is_replaced_and_named(tmp_path, converted):
    directory = tmp_path / "export"
    shutil.copytree(converted(HEALTHY, "parquetdir"), directory)
    strings = pq.read_table(directory / "StringIds.parquet")
    values = [v.encode() for v in strings.column("value").to_pylist()]
    values[0] = b"bad \xff\xfe name"
    pq.write_table(strings.set_column(1, "value", pa.array(values, type=pa.binary())), directory / "StringIds.parquet")
    trace = load_trace(directory)
    assert "invalid UTF-8 in StringIds replaced with U+FFFD" in trace.meta.warnings
    assert trace.kernels.height == 12_383


def test_a_parquet_directory_is_one_export_not_a_directory_of_ranks(converted):
    directory = converted(HEALTHY, "parquetdir")
    assert expand_trace_paths([directory]) == [str(directory)]


def test_a_directory_of_columnar_exports_gives_one_rank_each(tmp_path, converted):
    for name, fmt in (("rank10.parquetdir", "parquetdir"), ("rank2.arrowdir", "arrowdir")):
        shutil.copytree(converted(HEALTHY, fmt), tmp_path / name)
    (tmp_path / "rank2.nsys-rep").write_bytes(b"\x00report of rank 2, exported beside it")
    (tmp_path / "notes").mkdir()
    assert expand_trace_paths([tmp_path]) == [str(tmp_path / "rank2.arrowdir"), str(tmp_path / "rank10.parquetdir")]


# --------------------------------------------------------------------------------------
# Bad directories: one line, exit 2, nothing changed
# --------------------------------------------------------------------------------------


def _tree_hash(directory: Path) -> str:
    digest = hashlib.sha256()
    for file in sorted(directory.iterdir()):
        digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()


def _damaged(tmp_path: Path, converted, fmt: str, damage) -> Path:
    directory = tmp_path / f"damaged.{fmt}"
    shutil.copytree(converted(HEALTHY, fmt), directory)
    damage(directory)
    return directory


def _cut_kernels(suffix: str):
    def cut(directory: Path) -> None:
        file = directory / f"CUPTI_ACTIVITY_KIND_KERNEL{suffix}"
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    return cut


def _text_in_kernel_starts(directory: Path) -> None:
    file = directory / "CUPTI_ACTIVITY_KIND_KERNEL.parquet"
    table = pq.read_table(file)
    starts = pa.array([f"t{v}" for v in table.column("start").to_pylist()])
    pq.write_table(table.set_column(table.schema.get_field_index("start"), "start", starts), file)


BAD_DIRECTORIES = {
    "no-kernel-table": ("parquetdir", lambda d: (d / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink(),
                        "no CUDA kernels: was the capture made with -t cuda? (the directory has no "
                        "CUPTI_ACTIVITY_KIND_KERNEL.parquet or CUPTI_ACTIVITY_KIND_KERNEL.arrow)"),
    "truncated-parquet": ("parquetdir", _cut_kernels(".parquet"),
                          "corrupt or unreadable parquet file CUPTI_ACTIVITY_KIND_KERNEL.parquet"),
    "truncated-arrow": ("arrowdir", _cut_kernels(".arrow"),
                        "corrupt or unreadable arrow file CUPTI_ACTIVITY_KIND_KERNEL.arrow"),
    "not-parquet": ("parquetdir", lambda d: (d / "StringIds.parquet").write_text("id,value\n1,x\n"),
                    "corrupt or unreadable parquet file StringIds.parquet"),
    "text-in-an-integer-column": ("parquetdir", _text_in_kernel_starts,
                                  "unexpected data in table CUPTI_ACTIVITY_KIND_KERNEL"),
}


@pytest.mark.parametrize("name", sorted(BAD_DIRECTORIES))
def test_a_bad_directory_is_one_line_and_exit_2(name, tmp_path, converted):
    fmt, damage, problem = BAD_DIRECTORIES[name]
    directory = _damaged(tmp_path, converted, fmt, damage)
    before = _tree_hash(directory)
    run = subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "check", str(directory), "--expect", str(GLM)],
                         capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run.stderr
    assert lines[0].startswith(f"nsys-ledger: error: {directory}: "), lines[0]
    assert problem in lines[0]
    assert "internal error" not in lines[0]
    assert _tree_hash(directory) == before


# --------------------------------------------------------------------------------------
# .nsys-rep: exported to Parquet once, kept beside the report
# --------------------------------------------------------------------------------------


def _fake_nsys(bin_dir: Path, parquet_source: Path, log: Path, *, parquet: bool = True,
               tables: bool = True) -> None:
    """A stand-in for nsys: `export --type parquetdir ... --output DIR` copies a converted
    export's table files to DIR (or fails, like an nsys older than 2024.6, when `parquet` is
    False, or when given --tables and `tables` is False); `--type sqlite` copies the SQLite
    sample. Every call is logged."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nsys"
    fail_parquet = "" if parquet else 'echo "unknown export type parquetdir" >&2; exit 1'
    fail_tables = "" if tables else 'if [ -n "$listed" ]; then echo "unknown option --tables" >&2; exit 1; fi'
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'listed=""\n'
        'while [ "$#" -gt 0 ]; do case "$1" in --type) kind="$2";; --output) out="$2";; --tables) listed=1;; esac; '
        'shift; done\n'
        f'if [ "$kind" = parquetdir ]; then {fail_parquet or ":"}; {fail_tables or ":"}; mkdir -p "$out"; '
        f'cp "{parquet_source}"/*.parquet "$out"/; exit 0; fi\n'
        f'cp "{HEALTHY}" "$out"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_a_report_is_exported_once_to_parquet_and_reused_while_unchanged(tmp_path, monkeypatch, converted):
    report = tmp_path / "decode.nsys-rep"
    report.write_bytes(b"\x00NSYS-REPORT\xff" * 64)
    digest = hashlib.sha256(report.read_bytes()).hexdigest()
    log = tmp_path / "calls.log"
    _fake_nsys(tmp_path / "bin", converted(HEALTHY, "parquetdir"), log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")

    first = load_trace(report)
    assert first.path == str(report) and first.kernels.height == 12_383
    calls = _calls(log)
    assert len(calls) == 1 and calls[0].startswith("export --type parquetdir --tables StringIds,")
    assert "CUPTI_ACTIVITY_KIND_KERNEL" in calls[0].split()[4].split(",")
    cached = cache_dir_for(report)
    assert (cached / "parquet" / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").is_file()

    assert load_trace(report).kernels.equals(first.kernels)
    assert len(_calls(log)) == 1  # reused

    assert load_trace(report, cache=False).kernels.height == 12_383
    assert len(_calls(log)) == 2  # exported afresh into a temporary directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bin", "calls.log", "decode.nsys-rep", cached.name]

    os.utime(report, ns=(report.stat().st_atime_ns, report.stat().st_mtime_ns + 10**9))  # a new capture
    load_trace(report)
    assert len(_calls(log)) == 3
    assert hashlib.sha256(report.read_bytes()).hexdigest() == digest


def test_an_nsys_without_parquetdir_falls_back_to_sqlite(tmp_path, monkeypatch, converted):
    report = tmp_path / "old.nsys-rep"
    report.write_bytes(b"\x00NSYS-REPORT\xff" * 64)
    log = tmp_path / "calls.log"
    _fake_nsys(tmp_path / "bin", converted(HEALTHY, "parquetdir"), log, parquet=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    trace = load_trace(report)
    assert trace.kernels.equals(load_trace(HEALTHY).kernels)
    assert [c.split()[:4] for c in _calls(log)] == [
        ["export", "--type", "parquetdir", "--tables"], ["export", "--type", "parquetdir", "--output"],
        ["export", "--type", "sqlite", "--output"]]
    assert (cache_dir_for(report) / "export.sqlite").is_file()
    load_trace(report)
    assert len(_calls(log)) == 3


def test_an_nsys_that_refuses_the_table_list_exports_every_table(tmp_path, monkeypatch, converted):
    report = tmp_path / "decode.nsys-rep"
    report.write_bytes(b"\x00NSYS-REPORT\xff" * 64)
    log = tmp_path / "calls.log"
    _fake_nsys(tmp_path / "bin", converted(HEALTHY, "parquetdir"), log, tables=False)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    assert load_trace(report).kernels.height == 12_383
    assert [c.split()[:4] for c in _calls(log)] == [
        ["export", "--type", "parquetdir", "--tables"], ["export", "--type", "parquetdir", "--output"]]
    assert (cache_dir_for(report) / "parquet" / "StringIds.parquet").is_file()


def test_cli_no_cache_leaves_no_cache(tmp_path, converted):
    report = tmp_path / "decode.nsys-rep"
    report.write_bytes(b"\x00NSYS-REPORT\xff" * 64)
    log = tmp_path / "calls.log"
    _fake_nsys(tmp_path / "bin", converted(HEALTHY, "parquetdir"), log)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    run = subprocess.run([sys.executable, "-m", "nsys_ledger.cli", "check", str(report), "--expect", str(GLM),
                          "--no-cache"], capture_output=True, text=True, env=env, check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "checks passed on 4 decode steps" in run.stdout
    assert not cache_dir_for(report).exists()


# --------------------------------------------------------------------------------------
# The generator writes the layouts too
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt,suffix", [("parquetdir", ".parquet"), ("arrowdir", ".arrow")])
def test_synth_writes_a_columnar_export(tmp_path, fmt, suffix, expectations):
    out = tmp_path / f"decode.{fmt}"
    run = CliRunner().invoke(main, ["synth", str(out), "--steps", "3", "--format", fmt])
    assert run.exit_code == 0, run.output
    assert (out / f"CUPTI_ACTIVITY_KIND_KERNEL{suffix}").is_file()
    assert (out / f"StringIds{suffix}").is_file()
    result = nsys_ledger.check(out, expectations)
    assert result.step_table.height == 3
    assert result.step_table["kernels"].to_list() == [2077, 2077, 2077]


def test_synth_refuses_a_directory_that_is_not_empty(tmp_path):
    out = tmp_path / "full"
    out.mkdir()
    (out / "keep.txt").write_text("mine\n")
    run = CliRunner().invoke(main, ["synth", str(out), "--format", "parquetdir"])
    assert run.exit_code == 2
    assert "exists and is not an empty directory" in run.output
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_the_converter_without_the_fast_driver_writes_the_same_tables(tmp_path, monkeypatch, converted):
    """The converter reads through ADBC when it can and through sqlite3 otherwise (and for any
    table ADBC cannot type): both give the same files' contents."""
    monkeypatch.setenv("NSYS_LEDGER_READER", "sqlite3")
    slow = tmp_path / "slow.parquetdir"
    write_columnar(HEALTHY, slow, "parquetdir")
    fast = converted(HEALTHY, "parquetdir")
    assert sorted(p.name for p in slow.iterdir()) == sorted(p.name for p in fast.iterdir())
    for file in sorted(fast.iterdir()):
        assert pq.read_table(slow / file.name).equals(pq.read_table(file)), file.name


def test_names_resolve_the_same_when_string_ids_are_sparse(tmp_path, converted):
    """nsys numbers its strings 0, 1, 2, ... and names are then gathered by id; ids too sparse
    to index by (a hand-made file) are joined instead, with the same result."""
    directory = tmp_path / "export"
    shutil.copytree(converted(HEALTHY, "parquetdir"), directory)
    strings = pq.read_table(directory / "StringIds.parquet")
    extra = pa.table({"id": pa.array([2**40], type=strings.schema.field("id").type),
                      "value": pa.array(["far away"], type=strings.schema.field("value").type)})
    pq.write_table(pa.concat_tables([strings, extra]), directory / "StringIds.parquet")
    reference = load_trace(HEALTHY)
    sparse = load_trace(directory)
    for kind in FRAME_SCHEMAS:
        assert getattr(sparse, kind).equals(getattr(reference, kind)), kind


def test_other_physical_types_read_into_the_same_trace(tmp_path, converted):
    """Another writer may narrow integers (int32, uint32) or dictionary-encode text and use
    large strings; the Trace is the same."""
    directory = tmp_path / "export"
    shutil.copytree(converted(HEALTHY, "parquetdir"), directory)
    narrowed = {
        "StringIds": {"id": pa.int32(), "value": pa.dictionary(pa.int32(), pa.large_string())},
        "CUPTI_ACTIVITY_KIND_KERNEL": {"deviceId": pa.uint32(), "streamId": pa.int32(),
                                       "correlationId": pa.uint32(), "shortName": pa.int32()},
        "CUPTI_ACTIVITY_KIND_RUNTIME": {"correlationId": pa.uint32(), "eventClass": pa.uint8()},
        "NVTX_EVENTS": {"eventType": pa.uint16(), "text": pa.large_string()},
    }
    for table, types in narrowed.items():
        file = directory / f"{table}.parquet"
        data = pq.read_table(file)
        for column, dtype in types.items():
            index = data.schema.get_field_index(column)
            data = data.set_column(index, column, data.column(index).cast(dtype))
        pq.write_table(data, file)
    assert pq.read_schema(directory / "StringIds.parquet").field("id").type == pa.int32()
    reference = load_trace(HEALTHY)
    narrow = load_trace(directory)
    for kind in FRAME_SCHEMAS:
        assert getattr(narrow, kind).equals(getattr(reference, kind)), kind
