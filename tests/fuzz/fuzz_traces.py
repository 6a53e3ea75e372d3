"""Byte-mutation fuzzer: damaged copies of real and sample traces through the whole check.

    python tests/fuzz/fuzz_traces.py --cases 10000            # `make fuzz`
    python tests/fuzz/fuzz_traces.py --case 4711 --keep out/  # rerun one case, keep its file

Each case takes one trace of the corpus (the bundled samples and the real exports), damages a
copy of it in one of the ways below (seeded by the case number, so every case can be rerun),
and runs `nsys_ledger.check(copy, GLM ledger)` plus the terminal and JSON renderings in a
worker process. A case passes when the check returns a result, or raises an `InputError`
whose message is one line starting with the file's path (the CLI prints it and exits 2), and
the copy's bytes did not change. Anything else fails the run: another exception (the CLI would
print "internal error"), a worker that died (a crash in native code), or a case that outlived
its timeout (a hang; the worker is killed and replaced). `--cli-every N` also runs every N-th
case through the real console entry and checks its exit code and its stderr line.

Mutations: bit flips, random blocks, truncation, a zeroed page, a page copied over another,
a header field set to an edge value (page size, page count, text encoding, ...), bytes of
the schema's SQL text changed, edge integers (0, -1, 2**63-1, ...) written over a record.

The check runs in-process in long-lived workers (importing polars once per worker) because a
subprocess per case would cost more than the check itself.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "sample_traces"
REAL_TRACES = Path(os.environ.get("NSYS_LEDGER_REAL_TRACES") or ROOT.parent / "shared" / "real_traces")
GLM = ROOT / "expectations" / "glm-5.3-tp8-ep8.toml"
DEFAULT_TIMEOUT_S = 120.0  # a check of these files takes about a second; this is a hang
PASSING = ("ok", "input_error")


def default_corpus() -> list[Path]:
    files = sorted(SAMPLES.glob("*.sqlite"))
    if REAL_TRACES.is_dir():
        files += sorted(REAL_TRACES.glob("*.sqlite"))
    return files


# ---- mutations (each: bytes + a seeded Random -> damaged bytes) ---------------------------------


def _page_size(data: bytes) -> int:
    size = int.from_bytes(data[16:18], "big") if len(data) >= 18 else 4096
    return 65536 if size == 1 else (size if size >= 512 and size & (size - 1) == 0 else 4096)


def flip_bits(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 32)):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def random_block(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    length = rng.choice((1, 2, 4, 8, 64, 512, 4096))
    start = rng.randrange(max(1, len(out) - length))
    out[start:start + length] = rng.randbytes(length)
    return bytes(out[: len(data)])


def truncate(data: bytes, rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return data[: rng.randrange(len(data))]
    page = _page_size(data)
    return data[: page * rng.randrange(max(1, len(data) // page))]


def zero_page(data: bytes, rng: random.Random) -> bytes:
    page = _page_size(data)
    pages = max(1, len(data) // page)
    n = rng.randrange(pages)
    out = bytearray(data)
    out[n * page:(n + 1) * page] = bytes(min(page, len(data) - n * page))
    return bytes(out)


def copy_page(data: bytes, rng: random.Random) -> bytes:
    """A well-formed page in the wrong place: b-tree pointers that lead somewhere plausible."""
    page = _page_size(data)
    pages = len(data) // page
    if pages < 2:
        return flip_bits(data, rng)
    src, dst = rng.randrange(pages), rng.randrange(1, pages)
    out = bytearray(data)
    out[dst * page:(dst + 1) * page] = data[src * page:(src + 1) * page]
    return bytes(out)


# (offset, width, edge values) of SQLite header fields worth breaking
_HEADER_FIELDS = (
    (16, 2, (0, 1, 2, 511, 513, 1024, 32768, 65535)),  # page size
    (18, 1, (0, 2, 3, 255)),  # write version
    (19, 1, (0, 2, 3, 255)),  # read version
    (20, 1, (1, 32, 255)),  # reserved bytes per page
    (28, 4, (0, 1, 2, 0x7FFFFFFF, 0xFFFFFFFF)),  # page count
    (32, 4, (1, 2, 0xFFFFFFFF)),  # first freelist trunk page
    (36, 4, (1, 0xFFFFFFFF)),  # freelist pages
    (40, 4, (0, 1, 0xFFFFFFFF)),  # schema cookie
    (44, 4, (0, 5, 0xFFFFFFFF)),  # schema format
    (52, 4, (1, 2, 0xFFFFFFFF)),  # largest root b-tree page (auto-vacuum)
    (56, 4, (0, 2, 3, 4, 0xFFFFFFFF)),  # text encoding: 2/3 = UTF-16le/be
)


def header_field(data: bytes, rng: random.Random) -> bytes:
    offset, width, values = rng.choice(_HEADER_FIELDS)
    out = bytearray(data)
    out[offset:offset + width] = rng.choice(values).to_bytes(width, "big")
    return bytes(out)


def schema_text(data: bytes, rng: random.Random) -> bytes:
    """Change the SQL text of the schema (CREATE TABLE statements live in sqlite_master)."""
    starts = []
    at = data.find(b"CREATE TABLE")
    while at != -1 and len(starts) < 400:
        starts.append(at)
        at = data.find(b"CREATE TABLE", at + 1)
    if not starts:
        return flip_bits(data, rng)
    out = bytearray(data)
    at = rng.choice(starts) + rng.randrange(13, 200)
    for i in range(at, min(len(out), at + rng.randint(1, 6))):
        out[i] = rng.choice(b"(),' \"\x00abcXYZ0123456789")
    return bytes(out)


_EDGE_INTS = (0, 1, -1, 2**31 - 1, -(2**31), 2**63 - 1, -(2**63), 2**32, 0x7F, 0x80)


def edge_integers(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        width = rng.choice((1, 2, 4, 8))
        start = rng.randrange(100, max(101, len(out) - width))
        out[start:start + width] = (rng.choice(_EDGE_INTS) % (1 << (8 * width))).to_bytes(width, "big")
    return bytes(out)


MUTATIONS = {f.__name__: f for f in (flip_bits, random_block, truncate, zero_page, copy_page, header_field,
                                      schema_text, edge_integers)}


@dataclass(frozen=True)
class Case:
    number: int
    source: Path
    mutation: str


def plan(number: int, corpus: list[Path], seed: int) -> Case:
    rng = random.Random(f"{seed}:{number}:plan")
    return Case(number, corpus[number % len(corpus)], rng.choice(sorted(MUTATIONS)))


def mutate(case: Case, seed: int, cache: dict[Path, bytes]) -> bytes:
    data = cache.get(case.source)
    if data is None:
        data = cache[case.source] = case.source.read_bytes()
    return MUTATIONS[case.mutation](data, random.Random(f"{seed}:{case.number}:bytes"))


# ---- the worker: check one file in-process ------------------------------------------------------


def check_one(path: str, expectations: str) -> tuple[str, str]:
    """("ok" | "input_error" | "bad_message" | "bug", detail) for one file."""
    from nsys_ledger import check
    from nsys_ledger.errors import InputError
    from nsys_ledger.report.json_report import result_document
    from nsys_ledger.report.terminal import render
    import json

    try:
        result = check(path, expectations)
        render(result)
        json.dumps(result_document(result), ensure_ascii=False)
    except InputError as error:
        message = str(error)
        if message.startswith(f"{path}: ") and "\n" not in message and "\r" not in message:
            return "input_error", message[len(path) + 2:]
        return "bad_message", message
    except Exception:  # noqa: BLE001 - anything else is what the fuzzer is looking for
        return "bug", traceback.format_exc()
    return "ok", result.verdict


def _worker(jobs: mp.Queue, results: mp.Queue, expectations: str) -> None:
    os.environ.setdefault("POLARS_MAX_THREADS", "1")  # the workers are the parallelism
    parent = os.getppid()
    while True:
        try:
            item = jobs.get(timeout=5)
        except queue.Empty:
            if os.getppid() != parent:  # the runner is gone (killed): do not linger
                return
            continue
        if item is None:
            return
        number, path = item
        results.put((number, *check_one(path, expectations)))


class _Pool:
    """Worker processes that each check one file at a time; a worker that hangs or dies is
    replaced, and its case is reported as a hang or a crash."""

    def __init__(self, size: int, expectations: str, timeout_s: float):
        self.ctx = mp.get_context("spawn")  # polars runs threads: never fork it
        self.size = size
        self.expectations = expectations
        self.timeout_s = timeout_s
        self.workers: list[dict] = [self._start() for _ in range(size)]

    def _start(self) -> dict:
        jobs, results = self.ctx.Queue(), self.ctx.Queue()
        proc = self.ctx.Process(target=_worker, args=(jobs, results, self.expectations), daemon=True)
        proc.start()
        return {"proc": proc, "jobs": jobs, "results": results, "case": None, "since": 0.0}

    def idle(self) -> dict | None:
        return next((w for w in self.workers if w["case"] is None), None)

    def submit(self, worker: dict, number: int, path: str) -> None:
        worker["case"] = (number, path)
        worker["since"] = time.monotonic()
        worker["jobs"].put((number, path))

    def collect(self) -> list[tuple[int, str, str]]:
        """Finished cases (number, status, detail); waits a little when none is ready."""
        done = []
        for i, worker in enumerate(self.workers):
            if worker["case"] is None:
                continue
            try:
                done.append(worker["results"].get(timeout=0.02))
                worker["case"] = None
                continue
            except queue.Empty:
                pass
            number = worker["case"][0]
            if not worker["proc"].is_alive():
                done.append((number, "crash", f"worker died, exit code {worker['proc'].exitcode}"))
                self.workers[i] = self._start()
            elif time.monotonic() - worker["since"] > self.timeout_s:
                worker["proc"].kill()
                worker["proc"].join()
                done.append((number, "hang", f"no answer within {self.timeout_s:.0f} s"))
                self.workers[i] = self._start()
        return done

    def close(self) -> None:
        for worker in self.workers:
            worker["jobs"].put(None)
        for worker in self.workers:
            worker["proc"].join(timeout=10)
            if worker["proc"].is_alive():
                worker["proc"].kill()


# ---- the run ------------------------------------------------------------------------------------


@dataclass
class Report:
    cases: int = 0
    seconds: float = 0.0
    statuses: Counter = field(default_factory=Counter)
    by_mutation: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)  # number, source, status, detail

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [f"{self.cases} cases in {self.seconds:.0f} s ({self.cases / max(self.seconds, 1e-9):.1f}/s): "
                 + ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))]
        lines.append("mutations: " + ", ".join(f"{m} {n}" for m, n in sorted(self.by_mutation.items())))
        for number, source, status, detail in self.failures[:20]:
            lines.append(f"FAIL case {number} ({source}): {status}: {detail.strip().splitlines()[-1] if detail.strip() else ''}")
        return "\n".join(lines)


def _run_cli(path: str, expectations: str) -> tuple[str, str]:
    script = Path(sys.executable).with_name("nsys-ledger")
    cmd = [str(script)] if script.is_file() else [sys.executable, "-m", "nsys_ledger.cli"]
    proc = subprocess.run(cmd + ["check", path, "--expect", expectations], capture_output=True, text=True,
                          timeout=DEFAULT_TIMEOUT_S, check=False)
    if proc.returncode in (0, 1):
        return "ok", ""
    lines = proc.stderr.splitlines()
    if (proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"nsys-ledger: error: {path}: ")
            and "internal error" not in lines[0]):
        return "input_error", ""
    return "cli_bug", f"exit {proc.returncode}: {proc.stderr[-2000:]}"


def run(cases: int, *, seed: int = 0, first: int = 0, jobs: int | None = None, corpus: list[Path] | None = None,
        expectations: Path = GLM, timeout_s: float = DEFAULT_TIMEOUT_S, cli_every: int = 0,
        keep: Path | None = None, progress: bool = False) -> Report:
    """Fuzz cases first .. first + cases - 1 and report what happened."""
    corpus = corpus or default_corpus()
    report = Report()
    started = time.monotonic()
    cache: dict[Path, bytes] = {}
    workdir = Path(tempfile.mkdtemp(prefix="nsys-ledger-fuzz-"))
    pool = _Pool(jobs or os.cpu_count() or 1, str(expectations), timeout_s)
    pending: dict[int, tuple[Case, Path, str]] = {}
    todo = iter(range(first, first + cases))
    exhausted = False
    try:
        while pending or not exhausted:
            worker = pool.idle()
            while worker is not None and not exhausted:
                number = next(todo, None)
                if number is None:
                    exhausted = True
                    break
                case = plan(number, corpus, seed)
                path = workdir / f"case-{number}-{case.mutation}.sqlite"
                path.write_bytes(mutate(case, seed, cache))
                pending[number] = (case, path, hashlib.sha256(path.read_bytes()).hexdigest())
                pool.submit(worker, number, str(path))
                worker = pool.idle()
            for number, status, detail in pool.collect():
                case, path, digest = pending.pop(number)
                if status in PASSING and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
                    status, detail = "modified", "the file's bytes changed"
                if status in PASSING and cli_every and number % cli_every == 0:
                    cli_status, cli_detail = _run_cli(str(path), str(expectations))
                    if cli_status == "cli_bug":
                        status, detail = cli_status, cli_detail
                report.cases += 1
                report.statuses[status] += 1
                report.by_mutation[case.mutation] += 1
                if status not in PASSING:
                    report.failures.append((number, case.source.name, status, detail))
                    if keep is not None:
                        keep.mkdir(parents=True, exist_ok=True)
                        shutil.copyfile(path, keep / path.name)
                        (keep / f"{path.name}.txt").write_text(f"{case}\n{status}\n{detail}\n")
                elif keep is not None and cases == 1:
                    keep.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, keep / path.name)
                path.unlink()
                if progress and report.cases % 500 == 0:
                    elapsed = time.monotonic() - started
                    print(f"{report.cases} cases, {elapsed:.0f} s, {dict(report.statuses)}", flush=True)
    finally:
        pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


def main(argv: list[str] | None = None) -> int:
    # a SIGTERM unwinds like Ctrl-C, so that `run` stops its workers and removes its files
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000, help="number of cases (default 1000)")
    parser.add_argument("--case", type=int, help="run only this case number")
    parser.add_argument("--first", type=int, default=0, help="number of the first case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPUs)")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per case")
    parser.add_argument("--cli-every", type=int, default=0, help="also run every N-th case through the CLI")
    parser.add_argument("--keep", type=Path, help="copy failing cases (and --case's file) here")
    parser.add_argument("corpus", nargs="*", type=Path, help="traces to mutate (default: samples + real)")
    args = parser.parse_args(argv)
    first, cases = (args.case, 1) if args.case is not None else (args.first, args.cases)
    report = run(cases, seed=args.seed, first=first, jobs=args.jobs, corpus=args.corpus or None,
                 timeout_s=args.timeout, cli_every=args.cli_every, keep=args.keep, progress=True)
    print(report.summary())
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
