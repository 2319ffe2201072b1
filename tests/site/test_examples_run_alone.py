"""Every docstring example runs when pasted into a fresh interpreter.

``pytest --doctest-modules`` runs an example with the globals of the module that holds it, so an
example that uses ``torch`` or ``partition`` without importing it passes there and fails for the
reader who pastes it. Here each example of the public surface (the names the API reference
documents, their methods and properties defined in unitscale) and of every module docstring runs
with ``globs={}``, under the option flags of the doctest run.
"""

import doctest
import importlib
import inspect
import pkgutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import api_reference  # noqa: E402

# pyproject.toml sets no `doctest_optionflags`, so the doctest run uses pytest's default, ELLIPSIS.
OPTIONFLAGS = doctest.ELLIPSIS


def _members(cls: type) -> Iterator[tuple[str, object]]:
    """Methods and properties a unitscale class defines itself (not those torch or object give it)."""
    for name, attr in vars(cls).items():
        if name.startswith("_") and name != "__call__":
            continue
        function = attr.fget if isinstance(attr, property) else getattr(attr, "__func__", attr)
        if inspect.isfunction(function) and function.__module__.startswith(api_reference.PACKAGE):
            yield name, attr


def _docstrings() -> Iterator[tuple[str, str]]:
    """``(name, docstring)`` of every public object, their members, and every module, each once."""
    seen: set[int] = set()
    for name, obj in api_reference.documented_objects().items():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj):
            yield name, obj.__doc__ or ""
        else:  # a constant: its docstring is the one written where it is bound, not its type's
            yield name, "\n".join(api_reference._defining_attr_doc(obj, name.rsplit(".", 1)[1]) or [])
        if inspect.isclass(obj):
            for member, attr in _members(obj):
                if id(attr) not in seen:
                    seen.add(id(attr))
                    yield f"{name}.{member}", attr.__doc__ or ""
    package = importlib.import_module(api_reference.PACKAGE)
    yield package.__name__, package.__doc__ or ""
    for info in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
        yield info.name, importlib.import_module(info.name).__doc__ or ""


def _failures(name: str, docstring: str) -> str | None:
    """The report of the first failing example of ``docstring`` run in a fresh namespace, or None."""
    # a pasted session starts with nothing imported; its one global is `__name__` (fx and pickle read it)
    globs = {"__name__": "__main__"}
    test = doctest.DocTestParser().get_doctest(docstring, globs=globs, name=name, filename=name, lineno=0)
    if not test.examples:
        return None
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS | doctest.REPORT_ONLY_FIRST_FAILURE)
    # unitscale's own sources stay the only state shared between examples: nothing leaks in globs
    results = runner.run(test, out=report.append, clear_globs=True)
    return "".join(report) if results.failed else None


def test_every_docstring_example_runs_in_a_fresh_namespace():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: one thread is fastest, and leaves the other core free
    try:
        failures = {name: report for name, doc in _docstrings() if (report := _failures(name, doc))}
    finally:
        torch.set_num_threads(threads)
    details = "\n".join(report[-1500:] for report in failures.values())
    assert not failures, f"{len(failures)} examples fail when pasted alone: {sorted(failures)}\n{details}"


def test_an_example_missing_an_import_is_caught():
    doc = """Example:
        >>> torch.zeros(2).shape
        torch.Size([2])
    """
    assert "NameError: name 'torch' is not defined" in (_failures("missing", doc) or "")
    assert _failures("fine", doc.replace(">>> torch", ">>> import torch\n        >>> torch")) is None


@pytest.mark.parametrize("name", ["unitscale.partition", "unitscale.track_scales"])
def test_the_public_surface_is_collected(name):
    assert name in dict(_docstrings())
