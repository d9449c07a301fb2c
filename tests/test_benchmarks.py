"""Every benchmark still imports: they use the test helpers, which move as the suite does
(a benchmark that no longer runs measures nothing)."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

# Shared by the others, not run on their own.
LIBRARIES = {"load", "dashboard_load", "sidebyside_table"}
BENCHMARKS = sorted(p.stem for p in (Path(__file__).parents[1] / "benchmarks").glob("*.py"))


@pytest.mark.parametrize("name", BENCHMARKS)
def test_the_benchmark_imports(name: str) -> None:
    module = importlib.import_module(f"benchmarks.{name}")
    if name in LIBRARIES:
        return
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"
