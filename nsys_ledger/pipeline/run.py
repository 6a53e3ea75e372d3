"""The windows of a plan, one after the other or in local processes (`jobs`).

A worker gets one window's input (its activities with their context, and its host windows)
and the trace without its activity tables (the stages read the calls, ranges and syncs only),
and sends back the window's result: its steps' rows and its activities' layers.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context

from nsys_ledger.attribution.steps import Steps
from nsys_ledger.pipeline.plan import WindowPlan
from nsys_ledger.pipeline.window import WindowResult, WindowSettings, cut_window, run_window
from nsys_ledger.progress import quiet_worker
from nsys_ledger.trace import Trace

ACTIVITY_TABLES = ("kernels", "memcpys", "memsets")  # what the windows carry in their own inputs


def run_windows(trace: Trace, steps: Steps, plan: WindowPlan, settings: WindowSettings, *,
                jobs: int = 1, dask: str | None = None) -> list[WindowResult]:
    """Every window's result, in window order: here, in `jobs` local processes, or on the Dask
    cluster at `dask` (an address, or "local")."""
    if plan.count == 1 or (jobs <= 1 and dask is None):
        return [run_window(trace, cut_window(steps, plan, part), settings) for part in range(plan.count)]
    light = without_activity_tables(trace)
    if dask is not None:
        from nsys_ledger.pipeline.dask_cluster import windows_on_dask  # Dask is imported only when asked for

        inputs = [cut_window(steps, plan, part) for part in range(plan.count)]
        return windows_on_dask(light, inputs, settings, dask, jobs if jobs > 1 else None)
    # spawn, not fork: a forked child inherits polars' thread pool locks mid-use and can hang
    with ProcessPoolExecutor(max_workers=min(jobs, plan.count), mp_context=get_context("spawn"),
                             initializer=quiet_worker) as pool:
        futures = [pool.submit(run_window, light, cut_window(steps, plan, part), settings)
                   for part in range(plan.count)]
        return [future.result() for future in futures]


def without_activity_tables(trace: Trace) -> Trace:
    """`trace` with its kernel, copy and memset tables emptied (their columns kept)."""
    return dataclasses.replace(trace, **{name: getattr(trace, name).clear() for name in ACTIVITY_TABLES})
