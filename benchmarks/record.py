"""Run every benchmark and keep its rows for the site: ``docs/benchmark_runs/<bench>.json``.

``make bench`` runs this (full settings); ``--quick`` runs the quick modes. The Benchmarks page
shows what was recorded, with the line saying when, where and how it ran, instead of timing
benchmarks while the site builds (on cores shared with the tutorials executing beside them,
which measured the build machine's load more than the code).
"""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "docs" / "benchmark_runs"


def record(path: Path, quick: bool) -> dict:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    start = time.perf_counter()
    rows = module.main(quick=quick)
    seconds = time.perf_counter() - start
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    run = (
        f"{'quick' if quick else 'full'} mode, recorded {when} by `python benchmarks/record.py"
        f"{' --quick' if quick else ''}` in {seconds:.0f} s: torch {torch.__version__}, "
        f"{os.cpu_count()} CPU cores ({platform.machine()}), Python {platform.python_version()}"
    )
    machine = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),  # as the benchmark left them: the threads it timed with
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    return {"rows": rows, "run": run, "machine": machine}


def cpu_model() -> str:
    """The CPU's model name, as Linux reports it (else what the platform module knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def main() -> None:
    quick = "--quick" in sys.argv
    names = [a for a in sys.argv[1:] if not a.startswith("--")]
    RUNS.mkdir(exist_ok=True)
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        if names and path.stem not in names:
            continue
        print(f"== {path.name}", flush=True)
        result = record(path, quick)
        (RUNS / f"{path.stem}.json").write_text(json.dumps(result, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
