"""The Benchmarks page's CSV files hold every recorded row and column (docs/_ext/benchmark_csv.py)."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from benchmark_csv import write_csvs  # noqa: E402

RECORDING = ROOT / "docs" / "benchmark_runs" / "recording.json"


def test_each_recorded_benchmark_becomes_a_csv_with_the_same_rows(tmp_path: Path) -> None:
    written = write_csvs(RECORDING, tmp_path)
    benchmarks = json.loads(RECORDING.read_text())["benchmarks"]
    assert sorted(p.stem for p in written) == sorted(benchmarks)
    for path in written:
        rows = benchmarks[path.stem]["rows"]
        with path.open(newline="", encoding="utf-8") as f:
            read = list(csv.DictReader(f))
        assert len(read) == len(rows)
        for got, want in zip(read, rows, strict=True):  # csv writes None (no value) as an empty field
            assert {k: v for k, v in got.items() if v != ""} == {
                k: str(v) for k, v in want.items() if v is not None and v != ""
            }
