"""Read a PyTorch profiler (Kineto) Chrome trace, plain `.json` or gzip, into a `Trace`.

What a Kineto trace holds and where it lands in the Trace:

* ``cat: kernel`` -> `kernels` (device, stream and correlation from `args`);
  ``gpu_memcpy`` -> `memcpys` (kind from the name ``Memcpy HtoD (Pinned -> Device)``, else
  `args.kind`), ``gpu_memset`` -> `memsets`, ``cuda_sync`` -> `syncs`.
* ``cuda_runtime`` and ``cuda_driver`` -> `api_calls`, CUDA and HIP names alike
  (`hipLaunchKernel`, `hipExtModuleLaunchKernel`, `hipGraphLaunch`, ...), classified into the
  same kinds as an nsys export.
* ``user_annotation``, ``cpu_op`` and the ``nn.Module: X_n`` ranges of `with_modules` traces
  -> `nvtx` as push/pop ranges of their thread (domain = the Kineto category), so step
  detection (vLLM's ``execute_context_..._generation_...``, SGLang's ``step[DECODE bs=32]``)
  and NVTX projection see them; ``gpu_user_annotation`` as start/end ranges of the stream.
* ``deviceProperties`` -> `devices`; ``distributedInfo`` -> `meta.rank`, `meta.world_size`.

Process ids: Kineto writes GPU rows with the device as `pid` and the stream as `tid`. Each GPU
row takes the process of the call that launched it (by correlation id), so that a row and its
launching call join on `(pid, correlation)` as in an nsys export; ids are packed like nsys's
`globalTid` (`pid << 24 | tid`). A GPU row without `args.correlation` takes the id of the
`ac2g` flow that ends on it (Kineto's launch -> kernel arrow carries the correlation id).

CUDA/HIP graphs: a replayed kernel carries the correlation id of the `cudaGraphLaunch` /
`hipGraphLaunch` that replayed it (Kineto has no node ids). Such rows get a node id: the graph
(`graph_id`, one per distinct sequence of node names) and the position of the row in its
replay, ``graph_id << 20 | position``. So replays are counted by the same machinery as
`--cuda-graph-trace=node` exports, and the same node of two replays has the same id.

Timestamps are microseconds with up to three decimals (`ts`, `dur`), whatever
`displayTimeUnit` says: libkineto formats every time as ``<ns / 1000>.<ns % 1000>`` and
`displayTimeUnit: "ns"` only tells the viewer how to show them; they are relative to
`baseTimeNanoseconds` in recent traces, which is left out (all files of one run share it).
They become integer nanoseconds without losing a digit: the integer and fractional parts
are converted apart, and where a double cannot hold the decimal text to the nanosecond
(non-integer values at or above 2**43 µs, e.g. epoch microseconds with decimals), the numbers
are read again as text.

Reading streams: the text is inflated piece by piece and the `traceEvents` array decoded in
batches of whole events (`trace.json_stream`), each batch turned into polars columns of the
categories that become frames and then dropped, so memory holds one batch of events and the
columns, never the text or a million Python objects (docs/performance.md). A document laid out
unusually (not an object, a key twice, `traceEvents` not an array, malformed text outside the
array) is read whole instead, as before, so every problem keeps its one-line wording.
Decoding uses msgspec with typed structs (about 2.5x the standard library's speed on real
traces): only the fields used are materialized, the rest of each event is skipped by the
decoder. Anything wrong with the input is a `TraceError` naming the file.
"""

from __future__ import annotations

import os
import re
import zlib
from collections import defaultdict
from collections.abc import Iterator
from itertools import chain, compress, repeat
from operator import attrgetter, eq, is_
from pathlib import Path
from typing import Any, NamedTuple, Union

import msgspec
import polars as pl

from nsys_ledger.errors import TraceError
from nsys_ledger.safety import (
    MAX_JSON_BYTES, inflate_bounded, inflate_limit, inflate_stream, read_bounded, read_chunks, read_head,
)
from nsys_ledger.trace.json_stream import BadJson, EventStream, Unusual
from nsys_ledger.trace.model import FRAME_SCHEMAS, Trace, TraceMeta, empty_frame

__all__ = ["load_kineto", "load_kineto_capture", "is_kineto_file", "KINETO_VERSION_SOURCE"]

KINETO_VERSION_SOURCE = "kineto"
GZIP_MAGIC = b"\x1f\x8b"

I64 = pl.Int64
STR = pl.Utf8
_PID_SHIFT = 1 << 24
_LOW24 = 0xFFFFFF
# Above 2**43 µs a double's spacing exceeds 1 ns: the decimal text must be read exactly.
_EXACT_FLOAT_LIMIT_US = float(2**43)
_MAX_TIME_US = 9 * 10**15  # 285 years: larger times (or their ns) do not fit an int64 ns column
_UNIT_NS = 1000  # times are µs (see the module docstring)
GRAPH_ID_SHIFT = 20  # graph_node_id = graph_id << 20 | position in the replay
# A Kineto replay has no record of where its graph kernels were captured (nsys has node rows).
CAPTURE_HINT = (
    "{kernels} kernels were replayed from CUDA/HIP graphs: the trace does not say which module or layer "
    "captured them; give the capture traces (SGLang --enable-profile-cuda-graph, vLLM) with --capture"
)

# The categories that carry GPU work, host calls and ranges; every other category is ignored.
KERNEL_CATS = ("kernel",)
MEMCPY_CATS = ("gpu_memcpy", "Memcpy")
MEMSET_CATS = ("gpu_memset", "Memset")
SYNC_CATS = ("cuda_sync",)
RUNTIME_CATS = ("cuda_runtime", "Runtime")
DRIVER_CATS = ("cuda_driver",)
CPU_RANGE_CATS = ("user_annotation", "cpu_op")
GPU_RANGE_CATS = ("gpu_user_annotation",)
MODULE_RANGE_PREFIX = "nn.Module: "  # python_function events of with_modules traces
PUSH_POP, START_END = 59, 60

# API kinds (trace.model.API_KINDS) of CUDA runtime/driver and HIP names; first match wins.
_API_KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("kernel_launch",
     r"^(?:cudaLaunchKernel|cudaLaunchCooperativeKernel|cuLaunchKernel|cuLaunchCooperativeKernel|cuLaunchGrid"
     r"|hipLaunchKernel|hipLaunchCooperativeKernel|hipModuleLaunchKernel|hipExtModuleLaunchKernel"
     r"|hipExtLaunchKernel|hipModuleLaunchCooperativeKernel|hipHccModuleLaunchKernel)"
     r"|^(?:cudaLaunch|cuLaunch|hipLaunch)(?:_pt[sd]z)?$"),
    ("graph_launch", r"^(?:cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"),
    ("memcpy", r"^(?:cudaMemcpy|cuMemcpy|hipMemcpy)"),
    ("memset", r"^(?:cudaMemset|cuMemset|hipMemset)"),
    ("sync", r"^(?:cu|hip)\w*Synchronize|^(?:cudaStreamWaitEvent|cuStreamWaitEvent|hipStreamWaitEvent)"),
    ("graph_capture",
     r"^(?:cudaStreamBeginCapture|cudaStreamEndCapture|cudaGraphInstantiate|cuStreamBeginCapture"
     r"|cuStreamEndCapture|cuGraphInstantiate|hipStreamBeginCapture|hipStreamEndCapture|hipGraphInstantiate)"),
)
_VERSION_SUFFIX = r"_v\d+$"

# "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Host)", "Memcpy DtoD (Device -> Device)"
_MEMCPY_NAME = r"^Memcpy\s+(\w+)(?:\s*\((\w+)\s*->\s*(\w+)\))?"
_COPY_KINDS = ("HtoD", "DtoH", "DtoD", "HtoH", "PtoP", "HtoA", "AtoH", "AtoA", "AtoD", "DtoA")
_SYNC_KINDS = {
    "event sync": "Event sync", "stream sync": "Stream sync", "context sync": "Context sync",
    "stream wait event": "Stream wait event",
}


# ---------------------------------------------------------------------------------------
# The decoder's view of an event: only these fields are built, the rest is skipped. The
# structs are not tracked by the cyclic GC (`gc=False`: decoded JSON holds no cycles), which
# keeps millions of events from triggering collections while they are built.
# ---------------------------------------------------------------------------------------

_Number = Union[int, float, str, None]  # a few writers quote numbers


class _Args(msgspec.Struct, gc=False):
    # every number may also come quoted ("bytes": "4096" on HIP runtime calls)
    correlation: _Number = None
    device: _Number = None
    stream: _Number = None
    kind: _Number = None
    bytes: _Number = None
    kernel: Any = None  # launches recorded during stream capture name their kernel
    cuda_sync_kind: Any = None
    name: Any = None  # process_name / thread_name metadata


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Union[str, None] = None  # another type sends the document down the generic path
    name: Any = None
    pid: Union[int, str, None] = None
    tid: Union[int, str, None] = None
    ts: _Number = None
    dur: _Number = None
    args: Union[_Args, None] = None
    id: _Number = None  # flow events (`ac2g`): the correlation id they link


_NO_ARGS = _Args()
# Field getters: `map` with attrgetter builds a column about twice as fast as a comprehension.
_CAT, _ID, _PH = attrgetter("cat"), attrgetter("id"), attrgetter("ph")
_ARGS, _PID, _TID, _NAME, _TS, _DUR = (attrgetter(f) for f in ("args", "pid", "tid", "name", "ts", "dur"))
_DEVICE, _STREAM, _CORRELATION, _KIND, _BYTES, _SYNC_KIND = (
    attrgetter(f) for f in ("device", "stream", "correlation", "kind", "bytes", "cuda_sync_kind")
)


class _RawTimes(msgspec.Struct, gc=False):
    ts: msgspec.Raw = msgspec.Raw()  # empty when the event has none
    dur: msgspec.Raw = msgspec.Raw()


class _Document(msgspec.Struct, gc=False):
    traceEvents: Union[list[_Event], None] = None
    displayTimeUnit: Any = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None


class _RawDocument(msgspec.Struct, gc=False):
    traceEvents: list[_RawTimes]


# ---------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------


def is_kineto_file(p: Path) -> bool:
    """A Chrome-trace JSON file: its (un-gzipped) text opens a JSON object or array, or its
    name ends in .json / .json.gz (then the reader says what is wrong with it)."""
    try:
        head = read_head(p, str(p), 4096, TraceError)
    except TraceError:
        return False
    if re.search(r"\.json(?:\.gz)?$", p.name, re.IGNORECASE) and not head.startswith(b"SQLite format 3\x00"):
        return True
    if head.startswith(GZIP_MAGIC):
        try:
            head = zlib.decompressobj(wbits=31).decompress(head, 64)
        except zlib.error:
            return False
    return head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith((b"{", b"["))


def load_kineto(path: str | os.PathLike[str]) -> Trace:
    """Read the Kineto/Chrome trace at `path` (plain or gzip JSON). Raises TraceError."""
    return _build(_read(Path(path), str(path)))


def load_kineto_capture(path: str | os.PathLike[str]) -> tuple[Trace, pl.DataFrame]:
    """A capture trace (SGLang `--enable-profile-cuda-graph`, vLLM's capture profile) and the
    kernel each recorded launch call names in `args.kernel` (ROCm writes it; CUPTI does not):
    `pid, correlation, kernel`, one row per call that names one."""
    builder = _read(Path(path), str(path))
    trace = _build(builder)
    return trace, builder.launch_kernels


def _build(builder: "_Builder") -> Trace:
    try:
        return builder.build()
    except _OutOfRange as exc:
        raise TraceError(builder.shown, f"{exc.field} value {str(exc.value)[:40]} does not fit 64 bits: "
                                        "no profiler writes it (damaged or hand-made trace)") from None


def _read(p: Path, shown: str) -> "_Builder":
    """The trace's events as columns: streamed in batches (`trace.json_stream`), or decoded
    whole when the document is laid out unusually. Times that a double may have rounded are
    read again as text in a second pass over the file, for the frames that hold them."""
    events = _collect(p, shown, frozenset())
    exact = events.frames_needing_exact_times()
    if exact:
        if events.dropped:  # entries that are not objects: rows cannot be paired with their text
            raise TraceError(shown, "traceEvents holds entries that are not objects")
        events = _collect(p, shown, exact)
    return _Builder(shown, events)


def _collect(p: Path, shown: str, exact: frozenset[str]) -> "_EventColumns":
    columns = _EventColumns(exact)
    stream = EventStream(_json_pieces(p, shown), _decode_batch, _HEADER_KEYS)
    try:
        for batch in stream.batches():
            columns.add(batch, shown)
            del batch  # its events go before the next batch is decoded, not after
    except Unusual:
        return _collect_whole(p, shown, exact)
    except BadJson as exc:
        raise TraceError(shown, f"not valid JSON ({exc})") from None
    except RecursionError:
        raise TraceError(shown, "JSON nested too deeply: not a profiler trace") from None
    if not stream.has_events:
        raise TraceError(shown, "JSON without a traceEvents list: not a PyTorch profiler / Chrome trace")
    if columns.entries and columns.dropped == columns.entries:
        raise TraceError(shown, "traceEvents holds no event objects: not a PyTorch profiler (Kineto) trace")
    columns.document = _Document(**{key: stream.header.get(key) for key in _HEADER_KEYS})
    return columns


def _collect_whole(p: Path, shown: str, exact: frozenset[str]) -> "_EventColumns":
    """The whole-document path, for documents the stream reader does not expect: every
    problem of such a document is worded by `decode_document`."""
    data = read_json_bytes(p, shown)
    document = decode_document(data, shown)
    events = document.traceEvents
    if events is None:
        raise TraceError(shown, "JSON without a traceEvents list: not a PyTorch profiler / Chrome trace")
    raw = None
    if exact:
        try:
            raw = msgspec.json.decode(data, type=_RawDocument).traceEvents
        except msgspec.ValidationError:
            raw = None
        if raw is None or len(raw) != len(events):  # the generic path dropped non-object entries
            raise TraceError(shown, "traceEvents holds entries that are not objects")
    columns = _EventColumns(exact)
    columns.add_events(events, raw, shown)
    columns.document = document
    return columns


def _json_pieces(p: Path, shown: str) -> Iterator[bytes]:
    """The JSON text of `p` in pieces, un-gzipped when it is gzip data (by its magic, not its
    name), within the same bounds as `read_json_bytes` (`nsys_ledger.safety`)."""
    size, pieces = read_chunks(p, shown, MAX_JSON_BYTES, "a profiler trace", _READ_PIECE, TraceError)
    first = next(pieces, b"")
    if not first:
        raise TraceError(shown, "empty file")
    if not first.startswith(GZIP_MAGIC):
        return chain([first], pieces)
    return inflate_stream(chain([first], pieces), size, shown, inflate_limit(size), TraceError)


def _decode_batch(text: bytes, bare: bool) -> "_Batch":
    """A batch of events from the text of a JSON array: typed, or through the generic decoder
    when some field has an unusual type (and always for a bare-array document, as before)."""
    if not bare:
        try:
            events = _DECODE_EVENTS.decode(text)
            return _Batch(text, events, len(events))
        except msgspec.ValidationError:
            pass
    items = _DECODE_ANY.decode(text)
    return _Batch(text, [_event_from_dict(e) for e in items if isinstance(e, dict)], len(items))


def read_json_bytes(p: Path, shown: str) -> bytes:
    """The JSON text of `p`, un-gzipped when it is gzip data (by its magic, not its name).

    Bounded (`nsys_ledger.safety`): the file is refused unless regular, and gzip is inflated
    in chunks up to `inflate_limit` of its compressed size, so a gzip bomb is refused early."""
    raw = read_bounded(p, shown, MAX_JSON_BYTES, "a profiler trace", TraceError)
    if not raw:
        raise TraceError(shown, "empty file")
    if not raw.startswith(GZIP_MAGIC):
        return raw
    return inflate_bounded(raw, shown, inflate_limit(len(raw)), TraceError)


def decode_document(data: bytes, shown: str) -> _Document:
    """The typed document; a field of an unexpected type falls back to the generic decoder."""
    try:
        return msgspec.json.decode(data, type=_Document)
    except RecursionError:
        raise TraceError(shown, "JSON nested too deeply: not a profiler trace") from None
    except msgspec.ValidationError:
        pass  # valid JSON, unusual types somewhere: the slower generic path below
    except msgspec.DecodeError as exc:
        raise TraceError(shown, f"not valid JSON ({_first_line(exc)})") from None
    try:
        generic = msgspec.json.decode(data)
    except RecursionError:
        raise TraceError(shown, "JSON nested too deeply: not a profiler trace") from None
    except msgspec.DecodeError as exc:
        raise TraceError(shown, f"not valid JSON ({_first_line(exc)})") from None
    if isinstance(generic, list):  # the Chrome trace format also allows a bare event array
        generic = {"traceEvents": generic}
    if not isinstance(generic, dict):
        raise TraceError(shown, "JSON that is not an object: not a PyTorch profiler / Chrome trace")
    events = generic.get("traceEvents")
    if events is not None and not isinstance(events, list):
        raise TraceError(shown, "traceEvents is not a list")
    if events and not any(isinstance(e, dict) for e in events):
        raise TraceError(shown, "traceEvents holds no event objects: not a PyTorch profiler (Kineto) trace")
    return _Document(
        traceEvents=None if events is None else [_event_from_dict(e) for e in events if isinstance(e, dict)],
        displayTimeUnit=generic.get("displayTimeUnit"),
        schemaVersion=generic.get("schemaVersion"),
        deviceProperties=generic.get("deviceProperties"),
        distributedInfo=generic.get("distributedInfo"),
    )


def _event_from_dict(event: dict) -> _Event:
    args = event.get("args")
    parsed_args = None
    if isinstance(args, dict):
        parsed_args = _Args(
            correlation=_scalar(args.get("correlation")), device=_scalar(args.get("device")),
            stream=_scalar(args.get("stream")), kind=_scalar(args.get("kind")), bytes=_scalar(args.get("bytes")),
            kernel=_text(args.get("kernel")),
            cuda_sync_kind=_text(args.get("cuda_sync_kind")), name=args.get("name"),
        )
    return _Event(
        ph=_text(event.get("ph")), cat=_text(event.get("cat")), name=event.get("name"),
        pid=_scalar(event.get("pid")), tid=_scalar(event.get("tid")),
        ts=_scalar(event.get("ts")), dur=_scalar(event.get("dur")), args=parsed_args, id=_scalar(event.get("id")),
    )


def _scalar(value: Any) -> Any:
    return value if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _raw_number(raw: msgspec.Raw) -> str | None:
    """The text of a JSON number (or quoted number); None for an absent field or null."""
    text = bytes(raw).decode("utf-8", errors="replace").strip().strip('"')
    return text if text and text != "null" else None


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# ---------------------------------------------------------------------------------------
# Column helpers
# ---------------------------------------------------------------------------------------


class _OutOfRange(Exception):
    """An id, count or size a profiler cannot write: it does not fit 64 bits."""

    def __init__(self, field: str, value: Any):
        super().__init__(field, value)
        self.field, self.value = _FIELD_NAMES.get(field, field), value


# _as_int's column names -> the JSON field they come from
_FIELD_NAMES = {"c": "args.correlation", "correlation": "args.correlation", "p": "pid", "t": "tid",
                "_gpid": "pid", "_gtid": "tid", "_flow": "id", "bytes": "args.bytes", "device": "args.device",
                "stream": "args.stream"}
_INT64 = 1 << 63


def _first_out_of_range(values: list) -> Any:
    """The first value that is a number (or numeric text) outside the signed 64-bit range."""
    for value in values:
        if isinstance(value, int):
            if not -_INT64 <= value < _INT64:
                return value
        elif isinstance(value, float):
            if value != value or abs(value) >= _INT64:
                return value
        elif isinstance(value, str):
            text = value.strip()
            try:
                number = int(text) if text.lstrip("+-").isdigit() else float(text)
            except ValueError:
                continue
            if isinstance(number, int) and not -_INT64 <= number < _INT64 or \
                    isinstance(number, float) and (number != number or abs(number) >= _INT64):
                return value
    return None


def _as_int(values: list, name: str) -> pl.Series:
    """Integers from JSON numbers or numeric strings; anything else null.

    Raises _OutOfRange for a number past 64 bits (polars would make it null, or a float)."""
    try:
        return pl.Series(name, values, dtype=I64, strict=True)  # the usual case: plain ints
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        pass
    bad = _first_out_of_range(values)
    if bad is not None:
        raise _OutOfRange(name, bad)
    try:
        series = pl.Series(name, values, strict=False)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        series = pl.Series(name, [str(v) if v is not None else None for v in values], dtype=STR)
    if series.dtype == STR:
        return series.str.strip_chars().cast(I64, strict=False)
    if series.dtype.is_float():
        return series.round().cast(I64, strict=False)
    if series.dtype.is_integer() or series.dtype == pl.Null:
        return series.cast(I64, strict=False)
    return series.cast(STR, strict=False).cast(I64, strict=False)


def _as_text(values: list, name: str) -> pl.Series:
    """Text from JSON strings; a number or anything else becomes its text, null stays null."""
    try:
        return pl.Series(name, values, dtype=STR, strict=True)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):  # 2**128 as a name
        return pl.Series(name, [v if isinstance(v, str) else (None if v is None else str(v)) for v in values],
                         dtype=STR)


def decimal_text_to_ns(text: pl.Series, unit_ns: int) -> pl.Series:
    """Exact integer ns of decimal numbers given as text ("4909914216204.635"), in `unit_ns`."""
    digits = len(str(unit_ns)) - 1  # 3 for µs, 0 for ns
    frame = pl.DataFrame({"t": text.str.strip_chars().str.strip_chars('"')})
    unsigned = pl.col("t").str.strip_prefix("-")
    parts = unsigned.str.split_exact(".", 1)
    whole = parts.struct.field("field_0").cast(I64, strict=False)
    whole = pl.when(whole.abs() < _MAX_TIME_US).then(whole)  # beyond int64 ns: a damaged time
    fraction = (
        parts.struct.field("field_1").fill_null("").str.slice(0, digits).str.pad_end(digits, "0")
        .cast(I64, strict=False).fill_null(0)
        if digits else pl.lit(0, I64)
    )
    sign = pl.when(pl.col("t").str.starts_with("-")).then(-1).otherwise(1)
    return frame.select((sign * (whole * unit_ns + fraction)).alias(text.name)).to_series()


def float_to_ns(values: pl.Series, unit_ns: int) -> pl.Series:
    """Integer ns of float times in `unit_ns` units: whole and fraction converted apart, so no
    product of a 16-digit value with 1000 is ever rounded (exact below 2**43 µs)."""
    values = values.cast(pl.Float64)
    values = values.set(values.abs() >= _MAX_TIME_US, None)  # beyond int64 ns: a damaged time
    whole = values.floor()
    fraction = values - whole
    return (whole.cast(I64) * unit_ns + (fraction * unit_ns).round().cast(I64)).rename(values.name)


def _classify_api(names: pl.Series) -> pl.DataFrame:
    """`_raw, name, kind` for each distinct raw API name (the regexes run once per name)."""
    distinct = pl.DataFrame({"_raw": names.unique().drop_nulls()})
    kind = pl.when(pl.lit(False)).then(pl.lit(None, dtype=STR))
    for label, pattern in _API_KIND_PATTERNS:
        kind = kind.when(pl.col("name").str.contains(pattern)).then(pl.lit(label))
    return distinct.with_columns(pl.col("_raw").str.replace(_VERSION_SUFFIX, "").alias("name")).with_columns(
        kind.otherwise(pl.lit("other")).alias("kind")
    )


# ---------------------------------------------------------------------------------------
# Events as columns, batch by batch
# ---------------------------------------------------------------------------------------

_DECODE_EVENTS = msgspec.json.Decoder(list[_Event])
_DECODE_ANY = msgspec.json.Decoder()
_DECODE_RAW_TIMES = msgspec.json.Decoder(list[_RawTimes])
_HEADER_KEYS = ("displayTimeUnit", "schemaVersion", "deviceProperties", "distributedInfo")
_READ_PIECE = 4 * 1024 * 1024


class _Batch(NamedTuple):
    text: bytes  # the JSON array the events were decoded from (read again for exact times)
    events: list[_Event]
    entries: int  # entries of the array, objects or not


# The rows of each frame, by category in this order (a frame's rows are its categories' rows,
# category by category, each in file order): the order the whole-document reader gave them.
_FRAME_CATS: dict[str, tuple[str, ...]] = {
    "api": RUNTIME_CATS + DRIVER_CATS,
    "flow": ("ac2g",),  # only the GPU ends (`ph: f`)
    "kernel": KERNEL_CATS,
    "memcpy": MEMCPY_CATS,
    "memset": MEMSET_CATS,
    "sync": SYNC_CATS,
    "cpu": CPU_RANGE_CATS + ("python_function",),  # only the nn.Module ranges of python_function
    "gpu_range": GPU_RANGE_CATS,
}
_FRAME_OF = {cat: frame for frame, cats in _FRAME_CATS.items() for cat in cats}
_GPU_FRAMES = ("kernel", "memcpy", "memset", "sync", "gpu_range")
_EXTRA_COLUMNS = {"memcpy": ("kind", "bytes"), "memset": ("bytes",), "sync": ("cuda_sync_kind",)}
# a trace holds at least one of these, or it is not a profiler trace
_TRACE_CATS = (*KERNEL_CATS, *MEMCPY_CATS, *MEMSET_CATS, *SYNC_CATS, *GPU_RANGE_CATS, *RUNTIME_CATS, *DRIVER_CATS,
               *CPU_RANGE_CATS)


class _EventColumns:
    """The columns each frame needs, gathered batch by batch: only the events of the
    categories that become frames are kept, as polars Series, never as Python objects.

    A number that does not fit 64 bits is kept as its `_OutOfRange` in place of the batch's
    column and raised when the builder asks for that column: the same column, in the same
    order, as the whole-document reader raised it."""

    def __init__(self, exact: frozenset[str]):
        self.exact = exact  # frames whose times are read from the decimal text
        self.parts: dict[str, dict[str, list]] = {cat: defaultdict(list) for cat in _FRAME_OF}
        self.rows = dict.fromkeys(_FRAME_OF, 0)
        self.seen_cats: set[str] = set()
        self.events = 0
        self.entries = 0
        self.dropped = 0
        self._float_times: set[str] = set()  # frames with a time decoded as a double
        self._large_times: set[str] = set()  # ... and with one at or above 2**43 µs
        self.names = _NameTable()
        self.document = _Document()

    def add(self, batch: _Batch, shown: str) -> None:
        raw = None
        self.entries += batch.entries
        self.dropped += batch.entries - len(batch.events)
        if self.exact and any(e.cat in _FRAME_OF and _FRAME_OF[e.cat] in self.exact for e in batch.events):
            try:
                raw = _DECODE_RAW_TIMES.decode(batch.text)
            except msgspec.ValidationError:
                raise TraceError(shown, "traceEvents holds entries that are not objects") from None
        self.add_events(batch.events, raw, shown)

    def add_events(self, events: list[_Event], raw: list[_RawTimes] | None, shown: str) -> None:
        self.events += len(events)
        by_cat: dict[Any, list] = defaultdict(list)
        if raw is None:
            for event in events:
                by_cat[event.cat].append(event)
        else:  # exact times: the rows' places in the batch pair them with their text
            for index, cat in enumerate(map(_CAT, events)):
                by_cat[cat].append(index)
        for cat, picked in by_cat.items():
            frame = _FRAME_OF.get(cat)
            if frame is None:
                continue
            self.seen_cats.add(cat)
            rows = None
            if raw is not None:
                rows, picked = picked, list(map(events.__getitem__, picked))
            if cat == "ac2g":
                keep = list(map(eq, map(_PH, picked), repeat("f")))
            elif cat == "python_function":
                keep = list(map(_is_module_range, map(_NAME, picked)))
            else:
                keep = None
            if keep is not None:
                picked = list(compress(picked, keep))
                rows = None if rows is None else list(compress(rows, keep))
            if picked:
                self._add_rows(cat, frame, picked, rows, raw)

    def _add_rows(self, cat: str, frame: str, picked: list[_Event], rows: list[int] | None, raw) -> None:
        parts = self.parts[cat]
        self.rows[cat] += len(picked)
        ts, duration = self._times(frame, picked, rows, raw)
        parts["ts"].append(ts)
        parts["dur"].append(duration)
        parts["pid"].append(_lazy_int(list(map(_PID, picked)), "pid"))
        parts["tid"].append(_lazy_int(list(map(_TID, picked)), "tid"))
        if frame == "flow":
            parts["id"].append(_lazy_int(list(map(_ID, picked)), "_flow"))
            return
        parts["name"].append(self._name_codes(list(map(_NAME, picked))))
        if frame == "cpu":
            return
        args = list(map(_ARGS, picked))
        if frame == "api":
            parts["correlation"].append(_lazy_int([a.correlation if a is not None else None for a in args], "c"))
            named = [(e.pid, a.correlation, a.kernel) for e, a in zip(picked, args)
                     if a is not None and isinstance(a.kernel, str)]
            parts["launch_pid"].append(_lazy_int([n[0] for n in named], "pid"))
            parts["launch_correlation"].append(_lazy_int([n[1] for n in named], "correlation"))
            parts["launch_kernel"].append(pl.Series("kernel", [n[2] for n in named], dtype=STR))
            return
        if any(map(is_, args, repeat(None))):  # by identity: `None in args` calls each struct's __eq__
            args = [a if a is not None else _NO_ARGS for a in args]
        parts["device"].append(_lazy_int(list(map(_DEVICE, args)), "device"))
        parts["stream"].append(_lazy_int(list(map(_STREAM, args)), "stream"))
        parts["correlation"].append(_lazy_int(list(map(_CORRELATION, args)), "correlation"))
        extra = _EXTRA_COLUMNS.get(frame, ())
        if "kind" in extra:
            parts["_kind"].append(_as_text(list(map(_KIND, args)), "_kind"))
        if "bytes" in extra:
            parts["bytes"].append(_lazy_int(list(map(_BYTES, args)), "bytes"))
        if "cuda_sync_kind" in extra:
            parts["_sync"].append(_as_text(list(map(_SYNC_KIND, args)), "_sync"))

    def _name_codes(self, names: list) -> pl.Series:
        """The batch's names as codes into `self.names` (UInt32), or as text when one is not a
        string or the table of distinct names is full."""
        try:
            return pl.Series("name", list(map(self.names.__getitem__, names)), dtype=_CODE)
        except (_NotInterned, TypeError):  # TypeError: a list or object as a name is no dict key
            return _as_text(names, "name")

    def _times(self, frame: str, picked: list[_Event], rows: list[int] | None, raw) -> tuple[pl.Series, pl.Series]:
        """Start and duration of one category's events of one batch as decoded (numbers or
        text); converted to ns when the builder asks for them (`times`), a run of batches of
        one type at once."""
        ts = pl.Series("ts", list(map(_TS, picked)), strict=False)
        if ts.dtype.is_float():
            self._float_times.add(frame)
        if ts.dtype.is_numeric() and bool((ts.abs() >= _EXACT_FLOAT_LIMIT_US).any()):
            self._large_times.add(frame)
        if frame in self.exact:
            exact = [raw[i] for i in rows]
            return (pl.Series("ts", [_raw_number(r.ts) for r in exact], dtype=STR),
                    pl.Series("dur", [_raw_number(r.dur) for r in exact], dtype=STR))
        return ts, pl.Series("dur", list(map(_DUR, picked)), strict=False)

    def frames_needing_exact_times(self) -> frozenset[str]:
        """Frames with a non-integer time at or above 2**43 µs, where a double's spacing
        exceeds half a nanosecond (at 1.7e15 µs, epoch time, it is a quarter µs): all their
        times are read again as text (the decoder gives integer literals as int)."""
        return frozenset(self._float_times & self._large_times) - self.exact

    # -- the builder's view --------------------------------------------------------------

    def count(self, frame: str, cats: tuple[str, ...] | None = None) -> int:
        return sum(self.rows[cat] for cat in (cats or _FRAME_CATS[frame]))

    def column(self, frame: str, name: str, dtype: pl.DataType = I64, cats: tuple[str, ...] | None = None,
               alias: str | None = None) -> pl.Series:
        """The column `name` of the frame's rows (of `cats` only, when given), batch parts joined."""
        pieces = [piece for cat in (cats or _FRAME_CATS[frame]) for piece in self.parts[cat].get(name, [])]
        for piece in pieces:
            if isinstance(piece, _OutOfRange):
                raise piece
        alias = alias or name
        if not pieces:
            return pl.Series(alias, [], dtype=dtype)
        if name == "name":
            pieces = self._names_of(pieces)
        return pl.concat([piece.cast(dtype) for piece in pieces]).alias(alias)

    def _names_of(self, pieces: list[pl.Series]) -> list[pl.Series]:
        """Name pieces as text: each run of code pieces joined and looked up at once, so all
        rows of a name share one copy of its text (1M kernels of ~40 names: 16 MB of string
        views instead of ~190 MB of repeated text)."""
        distinct = pl.Series("name", list(self.names), dtype=STR)
        text, run = [], []
        for piece in [*pieces, None]:
            if piece is not None and piece.dtype == _CODE:
                run.append(piece)
                continue
            if run:
                text.append(distinct.gather(pl.concat(run)))
                run = []
            if piece is not None:
                text.append(piece)
        return text

    def times(self, frame: str, name: str) -> pl.Series:
        """Integer ns of the frame's `ts` or `dur`: each run of batch parts of one type joined
        and converted at once (the conversion depends on the type, not on the batch)."""
        pieces = [piece for cat in _FRAME_CATS[frame] for piece in self.parts[cat].get(name, [])]
        converted, run = [], []
        for piece in pieces:
            if run and (piece.dtype != run[0].dtype or piece.dtype == pl.Object):
                converted.append(_to_ns(pl.concat(run)).cast(I64))
                run = []
            run.append(piece)
        if run:
            converted.append(_to_ns(pl.concat(run)).cast(I64))
        return pl.concat(converted) if converted else pl.Series(name, [], dtype=I64)

    def release(self, frame: str) -> None:
        """Drop the frame's columns once its frame is built (they and the frame would
        otherwise both be held until the whole Trace is)."""
        for cat in _FRAME_CATS[frame]:
            self.parts[cat].clear()

    def has_any_trace_category(self) -> bool:
        return any(cat in self.seen_cats for cat in _TRACE_CATS)


_CODE = pl.UInt32
_MAX_NAMES = 1 << 16  # distinct names held as Python strings; past it, a batch's new names stay text


class _NotInterned(Exception):
    """A name that is not a string, or a new one past `_MAX_NAMES`."""


class _NameTable(dict):
    """Each distinct event name (a string, or None) -> its code, in first-seen order. Kineto
    names repeat (a decode step launches the same ~2,000 kernels), so a batch's names become
    small integers and the frame's text is built once per distinct name. Only strings and
    None are codes: 1, 1.0 and True are one dict key but three different texts."""

    def __missing__(self, name: Any) -> int:
        if (name is not None and type(name) is not str) or len(self) >= _MAX_NAMES:
            raise _NotInterned
        code = self[name] = len(self)
        return code


def _replayed_rows(frames: tuple[pl.DataFrame, ...], launches: pl.DataFrame) -> pl.DataFrame:
    """`_row, _frame, pid, correlation, start, _name` (a hash of the name) of the GPU rows (of
    `frames`: their index as `_frame`, their row as `_row`) whose (pid, correlation) is a graph
    launch's. The correlation is matched first (a hash of one column); a two-column join is
    paid only when launches come from several processes."""
    rows = pl.concat([
        df.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), pl.lit(index, pl.UInt8).alias("_frame"),
                  "pid", "correlation", "start", pl.col("name").fill_null("").hash().alias("_name"))
        for index, df in enumerate(frames)
    ])
    rows = rows.filter(pl.col("correlation").is_in(launches["correlation"].implode()))
    pids = launches["pid"].unique()
    if pids.len() == 1:
        return rows.filter(pl.col("pid") == pids[0])
    return rows.join(launches, on=["pid", "correlation"], how="semi", maintain_order="left")


def _repeated(name: str, value: Any, height: int, dtype: pl.DataType) -> pl.Series:
    """`value` `height` times (no Python list of a million Nones to convert)."""
    return pl.repeat(value, height, dtype=dtype, eager=True).alias(name)


def _scattered(name: str, height: int, rows: pl.Series, values: pl.Series) -> pl.Series:
    """A column of `height` nulls with `values` at `rows`."""
    return pl.Series(name, [], dtype=I64).extend_constant(None, height).scatter(rows, values)


def _is_module_range(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(MODULE_RANGE_PREFIX)


def _lazy_int(values: list, name: str) -> pl.Series | _OutOfRange:
    try:
        return _as_int(values, name)
    except _OutOfRange as exc:
        return exc


def _to_ns(series: pl.Series) -> pl.Series:
    if series.dtype == STR or series.dtype == pl.Object:
        return decimal_text_to_ns(series.cast(STR), _UNIT_NS)
    if series.dtype.is_integer() or series.dtype == pl.Null:
        series = series.cast(I64, strict=False)
        return series.set(series.abs() >= _MAX_TIME_US, None) * _UNIT_NS
    return float_to_ns(series, _UNIT_NS)


# ---------------------------------------------------------------------------------------
# Building the Trace
# ---------------------------------------------------------------------------------------


class _Builder:
    def __init__(self, shown: str, events: _EventColumns):
        self.shown = shown
        self.events = events
        self.document = events.document
        self.warnings: list[str] = []
        self.launch_kernels = pl.DataFrame(schema={"pid": I64, "correlation": I64, "kernel": STR})

    def build(self) -> Trace:
        if not self.events.has_any_trace_category():
            if not self.events.events:
                raise TraceError(self.shown, "the trace holds no events (empty traceEvents)")
            raise TraceError(
                self.shown,
                "no kernel, CUDA runtime, cpu_op or annotation events: not a PyTorch profiler (Kineto) trace",
            )

        api_calls = self.api_calls()
        self.launch_kernels = self.named_launch_kernels()
        self.events.release("api")
        launchers = api_calls.select("pid", "correlation").drop_nulls().unique(subset=["correlation"], keep="first")
        self.flow_ends = self._flow_ends()
        self.events.release("flow")
        main_pid = self._main_pid(api_calls)
        kernels, memcpys, memsets, syncs = (self.gpu_rows(frame, launchers, main_pid)
                                            for frame in ("kernel", "memcpy", "memset", "sync"))
        if kernels.height == 0:
            self.warnings.append("the trace has no kernel events (was the profiler run with CUDA activities?)")

        kernels, memcpys, memsets = self.graph_nodes_of_replays(kernels, memcpys, memsets, api_calls)
        frames = {
            "kernels": self.kernels(kernels),
            "api_calls": api_calls,
            "memcpys": self.memcpys(memcpys),
            "memsets": self.memsets(memsets),
            "syncs": self.syncs(syncs),
            "nvtx": self.nvtx(launchers, main_pid),
            "devices": self.devices(kernels, memcpys, memsets),
        }
        for kind, df in frames.items():
            frames[kind] = df.select(list(FRAME_SCHEMAS[kind])).cast(FRAME_SCHEMAS[kind])
        graph_kernels = int(frames["kernels"]["graph_node_id"].is_not_null().sum())
        if graph_kernels:
            self.warnings.append(CAPTURE_HINT.format(kernels=graph_kernels))
        rank, world_size = self._distributed()
        meta = TraceMeta(
            nsys_version=None,
            schema_version=None if self.document.schemaVersion is None else str(self.document.schemaVersion),
            version_source=KINETO_VERSION_SOURCE,
            cuda_graph_trace="node" if graph_kernels else None,
            warnings=tuple(self.warnings),
            rank=rank,
            world_size=world_size,
        )
        return Trace(path=self.shown, meta=meta, **frames)

    # -- times -------------------------------------------------------------------------

    def _span(self, frame: str) -> tuple[pl.Series, pl.Series]:
        """Start and end in integer ns of the frame's events (converted batch by batch; each
        frame checked on its own for values a double cannot hold to the nanosecond)."""
        start = self.events.times(frame, "ts")
        duration = self.events.times(frame, "dur")
        negative = int((duration < 0).sum())
        if negative:
            raise TraceError(self.shown, f"{negative} of {start.len()} events have a negative duration (dur): "
                                         "no profiler writes that (damaged or hand-made trace)")
        start = start.alias("start")
        return start, (start + duration.fill_null(0)).alias("end")

    # -- host side ---------------------------------------------------------------------

    def api_calls(self) -> pl.DataFrame:
        if not self.events.count("api"):
            return empty_frame("api_calls")
        column = self.events.column
        start, end = self._span("api")
        runtime, driver = self.events.count("api", RUNTIME_CATS), self.events.count("api", DRIVER_CATS)
        df = pl.DataFrame({
            "start": start, "end": end, "pid": column("api", "pid"), "tid": column("api", "tid"),
            "correlation": column("api", "correlation"),
            "_raw": column("api", "name", STR, alias="_raw"),
            "event_class": pl.concat([_repeated("event_class", 0, runtime, I64),
                                      _repeated("event_class", 1, driver, I64)]),
        })
        names = _classify_api(df["_raw"])
        df = df.join(names, on="_raw", how="left", maintain_order="left")
        return df.with_columns(
            pl.col("kind").fill_null("other"),
            ((pl.col("pid") & _LOW24) * _PID_SHIFT + (pl.col("tid") & _LOW24)).alias("global_tid"),
        ).sort("start", maintain_order=True)

    def named_launch_kernels(self) -> pl.DataFrame:
        """`pid, correlation, kernel` of the launch calls whose args name their kernel."""
        column = self.events.column
        return pl.DataFrame({
            "pid": column("api", "launch_pid", alias="pid"),
            "correlation": column("api", "launch_correlation", alias="correlation"),
            "kernel": column("api", "launch_kernel", STR, alias="kernel"),
        }, schema={"pid": I64, "correlation": I64, "kernel": STR})

    def _main_pid(self, api_calls: pl.DataFrame) -> int | None:
        """The process that made the most API calls (else the most ranges): GPU rows whose
        launching call was not recorded are given to it."""
        if api_calls.height:
            counts = api_calls.group_by("pid").len().sort(["len", "pid"], descending=[True, False])
            return counts["pid"][0]
        pids = self.events.column("cpu", "pid", cats=CPU_RANGE_CATS).drop_nulls()
        return pids.mode().sort()[0] if pids.len() else None

    # -- GPU side ----------------------------------------------------------------------

    def gpu_rows(self, frame: str, launchers: pl.DataFrame, main_pid: int | None) -> pl.DataFrame:
        """Common columns of GPU rows: times, device, stream, correlation, name, launching pid;
        and the kind, bytes or sync kind where this kind of row has one."""
        column = self.events.column
        rows = self.events.count(frame)
        start, end = self._span(frame)
        device = column(frame, "device")
        stream = column(frame, "stream")
        # Kineto draws GPU rows with pid = device and tid = stream: fill what args lack from them
        if device.null_count():
            device = device.fill_null(column(frame, "pid"))
        if stream.null_count():
            stream = stream.fill_null(column(frame, "tid"))
        columns = {
            "start": start, "end": end, "device": device, "stream": stream,
            "correlation": column(frame, "correlation"),
            "name": column(frame, "name", STR),
            "_kind": _repeated("_kind", None, rows, STR),
            "bytes": _repeated("bytes", None, rows, I64),
            "_sync": _repeated("_sync", None, rows, STR),
        }
        extra = _EXTRA_COLUMNS.get(frame, ())
        if "kind" in extra:
            columns["_kind"] = column(frame, "_kind", STR)
        if "bytes" in extra:
            columns["bytes"] = column(frame, "bytes")
            negative = int((columns["bytes"] < 0).sum())
            if negative:
                raise TraceError(self.shown, f"{negative} of {rows} copy or memset events have a negative "
                                             "size (args.bytes): no profiler writes that")
        if "cuda_sync_kind" in extra:
            columns["_sync"] = column(frame, "_sync", STR)
        df = pl.DataFrame(columns)
        if df["correlation"].null_count() and self.flow_ends is not None:
            df = self._correlation_from_flows(df, frame)
        df = df.join(launchers, on="correlation", how="left", maintain_order="left")
        df = df.with_columns(pl.col("pid").fill_null(pl.lit(main_pid, dtype=I64)))
        missing = df["start"].null_count()
        if missing:
            raise TraceError(self.shown, f"{missing} of {df.height} GPU events have no timestamp (ts)")
        self.events.release(frame)
        return df.with_columns((pl.col("pid") * _PID_SHIFT).alias("global_pid"))

    def _flow_ends(self) -> pl.DataFrame | None:
        """The GPU ends of `ac2g` flows (`ph: f`, drawn at the GPU row they bind to):
        `_gpid, _gtid, start, _flow` (the correlation id), or None without any. Several flows
        may end at one place; `_correlation_from_flows` takes the first."""
        if not self.events.count("flow"):
            return None
        column = self.events.column
        start, _ = self._span("flow")
        return pl.DataFrame({
            "_gpid": column("flow", "pid", alias="_gpid"), "_gtid": column("flow", "tid", alias="_gtid"),
            "start": start, "_flow": column("flow", "id", alias="_flow"),
        }).drop_nulls()

    def _correlation_from_flows(self, df: pl.DataFrame, frame: str) -> pl.DataFrame:
        """Fill a GPU row's missing `args.correlation` from the flow that ends on it: Kineto
        draws the launch -> kernel arrow with the correlation id as the flow id. Only the flows
        ending where a row lacks one are made unique (a trace has about one flow per kernel,
        and most rows carry their correlation)."""
        keys = ["_gpid", "_gtid", "start"]
        keyed = df.with_columns(self.events.column(frame, "pid", alias="_gpid"),
                                self.events.column(frame, "tid", alias="_gtid"))
        wanted = keyed.filter(pl.col("correlation").is_null()).select(keys)
        flows = (self.flow_ends.join(wanted, on=keys, how="semi", maintain_order="left")
                 .unique(subset=keys, keep="first"))
        linked = keyed.join(flows, on=keys, how="left", maintain_order="left")
        return linked.with_columns(pl.coalesce("correlation", "_flow").alias("correlation")).drop(
            "_gpid", "_gtid", "_flow")

    def graph_nodes_of_replays(
        self, kernels: pl.DataFrame, memcpys: pl.DataFrame, memsets: pl.DataFrame, api_calls: pl.DataFrame
    ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
        """`graph_id` and `graph_node_id` for the rows that share a graph launch's correlation."""
        launches = api_calls.filter(pl.col("kind") == "graph_launch").select("pid", "correlation").drop_nulls()
        frames = (kernels, memcpys, memsets)
        nodes = _replayed_rows(frames, launches)
        if nodes.height == 0:
            return tuple(  # type: ignore[return-value]
                df.with_columns(pl.lit(None, I64).alias("graph_id"), pl.lit(None, I64).alias("graph_node_id"))
                for df in frames
            )
        # one replay per (pid, correlation): after the sort each replay's rows are one run
        nodes = nodes.sort("pid", "correlation", "start", "_frame", "_row")
        first = ((pl.col("pid") != pl.col("pid").shift(1)) | (pl.col("correlation") != pl.col("correlation").shift(1))
                 ).fill_null(True)
        row = pl.int_range(pl.len(), dtype=I64)
        nodes = nodes.with_columns(first.alias("_first_row")).with_columns(
            (pl.col("_first_row").cum_sum() - 1).alias("_replay"),
            (row - pl.when(pl.col("_first_row")).then(row).forward_fill()).alias("_position"),
        )
        # one graph per distinct node sequence: the same id for every replay of one graph
        # a 64-bit hash of the ordered name sequence: joining 2000 names per replay into one
        # string cost 2 s at 1M kernels
        replays = nodes.group_by("_replay", maintain_order=True).agg(
            pl.col("pid").first(),
            pl.col("_name").alias("_sequence"),
            pl.col("start").min().alias("_first"),
        ).with_columns(pl.col("_sequence").hash())
        graphs = (
            replays.group_by("pid", "_sequence").agg(pl.col("_first").min())
            .sort("pid", "_first")
            .with_columns(pl.int_range(1, pl.len() + 1).over("pid").cast(I64).alias("graph_id"))
        )
        graph_of_replay = replays.join(graphs.select("pid", "_sequence", "graph_id"), on=["pid", "_sequence"],
                                       how="left", maintain_order="left")["graph_id"]
        nodes = nodes.with_columns(pl.lit(graph_of_replay).gather(pl.col("_replay")).alias("graph_id")).with_columns(
            (pl.col("graph_id") * (1 << GRAPH_ID_SHIFT) + pl.col("_position")).alias("graph_node_id")
        )
        result = []
        for index, df in enumerate(frames):
            mine = nodes.filter(pl.col("_frame") == index)
            result.append(df.with_columns(
                _scattered("graph_id", df.height, mine["_row"], mine["graph_id"]),
                _scattered("graph_node_id", df.height, mine["_row"], mine["graph_node_id"]),
            ))
        return tuple(result)  # type: ignore[return-value]

    def kernels(self, df: pl.DataFrame) -> pl.DataFrame:
        if df.height == 0:
            return empty_frame("kernels")
        return df.with_columns(pl.col("name").alias("short_name"))

    def memcpys(self, df: pl.DataFrame) -> pl.DataFrame:
        if df.height == 0:
            return empty_frame("memcpys")
        parts = df["name"].str.extract_groups(_MEMCPY_NAME)
        named_kind = parts.struct.field("1")
        kind_arg = pl.col("_kind")
        copy_kind = (
            pl.when(pl.col("_named").is_in(_COPY_KINDS)).then(pl.col("_named"))
            .when(kind_arg.is_in(_COPY_KINDS)).then(kind_arg)
            .otherwise(pl.coalesce(pl.col("_named"), kind_arg, pl.lit("Unknown")))
        )
        return df.with_columns(
            named_kind.alias("_named"), parts.struct.field("2").alias("src_kind"),
            parts.struct.field("3").alias("dst_kind"),
        ).with_columns(copy_kind.alias("copy_kind"))

    def memsets(self, df: pl.DataFrame) -> pl.DataFrame:
        if df.height == 0:
            return empty_frame("memsets")
        mem_kind = df["name"].str.extract(r"\((\w+)\)", 1)
        return df.with_columns(mem_kind.alias("mem_kind"))

    def syncs(self, df: pl.DataFrame) -> pl.DataFrame:
        if df.height == 0:
            return empty_frame("syncs")
        label = pl.coalesce("_sync", "name").str.to_lowercase().str.strip_chars()
        return df.with_columns(
            label.replace_strict(_SYNC_KINDS, default="Unknown", return_dtype=STR).alias("sync_type")
        )

    # -- ranges ------------------------------------------------------------------------

    def nvtx(self, launchers: pl.DataFrame, main_pid: int | None) -> pl.DataFrame:
        column = self.events.column
        frames = []
        if self.events.count("cpu"):
            start, end = self._span("cpu")
            domain = [_repeated("domain", cat, self.events.rows[cat], STR) for cat in CPU_RANGE_CATS]
            domain.append(_repeated("domain", "nn.Module", self.events.rows["python_function"], STR))
            frames.append(pl.DataFrame({
                "start": start, "end": end,
                "pid": column("cpu", "pid"),
                "tid": column("cpu", "tid"),
                "event_type": _repeated("event_type", PUSH_POP, start.len(), I64),
                "name": column("cpu", "name", STR),
                "domain": pl.concat(domain),
            }))
        if self.events.count("gpu_range"):
            gpu = self.gpu_rows("gpu_range", launchers, main_pid)
            # a GPU annotation has no launching call: it belongs to the process that annotated
            frames.append(gpu.select(
                "start", "end", pl.lit(main_pid, dtype=I64).alias("pid"), pl.col("stream").alias("tid"),
                pl.lit(START_END, dtype=I64).alias("event_type"), "name",
                pl.lit("gpu_user_annotation", dtype=STR).alias("domain"),
            ))
        if not frames:
            return empty_frame("nvtx")
        ranges = pl.concat(frames, how="vertical_relaxed").filter(
            pl.col("pid").is_not_null() & pl.col("tid").is_not_null() & pl.col("start").is_not_null()
        )
        return ranges.with_columns(
            ((pl.col("pid") & _LOW24) * _PID_SHIFT + (pl.col("tid") & _LOW24)).alias("global_tid"),
            pl.lit(None, I64).alias("end_global_tid"),
        ).sort("global_tid", "start", maintain_order=True)

    # -- devices and ranks -------------------------------------------------------------

    def devices(self, kernels: pl.DataFrame, memcpys: pl.DataFrame, memsets: pl.DataFrame) -> pl.DataFrame:
        described = []
        properties = self.document.deviceProperties
        for entry in properties if isinstance(properties, list) else []:
            if not isinstance(entry, dict) or not isinstance(entry.get("id"), int):
                continue
            major, minor = entry.get("computeMajor"), entry.get("computeMinor")
            described.append({
                "device": entry["id"],
                "name": entry.get("name") if isinstance(entry.get("name"), str) and entry.get("name") else None,
                "sm_count": entry.get("numSms") if isinstance(entry.get("numSms"), int) else None,
                "total_memory": entry.get("totalGlobalMem") if isinstance(entry.get("totalGlobalMem"), int) else None,
                "compute_capability": f"{major}.{minor}" if isinstance(major, int) and isinstance(minor, int) else None,
            })
        schema = FRAME_SCHEMAS["devices"]
        df = pl.DataFrame(described, schema=schema) if described else pl.DataFrame(schema=schema)
        df = df.unique(subset=["device"], keep="first", maintain_order=True)
        used = pl.concat([f.select("device") for f in (kernels, memcpys, memsets)]).drop_nulls().unique()
        missing = used.join(df.select("device"), on="device", how="anti")
        if missing.height:
            df = pl.concat([df, missing], how="diagonal")
        return df.sort("device")

    def _distributed(self) -> tuple[int | None, int | None]:
        info = self.document.distributedInfo
        if not isinstance(info, dict):
            return None, None
        rank, world = info.get("rank"), info.get("world_size")
        return (rank if isinstance(rank, int) else None, world if isinstance(world, int) else None)
