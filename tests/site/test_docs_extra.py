"""`pip install -e '.[docs]'` installs every Sphinx extension conf.py loads, so `make html` runs on a fresh clone."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def conf_extensions() -> list[str]:
    """The ``extensions`` list of conf.py, read from its source."""
    for node in ast.parse((ROOT / "conf.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "extensions" for t in node.targets):
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError("conf.py has no extensions list")


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_extension_is_in_the_docs_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    docs = {_canonical(re.split(r"[<>=!~\[; ]", req)[0]) for req in project["optional-dependencies"]["docs"]}
    local = {path.stem for path in (ROOT / "docs" / "_ext").glob("*.py")}
    distributions = importlib.metadata.packages_distributions()
    missing = []
    for extension in conf_extensions():
        top = extension.split(".")[0]
        if top in local or top == "sphinx":
            continue
        names = {_canonical(d) for d in distributions.get(top, [])}
        assert names, f"conf.py loads {extension}, which no installed distribution provides"
        if not names & docs:
            missing.append(f"{extension} (from {', '.join(sorted(names))})")
    assert not missing, "conf.py loads extensions the docs extra does not install: " + "; ".join(missing)
