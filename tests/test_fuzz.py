"""A short run of the byte-mutation fuzzer (tests/fuzz/fuzz_traces.py; `make fuzz` runs long).

200 damaged copies of small traces, each checked in a worker process: every case must give a
result or a one-line input error naming the file, never another exception, a crash or a hang,
and must leave the copy's bytes as they were. The corpus is kept small here (the three small
real exports and a one-step synthetic trace) so that the cases run at a few per second; `make
fuzz` mutates every bundled sample and every real export.
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
    tiny = tmp_path_factory.mktemp("fuzz") / "glm5-graph-1step.sqlite"
    generate(tiny, steps=1, prefill=False, layerwise_nvtx=False)
    small_real = ("morluto__flameox__nsight-2025.5.2.sqlite", "LeiWang1999__memfusion_artifact__report1.sqlite",
                  "hpcgroup__pipit__saxpy-mpi-cuda_nsys_perlmutter0.sqlite")
    return [tiny] + [fuzz.REAL_TRACES / name for name in small_real if (fuzz.REAL_TRACES / name).is_file()]


def test_damaged_traces_never_crash_hang_or_get_modified(corpus):
    report = fuzz.run(CASES, seed=20260601, jobs=min(4, os.cpu_count() or 1), corpus=corpus)
    assert report.failures == [], report.summary()
    assert report.cases == CASES
    assert set(report.statuses) <= {"ok", "input_error"}
    # both outcomes occur: the mutations reach past the header checks
    assert report.statuses["ok"] > 0 and report.statuses["input_error"] > 0
    assert set(report.by_mutation) == set(fuzz.MUTATIONS)


def test_cases_are_reproducible(corpus):
    cache: dict[Path, bytes] = {}
    case = fuzz.plan(4711, corpus, seed=7)
    assert case == fuzz.plan(4711, corpus, seed=7)
    assert fuzz.mutate(case, 7, cache) == fuzz.mutate(case, 7, cache)
    assert fuzz.mutate(case, 7, cache) != fuzz.mutate(case, 8, cache)


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
