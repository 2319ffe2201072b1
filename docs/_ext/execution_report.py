"""The execution report's Status column in words, not emoji.

MyST-NB's ``nb-exec-table`` marks each notebook ✅ or ❌. A machine without an emoji font (a
Linux box with the usual fonts, the headless Chromium the site's screenshots are taken with)
shows both as the same empty box, so the column said nothing. After MyST-NB has made the table
(``doctree-resolved`` comes after its post-transform), the two marks become "ok" and
"failed", and the table gets the class ``execution-report`` (``unitscale.css`` keeps its
cells on one line: a date broken after its day read as two values). The rest is MyST-NB's.
"""

from __future__ import annotations

from docutils import nodes
from sphinx.application import Sphinx

HEADER = ["Document", "Modified", "Method", "Run Time (s)", "Status"]
WORDS = {"✅": "ok", "❌": "failed"}


def status_in_words(app: Sphinx, doctree: nodes.document, docname: str) -> None:
    """Replace the marks in the Status column of every MyST-NB execution table of ``doctree``."""
    for table in doctree.findall(nodes.table):
        head = [entry.astext() for entry in table.findall(nodes.entry) if isinstance(entry.parent.parent, nodes.thead)]
        if head != HEADER:
            continue
        table["classes"].append("execution-report")
        for body in table.findall(nodes.tbody):
            for row in body.findall(nodes.row):
                status = row.children[-1]
                for text in list(status.findall(nodes.Text)):
                    if str(text) in WORDS:
                        text.parent.replace(text, nodes.Text(WORDS[str(text)]))


def setup(app: Sphinx) -> dict:
    app.connect("doctree-resolved", status_in_words)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
