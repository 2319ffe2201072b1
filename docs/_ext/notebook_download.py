"""Offer every tutorial as an ``.ipynb`` that runs and reads well outside the site.

sphinx-book-theme's download menu lists an ``.ipynb`` only when the page's source is one; our
tutorials are MyST text notebooks (``.md``), so this writes ``_sources/<page>.ipynb`` and points
the theme's menu at it. The notebook is the build's executed one, so it carries the outputs the
page shows. MyST-NB's parser (``myst_nb/sphinx_.py``, ``Parser.parse``) writes each page's
notebook to ``<output_folder>/<docname>.ipynb`` (``output_folder`` is ``_build/jupyter_execute``,
set by ``myst_nb/sphinx_ext.py``) and the glued values beside it in ``<docname>.glue.json``; the
files of a page's last read stay, so a page this build did not re-read has them too. Under
``force`` that notebook was executed in place and carries its outputs; under ``cache`` it does
not (see :func:`executed_notebook`), and the outputs come from jupyter-cache, matched exactly as
MyST-NB matched them. The Markdown roles are then rendered as plain text
(``standalone_notebook``), so the download needs only ``unitscale`` and a Jupyter kernel.
"""

from __future__ import annotations

import json
import posixpath
from pathlib import Path

import nbformat
from jupyter_cache import get_cache
from myst_nb.core.variables import format_plain_text
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from standalone_notebook import UnrenderableRole, standalone


def is_text_notebook(path: Path) -> bool:
    """A Markdown file whose front matter declares a kernel (the jupytext/MyST-NB convention)."""
    if path.suffix != ".md" or not path.is_file():
        return False
    text = path.read_text(encoding="utf-8")
    return text.startswith("---") and "kernelspec:" in text.split("\n---", 1)[0]


def executed_notebook(app: Sphinx, pagename: str) -> tuple[nbformat.NotebookNode, dict]:
    """The page's executed notebook and its glued values (``key -> mime bundle``), as MyST-NB has them."""
    config = app.env.mystnb_config
    folder = Path(config.output_folder)
    path = folder / f"{pagename}.ipynb"
    if not path.is_file():
        raise ExtensionError(f"{pagename}: MyST-NB wrote no notebook at {path}")
    notebook = nbformat.read(path, as_version=4)
    mode = notebook.metadata.get("mystnb", {}).get("execution_mode", config.execution_mode)
    if mode == "cache":
        # On a cache hit MyST-NB 1.4 renders the outputs of a merged *copy*
        # (myst_nb/core/execute/cache.py: `_, self._notebook = cache.merge_match_into_notebook(...)`)
        # but writes the file above from the notebook it parsed, without them. Merge them from
        # the cache the same way (after a miss the notebook is cached, so this holds for both).
        try:
            _, notebook = get_cache(config.execution_cache_path).merge_match_into_notebook(notebook)
        except KeyError as error:
            raise ExtensionError(f"{pagename}: no executed notebook in {config.execution_cache_path}") from error
    elif mode == "off":
        raise ExtensionError(f"{pagename}: not executed (nb_execution_mode 'off'); its download would have no outputs")
    glue_path = folder / f"{pagename}.glue.json"
    glued = json.loads(glue_path.read_text(encoding="utf-8")) if glue_path.is_file() else {}
    return notebook, {key: output["data"] for key, output in glued.items()}


def doc_title(app: Sphinx, pagename: str, target: str) -> str:
    """The title of the page a ``{doc}`` role in ``pagename`` names (relative, or absolute with ``/``)."""
    here = posixpath.dirname(pagename)
    docname = target[1:] if target.startswith("/") else posixpath.normpath(posixpath.join(here, target))
    if docname not in app.env.titles:
        raise UnrenderableRole(f"{{doc}}`{target}`: no page {docname!r}")
    return app.env.titles[docname].astext()


def write_ipynb(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if app.builder.format != "html" or pagename not in app.env.found_docs:
        return
    source = Path(app.env.doc2path(pagename))
    if not is_text_notebook(source):
        return
    executed, glue = executed_notebook(app, pagename)
    try:
        notebook = standalone(executed, glue, format_plain_text, lambda target: doc_title(app, pagename, target))
    except UnrenderableRole as error:
        raise ExtensionError(f"{source}: {error}") from error
    target = Path(app.outdir) / "_sources" / f"{pagename}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, target)
    context["ipynb_source"] = f"{pagename}.ipynb"


def setup(app: Sphinx) -> dict:
    # before sphinx-book-theme builds its header buttons (priority 501)
    app.connect("html-page-context", write_ipynb, priority=400)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
