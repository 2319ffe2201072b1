"""What a tool built on :func:`~unitscale.capture.capture` uses beside it to read, rewrite or re-run its graph.

>>> from unitscale.capture.toolkit import GRAPH_ROUTE_NAMES
>>> GRAPH_ROUTE_NAMES  # the routes that give a graph
('fx', 'export', 'export-strict', 'dynamo')
"""

from collections.abc import Sequence
from html import escape

from unitscale.capture._cache import call_state
from unitscale.capture._capture import GRAPH_ROUTE_NAMES
from unitscale.capture._dynamo import DynamoGraph, dynamo_graph, no_torch_function_modes
from unitscale.capture._eager import OpRecorder
from unitscale.capture._meta import copy_origin, normalise_graph, normalise_path, stack_entries
from unitscale.capture._verify import flat_graph_inputs
from unitscale.fx.module_state import hook_key

__all__ = [
    "normalise_graph",
    "normalise_path",
    "stack_entries",
    "copy_origin",
    "DynamoGraph",
    "dynamo_graph",
    "no_torch_function_modes",
    "flat_graph_inputs",
    "call_state",
    "hook_key",
    "GRAPH_ROUTE_NAMES",
    "OpRecorder",
    "html_table",
]


def html_table(header: Sequence[str], body: Sequence[Sequence[str]], note: str = "") -> str:
    """An HTML table for a notebook that a phone's column holds; every cell and ``note`` line is escaped.

    ``header[0]``/``header[1]`` and each row's first two cells are the row's name and a small
    line under it; the other cells follow, scrolling in the box.

    >>> from unitscale.capture.toolkit import html_table
    >>> html = html_table(["node", "op", "std"], [["fc.w", "param", "0.5"]], "1 row")
    >>> "<td>fc.<wbr>w<br><small>param</small></td><td>0.5</td>" in html
    True
    """

    def name(cell: str, sub: str, tag: str) -> str:
        return f"<{tag}>{breakable(cell)}<br><small>{breakable(sub)}</small></{tag}>"

    def breakable(text: str) -> str:
        return escape(text).replace(".", ".<wbr>")

    head = name(header[0], header[1], "th") + "".join(f"<th>{escape(h)}</th>" for h in header[2:])
    rows = "".join(
        "<tr>" + name(line[0], line[1], "td") + "".join(f"<td>{escape(c)}</td>" for c in line[2:]) + "</tr>"
        for line in body
    )
    caption = "<br>".join(escape(line) for line in note.splitlines())
    return (
        '<div class="unitscale-table" style="overflow-x: auto; max-width: 100%">'
        f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></div>"
        + (f'<p class="unitscale-table-note">{caption}</p>' if caption else "")
    )
