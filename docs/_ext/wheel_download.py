"""Serve the package's wheel from the site's root, for readers who never clone the repository.

``pip install <site URL>/unitscale-<version>-py3-none-any.whl`` installs the library that the
site's tutorials ran against. The wheel is ``dist/``'s when ``make dist`` made one after the last
change to the package's sources; otherwise it is built here, offline (``--no-build-isolation
--no-deps --no-index``: the build backend already installed, nothing fetched), from a copy of
the sources in a temporary folder, so the build leaves no ``build/`` or ``*.egg-info`` in the
repository, and kept in ``_build/wheel/`` until the sources change. A wheel in the site newer
than every source is kept, so an incremental build adds nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.util import logging

logger = logging.getLogger(__name__)
# what a wheel is built from (setuptools reads the readme and a license file, if any)
SOURCE_FILES = ("pyproject.toml", "README.md", "LICENSE", "LICENSE.txt", "setup.cfg", "setup.py")


def wheel_name(root: Path) -> str:
    """``<name>-<version>-py3-none-any.whl`` for the project in ``root`` (a pure-Python package)."""
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    return f"{project['name'].replace('-', '_')}-{project['version']}-py3-none-any.whl"


def sources(root: Path, package: str) -> list[Path]:
    """The files the wheel holds or is built from."""
    files = [root / name for name in SOURCE_FILES if (root / name).is_file()]
    return files + [p for p in sorted((root / package).rglob("*")) if p.is_file() and "__pycache__" not in p.parts]


def is_fresh(path: Path, inputs: list[Path]) -> bool:
    return path.is_file() and path.stat().st_mtime >= max(p.stat().st_mtime for p in inputs)


def build_wheel(root: Path, package: str, out: Path) -> Path:
    """Build the wheel of ``root`` offline into ``out``, from a copy of its sources."""
    with tempfile.TemporaryDirectory(prefix="unitscale-wheel-") as tmp:
        copy = Path(tmp) / "src"
        for file in sources(root, package):
            target = copy / file.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(file, target)
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
        result = subprocess.run([*command, "-w", str(out), str(copy)], capture_output=True, text=True)
        if result.returncode:
            raise ExtensionError(f"building the wheel failed ({' '.join(command)}):\n{result.stdout}{result.stderr}")
    return out / wheel_name(root)


def site_wheel(root: Path, package: str) -> Path:
    """A wheel of ``root`` no older than its sources: ``dist/``'s, else the build cache's, else a new one.

    The cache (``_build/wheel/``) lets every build of the site (and the small test sites that
    reuse ``conf.py``) build the wheel once per change of the sources.
    """
    name = wheel_name(root)
    inputs = sources(root, package)
    for made in (root / "dist" / name, root / "_build" / "wheel" / name):
        if is_fresh(made, inputs):
            return made
    logger.info(f"building {name} for the site (dist/ has none newer than the sources)")
    cache = root / "_build" / "wheel"
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="unitscale-dist-", dir=cache) as out:
        built = build_wheel(root, package, Path(out))
        os.replace(built, cache / name)  # atomic: builds running side by side never see half a wheel
    return cache / name


def add_wheel(app: Sphinx, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    root = Path(app.config.wheel_project_root or app.confdir)
    target = Path(app.outdir) / wheel_name(root)
    if not is_fresh(target, sources(root, app.config.wheel_package)):
        shutil.copyfile(site_wheel(root, app.config.wheel_package), target)


def setup(app: Sphinx) -> dict:
    app.add_config_value("wheel_package", "unitscale", "env")
    app.add_config_value("wheel_project_root", "", "env")  # the folder with pyproject.toml (default: confdir)
    app.connect("build-finished", add_wheel)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
