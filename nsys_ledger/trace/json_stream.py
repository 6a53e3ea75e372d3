"""The `traceEvents` array of a Chrome-trace JSON document, read as a stream of event batches.

A PyTorch profiler trace is one JSON object: a few small keys (`deviceProperties`,
`distributedInfo`, `displayTimeUnit`, ...) before or after one huge `traceEvents` array.
Decoding the whole text at once holds the text and every decoded event together (2.5 GB for
a 619 MB trace); users' traces pass 1 GB per step. So the text is read in pieces (inflated
piece by piece when it is gzip) and the array is cut into batches of whole events:

* a candidate cut is a ``}`` followed by ``,`` and ``{`` (whitespace allowed between), the
  last one in a window of `BATCH_BYTES` after the current event;
* the batch ``[`` + text up to the cut + ``]`` is handed to the caller's decoder (msgspec).
  A candidate inside a string (``"a},{b"``) or inside a nested object of the last event
  leaves that event unfinished, which no JSON decoder accepts (a proper prefix of an object
  is never a whole value): the window is doubled and the batch cut again;
* where the array ends inside the window, the decoder reports the characters after its
  ``]`` as trailing ("trailing characters (byte N)"), which gives the end of the array; the
  keys after it are read as the ones before it.

The other top-level values are decoded on their own (msgspec reads the first value of the
rest of the text and reports where it ends). Anything this reader does not expect at the
top level (not an object or an array, a key given twice, a `traceEvents` that is not an
array, malformed text outside the array) raises `Unusual`: the caller then reads the
document whole, which words every such problem as before. Malformed text inside the array
is a `BadJson` whose message is the decoder's, with its byte offset counted in the whole
document, as a whole-document decode words it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

import msgspec

__all__ = ["BATCH_BYTES", "Unusual", "BadJson", "EventStream", "trailing_at"]

BATCH_BYTES = 8 * 1024 * 1024  # ~30-40k Kineto events, ~40 MB as decoded structs: small next to a trace, large next to per-batch costs
_COMPACT_AT = 1024 * 1024  # drop the consumed head of the buffer once it is this large
_WHITESPACE = frozenset(b" \t\r\n")
_OPEN_OBJECT, _CLOSE_OBJECT, _OPEN_ARRAY, _QUOTE, _COMMA, _COLON = (ord(c) for c in '{}["' + ",:")
_CUT = re.compile(rb"\}[ \t\r\n]*,[ \t\r\n]*\{")
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_BYTE = re.compile(r"\(byte (\d+)\)")
EVENTS_KEY = "traceEvents"

T = TypeVar("T")


class Unusual(Exception):
    """The document is not laid out as the stream reader expects: read it whole instead."""


class BadJson(Exception):
    """Malformed JSON inside the traceEvents array; the message is the decoder's."""


def trailing_at(exc: msgspec.DecodeError) -> int | None:
    """Where the trailing characters after a complete value begin (0-based), if that is the error."""
    match = _TRAILING.search(str(exc))
    return int(match.group(1)) - 1 if match else None


class EventStream(Generic[T]):
    """Batches of decoded events from the JSON text given as `pieces`.

    `decode(text, bare)` turns the text of a JSON array of events into a batch (`bare`: the
    document is a bare array, not an object) and raises msgspec.DecodeError when the text is
    not one whole JSON array. Iterate `batches()`; afterwards `header` holds the top-level
    values named in `keys` and `has_events` whether there was a traceEvents array (a null one
    leaves it False, as a missing one does)."""

    def __init__(self, pieces: Iterator[bytes], decode: Callable[[bytes, bool], T], keys: tuple[str, ...]):
        self._pieces = pieces
        self._decode = decode
        self._keys = keys
        self._buf = b""  # immutable: replaced, never grown in place (see _more)
        self._pos = 0  # the next unread byte of _buf
        self._base = 0  # the document offset of _buf[0]
        self._eof = False
        self.header: dict[str, Any] = {}
        self.has_events = False

    # -- the buffer ----------------------------------------------------------------------

    def _more(self, wanted: int = 1) -> bool:
        """Append pieces of text until `wanted` more bytes are buffered or the input ends;
        False when there was nothing left to append.

        The pieces are joined to the unread rest in one copy: a bytearray grown piece by
        piece (1 MiB each) was reallocated and copied many times per 8 MB batch (0.3 s of
        memory copies for a 607 MiB trace)."""
        if self._eof:
            return False
        pieces, got = [], 0
        while got < wanted:
            piece = next(self._pieces, None)
            if piece is None:
                self._eof = True
                break
            pieces.append(piece)
            got += len(piece)
        if not pieces:
            return False
        with memoryview(self._buf) as view:
            if self._pos >= _COMPACT_AT:
                rest = view[self._pos:]
                self._base += self._pos
                self._pos = 0
            else:
                rest = view
            self._buf = b"".join((rest, *pieces))
            rest.release()
        return True

    def _peek(self) -> int | None:
        """The next byte that is not whitespace (the position moves onto it); None at the end."""
        while True:
            buf, pos = self._buf, self._pos
            while pos < len(buf) and buf[pos] in _WHITESPACE:
                pos += 1
            self._pos = pos
            if pos < len(buf):
                return buf[pos]
            if not self._more():
                return None

    def _value(self) -> Any:
        """The JSON value that starts at the position, decoded; the position moves past it."""
        while True:
            with memoryview(self._buf) as view, view[self._pos:] as rest:
                value, ends = self._first_value(rest)
            if ends is not None:
                self._pos += ends
                return value
            # at least as much again as is buffered: a long value is copied O(1) times per byte
            if not self._more(len(self._buf) - self._pos):
                raise Unusual

    def _first_value(self, rest: memoryview) -> tuple[Any, int | None]:
        """The value at the start of `rest` and where it ends; (None, None) when the text may
        go on in the next piece."""
        try:
            value = msgspec.json.decode(rest)
            if self._eof:
                return value, len(rest)
            return None, None  # a number at the end of the buffer may go on in the next piece
        except msgspec.DecodeError as exc:
            ends = trailing_at(exc)
            if ends is None:
                if str(exc).startswith("Input data was truncated"):
                    return None, None
                raise Unusual from None
        except RecursionError:
            raise Unusual from None
        return msgspec.json.decode(bytes(rest[:ends])), ends

    # -- the document ----------------------------------------------------------------------

    def batches(self) -> Iterator[T]:
        first = self._peek()
        if first == _OPEN_ARRAY:
            self._pos += 1
            self.has_events = True
            yield from self._array(bare=True)
        elif first == _OPEN_OBJECT:
            self._pos += 1
            yield from self._object()
        else:
            raise Unusual
        if self._peek() is not None:
            raise Unusual  # text after the document

    def _object(self) -> Iterator[T]:
        seen: set[str] = set()
        following = self._peek()
        if following == _CLOSE_OBJECT:
            self._pos += 1
            return
        while True:
            if following != _QUOTE:
                raise Unusual
            key = self._value()
            if key in seen and (key == EVENTS_KEY or key in self._keys):
                raise Unusual  # which one counts is the whole-document decoder's business
            seen.add(key)
            if self._peek() != _COLON:
                raise Unusual
            self._pos += 1
            start = self._peek()
            if key == EVENTS_KEY and start == _OPEN_ARRAY:
                self._pos += 1
                self.has_events = True
                yield from self._array(bare=False)
            else:
                value = self._value()
                if key == EVENTS_KEY and value is not None:
                    raise Unusual  # not a list: worded by the whole-document reader
                if key in self._keys:
                    self.header[key] = value
            following = self._peek()
            if following == _CLOSE_OBJECT:
                self._pos += 1
                return
            if following != _COMMA:
                raise Unusual
            self._pos += 1
            following = self._peek()

    # -- the array -------------------------------------------------------------------------

    def _array(self, bare: bool) -> Iterator[T]:
        """Batches of the array whose `[` was just passed; the position ends after its `]`."""
        first = self._peek()
        if first is None:
            raise Unusual
        if first == ord("]"):
            self._pos += 1
            return
        window = BATCH_BYTES
        while True:
            while len(self._buf) - self._pos < window and self._more(window - (len(self._buf) - self._pos)):
                pass
            end = min(len(self._buf), self._pos + window)
            cut = self._last_cut(end)
            if cut is None:
                if self._eof and end == len(self._buf):
                    yield self._last_batch(bare)
                    return
                window *= 2
                continue
            close, following = cut
            with memoryview(self._buf) as view:  # one copy of the batch
                text = b"".join((b"[", view[self._pos:close + 1], b"]"))
            try:
                batch = self._decode(text, bare)
            except msgspec.DecodeError as exc:
                ends = trailing_at(exc)
                if ends is None:
                    if self._eof and end == len(self._buf):
                        yield self._last_batch(bare)  # no cut is left to try: the rest decides
                        return
                    window *= 2  # the cut was inside an event: cut again further on
                    continue
                yield self._ended_inside(text, ends, bare)
                return
            yield batch
            del batch, text  # the consumer has dropped its reference: free the events before the next decode
            self._pos = following
            window = BATCH_BYTES

    def _last_cut(self, end: int) -> tuple[int, int] | None:
        """The last candidate boundary between two events before `end`: the index of the `}`
        closing one event and of the `{` opening the next."""
        buf = self._buf
        at = end
        while True:
            at = buf.rfind(b"}", self._pos, at)
            if at < 0:
                return None
            match = _CUT.match(buf, at)
            if match is not None:
                return at, match.end() - 1

    def _ended_inside(self, text: bytes, ends: int, bare: bool) -> T:
        """The batch of an array that ended inside `text` (`ends`: the first character after it)."""
        array = text[:ends].rstrip(b" \t\r\n")
        batch = self._decode(array, bare)
        self._pos += len(array) - 1  # text[0] is the added "[": text[i] is _buf[_pos - 1 + i]
        return batch

    def _last_batch(self, bare: bool) -> T:
        """The events up to the end of the array, from the rest of the text."""
        text = b"[" + self._buf[self._pos:]
        try:
            batch = self._decode(text, bare)
        except msgspec.DecodeError as exc:
            ends = trailing_at(exc)
            if ends is None:
                offset = self._base + self._pos - 1
                raise BadJson(_BYTE.sub(lambda m: f"(byte {int(m.group(1)) + offset})", str(exc))) from None
            return self._ended_inside(text, ends, bare)
        self._pos = len(self._buf)
        return batch
