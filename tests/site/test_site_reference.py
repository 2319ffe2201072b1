"""The API reference is complete and every public name carries a runnable example."""

import inspect
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

import unitscale

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import api_reference  # noqa: E402


@pytest.mark.parametrize("name", unitscale.__all__)
def test_every_public_name_has_a_docstring_example(name):
    doc = inspect.getdoc(getattr(unitscale, name)) or ""
    assert ">>>" in doc, f"unitscale.{name} needs a docstring with a runnable `>>>` example"


def test_api_reference_lists_exactly_the_public_names():
    assert api_reference.exported_names() == list(unitscale.__all__)
    assert ".. unitscale-api::\n" in (ROOT / "docs" / "api.md").read_text()


def test_public_names_are_unique_and_importable():
    assert len(set(unitscale.__all__)) == len(unitscale.__all__)
    for name in unitscale.__all__:
        assert hasattr(unitscale, name), f"unitscale.__all__ names {name!r}, which unitscale does not define"


def test_site_build_is_strict():
    conf = (ROOT / "conf.py").read_text()
    assert re.search(r"^nitpicky = True$", conf, re.M)
    assert re.search(r"^nb_execution_raise_on_error = True$", conf, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert "-W --keep-going -T" in makefile
    assert "NB_EXECUTION_MODE=force $(SPHINX) -E" in makefile


TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]_*.md"))


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_converts_to_a_valid_notebook(path):
    notebook = jupytext.read(path, fmt="md:myst")
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert any(cell.cell_type == "code" for cell in notebook.cells)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")
