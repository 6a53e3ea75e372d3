"""The streaming Kineto reader (trace/json_stream.py + kineto_reader) against the reader's own
whole-document path (`_collect_whole`: the document decoded at once with msgspec, as the reader
did before it streamed; it still serves the documents laid out unusually).

Every bundled Kineto sample and every real trace in ../shared/real_traces/kineto gives the same
frames and meta with the default batches and with 4 KiB batches (hundreds of batches, cuts
inside strings and nested objects retried). The layouts a writer may choose (compact on one
line, pretty-printed, the small keys after `traceEvents`, a bare event array, `},{` inside
strings and nested args) give the same Trace too, and malformed or unusual documents the same
one-line error. Kernel counts are the JSON's own, counted here with the `json` module.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

from unittest import mock

import pytest
from polars.testing import assert_frame_equal

from nsys_ledger.errors import TraceError
from nsys_ledger.trace import json_stream, kineto_reader
from nsys_ledger.trace.kineto_reader import load_kineto, load_kineto_capture
from shared_data import KINETO_TRACES, needs_shared

REPO = Path(__file__).resolve().parents[1]
SAMPLES = sorted((REPO / "sample_traces").glob("*.trace.json.gz"))
REAL = sorted(KINETO_TRACES.glob("*.json.gz")) if KINETO_TRACES.is_dir() else []
FRAMES = ("kernels", "api_calls", "memcpys", "memsets", "syncs", "nvtx", "devices")
SMALL_BATCH = 4096


def whole_document(load):
    """`load` (load_kineto or load_kineto_capture) through the whole-document path only."""
    def loaded(path: Path):
        with mock.patch.object(kineto_reader, "_collect", kineto_reader._collect_whole):
            return load(path)
    return loaded


def assert_same_trace(path: Path) -> None:
    new, old = load_kineto(path), whole_document(load_kineto)(path)
    for frame in FRAMES:
        assert_frame_equal(getattr(new, frame), getattr(old, frame), check_exact=True)
    assert new.meta == old.meta


def json_kernels(document: dict | list) -> int:
    events = document if isinstance(document, list) else document["traceEvents"]
    return sum(1 for e in events if isinstance(e, dict) and e.get("cat") == "kernel")


@pytest.fixture(params=["default", "small"])
def batch_bytes(request, monkeypatch) -> int:
    if request.param == "small":
        monkeypatch.setattr(json_stream, "BATCH_BYTES", SMALL_BATCH)
    return json_stream.BATCH_BYTES


def test_the_samples_are_here() -> None:
    assert [p.name for p in SAMPLES] == [
        "glm5-eager-healthy.trace.json.gz", "glm5-graph-broken-fusion.trace.json.gz",
        "glm5-graph-extra-h2d.trace.json.gz", "glm5-graph-healthy.trace.json.gz",
    ]


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_equal_the_whole_document_reader(path: Path, batch_bytes: int) -> None:
    assert_same_trace(path)


@needs_shared(KINETO_TRACES)
@pytest.mark.parametrize("name", [p.name for p in REAL] or ["none"])
def test_real_traces_equal_the_whole_document_reader(name: str, batch_bytes: int) -> None:
    assert_same_trace(KINETO_TRACES / name)


@needs_shared(KINETO_TRACES)
def test_capture_trace_named_launches_equal(monkeypatch) -> None:
    monkeypatch.setattr(json_stream, "BATCH_BYTES", SMALL_BATCH)
    path = KINETO_TRACES / "AMD-AGI__TraceLens__inference_sglang_decode_capture_traces_bs_32_rank0.json.gz"
    (trace, named), (old_trace, old_named) = load_kineto_capture(path), whole_document(load_kineto_capture)(path)
    assert_frame_equal(named, old_named)
    assert_frame_equal(trace.kernels, old_trace.kernels)
    assert named.height == 546  # launch calls naming their kernel (test_kineto_real: launches=546)


# ---- layouts ----------------------------------------------------------------------------

SAMPLE = REPO / "sample_traces" / "glm5-graph-broken-fusion.trace.json.gz"


def _document() -> dict:
    document = json.loads(gzip.decompress(SAMPLE.read_bytes()))
    events = document["traceEvents"]
    # strings and nested args that hold the very text a cut looks for
    events[5]["args"] = {"note": "a},{b", "nested": [{"x": 1}, {"y": "},{"}], "deep": {"z": [{}, {"w": "}, {"}]}}
    events[40]["name"] = events[40]["name"] + ' },\n{"cat": "kernel"}'
    return document


def _variants() -> dict[str, bytes]:
    document = _document()
    events = document["traceEvents"]
    head = {k: v for k, v in document.items() if k != "traceEvents"}
    after = json.dumps({"traceEvents": events, **head})  # the small keys after the array
    return {
        "compact": json.dumps(document, separators=(",", ":")).encode(),
        "pretty": json.dumps(document, indent=2).encode(),
        "keys-after-events": after.encode(),
        "crlf-tabs": json.dumps(document, indent="\t").replace("\n", "\r\n").encode(),
        "bare-array": json.dumps(events).encode(),
        "gzip-two-members": gzip.compress(json.dumps(document).encode()[:100_000])
        + gzip.compress(json.dumps(document).encode()[100_000:]),
    }


@pytest.mark.parametrize("variant", list(_variants()))
def test_layouts_give_the_same_trace(variant: str, tmp_path: Path, batch_bytes: int) -> None:
    path = tmp_path / f"{variant}.json"
    path.write_bytes(_variants()[variant])
    assert_same_trace(path)
    assert json_kernels(_document()) == 11087  # counted by the json module
    assert load_kineto(path).kernels.height == 11087  # `"cat": "kernel"` inside a name is a name


def test_cuts_inside_strings_are_retried(tmp_path: Path, monkeypatch) -> None:
    """Every event's name holds `},{`: most candidate cuts are inside a string."""
    monkeypatch.setattr(json_stream, "BATCH_BYTES", 512)
    events = [{"ph": "X", "cat": "kernel", "name": "k" + "},{" * 40 + str(i), "pid": 0, "tid": 7,
               "ts": i * 10, "dur": 5, "args": {"correlation": i, "device": 0, "stream": 7}} for i in range(300)]
    path = tmp_path / "strings.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_kineto(path)
    assert trace.kernels.height == 300
    assert trace.kernels["name"][299] == "k" + "},{" * 40 + "299"
    assert trace.kernels["start"].to_list()[:3] == [0, 10_000, 20_000]
    assert_same_trace(path)


def test_exact_times_in_a_late_batch(tmp_path: Path, monkeypatch) -> None:
    """Epoch microseconds with decimals only in the last batch: the whole frame is read again
    as text (a second pass), as the whole-document reader read it."""
    monkeypatch.setattr(json_stream, "BATCH_BYTES", 1024)
    events = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1000.1234 + i, "dur": 1.5,
               "args": {"correlation": i}} for i in range(200)]
    text = json.dumps({"traceEvents": events})
    text = text.replace('"ts": 1199.1234', '"ts": 1700000000123456.789')
    path = tmp_path / "epoch.json"
    path.write_text(text)
    trace = load_kineto(path)
    assert trace.kernels["start"].to_list()[-1] == 1700000000123456789
    assert trace.kernels["start"].to_list()[0] == 1000123  # text: .1234 µs is 123 ns, not a rounded float
    assert_same_trace(path)


# ---- errors ----------------------------------------------------------------------------


def _error(loader, path: Path) -> str:
    with pytest.raises(TraceError) as info:
        loader(path)
    return str(info.value)


BAD = {
    "malformed-in-the-array": lambda text: text[:300_000] + "}{" + text[300_000:],
    "cut-off-in-the-array": lambda text: text[:len(text) // 2],
    "trailing-comma": lambda text: text[:text.rfind("}]") + 1] + "," + text[text.rfind("}]") + 1:],
    "two-event-lists": lambda text: text[:-1] + ', "traceEvents": []}',
    "text-after-the-document": lambda text: text + " {}",
    "bom": lambda text: "\ufeff" + text,
    "events-a-number": lambda text: '{"traceEvents": 3, "x": ' + text + "}",
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_documents_give_the_old_one_line_error(case: str, tmp_path: Path, batch_bytes: int) -> None:
    text = json.dumps(_document())
    path = tmp_path / f"{case}.json"
    path.write_text(BAD[case](text), encoding="utf-8")
    message = _error(load_kineto, path)
    assert message == _error(whole_document(load_kineto), path)
    assert "\n" not in message and message.startswith(str(path))


def test_malformed_array_error_counts_bytes_in_the_whole_document(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(json_stream, "BATCH_BYTES", SMALL_BATCH)
    text = json.dumps(_document())
    bad = text[:300_000] + "@" + text[300_000:]
    path = tmp_path / "bad.json"
    path.write_text(bad)
    message = _error(load_kineto, path)
    assert message.endswith("(byte 300000))"), message  # the "@" put at offset 300,000
    assert message == _error(whole_document(load_kineto), path)


# ---- memory ----------------------------------------------------------------------------

_MEASURE = """
import json, sys
from nsys_ledger.trace import json_stream
from nsys_ledger.trace.kineto_reader import load_kineto

def status(field):
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field))

json_stream.BATCH_BYTES = 1024 * 1024
load_kineto(sys.argv[2])  # warm: imports, polars' pools
with open("/proc/self/clear_refs", "w") as fh:
    fh.write("5")  # the peak (VmHWM) starts again from the current RSS
before = status("VmRSS:")
trace = load_kineto(sys.argv[1])
print(json.dumps({"kernels": trace.kernels.height, "grew": status("VmHWM:") - before}))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="measures the peak RSS through Linux's /proc")
def test_a_trace_is_read_in_memory_far_below_its_size(tmp_path: Path) -> None:
    """64 MiB of JSON (440,000 python_function events that become no frame, and 1,000 kernels)
    read with the peak RSS growing by less than half the text: the text is never held whole
    (a reader that holds it grows by at least its 64 MiB)."""
    kernel = ('{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":%d,"dur":3,'
              '"args":{"correlation":%d,"device":0,"stream":7}}')
    python = '{"ph":"X","cat":"python_function","name":"torch/nn/modules/module.py(1750): _call_impl","pid":1,' \
             '"tid":1,"ts":%d,"dur":2,"args":{"Python id":%d,"Python parent id":%d}}'
    path = tmp_path / "big.json"
    with path.open("w") as out:
        out.write('{"schemaVersion":1,"traceEvents":[')
        for i in range(1000):
            out.write(kernel % (i * 100, i) + ",")
            out.write(",".join(python % (i * 100 + j, j, j - 1) for j in range(440)) + ",")
        out.write('{"ph":"M","name":"process_name","pid":1,"args":{"name":"python"}}]}')
    size = path.stat().st_size
    assert size > 64 * 1024 * 1024
    small = tmp_path / "small.json"
    small.write_text('{"traceEvents":[' + kernel % (0, 0) + "]}")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(path), str(small)], capture_output=True, text=True,
                          env=env, check=True)
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    assert figures["kernels"] == 1000
    assert figures["grew"] < size / 2, figures
