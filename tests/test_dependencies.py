"""Declared equals imported: every package pyproject.toml installs is imported by nsys_ledger,
and every third-party module nsys_ledger imports is declared (the optional ones in an extra)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import nsys_ledger

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "nsys_ledger"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))

# import name -> distribution name, where the two differ
DISTRIBUTION_OF = {"adbc_driver_sqlite": "adbc-driver-sqlite", "distributed": "dask", "sqlite_utils": "sqlite-utils"}


def distribution(requirement: str) -> str:
    """'adbc-driver-sqlite>=1.0; platform...' -> 'adbc-driver-sqlite', 'dask[distributed]>=1' -> 'dask'."""
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower().replace("_", "-")


def third_party_imports() -> set[str]:
    """Top-level modules the package imports (at module level or inside functions)."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "nsys_ledger"}


def test_declared_dependencies_equal_the_imported_ones():
    imported = {DISTRIBUTION_OF.get(name, name) for name in third_party_imports()}
    declared = {distribution(r) for r in PYPROJECT["project"]["dependencies"]}
    optional = {distribution(r) for r in PYPROJECT["project"]["optional-dependencies"]["dask"]}
    assert declared == imported - optional
    assert imported == {"adbc-driver-sqlite", "click", "dask", "msgspec", "numpy", "pandas", "plotly", "polars",
                        "pyarrow", "sqlite-utils"}


def test_pandas_frames_for_notebooks():
    import pandas

    result = nsys_ledger.check(ROOT / "sample_traces" / "glm5-graph-healthy.sqlite")
    frames = result.to_pandas()
    assert set(frames) == {"steps", "ops", "gaps", "kernels"}
    assert all(isinstance(frame, pandas.DataFrame) for frame in frames.values())
    assert frames["steps"]["kernels"].tolist() == [2077] * 4
    # 2,077 decode kernels in each of the 4 steps, one row each
    assert frames["kernels"].groupby("step").size().tolist() == [2077] * 4
    assert frames["gaps"]["cause"].tolist() == ["launch"] * 4
