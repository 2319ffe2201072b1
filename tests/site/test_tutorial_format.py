"""The tutorials' code cells are formatted at 88 columns, so none scrolls sideways on the site.

``make format-tutorials`` formats them (``docs/_ext/format_tutorials.py``: ruff over each code
cell, the prose untouched); this checks that it has nothing left to do, and that the formatter
keeps what it must.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import format_tutorials  # noqa: E402

TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))

PAGE = """---
jupytext:
  text_representation:
    format_name: myst
---

# A page

Prose with `code`   and  two spaces, kept as written.

```{code-cell} ipython3
:tags: [remove-cell]

x=[1,2 ,3]
```

```{code-cell} ipython3
torch.set_num_threads(1)  # a comment long enough to push this line past the eighty-eight columns
```
"""


@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_the_tutorials_code_cells_are_formatted(path: Path) -> None:
    text = path.read_text()
    assert format_tutorials.format_text(text) == text, f"run `make format-tutorials` ({path.name} changes)"


def test_the_formatter_changes_only_code_and_is_idempotent() -> None:
    once = format_tutorials.format_text(PAGE)
    comment = "# a comment long enough to push this line past the eighty-eight columns"
    expected = PAGE.replace("x=[1,2 ,3]", "x = [1, 2, 3]").replace(
        f"torch.set_num_threads(1)  {comment}", f"{comment}\ntorch.set_num_threads(1)"
    )
    assert once == expected, "the front matter, the prose or a cell's options changed, or the code did not"
    assert format_tutorials.format_text(once) == once
