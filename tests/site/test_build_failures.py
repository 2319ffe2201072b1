"""`make test` fails on a broken tutorial cell, on a Sphinx warning and on a failing doctest.

Each case builds (or tests) something tiny in a temporary directory with the settings the real
build uses: the project's own ``conf.py`` (loaded, not copied), ``-W --keep-going`` and
``NB_EXECUTION_MODE=force``, and the same pytest flags as the Makefile. A passing control case
shows that the failures come from the planted fault, not from the set-up.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPHINX = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-T"]

CONF = f"""
import runpy
globals().update({{k: v for k, v in runpy.run_path({str(ROOT / "conf.py")!r}).items() if not k.startswith("__")}})
root_doc = "index"
exclude_patterns = ["_build"]
# the API page and its stubs belong to the real site, not to this tiny one
extensions = [e for e in extensions if e != "api_reference"]
nb_execute_alone = []  # the real site's pipeline tutorial is no page here
"""

FRONT_MATTER = """\
---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---
"""


def notebook(title: str, code: str) -> str:
    return f"{FRONT_MATTER}\n# {title}\n\n```{{code-cell}} ipython3\n{code}\n```\n"


def build(tmp_path: Path, pages: dict[str, str]) -> subprocess.CompletedProcess:
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF)
    toctree = "\n".join(name for name in pages if name != "index")
    (src / "index.md").write_text(f"# Tiny\n\n```{{toctree}}\n{toctree}\n```\n")
    for name, text in pages.items():
        (src / f"{name}.md").write_text(text)
    env = {**os.environ, "NB_EXECUTION_MODE": "force", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    return subprocess.run(
        [*SPHINX, str(src), str(tmp_path / "html"), "-d", str(tmp_path / "doctrees")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.slow
def test_a_working_tutorial_builds_and_gets_an_ipynb_download(tmp_path):
    result = build(tmp_path, {"tutorial": notebook("Works", "print(6 * 7)")})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "42" in (tmp_path / "html" / "tutorial.html").read_text()
    assert (tmp_path / "html" / "_sources" / "tutorial.ipynb").is_file()


@pytest.mark.slow
def test_a_broken_tutorial_cell_fails_the_build(tmp_path):
    result = build(tmp_path, {"tutorial": notebook("Broken", "raise ZeroDivisionError('planted fault')")})
    assert result.returncode != 0
    assert "planted fault" in result.stdout + result.stderr


def test_a_sphinx_warning_fails_the_build(tmp_path):
    page = "# Page\n\nSee {func}`unitscale.no_such_function`.\n"
    result = build(tmp_path, {"page": page})
    assert result.returncode != 0
    assert "reference target not found: unitscale.no_such_function" in result.stderr


def test_a_failing_doctest_fails_the_tests(tmp_path):
    module = tmp_path / "wrong_example.py"
    module.write_text(
        textwrap.dedent('''
        def double(x: int) -> int:
            """Double a number.

            >>> double(2)
            5
            """
            return 2 * x
    ''')
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "--doctest-modules",
            str(module),
            "--rootdir",
            str(tmp_path),
            "-c",
            os.devnull,
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout
    assert "1 failed" in result.stdout
    assert "Expected:\n    5\nGot:\n    4" in result.stdout
