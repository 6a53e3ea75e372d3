"""Benchmark: full `check` against a bare read of the same data, in one run.

Generates (once, cached in bench/out/) a graph-mode GLM-5.3 decode trace with about
1,000,000 kernels with the project's generator, then times in separate processes (so peak
memory is each one's own):

* bare read: the kernel columns `check` needs, names resolved by a SQL join, into polars;
* bare read (all): the same for every table `check` reads (kernels, API calls, copies, NVTX);
* load: `nsys_ledger.load_trace` alone;
* check: the whole `nsys_ledger.check` with the GLM-5.3 ledger, JSON written.

Prints a table with seconds, peak RSS and the ratio to the bare kernel read.
Usage: python bench/bench_check.py [--steps 500] [--mode graph|eager] [--repeat 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"
EXPECT = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"

BARE_KERNELS = """
import sqlite3, sys, polars as pl
con = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
rows = con.execute(
    "SELECT k.start, k.end, k.deviceId, k.streamId, k.correlationId, k.globalPid, k.graphNodeId, s.value "
    "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName").fetchall()
frame = pl.DataFrame(rows, schema=["start", "end", "device", "stream", "correlation", "global_pid",
                                   "graph_node_id", "name"], orient="row")
print(frame.height)
"""

BARE_ALL = BARE_KERNELS + """
for sql in [
    "SELECT r.start, r.end, r.globalTid, r.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
    "JOIN StringIds s ON s.id = r.nameId WHERE r.eventClass IN (0, 1)",
    "SELECT start, end, deviceId, streamId, correlationId, globalPid, bytes, copyKind, srcKind "
    "FROM CUPTI_ACTIVITY_KIND_MEMCPY",
    "SELECT n.start, n.end, n.globalTid, coalesce(s.value, n.text) FROM NVTX_EVENTS n "
    "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType IN (59, 60)",
]:
    rows = con.execute(sql).fetchall()
    print(pl.DataFrame(rows, orient="row").height)
"""

LOAD = """
import sys, nsys_ledger
trace = nsys_ledger.load_trace(sys.argv[1])
print(trace.kernels.height)
"""

CHECK = """
import sys, nsys_ledger
from nsys_ledger.report.json_report import write_json
result = nsys_ledger.check(sys.argv[1], sys.argv[2])
write_json(result, sys.argv[3])
print(result.step_table.height, result.verdict)
"""

MEASURE = """
import resource, subprocess, sys, time
start = time.perf_counter()
exec(compile(open(sys.argv[1]).read(), "bench", "exec"), {"__name__": "__bench__"})
elapsed = time.perf_counter() - start
print("BENCH", elapsed, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _run(code: str, *args: str) -> tuple[float, float]:
    """Run `code` in a fresh interpreter; return (seconds, peak RSS in MiB)."""
    script = OUT / "_snippet.py"
    script.write_text(code)
    runner = OUT / "_measure.py"
    runner.write_text(MEASURE)
    proc = subprocess.run(
        [sys.executable, str(runner), str(script), *args], capture_output=True, text=True, check=True
    )
    line = next(l for l in proc.stdout.splitlines() if l.startswith("BENCH"))
    _, seconds, rss_kib = line.split()
    return float(seconds), int(rss_kib) / 1024


def _trace(steps: int, mode: str) -> Path:
    path = OUT / f"glm5-{mode}-{steps}steps.sqlite"
    if not path.exists():
        from nsys_ledger.synth import generate

        started = time.perf_counter()
        generate(str(path), mode=mode, steps=steps, ranks=1, seed=0)
        print(f"generated {path.name} in {time.perf_counter() - started:.1f} s")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="decode steps (about 2000 kernels each)")
    parser.add_argument("--mode", choices=["graph", "eager"], default="graph")
    parser.add_argument("--repeat", type=int, default=1, help="take the best of N runs")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    trace = _trace(args.steps, args.mode)
    json_out = str(OUT / "check.json")

    cases = [
        ("bare read: kernel columns", BARE_KERNELS, (str(trace),)),
        ("bare read: all tables check reads", BARE_ALL, (str(trace),)),
        ("load_trace", LOAD, (str(trace),)),
        ("check (steps, ops, anchors, gaps, H2D, JSON)", CHECK, (str(trace), str(EXPECT), json_out)),
    ]
    results = []
    for label, code, case_args in cases:
        best = min((_run(code, *case_args) for _ in range(args.repeat)), key=lambda r: r[0])
        results.append((label, *best))

    kernels = json.loads(Path(json_out).read_text())["totals"]["kernels"]
    base = results[0][1]
    print(f"\ntrace: {trace.name}, {kernels:,} kernels, {trace.stat().st_size / 2**20:.0f} MiB")
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}")
    print(f"{'what':48} {'seconds':>8} {'peak MiB':>9} {'x bare':>7}")
    for label, seconds, rss in results:
        print(f"{label:48} {seconds:8.2f} {rss:9.0f} {seconds / base:7.2f}")


if __name__ == "__main__":
    main()
