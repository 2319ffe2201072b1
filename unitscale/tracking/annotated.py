"""Scale tracking's code view: the captured graph's code, each line annotated with its scales.

:func:`~unitscale.tracking.analyse_module` returns what :func:`annotated_code` writes from a
:class:`~unitscale.tracking.ScaleReport`'s rows and the :class:`~unitscale.capture.Capture`
they were recorded on: the fx route's code as ``torch.fx`` writes it, the exported graph's
(aten ops, each line with its module path), or, for the eager route, one line per op.
"""

from __future__ import annotations

import functools
import html
import re
import sys
import textwrap
from typing import Any

from pygments import highlight
from pygments.formatters import HtmlFormatter, TerminalFormatter
from pygments.lexers import PythonLexer

from unitscale.capture import Capture
from unitscale.fx.nodes import MODULE_PATH_KEY
from unitscale.tracking.report import ScaleRow

__all__ = ["AnnotatedCode", "annotated_code"]

_ASSIGN = re.compile(r"^\s*(\w+) = ")
_CLEANUP = re.compile(r";  (?:\w+ = )+None$")


@functools.lru_cache(maxsize=16)
def _code_lines(code: str) -> tuple[tuple[str, str | None], ...]:
    """The code's non-blank lines without fx's ``x = None`` clean-ups, each with the name it assigns."""
    lines = []
    for line in code.strip("\n").splitlines():
        line = _CLEANUP.sub("", line.rstrip())
        if line.strip():
            match = _ASSIGN.match(line)
            lines.append((line, match.group(1) if match else None))
    return tuple(lines)


def _marked(row: ScaleRow) -> str:
    """A row's scales, with a marker when a NaN or infinity reached it."""
    return f"{row.scale} NON-FINITE" if not row.finite else str(row.scale)


def annotated_code(cap: Capture, rows: list[ScaleRow], model: str, code: str | None = None) -> str:
    """The code of ``cap`` (or its op listing) with each line's ``(-> forward, <- backward)`` scales.

    Args:
        cap: the capture the rows were recorded on.
        rows: the report's rows.
        model: the model's name, for the listing's first line.
        code: the graph's code, where the caller has it (the compiled tracking's); ``None``:
            ``cap.python_code()``.

    Returns:
        The annotated text (plain; :class:`AnnotatedCode` highlights it).

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.tracking import track_scales
    >>> from unitscale.tracking.annotated import annotated_code
    >>> class Double(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x * 2
    >>> x = torch.tensor([1.0, -1.0]).requires_grad_()
    >>> grad = torch.tensor([1.0, -1.0])
    >>> report = track_scales(Double(), x, grad)
    >>> cap = capture(Double(), x, deep=DeepTracing())
    >>> print(annotated_code(cap, list(report.rows), "Double"))
    def forward(self, x):  # x (-> 1.0, <- 2.0)
        mul = x * 2  # (-> 2.0, <- 1.0)
        return mul
    """
    by_name = {r.node: r for r in rows}
    if cap.graph_module is None:
        return _listing(rows, model, cap.reasons.get("fx", ""))
    code = cap.python_code()[0] if code is None else code
    lines = []
    if cap.route == "fx":
        inputs = [n.name for n in cap.graph_module.graph.nodes if n.op == "placeholder" and n.name in by_name]
        for line, name in _code_lines(code):
            if line.startswith("def forward") and inputs:
                line += "  # " + ", ".join(f"{x} {_marked(by_name[x])}" for x in inputs)
            elif name in by_name:
                line += f"  # {_marked(by_name[name])}"
            lines.append(line)
        return "\n".join(lines)
    paths = {n.name: n.meta.get(MODULE_PATH_KEY, "") for n in cap.graph_module.graph.nodes}
    lines.append(f"# {model}: captured by {_CAPTURED_BY.get(cap.route, cap.route)}")
    for line, name in _code_lines(code):
        if name in by_name:
            line += f"  # {_marked(by_name[name])}" + (f"  {paths[name]}" if paths.get(name) else "")
        lines.append(line)
    return "\n".join(lines)


_CAPTURED_BY = {"export": "torch.export", "export-strict": "torch.export (strict)", "dynamo": "TorchDynamo"}


def _listing(rows: list[ScaleRow], model: str, failure: str) -> str:
    width = max([len(r.node) for r in rows] + [4])
    why = f"; {failure.removeprefix('TraceError: ')}" if failure else ""
    # the reason can be a long sentence: wrapped as comment lines, so the listing fits a page
    header = textwrap.wrap(f"{model}: ops recorded as they ran{why}", 86, break_on_hyphens=False)
    lines = [f"# {part}" for part in header]
    for r in rows:
        where = f" in {r.module_path}" if r.module_path else ""
        lines.append(f"{r.node.ljust(width)}  # {_marked(r)}  {r.op}{where}")
    return "\n".join(lines)


class AnnotatedCode(str):
    """Code annotated with scales: a ``str`` that highlights itself for its reader.

    ``print()`` shows ANSI-highlighted code in a terminal (plain text elsewhere), a
    notebook shows HTML-highlighted code, and ``repr`` (doctests, the REPL) shows the
    plain text. Set ``highlight=False`` for plain text everywhere.

    Args:
        text: the code.
        highlight: highlight with pygments where the reader supports it.

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
