"""Every benchmark runs: the site shows recorded runs (benchmarks/record.py), so a script broken
by a change in the library would otherwise go unnoticed until the next ``make bench``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


def test_there_are_benchmarks_and_each_has_a_recorded_run_for_the_site() -> None:
    assert len(BENCHMARKS) >= 5
    recorded = {p.stem for p in (ROOT / "docs" / "benchmark_runs").glob("bench_*.json")}
    assert recorded == {p.stem for p in BENCHMARKS}, "run `make bench` and commit docs/benchmark_runs/"


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_each_benchmark_runs_in_its_quick_mode_and_prints_ratios(path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, str(path), "--quick"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), f"{path.name} printed nothing"
