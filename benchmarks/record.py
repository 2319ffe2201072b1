"""Run every benchmark once, at one commit, into one recording: ``docs/benchmark_runs/recording.json``.

``make bench`` runs this. The recording names what the numbers depend on: the commit (and whether
the tree had uncommitted changes), a hash of the library's source (:func:`library_hash`, which
``tests/test_benchmarks.py`` compares with the source of the day, so a recording older than the
code it measures fails a test), the CPU model, torch and Python versions, the threads each
benchmark timed with, the date and the statistic. Each benchmark's rows follow, with the seconds
it took and the targets it declares (``TARGETS`` in its module). The Benchmarks page and the
planner page show this file; the site build times nothing again, since beside the tutorials
executing on the same cores it would measure the build's load more than the code.

``--quick`` runs the quick modes (a check that everything runs, not numbers to show) and
``--out PATH`` writes elsewhere.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
RECORDING = ROOT / "docs" / "benchmark_runs" / "recording.json"
# the library beside this file, not an installed one: here, in the benchmarks' pipeline workers
# (they inherit the environment) and for the helpers beside the benchmarks
# (PYTHONPATH is set in main(): importing this module must not change the importer's environment)
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from spread import STATISTIC  # noqa: E402


def library_hash(root: Path = ROOT) -> str:
    """SHA-256 of the library's source: every ``unitscale/**/*.py``, by path relative to ``root``
    in sorted order, each path and content hashed. Not git: the same on a clean clone, in a
    worktree and in a tree with changes not yet committed."""
    digest = hashlib.sha256()
    for path in sorted((root / "unitscale").rglob("*.py"), key=lambda p: p.relative_to(root).as_posix()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def cpu_model() -> str:
    """The CPU's model name, as Linux reports it (else what the platform module knows)."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def commit() -> tuple[str, bool]:
    """The checked-out commit and whether the library or benchmarks had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    try:
        head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
        status = subprocess.run(
            [*git, "status", "--porcelain", "--", "unitscale", "benchmarks"], capture_output=True, text=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)", False
    return head.strip(), bool(status.strip())


def run(path: Path, quick: bool) -> dict[str, Any]:
    """One benchmark's rows, the seconds it took, the threads it timed with and its targets."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    start = time.perf_counter()
    rows = module.main(quick=quick)
    seconds = time.perf_counter() - start
    timed_with = torch.get_num_threads()  # as the benchmark left them: the threads it timed with
    torch.set_num_threads(threads)
    return {
        "seconds": round(seconds, 1),
        "threads": getattr(module, "THREADS", timed_with),
        "targets": getattr(module, "TARGETS", []),
        "rows": rows,
    }


def main() -> None:
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    quick = "--quick" in sys.argv
    out = Path(sys.argv[sys.argv.index("--out") + 1]) if "--out" in sys.argv else RECORDING
    head, dirty = commit()
    started = time.perf_counter()
    benchmarks = {}
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        print(f"== {path.name}", flush=True)
        benchmarks[path.stem] = run(path, quick)
        print(f"== {path.name}: {benchmarks[path.stem]['seconds']:.0f} s", flush=True)
    recording = {
        "command": "make bench" + (" (quick mode)" if quick else ""),
        "quick": quick,
        "commit": head,
        "dirty": dirty,
        "library hash": library_hash(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "seconds": round(time.perf_counter() - started),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "statistic": STATISTIC,
        "benchmarks": benchmarks,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(recording, indent=1, default=str) + "\n")
    print(f"recorded {out} in {recording['seconds']} s")


if __name__ == "__main__":
    main()
