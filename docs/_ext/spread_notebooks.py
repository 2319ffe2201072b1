"""Under ``-j``, the notebooks are dealt out over the chunks Sphinx reads, so that two execute at once.

A parallel build reads the pages in chunks of consecutive docnames, one chunk per process at
a time (``sphinx.util.parallel.make_chunks``, on the sorted list of pages). The site's
notebooks sort together (``tutorials/``), so they fell into the last chunks: in one cold build
eight tutorials, 148 s of execution, were one chunk, read by one process while the other had
nothing left to read, and the build ran on one of its two cores for two minutes.

Before the read (``env-before-read-docs``, the event Sphinx gives for reordering) the
notebooks are dealt to the chunks in turn, in the order Sphinx would read them, and the other
pages fill each chunk up in theirs. Sphinx then makes the same number of chunks of the same
sizes from the new order. Which process reads a page changes; what a page holds does not.
Pages that time themselves still execute alone (``execute_alone``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from notebook_download import is_text_notebook
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.parallel import make_chunks


def spread(docnames: list[str], executes: Callable[[str], bool], nproc: int) -> list[str]:
    """``docnames`` reordered so that Sphinx's chunks for ``nproc`` processes share out the pages that ``executes``.

    Each chunk keeps its size; the notebooks go one to a chunk in turn (skipping a full one),
    each chunk's notebooks first, then its other pages, both in their original order.
    """
    sizes = [len(chunk) for chunk in make_chunks(docnames, nproc)]
    notebooks = [d for d in docnames if executes(d)]
    if len(sizes) < 2 or not notebooks:
        return list(docnames)
    dealt: list[list[str]] = [[] for _ in sizes]
    turn = 0
    for name in notebooks:
        while len(dealt[turn]) == sizes[turn]:
            turn = (turn + 1) % len(sizes)
        dealt[turn].append(name)
        turn = (turn + 1) % len(sizes)
    chosen = set(notebooks)
    others = iter(d for d in docnames if d not in chosen)
    order = []
    for chunk, size in zip(dealt, sizes, strict=True):
        order += chunk + [next(others) for _ in range(size - len(chunk))]
    return order


def _spread(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    if app.parallel > 1:
        docnames[:] = spread(docnames, lambda d: _executes(Path(env.doc2path(d))), app.parallel)


def _executes(path: Path) -> bool:
    return path.suffix == ".ipynb" or is_text_notebook(path)


def setup(app: Sphinx) -> dict:
    app.connect("env-before-read-docs", _spread)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
