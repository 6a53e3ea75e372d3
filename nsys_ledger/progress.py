"""A progress line on the terminal for stages that take more than a second.

Reading a 1 GB export or attributing ten million kernels takes tens of seconds; a silent
terminal for that long looks hung. While a `stage` runs longer than `DELAY_S`, one line on
stderr says what is being done and for how long, rewritten in place and erased when the stage
ends, so nothing of it stays in the output.

Shown only when stderr is a terminal and neither the `CI` environment variable (set by GitHub
Actions, GitLab CI, Buildkite, ...) nor NSYS_LEDGER_PROGRESS=0 asks for quiet: a CI log or a
redirected stderr never gets the carriage returns. The work stays on the calling thread; a
daemon thread only writes the line, since the stages are long single calls into polars or
SQLite that cannot report on their own.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

DELAY_S = 1.0  # stages shorter than this print nothing
REFRESH_S = 0.5
PROGRESS_ENV = "NSYS_LEDGER_PROGRESS"
_ERASE = "\r\x1b[K"


def progress_enabled(stream: TextIO | None = None) -> bool:
    """True when progress lines may be written to `stream` (default: stderr)."""
    stream = stream if stream is not None else sys.stderr
    if os.environ.get(PROGRESS_ENV, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    if os.environ.get("CI", "").strip().lower() not in ("", "0", "false"):
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or not a real file
        return False


class _Ticker:
    """Writes `label  N s` to the stream every REFRESH_S once DELAY_S has passed."""

    def __init__(self, label: str, stream: TextIO):
        self.label = label
        self.stream = stream
        self.started = time.monotonic()
        self.shown = False
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nsys-ledger-progress", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        if self._done.wait(DELAY_S):
            return
        while not self._done.is_set():
            elapsed = time.monotonic() - self.started
            self._write(f"{_ERASE}nsys-ledger: {self.label} ... {elapsed:.0f} s")
            self.shown = True
            self._done.wait(REFRESH_S)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        if self.shown:
            self._write(_ERASE)

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # the terminal went away: progress is not worth an error
            self._done.set()


class _Quiet:
    """Stands in for the ticker when nothing may be shown; `label` can still be set."""

    def __init__(self, label: str):
        self.label = label


@contextmanager
def stage(label: str, stream: TextIO | None = None) -> Iterator[_Ticker | _Quiet]:
    """Show `label` with the elapsed seconds while the block runs longer than a second.

    The block gets an object whose `label` it may change (`done 3 of 8 files`)."""
    stream = stream if stream is not None else sys.stderr
    if not progress_enabled(stream):
        yield _Quiet(label)
        return
    ticker = _Ticker(label, stream)
    ticker.start()
    try:
        yield ticker
    finally:
        ticker.stop()


def quiet_worker() -> None:
    """Worker processes (local or Dask) share the parent's terminal: only the parent draws a
    progress line."""
    os.environ[PROGRESS_ENV] = "0"
