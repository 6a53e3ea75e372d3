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


def _folder_state(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder`: its kind, its bytes' sha256 and its mtime (links not followed),
    so a changed byte, a touched file or a new side file (-wal, -shm, a cache) all show."""
    state = {}
    for item in sorted(folder.rglob("*")):
        st = item.lstat()
        if stat.S_ISREG(st.st_mode):
            state[str(item.relative_to(folder))] = ("file", _sha(item), st.st_mtime_ns)
        elif stat.S_ISLNK(st.st_mode):
            state[str(item.relative_to(folder))] = ("link", os.readlink(item), st.st_mtime_ns)
        else:
            state[str(item.relative_to(folder))] = ("other", stat.S_IFMT(st.st_mode), st.st_mtime_ns)
    return state


@dataclass
class Case:
    """One command line and what it must do."""

    argv: list[str]
    blame: str  # the file the error line must name (as shown, control characters escaped)
    problem: str  # a fragment of the problem the line must state
    inputs: list[Path] = field(default_factory=list)  # files whose bytes must not change
    env: dict[str, str] | None = None
    exit_code: int = 2
    stdin: str | None = None
    # folders whose every entry (names, bytes, modification times, side files) must not change
    folders: list[Path] = field(default_factory=list)
    result: subprocess.CompletedProcess | None = None
    before: dict[Path, str | None] = field(default_factory=dict)
    after: dict[Path, str | None] = field(default_factory=dict)
    folders_before: dict[Path, dict] = field(default_factory=dict)
    folders_after: dict[Path, dict] = field(default_factory=dict)


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

    cases.update(_robust_catalog(tmp / "robust"))

    # -- the other two exit codes, for the README table
    cases["exit-0-pass"] = Case(["check", str(HEALTHY), "--expect", str(GLM)], str(HEALTHY),
                                "checks passed on 4 decode steps", [HEALTHY, GLM],
                                exit_code=0)
    cases["exit-1-violated"] = Case(["check", str(FAULTED), "--expect", str(GLM)], str(FAULTED),
                                    "[anchors.per_token_group_quant]", [FAULTED, GLM], exit_code=1)
    return cases


# ---- never lose a byte (issue 20): outputs over inputs, side files, hangs, blow-ups ------------
#
# Each case lives in a folder of its own, and the whole folder (names, bytes, modification
# times, links) must be as it was after the run: nothing overwritten, nothing written beside.

LONG_NAME = "a" * 50_000 + "!"  # `(a+)+$` backtracks exponentially on it in Python's re


def _kineto_events(**changes) -> dict:
    """A tiny Kineto trace (one launch, its kernel and an H2D copy); `changes` edit the events
    as "event.field" (event: call, kernel, copy; field: a key or args.KEY)."""
    events = {
        "call": {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 11, "tid": 11, "ts": 5,
                 "dur": 2, "args": {"correlation": 1}},
        "kernel": {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5,
                   "args": {"device": 0, "stream": 7, "correlation": 1}},
        "copy": {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
                 "ts": 20, "dur": 5, "args": {"device": 0, "stream": 7, "correlation": 2, "bytes": 4096}},
    }
    for key, value in changes.items():
        event, _, name = key.partition(".")
        target = events[event]
        if name.startswith("args."):
            target, name = target["args"], name[len("args."):]
        target[name] = value
    return {"traceEvents": list(events.values())}


def _glm_text(old: str, new: str) -> str:
    text = GLM.read_text(encoding="utf-8")
    assert text.count(old) == 1, old
    return text.replace(old, new)


def _write_json(path: Path, document: object) -> Path:
    import json

    path.write_text(json.dumps(document))
    return path


def _wal_export(dst: Path, *statements: str, keep_wal: bool) -> Path:
    """A copy of the healthy sample in WAL mode; `statements` committed to its -wal file and
    left there (not checkpointed) when `keep_wal`, as a copy taken from a live database is."""
    _copy(HEALTHY, dst)
    conn = sqlite3.connect(dst)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    for statement in statements:
        conn.execute(statement)
    conn.commit()
    if keep_wal:  # closing would checkpoint and delete the -wal: copy the pair while it is open
        shutil.copyfile(dst, dst.with_name("copied.sqlite"))
        shutil.copyfile(f"{dst}-wal", dst.with_name("copied.sqlite-wal"))
    conn.close()
    if keep_wal:
        os.replace(dst.with_name("copied.sqlite"), dst)
        os.replace(dst.with_name("copied.sqlite-wal"), f"{dst}-wal")
    for side in ("-shm", "-journal"):
        Path(f"{dst}{side}").unlink(missing_ok=True)
    assert Path(f"{dst}-wal").exists() == keep_wal
    return dst


def _gzip_bomb(path: Path, inflated: int) -> Path:
    import zlib

    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    with open(path, "wb") as out:
        for _ in range(inflated // len(chunk)):
            out.write(packer.compress(chunk))
        out.write(packer.flush())
    return path


def _robust_catalog(root: Path) -> dict[str, Case]:
    cases: dict[str, Case] = {}

    def folder(name: str) -> Path:
        path = root / name
        path.mkdir(parents=True)
        return path

    def case(name: str, argv: list, blame: str | Path, problem: str, *, exit_code: int = 2,
             stdin: str | None = None, env: dict[str, str] | None = None, inputs: list[Path] = ()) -> None:
        assert ROBUST_CASES[name] == exit_code, name
        cases[name] = Case([str(a) for a in argv], str(blame), problem, list(inputs), env, exit_code, stdin,
                           [root / name])

    def trace_in(name: str, source: Path = HEALTHY, as_name: str = "t.sqlite") -> Path:
        return _copy(source, folder(name) / as_name)

    def ledger_in(where: Path, text: str | None = None, as_name: str = "ledger.toml") -> Path:
        target = where / as_name
        target.write_text(GLM.read_text(encoding="utf-8") if text is None else text, encoding="utf-8")
        return target

    # -- 1. outputs over inputs: refused before any work, naming the output and the input
    t = trace_in("out-json-onto-trace")
    case("out-json-onto-trace", ["check", t, "--json", t], t, "cannot write output (--json): it is the input")
    t = trace_in("out-trace-out-onto-trace")
    case("out-trace-out-onto-trace", ["check", t, "--trace-out", t], t, "(--trace-out): it is the input")
    t = trace_in("out-html-onto-ledger")
    ledger = ledger_in(t.parent)
    case("out-html-onto-ledger", ["check", t, "--expect", ledger, "--html", ledger], ledger,
         f"(--html): it is the input {ledger}")
    t = trace_in("out-markdown-onto-capture")
    capture = _copy(SAMPLES / "glm5-graph-healthy.trace.json.gz", t.parent / "capture.trace.json.gz")
    case("out-markdown-onto-capture", ["check", t, "--capture", capture, "--markdown", capture], capture,
         "(--markdown): it is the input")
    a = trace_in("out-diff-json-onto-before")
    b = _copy(FAULTED, a.parent / "b.sqlite")
    case("out-diff-json-onto-before", ["diff", a, b, "--json", a], a, "(--json): it is the input")
    t = trace_in("out-symlink-to-trace")
    (t.parent / "link.json").symlink_to(t.name)
    case("out-symlink-to-trace", ["check", t, "--json", t.parent / "link.json"], t.parent / "link.json",
         f"(--json): it is the input {t}")
    t = trace_in("out-hardlink-to-trace")
    os.link(t, t.parent / "hard.json")
    case("out-hardlink-to-trace", ["check", t, "--junit", t.parent / "hard.json"], t.parent / "hard.json",
         f"(--junit): it is the input {t}")
    parquet = folder("out-inside-parquetdir") / "t.parquetdir"
    write_columnar(HEALTHY, parquet, "parquetdir")
    case("out-inside-parquetdir", ["check", parquet, "--json", parquet / "r.json"], parquet / "r.json",
         f"(--json): it is inside the input directory {parquet}")
    t = trace_in("out-side-file-of-trace")  # SQLite would take it for the trace's write-ahead log
    case("out-side-file-of-trace", ["check", t, "--json", f"{t}-wal"], f"{t}-wal", f"it is the input {t}")
    t = trace_in("out-two-outputs-one-file")
    case("out-two-outputs-one-file", ["check", t, "--json", t.parent / "r.out", "--html", t.parent / "r.out"],
         t.parent / "r.out", "(--html): --json writes the same file")
    t = trace_in("learn-out-onto-trace")
    case("learn-out-onto-trace", ["learn", t, "--out", t], t, "cannot write output (--out): it is the input")
    t = trace_in("learn-out-onto-base")
    ledger = ledger_in(t.parent)
    case("learn-out-onto-base", ["learn", t, "--base", ledger, "--out", ledger], ledger,
         "cannot write output (--out): it is the input")

    # -- 3. hangs: a FIFO is refused before it is opened for a blocking read
    fifo = folder("fifo-trace") / "t.sqlite"
    os.mkfifo(fifo)
    case("fifo-trace", ["check", fifo], fifo, "is a FIFO (named pipe), not a regular file")
    fifo = folder("fifo-kineto") / "t.trace.json.gz"
    os.mkfifo(fifo)
    case("fifo-kineto", ["check", fifo], fifo, "is a FIFO (named pipe), not a regular file")
    t = trace_in("fifo-ledger")
    os.mkfifo(t.parent / "ledger.toml")
    case("fifo-ledger", ["check", t, "--expect", t.parent / "ledger.toml"], t.parent / "ledger.toml",
         "is a FIFO (named pipe), not a regular file")
    t = trace_in("fifo-learn-base")
    os.mkfifo(t.parent / "base.toml")
    case("fifo-learn-base", ["learn", t, "--base", t.parent / "base.toml", "--out", t.parent / "new.toml"],
         t.parent / "base.toml", "is a FIFO (named pipe)")

    # -- 4. unbounded memory: bounds are checked before anything is expanded or read whole
    t = trace_in("layer-range-huge")
    ledger = ledger_in(t.parent, _glm_text('layers = "0-2, 6-74/4"', 'layers = "0-2, 6-999999999/4"'))
    case("layer-range-huge", ["check", t, "--expect", ledger], ledger, "layer 78 is outside 0-77")
    t = trace_in("ledger-dev-zero")
    case("ledger-dev-zero", ["check", t, "--expect", "/dev/zero"], "/dev/zero",
         "is a character device, not a regular file")
    t = trace_in("ledger-too-large")
    big = ledger_in(t.parent, GLM.read_text(encoding="utf-8") + "#" * (5 * 1024 * 1024) + "\n")
    case("ledger-too-large", ["check", t, "--expect", big], big, "larger than 4.0 MiB: too large for an expectations")
    bomb = _gzip_bomb(folder("gzip-bomb") / "t.trace.json.gz", 256 * 1024 * 1024)
    case("gzip-bomb", ["check", bomb], bomb, "gzip data inflates to more than 64.0 MiB")

    # -- 5. what used to be an internal error: now one line naming the file or the option
    deep = _write_json(folder("json-nested-100000") / "t.json", None)
    deep.write_text("[" * 100_000 + "]" * 100_000)
    case("json-nested-100000", ["check", deep], deep, "JSON nested too deeply")
    t = trace_in("toml-nested-50000")
    ledger = ledger_in(t.parent, "x = " + "[" * 50_000 + "]" * 50_000 + "\n")
    case("toml-nested-50000", ["check", t, "--expect", ledger], ledger, "nested too deeply")
    t = trace_in("param-chain-3000")
    chain = "\n".join([f'c{i} = "c{i + 1} + 1"' for i in range(2999)] + ["c2999 = 1"])
    ledger = ledger_in(t.parent, _glm_text("\n[params]\n", f"\n[params]\n{chain}\n"))
    case("param-chain-3000", ["check", t, "--expect", ledger], ledger, "nested too deeply to evaluate")
    parquet = folder("parquet-table-symlink-loop") / "t.parquetdir"
    write_columnar(HEALTHY, parquet, "parquetdir")
    (parquet / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").unlink()
    (parquet / "CUPTI_ACTIVITY_KIND_KERNEL.parquet").symlink_to("CUPTI_ACTIVITY_KIND_KERNEL.parquet")
    case("parquet-table-symlink-loop", ["check", parquet], parquet,
         "table file CUPTI_ACTIVITY_KIND_KERNEL.parquet is a symlink loop")
    loop = folder("trace-symlink-loop") / "t.sqlite"
    loop.symlink_to(loop.name)
    case("trace-symlink-loop", ["check", loop], loop, "symlink loop")
    for label, value, problem in (("nan", "nan", "NaN"), ("inf", "inf", "infinite"), ("negative", "-1", "above 0")):
        t = trace_in(f"gap-us-{label}")
        case(f"gap-us-{label}", ["check", t, "--gap-us", value], "--gap-us", problem)
    t = trace_in("batch-10e30")
    case("batch-10e30", ["check", t, "--batch", 10**30], "--batch", "is not in the range 1<=x<=1000000")
    t = trace_in("step-nvtx-unclosed")
    case("step-nvtx-unclosed", ["check", t, "--step-nvtx", "("], "--step-nvtx", "invalid regex")
    t = trace_in("diff-step-nvtx-unclosed")
    case("diff-step-nvtx-unclosed", ["diff", t, t, "--step-nvtx", "[z-a]"], "--step-nvtx", "invalid regex")
    for label, value, problem in (("nan", "x=nan", "NaN"), ("1e400", "x=1e400", "infinite")):
        t = trace_in(f"learn-params-{label}")
        case(f"learn-params-{label}", ["learn", t, "--out", t.parent / "new.toml", "--params", value], "--params",
             problem)
    t = trace_in("learn-from-steps-reversed")
    case("learn-from-steps-reversed", ["learn", t, "--out", t.parent / "new.toml", "--from-steps", "3-1"],
         "--from-steps", "the first step 3 is after the last 1")
    t = trace_in("learn-out-dev-full")
    case("learn-out-dev-full", ["learn", t, "--out", "/dev/full", "--no-verify"], "/dev/full",
         "cannot write output: No space left on device")

    # -- 6. values no profiler writes
    negative = _write_json(folder("kineto-negative-dur") / "t.json", _kineto_events(**{"kernel.dur": -5}))
    case("kineto-negative-dur", ["check", negative], negative, "1 of 1 events have a negative duration (dur)")
    big_pid = _write_json(folder("kineto-pid-past-64-bits") / "t.json", _kineto_events(**{"call.pid": 2**70}))
    case("kineto-pid-past-64-bits", ["check", big_pid], big_pid,
         f"pid value {2**70} does not fit 64 bits")
    big_tid = _write_json(folder("kineto-tid-past-64-bits") / "t.json", _kineto_events(**{"call.tid": -(2**64)}))
    case("kineto-tid-past-64-bits", ["check", big_tid], big_tid, f"tid value {-(2**64)} does not fit 64 bits")
    huge = _write_json(folder("kineto-copy-1e30-bytes") / "t.json", _kineto_events(**{"copy.args.bytes": 1e30}))
    case("kineto-copy-1e30-bytes", ["check", huge], huge, "args.bytes value 1e+30 does not fit 64 bits")
    quoted = _write_json(folder("kineto-quoted-huge-correlation") / "t.json",
                         _kineto_events(**{"kernel.args.correlation": "99999999999999999999999"}))
    case("kineto-quoted-huge-correlation", ["check", quoted], quoted,
         "args.correlation value 99999999999999999999999 does not fit 64 bits")
    minus = _write_json(folder("kineto-negative-bytes") / "t.json", _kineto_events(**{"copy.args.bytes": -4096}))
    case("kineto-negative-bytes", ["check", minus], minus, "1 of 1 copy or memset events have a negative size")
    t = folder("sqlite-negative-copy-bytes") / "t.sqlite"
    _with_sql(HEALTHY, t, "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET bytes = -5 WHERE rowid = 1")
    case("sqlite-negative-copy-bytes", ["check", t], t, "1 of 15 memcpy rows have a negative size (bytes")
    parquet = folder("parquetdir-without-stringids") / "t.parquetdir"
    write_columnar(HEALTHY, parquet, "parquetdir")
    (parquet / "StringIds.parquet").unlink()
    case("parquetdir-without-stringids", ["check", parquet], parquet,
         "not an Nsight Systems export (no StringIds table)")
    parquet = folder("parquetdir-table-is-device") / "t.parquetdir"
    write_columnar(HEALTHY, parquet, "parquetdir")
    (parquet / "StringIds.parquet").unlink()
    (parquet / "StringIds.parquet").symlink_to("/dev/zero")
    case("parquetdir-table-is-device", ["check", parquet], parquet,
         "table file StringIds.parquet is a character device, not a regular file")

    # -- 7. good input that used to be refused, and a broken export that used to be cached
    as_json = trace_in("sqlite-named-json", as_name="t.json")
    case("sqlite-named-json", ["check", as_json, "--expect", GLM], as_json, "checks passed on 4 decode steps",
         exit_code=0)
    bin_dir = folder("nsys-rep-broken-export") / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "nsys", 'case "$*" in *parquetdir*) exit 1;; esac\n'
                'while [ "$#" -gt 0 ]; do if [ "$1" = "--output" ]; then out="$2"; fi; shift; done\n'
                'echo "half an export" > "$out"\n')
    report = bin_dir.parent / "decode.nsys-rep"
    report.write_bytes(b"\x00\x01NSYS-REPORT\xff" * 256)
    case("nsys-rep-broken-export", ["check", report], report,
         "not an SQLite database (text file) (in the SQLite export nsys made)",
         env={"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"})

    # -- 2. WAL-mode exports: read as they are, nothing beside them created or rewritten
    wal = _wal_export(folder("wal-mode-export") / "t.sqlite", keep_wal=False)
    case("wal-mode-export", ["check", wal, "--expect", GLM], wal, "checks passed on 4 decode steps", exit_code=0)
    wal = _wal_export(folder("wal-with-committed-log") / "t.sqlite", "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY",
                      keep_wal=True)
    case("wal-with-committed-log", ["check", wal], wal, "12,383 kernels (device 0: 12,383); 0 H2D copies",
         exit_code=0)

    # found by the fuzzer: a header whose read version alone says WAL made SQLite create -shm/-wal
    damaged = folder("damaged-header-says-wal") / "t.sqlite"
    header = bytearray(HEALTHY.read_bytes())
    header[18], header[19] = 1, 2
    damaged.write_bytes(bytes(header))
    case("damaged-header-says-wal", ["check", damaged], damaged, "4 decode steps", exit_code=0)

    # -- 3. a pattern that backtracks exponentially in Python's re, on a 50,001-character name
    t = folder("redos-op-pattern") / "t.sqlite"
    _with_sql(HEALTHY, t, f"UPDATE StringIds SET value = '{LONG_NAME}' WHERE id = "
                          "(SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL LIMIT 1)")
    ledger = ledger_in(t.parent, _glm_text("patterns = ['FusedAddRMSNormKernel'",
                                           "patterns = ['(a+)+$', 'FusedAddRMSNormKernel'"))
    # the long name replaces the name every qkv_a_proj kernel shares, so the layers' sequences
    # miss that op (exit 1): the point is that the check finishes, with its verdict
    case("redos-op-pattern", ["check", t, "--expect", ledger], t,
         "FAIL 4 finding(s) in 20 checks on 4 decode steps", exit_code=1)
    case("redos-expectations-match", ["expectations", "match", ledger], ledger, f"no op\t-\t-\t{LONG_NAME}",
         exit_code=0, stdin=f"{LONG_NAME}\nFusedAddRMSNormKernel\n")
    return cases


# name -> the exit code; 2 joins ERROR_CASES (one line naming the file or option)
ROBUST_CASES = {
    "out-json-onto-trace": 2, "out-trace-out-onto-trace": 2, "out-html-onto-ledger": 2,
    "out-markdown-onto-capture": 2, "out-diff-json-onto-before": 2, "out-symlink-to-trace": 2,
    "out-hardlink-to-trace": 2, "out-inside-parquetdir": 2, "out-side-file-of-trace": 2,
    "out-two-outputs-one-file": 2, "learn-out-onto-trace": 2, "learn-out-onto-base": 2,
    "fifo-trace": 2, "fifo-kineto": 2, "fifo-ledger": 2, "fifo-learn-base": 2,
    "layer-range-huge": 2, "ledger-dev-zero": 2, "ledger-too-large": 2, "gzip-bomb": 2,
    "json-nested-100000": 2, "toml-nested-50000": 2, "param-chain-3000": 2, "parquet-table-symlink-loop": 2,
    "trace-symlink-loop": 2, "gap-us-nan": 2, "gap-us-inf": 2, "gap-us-negative": 2, "batch-10e30": 2,
    "step-nvtx-unclosed": 2, "diff-step-nvtx-unclosed": 2, "learn-params-nan": 2, "learn-params-1e400": 2,
    "learn-from-steps-reversed": 2, "learn-out-dev-full": 2,
    "kineto-negative-dur": 2, "kineto-pid-past-64-bits": 2, "kineto-tid-past-64-bits": 2,
    "kineto-copy-1e30-bytes": 2, "kineto-quoted-huge-correlation": 2, "kineto-negative-bytes": 2,
    "sqlite-negative-copy-bytes": 2, "parquetdir-without-stringids": 2, "parquetdir-table-is-device": 2,
    "nsys-rep-broken-export": 2,
    "sqlite-named-json": 0, "wal-mode-export": 0, "wal-with-committed-log": 0, "redos-op-pattern": 1,
    "redos-expectations-match": 0, "damaged-header-says-wal": 0,
}


def _run(case: Case, cwd: Path) -> None:
    env = dict(os.environ)
    env.pop("NSYS_LEDGER_DEBUG", None)
    env.update(case.env or {})
    case.result = subprocess.run(
        _console_entry() + case.argv, cwd=cwd, env=env, capture_output=True, text=True,
        timeout=HANG_GUARD_S, check=False, input=case.stdin if case.stdin is not None else "",
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
        case.folders_before = {f: _folder_state(f) for f in case.folders}
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
        case.folders_after = {f: _folder_state(f) for f in case.folders}
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
    *(name for name, case in ROBUST_CASES.items() if case == 2),
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
    assert case.folders_after == case.folders_before


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


@pytest.mark.parametrize("name", [name for name, code in ROBUST_CASES.items() if code != 2])
def test_good_input_is_read_and_nothing_beside_it_changes(catalog, name):
    """A WAL-mode export (with or without a committed -wal), an SQLite export named .json and a
    ledger whose op pattern backtracks exponentially in Python's re: read, in bounded time,
    with no file created, rewritten or touched in their folder."""
    case = catalog.cases[name]
    result = case.result
    assert result.returncode == case.exit_code, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert result.stderr == ""
    assert case.problem in result.stdout
    assert case.folders_after == case.folders_before


def test_the_wal_cases_kept_their_side_files_as_they_were(catalog):
    (with_log,) = catalog.cases["wal-with-committed-log"].folders_after.values()
    (without,) = catalog.cases["wal-mode-export"].folders_after.values()
    assert sorted(with_log) == ["t.sqlite", "t.sqlite-wal"]  # the log, and no -shm made by reading
    assert sorted(without) == ["t.sqlite"]
    (damaged,) = catalog.cases["damaged-header-says-wal"].folders_after.values()
    assert sorted(damaged) == ["t.sqlite"]


def test_a_broken_nsys_export_is_not_cached(catalog):
    case = catalog.cases["nsys-rep-broken-export"]
    assert case.result.returncode == 2
    assert not (Path(case.blame).parent / "decode.nsys-rep.nsys-ledger-cache").exists()


def test_an_output_is_replaced_whole_or_not_at_all(tmp_path):
    """write_atomically: a writer that fails half-way leaves the old file and no temporary file."""
    from nsys_ledger.errors import InputError
    from nsys_ledger.safety import write_atomically

    target = tmp_path / "r.json"
    target.write_text("old\n")

    def half_then_fail(path: Path) -> None:
        path.write_text("{half")
        raise OSError(28, "No space left on device")

    with pytest.raises(InputError, match="r.json: cannot write output: No space left on device"):
        write_atomically(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
    write_atomically(target, lambda path: path.write_text("new\n"))
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]
