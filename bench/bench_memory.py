"""Memory benchmark: peak RSS of `check` on a 10M-kernel trace, and how memory grows with the
columns read.

    python bench/bench_memory.py                     # 10M kernels (5000 graph-mode decode steps)
    python bench/bench_memory.py --kernels 1M        # quicker

Every measurement runs in a fresh interpreter and reports that process's peak resident set
size (`ru_maxrss`), so nothing one case allocated hides in another's figure:

* baseline: the interpreter with polars and nsys_ledger imported, nothing read;
* columns k: the kernel table's first k integer columns read into one polars frame, with the
  reader `load_trace` uses first (ADBC when installed) and with the standard sqlite3 module.
  Memory must grow by about 8 bytes per kernel and column: linear in the columns read, not in
  the table's width (the 2026 kernel table has 40 columns; the reader asks for 10);
* load_trace: the importer alone (every frame of the Trace);
* check: `nsys_ledger.check` with the GLM-5.3 ledger and the JSON document written, with the
  default reader and with NSYS_LEDGER_READER=sqlite3 (the reader without the `fast` extra).

The trace is cached in bench/out/ under the name bench_check.py uses
(glm5-graph-5000steps.sqlite for 10M), so the two scripts share one 10M-kernel export; if
another process is writing it (a `.part` file), this script waits for it. Writes
bench/out/memory.json.
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
KERNELS_PER_STEP = 2000  # bench_check.py's rounding, so that both find the same cached file
SIZES = {"1M": 1_000_000, "5M": 5_000_000, "10M": 10_000_000}
LIMIT_GB = 6.0  # issue 6: a 10M-kernel trace runs within 6 GB
KERNEL_COLUMNS = ("start", "end", "deviceId", "streamId", "correlationId", "globalPid", "demangledName",
                  "shortName", "graphNodeId", "graphId")  # the ones the reader asks for
COLUMN_STEPS = (1, 2, 4, 6, 8, 10)

# Runs after the imports in a fresh interpreter; prints the case's result and peak RSS (KiB).
PRELUDE = """
import resource, sys, time
import polars as pl, nsys_ledger
from nsys_ledger.report.json_report import write_json
ARGS = sys.argv[1:]
"""
EPILOGUE = """
print("PEAK_KIB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""
CASES = {
    "baseline": "print('RESULT', 0)",
    "columns": """
import sqlite3
from urllib.parse import quote
from nsys_ledger.trace import arrow_fetch
path, reader, columns = ARGS[0], ARGS[1], ARGS[2].split(",")
uri = f"file:{quote(path)}?mode=ro"
sql = "SELECT " + ", ".join(columns) + " FROM CUPTI_ACTIVITY_KIND_KERNEL"
schema = {c: pl.Int64 for c in columns}
if reader == "adbc":
    source = arrow_fetch.ArrowSource(uri)
    frame = source.frame(sql, schema)
    source.close()
else:
    con = sqlite3.connect(uri, uri=True)
    cursor = con.execute(sql)
    parts = []
    while batch := cursor.fetchmany(65536):
        parts.append(pl.DataFrame(batch, schema=schema, orient="row"))
    frame = pl.concat(parts, rechunk=True)
print("RESULT", frame.height, frame.estimated_size())
""",
    "load_trace": """
from nsys_ledger.trace import load_trace
trace = load_trace(ARGS[0])
print("RESULT", trace.kernels.height, sum(getattr(trace, f).estimated_size() for f in
      ("kernels", "api_calls", "memcpys", "nvtx", "graph_nodes")))
""",
    "check": """
result = nsys_ledger.check(ARGS[0], ARGS[1])
write_json(result, ARGS[2])
print("RESULT", result.totals.kernels, result.step_table.height, result.verdict)
""",
}


@dataclass
class Measurement:
    case: str
    reader: str
    columns: int | None
    seconds: float
    peak_mib: float
    result: str


def trace_path(kernels: int) -> Path:
    """The cached graph-mode export of about `kernels` kernels, generated or awaited."""
    steps = max(1, round(kernels / KERNELS_PER_STEP))
    path = OUT / f"glm5-graph-{steps}steps.sqlite"
    partial = path.with_name(path.name + ".part")
    while not path.exists() and partial.exists():  # bench_check.py is writing it
        print(f"waiting for {partial.name} ({partial.stat().st_size / 2**20:.0f} MiB so far)", flush=True)
        time.sleep(30)
    if not path.exists():
        from nsys_ledger.synth import generate

        OUT.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        generate(str(partial), mode="graph", steps=steps, ranks=1, seed=0)
        partial.replace(path)
        print(f"generated {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return path


def _rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure(case: str, *args: str, reader: str = "default", columns: int | None = None,
            cap_mib: float = float("inf")) -> Measurement:
    """Run one case in a fresh interpreter; stop it (and say so) if its RSS passes `cap_mib`,
    so that a measurement never takes the memory other processes on the machine need."""
    env = dict(os.environ)
    if reader == "sqlite3":
        env["NSYS_LEDGER_READER"] = "sqlite3"
    code = PRELUDE + CASES[case] + EPILOGUE
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=out, stderr=err, text=True, env=env)
        watched = 0.0
        while proc.poll() is None:
            watched = max(watched, _rss_mib(proc.pid))
            if watched > cap_mib:
                proc.kill()
                proc.wait()
                return Measurement(case, reader, columns, time.perf_counter() - started, watched,
                                   f"STOPPED above the {cap_mib / 1024:.1f} GiB cap")
            time.sleep(0.2)
        seconds = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{case} failed:\n{stderr[-3000:]}")
    lines = dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)
    peak = int(lines["PEAK_KIB"]) / 1024
    return Measurement(case, reader, columns, seconds, peak, lines.get("RESULT", ""))


def _reader_used() -> str:
    from nsys_ledger.trace.arrow_fetch import reader_name

    return reader_name()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default="10M", help=f"trace size: {', '.join(SIZES)} or a number")
    parser.add_argument("--skip-sqlite3-check", action="store_true",
                        help="do not run the whole check with the slow sqlite3 reader")
    parser.add_argument("--cap-gb", type=float, default=10.0,
                        help="stop a case whose RSS passes this (default 10 GiB; the machine is shared)")
    args = parser.parse_args(argv)
    cap = args.cap_gb * 1024
    kernels = SIZES.get(args.kernels) or int(args.kernels)
    path = trace_path(kernels)
    json_out = OUT / f"{path.stem}.memory-check.json"
    fast = _reader_used()
    print(f"trace {path.name}: {path.stat().st_size / 2**30:.2f} GiB; default reader: {fast}", flush=True)

    results: list[Measurement] = [measure("baseline")]
    readers = ["adbc", "sqlite3"] if fast == "adbc" else ["sqlite3"]
    for reader in readers:
        for k in COLUMN_STEPS:
            results.append(measure("columns", str(path), reader, ",".join(KERNEL_COLUMNS[:k]), reader=reader,
                                   columns=k, cap_mib=cap))
            print(_row(results[-1], results[0]), flush=True)
    results.append(measure("load_trace", str(path), reader=fast, cap_mib=cap))
    print(_row(results[-1], results[0]), flush=True)
    results.append(measure("check", str(path), str(EXPECT), str(json_out), reader=fast, cap_mib=cap))
    print(_row(results[-1], results[0]), flush=True)
    if fast == "adbc" and not args.skip_sqlite3_check:
        results.append(measure("check", str(path), str(EXPECT), str(json_out), reader="sqlite3", cap_mib=cap))
        print(_row(results[-1], results[0]), flush=True)

    print()
    print(_report(results, kernels))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "memory.json").write_text(json.dumps({
        "trace": path.name, "trace_bytes": path.stat().st_size, "kernels_requested": kernels,
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "limit_gb": LIMIT_GB, "measurements": [asdict(m) for m in results],
    }, indent=2) + "\n")
    worst = max(m.peak_mib for m in results if m.case == "check")
    return 0 if worst / 1024 <= LIMIT_GB or kernels < SIZES["10M"] else 1


def _row(m: Measurement, baseline: Measurement) -> str:
    label = f"{m.case}" + (f" {m.columns} col" if m.columns else "") + f" [{m.reader}]"
    return (f"{label:<28} {m.seconds:8.1f} s  peak {m.peak_mib:8.0f} MiB  (+{m.peak_mib - baseline.peak_mib:7.0f} "
            f"over baseline)  {m.result}")


def _report(results: list[Measurement], kernels: int) -> str:
    base = results[0].peak_mib
    lines = [f"baseline (imports only): {base:.0f} MiB"]
    for reader in ("adbc", "sqlite3"):
        cols = [m for m in results if m.case == "columns" and m.reader == reader]
        if len(cols) >= 2:
            rows = int(cols[0].result.split()[0])
            per_column = (cols[-1].peak_mib - cols[0].peak_mib) / (cols[-1].columns - cols[0].columns)
            lines.append(f"{reader}: {per_column:.0f} MiB per extra column of {rows:,} rows "
                         f"({per_column * 2**20 / rows:.1f} bytes per value; an Int64 is 8)")
            lines += [f"  {m.columns:2d} columns: +{m.peak_mib - base:6.0f} MiB" for m in cols]
    for m in results:
        if m.case in ("load_trace", "check") and m.result.startswith("STOPPED"):
            lines.append(f"{m.case} [{m.reader}]: more than {m.peak_mib / 1024:.2f} GiB: {m.result} "
                         f"after {m.seconds:.0f} s")
        elif m.case in ("load_trace", "check"):
            lines.append(f"{m.case} [{m.reader}]: peak {m.peak_mib / 1024:.2f} GiB in {m.seconds:.0f} s "
                         f"({m.peak_mib * 2**20 / kernels:.0f} bytes per kernel); {m.result}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
