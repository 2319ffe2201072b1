"""Every recorded benchmark as a CSV file in the site: ``docs/benchmark_runs/<bench>.csv``.

``benchmarks/record.py`` keeps one recording of every benchmark, ``docs/benchmark_runs/recording.json``;
the Benchmarks page shows charts and the key numbers, and links each section's full rows as a CSV
file that a spreadsheet opens. This writes those files into the build, beside the page, from the
same JSON, so the sources hold one copy of the numbers.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from sphinx.application import Sphinx


def write_csvs(recording: Path, out: Path) -> list[Path]:
    """One ``<bench>.csv`` in ``out`` for every benchmark of ``recording``: a header, then the rows."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, bench in sorted(json.loads(recording.read_text())["benchmarks"].items()):
        rows = bench["rows"]
        columns = list(dict.fromkeys(key for row in rows for key in row))
        target = out / f"{name}.csv"
        with target.open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, columns)
            writer.writeheader()
            writer.writerows(rows)
        written.append(target)
    return written


def _write(app: Sphinx, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        recording = Path(app.srcdir) / "docs" / "benchmark_runs" / "recording.json"
        if recording.is_file():  # a site without the Benchmarks page (a test's small site) has none
            write_csvs(recording, Path(app.outdir) / "docs" / "benchmark_runs")


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("build-finished", _write)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
