"""The execution report's Status column reads in words (``docs/_ext/execution_report.py``).

The table is MyST-NB's own (``make_stat_table``); the built page is checked as a reader gets it.
"""

import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest
from docutils import nodes
from docutils.utils import new_document
from myst_nb.ext.execution_tables import make_stat_table

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from execution_report import status_in_words  # noqa: E402


def _rows(table: nodes.table) -> list[list[str]]:
    return [[entry.astext() for entry in row.children] for row in table.findall(nodes.row)]


def test_myst_nbs_marks_become_words_and_the_rest_of_its_table_stays():
    run = {"mtime": 0.0, "method": "force", "runtime": 1.5}
    metadata = defaultdict(dict)
    metadata["good"]["exec_data"] = {**run, "succeeded": True}
    metadata["bad"]["exec_data"] = {**run, "succeeded": False, "error": "CellExecutionError"}
    doctree = new_document("test")
    doctree += make_stat_table("report", metadata)
    before = _rows(next(doctree.findall(nodes.table)))
    assert [row[-1] for row in before] == ["Status", "❌", "✅"]  # MyST-NB's marks, rows by docname
    status_in_words(None, doctree, "report")
    after = _rows(next(doctree.findall(nodes.table)))
    assert [row[-1] for row in after] == ["Status", "failed", "ok"]
    assert [row[:-1] for row in after] == [row[:-1] for row in before]
    assert "execution-report" in next(doctree.findall(nodes.table))["classes"]


def test_a_table_of_another_shape_is_left_alone():
    doctree = new_document("test")
    run = {"mtime": 0.0, "method": "force", "runtime": 1.5, "succeeded": True}
    table = make_stat_table("report", defaultdict(dict, {"x": {"exec_data": run}}))
    next(table.findall(nodes.thead)).children[0].children[0].children[0].replace_self(
        nodes.entry("", nodes.paragraph(text="Page"))
    )
    doctree += table
    status_in_words(None, doctree, "report")
    assert _rows(table)[1][-1] == "✅" and "execution-report" not in table["classes"]


@pytest.mark.built
def test_the_built_report_says_ok_for_every_notebook():
    page = SITE / "docs" / "execution.html"
    if not page.is_file():
        pytest.fail(f"no built site at {SITE}: run `make html` (or set UNITSCALE_SITE)")
    html = page.read_text(encoding="utf-8")
    assert "✅" not in html and "❌" not in html
    notebooks = len(list(ROOT.glob("tutorials/[0-9]*.md")))
    assert html.count("<td><p>ok</p></td>") >= notebooks
