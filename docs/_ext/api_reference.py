"""The API reference documents the public surface, grouped by task, with no hand-kept list of names.

The public surface is ``unitscale.__all__`` plus the ``__all__`` of each *namespace*: every
subpackage (a folder with an ``__init__.py``, found at build time, so a new one such as
``unitscale.capture`` is picked up without editing this file), every subpackage of a subpackage
(the rooms of ``unitscale.stages``: ``unitscale.stages.planner``, ...), listed right after the
package that holds it, and the plain modules users import as namespaces
(``unitscale.functional``, ``unitscale.nn``, ``unitscale.formats``, ``unitscale.errors``). What
a plain module lists in its own ``__all__`` is internal and not documented.

``.. unitscale-api:: unitscale.fx unitscale.capture`` renders one autosummary table: each
namespace named (its page says what it holds), then the names it exports; ``others`` among
the arguments adds the namespaces that no ``unitscale-api`` directive of the reference's pages
names (a new subpackage lands there until a page places it). The reference is
``docs/api.md``, an index, and one page per group in ``docs/api/``: the sidebar then lists the
groups, and under the open group only its names. A name is listed once, in the table
of the first namespace (in reference order, ``ORDER``) that exports it, and documented under
the name users import it by: ``unitscale.<name>`` when the package exports it, else
``unitscale.<namespace>.<name>`` (``unitscale.stages.planner.plan_chain`` for a room's name).
At ``builder-inited`` the stub pages for all of them are generated into ``docs/generated``
(stale stubs of names no longer public are removed, so they cannot leave orphan pages).

Each object is documented once, so references are resolved by identity: a type hint that
autodoc writes with the defining module (``unitscale.stages.runtime.pipeline.PipelineResult``)
resolves to where that object is documented (``unitscale.stages.PipelineResult``), and a
bare name in a docstring (``Raises: InputError``) (or ``ScaleReport.plot``) to the one
documented ``unitscale`` object of that name. A class's private helper bases are replaced by
their public ancestors, and a member that the class docstring's ``Attributes:`` already
describes (a NamedTuple field, a property) is not described a second time.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pkgutil
import re
import tempfile
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.ext.autosummary import Autosummary
from sphinx.ext.autosummary.generate import generate_autosummary_docs
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

PACKAGE = "unitscale"
STUB_DIR = "docs/generated"  # relative to the source root
GROUP_DIR = "docs/api"  # the reference's pages, one per group, each with its unitscale-api directives
# Plain modules (not folders) that users import as namespaces (``functional`` and ``nn`` are
# listed too in case they are plain modules: as folders they are found as subpackages anyway).
NAMESPACE_MODULES = ("functional", "nn", "formats", "errors")
# Reference order: a name exported by two namespaces is listed under the first.
ORDER = ("capture", "fx", "tracking", "functional", "nn", "scaling", "formats", "transforms", "stages", "examples")
OTHERS = "others"
_DIRECTIVE = re.compile(r"^\.\. unitscale-api::(.*)$", re.M)


def exported_names() -> list[str]:
    """The package's public names, in ``__all__`` order."""
    return list(importlib.import_module(PACKAGE).__all__)


def namespaces() -> list[str]:
    """``unitscale.<name>`` of every subpackage and namespace module, in reference order, each
    followed by its own subpackages (``unitscale.<name>.<room>``, alphabetically)."""
    package = importlib.import_module(PACKAGE)
    found = {
        info.name
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_") and (info.ispkg or info.name in NAMESPACE_MODULES)
    }
    ordered = [name for name in ORDER if name in found] + sorted(found - set(ORDER))
    result = []
    for name in ordered:
        result.append(f"{PACKAGE}.{name}")
        module = importlib.import_module(f"{PACKAGE}.{name}")
        rooms = pkgutil.iter_modules(getattr(module, "__path__", []))
        result += sorted(f"{PACKAGE}.{name}.{room.name}" for room in rooms if room.ispkg and room.name[0] != "_")
    return result


def namespace_names(namespace: str) -> list[str]:
    """The names ``namespace`` exports: its ``__all__``, else the public classes and functions it defines."""
    module = importlib.import_module(namespace)
    if hasattr(module, "__all__"):
        return list(module.__all__)
    return [
        name
        for name, obj in vars(module).items()
        if not name.startswith("_") and getattr(obj, "__module__", None) == namespace
    ]


def _public() -> list[tuple[str, str, object]]:
    """``(namespace, name, object)`` for every export: the package's first, then each namespace's."""
    package = importlib.import_module(PACKAGE)
    rows = [(PACKAGE, name, getattr(package, name)) for name in package.__all__]
    for namespace in namespaces():
        module = importlib.import_module(namespace)
        rows += [(namespace, name, getattr(module, name)) for name in namespace_names(namespace)]
    return rows


def documented_objects() -> dict[str, object]:
    """Every documented name (``unitscale.X`` first, then ``unitscale.<namespace>.X``) -> its object."""
    documented: dict[str, object] = {}
    seen: set[int] = set()
    for namespace, name, obj in _public():
        if id(obj) not in seen:
            seen.add(id(obj))
            documented[f"{namespace}.{name}"] = obj
    return documented


def names_in(namespace: str) -> list[str]:
    """The documented names that ``namespace``'s table lists: what it exports and no earlier namespace does."""
    name_of = {id(obj): name for name, obj in documented_objects().items()}
    owner: dict[int, str] = {}
    for ns, _, obj in _public():
        if ns != PACKAGE:
            owner.setdefault(id(obj), ns)
    module = importlib.import_module(namespace)
    objects = [getattr(module, name) for name in namespace_names(namespace)]
    return list(dict.fromkeys(name_of[id(obj)] for obj in objects if owner[id(obj)] == namespace))


def unowned_names() -> list[str]:
    """Names of ``unitscale.__all__`` that no namespace exports (listed with the ``others``)."""
    in_namespaces = {id(obj) for ns, _, obj in _public() if ns != PACKAGE}
    return [name for name, obj in documented_objects().items() if id(obj) not in in_namespaces]


def group_pages(srcdir: Path) -> str:
    """The source text of every page of the reference (``docs/api/*.md``), one after another."""
    return "\n".join(page.read_text(encoding="utf-8") for page in sorted((srcdir / GROUP_DIR).glob("*.md")))


def listed_namespaces(page: str) -> list[str]:
    """The namespaces the ``unitscale-api`` directives in ``page`` (source text) name."""
    return [arg for args in _DIRECTIVE.findall(page) for arg in args.split() if arg != OTHERS]


def table(arguments: list[str], page: str) -> list[str]:
    """The rows of a ``unitscale-api`` table: each namespace named, then its names.

    ``others`` stands for the namespaces no directive in ``page`` names (a new subpackage),
    and the package's own exports that no namespace holds.
    """
    rows: list[str] = []
    for argument in arguments:
        if argument == OTHERS:
            listed = set(listed_namespaces(page))
            rows += unowned_names()
            for namespace in namespaces():
                if namespace not in listed:
                    rows += [namespace, *names_in(namespace)]
        else:
            rows += [argument, *names_in(argument)]
    return list(dict.fromkeys(rows))


class UnitscaleApi(SphinxDirective):
    """An autosummary table (with stub pages, listed under this page) of the namespaces named and their names.

    Use it from reStructuredText (in MyST: an ``{eval-rst}`` block): autosummary writes its
    table cells as reStructuredText roles.
    """

    required_arguments = 1
    final_argument_whitespace = True

    def run(self) -> list[nodes.Node]:
        arguments = self.arguments[0].split()
        unknown = [arg for arg in arguments if arg != OTHERS and arg not in namespaces()]
        if unknown:
            raise self.error(f"unitscale-api: {unknown} are not namespaces of {PACKAGE}; known: {namespaces()}")
        names = table(arguments, group_pages(Path(self.env.srcdir)))
        here = Path(self.env.doc2path(self.env.docname)).parent
        stubs = os.path.relpath(Path(self.env.srcdir) / STUB_DIR, here)  # the toctree is relative to this page
        directive = Autosummary(
            "autosummary",
            [],
            {"toctree": stubs, "nosignatures": True},
            StringList(names, source="unitscale-api"),
            self.lineno,
            self.content_offset,
            self.block_text,
            self.state,
            self.state_machine,
        )
        result = directive.run()
        for toc in (toc for node in result for toc in node.findall(addnodes.toctree)):
            toc["entries"] = [(sidebar_title(docname), docname) for _, docname in toc["entries"]]
        return result


def sidebar_title(docname: str) -> str:
    """The sidebar's name for a stub page: ``track_scales``, not ``unitscale.track_scales``.

    The group page above it in the sidebar says where the name lives, and the page's own
    title keeps the full name; a namespace keeps its full name (``unitscale.tracking``).
    """
    name = docname.rsplit("/", 1)[-1]
    return name if name in namespaces() else name.rsplit(".", 1)[-1]


def generate_stubs(app: Sphinx) -> None:
    out = Path(app.srcdir) / STUB_DIR
    out.mkdir(parents=True, exist_ok=True)
    names = [*documented_objects(), *namespaces()]
    wanted = {f"{name}.rst" for name in names}
    for stale in out.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()
    with tempfile.TemporaryDirectory() as tmp:
        listing = Path(tmp) / "api.rst"
        listing.write_text(
            f".. autosummary::\n   :toctree: {out}\n\n" + "".join(f"   {name}\n" for name in names),
            encoding="utf-8",
        )
        generate_autosummary_docs([str(listing)], app=app, suffix=".rst", overwrite=False)


def import_target(target: str) -> tuple[bool, object]:
    """Import ``a.b.C.d`` as an attribute chain after the longest importable module prefix."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False, None
        return True, obj
    return False, None


def documented_name(target: str, domain) -> str | None:
    if target.startswith(PACKAGE + "."):
        found, obj = import_target(target)
        if not found:
            return None
        for name, documented in documented_objects().items():
            if documented is obj:
                return name
        # a member of a documented class: unitscale._report.ScaleReport.plot
        head, _, member = target.rpartition(".")
        owner = documented_name(head, domain) if "." in head else None
        return f"{owner}.{member}" if owner else None
    if all(part.isidentifier() for part in target.split(".")):
        found = sorted(
            {
                name
                for name, entry in domain.objects.items()
                # not autodoc's `:canonical:` aliases: one object, one name
                if name.startswith(PACKAGE + ".") and name.endswith("." + target) and not entry.aliased
            },
            key=lambda name: (name.count("."), name),  # the exported unitscale.<Name> first
        )
        if len(found) == 1 or (found and found[0] == f"{PACKAGE}.{target}"):
            return found[0]
    return None


def resolve_documented(app: Sphinx, env, node: nodes.Element, contnode: nodes.Element):
    if node.get("refdomain") != "py":
        return None
    domain = env.domains["py"]
    alias = documented_name(node.get("reftarget", ""), domain)
    if alias is None or alias == node.get("reftarget"):
        return None
    resolved = domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], alias, node, contnode)
    if resolved is None:  # the same object named with another role (:exc: for a class)
        matches = domain.resolve_any_xref(env, node["refdoc"], app.builder, alias, node, contnode)
        resolved = matches[0][1] if matches else None
    return resolved


def public_bases(app: Sphinx, name: str, obj: type, options: dict, bases: list[type]) -> None:
    def public(base: type) -> list[type]:
        # a private class, or a mixin from a private module (unitscale.fx._name)
        private_module = any(part.startswith("_") for part in base.__module__.split("."))
        if not base.__name__.startswith("_") and not (private_module and base.__module__.startswith(PACKAGE)):
            return [base]
        return [b for parent in base.__bases__ if parent is not object for b in public(parent)]

    bases[:] = list(dict.fromkeys(b for base in bases for b in public(base))) or [object]


_described_attributes: set[str] = set()  # of the class autodoc is documenting right now


def note_described_attributes(app: Sphinx, what: str, name: str, obj: object, options: dict, lines: list[str]) -> None:
    """Remember the attributes a class docstring's ``Attributes:`` section describes.

    Runs after napoleon, which has turned that section into ``.. attribute::`` directives.
    autodoc processes a class's docstring right before it filters the class's members.
    """
    if what == "class":
        _described_attributes.clear()
        _described_attributes.update(m.group(1) for line in lines if (m := _ATTRIBUTE.match(line)))


_ATTRIBUTE = re.compile(r"^\s*\.\. attribute:: (\w+)")


def skip_described_members(app: Sphinx, what: str, name: str, obj: object, skip: bool, options: dict) -> bool | None:
    """Describe a member once: a NamedTuple's fields and the attributes (and properties) a class
    docstring's ``Attributes:`` section describes are not documented again as members."""
    if what == "class" and (name in _described_attributes or type(obj).__name__ == "_tuplegetter"):
        return True
    return None


def _defining_attr_doc(obj: object, short: str) -> list[str] | None:
    """The ``#:`` or string docstring of the module attribute that first bound ``obj`` as ``short``."""
    package = importlib.import_module(PACKAGE)
    for info in pkgutil.walk_packages(package.__path__, PACKAGE + "."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:
            continue
        if getattr(module, short, None) is not obj:
            continue
        docs = ModuleAnalyzer.for_module(info.name).find_attr_docs()
        if ("", short) in docs:
            return list(docs[("", short)])
    return None


def data_docstring(app: Sphinx, what: str, name: str, obj: object, options: dict, lines: list[str]) -> None:
    """A re-exported constant (``unitscale.functional.torch_map``) keeps the docstring written where it
    is defined; without this, autodoc finds none at the import path and shows its type's (``dict``)."""
    if what not in ("data", "attribute") or not name.startswith(PACKAGE + "."):
        return
    type_doc = inspect.getdoc(type(obj)) or ""
    if lines and not type_doc.startswith(lines[0].strip()):
        return  # it has a docstring of its own
    found = _defining_attr_doc(obj, name.rpartition(".")[2])
    if found is not None:
        lines[:] = found


def setup(app: Sphinx) -> dict:
    app.add_directive("unitscale-api", UnitscaleApi)
    app.connect("builder-inited", generate_stubs)
    app.connect("missing-reference", resolve_documented)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("autodoc-process-docstring", data_docstring, priority=400)
    app.connect("autodoc-process-docstring", note_described_attributes, priority=600)
    app.connect("autodoc-skip-member", skip_described_members)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":  # `python docs/_ext/api_reference.py`: the tables the reference gets, without Sphinx
    page = group_pages(Path(__file__).resolve().parents[2])
    for arguments in _DIRECTIVE.findall(page):
        print(f"unitscale-api::{arguments}")
        for row in table(arguments.split(), page):
            print(f"    {row}")
