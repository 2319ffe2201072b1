"""The site shows one recording of every benchmark (``make bench``: benchmarks/record.py): it must
be of the library as it is, hold every benchmark, and every benchmark must still run, since a
script broken by a change in the library would otherwise go unnoticed until the next recording."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.record import RECORDING, library_hash

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").glob("bench_*.py"))


# A guard against a hang, not a time budget. The quick modes used 4 to 35 s of CPU each (the most:
# bench_stages, whose pipelines start processes; bench_analysis 19 s) and took up to ten times
# that in wall time while other work kept a two-core machine at a load of 10; 300 s was once
# passed there. Each quick mode runs on one thread, so two runs side by side do not fight.
HANG_GUARD_S = 1800


def _recording() -> dict:
    return json.loads(RECORDING.read_text())


def test_the_recording_is_of_the_library_as_it_is() -> None:
    """The recording's hash of ``unitscale/**/*.py`` is the source's today: a change to the library
    after the recording fails here until the benchmarks are recorded again."""
    recorded = _recording()
    assert recorded["library hash"] == library_hash(), (
        f"docs/benchmark_runs/recording.json was recorded at commit {recorded['commit'][:12]} on "
        f"{recorded['date']}, and the library's source has changed since: run `make bench` and commit "
        "docs/benchmark_runs/recording.json"
    )


def test_the_library_hash_follows_the_source_and_nothing_else(tmp_path: Path) -> None:
    """The hash changes with a library file's content or path, not with files beside the library
    (tests, docs, caches) nor with where the checkout is."""
    copy = tmp_path / "a"
    shutil.copytree(ROOT / "unitscale", copy / "unitscale", ignore=shutil.ignore_patterns("__pycache__"))
    assert library_hash(copy) == library_hash(ROOT)
    (copy / "notes.md").write_text("not the library")
    (copy / "unitscale" / "data.json").write_text("{}")
    assert library_hash(copy) == library_hash(ROOT)
    errors = copy / "unitscale" / "errors.py"
    errors.write_text(errors.read_text() + "\n# a comment is a change\n")
    assert library_hash(copy) != library_hash(ROOT)
    errors.rename(copy / "unitscale" / "errors_moved.py")
    moved = library_hash(copy)
    assert moved != library_hash(ROOT)


def test_the_recording_holds_every_benchmark_once_and_says_where_and_how() -> None:
    recorded = _recording()
    assert set(recorded["benchmarks"]) == {p.stem for p in BENCHMARKS}, "run `make bench` and commit the recording"
    assert not recorded["quick"], "the recording is of quick modes: run `make bench`"
    for key in ("commit", "dirty", "cpu", "torch", "python", "date", "statistic", "seconds"):
        assert recorded[key] not in ("", None), key
    for name, bench in recorded["benchmarks"].items():
        assert bench["rows"] and bench["threads"] >= 1, name
        for row in bench["rows"]:  # every median is recorded with its spread and its n
            for column in [c for c in row if f"{c} min" in row]:
                assert "n" in row, (name, row)
                if isinstance(row[column], float):
                    assert row[f"{column} min"] <= row[column] <= row[f"{column} max"], (name, column, row)


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


def test_the_planner_verdict_runs_ours_and_its_rival_abba_and_names_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_planner's fresh rounds: ours (A) and the rival (B) run A B B A, then B A A B; each
    round's ratio is A's two runs over B's, and two runs of one split give the noise. Times by hand."""
    import types

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import bench_planner
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    times = iter([1.0, 2.0, 2.2, 1.1, 2.0, 1.2, 1.0, 2.1])
    ran: list[str] = []

    def run_plan(plan, x, y, schedule, v, steps, warmup):  # noqa: ANN001, ANN202
        ran.append(plan)
        return types.SimpleNamespace(step_time=next(times))

    monkeypatch.setattr(bench_planner, "run_plan", run_plan)
    got = bench_planner.confirm("A", "B", None, None, "1f1b", 1, bench_planner.FULL._replace(confirm=2))
    assert ran == ["A", "B", "B", "A", "B", "A", "A", "B"]
    assert got.ratios == pytest.approx([(1.0 + 1.1) / (2.0 + 2.2), (1.2 + 1.0) / (2.0 + 2.1)])
    assert got.apart == pytest.approx([1.1, 1.1, 1.2, 2.1 / 2.0])
    assert bench_planner.judged(1.02, 1.5) == "within 3%"
    assert bench_planner.judged(1.2, 1.5).startswith("not resolved")
    assert bench_planner.judged(1.2, 1.1) == "slower beyond the noise"
