"""The site is ready to host: Read the Docs and GitHub Pages build it as ``make html`` does.

``.readthedocs.yaml`` and ``.github/workflows/pages.yml`` are checked offline: against the
schemas that ``check-jsonschema`` ships (Read the Docs' config, GitHub's workflow schema, and
its rule that every job has a timeout), by ``actionlint`` (expressions, action inputs, job
graph), and for what they run: ``make html``, and a publish of ``_build/html``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
READTHEDOCS = ROOT / ".readthedocs.yaml"
PAGES = ROOT / ".github" / "workflows" / "pages.yml"


def _run(*command: str) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize(
    ("path", "schemas"),
    [
        (READTHEDOCS, ["vendor.readthedocs"]),
        (PAGES, ["vendor.github-workflows", "custom.github-workflows-require-timeout"]),
    ],
    ids=["readthedocs", "pages"],
)
def test_the_config_is_valid_under_its_schema(path: Path, schemas: list[str]) -> None:
    for schema in schemas:
        _run(str(BIN / "check-jsonschema"), "--builtin-schema", schema, str(path))


def test_actionlint_finds_nothing_in_the_workflows() -> None:
    _run(str(BIN / "actionlint"), *map(str, sorted((ROOT / ".github" / "workflows").glob("*.yml"))))


def test_both_build_the_site_with_make_html_and_publish_the_build() -> None:
    rtd = yaml.safe_load(READTHEDOCS.read_text())
    commands = rtd["build"]["commands"]
    assert any(c.split()[-2:] == ["html", "PYTHON=python"] and " make html" in f" {c}" for c in commands), commands
    assert any("_build/html $READTHEDOCS_OUTPUT/html" in c for c in commands), commands
    jobs = yaml.safe_load(PAGES.read_text())["jobs"]
    steps = jobs["build"]["steps"]
    assert [s["run"] for s in steps if "run" in s] == ["make html"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact@"))
    assert upload["with"]["path"] == "_build/html"
    assert any(s.get("uses", "").startswith("actions/deploy-pages@") for s in jobs["deploy"]["steps"])


def test_the_checks_see_a_broken_workflow(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("on: push\njobs:\n  x:\n    runs-on: ubuntu-24.04\n    steps:\n      - run: echo ${{ nope.x }}\n")
    assert subprocess.run([BIN / "actionlint", str(bad)], capture_output=True).returncode != 0
    schema = ["--builtin-schema", "custom.github-workflows-require-timeout", str(bad)]
    assert subprocess.run([BIN / "check-jsonschema", *schema], capture_output=True).returncode != 0
