"""Serve the project's sources from the site's root, so a reader can run ``make html`` and ``make test``.

``unitscale-<version>-src.tar.gz`` holds one folder, ``unitscale-<version>/``, with every file
of the checkout that ``.gitignore`` does not ignore (read with ``pathspec``, git's own rules; no
git needed, so an archive unpacked from the site builds its own archive the same way). Entries
are sorted and carry the newest source's time, no owner and fixed modes, so the same sources
give the same bytes. Kept in ``_build/source/`` until a source changes, like the wheel.
"""

from __future__ import annotations

import gzip
import os
import shutil
import tarfile
import tomllib
from pathlib import Path

import pathspec
from sphinx.application import Sphinx

ALWAYS_LEFT_OUT = (".git",)  # a folder in a clone, a file in a worktree


def folder_name(root: Path) -> str:
    """``<name>-<version>``, the archive's one folder, for the project in ``root``."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return f"{project['name']}-{project['version']}"


def archive_name(root: Path) -> str:
    """``<name>-<version>-src.tar.gz`` for the project in ``root``."""
    return f"{folder_name(root)}-src.tar.gz"


def source_files(root: Path) -> list[Path]:
    """Every file under ``root`` that its ``.gitignore`` does not ignore, as sorted relative paths."""
    ignore = root / ".gitignore"
    lines = ignore.read_text(encoding="utf-8").splitlines() if ignore.is_file() else []
    spec = pathspec.GitIgnoreSpec.from_lines([*ALWAYS_LEFT_OUT, *lines])
    kept: list[Path] = []
    for folder, dirs, files in os.walk(root):
        here = Path(folder).relative_to(root)
        dirs[:] = [d for d in dirs if not spec.match_file(f"{(here / d).as_posix()}/")]
        kept += [here / f for f in files if not spec.match_file((here / f).as_posix())]
    return sorted(kept, key=Path.as_posix)


def build_archive(root: Path, out: Path) -> Path:
    """Write the archive of ``root``'s sources to ``out`` (a folder) and return its path."""
    files = source_files(root)
    top = folder_name(root)
    when = int(max((root / f).stat().st_mtime for f in files))
    target = out / archive_name(root)
    with open(target, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=when) as zipped:
        with tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for f in files:
                info = tar.gettarinfo(str(root / f), arcname=f"{top}/{f.as_posix()}")
                info.mtime, info.uid, info.gid, info.uname, info.gname = when, 0, 0, "", ""
                info.mode = 0o755 if info.mode & 0o100 else 0o644
                if info.isfile():
                    with open(root / f, "rb") as data:
                        tar.addfile(info, data)
                else:
                    tar.addfile(info)
    return target


def _is_fresh(path: Path, root: Path) -> bool:
    if not path.is_file():
        return False
    newest = max((root / f).stat().st_mtime for f in source_files(root))
    return path.stat().st_mtime >= newest


def add_archive(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    root = Path(app.config.wheel_project_root or app.confdir)
    target = Path(app.outdir) / archive_name(root)
    if _is_fresh(target, root):
        return
    cache = root / "_build" / "source"
    cache.mkdir(parents=True, exist_ok=True)
    made = cache / archive_name(root)
    if not _is_fresh(made, root):
        tmp = cache / f".{os.getpid()}.tmp"
        tmp.mkdir(exist_ok=True)
        os.replace(build_archive(root, tmp), made)  # atomic: builds side by side never see half an archive
        tmp.rmdir()
    shutil.copyfile(made, target)


def setup(app: Sphinx) -> dict:
    app.connect("build-finished", add_archive)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
