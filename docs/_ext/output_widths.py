"""Printed outputs that read on a phone: prose wraps, tables keep their columns and scroll.

A notebook prints two kinds of text: sentences, messages and code (an error's explanation, a
node's one-line description, generated code), and tables whose columns line up. The site keeps
an output's lines as printed (``white-space: pre``), so on a phone both scrolled sideways, an
error message 1,900 px wide among them. This marks every printed output that is not a table
(:func:`is_table`) with the class :data:`WRAPS`, which ``unitscale.css`` lets wrap; a table
still scrolls in its own box, and ``outputs.js`` marks a box that scrolls with a shadow at the
edge where more is hidden.
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes

#: the class of an output block that may wrap its lines
WRAPS = "output-wraps"
# two or more spaces between two pieces of text: the gap before a column (not after a semicolon:
# fx's generated code separates two statements so, ``act = self.act(fc1);  fc1 = None``)
_GAP = re.compile(r"(?<=[^\s;]) {2,}(?=\S)")


def is_table(text: str) -> bool:
    """Whether ``text`` is laid out in columns: at least two lines, and a column after a gap of
    two or more spaces whose left or right edge is at the same place in at least a third of them.
    Indentation does not count, nor a gap at a different place on each line
    (``x = f(y);  y = None``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) < 2:
        return False
    edges: dict[tuple[str, int], int] = {}  # a column's left edge, or its right one (numbers align right)
    for line in lines:
        found = set()
        for gap in _GAP.finditer(line):
            word = re.match(r"\S+", line[gap.end() :])
            found |= {("left", gap.end()), ("right", gap.end() + (word.end() if word else 0))}
        for edge in found:
            edges[edge] = edges.get(edge, 0) + 1
    return max(edges.values(), default=0) >= max(2, len(lines) / 3)


def mark_wrapping_outputs(app: Any, doctree: nodes.document, docname: str) -> None:
    for block in doctree.findall(nodes.literal_block):
        classes = block.get("classes", [])
        if "output" in classes and not is_table(block.astext()):
            classes.append(WRAPS)


def setup(app: Any) -> dict:
    app.connect("doctree-resolved", mark_wrapping_outputs)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
