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

Three kinds of input, each with its own mutations:

- SQLite exports: bit flips, random blocks, truncation, a zeroed page, a page copied over
  another, a header field set to an edge value (page size, page count, text encoding, ...),
  bytes of the schema's SQL text changed, edge integers (0, -1, 2**63-1, ...) over a record.
- Kineto (PyTorch profiler) JSON, plain or gzip: the same byte damage on the JSON text; a
  field the reader uses (ts, dur, pid, tid, correlation, bytes, ...) set to an edge value
  (negative, 1e30, 2**64, a string, null, an object); the structure broken (a bracket
  swapped or dropped, 20,000 levels of nesting, traceEvents renamed); the gzip stream
  damaged or cut.
- parquetdir exports (made at the start from SQLite exports with the project's converter):
  one table file damaged (bits, a block, cut), removed, swapped for another table's file, or
  rewritten with an integer column's values set to edge values.

A case also fails when the input changed: its bytes, or a file that appeared beside it
(an SQLite -wal/-shm/-journal) or inside it (a parquetdir).

The check runs in-process in long-lived workers (importing polars once per worker) because a
subprocess per case would cost more than the check itself.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import multiprocessing as mp
import os
import queue
import random
import re
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


KINETO_SUFFIXES = (".json", ".json.gz")
# parquetdirs of the corpus are converted from these exports at the start of a run
PARQUET_SOURCES = ("glm5-graph-healthy.sqlite", "glm5-eager-healthy.sqlite")


def default_corpus() -> list[Path]:
    """SQLite exports and Kineto traces: the bundled samples and the real traces."""
    files = sorted(SAMPLES.glob("*.sqlite"))
    if REAL_TRACES.is_dir():
        files += sorted(REAL_TRACES.glob("*.sqlite"))
    files += sorted(SAMPLES.glob("*.trace.json.gz"))
    if (REAL_TRACES / "kineto").is_dir():
        files += sorted((REAL_TRACES / "kineto").glob("*.json.gz"))
    return files


def parquet_corpus(into: Path, sources: list[Path]) -> list[Path]:
    """parquetdir exports of `sources` (SQLite files), written under `into`."""
    from nsys_ledger.synth.parquet_writer import write_columnar

    made = []
    for source in sources:
        target = into / (source.stem + ".parquetdir")
        if not target.is_dir():
            write_columnar(source, target, "parquetdir")
        made.append(target)
    return made


def kind_of(source: Path) -> str:
    if source.is_dir():
        return "parquetdir"
    return "kineto" if source.name.lower().endswith(KINETO_SUFFIXES) else "sqlite"


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


# ---- Kineto JSON mutations (on the un-gzipped text; the result is gzipped again when the source was)

_JSON_FIELDS = re.compile(rb'"(ts|dur|pid|tid|correlation|device|stream|bytes|id|External id|ph|cat|name)"\s*:\s*'
                          rb'(-?[0-9][0-9.eE+-]*|"[^"\\]{0,200}"|null|true|false)')
_JSON_EDGES = (b"-1", b"-1000000", b"0", b"1e30", b"-1e30", b"1e308", b"18446744073709551616",
               b"-9223372036854775809", b"9223372036854775807", b"340282366920938463463374607431768211456",
               b"1.5", b"-0.001", b'"x"', b'""', b'"1e30"', b'"-5"', b"null", b"true", b"[]", b"{}",
               b'{"a": [1, {"b": null}]}', rb'"\u0000\u001b[31m"')


def json_value(data: bytes, rng: random.Random) -> bytes:
    """Set one to eight of the fields the reader uses to edge values."""
    fields = list(_JSON_FIELDS.finditer(data, 0, min(len(data), 4_000_000)))
    if not fields:
        return flip_bits(data, rng)
    out = bytearray(data)
    for match in sorted(rng.sample(fields, min(len(fields), rng.randint(1, 8))), key=lambda m: -m.start(2)):
        out[match.start(2):match.end(2)] = rng.choice(_JSON_EDGES)
    return bytes(out)


def json_structure(data: bytes, rng: random.Random) -> bytes:
    """Break the structure: a bracket swapped or dropped, deep nesting, the events renamed."""
    choice = rng.randrange(5)
    if choice == 0:
        return data.replace(b'"traceEvents"', b'"traceEventz"', 1)
    brackets = [m.start() for m in re.finditer(rb"[\[\]{}]", data[:2_000_000])]
    if not brackets:
        return flip_bits(data, rng)
    at = rng.choice(brackets)
    if choice == 1:
        return data[:at] + data[at + 1:]
    if choice == 2:
        swap = {ord("["): b"{", ord("]"): b"}", ord("{"): b"[", ord("}"): b"]"}[data[at]]
        return data[:at] + swap + data[at + 1:]
    depth = rng.choice((200, 5000, 20000))
    if choice == 3:  # a deeply nested value in place of the next value
        colon = data.find(b":", at)
        if colon < 0:
            return data
        return data[:colon + 1] + b"[" * depth + b"]" * depth + b"," + data[colon + 1:]
    return data[:at] + b"[" * depth + data[at:]  # unbalanced


def json_bytes(data: bytes, rng: random.Random) -> bytes:
    return rng.choice((flip_bits, random_block, truncate))(data, rng)


def gzip_stream(data: bytes, rng: random.Random) -> bytes:
    """Damage the compressed stream itself (marked by a leading NUL: the text is not re-gzipped)."""
    packed = gzip.compress(data, compresslevel=1, mtime=0)
    return b"\x00" + rng.choice((flip_bits, random_block, truncate))(packed, rng)


KINETO_MUTATIONS = {f.__name__: f for f in (json_value, json_structure, json_bytes, gzip_stream)}


# ---- parquetdir mutations (on a copy of the directory) -------------------------------------------

_INT_EDGES = (-1, -(2**63), 2**63 - 1, 0, 2**31, -(2**40))


def _tables(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.parquet"))


def _key_tables(directory: Path) -> list[Path]:
    """The tables the reader reads (kernels, strings, copies, calls, ...) before the others."""
    wanted = [t for t in _tables(directory)
              if t.stem.startswith(("CUPTI_ACTIVITY_KIND_", "StringIds", "NVTX", "CUDA_GRAPH", "TARGET_INFO"))]
    return wanted or _tables(directory)


def table_bytes(directory: Path, rng: random.Random) -> None:
    table = rng.choice(_key_tables(directory))
    table.write_bytes(rng.choice((flip_bits, random_block, truncate))(table.read_bytes(), rng))


def table_removed(directory: Path, rng: random.Random) -> None:
    rng.choice(_key_tables(directory)).unlink()


def table_swapped(directory: Path, rng: random.Random) -> None:
    tables = _key_tables(directory)
    target, source = rng.choice(tables), rng.choice(_tables(directory))
    target.write_bytes(source.read_bytes())


def table_values(directory: Path, rng: random.Random) -> None:
    """An integer column of a table rewritten with edge values (or nulls) in some rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table_path = rng.choice(_key_tables(directory))
    table = pq.read_table(table_path)
    columns = [i for i, f in enumerate(table.schema) if pa.types.is_integer(f.type)]
    if not columns or table.num_rows == 0:
        return table_bytes(directory, rng)
    index = rng.choice(columns)
    values = table.column(index).to_pylist()
    for row in rng.sample(range(len(values)), min(len(values), rng.randint(1, 16))):
        values[row] = rng.choice((*_INT_EDGES, None))
    column = pa.array(values, type=pa.int64())
    pq.write_table(table.set_column(index, pa.field(table.schema[index].name, pa.int64()), column), table_path)


PARQUET_MUTATIONS = {f.__name__: f for f in (table_bytes, table_removed, table_swapped, table_values)}
MUTATIONS_BY_KIND = {"sqlite": MUTATIONS, "kineto": KINETO_MUTATIONS, "parquetdir": PARQUET_MUTATIONS}


@dataclass(frozen=True)
class Case:
    number: int
    source: Path
    mutation: str


def plan(number: int, corpus: list[Path], seed: int) -> Case:
    rng = random.Random(f"{seed}:{number}:plan")
    source = corpus[number % len(corpus)]
    return Case(number, source, rng.choice(sorted(MUTATIONS_BY_KIND[kind_of(source)])))


def _text_of(source: Path, cache: dict[Path, bytes]) -> bytes:
    """The bytes of a file source; a Kineto trace's JSON text (un-gzipped)."""
    data = cache.get(source)
    if data is None:
        data = source.read_bytes()
        if kind_of(source) == "kineto" and data.startswith(b"\x1f\x8b"):
            data = gzip.decompress(data)
        cache[source] = data
    return data


def mutate(case: Case, seed: int, cache: dict[Path, bytes]) -> bytes:
    """The damaged bytes of a file case (SQLite, or Kineto as it is written: gzipped like its source)."""
    rng = random.Random(f"{seed}:{case.number}:bytes")
    data = _text_of(case.source, cache)
    if kind_of(case.source) == "sqlite":
        return MUTATIONS[case.mutation](data, rng)
    damaged = KINETO_MUTATIONS[case.mutation](data, rng)
    if case.mutation == "gzip_stream":
        return damaged[1:]
    return gzip.compress(damaged, compresslevel=1, mtime=0) if case.source.name.endswith(".gz") else damaged


def materialize(case: Case, seed: int, cache: dict[Path, bytes], workdir: Path) -> Path:
    """Write the damaged input of `case` under `workdir`: a file, or a parquetdir directory."""
    if kind_of(case.source) == "parquetdir":
        target = workdir / f"case-{case.number}-{case.mutation}.parquetdir"
        shutil.copytree(case.source, target)
        PARQUET_MUTATIONS[case.mutation](target, random.Random(f"{seed}:{case.number}:bytes"))
        return target
    suffix = ".json.gz" if case.source.name.endswith(".gz") else ".json" if kind_of(case.source) == "kineto" \
        else ".sqlite"
    target = workdir / f"case-{case.number}-{case.mutation}{suffix}"
    target.write_bytes(mutate(case, seed, cache))
    return target


_SIDE_FILES = ("-wal", "-shm", "-journal")


def fingerprint(path: Path) -> str:
    """sha256 over what must not change: the file's bytes and the side files SQLite could
    leave beside it; a directory's file names, bytes and modification times."""
    digest = hashlib.sha256()
    if path.is_dir():
        for item in sorted(path.rglob("*")):
            digest.update(str(item.relative_to(path)).encode())
            if item.is_file():
                digest.update(item.read_bytes())
                digest.update(str(item.stat().st_mtime_ns).encode())
        return digest.hexdigest()
    digest.update(path.read_bytes())
    digest.update(str(path.stat().st_mtime_ns).encode())
    for side in _SIDE_FILES:
        digest.update(f"{side}:{os.path.lexists(f'{path}{side}')}".encode())
    return digest.hexdigest()


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    for side in _SIDE_FILES:
        Path(f"{path}{side}").unlink(missing_ok=True)


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
    by_kind: Counter = field(default_factory=Counter)
    failures: list[tuple[int, str, str, str]] = field(default_factory=list)  # number, source, status, detail

    @property
    def passed(self) -> bool:
        return not self.failures

    def summary(self) -> str:
        lines = [f"{self.cases} cases in {self.seconds:.0f} s ({self.cases / max(self.seconds, 1e-9):.1f}/s): "
                 + ", ".join(f"{n} {s}" for s, n in sorted(self.statuses.items()))]
        lines.append("kinds: " + ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items())))
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
    report = Report()
    started = time.monotonic()
    cache: dict[Path, bytes] = {}
    workdir = Path(tempfile.mkdtemp(prefix="nsys-ledger-fuzz-"))
    if corpus is None:
        corpus = default_corpus()
        (workdir / "corpus").mkdir()
        corpus += parquet_corpus(workdir / "corpus", [SAMPLES / name for name in PARQUET_SOURCES])
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
                path = materialize(case, seed, cache, workdir)
                pending[number] = (case, path, fingerprint(path))
                pool.submit(worker, number, str(path))
                worker = pool.idle()
            for number, status, detail in pool.collect():
                case, path, digest = pending.pop(number)
                if status in PASSING and fingerprint(path) != digest:
                    status, detail = "modified", "the input's bytes, times or side files changed"
                if status in PASSING and cli_every and number % cli_every == 0:
                    cli_status, cli_detail = _run_cli(str(path), str(expectations))
                    if cli_status == "cli_bug":
                        status, detail = cli_status, cli_detail
                report.cases += 1
                report.statuses[status] += 1
                report.by_mutation[case.mutation] += 1
                report.by_kind[kind_of(case.source)] += 1
                if status not in PASSING:
                    report.failures.append((number, case.source.name, status, detail))
                    if keep is not None:
                        _keep(path, keep)
                        (keep / f"{path.name}.txt").write_text(f"{case}\n{status}\n{detail}\n")
                elif keep is not None and cases == 1:
                    _keep(path, keep)
                _remove(path)
                if progress and report.cases % 500 == 0:
                    elapsed = time.monotonic() - started
                    print(f"{report.cases} cases, {elapsed:.0f} s, {dict(report.statuses)}", flush=True)
    finally:
        pool.close()
        shutil.rmtree(workdir, ignore_errors=True)
    report.seconds = time.monotonic() - started
    return report


def _keep(path: Path, keep: Path) -> None:
    keep.mkdir(parents=True, exist_ok=True)
    if path.is_dir():
        shutil.copytree(path, keep / path.name, dirs_exist_ok=True)
    else:
        shutil.copyfile(path, keep / path.name)


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
