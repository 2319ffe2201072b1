"""The source pages' "[docs]" links lead to the object's entry, whatever name documents it.

``sphinx.ext.viewcode`` writes, beside each class and function of a source page, a link back to
where it is documented, with the anchor ``<module>.<name>``. It keeps one ``<module>`` per source
file: the name under which the *first* object of that file was documented. The API reference
documents a file's objects under different namespaces (``unitscale.ResNet`` from
``unitscale.examples.models`` beside ``unitscale.examples.BasicBlock``), so every other link of
that file pointed at an anchor that does not exist.

This extension notes, as each page is read, the anchor each object really has (the ``id`` of its
signature) and, once the build has written the source pages, rewrites each "[docs]" link whose
anchor is not that one. ``tests/site/test_links.py`` checks every link of the build.

It also keeps the source pages to the package's own code. viewcode writes a page for every module
it read while looking for an object's source; type aliases (``unitscale.scaling.Constraint``) led
it into the standard library, and it wrote unlinked pages for ``functools``, ``types`` and
``collections.abc``.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx

PACKAGE = "unitscale"

BACKLINK = re.compile(r'(<a class="viewcode-back" href=")([^"#]*)#([^"]*)(")')


def _record(app: Sphinx, doctree: nodes.document) -> None:
    anchors: dict[str, dict[str, str]] = app.env.__dict__.setdefault("unitscale_viewcode_anchors", {})
    docname = app.env.current_document.docname
    for signode in doctree.findall(addnodes.desc_signature):
        fullname, ids = signode.get("fullname"), signode.get("ids")
        if fullname and ids:
            anchors.setdefault(docname, {})[fullname] = ids[0]


def _merge(app: Sphinx, env: Any, docnames: set[str], other: Any) -> None:
    mine = env.__dict__.setdefault("unitscale_viewcode_anchors", {})
    for docname in docnames:
        if docname in other.__dict__.get("unitscale_viewcode_anchors", {}):
            mine[docname] = other.unitscale_viewcode_anchors[docname]


def _purge(app: Sphinx, env: Any, docname: str) -> None:
    env.__dict__.get("unitscale_viewcode_anchors", {}).pop(docname, None)


def _fix(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    anchors = app.env.__dict__.get("unitscale_viewcode_anchors", {})
    out = Path(app.outdir)
    suffix = app.builder.out_suffix  # type: ignore[attr-defined]
    for page in (out / "_modules").rglob(f"*{suffix}"):

        def relink(match: re.Match[str], page: Path = page) -> str:
            target = (page.parent / html.unescape(match[2])).resolve()
            try:
                docname = target.relative_to(out.resolve()).as_posix().removesuffix(suffix)
            except ValueError:
                return match[0]
            known = anchors.get(docname, {})
            anchor = html.unescape(match[3])
            if anchor in known.values():
                return match[0]
            # the anchor is "<first module>.<fullname>": find the fullname this page documents
            for fullname, real in sorted(known.items(), key=lambda item: -len(item[0])):
                if anchor.endswith("." + fullname):
                    return f"{match[1]}{match[2]}#{html.escape(real)}{match[4]}"
            return match[0]

        text = page.read_text(encoding="utf-8")
        fixed = BACKLINK.sub(relink, text)
        if fixed != text:
            page.write_text(fixed, encoding="utf-8")


def _own_sources_only(app: Sphinx) -> list[tuple[str, dict[str, Any], str]]:
    """Drop, before viewcode writes its pages, the modules outside the package it read."""
    modules = app.env.__dict__.get("_viewcode_modules", {})
    for modname in [m for m in modules if m != PACKAGE and not m.startswith(PACKAGE + ".")]:
        del modules[modname]
    return []  # no pages of its own


def setup(app: Sphinx) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.viewcode")
    app.connect("doctree-read", _record)
    app.connect("env-merge-info", _merge)
    app.connect("env-purge-doc", _purge)
    app.connect("build-finished", _fix)
    app.connect("html-collect-pages", _own_sources_only, priority=400)  # before viewcode's (500)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
