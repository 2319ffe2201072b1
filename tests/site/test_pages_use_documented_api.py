"""Every ``unitscale`` name a tutorial or guide page imports or calls is documented on the API pages.

A reader who meets ``from unitscale.x import y`` on a page can look ``y`` up; a page that reaches
past a namespace's face (``unitscale.examples.models``, ``unitscale.tracking.report``) teaches
an import path the API reference does not promise. The names are read from the pages' code
(code cells and ``python`` blocks) with :mod:`ast`: imports, and attribute chains that start at
an imported ``unitscale`` name (``U.silu``, ``unitscale.optim.Adam``).
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import api_reference  # noqa: E402

PAGES = sorted(
    [*ROOT.glob("tutorials/[0-9][0-9]*_*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("docs/api/*.md"), ROOT / "README.md"]
)
_FENCE = re.compile(r"^(`{3,}|~{3,})[ \t]*(\{code-cell\}[^\n]*|python|py)\n(.*?)^\1", re.M | re.S)


def code_blocks(text: str) -> list[str]:
    """The Python of a page: its code cells and ``python`` blocks, IPython magics left out."""
    blocks = []
    for match in _FENCE.finditer(text):
        lines = match.group(3).splitlines()
        blocks.append("\n".join(line for line in lines if not line.lstrip().startswith(("%", "!", ":"))))
    return blocks


def _dotted(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return [node.id, *reversed(parts)] if isinstance(node, ast.Name) else None


def names_used(code: str) -> set[str]:
    """The full ``unitscale`` names that ``code`` imports or reaches through an imported name."""
    tree = ast.parse(code)
    used: set[str] = set()
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "unitscale":
            used.add(node.module or "")
            for alias in node.names:
                used.add(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "unitscale":
                    used.add(alias.name)
                    bound[alias.asname or "unitscale"] = alias.name if alias.asname else "unitscale"
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := _dotted(node)) and chain[0] in bound:
            used.add(".".join([bound[chain[0]], *chain[1:]]))
    return used


def resolve(name: str) -> object:
    """The object ``name`` reaches: attributes first, then submodules (as ``import a.b`` would)."""
    parts = name.split(".")
    obj: object = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            obj = importlib.import_module(".".join(parts[: i + 1]))
        else:
            raise AttributeError(f"{name}: {'.'.join(parts[:i])} has no attribute {part!r}")
    return obj


def undocumented(name: str) -> str | None:
    """Why ``name`` is not a documented name, or ``None`` when it is."""
    documented = {id(obj) for obj in api_reference.documented_objects().values()}
    namespaces = {"unitscale", *api_reference.namespaces()}
    obj = resolve(name)
    if isinstance(obj, types.ModuleType):
        return None if name in namespaces else f"{name} is a module below the namespaces the API pages document"
    if id(obj) in documented:
        return None
    # a method or attribute of a documented object (``StagePlan.save``, ``FP8_E4M3.round``)
    parent = resolve(name.rsplit(".", 1)[0])
    if id(parent) in documented or (isinstance(obj, types.MethodType) and id(obj.__self__) in documented):
        return None
    return f"{name} is not documented on the API pages"


def test_the_scan_sees_imports_aliases_and_attribute_chains() -> None:
    code = "import unitscale.functional as U\nfrom unitscale.examples import TinyGPT as G\ny = U.silu(x)\nG.loss\n"
    assert names_used(code) == {
        "unitscale.functional",
        "unitscale.examples",
        "unitscale.examples.TinyGPT",
        "unitscale.functional.silu",
        "unitscale.examples.TinyGPT.loss",
    }
    assert undocumented("unitscale.functional.silu") is None
    assert undocumented("unitscale.examples.models") is not None
    assert undocumented("unitscale.examples.models.TinyGPT") is None  # the object is documented...
    assert undocumented("unitscale.tracking.report") is not None  # ...but not the module path


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_page_uses_only_names_the_api_pages_document(page: Path) -> None:
    names = set().union(*(names_used(code) for code in code_blocks(page.read_text())))
    problems = sorted(filter(None, map(undocumented, names)))
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)
