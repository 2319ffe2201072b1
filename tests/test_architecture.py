"""The house rules of ARCHITECTURE.md, read from the source: every module's imports, parsed with ``ast``.

1. A ``_module`` (or a folder named ``_x``) is private to the package that holds it: no module
   outside that package imports it, and no module imports a ``_name`` from another package.
2. No import cycle between modules (imports inside functions count: a cycle hidden in a
   function is still a cycle).
3. Imports sit at the top of a module; one inside a function, of the package or of any other
   library, carries its reason as a comment on its line (``import torch._dynamo  # 1.5 s: only a
   capture pays it``) or on a comment line heading its run of imports.
4. One name, one thing: no function or class in a package's face hides a module of the same
   name, and the top level holds no example model.
5. A room imports another room's face (a name in its ``__all__``) or a module that room lends
   (listed under "What a room lends another" in ARCHITECTURE.md, the name in its ``__all__``).
6. Only ``capture``'s ``write_origin`` and ``copy_origin`` write a node's origin (``module_path``,
   ``module_type``, ``source``), and fx's ``ModulePathTracer`` its ``module_path``.
7. ``tests/<dir>`` mirrors a package, or is one of the folders :data:`TEST_DIRS_APART`.
8. The top level holds as many names as ARCHITECTURE.md says.
9. The library (``unitscale/**/*.py``, counted as ``wc -l`` counts) is no larger than
   ARCHITECTURE.md says: new work pays for its lines.

``python tests/test_architecture.py`` prints what imports what inside the package, one module a
line: the arrows ARCHITECTURE.md draws, read from the code.

Where code outside ``fx/``, ``examples/`` and the top-level modules broke a rule when the rules
were written, the break is listed below, with the part that owns it, and the test checks the
rest. Each list may only shrink: an entry that no longer occurs fails the test, so a fix
removes its entry.
"""

from __future__ import annotations

import ast
import functools
import importlib
import pkgutil
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import unitscale

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "unitscale"

# Known exceptions to each rule, all empty: an entry needs a reason written beside it.
# (importer, imported): a private module or name of another package.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str]] = set()
# Sets of modules that import each other.
CYCLES_ALLOWED: set[frozenset[str]] = set()
# (module, imported): an import inside a function with no reason written on its line.
LOCAL_IMPORTS_ALLOWED: set[tuple[str, str]] = set()
# package.module where the package's face binds the module's name to a function.
HIDDEN_MODULES_ALLOWED: set[str] = set()
# (importer, imported): a name another room imports past its face, from no module it lends.
# Owner: stages (unitscale.stages, moving into sub-packages): import these from unitscale.capture.toolkit.
FACE_IMPORTS_MOVING: set[tuple[str, str]] = set()
# A lent module without an ``__all__`` (its lent names unlisted). Owner: scaling.
LENT_WITHOUT_ALL: set[str] = {"unitscale.scaling.constant", "unitscale.scaling.softmax_stats"}
# The modules that write a node's origin keys, or a ``node.meta`` key held in a variable.
ORIGIN_WRITERS = {
    "unitscale.capture._meta": "write_origin and copy_origin: the one writer of every route's origin",
    "unitscale.fx.tracers": "ModulePathTracer writes module_path; TaggingTracer the key its user names",
}
# Folders of tests/ that mirror no package, and why.
TEST_DIRS_APART = {
    "site": "the site's own tests (pages, build, browser), not the library's",
    "gpu": "tests that need an accelerator, of every package, run apart",
}
ORIGIN_KEYS = {"MODULE_PATH_KEY", "MODULE_TYPE_KEY", "SOURCE_KEY", "module_path", "module_type", "source"}


@dataclass(frozen=True)
class Import:
    """One imported module or name, where it was imported and how."""

    importer: str  # the module whose code holds the import
    target: str  # the module imported; for ``from m import name`` of a non-module, ``m.name``
    module: str  # the module the target lives in (``target`` itself when it is a module)
    line: int
    local: bool  # inside a function
    reason: str  # the comment on the import's line(s) or heading its run of imports, "" when none
    type_only: bool  # under ``if TYPE_CHECKING:``


def modules() -> dict[str, Path]:
    """Every module of the package by its dotted name (read once per ROOT)."""
    return _modules(ROOT)


@functools.cache
def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _comment(lines: list[str], first: int, last: int) -> str:
    """The comments on source lines ``first``..``last`` (1-based), lint directives left out."""
    found = []
    for text in lines[first - 1 : last]:
        if "#" in text:
            comment = text.split("#", 1)[1].strip()
            if comment and not comment.startswith(("noqa", "type:", "pragma")):
                found.append(comment)
    return " ".join(found)


def _reason(lines: list[str], node: ast.Import | ast.ImportFrom) -> str:
    """The reason written for an import: comments on its lines, or on a comment line just above
    the run of imports it belongs to (one reason may head a block of them)."""
    top = node.lineno
    while top > 1 and lines[top - 2].strip().startswith(("import ", "from ")):
        top -= 1
    head = top - 1 if top > 1 and lines[top - 2].strip().startswith("#") else top
    return _comment(lines, head, node.end_lineno or node.lineno)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(name: str, path: Path, known: set[str]) -> Iterator[Import]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST, local: bool, type_only: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, True, type_only)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                yield from visit(child, local, True)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                yield from resolve(child, local, type_only)
            else:
                yield from visit(child, local, type_only)

    def resolve(node: ast.Import | ast.ImportFrom, local: bool, type_only: bool) -> Iterator[Import]:
        reason = _reason(lines, node)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield Import(name, alias.name, alias.name, node.lineno, local, reason, type_only)
            return
        base = node.module or ""
        if node.level:  # relative: from .x import y
            anchor = name.split(".") if is_package else name.split(".")[:-1]
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        if base.split(".")[0] != PACKAGE:
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in known:
                yield Import(name, full, full, node.lineno, local, reason, type_only)
            else:
                yield Import(name, full, base, node.lineno, local, reason, type_only)

    yield from visit(ast.parse(source, filename=str(path)), False, False)


def all_imports() -> list[Import]:
    """Every import in the package (parsed once per ROOT)."""
    return _all_imports(ROOT)


@functools.cache
def _all_imports(root: Path) -> list[Import]:
    found = _modules(root)
    return [imp for name, path in found.items() for imp in imports_of(name, path, set(found))]


def package_of(module: str) -> str:
    """The package a module belongs to: itself when it is a package (an ``__init__``), else its parent."""
    path = modules()[module]
    return module if path.name == "__init__.py" else module.rpartition(".")[0]


def private_owner(target: str) -> str | None:
    """The package a private module or name is private to (``unitscale.fx`` for
    ``unitscale.fx._module_state`` and for ``unitscale.fx.tracers._check_autowrap``), else None."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            known = modules()
            # a _name inside a plain module is private to that module's package
            if owner in known and known[owner].name != "__init__.py":
                owner = owner.rpartition(".")[0]
            return owner
    return None


def private_imports() -> set[tuple[str, str]]:
    broken = set()
    for imp in all_imports():
        owner = private_owner(imp.target)
        if owner is None:
            continue
        importer_package = package_of(imp.importer)
        if importer_package != owner and not importer_package.startswith(owner + "."):
            broken.add((imp.importer, imp.target))
    return broken


def graph() -> dict[str, set[str]]:
    """Module -> the modules it imports (at run time, wherever in the module the import sits)."""
    edges: dict[str, set[str]] = {name: set() for name in modules()}
    for imp in all_imports():
        if not imp.type_only and imp.module != imp.importer:
            edges[imp.importer].add(imp.module)
    return edges


def cycles() -> set[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    edges = graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.add(frozenset(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def local_imports_without_reason() -> set[tuple[str, str]]:
    """(module, imported) for each import inside a function with no reason beside it: of the
    package (:func:`all_imports`) and of any other library (:func:`_library_imports_in_functions`)."""
    inside = {(imp.importer, imp.target) for imp in all_imports() if imp.local and not imp.reason}
    return inside | _library_imports_in_functions(ROOT)


@functools.cache
def _library_imports_in_functions(root: Path) -> set[tuple[str, str]]:
    """Imports of other libraries inside a function with no reason (:func:`_reason`) beside them."""
    found = set()
    for name, path in _modules(root).items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for function in ast.walk(ast.parse("\n".join(lines), filename=str(path))):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if not isinstance(node, (ast.Import, ast.ImportFrom)) or getattr(node, "level", 0):
                    continue
                target = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (target or "").split(".")[0] == PACKAGE:
                    continue  # the package's own: all_imports() has them
                if not _reason(lines, node):
                    found.add((name, target))
    return found


# -- the rules ---------------------------------------------------------------------------------


def test_no_private_module_or_name_is_imported_from_another_package() -> None:
    broken = private_imports()
    new = sorted(broken - PRIVATE_IMPORTS_ALLOWED)
    assert not new, "make what another package needs public in its package (its __init__), then import that:\n" + (
        "\n".join(f"  {importer} imports {target}" for importer, target in new)
    )
    fixed = sorted(PRIVATE_IMPORTS_ALLOWED - broken)
    assert not fixed, f"fixed, so remove from PRIVATE_IMPORTS_ALLOWED: {fixed}"


def test_no_modules_import_each_other() -> None:
    found = cycles()
    new = [sorted(cycle) for cycle in found - CYCLES_ALLOWED]
    assert not new, f"modules that import each other (move what both need into a third): {new}"
    fixed = [sorted(cycle) for cycle in CYCLES_ALLOWED - found]
    assert not fixed, f"fixed, so remove from CYCLES_ALLOWED: {fixed}"


def test_an_import_inside_a_function_says_why_on_its_line() -> None:
    broken = local_imports_without_reason()
    new = sorted(broken - LOCAL_IMPORTS_ALLOWED)
    assert not new, "move these imports to the top of the module, or write the reason on the line:\n" + (
        "\n".join(f"  {module} imports {target}" for module, target in new)
    )
    fixed = sorted(LOCAL_IMPORTS_ALLOWED - broken)
    assert not fixed, f"fixed, so remove from LOCAL_IMPORTS_ALLOWED: {fixed}"


def test_a_name_in_a_package_is_one_thing_never_a_function_hiding_a_module() -> None:
    """``unitscale.fx.invert`` once hid the module ``unitscale/fx/invert.py``: ``import
    unitscale.fx.invert`` gave a function. Every submodule's name, read as an attribute of its
    package, must be that module."""
    hidden = set()
    for name, path in modules().items():
        if path.name != "__init__.py":
            continue
        package = importlib.import_module(name)
        for info in pkgutil.iter_modules(package.__path__):
            value = getattr(package, info.name, None)
            if value is not None and not isinstance(value, types.ModuleType):
                hidden.add(f"{name}.{info.name}")
    new = sorted(hidden - HIDDEN_MODULES_ALLOWED)
    assert not new, f"a function or class hides the module of the same name (rename the module): {new}"
    fixed = sorted(HIDDEN_MODULES_ALLOWED - hidden)
    assert not fixed, f"fixed, so remove from HIDDEN_MODULES_ALLOWED: {fixed}"


def test_the_top_level_holds_no_example_and_reaches_every_part() -> None:
    examples = [
        name for name in unitscale.__all__ if getattr(unitscale, name).__module__.startswith("unitscale.examples")
    ]
    assert not examples, f"example models belong in unitscale.examples, not the top level: {examples}"
    parts = {info.name for info in pkgutil.iter_modules(unitscale.__path__) if not info.name.startswith("_")}
    assert all(isinstance(getattr(unitscale, part, None), types.ModuleType) for part in parts), parts


def room_of(module: str) -> str | None:
    """``capture`` for ``unitscale.capture._meta``; None for the top-level face."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def lent_modules() -> set[str]:
    """The modules ARCHITECTURE.md lists under "What a room lends another" (``unitscale.fx.nodes``)."""
    page = (ROOT / "ARCHITECTURE.md").read_text()
    match = re.search(r"## What a room lends another.*?\n```\n(.*?)```", page, re.S)
    assert match, "ARCHITECTURE.md has no 'What a room lends another' list"
    paths = [line.split()[0] for line in match.group(1).splitlines() if line.strip()]
    return {f"{PACKAGE}." + path.removesuffix(".py").replace("/", ".") for path in paths}


def listed(module: str) -> list[str] | None:
    """A module's ``__all__``, read from its source (None when it has none)."""
    tree = ast.parse(modules()[module].read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def imports_past_a_face() -> set[tuple[str, str]]:
    """(importer, imported) for each import of another room's name that is neither in that room's
    face (its ``__all__``) nor in the ``__all__`` of a module the room lends."""
    lent, broken = lent_modules(), set()
    for imp in all_imports():
        source, target = room_of(imp.importer), room_of(imp.module)
        if source is None or target is None or source == target or imp.target in lent:
            continue
        name = imp.target.rpartition(".")[2] if imp.target != imp.module else None
        if imp.module == f"{PACKAGE}.{target}":  # the face
            if name is not None and name not in (listed(imp.module) or []):
                broken.add((imp.importer, imp.target))
        elif imp.module not in lent:
            broken.add((imp.importer, imp.target))
        elif name is not None and imp.module not in LENT_WITHOUT_ALL and name not in (listed(imp.module) or []):
            broken.add((imp.importer, imp.target))
    return broken


def meta_writes() -> set[tuple[str, str]]:
    """(module, key) for each ``x.meta[key] = ...`` whose key is an origin key (by name or value) or
    is held in a variable (so may be one): ``key`` as written."""
    found = set()
    for name, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if not (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)):
                    continue
                if target.value.attr != "meta":
                    continue
                key = target.slice
                if isinstance(key, ast.Constant):
                    written = str(key.value)
                elif isinstance(key, ast.Name) and key.id.isupper():
                    written = key.id  # a constant's name: MODULE_PATH_KEY
                else:
                    written = ast.unparse(key)  # a variable: any key
                    found.add((name, written))
                    continue
                if written in ORIGIN_KEYS:
                    found.add((name, written))
    return found


def test_a_room_imports_another_rooms_face_or_a_module_it_lends() -> None:
    broken = imports_past_a_face()
    new = sorted(broken - FACE_IMPORTS_MOVING)
    assert not new, (
        "import the name from the room's face (its __init__ __all__), or from a module the room lends "
        "(ARCHITECTURE.md, 'What a room lends another'; the name in its __all__):\n"
        + "\n".join(f"  {importer} imports {target}" for importer, target in new)
    )
    fixed = sorted(FACE_IMPORTS_MOVING - broken)
    assert not fixed, f"fixed, so remove from FACE_IMPORTS_MOVING: {fixed}"
    missing = sorted(lent for lent in lent_modules() if lent not in modules())
    assert not missing, f"ARCHITECTURE.md lends modules that do not exist: {missing}"


def test_only_capture_writes_a_nodes_origin() -> None:
    writers = {module for module, _ in meta_writes()}
    assert writers <= set(ORIGIN_WRITERS), (
        "write a node's origin with capture's write_origin, or copy it from the node it stands for with "
        f"unitscale.capture.toolkit.copy_origin: {sorted(meta_writes())}"
    )


def test_tests_mirror_the_packages() -> None:
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and any(p.glob("test_*.py"))}
    packages = {name.split(".")[1] for name, path in modules().items() if path.name == "__init__.py" and "." in name}
    apart = sorted(folders - packages - set(TEST_DIRS_APART))
    assert not apart, f"tests/<folder> names a package of unitscale (or is listed in TEST_DIRS_APART): {apart}"


def test_the_top_level_holds_as_many_names_as_the_page_says() -> None:
    match = re.search(r"The top level holds (\d+) names", (ROOT / "ARCHITECTURE.md").read_text())
    assert match, "ARCHITECTURE.md no longer says how many names the top level holds"
    assert len(unitscale.__all__) == int(match.group(1)), unitscale.__all__


def test_the_library_is_no_larger_than_the_page_says() -> None:
    match = re.search(r"The library is at most ([\d,]+) lines", (ROOT / "ARCHITECTURE.md").read_text())
    assert match, "ARCHITECTURE.md no longer says how large the library may be"
    bar = int(match.group(1).replace(",", ""))
    lines = sum(p.read_bytes().count(b"\n") for p in (ROOT / "unitscale").rglob("*.py"))
    assert lines <= bar, (
        f"unitscale/**/*.py holds {lines:,} lines, over the {bar:,} ARCHITECTURE.md allows: cut what the "
        "change repeats (duplicates --change), or say on that page why the bar moves"
    )


# -- the checks check: each rule, on a package made to break it ---------------------------------


@pytest.fixture
def tiny_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A throwaway ``unitscale`` with two parts, ``a`` and ``b``, as ROOT."""
    for folder in ("unitscale", "unitscale/a", "unitscale/b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "unitscale/a/_inner.py").write_text("def _helper():\n    pass\n")
    (tmp_path / "unitscale/a/face.py").write_text("from unitscale.a._inner import _helper\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    return tmp_path


def test_the_rules_pass_a_package_that_keeps_them(tiny_package: Path) -> None:
    (tiny_package / "unitscale/b/user.py").write_text(
        "from unitscale.a import face\n\ndef f():\n    import unitscale.a.face  # cheap to import late: the test\n"
    )
    assert private_imports() == set() and cycles() == set() and local_imports_without_reason() == set()


@pytest.mark.parametrize(
    "source",
    ["from unitscale.a._inner import _helper\n", "from unitscale.a import _inner\n", "import unitscale.a._inner\n"],
)
def test_a_private_module_imported_from_another_package_is_found(tiny_package: Path, source: str) -> None:
    (tiny_package / "unitscale/b/user.py").write_text(source)
    assert {importer for importer, _ in private_imports()} == {"unitscale.b.user"}


def test_a_private_name_of_another_package_is_found(tiny_package: Path) -> None:
    (tiny_package / "unitscale/a/public.py").write_text("def _secret():\n    pass\n")
    (tiny_package / "unitscale/b/user.py").write_text("from unitscale.a.public import _secret\n")
    assert private_imports() == {("unitscale.b.user", "unitscale.a.public._secret")}


def test_a_cycle_through_a_function_and_a_package_face_is_found(tiny_package: Path) -> None:
    (tiny_package / "unitscale/b/__init__.py").write_text("from unitscale.b.one import f\n")
    (tiny_package / "unitscale/b/one.py").write_text("def f():\n    from unitscale.b.two import g  # late\n")
    (tiny_package / "unitscale/b/two.py").write_text("from unitscale.b import f\n\ndef g():\n    pass\n")
    assert cycles() == {frozenset({"unitscale.b", "unitscale.b.one", "unitscale.b.two"})}


def test_a_local_import_without_a_reason_is_found_and_a_lint_directive_is_no_reason(tiny_package: Path) -> None:
    (tiny_package / "unitscale/b/user.py").write_text(
        "def f():\n    from unitscale.a import face  # noqa: F401\n\n"
        "def g():\n    import unitscale.a.face  # needed late: it is slow\n"
    )
    assert local_imports_without_reason() == {("unitscale.b.user", "unitscale.a.face")}


def test_a_library_imported_late_needs_a_reason_too(tiny_package: Path) -> None:
    (tiny_package / "unitscale/b/user.py").write_text(
        "def f():\n    import json\n\n"
        "def g():\n    # lazy: slow to import\n    import csv\n    from os import path\n\n"
        "def h():\n    from math import pi  # lazy: the reason on the line\n"
    )
    assert local_imports_without_reason() == {("unitscale.b.user", "json")}


def test_an_origin_written_outside_capture_is_found(tiny_package: Path) -> None:
    (tiny_package / "unitscale/b/user.py").write_text(
        "def f(node, other, key):\n    node.meta['module_path'] = ''\n    node.meta[SOURCE_KEY] = ''\n"
        "    node.meta[key] = other.meta[key]\n    node.meta['val'] = 1\n    node.meta[KEPT_KEY] = 1\n"
    )
    assert meta_writes() == {("unitscale.b.user", "module_path"), ("unitscale.b.user", "SOURCE_KEY")} | {
        ("unitscale.b.user", "key")
    }


def test_an_import_past_a_face_is_found(tiny_package: Path) -> None:
    (tiny_package / "unitscale/a/face.py").write_text("__all__ = ['lent']\nlent = 1\nnot_lent = 2\n")
    (tiny_package / "unitscale/b/user.py").write_text("from unitscale.a.face import lent, not_lent\n")
    (tiny_package / "ARCHITECTURE.md").write_text("## What a room lends another\n\n```\na/face.py  x\n```\n")
    assert imports_past_a_face() == {("unitscale.b.user", "unitscale.a.face.not_lent")}


if __name__ == "__main__":  # the arrows, read from the code
    for importer, imported in sorted(graph().items()):
        if imported:
            print(f"{importer} -> {', '.join(sorted(imported))}")
