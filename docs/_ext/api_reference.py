"""The API reference lists every public name of ``unitscale``, with no hand-kept list.

``.. unitscale-api::`` renders an autosummary table of ``unitscale.<name>`` for each name in
``unitscale.__all__``; ``.. unitscale-api:: supporting`` does the same for the names that public
modules list in their own ``__all__`` without the package re-exporting them (the row type a
report yields, a type alias a tracer accepts), documented as ``unitscale.<module>.<name>``;
``.. unitscale-api:: modules`` lists the public modules (their docstrings say what each holds).
At ``builder-inited`` the stub pages for all of them are generated into ``docs/generated``
(stale stubs of names no longer public are removed, so they cannot leave orphan pages).

Each object is documented once, under the name users import it by, so references are resolved
by identity: a type hint that autodoc writes with the defining module
(``unitscale.stages.pipeline.PipelineResult``) resolves to where that object is documented
(``unitscale.stages.PipelineResult``), and a bare name in a docstring (``Raises: InputError``)
(or ``ScaleReport.plot``) to the one documented ``unitscale`` object of that name. A class's private helper bases are
replaced by their public ancestors, and a member that the class docstring's ``Attributes:``
already describes (a NamedTuple field, a property) is not described a second time.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
import tempfile
from pathlib import Path

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.application import Sphinx
from sphinx.ext.autosummary import Autosummary
from sphinx.ext.autosummary.generate import generate_autosummary_docs
from sphinx.util.docutils import SphinxDirective

PACKAGE = "unitscale"
STUB_DIR = "docs/generated"  # relative to the source root; the directive lives in docs/api.md
SEPARATELY_DOCUMENTED = {"errors"}  # docs/api.md documents unitscale.errors as a whole


def exported_names() -> list[str]:
    """The package's public names, in ``__all__`` order."""
    return list(importlib.import_module(PACKAGE).__all__)


def public_modules() -> list[str]:
    """``unitscale.<module>`` for every module without a leading underscore."""
    package = importlib.import_module(PACKAGE)
    return [
        f"{PACKAGE}.{info.name}"
        for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name)
        if not info.name.startswith("_") and info.name not in SEPARATELY_DOCUMENTED
    ]


def documented_objects() -> dict[str, object]:
    """Every documented name (``unitscale.X`` first, then ``unitscale.module.X``) -> its object."""
    package = importlib.import_module(PACKAGE)
    documented = {f"{PACKAGE}.{name}": getattr(package, name) for name in package.__all__}
    seen = {id(obj) for obj in documented.values()}
    for module_name in public_modules():
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", []):
            obj = getattr(module, name)
            if id(obj) not in seen:
                seen.add(id(obj))
                documented[f"{module.__name__}.{name}"] = obj
    return documented


def supporting_names() -> list[str]:
    exported = {f"{PACKAGE}.{name}" for name in exported_names()}
    return [name for name in documented_objects() if name not in exported]


class UnitscaleApi(SphinxDirective):
    """An autosummary table (with stub pages) of unitscale's exported or supporting names.

    Use it from reStructuredText (in MyST: an ``{eval-rst}`` block): autosummary writes its
    table cells as reStructuredText roles.
    """

    optional_arguments = 1

    def run(self) -> list[nodes.Node]:
        if self.arguments and self.arguments[0] == "supporting":
            names = supporting_names()
        elif self.arguments and self.arguments[0] == "modules":
            names = public_modules()
        else:
            names = [f"{PACKAGE}.{name}" for name in exported_names()]
        directive = Autosummary(
            "autosummary",
            [],
            {"toctree": "generated", "nosignatures": True},
            StringList(names, source="unitscale.__all__"),
            self.lineno,
            self.content_offset,
            self.block_text,
            self.state,
            self.state_machine,
        )
        return directive.run()


def generate_stubs(app: Sphinx) -> None:
    out = Path(app.srcdir) / STUB_DIR
    out.mkdir(parents=True, exist_ok=True)
    names = [*documented_objects(), *public_modules()]
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
        # a private class, or a mixin from a private module (unitscale.fx._replay.BlockReplay)
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


def setup(app: Sphinx) -> dict:
    app.add_directive("unitscale-api", UnitscaleApi)
    app.connect("builder-inited", generate_stubs)
    app.connect("missing-reference", resolve_documented)
    app.connect("autodoc-process-bases", public_bases)
    app.connect("autodoc-process-docstring", note_described_attributes, priority=600)
    app.connect("autodoc-skip-member", skip_described_members)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
