"""Pages that time themselves execute with no other notebook beside them.

A parallel build (``-j``) executes two notebooks at once. A tutorial that measures how long
something takes on this machine and compares it with a prediction (the pipeline tutorial
runs real pipelines on every core) would then share its cores with the other notebook, whose
load changes from one second to the next. ``nb_execute_alone`` in ``conf.py`` lists such
pages by docname. Every notebook executes holding a lock on a file in the doctree folder:
shared for ordinary pages, so they still run side by side, exclusive for the listed ones, so
each of those waits until no other notebook executes and keeps the others waiting until it is
done. A build with one process takes the lock uncontended. The wrapper only adds the lock
around MyST-NB's own execution client; what executes and what is cached is unchanged.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Collection
from pathlib import Path
from types import TracebackType
from typing import Any

from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util import logging

logger = logging.getLogger(__name__)

LOCK_NAME = "notebook-execution.lock"


class HeldWhileExecuting:
    """Enter ``client`` (which executes its notebook) holding a shared or an exclusive lock on ``lock_path``."""

    def __init__(self, client: Any, lock_path: Path, exclusive: bool) -> None:
        self.client, self.lock_path, self.exclusive = client, lock_path, exclusive
        self.file: Any = None

    def __enter__(self) -> Any:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.lock_path, "a")  # noqa: SIM115 (closed in _release)
        fcntl.flock(self.file, fcntl.LOCK_EX if self.exclusive else fcntl.LOCK_SH)
        try:
            return self.client.__enter__()
        except BaseException:
            self._release()
            raise

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> Any:
        try:
            return self.client.__exit__(kind, error, trace)
        finally:
            self._release()

    def _release(self) -> None:
        if self.file is not None:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()
            self.file = None


def executing_alone(
    create_client: Callable[..., Any], srcdir: Path, lock_path: Path, alone: Collection[str]
) -> Callable[..., Any]:
    """``create_client`` whose clients run under :class:`HeldWhileExecuting`, exclusive for docnames in ``alone``."""

    def create(notebook: Any, source: str, *args: Any, **kwargs: Any) -> HeldWhileExecuting:
        client = create_client(notebook, source, *args, **kwargs)
        try:
            docname = Path(source).resolve().relative_to(srcdir).with_suffix("").as_posix()
        except (OSError, ValueError):
            docname = ""
        return HeldWhileExecuting(client, lock_path, exclusive=docname in alone)

    create.wrapped = create_client  # type: ignore[attr-defined]
    return create


def install(app: Sphinx) -> None:
    import myst_nb.sphinx_ as parser

    original = getattr(parser.create_client, "wrapped", parser.create_client)
    lock_path = Path(app.doctreedir) / LOCK_NAME
    parser.create_client = executing_alone(
        original, Path(app.srcdir).resolve(), lock_path, frozenset(app.config.nb_execute_alone)
    )


def check_listed_pages(app: Sphinx, env: BuildEnvironment, docnames: list[str]) -> None:
    """Warn (an error under ``-W``) about a listed docname that is no page: it would run beside others unnoticed."""
    for docname in app.config.nb_execute_alone:
        if docname not in env.found_docs:
            logger.warning(
                f"nb_execute_alone lists {docname!r}, which is not a page of this site; "
                "list docnames as Sphinx names them, relative to the source folder and without a suffix"
            )


def setup(app: Sphinx) -> dict:
    app.add_config_value("nb_execute_alone", [], "env", [list])
    app.connect("builder-inited", install)
    app.connect("env-before-read-docs", check_listed_pages)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
