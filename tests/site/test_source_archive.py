"""The sources the site serves: the checkout's files as git sees them, and Install's commands run in them.

Install's recommended way in is the archive at the site's root: unpack it, then ``make html`` and
``make test``. The oracle for what it holds is git (``git ls-files --cached --others
--exclude-standard``: tracked files and the untracked ones ``.gitignore`` does not ignore); the
commands are Install's block, run by bash as written, with ``make`` dry-run (``-n``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from source_archive import archive_name, build_archive, folder_name  # noqa: E402

INSTALL = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


def _git_files(root: Path) -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout
    return sorted(p for p in listed.decode().split("\0") if p and (root / p).is_file())


def _members(archive: Path) -> list[str]:
    with tarfile.open(archive) as tar:
        return sorted(m.name for m in tar.getmembers())


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_archive(ROOT, tmp_path_factory.mktemp("source"))


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="needs a git checkout: git is the oracle")
def test_the_archive_holds_what_git_sees_in_one_folder(archive: Path) -> None:
    top = folder_name(ROOT)
    assert _members(archive) == [f"{top}/{p}" for p in _git_files(ROOT)]
    assert not any(m.split("/")[1] in (".venv", "_build", ".git") for m in _members(archive))


def test_the_same_sources_give_the_same_bytes(archive: Path, tmp_path: Path) -> None:
    again = build_archive(ROOT, tmp_path)
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(archive.read_bytes()).digest()


def test_a_file_gitignore_ignores_is_left_out_and_any_other_kept(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / ".gitignore").write_text("_build/\n*.pyc\n!keep.pyc\n")
    for name in ("a.py", "b.pyc", "keep.pyc", "_build/html/x.html", "docs/_build.md", "sub/_build/y"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(name)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    made = build_archive(tmp_path, tmp_path / "_build")
    top = folder_name(tmp_path)
    assert _members(made) == [f"{top}/{p}" for p in _git_files(tmp_path)]
    assert f"{top}/keep.pyc" in _members(made) and f"{top}/b.pyc" not in _members(made)


def test_install_links_the_archive_the_build_serves() -> None:
    named = set(re.findall(r"unitscale-[\w.]+-src\.tar\.gz", INSTALL))
    assert named == {archive_name(ROOT)}
    assert f'href="../{archive_name(ROOT)}"' in INSTALL


@pytest.mark.built
def test_installs_recommended_commands_run_as_written_in_the_sites_archive(tmp_path: Path) -> None:
    """Install's block, as bash runs it, in the folder the site's archive was saved to; ``make`` is
    dry-run there (``-n``, the set-up and Chromium taken as done), so what is checked is that the
    archive unpacks to the folder the block enters and that its Makefile makes the site and CI's
    steps from the unpacked files alone (no git)."""
    site = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
    shutil.copy(site / archive_name(ROOT), tmp_path)
    section = INSTALL[INSTALL.index("## The sources (recommended)") :]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)  # type: ignore[union-attr]
    dry = 'make() { command make -n -o .venv/.installed-stamp -o chromium "$@"; }\n'
    env = {**os.environ, "MAKEFLAGS": ""}
    done = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + dry + block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    unpacked = tmp_path / folder_name(ROOT)
    assert not (unpacked / ".git").exists()
    for step in ("-m sphinx -b html -W", "ruff check", "mypy", "pytest", "NB_EXECUTION_MODE=force"):
        assert step in done.stdout, f"make html/test in the unpacked sources no longer runs {step}"
