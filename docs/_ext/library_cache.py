"""Cached tutorial outputs belong to one version of the library.

MyST-NB's ``cache`` mode runs a notebook again only when its code cells change. A change to
``unitscale`` itself would leave every page showing numbers from the old code. So the
jupyter-cache lives in a folder named by a digest of the package's sources
(:func:`cache_path`, set as ``nb_execution_cache_path`` in ``conf.py``), each executed page
depends on those sources (``conf.py``'s ``page_dependencies``: an edit re-reads the page),
and after a successful build the caches of other versions are removed.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Sequence
from pathlib import Path

from sphinx.application import Sphinx

DIGEST_LENGTH = 16


def source_digest(package: Path, also: Sequence[Path] = ()) -> str:
    """A digest of every ``.py`` file under ``package`` and of the files ``also``: their paths and their bytes."""
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    for path in also:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:DIGEST_LENGTH]


def cache_path(cache_root: Path, package: Path, also: Sequence[Path] = ()) -> Path:
    """The jupyter-cache folder for the current sources of ``package`` and the files ``also``
    (code the kernels run besides the package: ``figure_widths``)."""
    return cache_root / source_digest(package, also)


def stale_caches(current: Path) -> list[Path]:
    """The sibling folders of ``current`` that are caches of other versions."""
    if not current.parent.is_dir():
        return []
    return sorted(
        path
        for path in current.parent.iterdir()
        if path.is_dir() and path != current and len(path.name) == DIGEST_LENGTH and path.name.isalnum()
    )


def remove_stale_caches(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.config.nb_execution_mode != "cache" or not app.config.nb_execution_cache_path:
        return
    for path in stale_caches(Path(app.config.nb_execution_cache_path)):
        shutil.rmtree(path, ignore_errors=True)


def setup(app: Sphinx) -> dict:
    app.connect("build-finished", remove_stale_caches)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
