"""Scale tracking's code view: :class:`AnnotatedCode`, the annotated code of a report, highlighted."""

from __future__ import annotations

import html
import sys
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter, TerminalFormatter
from pygments.lexers import PythonLexer

__all__ = ["AnnotatedCode"]


class AnnotatedCode(str):
    """Code annotated with scales: a ``str`` that highlights itself for its reader.

    ``print()`` shows ANSI-highlighted code in a terminal (plain text elsewhere), a
    notebook shows HTML-highlighted code, and ``repr`` (doctests, the REPL) shows the
    plain text. Set ``highlight=False`` for plain text everywhere.

    >>> from unitscale.tracking import AnnotatedCode
    >>> code = AnnotatedCode("y = f(x)  # (-> 1.0, <- 0.5)")
    >>> code
    y = f(x)  # (-> 1.0, <- 0.5)
    >>> "<span" in code._repr_html_()
    True
    """

    highlight: bool

    def __new__(cls, text: str, highlight: bool = True) -> AnnotatedCode:
        obj = super().__new__(cls, text)
        obj.highlight = highlight
        return obj

    def __reduce__(self) -> tuple[Any, ...]:
        return (AnnotatedCode, (str(self.plain), self.highlight))

    @property
    def plain(self) -> str:
        """The text without highlighting."""
        return str.__str__(self)

    def __str__(self) -> str:
        if self.highlight and sys.stdout.isatty():
            return highlight(self.plain, PythonLexer(), TerminalFormatter()).rstrip("\n")
        return self.plain

    def __repr__(self) -> str:
        return self.plain

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))

    def _repr_html_(self) -> str | None:
        if not self.highlight:
            return f"<pre>{html.escape(self.plain)}</pre>"
        return highlight(self.plain, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))
