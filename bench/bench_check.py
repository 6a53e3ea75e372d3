"""Benchmark: the full `check` against a bare read of the same columns, measured in one run.

For every trace size and mode it generates (once, cached in bench/out/) a GLM-5.3 decode
export with the project's generator and measures, each in a fresh process so that peak
memory is that case's own:

* bare read: exactly the SQL queries `load_trace` issues (same tables, same columns; recorded
  from a dry run of the reader), each into a polars frame, nothing else: no joins, no names
  resolved. Once with the reader `load_trace` uses (ADBC when installed), and up to 1M
  kernels also with the standard sqlite3 module, the pure fallback;
* check: `nsys_ledger.check` with the GLM-5.3 ledger (steps, ops, anchors, layers, gaps, H2D,
  graph replays, rank comparison) and the JSON document written;
* layer attribution alone: NVTX projection (eager) or capture-time origins (graph), layer
  inference where a step has no layer range, per-layer counts and ledger, after the trace was
  read and its steps found (printed with the decode kernels by how their layer was found);
* timeline checks alone: device and per-stream gaps with their causes, H2D copies, graph
  replays and breaks, the step time budget, the rank comparison and their outcomes (trace
  read and steps found before the clock starts);
* html: the same plus the HTML report, when the project has one;
* with --ranks N: N exports of 1M kernels checked together (`check_many`, one process per
  file up to the core count) against one of them alone; with --dask also through `--dask
  local` (a LocalCluster, one worker process per file up to the core count);
* parquet (unless --no-parquet): the same trace converted to an `nsys export --type
  parquetdir` directory (synth/parquet_writer.py, cached beside it): a bare read of exactly
  the columns `load_trace` reads from it (recorded from a dry run, the same row filters, no
  casts, no joins) and the check + JSON of the directory.

Times exclude interpreter start-up and imports (the same for every case). Prints a table with
seconds, peak RSS, the ratio to the bare read and microseconds per kernel, and writes it to
bench/out/results.json. Eager traces carry the layerwise NVTX ranges (about 0.75 per kernel).

    python bench/bench_check.py                  # 100k, 1M, 5M kernels, graph and eager
    python bench/bench_check.py --quick          # 100k only
    python bench/bench_check.py --sizes 1M,10M --modes graph --ranks 8
    python bench/bench_check.py --sizes 1M --modes graph --ranks 8 --dask
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
EXPECT = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
KERNELS_PER_STEP = 2000  # about: 2077 in a healthy GLM-5.3 decode step
# 50M: a 4+ GB export (issue 14's scale target); generated on request only (--sizes 50M)
SIZES = {"100k": 100_000, "1M": 1_000_000, "5M": 5_000_000, "10M": 10_000_000, "50M": 50_000_000}
SQLITE3_BARE_UP_TO = 1_000_000  # the slow fallback reader is measured up to this many kernels

# Runs a snippet in this fresh interpreter after the common imports and prints its wall time
# and peak RSS (of this process, and of the largest child for the multi-file case).
RUNNER = """
import os, resource, sys, time
import polars, nsys_ledger, nsys_ledger.pipeline.multifile, nsys_ledger.report.json_report
try:
    import nsys_ledger.report.html
except ImportError:
    pass
from nsys_ledger.trace import arrow_fetch
code = open(sys.argv[1]).read()
namespace = {"__name__": "__bench__", "ARGS": sys.argv[2:]}
exec(compile(code, "setup", "exec"), namespace)
def cpu():
    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
load = os.getloadavg()[0]
start, start_cpu = time.perf_counter(), cpu()
namespace["run"]()
elapsed, cpu_seconds = time.perf_counter() - start, cpu() - start_cpu
print("BENCH", elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
      resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, cpu_seconds, load)
"""

# ARGS: path, reader ("adbc" or "sqlite3"). The queries are recorded from a dry run of the
# reader on the same file (frames answered empty, so it costs nothing), then run for real.
BARE = """
import sqlite3, polars as pl
from urllib.parse import quote
from nsys_ledger.trace import arrow_fetch, sqlite_reader

path, reader = ARGS
queries = []
def record(self, sql, schema):
    queries.append((sql, dict(schema)))
    return pl.DataFrame(schema=schema)
real_frame, real_run = arrow_fetch.ArrowSource.frame, sqlite_reader._SqliteTables._run
arrow_fetch.ArrowSource.frame = record
sqlite_reader._SqliteTables._run = lambda self, sql, schema: []
sqlite_reader.load_sqlite(path)
arrow_fetch.ArrowSource.frame, sqlite_reader._SqliteTables._run = real_frame, real_run
uri = f"file:{quote(path)}?mode=ro"

def run():
    rows = 0
    if reader == "adbc":
        source = arrow_fetch.ArrowSource(uri)
        for sql, schema in queries:
            frame = source.frame(sql, schema)
            assert frame is not None, sql
            rows += frame.height
        source.close()
    else:
        con = sqlite3.connect(uri, uri=True)
        for sql, schema in queries:
            cursor = con.execute(sql)
            while batch := cursor.fetchmany(65536):
                rows += pl.DataFrame(batch, schema=schema, orient="row").height
    print("ROWS", rows, len(queries))
"""

CHECK = """
import nsys_ledger
from nsys_ledger.report.json_report import write_json
path, expect, json_out = ARGS[:3]
html_out = ARGS[3] if len(ARGS) > 3 else None

def run():
    result = nsys_ledger.check(path, expect)
    write_json(result, json_out)
    if html_out:
        from nsys_ledger.report.html import write_html
        write_html(result, html_out)
    print("RESULT", result.totals.kernels, result.step_table.height, result.verdict)
"""

# What `nsys-ledger check --json` does: no per-activity frames kept, so an export of over a
# million kernels goes through a store on disk (pipeline.stream) in windows of 64 steps.
CHECK_STORE = """
import nsys_ledger
from nsys_ledger.report.json_report import write_json
path, expect, json_out = ARGS[:3]

def run():
    result = nsys_ledger.check(path, expect, stream=True)
    write_json(result, json_out)
    print("RESULT", result.totals.kernels, result.step_table.height, result.verdict)
"""

# The trace read and its decode steps found, before the clock starts (the stage cases below).
STEPS_SETUP = """
import nsys_ledger
from nsys_ledger.attribution.activities import gpu_activities, with_launch_calls
from nsys_ledger.attribution.ops import with_ops
from nsys_ledger.attribution.steps import find_steps
path, expect = ARGS
expectations = nsys_ledger.load_expectations(expect)
trace = nsys_ledger.load_trace(path)
activities = with_ops(with_launch_calls(gpu_activities(trace), trace.api_calls), expectations)
steps = find_steps(activities, trace.api_calls, trace.nvtx, expectations.steps)
"""

# Layer attribution alone (NVTX projection, capture-time origins, inference where needed, the
# per-layer counts and ledger).
LAYERS = STEPS_SETUP + """
from nsys_ledger.attribution.layers import attribute_layers
from nsys_ledger.checks.layers import check_layers, summarize_layers

def run():
    summary = summarize_layers(attribute_layers(trace, steps.activities, expectations))
    check_layers(expectations, summary, steps.decode.height)
    by_how = " ".join(f"{how}={n}" for how, n in summary.kernels_by_how().items())
    print("RESULT", sum(summary.kernels_by_how().values()), trace.nvtx.height, by_how)
"""

# All timeline checks alone (device and per-stream gaps with causes, H2D copies, graph replays
# and breaks, the step budget, rank comparison, their outcomes).
TIMELINE = STEPS_SETUP + """
from nsys_ledger.checks.stats import step_table
from nsys_ledger.checks.timeline import add_timeline_columns, build_timeline, rank_comparison, timeline_outcomes

def run():
    timeline = build_timeline(steps, trace, expectations.gap_threshold_ns, per_stream=True)
    table = add_timeline_columns(step_table(steps, timeline.gaps), timeline, expectations.batch)
    outcomes = timeline_outcomes(expectations, table, timeline, rank_comparison(table), step_method=steps.method)
    print("RESULT", table["kernels"].sum(), timeline.gaps.height, timeline.stream_gaps.height, len(outcomes))
"""

# ARGS: the parquetdir export. The column reads are recorded from a dry run of the columnar
# reader (frames answered empty), then done for real: only those columns, the same filters.
BARE_PARQUET = """
import polars as pl
from nsys_ledger.trace import columnar_reader

directory, = ARGS
reads = []
def record(self, table, columns, schema, keep=None):
    reads.append((self.files[table], sorted({c for c in columns.values() if c}), keep))
    return pl.DataFrame(schema=schema)
real_fetch = columnar_reader._ColumnarTables.fetch
columnar_reader._ColumnarTables.fetch = record
try:
    columnar_reader.load_columnar(directory)
except Exception:
    pass  # the dry run's empty frames may not make a trace; the reads are recorded by then
columnar_reader._ColumnarTables.fetch = real_fetch

def run():
    rows = 0
    for file, columns, keep in reads:
        lazy = pl.scan_parquet(file)
        if keep is not None:
            lazy = lazy.filter(pl.col(keep.column).is_in(list(keep.values)))
        rows += lazy.select(columns).collect().height
    print("ROWS", rows, len(reads))
"""

MANY = """
from nsys_ledger.pipeline.multifile import check_many
from nsys_ledger.report.json_report import write_json
expect, json_out, dask, *paths = ARGS

def run():
    result = check_many(paths, expect, dask=dask or None)
    write_json(result, json_out)
    print("RESULT", result.totals.kernels, result.step_table.height, result.verdict)
"""


@dataclass
class Measurement:
    trace: str
    mode: str
    kernels: int
    case: str
    seconds: float
    peak_mib: float
    child_peak_mib: float
    cpu_seconds: float  # user + system of the process and its children: robust to a busy machine
    load: float  # 1-minute load average when the case started (other work on the machine)
    ratio_to_bare: float | None = None
    us_per_kernel: float | None = None


Timing = tuple[float, float, float, float, float, str]


def _run(code: str, *args: str, env: dict[str, str] | None = None) -> Timing:
    """Run `code` in a fresh interpreter: (seconds, peak RSS MiB, largest child's MiB, CPU
    seconds, load average, stdout)."""
    OUT.mkdir(parents=True, exist_ok=True)
    # a file of its own: several benchmark runs may share bench/out/
    with tempfile.NamedTemporaryFile("w", suffix=".py", prefix="_snippet-", dir=OUT, delete=False) as snippet:
        snippet.write(code)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, snippet.name, *args], capture_output=True, text=True,
            env={**os.environ, **(env or {})}, cwd=ROOT,
        )
    finally:
        os.unlink(snippet.name)
    if proc.returncode != 0:
        raise SystemExit(f"benchmark case failed:\n{proc.stdout}\n{proc.stderr}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("BENCH"))
    _, seconds, rss_kib, child_kib, cpu_seconds, load = line.split()
    return float(seconds), int(rss_kib) / 1024, int(child_kib) / 1024, float(cpu_seconds), float(load), proc.stdout


def _best(repeat: int, code: str, *args: str, env: dict[str, str] | None = None) -> Timing:
    return min((_run(code, *args, env=env) for _ in range(repeat)), key=lambda r: r[0])


def parquet_path(path: Path) -> Path:
    """The parquetdir conversion of the SQLite export `path` (made on first use)."""
    directory = path.with_suffix(".parquetdir")
    if not directory.exists():
        import shutil

        from nsys_ledger.synth.parquet_writer import write_columnar

        started = time.perf_counter()
        partial = directory.with_name(directory.name + ".part")
        shutil.rmtree(partial, ignore_errors=True)
        write_columnar(path, partial, "parquetdir")
        partial.rename(directory)
        print(f"converted {path.name} to parquetdir in {time.perf_counter() - started:.0f} s", flush=True)
    return directory


def trace_path(mode: str, kernels: int, seed: int = 0) -> Path:
    """The cached export of about `kernels` kernels (generated on first use)."""
    steps = max(1, round(kernels / KERNELS_PER_STEP))
    path = OUT / (f"glm5-{mode}-{steps}steps" + (f"-seed{seed}" if seed else "") + ".sqlite")
    if not path.exists():
        from nsys_ledger.synth import generate

        OUT.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        partial = path.with_name(path.name + ".part")
        generate(str(partial), mode=mode, steps=steps, ranks=1, seed=seed)
        partial.replace(path)
        print(f"generated {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def _kernel_count(stdout: str) -> int:
    return int(next(l for l in stdout.splitlines() if l.startswith("RESULT")).split()[1])


def measure_trace(mode: str, size: str, args: argparse.Namespace) -> list[Measurement]:
    path = trace_path(mode, SIZES[size])
    json_out, html_out = OUT / f"{path.stem}.json", OUT / f"{path.stem}.html"
    rows: list[tuple[str, Timing]] = []
    reader = _reader_name()
    rows.append((f"bare read ({reader})", _best(args.repeat, BARE, str(path), reader)))
    if reader != "sqlite3" and SIZES[size] <= SQLITE3_BARE_UP_TO:
        rows.append(("bare read (sqlite3)", _best(args.repeat, BARE, str(path), "sqlite3")))
        rows.append(("check + JSON, sqlite3 reader", _best(
            args.repeat, CHECK, str(path), str(EXPECT), str(json_out), env={"NSYS_LEDGER_READER": "sqlite3"})))
    check = _best(args.repeat, CHECK, str(path), str(EXPECT), str(json_out))
    rows.append(("check + JSON", check))
    rows.append(("check + JSON, through the store", _best(
        args.repeat, CHECK_STORE, str(path), str(EXPECT), str(OUT / f"{path.stem}.store.json"))))
    layers = _best(args.repeat, LAYERS, str(path), str(EXPECT))
    rows.append(("layer attribution alone", layers))
    _, decode_kernels, nvtx_ranges, *by_how = next(
        l for l in layers[-1].splitlines() if l.startswith("RESULT")).split()
    print(f"{path.name}: layer attribution of {int(decode_kernels):,} decode kernels with {int(nvtx_ranges):,} "
          f"NVTX ranges in the trace: {layers[0]:.2f} s ({', '.join(by_how)})", flush=True)
    timeline = _best(args.repeat, TIMELINE, str(path), str(EXPECT))
    rows.append(("timeline checks alone (+streams)", timeline))
    if _has_html_report() and not args.no_html:
        rows.append(("check + JSON + HTML", _best(args.repeat, CHECK, str(path), str(EXPECT), str(json_out),
                                                  str(html_out))))
    kernels = _kernel_count(check[-1])
    bare = rows[0][1][0]
    measured = [
        Measurement(path.name, mode, kernels, label, seconds, rss, child, cpu, load, seconds / bare,
                    seconds / kernels * 1e6)
        for label, (seconds, rss, child, cpu, load, _) in rows
    ]
    if not args.no_parquet:
        measured += measure_parquet(path, mode, kernels, args)
    return measured


def measure_parquet(path: Path, mode: str, kernels: int, args: argparse.Namespace) -> list[Measurement]:
    """The same trace as a parquetdir: its bare read and its check, the ratio to that bare read."""
    directory = parquet_path(path)
    bare = _best(args.repeat, BARE_PARQUET, str(directory))
    check = _best(args.repeat, CHECK, str(directory), str(EXPECT), str(OUT / f"{path.stem}.parquet.json"))
    return [
        Measurement(directory.name, mode, kernels, label, seconds, rss, child, cpu, load, seconds / bare[0],
                    seconds / kernels * 1e6)
        for label, (seconds, rss, child, cpu, load, _) in (("bare read (parquet)", bare),
                                                           ("check + JSON (parquet)", check))
    ]


def measure_ranks(count: int, args: argparse.Namespace) -> list[Measurement]:
    """`count` exports of 1M kernels (distinct seeds) checked together, against one alone."""
    paths = [trace_path("graph", SIZES["1M"], seed) for seed in range(count)]
    one = _best(args.repeat, CHECK, str(paths[0]), str(EXPECT), str(OUT / "one.json"))
    many = _best(args.repeat, MANY, str(EXPECT), str(OUT / "many.json"), "", *map(str, paths))
    kernels_one, kernels_many = _kernel_count(one[-1]), _kernel_count(many[-1])
    label = f"{count} files x 1M"
    measured = [
        Measurement(paths[0].name, "graph", kernels_one, "one file: check + JSON", *one[:5], 1.0,
                    one[0] / kernels_one * 1e6),
        Measurement(label, "graph", kernels_many, f"{count} files: check_many + JSON", *many[:5],
                    many[0] / one[0], many[0] / kernels_many * 1e6),
    ]
    if args.dask:
        # the ratio of this row is to the local process pool (the row above), not to one file
        on_dask = _best(args.repeat, MANY, str(EXPECT), str(OUT / "many-dask.json"), "local", *map(str, paths))
        measured.append(Measurement(label, "graph", _kernel_count(on_dask[-1]), f"{count} files: --dask local + JSON",
                                    *on_dask[:5], on_dask[0] / many[0], on_dask[0] / kernels_many * 1e6))
    return measured


def _reader_name() -> str:
    from nsys_ledger.trace.arrow_fetch import reader_name

    return reader_name()


def _has_html_report() -> bool:
    try:
        from nsys_ledger.report.html import write_html  # noqa: F401
    except ImportError:
        return False
    return True


def machine() -> dict[str, str]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    memory = ""
    try:
        cpu = next(l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name"))
        kib = next(int(l.split()[1]) for l in open("/proc/meminfo") if l.startswith("MemTotal"))
        memory = f"{kib / 2**20:.0f} GiB"
    except (OSError, StopIteration):
        pass
    versions = {}
    for module in ("polars", "pyarrow", "adbc_driver_sqlite"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "not installed"
    return {
        "cpu": cpu, "cores": str(os.cpu_count()), "memory": memory, "os": platform.platform(),
        "python": platform.python_version(), **versions, "reader": _reader_name(),
    }


def print_table(results: list[Measurement]) -> None:
    header = (f"{'trace':34} {'kernels':>10} {'case':32} {'seconds':>8} {'cpu s':>7} {'peak MiB':>9} "
              f"{'x bare':>7} {'us/kernel':>9} {'load':>5}")
    print(header)
    print("-" * len(header))
    for r in results:
        ratio = f"{r.ratio_to_bare:7.2f}" if r.ratio_to_bare is not None else " " * 7
        peak = max(r.peak_mib, r.child_peak_mib)
        print(f"{r.trace:34} {r.kernels:>10,} {r.case:32} {r.seconds:8.2f} {r.cpu_seconds:7.2f} {peak:9.0f} "
              f"{ratio} {r.us_per_kernel or 0:9.2f} {r.load:5.1f}")


def print_targets(results: list[Measurement]) -> None:
    """The issue's targets, judged from this run's figures."""
    checks = [r for r in results if r.case == "check + JSON"]
    for r in results:
        if "--dask" in r.case:
            print(f"target: {r.case} within 1.2x of the process pool: {r.ratio_to_bare:.2f}x "
                  f"{'met' if r.ratio_to_bare <= 1.2 else 'NOT met'}")
        if r.case not in ("check + JSON", "check + JSON (parquet)"):
            continue
        if 900_000 <= r.kernels <= 1_100_000:
            print(f"target: {r.mode} 1M {r.case} <= 2.5x its bare read: {r.ratio_to_bare:.2f}x "
                  f"{'met' if r.ratio_to_bare <= 2.5 else 'NOT met'}")
        if r.kernels >= 9_000_000:
            ok = r.seconds < 60 and r.peak_mib < 6 * 1024
            print(f"target: {r.mode} 10M {r.case} < 60 s and < 6 GB: {r.seconds:.1f} s, {r.peak_mib:.0f} MiB "
                  f"{'met' if ok else 'NOT met'}; <= 3x its bare read: {r.ratio_to_bare:.2f}x "
                  f"{'met' if r.ratio_to_bare <= 3 else 'NOT met'}; peak <= 3 GB: "
                  f"{'met' if r.peak_mib <= 3 * 1024 else 'NOT met'}")
    for mode in sorted({r.mode for r in checks}):
        per_kernel = [r.us_per_kernel for r in checks if r.mode == mode and r.us_per_kernel]
        if len(per_kernel) > 1:
            spread = max(per_kernel) / min(per_kernel)
            print(f"target: {mode} time per kernel flat within 1.5x: {spread:.2f}x {'met' if spread <= 1.5 else 'NOT met'}")
    for r in results:
        if "check_many" in r.case:
            count = int(r.case.split()[0])
            print(f"target: {r.case} < {count}x one file: {r.ratio_to_bare:.2f}x "
                  f"{'met' if r.ratio_to_bare < count else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="100k,1M,5M", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--modes", default="graph,eager", help="graph, eager or both")
    parser.add_argument("--quick", action="store_true", help="100k kernels only (about a minute)")
    parser.add_argument("--ranks", type=int, default=0, help="also check N exports of 1M kernels together")
    parser.add_argument("--repeat", type=int, default=1, help="best of N runs per case")
    parser.add_argument("--no-html", action="store_true", help="skip the HTML report case")
    parser.add_argument("--no-parquet", action="store_true", help="skip the parquetdir cases")
    parser.add_argument("--dask", action="store_true", help="with --ranks N: also check the N files with --dask local")
    args = parser.parse_args()
    sizes = ["100k"] if args.quick else [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {', '.join(unknown)}; known: {', '.join(SIZES)}")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

    results: list[Measurement] = []
    for mode in modes:
        for size in sizes:
            results += measure_trace(mode, size, args)
    if args.ranks > 1:
        results += measure_ranks(args.ranks, args)

    about = machine()
    print()
    print("machine: " + ", ".join(f"{k} {v}" for k, v in about.items()))
    print_table(results)
    print()
    print_targets(results)
    (OUT / "results.json").write_text(json.dumps(
        {"machine": about, "results": [asdict(r) for r in results]}, indent=2) + "\n")


if __name__ == "__main__":
    main()
