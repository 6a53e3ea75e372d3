"""Where the tests find the team's reference data, and the one reason they skip without it.

The real Nsight Systems and Kineto traces and the reference kernel names live in `../shared`
beside the repository (`shared/real_traces`, `shared/real_traces/kineto`, `shared/reference`).
Elsewhere point `NSYS_LEDGER_SHARED` at a copy of that folder (or `NSYS_LEDGER_REAL_TRACES` /
`NSYS_LEDGER_REFERENCE` at its two parts). Without it every test that needs it skips with
`NO_SHARED`, and the rest of the suite runs on the bundled samples.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("NSYS_LEDGER_SHARED") or REPO.parent / "shared")
REAL_TRACES = Path(os.environ.get("NSYS_LEDGER_REAL_TRACES") or SHARED / "real_traces")
KINETO_TRACES = REAL_TRACES / "kineto"
REFERENCE = Path(os.environ.get("NSYS_LEDGER_REFERENCE") or SHARED / "reference")

NO_SHARED = "needs ../shared (real traces, reference names): absent here; set NSYS_LEDGER_SHARED (README, Tests)"


def needs_shared(*paths: Path) -> pytest.MarkDecorator:
    """Skip, with the one reason, unless every one of `paths` exists."""
    return pytest.mark.skipif(not all(Path(p).exists() for p in paths), reason=NO_SHARED)


def skip_without_shared() -> None:
    """Inside a test or fixture: skip with the one reason (a file the test looked for is absent)."""
    pytest.skip(NO_SHARED)


def real_sqlite_exports() -> list[Path]:
    return sorted(REAL_TRACES.glob("*.sqlite")) if REAL_TRACES.is_dir() else []


def real_params(paths: list[Path]) -> list:
    """`paths` as pytest parameters named by file, or one skipped parameter when there are none
    (an empty parameter list would skip with pytest's own reason)."""
    if not paths:
        return [pytest.param(None, id="no-shared", marks=needs_shared(REAL_TRACES / "absent"))]
    return [pytest.param(p, id=p.name) for p in paths]
