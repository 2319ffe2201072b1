"""A reader who copies only a tutorial's visible cells gets code that runs.

Hidden cells (``remove-cell``, ``remove-input``, ``hide-input``, ``hide-cell``) are for glue and
plot styling: a name a visible cell reads must come from a visible cell, an earlier one or itself,
or from Python's builtins, never only from a hidden cell. Checked on the source (no execution),
so every tutorial, today's and future ones, is covered in milliseconds.
"""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import jupytext
import pytest

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))
HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}


def _bound(tree: ast.AST, with_parameters: bool) -> set[str]:
    """Names a cell binds: imports, definitions, assignment and loop targets (and parameters)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif with_parameters and isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _read(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _python(source: str) -> ast.Module:
    # IPython magics and shell escapes are not Python; they bind nothing a later cell reads
    return ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))


def hidden_names_read_by_visible_cells(markdown: str) -> list[tuple[int, str, list[str]]]:
    """(cell number, first line, names) for each visible cell that reads a name only a hidden cell binds."""
    notebook = jupytext.reads(markdown, fmt="md:myst")
    visible = set(dir(builtins))
    hidden: set[str] = set()
    problems = []
    for number, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        tree = _python(cell.source)
        if HIDDEN_TAGS & set(cell.metadata.get("tags", [])):
            hidden |= _bound(tree, with_parameters=False)
            continue
        missing = sorted((_read(tree) - visible - _bound(tree, with_parameters=True)) & hidden)
        if missing:
            problems.append((number, cell.source.splitlines()[0], missing))
        visible |= _bound(tree, with_parameters=False)
    return problems


@pytest.mark.parametrize("tutorial", TUTORIALS, ids=lambda p: p.stem)
def test_visible_cells_read_no_name_defined_only_in_a_hidden_cell(tutorial):
    problems = hidden_names_read_by_visible_cells(tutorial.read_text())
    assert problems == [], (
        f"{tutorial.name}: visible cells read names that only hidden cells define; a reader who copies "
        f"the visible cells gets NameError. Define them in a visible cell: {problems}"
    )


def test_the_check_catches_a_hidden_import():
    page = """---
jupytext:
  text_representation:
    format_name: myst
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

```{code-cell} ipython3
:tags: [hide-input]

import torch
secret = 3
```

```{code-cell} ipython3
f = lambda v: v + secret
print(torch.ones(2), len([1]), f(1))
```
"""
    assert hidden_names_read_by_visible_cells(page) == [(1, "f = lambda v: v + secret", ["secret", "torch"])]
    visible = page.replace(":tags: [hide-input]\n", "")
    assert hidden_names_read_by_visible_cells(visible) == []
