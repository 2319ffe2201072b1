"""Offer every MyST text notebook as an ``.ipynb`` download.

sphinx-book-theme's download menu lists an ``.ipynb`` only when the page's source is one; our
tutorials are MyST text notebooks (``.md``), so this writes ``_sources/<page>.ipynb`` with
jupytext (the same conversion as ``make notebooks``) and points the theme's menu at it.
"""

from __future__ import annotations

from pathlib import Path

import jupytext
import nbformat
from sphinx.application import Sphinx


def is_text_notebook(path: Path) -> bool:
    """A Markdown file whose front matter declares a kernel (the jupytext/MyST-NB convention)."""
    if path.suffix != ".md" or not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


def write_ipynb(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.builder.format != "html" or pagename not in app.env.found_docs:
        return
    source = Path(app.env.doc2path(pagename))
    if not is_text_notebook(source):
        return
    notebook = jupytext.read(source, fmt="md:myst")
    notebook.metadata.pop("jupytext", None)  # a plain notebook: no pairing with a .md file
    nbformat.validate(notebook)
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app: Sphinx) -> dict:
    # before sphinx-book-theme builds its header buttons (priority 501)
    app.connect("html-page-context", write_ipynb, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
