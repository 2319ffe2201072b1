"""Re-read a page when files it reads at build time change, appear or disappear.

Sphinx re-reads a page when its source changes; a notebook page that runs other files (the
Benchmarks page runs ``benchmarks/bench_*.py``) depends on those too. ``page_dependencies`` in
``conf.py`` maps a docname to glob patterns (relative to the source root). Every match is a
Sphinx dependency (an edit re-reads the page), and the list of matches is remembered, so a
script added or removed re-reads the page as well.
"""

from __future__ import annotations

from pathlib import Path

from sphinx.application import Sphinx


def matches(app: Sphinx, docname: str) -> list[str]:
    root = Path(app.srcdir)
    patterns = app.config.page_dependencies.get(docname, [])
    return sorted(str(path) for pattern in patterns for path in root.glob(pattern) if path.is_file())


def note_dependencies(app: Sphinx, docname: str, source: list[str]) -> None:
    if docname not in app.config.page_dependencies:
        return
    found = matches(app, docname)
    for path in found:
        app.env.note_dependency(path)
    if not hasattr(app.env, "page_dependency_matches"):
        app.env.page_dependency_matches = {}
    app.env.page_dependency_matches[docname] = found


def outdated(app: Sphinx, env, added: set[str], changed: set[str], removed: set[str]) -> list[str]:
    seen = getattr(env, "page_dependency_matches", {})
    return [
        docname
        for docname in app.config.page_dependencies
        if docname in env.all_docs and seen.get(docname) != matches(app, docname)
    ]


def merge(app: Sphinx, env, docnames: set[str], other) -> None:
    if not hasattr(env, "page_dependency_matches"):
        env.page_dependency_matches = {}
    env.page_dependency_matches.update(getattr(other, "page_dependency_matches", {}))


def setup(app: Sphinx) -> dict:
    app.add_config_value("page_dependencies", {}, "env", types=[dict])
    app.connect("source-read", note_dependencies)
    app.connect("env-get-outdated", outdated)
    app.connect("env-merge-info", merge)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
