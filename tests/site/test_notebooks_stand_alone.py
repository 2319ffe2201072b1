"""The ``.ipynb`` a reader downloads from a tutorial page stands alone.

It carries the outputs the page shows, its Markdown has no MyST role left (glued values are
written in, formatted as on the page), it imports ``myst_nb`` only where a fallback catches its
absence, and it runs in a plain Jupyter kernel that has no ``myst_nb``. Reads the built site
(``_build/html``, or ``$UNITSCALE_SITE``) like the browser tests, so it runs after the build.
"""

import ast
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
EXECUTED = SITE.parent / "jupyter_execute"  # MyST-NB's executed notebooks and glue data
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))
ROLE = re.compile(r"\{[\w:.+-]+\}`")

sys.path.insert(0, str(ROOT / "docs" / "_ext"))


def download(tutorial: str) -> nbformat.NotebookNode:
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `make html` (or set UNITSCALE_SITE)")
    path = SITE / "_sources" / "tutorials" / f"{tutorial}.ipynb"
    assert path.is_file(), f"the site offers no {path.name}"
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    return notebook


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_download_carries_the_outputs_the_page_shows(tutorial):
    notebook = download(tutorial)
    with_output = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.outputs]
    page = (SITE / "tutorials" / f"{tutorial}.html").read_text(encoding="utf-8")
    shown = page.count('<div class="cell_output docutils container">')
    assert shown > 0
    assert len(with_output) == shown, f"the page shows {shown} cell outputs, the download has {len(with_output)}"
    figures = sum("image/png" in output.get("data", {}) for cell in with_output for output in cell.outputs)
    # a figure is an <img> of the build's images (inside its <picture> with the phone rendition)
    assert figures == len(re.findall(r'<img [^>]*src="(?:\.\./)?_images/', page)), "figures differ"


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_download_has_no_myst_roles_and_its_glued_values_are_written_in(tutorial):
    import standalone_notebook
    from myst_nb.core.variables import format_plain_text

    notebook = download(tutorial)
    text = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    assert "{glue" not in text
    assert not ROLE.findall(text), f"MyST role text left in the Markdown: {ROLE.findall(text)[:5]}"
    glue_file = EXECUTED / "tutorials" / f"{tutorial}.glue.json"
    glued = {k: v["data"] for k, v in json.loads(glue_file.read_text()).items()} if glue_file.is_file() else {}
    source = (ROOT / "tutorials" / f"{tutorial}.md").read_text(encoding="utf-8")
    for role, content in re.findall(r"\{(glue:text)\}`([^`]*)`", source):
        value = standalone_notebook.glued_text(role, content, glued, format_plain_text)
        assert value in text, f"{{glue:text}}`{content}` should read {value!r} in the download"


def _unguarded_myst_nb_imports(code: str) -> list[int]:
    """Lines importing ``myst_nb`` outside a ``try`` that catches ``ImportError``."""
    tree = ast.parse("\n".join(line for line in code.splitlines() if not line.lstrip().startswith(("%", "!"))))
    catches = ("ImportError", "ModuleNotFoundError")
    guarded = {
        id(node)
        for t in ast.walk(tree)
        if isinstance(t, ast.Try) and any(getattr(h.type, "id", None) in catches for h in t.handlers)
        for stmt in t.body
        for node in ast.walk(stmt)
    }

    def modules(node: ast.Import | ast.ImportFrom) -> list[str]:
        return [node.module or ""] if isinstance(node, ast.ImportFrom) else [alias.name for alias in node.names]

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        and id(node) not in guarded
        and any(name.split(".")[0] == "myst_nb" for name in modules(node))
    ]


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_download_needs_no_myst_nb(tutorial):
    notebook = download(tutorial)
    assert notebook.metadata.kernelspec.name == "python3"
    assert "jupytext" not in notebook.metadata
    for index, cell in enumerate(notebook.cells):
        if cell.cell_type == "code":
            assert not _unguarded_myst_nb_imports(cell.source), f"cell {index} imports myst_nb: {cell.source[:200]}"


def test_the_import_check_sees_unguarded_imports():
    assert _unguarded_myst_nb_imports("from myst_nb import glue") == [1]
    assert _unguarded_myst_nb_imports("import torch\nimport myst_nb.ext") == [2]
    guarded = "try:\n    from myst_nb import glue\nexcept ImportError:\n    glue = print"
    assert _unguarded_myst_nb_imports(guarded) == []
