"""The Dask cluster behind `check --dask ADDRESS`: its client, and the step windows of one big
file as Dask tasks (`windows_on_dask`). Rank files use the same client (`multifile`: one task
per file, `worker.check_one_file`, the results stacked exactly as the local ones are). Only this
module imports Dask, and only when `--dask` is given: a check without it loads nothing of it.

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
from nsys_ledger.progress import quiet_worker, stage

__all__ = ["LOCAL", "dask_client", "windows_on_dask"]

LOCAL = "local"
# How long to wait for the scheduler before saying it cannot be reached.
CONNECT_TIMEOUT_S = 10


def windows_on_dask(trace: Any, windows: Sequence[Any], settings: Any, address: str,
                    workers: int | None = None) -> list[Any]:
    """The step windows of one big file (pipeline.window.run_window), one task per window; the
    results in window order. `trace`: the file's Trace without its activity tables, sent to
    every worker once; each window's input (its activities and context) goes to its task."""
    from nsys_ledger.pipeline.window import run_window

    with dask_client(address, len(windows), workers) as client:
        client.run(quiet_worker)
        shared = client.scatter(trace, broadcast=True)
        with stage(f"checking {len(windows)} step windows on the Dask cluster {address}"):
            futures = client.map(run_window, [shared] * len(windows), list(windows), [settings] * len(windows),
                                 pure=False)
            return client.gather(futures)


@contextlib.contextmanager
def dask_client(address: str, tasks: int, workers: int | None) -> Iterator[Any]:
    """A client of the scheduler at `address`, or of a LocalCluster (`local`) with one worker
    process per task up to `workers` or the core count."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--dask", "needs dask.distributed: pip install 'nsys-ledger[dask]'") from None
    if address == LOCAL:
        count = max(1, min(tasks, workers or os.cpu_count() or 1))
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
