"""What a reader with only the site gets: a quick start that runs as pasted, install commands that
name the wheel the site serves, and tutorial notebooks whose MyST roles read as plain text."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from myst_nb.core.variables import format_plain_text

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import standalone_notebook as sn  # noqa: E402
from wheel_download import wheel_name  # noqa: E402

INDEX = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")


def quick_start() -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", INDEX, re.S | re.M)
    assert blocks, "docs/index.md has no ```python quick start"
    return blocks[0]


def test_the_home_page_opens_with_a_ten_line_quick_start():
    assert INDEX.index("```python") < INDEX.index("::::{grid}"), "the quick start comes before the cards"
    assert len(quick_start().strip().splitlines()) <= 10


def test_the_quick_start_runs_as_pasted(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}  # this checkout's unitscale
    run = subprocess.run(
        [sys.executable, "-"], input=quick_start(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    table, rest = run.stdout.split("\n(->", 1)
    assert table.splitlines()[0].split()[:3] == ["node", "module", "op"]
    backward = float(rest.split("\n")[0].split("<-")[1].strip(" )"))
    assert abs(backward - 1) < 0.1, f"the unit-scaled input gradient should have std near 1, got {backward}"
    assert "bubble with 8 microbatches" in run.stdout


def shown_output() -> str:
    """The ```text block after the quick start: what the page says it prints."""
    rest = INDEX[INDEX.index(quick_start()) :]
    match = re.search(r"^```text\n(.*?)^```", rest, re.S | re.M)
    assert match, "the quick start shows no output"
    return match.group(1)


def test_the_quick_start_prints_what_the_page_shows(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [sys.executable, "-"], input=quick_start(), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == shown_output()


@pytest.mark.parametrize("page", ["docs/index.md", "docs/install.md"])
def test_pages_name_the_wheel_the_build_serves(page):
    text = (ROOT / page).read_text(encoding="utf-8")
    named = set(re.findall(r"unitscale-[\w.]+-py3-none-any\.whl", text))
    assert named == {wheel_name(ROOT)}, f"{page} names {named}; the build serves {wheel_name(ROOT)}"
    assert f'href="../{wheel_name(ROOT)}"' in text  # the site root, from docs/<page>.html


def test_install_page_gives_the_clone_command_with_the_pins():
    assert "pip install -c constraints.txt -e ." in (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


GLUED = {"mean": {"text/plain": "0.123456"}, "name": {"text/plain": "'fc1'"}, "md": {"text/markdown": "**x**"}}


TITLES = {"02_custom_tracers": "Custom tracers"}


def render(text: str) -> str:
    return sn.render_markdown(text, GLUED, format_plain_text, TITLES.__getitem__)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("std {glue:text}`mean:.3f`.", "std 0.123."),
        ("std {glue:text}`mean:.1e`", "std 1.2e-01"),
        ("module {glue:text}`name`", "module fc1"),
        ("{glue}`mean` and {glue:md}`md`", "0.123456 and **x**"),
        ("{func}`unitscale.partition`, {func}`~unitscale.stages.partition`", "`unitscale.partition()`, `partition()`"),
        ("{meth}`ScaleReport.plot`, {class}`~unitscale.ScaleReport`", "`ScaleReport.plot()`, `ScaleReport`"),
        ("{mod}`unitscale.fx`, {data}`unitscale.formats.FP16`", "`unitscale.fx`, `unitscale.formats.FP16`"),
        ("{class}`the report <unitscale.ScaleReport>`", "`the report`"),
        ("see {doc}`02_custom_tracers`, {doc}`that page <02_custom_tracers>`", "see Custom tracers, that page"),
        ("the {fas}`download` menu, {math}`x^2`", "the download menu, $x^2$"),
    ],
)
def test_roles_render_as_the_page_shows_them(text, expected):
    assert render(text) == expected


def test_glued_numbers_are_formatted_as_myst_nb_formats_them():
    assert sn.glued_text("glue:text", "mean:.2f", GLUED, format_plain_text) == format_plain_text("0.123456", ".2f")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("{glue:text}`missing:.3f`", ["no value glued as 'missing'", "mean"]),
        ("{glue:text}`other_page::mean`", ["another page"]),
        ("{unknownrole}`x`", ["no plain-Markdown rendering", "unknownrole"]),
    ],
)
def test_a_role_that_cannot_be_rendered_fails_the_build(text, words):
    with pytest.raises(sn.UnrenderableRole) as error:
        render(text)
    assert all(word in str(error.value) for word in words)


def test_hidden_glue_records_are_dropped_and_sphinx_metadata_removed():
    import nbformat

    kernel = {"name": "python3", "display_name": "Python 3"}
    notebook = nbformat.v4.new_notebook(metadata={"jupytext": {"formats": "md:myst"}, "kernelspec": kernel})
    cell = nbformat.v4.new_code_cell("glue('mean', 0.1, display=False)\n1 + 1")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={"application/papermill.record/text/plain": "0.1"},
            metadata={"scrapbook": {"name": "mean", "mime_prefix": "application/papermill.record/"}},
        ),
        nbformat.v4.new_output("execute_result", data={"text/plain": "2"}, execution_count=1),
    ]
    notebook.cells = [nbformat.v4.new_markdown_cell("mean {glue:text}`mean:.1f`"), cell]
    out = sn.standalone(notebook, GLUED, format_plain_text, str)
    assert "jupytext" not in out.metadata and out.metadata.kernelspec.name == "python3"
    assert out.cells[0].source == "mean 0.1"
    assert [o.output_type for o in out.cells[1].outputs] == ["execute_result"]
    assert len(notebook.cells[1].outputs) == 2, "the executed notebook itself is left as it was"


def test_a_figures_phone_rendering_stays_on_the_site():
    import nbformat

    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    cell = nbformat.v4.new_code_cell("plt.plot([1, 2])")
    phone = {"png": "iVBORw0KGgo=", "dpi": 200, "min_pt": 11.0, "width_px": 840}
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"},
            metadata={"image/png": {sn.FIGURE_KEY: {"phone": phone}, "width": 500}},
        )
    ]
    notebook.cells = [cell]
    out = sn.standalone(notebook, {}, format_plain_text, str)
    assert out.cells[0].outputs[0].metadata == {"image/png": {"width": 500}}
    assert sn.FIGURE_KEY in notebook.cells[0].outputs[0].metadata["image/png"], "the executed notebook is unchanged"


@pytest.mark.slow
def test_a_tutorial_built_from_scratch_downloads_with_outputs_and_glued_text(tmp_path):
    """The real build's settings (``force``: no jupyter-cache), on a tiny site: outputs and glue make it."""
    import nbformat

    from tests.site.test_build_failures import build, notebook

    code = "from myst_nb import glue\nglue('x', 2 / 3, display=False)\n6 * 7"
    page = notebook("Tiny", code) + "\nTwo thirds is {glue:text}`x:.2f`, an {class}`int` it is not.\n"
    result = build(tmp_path, {"tutorial": page})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    downloaded = nbformat.read(tmp_path / "html" / "_sources" / "tutorial.ipynb", as_version=4)
    code_cell = next(cell for cell in downloaded.cells if cell.cell_type == "code")
    assert [output.data["text/plain"] for output in code_cell.outputs] == ["42"]
    assert "Two thirds is 0.67, an `int` it is not." in downloaded.cells[-1].source


@pytest.mark.slow
def test_a_tutorial_read_from_jupyter_cache_downloads_with_its_outputs(tmp_path):
    """``make html``'s ``cache`` mode: on a cache hit MyST-NB's executed-notebook file has no outputs."""
    import nbformat

    from tests.site.test_build_failures import CONF, SPHINX, notebook

    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF + f"nb_execution_cache_path = {str(tmp_path / 'cache')!r}\n")
    (src / "index.md").write_text("# Tiny\n\n```{toctree}\ntutorial\n```\n")
    (src / "tutorial.md").write_text(notebook("Tiny", "6 * 7"))
    env = {**os.environ, "NB_EXECUTION_MODE": "cache", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    for build in ("miss", "hit"):  # executed and cached, then read from the cache
        out = tmp_path / build
        command = [*SPHINX, str(src), str(out / "html"), "-d", str(out / "doctrees")]
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        downloaded = nbformat.read(out / "html" / "_sources" / "tutorial.ipynb", as_version=4)
        code_cell = next(cell for cell in downloaded.cells if cell.cell_type == "code")
        assert [output.data["text/plain"] for output in code_cell.outputs] == ["42"], build
    assert "Using cached notebook" in result.stdout + result.stderr, "the second build should read the cache"
