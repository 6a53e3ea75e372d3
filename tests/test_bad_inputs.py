"""The bad-input catalog, run through the real console entry (`nsys-ledger`, a subprocess).

Every bad input must give exit code 2, exactly one line on stderr that names the file and the
problem, nothing on stdout, no traceback, and leave every input file's bytes as they were.
The README's exit-code table is checked against the same runs.

All cases are launched together once per module (a process each, a few at a time), so the
catalog costs about as much as its slowest case plus the interpreter start-ups spread over
the CPUs; each parametrized test then judges one finished run.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from nsys_ledger.synth.parquet_writer import write_columnar

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "sample_traces"
HEALTHY = SAMPLES / "glm5-graph-healthy.sqlite"
FAULTED = SAMPLES / "glm5-graph-broken-fusion.sqlite"
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

# A run that takes this long is hung, not slow: the catalog's runs take about a second each.
HANG_GUARD_S = 300


def _console_entry() -> list[str]:
    """The installed `nsys-ledger` script next to this interpreter, else `python -m`."""
    script = Path(sys.executable).with_name("nsys-ledger")
    if script.is_file():
        return [str(script)]
    return [sys.executable, "-m", "nsys_ledger.cli"]


def _sha(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


@dataclass
class Case:
    """One command line and what it must do."""

    argv: list[str]
    blame: str  # the file the error line must name (as shown, control characters escaped)
    problem: str  # a fragment of the problem the line must state
    inputs: list[Path] = field(default_factory=list)  # files whose bytes must not change
    env: dict[str, str] | None = None
    exit_code: int = 2
    result: subprocess.CompletedProcess | None = None
    before: dict[Path, str | None] = field(default_factory=dict)
    after: dict[Path, str | None] = field(default_factory=dict)


# ---- inputs ----------------------------------------------------------------------------------


def _copy(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    return dst


def _with_sql(src: Path, dst: Path, *statements: str) -> Path:
    """A copy of `src` changed by `statements` (the copy, never the source)."""
    _copy(src, dst)
    conn = sqlite3.connect(dst)
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    conn.close()
    return dst


GPID = (1 << 48) | (77 << 24)


def _kernels_with_nulls(dst: Path, rows: list[tuple]) -> Path:
    """nsys's DDL declares start, end and deviceId NOT NULL (and always sets globalPid), so
    NULLs come from a table built without those constraints (a hand-made or third-party
    writer) or from damage; the reader must still say what is wrong. Rows: (start, end,
    deviceId, correlationId, globalPid)."""
    conn = sqlite3.connect(dst)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute(
        "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, deviceId INTEGER, "
        "streamId INTEGER, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER, "
        "shortName INTEGER)"
    )
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", [(1, "void k()"), (2, "k")])
    conn.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, 7, ?, ?, 1, 2)", rows)
    conn.commit()
    conn.close()
    return dst


def _other_app_database(dst: Path) -> Path:
    conn = sqlite3.connect(dst)
    conn.execute("CREATE TABLE moz_places (id INTEGER PRIMARY KEY, url TEXT, visit_count INTEGER)")
    conn.execute("INSERT INTO moz_places VALUES (1, 'https://example.org', 3)")
    conn.commit()
    conn.close()
    return dst


def _executable(path: Path, body: str) -> Path:
    path.parent.mkdir(exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _glm_variant(dst: Path, old: str, new: str) -> Path:
    text = GLM.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    dst.write_text(text.replace(old, new), encoding="utf-8")
    return dst


RMSNORM_ANCHOR = 'expected = "2 * layers"                  # rows 1 and 14 of every layer: 156'


def _catalog(tmp: Path) -> dict[str, Case]:
    """Every case of the catalog, keyed by test id."""
    cases: dict[str, Case] = {}

    def trace_case(name: str, path: Path, problem: str, *extra: str, blame: str | None = None,
                   env: dict[str, str] | None = None) -> None:
        cases[name] = Case(["check", str(path), *extra], blame or str(path), problem, [path], env)

    # -- not a trace file at all
    trace_case("missing-path", tmp / "nope.sqlite", "no such file")
    # A directory stands for the trace files in it (one rank each); one without any is an error.
    no_traces = tmp / "no-traces"
    no_traces.mkdir()
    (no_traces / "notes.txt").write_text("not a trace\n")
    trace_case("directory", no_traces, "is a directory without trace files")
    empty = tmp / "empty.sqlite"
    empty.write_bytes(b"")
    trace_case("empty-file", empty, "empty file")
    text = tmp / "notes.sqlite"
    text.write_text("start,end,name\n1,2,fused_add_rmsnorm\n")
    trace_case("text-file", text, "not an SQLite database (text file)")
    gz = tmp / "trace.sqlite.gz"
    gz.write_bytes(gzip.compress(HEALTHY.read_bytes()[:65536]))
    trace_case("gzip", gz, "not an SQLite database (gzip data)")
    newline_name = tmp / "two\nlines.sqlite"
    newline_name.write_text("not a trace\n")
    trace_case("newline-in-file-name", newline_name, "not an SQLite database",
               blame=str(tmp / "two\\nlines.sqlite"))

    # -- .nsys-rep reports: converted by `nsys export` when nsys is on PATH
    report = tmp / "decode.nsys-rep"
    report.write_bytes(b"\x00\x01NSYS-REPORT\xff" * 256)
    empty_bin = tmp / "empty-bin"
    empty_bin.mkdir()
    trace_case("nsys-rep-without-nsys", report, "nsys is not on PATH",
               env={"PATH": str(empty_bin)})
    # A stand-in for nsys: `nsys export --type sqlite --output OUT REPORT` copies a sample.
    converting_bin = tmp / "converting-bin"
    _executable(
        converting_bin / "nsys",
        'while [ "$#" -gt 0 ]; do if [ "$1" = "--output" ]; then out="$2"; fi; shift; done\n'
        f'cp "{HEALTHY}" "$out"\n',
    )
    cases["nsys-rep-converted-by-nsys"] = Case(
        ["check", str(report), "--expect", str(GLM)], str(report), "checks passed on 4 decode steps",
        [report], {"PATH": f"{converting_bin}{os.pathsep}{os.environ.get('PATH', '')}"}, exit_code=0,
    )
    failing_bin = tmp / "failing-bin"
    _executable(failing_bin / "nsys", 'echo "ERROR: the report file is damaged" >&2\nexit 3\n')
    # a report of its own: the converted one above leaves its export cached beside it
    damaged_report = tmp / "damaged.nsys-rep"
    damaged_report.write_bytes(report.read_bytes())
    trace_case("nsys-rep-export-fails", damaged_report, "nsys export failed (exit 3)",
               env={"PATH": str(failing_bin)})

    # -- nsys export --type parquetdir / arrowdir directories (converted from the sample)
    no_kernels = tmp / "no-kernels.parquetdir"
    write_columnar(HEALTHY, no_kernels, "parquetdir")
    (no_kernels / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
    trace_case("parquetdir-no-kernel-table", no_kernels, "no CUDA kernels: was the capture made with -t cuda?")
    cut_table = tmp / "cut-table.arrowdir"
    write_columnar(HEALTHY, cut_table, "arrowdir")
    kernel_file = cut_table / "CUPTI_ACTIVITY_KIND_KERNEL.arrow"
    kernel_file.write_bytes(kernel_file.read_bytes()[:4096])
    trace_case("arrowdir-truncated-table", cut_table,
               "corrupt or unreadable arrow file CUPTI_ACTIVITY_KIND_KERNEL.arrow")

    # -- damaged SQLite: an interrupted copy or export
    data = HEALTHY.read_bytes()
    for label, size in (("100", 100), ("4096", 4096), ("half", len(data) // 2),
                        ("last-page", len(data) - 4096), ("minus-1", len(data) - 1)):
        cut = tmp / f"cut-{label}.sqlite"
        cut.write_bytes(data[:size])
        trace_case(f"truncated-{label}", cut, "truncated SQLite database")

    # a byte of the schema's SQL text damaged: SQLite's error quotes it, and it is not UTF-8
    # (found by the fuzzer: it used to escape as a UnicodeDecodeError)
    schema = bytearray(data)
    at = schema.find(b"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (")
    schema[at + len(b"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ")] = 0xFF
    damaged_schema = tmp / "damaged-schema.sqlite"
    damaged_schema.write_bytes(bytes(schema))
    trace_case("damaged-schema-not-utf8", damaged_schema, "corrupt SQLite database (damaged schema")

    # -- SQLite, but not a usable nsys export
    trace_case("sqlite-not-nsys", _other_app_database(tmp / "places.sqlite"),
               "not an Nsight Systems export")
    trace_case("no-kernel-table",
               _with_sql(HEALTHY, tmp / "no-kernels.sqlite", "DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL"),
               "no CUDA kernels: was the capture made with -t cuda?")
    trace_case("null-timestamps",
               _kernels_with_nulls(tmp / "nulls.sqlite", [(10, 20, 0, 1, GPID), (None, 30, 0, 2, GPID),
                                                          (40, None, 0, 3, GPID)]),
               "2 of 3 kernel rows have a NULL or inverted start/end")
    trace_case("null-device-and-process",
               _kernels_with_nulls(tmp / "no-device.sqlite", [(10, 20, 0, 1, GPID), (30, 40, None, 2, GPID),
                                                              (50, 60, 0, 3, None)]),
               "1 of 3 kernel rows have no deviceId (CUPTI_ACTIVITY_KIND_KERNEL); the export is damaged")
    inverted = _with_sql(
        HEALTHY, tmp / "inverted.sqlite",
        "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 5 WHERE rowid IN (10, 20, 30)",
    )
    trace_case("inverted-timestamps", inverted, "3 of 12383 kernel rows have a NULL or inverted")
    # held by the fixture with BEGIN EXCLUSIVE while the runs go
    trace_case("locked-database", _copy(HEALTHY, tmp / "locked.sqlite"), "database is locked")

    # -- expectations (the ledger)
    def expect_case(name: str, path: Path, problem: str, *, command: str = "check") -> None:
        argv = ["check", str(HEALTHY), "--expect", str(path)] if command == "check" else \
            ["expectations", "show", str(path)]
        cases[name] = Case(argv, str(path), problem, [path, HEALTHY])

    expect_case("expect-missing", tmp / "nope.toml", "no such file")
    not_toml = tmp / "not-toml.toml"
    not_toml.write_text(GLM.read_text(encoding="utf-8") + "\nbroken = = 3\n", encoding="utf-8")
    expect_case("expect-not-toml", not_toml, "not valid TOML")
    expect_case("expect-not-toml-show", not_toml, "not valid TOML", command="show")
    expect_case("expect-unknown-op",
                _glm_variant(tmp / "unknown-op.toml", "[anchors.sampling]", "[anchors.samplnig]"),
                "unknown op 'samplnig'")
    expect_case("expect-unknown-param",
                _glm_variant(tmp / "unknown-param.toml", RMSNORM_ANCHOR, 'expected = "2 * layer"'),
                "unknown name 'layer'")
    expect_case("expect-unknown-param-in-params",
                _glm_variant(tmp / "unknown-param2.toml", 'moe_layers = "layers - dense_layers"',
                             'moe_layers = "layers - dense"'),
                "unknown parameter 'dense'")
    expect_case("expect-invalid-regex",
                _glm_variant(tmp / "bad-regex.toml", "patterns = ['FusedAddRMSNormKernel'",
                             "patterns = ['FusedAdd(RMSNormKernel'"),
                "invalid regex")
    # The formula would create a file if it were ever run; the case checks it never appears.
    expect_case("expect-formula-import",
                _glm_variant(tmp / "import.toml", RMSNORM_ANCHOR,
                             """expected = "__import__('os').system('touch PWNED') + 156\""""),
                "__import__")
    expect_case("expect-formula-attribute",
                _glm_variant(tmp / "attribute.toml", RMSNORM_ANCHOR,
                             'expected = "layers.__class__.__mro__"'),
                "attribute access")
    expect_case("expect-formula-huge-exponent",
                _glm_variant(tmp / "exponent.toml", RMSNORM_ANCHOR, 'expected = "9 ** 9 ** 9"'),
                "exponent")
    expect_case("expect-contradictory-range",
                _glm_variant(tmp / "contradictory.toml", RMSNORM_ANCHOR, "min = 200\nmax = 100"),
                "contradictory")

    # -- output paths that cannot be written (found before any work is done)
    def output_case(name: str, path: Path, problem: str, *, command: str = "check") -> None:
        argv = ["check", str(HEALTHY), "--json", str(path)] if command == "check" else \
            ["synth", str(path), "--steps", "1"]
        cases[name] = Case(argv, str(path), problem, [HEALTHY])

    output_case("json-dir-missing", tmp / "no" / "such" / "dir" / "r.json", "does not exist")
    output_case("json-is-directory", tmp, "cannot write output: is a directory")
    output_case("json-parent-is-file", empty / "r.json", "is not a directory")
    output_case("synth-dir-missing", tmp / "no" / "such" / "t.sqlite", "does not exist",
                command="synth")
    if os.geteuid() != 0:  # root writes anywhere
        read_only = tmp / "read-only"
        read_only.mkdir()
        read_only.chmod(stat.S_IRUSR | stat.S_IXUSR)
        output_case("json-permission-denied", read_only / "r.json", "permission denied")

    # -- the other two exit codes, for the README table
    cases["exit-0-pass"] = Case(["check", str(HEALTHY), "--expect", str(GLM)], str(HEALTHY),
                                "checks passed on 4 decode steps", [HEALTHY, GLM],
                                exit_code=0)
    cases["exit-1-violated"] = Case(["check", str(FAULTED), "--expect", str(GLM)], str(FAULTED),
                                    "[anchors.per_token_group_quant]", [FAULTED, GLM], exit_code=1)
    return cases


def _run(case: Case, cwd: Path) -> None:
    env = dict(os.environ)
    env.pop("NSYS_LEDGER_DEBUG", None)
    env.update(case.env or {})
    case.result = subprocess.run(
        _console_entry() + case.argv, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S, check=False,
    )


@dataclass
class Catalog:
    cases: dict[str, Case]
    run_dir: Path  # the working directory of every run (starts empty)


@pytest.fixture(scope="module")
def catalog(tmp_path_factory) -> Catalog:
    tmp = tmp_path_factory.mktemp("bad-inputs")
    run_dir = tmp_path_factory.mktemp("cwd")
    cases = _catalog(tmp)
    for case in cases.values():
        case.before = {p: _sha(p) for p in case.inputs}
    holder = sqlite3.connect(tmp / "locked.sqlite", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with ThreadPoolExecutor(max_workers=max(2, (os.cpu_count() or 2))) as pool:
            list(pool.map(lambda c: _run(c, run_dir), cases.values()))
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    for case in cases.values():
        case.after = {p: _sha(p) for p in case.inputs}
    return Catalog(cases, run_dir)


ERROR_CASES = [
    "missing-path", "directory", "empty-file", "text-file", "gzip", "newline-in-file-name",
    "nsys-rep-without-nsys", "nsys-rep-export-fails",
    "truncated-100", "truncated-4096", "truncated-half", "truncated-last-page", "truncated-minus-1",
    "damaged-schema-not-utf8", "parquetdir-no-kernel-table", "arrowdir-truncated-table",
    "sqlite-not-nsys", "no-kernel-table", "null-timestamps", "null-device-and-process",
    "inverted-timestamps",
    "locked-database",
    "expect-missing", "expect-not-toml", "expect-not-toml-show", "expect-unknown-op",
    "expect-unknown-param", "expect-unknown-param-in-params", "expect-invalid-regex",
    "expect-formula-import", "expect-formula-attribute", "expect-formula-huge-exponent",
    "expect-contradictory-range",
    "json-dir-missing", "json-is-directory", "json-parent-is-file", "synth-dir-missing",
    "json-permission-denied",
]


@pytest.mark.parametrize("name", ERROR_CASES)
def test_bad_input_is_one_line_exit_2_and_changes_nothing(catalog, name):
    if name not in catalog.cases:
        pytest.skip("running as root: every directory is writable")
    case = catalog.cases[name]
    result = case.result
    assert result.returncode == 2, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    line = lines[0]
    assert line.startswith(f"nsys-ledger: error: {case.blame}: "), line
    assert case.problem in line, line
    assert "Traceback" not in result.stderr
    assert "internal error" not in line
    assert case.after == case.before


def test_nsys_rep_is_converted_with_nsys_on_path_and_checked(catalog):
    case = catalog.cases["nsys-rep-converted-by-nsys"]
    assert case.result.returncode == 0, case.result.stderr
    assert case.result.stderr == ""
    assert f"nsys-ledger check {case.blame}" in case.result.stdout
    assert case.problem in case.result.stdout
    assert case.after == case.before


def test_formula_with_import_never_runs(catalog):
    assert catalog.cases["expect-formula-import"].result.returncode == 2
    assert list(catalog.run_dir.iterdir()) == []  # no PWNED, nor anything else


def test_the_lock_did_not_outlive_the_run(catalog):
    """The locked copy reads fine once the lock is released: the error was the lock."""
    locked = catalog.cases["locked-database"]
    result = subprocess.run(_console_entry() + ["check", locked.blame], capture_output=True, text=True,
                            timeout=HANG_GUARD_S, check=False)
    assert result.returncode == 0, result.stderr
    assert "4 decode steps" in result.stdout


def _readme_exit_codes() -> dict[int, str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("### Exit codes", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*(.+?)\s*\|\s*$", section, flags=re.MULTILINE)
    return {int(code): meaning for code, meaning in rows}


def test_readme_lists_the_exit_codes_the_catalog_produces(catalog):
    table = _readme_exit_codes()
    assert sorted(table) == [0, 1, 2]
    assert "passed" in table[0]
    assert "violated" in table[1]
    assert "one line on stderr" in table[2] and "never modified" in table[2]
    cases = catalog.cases
    assert {case.result.returncode for case in cases.values()} == {0, 1, 2}
    assert cases["exit-0-pass"].result.returncode == 0
    assert cases["exit-0-pass"].problem in cases["exit-0-pass"].result.stdout
    assert cases["exit-1-violated"].result.returncode == 1
    assert cases["exit-1-violated"].problem in cases["exit-1-violated"].result.stdout
    for name in ("exit-0-pass", "exit-1-violated"):
        assert cases[name].after == cases[name].before
