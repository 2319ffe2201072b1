"""The set-up commands that Install, Run locally and the README give are the ones that work.

- Install's "without make" block: each ``pip install -c constraints.txt -e ...`` line runs as
  written on a copy of the sources, with ``--dry-run --no-index --no-build-isolation`` added so
  that it resolves against this environment offline and installs nothing;
- Install's "what make does on first use" block: each command is in the Makefile's set-up rule;
- the README's and Install's two commands, ``make html`` and ``make test``: make runs them
  (``make -n``, on this checkout): the build with the jupyter cache, and the four steps of CI;
- Run locally's ``make notebooks``: run on the last build, it leaves one ``.ipynb`` per tutorial.

The quick start on the home page runs as pasted in ``test_readers_without_a_clone.py``, and the
wheel from the site's URL with its ``tutorials`` extra in ``test_reader_environment.py``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))


def block_after(text: str, heading: str) -> list[str]:
    """The command lines of the first ```bash block after ``heading``, comments removed."""
    rest = text[text.index(heading) :]
    match = re.search(r"^```bash\n(.*?)^```", rest, re.S | re.M)
    assert match, f"no ```bash block after {heading!r}"
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in match.group(1).splitlines()]
    return [line for line in lines if line]


def _make(*args: str, cwd: Path = ROOT) -> str:
    env = {**os.environ, "MAKEFLAGS": ""}
    done = subprocess.run(["make", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of what ``pip install -e .`` reads: the project file, the pins and the package."""
    where = tmp_path_factory.mktemp("clone")
    for name in ("pyproject.toml", "constraints.txt", "README.md"):
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "unitscale", where / "unitscale", ignore=shutil.ignore_patterns("__pycache__"))
    return where


WITHOUT_MAKE = block_after(INSTALL, "## The sources, without make")


def test_install_gives_one_line_per_extra() -> None:
    extras = [re.search(r"-e '?\.(\[\w+\])?", line).group(1) for line in WITHOUT_MAKE]  # type: ignore[union-attr]
    assert extras == [None, "[tutorials]", "[docs]", "[test]"]


@pytest.mark.parametrize("line", WITHOUT_MAKE)
def test_each_install_line_resolves_with_the_pins(line: str, sources: Path) -> None:
    words = shlex.split(line)
    assert words[:2] == ["pip", "install"], line
    command = [sys.executable, "-m", *words, "--dry-run", "--no-index", "--no-build-isolation"]
    done = subprocess.run(command, cwd=sources, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{line}:\n{done.stderr[-3000:]}"
    assert "Would install unitscale-" in done.stdout, done.stdout[-2000:]


def test_what_make_does_on_first_use_is_the_makefiles_set_up_rule() -> None:
    rule = (ROOT / "Makefile").read_text().split("$(STAMP): pyproject.toml constraints.txt\n", 1)[1].split("\n\n")[0]
    rule = rule.replace("$(PY)", ".venv/bin/python").replace("$(PYTHON)", "python3").replace("$(VENV)", ".venv")
    rule = rule.replace(" -q", "")
    index = re.search(r"^TORCH_INDEX \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert index, "the Makefile names no TORCH_INDEX, where torch's CPU build comes from"
    rule = rule.replace("$(TORCH_INDEX)", index[1])
    for line in block_after(INSTALL, "create `.venv` on first use with"):
        assert line in rule, f"Install says make runs `{line}`; the Makefile's set-up rule is:\n{rule}"


@pytest.mark.parametrize("text", [README, INSTALL], ids=["README", "Install"])
def test_the_two_commands_are_targets_that_build_and_test(text: str) -> None:
    commands = [line.split("#")[0].strip() for line in re.findall(r"^make (?:html|test).*$", text, re.M)]
    assert commands == ["make html", "make test"]
    html = _make("-n", "-o", ".venv/.installed-stamp", "html")
    assert "NB_EXECUTION_MODE=cache .venv/bin/python -m sphinx -b html -W" in html
    test = _make("-n", "-o", ".venv/.installed-stamp", "-o", "chromium", "test")
    for step in ("ruff check", "mypy", "format_tutorials.py --check", "pytest", "NB_EXECUTION_MODE=force"):
        assert step in test, f"make test no longer runs {step}"


@pytest.mark.built
def test_make_notebooks_leaves_one_notebook_per_tutorial(tmp_path: Path) -> None:
    assert "make notebooks" in block_after((ROOT / "docs" / "run-locally.md").read_text(), "## All of them at once")[0]
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "_build").symlink_to(ROOT / "_build")
    _make("-o", ".venv/.installed-stamp", "-o", "html", "notebooks", cwd=tmp_path)
    assert sorted(p.stem for p in (tmp_path / "notebooks").glob("*.ipynb")) == TUTORIALS


RUN_LOCALLY = (ROOT / "docs" / "run-locally.md").read_text(encoding="utf-8")
PINNED_TORCH = re.search(r"^torch==(\S+)$", (ROOT / "constraints.txt").read_text(), re.M).group(1)  # type: ignore[union-attr]


@pytest.mark.parametrize("text", [INSTALL, RUN_LOCALLY], ids=["Install", "Run locally"])
def test_reader_commands_name_no_placeholder_and_the_cpu_torch(text: str) -> None:
    """Run as written, a bare `pip install` of the wheel fetched torch's CUDA build (5.6 GB)."""
    assert "<site URL>" not in text
    torch_lines = re.findall(r"^pip install torch.*$", text, re.M)
    assert torch_lines, "no line installs torch's CPU build before the wheel"
    for line in torch_lines:
        assert line == f"pip install torch=={PINNED_TORCH} --index-url https://download.pytorch.org/whl/cpu", line


def reader_blocks(page: str) -> list[str]:
    """The ```bash blocks a reader without a clone runs: Install's wheel section, Run locally's first."""
    if page == "Install":
        section = INSTALL[INSTALL.index("## The wheel") : INSTALL.index("## The sources (recommended)")]
        blocks = re.findall(r"^```bash\n(.*?)^```", section, re.S | re.M)
        assert len(blocks) == 2
        return blocks
    return re.findall(r"^```bash\n(.*?)^```", RUN_LOCALLY, re.S | re.M)[:1]


@pytest.mark.built
@pytest.mark.parametrize("page", ["Install", "Run locally"])
def test_reader_install_commands_run_as_written(page: str, tmp_path: Path) -> None:
    """The commands a reader without a clone runs, run as shown by bash in the folder the wheel was
    saved to (Run locally's in the environment Install's made). pip is pointed at the local
    wheelhouse by its environment (``PIP_NO_INDEX``, ``PIP_FIND_LINKS``: no network; torch's CPU
    wheel is there) and resolves without installing (``PIP_DRY_RUN``): what is checked is that each
    line is valid and resolves with the pins, torch's CPU build included, not the download."""
    site = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
    wheels = list(site.glob("unitscale-*-py3-none-any.whl"))
    assert len(wheels) == 1, f"the built site serves {wheels}"
    shutil.copy(wheels[0], tmp_path / wheels[0].name)
    blocks = reader_blocks(page)
    if page != "Install":
        blocks = ["python3 -m venv .venv && source .venv/bin/activate\n", *blocks]
    env = {
        **os.environ,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(ROOT / ".venv" / "wheelhouse"),
        "PIP_DRY_RUN": "1",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("VIRTUAL_ENV", None)
    script = "set -euo pipefail\n" + "".join(blocks)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    would = " ".join(line for line in done.stdout.splitlines() if line.startswith("Would install"))
    assert f" torch-{PINNED_TORCH}" in would, done.stdout[-2000:]
    assert f" unitscale-{wheels[0].name.split('-')[1]}" in would, done.stdout[-2000:]
