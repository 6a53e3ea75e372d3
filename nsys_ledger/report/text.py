"""Text from a trace or a ledger, made safe to print on a terminal.

Kernel names, NVTX texts and file names are whatever the profiled program or the user made
them: a newline would split a report line (or an error message that must stay one line), a
carriage return or an ESC sequence would overwrite or recolour the terminal, a bidi override
would show text in another order than it is. `printable` writes each of these characters as a
visible escape instead, the way Python's string literals do (`\\n`, `\\x1b`, `\\u202e`).
"""

from __future__ import annotations

import re

# C0 and C1 controls (tab and newline included), DEL, and the bidi marks, embeddings,
# overrides and isolates.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def printable(text: object) -> str:
    """`text` on one line, with every control character and bidi override escaped."""
    return _UNPRINTABLE.sub(_escape, str(text))


# The same but tab, newline and carriage return, for HTML, where they are only white space.
_INVISIBLE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: object) -> str:
    """`text` with every control character but white space, and bidi overrides, escaped."""
    return _INVISIBLE.sub(_escape, str(text))
