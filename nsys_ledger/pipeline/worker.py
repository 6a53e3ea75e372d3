"""Check one export in a worker process (the local process pool, or a Dask worker).

What comes back is picklable: the Result (its per-event frames emptied unless asked for,
see `multifile`), or the InputError as plain fields, rebuilt in the parent.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from nsys_ledger.api import Result, _graph_level_replays, check
from nsys_ledger.errors import InputError
from nsys_ledger.ledger import Expectations
from nsys_ledger.trace.model import FRAME_SCHEMAS

__all__ = ["CheckedFile", "FailedFile", "check_one_file"]


@dataclass(frozen=True)
class CheckedFile:
    result: Result
    graph_level: bool  # captured with --cuda-graph-trace=graph (needs the events to tell)


@dataclass(frozen=True)
class FailedFile:
    """An InputError from a worker; rebuilt in the parent (its (path, problem) constructor
    does not survive pickling as an exception)."""

    kind: type[InputError]
    path: str
    problem: str


def check_one_file(
    path: str, expectations: Expectations | None, options: dict[str, Any], keep_events: bool
) -> CheckedFile | FailedFile:
    try:
        result = check(path, expectations, **options)
    except InputError as error:
        return FailedFile(type(error), error.path, error.problem)
    graph_level = _graph_level_replays(result.trace)
    return CheckedFile(result if keep_events else _without_events(result), graph_level)


def _without_events(result: Result) -> Result:
    """`result` with its per-event frames emptied (columns kept): see the module docstring."""
    trace = dataclasses.replace(
        result.trace,
        **{name: getattr(result.trace, name).clear() for name in FRAME_SCHEMAS if name != "devices"},
    )
    steps = dataclasses.replace(
        result.steps, activities=result.steps.activities.clear(), api_calls=result.steps.api_calls.clear()
    )
    slim = dataclasses.replace(result, trace=trace, steps=steps)
    if result.layers is not None:  # the layer of every activity: per event too
        slim = dataclasses.replace(
            slim, layers=dataclasses.replace(result.layers, assignments=result.layers.assignments.clear())
        )
    return slim
