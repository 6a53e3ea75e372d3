"""The memory the per-step stages take follows the step window, not the trace.

A 200-step graph-mode GLM-5.3 trace (~415k kernels, the project's generator, as
bench/bench_check.py makes its traces) is checked in child processes, once in one whole-trace
window and once in windows of 16 steps. Each child resets its peak RSS (VmHWM, through
/proc/self/clear_refs) when the window stages start and prints how far the stages raised it
above the RSS the plan left. Measured here (Linux, polars 1.x): 339-390 MiB in one window,
54-82 MiB in windows of 16 (56 MiB at 50 steps, 98 MiB at 500: what grows is the windows'
per-activity results, every activity's layer and op, which the Result keeps).

What this does NOT show: the whole process's peak still grows with the trace (311 MiB at 50
steps, ~775 MiB at 500 with windows of 16), because the plan reads the whole activity tables;
docs/performance.md (Step windows) has the figures and what is left. No wall-clock limits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsys_ledger.synth import generate

REPO = Path(__file__).resolve().parents[1]
LEDGER = REPO / "expectations" / "glm-5.3-tp8-ep8.toml"
STEPS = 200

CHILD = r"""
import sys
import nsys_ledger.api as api

def status(field):
    return int(next(l for l in open("/proc/self/status") if l.startswith(field)).split()[1]) // 1024

measured = {}
stages = api.run_windows

def measured_stages(*args, **kwargs):
    measured["before"] = status("VmRSS:")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak RSS from here on
    out = stages(*args, **kwargs)
    measured["peak"] = status("VmHWM:")
    return out

api.run_windows = measured_stages
result = api.check(sys.argv[1], sys.argv[2], window_steps=int(sys.argv[3]))
print(result.windows, result.step_table.height, measured["peak"] - measured["before"])
"""

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(),
                                reason="needs Linux's /proc/self/clear_refs to reset the peak RSS")


def stage_memory(trace: Path, window_steps: int) -> tuple[int, int, int]:
    """(windows, decode steps, MiB the window stages added above the plan) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "NSYS_LEDGER_PROGRESS": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(trace), str(LEDGER), str(window_steps)],
                         capture_output=True, text=True, env=env, check=True)
    windows, steps, added = (int(v) for v in out.stdout.split())
    return windows, steps, added


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("window-memory") / f"glm5-graph-{STEPS}steps.sqlite"
    generate(str(path), mode="graph", steps=STEPS, ranks=1, seed=0)
    return path


def test_window_stages_take_a_fraction_of_the_whole_trace_pass(trace):
    whole_windows, whole_steps, whole = stage_memory(trace, 0)
    windows, steps, windowed = stage_memory(trace, 16)
    assert (whole_windows, whole_steps) == (1, STEPS)
    assert (windows, steps) == (13, STEPS)  # 12 windows of 16 steps and one of 8
    # measured 54-82 MiB against 339-390 MiB (0.15-0.22): a bound with margin that one window fails
    assert windowed <= 0.4 * whole, f"windows of 16 steps: {windowed} MiB, one window: {whole} MiB"
