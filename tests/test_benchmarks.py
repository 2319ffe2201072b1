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


# A guard against a hang, not a time budget. The quick modes used 4 to 35 s of CPU each (the most:
# bench_stages, whose pipelines start processes; bench_analysis 19 s) and took up to ten times
# that in wall time while other work kept a two-core machine at a load of 10; 300 s was once
# passed there. Each quick mode runs on one thread, so two runs side by side do not fight.
HANG_GUARD_S = 1800


def test_every_benchmark_has_a_recorded_run_for_the_site_and_every_run_a_benchmark() -> None:
    recorded = {p.stem for p in (ROOT / "docs" / "benchmark_runs").glob("bench_*.json")}
    assert recorded == {p.stem for p in BENCHMARKS}, "run `make bench` and commit docs/benchmark_runs/"


@pytest.mark.parametrize("path", BENCHMARKS, ids=[p.stem for p in BENCHMARKS])
def test_each_benchmark_runs_in_its_quick_mode_and_prints_ratios(path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, str(path), "--quick"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip(), f"{path.name} printed nothing"


def test_the_torchgpipe_anchor_is_the_real_code_and_the_fallback_matches_it() -> None:
    """``torchgpipe`` (a test dependency) is what bench_stages compares against; its
    re-implementation, used where torchgpipe is missing, gives the same balance on random
    chains, with and without items of cost 0 (where torchgpipe can return an empty stage)."""
    import random

    balance = pytest.importorskip("torchgpipe.balance")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_stages
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    rng = random.Random(0)
    compared = 0
    for trial in range(400):
        n, k = rng.randint(4, 40), rng.choice([2, 3, 4, 8])
        if k > n:
            continue
        costs = [0.0 if trial % 2 and rng.random() < 0.3 else rng.lognormvariate(0, 1) for _ in range(n)]
        try:
            ours = bench_stages._block_partition_lengths(costs, k)
        except bench_stages.NoPlan:
            continue  # torchgpipe would loop forever here: not called
        assert ours == balance.balance_cost(list(costs), k), (costs, k)
        compared += 1
    assert compared > 300
