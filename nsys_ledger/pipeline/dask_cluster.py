"""Check rank files on a Dask cluster instead of local processes (`check --dask ADDRESS`).

Each export is checked by the same worker function as in the local process pool
(`worker.check_one_file`: `check()` on one file, the per-event frames dropped unless asked
for), one task per file, and the results come back in file order to be stacked exactly as
the local ones are (`multifile.stack_results`). Only this module imports Dask, and only
`check_many(..., dask=...)` imports this module: a check without `--dask` loads nothing of it.

The workers open the files by the paths given, so every worker must see them under the same
path (a shared file system), and must have nsys-ledger installed (`pip install
nsys-ledger[dask]` on the scheduler's and the workers' machines).

ADDRESS is the scheduler's address (`tcp://10.0.0.5:8786`, as printed by `dask scheduler`),
or `local`: a LocalCluster on this machine with one single-threaded worker process per file
up to the core count (polars already spreads one check over the cores of its process).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

from nsys_ledger.errors import InputError
from nsys_ledger.ledger import Expectations
from nsys_ledger.pipeline.worker import CheckedFile, FailedFile, check_one_file, quiet_worker
from nsys_ledger.progress import stage

__all__ = ["LOCAL", "check_on_dask", "windows_on_dask"]

LOCAL = "local"
# How long to wait for the scheduler before saying it cannot be reached.
CONNECT_TIMEOUT_S = 10


def check_on_dask(
    files: Sequence[str],
    expectations: Expectations | None,
    options: dict[str, Any],
    keep_events: bool,
    address: str,
    workers: int | None = None,
) -> list[CheckedFile]:
    """One Dask task per file; the outcomes in file order. Raises the first file's InputError."""
    with _client(address, len(files), workers) as client:
        client.run(quiet_worker)
        count = len(files)
        with stage(f"checking {count} files on the Dask cluster {address}") as line:
            futures = client.map(
                check_one_file, list(files), [expectations] * count, [options] * count, [keep_events] * count,
                pure=False,
            )
            outcomes: list[CheckedFile | FailedFile] = []
            for index, future in enumerate(futures):
                outcome = future.result()
                if isinstance(outcome, FailedFile):
                    client.cancel(futures[index + 1:])
                    raise outcome.kind(outcome.path, outcome.problem)
                outcomes.append(outcome)
                line.label = f"checking {count} files on the Dask cluster {address}: {index + 1} done"
    return [o for o in outcomes if isinstance(o, CheckedFile)]


def windows_on_dask(trace: Any, windows: Sequence[Any], settings: Any, address: str,
                    workers: int | None = None) -> list[Any]:
    """The step windows of one big file (pipeline.window.run_window), one task per window; the
    results in window order. `trace`: the file's Trace without its activity tables, sent to
    every worker once; each window's input (its activities and context) goes to its task."""
    from nsys_ledger.pipeline.window import run_window

    with _client(address, len(windows), workers) as client:
        client.run(quiet_worker)
        shared = client.scatter(trace, broadcast=True)
        with stage(f"checking {len(windows)} step windows on the Dask cluster {address}"):
            futures = client.map(run_window, [shared] * len(windows), list(windows), [settings] * len(windows),
                                 pure=False)
            return client.gather(futures)


@contextlib.contextmanager
def _client(address: str, files: int, workers: int | None) -> Iterator[Any]:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--dask", "needs dask.distributed: pip install 'nsys-ledger[dask]'") from None
    if address == LOCAL:
        count = max(1, min(files, workers or os.cpu_count() or 1))
        with LocalCluster(n_workers=count, threads_per_worker=1, processes=True, dashboard_address=":0",
                          silence_logs=logging.ERROR) as cluster, Client(cluster) as client:
            yield client
        return
    try:
        client = Client(address, timeout=CONNECT_TIMEOUT_S)
    except (OSError, TimeoutError, ValueError) as error:
        raise InputError(address, f"cannot reach the Dask scheduler ({error})") from None
    with client:
        yield client
