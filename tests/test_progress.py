"""The progress line: only on a terminal, never in CI or when switched off, erased at the end."""

from __future__ import annotations

import io
import threading

import pytest

from nsys_ledger import progress


class FakeTerminal(io.StringIO):
    """A stream that says it is a terminal and tells when something was written."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def isatty(self) -> bool:
        return True

    def write(self, text: str) -> int:
        count = super().write(text)
        self.written.set()
        return count


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv(progress.PROGRESS_ENV, raising=False)
    return FakeTerminal()


def test_enabled_only_on_a_terminal(terminal):
    assert progress.progress_enabled(terminal)
    assert not progress.progress_enabled(io.StringIO())


@pytest.mark.parametrize("name, value", [("CI", "true"), ("CI", "1"), (progress.PROGRESS_ENV, "0")])
def test_ci_and_the_switch_keep_it_quiet(terminal, monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    assert not progress.progress_enabled(terminal)


def test_a_long_stage_shows_its_label_then_erases_the_line(terminal, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 0.0)
    with progress.stage("reading big.sqlite", terminal) as line:
        assert terminal.written.wait(timeout=30)
        line.label = "reading big.sqlite: half"
    text = terminal.getvalue()
    assert text.startswith("\r\x1b[Knsys-ledger: reading big.sqlite ... ")
    assert text.endswith("\r\x1b[K")


def test_a_short_stage_prints_nothing(terminal, monkeypatch):
    monkeypatch.setattr(progress, "DELAY_S", 3600.0)
    with progress.stage("reading small.sqlite", terminal):
        pass
    assert terminal.getvalue() == ""


def test_a_quiet_stage_still_takes_a_label(monkeypatch):
    quiet = io.StringIO()
    with progress.stage("checking 2 files", quiet) as line:
        line.label = "checking 2 files: 1 done"
    assert quiet.getvalue() == ""
