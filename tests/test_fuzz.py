"""A short run of the byte-mutation fuzzer (tests/fuzz/fuzz_traces.py; `make fuzz` runs long).

200 damaged copies of small traces, each checked in a worker process: every case must give a
result or a one-line input error naming the file, never another exception, a crash or a hang,
and must leave the copy's bytes (and the files beside or inside it) as they were. The corpus
is kept small here (the three small real exports, a one-step synthetic SQLite trace, its
parquetdir export, its Kineto twin and the smallest real Kineto trace) so that the cases run
at a few per second; `make fuzz` mutates every bundled sample and every real trace.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from nsys_ledger.synth import generate

HERE = Path(__file__).resolve().parent
CASES = 200


# A plain import (not one by file location): the spawned workers import the module by name.
sys.path.insert(0, str(HERE / "fuzz"))
import fuzz_traces as fuzz  # noqa: E402


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("fuzz")
    tiny = folder / "glm5-graph-1step.sqlite"
    generate(tiny, steps=1, prefill=False, layerwise_nvtx=False)
    tiny_kineto = folder / "glm5-graph-1step.trace.json.gz"
    generate(tiny_kineto, steps=1, prefill=False, format="kineto")
    small_real = ("morluto__flameox__nsight-2025.5.2.sqlite", "LeiWang1999__memfusion_artifact__report1.sqlite",
                  "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite",
                  "kineto/HTA__critical_path__alexnet__benchmark_result_2869224_1695835535_trace.json.gz")
    return ([tiny, tiny_kineto, *fuzz.parquet_corpus(folder, [tiny])]
            + [fuzz.REAL_TRACES / name for name in small_real if (fuzz.REAL_TRACES / name).is_file()])


def test_damaged_traces_never_crash_hang_or_get_modified(corpus):
    report = fuzz.run(CASES, seed=20260601, jobs=min(4, os.cpu_count() or 1), corpus=corpus)
    assert report.failures == [], report.summary()
    assert report.cases == CASES
    assert set(report.statuses) <= {"ok", "input_error"}
    # both outcomes occur: the mutations reach past the header checks
    assert report.statuses["ok"] > 0 and report.statuses["input_error"] > 0
    assert set(report.by_kind) == {"sqlite", "kineto", "parquetdir"}
    every = set(fuzz.MUTATIONS) | set(fuzz.KINETO_MUTATIONS) | set(fuzz.PARQUET_MUTATIONS)
    assert set(report.by_mutation) == every


def test_cases_are_reproducible(corpus):
    cache: dict[Path, bytes] = {}
    case = fuzz.plan(4711, corpus, seed=7)
    assert case == fuzz.plan(4711, corpus, seed=7)
    assert fuzz.mutate(case, 7, cache) == fuzz.mutate(case, 7, cache)
    assert fuzz.mutate(case, 7, cache) != fuzz.mutate(case, 8, cache)
    kineto = next(n for n in range(100) if fuzz.kind_of(fuzz.plan(n, corpus, seed=7).source) == "kineto")
    case = fuzz.plan(kineto, corpus, seed=7)
    assert case.mutation in fuzz.KINETO_MUTATIONS
    assert fuzz.mutate(case, 7, cache) == fuzz.mutate(case, 7, cache)


def test_a_parquetdir_case_damages_a_copy_never_the_source(corpus, tmp_path):
    source = next(p for p in corpus if fuzz.kind_of(p) == "parquetdir")
    before = fuzz.fingerprint(source)
    number = next(n for n in range(100) if fuzz.plan(n, corpus, seed=3).source == source)
    case = fuzz.plan(number, corpus, seed=3)
    made = fuzz.materialize(case, 3, {}, tmp_path)
    assert made.is_dir() and made.parent == tmp_path
    assert fuzz.fingerprint(made) != before  # the copy is damaged
    assert fuzz.fingerprint(source) == before


def test_the_classifier_tells_a_bug_from_an_input_error(tmp_path, monkeypatch):
    """The fuzzer's own judge: a one-line error naming the file passes, any other exception is a bug."""
    text = tmp_path / "notes.sqlite"
    text.write_text("not a trace\n")
    assert fuzz.check_one(str(text), str(fuzz.GLM)) == ("input_error", "not an SQLite database (text file)")

    def broken_check(*args, **kwargs):
        return 1 // 0

    monkeypatch.setattr("nsys_ledger.check", broken_check)
    status, detail = fuzz.check_one(str(text), str(fuzz.GLM))
    assert status == "bug" and "ZeroDivisionError" in detail
