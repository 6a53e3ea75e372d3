"""Errors that the CLI turns into one line and exit code 2.

Every error about the user's input names the file it is about, so the message printed is
always ``<path>: <problem>``; no traceback reaches the terminal.
"""

from __future__ import annotations


class InputError(Exception):
    """A problem with a file the user gave us (trace, expectations, output path)."""

    def __init__(self, path: str | object, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


class TraceError(InputError):
    """The trace file cannot be read as an Nsight Systems export."""


class ExpectationsError(InputError):
    """The expectations (ledger) file is malformed."""
