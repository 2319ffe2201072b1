"""The wheel ``make dist`` builds holds the whole package: every subpackage and every module.

The build runs on a copy of the sources in a temporary folder, so the checkout gets no
``build/`` or ``*.egg-info`` folder and parallel runs do not share one. ``--no-isolation``
uses this environment's setuptools (no network), as ``make dist`` does.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("build")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "unitscale"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _build_wheel(tmp_path: Path) -> Path:
    src, out = tmp_path / "src", tmp_path / "dist"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "unitscale", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> tuple[str, set[str]]:
    with zipfile.ZipFile(wheel) as zf:
        return wheel.name, set(zf.namelist())


def _sources(pattern: str) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob(pattern) if "__pycache__" not in p.parts}


def test_wheel_holds_every_subpackage_of_unitscale(wheel_names: tuple[str, set[str]]) -> None:
    _, names = wheel_names
    packages = _sources("__init__.py")
    # the folders of the package today; a new one must appear here too
    assert {"unitscale/__init__.py", "unitscale/capture/__init__.py", "unitscale/stages/__init__.py"} <= packages
    assert len(packages) >= 8
    assert sorted(packages - names) == []


def test_wheel_holds_every_module_and_nothing_outside_unitscale(wheel_names: tuple[str, set[str]]) -> None:
    name, names = wheel_names
    modules = _sources("*.py")
    assert sorted(modules - names) == []
    assert {n for n in names if n.endswith(".py")} == modules  # no tests, docs or benchmarks leak in
    assert {n.split("/")[0] for n in names} == {"unitscale", f"unitscale-{VERSION}.dist-info"}
    assert name == f"unitscale-{VERSION}-py3-none-any.whl"


def test_twine_check_passes_on_the_wheel(wheel: Path) -> None:
    """What PyPI would say of the metadata and README (``make dist`` runs the same check); offline."""
    pytest.importorskip("twine")
    done = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheel)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASSED" in done.stdout and "WARNING" not in done.stdout
