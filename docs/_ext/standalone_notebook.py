"""A tutorial as the notebook a reader downloads: executed, and readable without Sphinx.

The site renders MyST roles in a tutorial's Markdown cells (``{glue:text}`key:.3f```,
``{func}`unitscale.partition```, ``{doc}`02_custom_tracers```); Jupyter shows them as raw text.
:func:`standalone` rewrites each one as what the page shows: a glued value formatted with the
role's format spec (by MyST-NB's own ``format_plain_text``, so the numbers equal the page's), an
object's name in backticks (``unitscale.partition()``, as Sphinx writes it), a page's title.
A role this module cannot render raises :class:`UnrenderableRole` (the build fails) rather than
leaving role text for the reader.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import nbformat

# MyST's role syntax; no role in our pages holds a backtick
ROLE = re.compile(r"\{(?P<name>[\w:.+-]+)\}`(?P<content>[^`]*)`")
_TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.S)
_OBJECT_ROLES = {"class", "data", "attr", "exc", "mod", "obj", "const", "type", "any", "ref", "envvar"}
_CALLABLE_ROLES = {"func", "meth"}  # Sphinx adds "()" to these (add_function_parentheses)
_WORD_ROLES = {"fas", "far", "fab", "octicon", "sub", "sup", "abbr", "kbd", "guilabel", "menuselection", "command"}
_GLUE_ROLES = {"glue", "glue:", "glue:any", "glue:text", "glue:md"}


class UnrenderableRole(ValueError):
    """A role in a Markdown cell that the standalone notebook cannot show as the page does."""


Glue = Mapping[str, Mapping[str, Any]]  # key -> the glued value's mime bundle
Formatter = Callable[[str, str], str]  # (text/plain, format spec) -> text


def glued_text(role: str, content: str, glue: Glue, fmt_plain: Formatter) -> str:
    """The text a glue role shows: the value's ``text/plain`` (``text/markdown`` for ``glue:md``), formatted."""
    if "::" in content:
        raise UnrenderableRole(f"{{{role}}}`{content}` glues from another page; glue the value on this page")
    key, fmt = content, ""
    if role == "glue:text" and ":" in content:  # `key:format_spec`, as MyST-NB's PasteTextRole splits it
        key, fmt = content.rsplit(":", 1)
    if key not in glue:
        raise UnrenderableRole(f"{{{role}}}`{content}`: no value glued as {key!r} (glued: {sorted(glue)})")
    data = glue[key]
    if role == "glue:md":
        return str(data["text/markdown"])
    return fmt_plain(str(data["text/plain"]), fmt)


def render_role(
    role: str,
    content: str,
    glue: Glue,
    fmt_plain: Formatter,
    doc_title: Callable[[str], str],
) -> str:
    """What the site shows for ``{role}`content```, as plain Markdown."""
    if role in _GLUE_ROLES:
        return glued_text(role, content, glue, fmt_plain)
    titled = _TITLED.match(content)
    title, target = (titled["title"], titled["target"]) if titled else (None, content)
    if role == "doc":
        return title or doc_title(target)
    if role == "math":
        return f"${content}$"
    if role in _WORD_ROLES:
        return content
    if role == "term":  # a glossary word, as the page shows it: prose, not code
        return title or target
    short = target.lstrip("!")
    if short.startswith("~"):
        short = short[1:].rsplit(".", 1)[-1]
    if role in _CALLABLE_ROLES or role.endswith((":func", ":meth")):
        return f"`{title}`" if title else f"`{short}()`"
    if role in _OBJECT_ROLES or ":" in role:  # py:class, std:ref, ...
        return f"`{title or short}`"
    raise UnrenderableRole(f"{{{role}}}`{content}`: no plain-Markdown rendering for the role {role!r}")


def render_markdown(
    text: str,
    glue: Glue,
    fmt_plain: Formatter,
    doc_title: Callable[[str], str],
) -> str:
    """``text`` with every MyST role replaced by :func:`render_role`'s rendering."""
    return ROLE.sub(lambda m: render_role(m["name"], m["content"], glue, fmt_plain, doc_title), text)


#: the output metadata that carries a figure's phone rendering (``figure_widths.METADATA_KEY``)
FIGURE_KEY = "unitscale_site_figure"


def _is_hidden_glue(output: Mapping[str, Any]) -> bool:
    """A ``glue(..., display=False)`` record: data that only the site reads (MyST-NB's scrapbook convention)."""
    return bool(output.get("metadata", {}).get("scrapbook", {}).get("mime_prefix"))


def standalone(
    executed: nbformat.NotebookNode,
    glue: Glue,
    fmt_plain: Formatter,
    doc_title: Callable[[str], str],
) -> nbformat.NotebookNode:
    """A copy of the executed notebook with its outputs, roles rendered, and no Sphinx-only metadata."""
    notebook = nbformat.from_dict(executed)
    for key in ("jupytext", "source_map", "mystnb"):
        notebook.metadata.pop(key, None)
    for cell in notebook.cells:
        if cell.cell_type == "markdown":
            cell.source = render_markdown(cell.source, glue, fmt_plain, doc_title)
        elif cell.cell_type == "code":
            cell.outputs = [output for output in cell.outputs if not _is_hidden_glue(output)]
            for output in cell.outputs:  # a figure's phone rendering is the site's (figure_widths)
                output.get("metadata", {}).get("image/png", {}).pop(FIGURE_KEY, None)
    nbformat.validate(notebook)
    return notebook
