"""The API reference is complete and every public name carries a runnable example."""

import importlib
import inspect
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import pytest

import unitscale

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import api_reference  # noqa: E402


@pytest.mark.parametrize("name", unitscale.__all__)
def test_every_public_name_has_a_docstring_example(name):
    doc = inspect.getdoc(getattr(unitscale, name)) or ""
    assert ">>>" in doc, f"unitscale.{name} needs a docstring with a runnable `>>>` example"


API_PAGE = api_reference.group_pages(ROOT)  # the reference's pages, one per group, docs/api/*.md


def _tables() -> list[list[str]]:
    """The rows of every ``unitscale-api`` table of the reference, as the extension builds them."""
    return [
        api_reference.table(args.split(), API_PAGE)
        for args in re.findall(r"^\.\. unitscale-api::(.*)$", API_PAGE, re.M)
    ]


def test_namespaces_are_every_subpackage_and_the_namespace_modules():
    package_dir = Path(unitscale.__file__).parent
    subpackages = {
        ".".join(p.parent.relative_to(package_dir).parts)
        for pattern in ("*/__init__.py", "*/*/__init__.py")
        for p in package_dir.glob(pattern)
        if not any(part.startswith("_") for part in p.parent.relative_to(package_dir).parts)
    }
    expected = subpackages | {"functional", "nn", "formats", "errors"}
    assert set(api_reference.namespaces()) == {f"unitscale.{name}" for name in expected}
    assert api_reference.namespaces()[:3] == ["unitscale.capture", "unitscale.fx", "unitscale.tracking"]
    # a room of a package right after the package: unitscale.stages, then its rooms
    stages = api_reference.namespaces().index("unitscale.stages")
    assert api_reference.namespaces()[stages : stages + 4] == [
        "unitscale.stages",
        "unitscale.stages.partitioner",
        "unitscale.stages.planner",
        "unitscale.stages.runtime",
    ]


def test_api_reference_documents_every_public_name_exactly_once():
    rows = [row for table in _tables() for row in table]
    assert len(rows) == len(set(rows)), "a name is listed in two tables"
    documented = api_reference.documented_objects()
    assert set(rows) == set(documented) | set(api_reference.namespaces())
    exported = {id(getattr(unitscale, name)) for name in unitscale.__all__}
    for namespace in api_reference.namespaces():
        module = importlib.import_module(namespace)
        for name in api_reference.namespace_names(namespace):
            obj = getattr(module, name)
            assert [n for n, o in documented.items() if o is obj], f"{namespace}.{name} is not documented"
            if id(obj) in exported:  # under the name users import it by
                assert documented.get(f"unitscale.{name}") is obj


def _group_tables() -> dict[str, list[str]]:
    """Each page of the reference, in the index's order: its title -> the rows of its tables."""
    order = re.findall(r"^api/(\w+)$", (ROOT / "docs" / "api.md").read_text(), re.M)  # the index's toctree
    pages = sorted(p.stem for p in (ROOT / "docs" / "api").glob("*.md"))
    assert sorted(order) == pages, "a page of docs/api/ is missing from the index's toctree"
    tables = {}
    for group in order:
        text = (ROOT / "docs" / "api" / f"{group}.md").read_text()
        title = re.search(r"^# (.+)$", text, re.M)
        assert title is not None, f"docs/api/{group}.md has no title"
        args = re.findall(r"^\.\. unitscale-api::(.*)$", text, re.M)
        tables[title[1]] = [row for arg in args for row in api_reference.table(arg.split(), API_PAGE)]
    return tables


def test_api_reference_groups_by_task_under_the_import_names():
    tables = _group_tables()
    assert list(tables) == [
        "Capturing a model's graph",
        "Tracing with torch.fx",
        "Tracking scales",
        "Unit-scaled ops",
        "Unit-scaled modules",
        "Constraints, roles and transfer checks",
        "u-μP optimisers",
        "Formats",
        "Transforms",
        "Pipeline stages",
        "Example models and data",
        "Errors",
    ]
    assert {"unitscale.capture", "unitscale.capture.capture", "unitscale.capture.Capture"} <= set(
        tables["Capturing a model's graph"]
    )
    assert {"unitscale.fx", "unitscale.fx.DeepTracer", "unitscale.inline"} <= set(tables["Tracing with torch.fx"])
    assert {"unitscale.track_scales", "unitscale.tracking.ScaleRow"} <= set(tables["Tracking scales"])
    assert "unitscale.functional.linear" in tables["Unit-scaled ops"]
    assert "unitscale.nn.Linear" in tables["Unit-scaled modules"]
    assert "unitscale.scaling.ConstraintArg" in tables["Constraints, roles and transfer checks"]
    assert (
        "unitscale.errors.NotInvertibleError" in tables["Errors"] and "unitscale.errors.TraceError" in tables["Errors"]
    )
    # each name on one page only
    rows = [row for table in tables.values() for row in table]
    assert len(rows) == len(set(rows))


def test_internals_are_not_documented():
    documented = api_reference.documented_objects()
    short = {name.rsplit(".", 1)[-1] for name in documented}
    assert not short & {"scratch_space", "KEEP_SCRATCH_BYTES", "reads_at_once", "DeepPathTracer", "UnpackProxy"}
    # one level below a namespace at most: unitscale.X or unitscale.<namespace>.X
    namespaces = {"unitscale", *api_reference.namespaces()}
    assert all(name.rsplit(".", 1)[0] in namespaces for name in documented)


def test_a_namespace_no_directive_names_lands_in_others():
    page = API_PAGE.replace(".. unitscale-api:: unitscale.stages\n", "")
    others = api_reference.table(["others"], page)
    assert others[:2] == ["unitscale.stages", "unitscale.partition"]


def test_public_names_are_unique_and_importable():
    assert len(set(unitscale.__all__)) == len(unitscale.__all__)
    for name in unitscale.__all__:
        assert hasattr(unitscale, name), f"unitscale.__all__ names {name!r}, which unitscale does not define"


def test_site_build_is_strict():
    conf = (ROOT / "conf.py").read_text()
    assert re.search(r"^nitpicky = True$", conf, re.M)
    assert re.search(r"^nb_execution_raise_on_error = True$", conf, re.M)
    makefile = (ROOT / "Makefile").read_text()
    assert "-W --keep-going -T" in makefile
    assert "NB_EXECUTION_MODE=force $(SPHINX) -E" in makefile


TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_converts_to_a_valid_notebook(path):
    notebook = jupytext.read(path, fmt="md:myst")
    nbformat.validate(notebook)
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    assert any(cell.cell_type == "code" for cell in notebook.cells)
    assert notebook.cells[0].cell_type == "markdown" and notebook.cells[0].source.startswith("# ")


@pytest.mark.parametrize(
    ("target", "documented"),
    [
        ("unitscale.tracking.analysis.track_scales", "unitscale.track_scales"),
        ("unitscale.tracking.report.ScaleRow", "unitscale.tracking.ScaleRow"),
        ("unitscale.stages.runtime.pipeline.PipelineResult", "unitscale.stages.PipelineResult"),
        ("unitscale.tracking.report.ScaleReport.plot", "unitscale.ScaleReport.plot"),
        ("unitscale.capture._cache.clear_capture_cache", "unitscale.capture.clear_capture_cache"),
    ],
)
def test_references_resolve_by_identity_to_the_documented_name(target, documented):
    assert api_reference.documented_name(target, domain=None) == documented
