"""A reader with only the built site and pip: every tutorial's download runs in a fresh environment.

Serves the built site (``_build/html``, or ``$UNITSCALE_SITE``) on 127.0.0.1, makes a new virtual
environment, and does there what the Install page tells a reader to do: ``pip install <site
URL>/unitscale-<version>-py3-none-any.whl`` (pip resolves the wheel's own dependencies, so a
dependency the wheel forgot to declare fails here), a smoke test with no extras, then ``pip
install "unitscale[tutorials] @ <wheel URL>"``: a Jupyter kernel, ``transformers`` (for *Your
own model*) and ``ipywidgets``, as Install and Run locally tell a reader. Then every tutorial's
``.ipynb`` is downloaded from the site and executed in that environment's kernel, from a folder
outside the checkout: no ``myst_nb``, no Sphinx, no source tree on the path.

pip runs offline (``--no-index``) from the wheelhouse ``make`` fetched at set-up (``make
wheelhouse``: the package's declared dependencies, a kernel and ``transformers``, pinned by
``constraints.txt``), so the test needs no network and a dependency the wheel forgot to declare
is missing here as it would be for a reader.
The environment is made once per run and shared by the xdist workers (a file lock guards it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest
from filelock import FileLock

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))
ROLE = re.compile(r"\{[\w:.+-]+\}`")
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from wheel_download import wheel_name  # noqa: E402

# what only the project's own environment has: a reader's must not need any of it
WHEELHOUSE = Path(os.environ.get("UNITSCALE_WHEELHOUSE", Path(sys.prefix) / "wheelhouse"))
PROJECT_ONLY = ("myst_nb", "sphinx", "jupytext", "pytest", "hypothesis", "playwright")
DETERMINISTIC = ("01_writing_a_tracer",)  # no timings, no threads: its outputs must come out as the page's
SMOKE = """
import importlib.util, json, sys
import matplotlib.pyplot, torch, unitscale
from unitscale import track_scales
from unitscale.examples import MLP
torch.manual_seed(0)
report = track_scales(MLP(16, 32), torch.randn(64, 16))
print(json.dumps({
    "file": unitscale.__file__,
    "rows": len(report),
    "missing": [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None],
}))
"""


def _texts(cells: list) -> list[tuple[frozenset[str], list[str]]]:
    """Per code cell: the lines it printed, as a set, and its results' ``text/plain``.

    A set, not the text: a kernel splits a stream into pieces as it flushes, differently from
    run to run, and a build's executed notebook was once seen to hold a printed table twice.
    """
    texts = []
    for cell in (cell for cell in cells if cell.cell_type == "code"):
        stdout = "".join(o.text for o in cell.outputs if o.output_type == "stream" and o.name == "stdout")
        results = [o.data.get("text/plain") for o in cell.outputs if o.output_type == "execute_result"]
        texts.append((frozenset(line for line in stdout.splitlines() if line.strip()), results))
    return texts


def _run(command: list[str], cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess[str]:
    # the environment's own bytecode is written as it is first imported (pip's --no-compile skips
    # compiling all of torch; a kernel then reads what the smoke test compiled)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONDONTWRITEBYTECODE")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def _make_reader_env(where: Path, base_url: str) -> Path:
    """A new venv with the wheel from the site, smoke-tested bare, then with its `tutorials` extra."""
    _run([sys.executable, "-m", "venv", str(where / "venv")], cwd=where)
    python = where / "venv" / "bin" / "python"
    if not WHEELHOUSE.is_dir():
        raise AssertionError(f"no wheelhouse at {WHEELHOUSE}: run `make wheelhouse` (make test does at set-up)")
    offline = ["--no-index", "--find-links", str(WHEELHOUSE)]
    pip = [str(python), "-m", "pip", "install", "--quiet", "--no-compile", *offline]
    _run([*pip, f"{base_url}/{wheel_name(ROOT)}"], cwd=where)  # as the Install page says
    smoke = json.loads(_run([str(python), "-c", SMOKE, *PROJECT_ONLY], cwd=where).stdout)
    (where / "smoke.json").write_text(json.dumps(smoke))
    # the `tutorials` extra, as Install and Run locally say: a kernel, transformers, ipywidgets
    _run([*pip, f"unitscale[tutorials] @ {base_url}/{wheel_name(ROOT)}"], cwd=where)
    kernels = where / "kernels" / "unitscale-reader"
    kernels.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    (kernels / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "reader", "language": "python"}))
    return where


@pytest.fixture(scope="session")
def reader_env(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's environment, made by the first worker that asks; the others wait for it."""
    shared = tmp_path_factory.getbasetemp().parent  # the same folder for every xdist worker
    # named by the wheel's bytes: without xdist that folder outlives the run, and an environment
    # made from another build's wheel (same file name, older code) must not be reused
    with urllib.request.urlopen(f"{base_url}/{wheel_name(ROOT)}") as response:
        digest = hashlib.sha256(response.read()).hexdigest()[:16]
    where = shared / f"reader-env-{digest}"
    failed = shared / f"reader-env-{digest}.failed"
    with FileLock(str(shared / f"reader-env-{digest}.lock")):
        if not (where / "kernels").is_dir() and not failed.exists():
            where.mkdir(exist_ok=True)
            try:
                _make_reader_env(where, base_url)
            except AssertionError as error:
                failed.write_text(str(error))  # the other workers fail with it instead of retrying
                raise
    if failed.exists():
        pytest.fail(f"making the reader's environment failed:\n{failed.read_text()}")
    return where


def test_the_wheel_installs_with_its_dependencies_and_runs_without_extras(reader_env: Path) -> None:
    smoke = json.loads((reader_env / "smoke.json").read_text())
    assert Path(smoke["file"]).is_relative_to(reader_env / "venv"), "unitscale came from elsewhere than the wheel"
    assert smoke["rows"] > 0
    assert sorted(smoke["missing"]) == sorted(PROJECT_ONLY), "the bare install pulled in a project-only package"


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_the_downloaded_notebook_runs_in_the_readers_environment(
    tutorial: str, reader_env: Path, base_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nbclient import NotebookClient

    with urllib.request.urlopen(f"{base_url}/_sources/tutorials/{tutorial}.ipynb") as response:
        notebook = nbformat.reads(response.read().decode("utf-8"), as_version=4)
    markdown = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    assert "{glue" not in markdown and not ROLE.findall(markdown), ROLE.findall(markdown)[:5]
    # the first cell checks where the kernel finds unitscale and that myst_nb is not there at all
    check = (
        "import importlib.util, unitscale\n"
        f"assert unitscale.__file__.startswith({str(reader_env / 'venv')!r}), unitscale.__file__\n"
        "assert importlib.util.find_spec('myst_nb') is None"
    )
    expected = _texts(notebook.cells)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(check))
    monkeypatch.setenv("JUPYTER_PATH", str(reader_env))  # finds kernels/unitscale-reader
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    resources = {"metadata": {"path": str(tmp_path)}}  # the kernel's working folder: not the checkout
    client = NotebookClient(notebook, timeout=300, kernel_name="unitscale-reader", resources=resources)
    client.execute()
    errors = [
        o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs if o.output_type == "error"
    ]
    assert not errors, errors[:1]
    if tutorial in DETERMINISTIC:
        assert _texts(notebook.cells[1:]) == expected, "re-running the download gives other outputs than the page's"
    else:
        assert sum(bool(cell.outputs) for cell in notebook.cells[1:] if cell.cell_type == "code") > 0
