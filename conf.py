"""Sphinx configuration. The source root is the repository root; the pages live in
``docs/`` (guides, reference) and ``tutorials/`` (MyST notebooks executed at build time).

No network at build time: there is no intersphinx, so references to other packages' objects
(torch, numpy, the standard library) are deliberately ignored below; references to
``unitscale`` objects stay strict (``nitpicky``).
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent  # not the cwd: tests reuse this file from other projects
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from library_cache import cache_path  # noqa: E402  (docs/_ext is importable only from here on)

project = "unitscale"
author = "the unitscale developers"
copyright = "2026, the unitscale developers"
root_doc = "docs/index"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx.ext.doctest",
    "sphinx_copybutton",
    "sphinx_design",
    "sphinx_last_updated_by_git",  # each page's "Last updated" from its git history
    "sphinxext.opengraph",  # title, description and type for link previews
    # ours, in docs/_ext
    "api_reference",
    "benchmark_csv",  # each recorded benchmark as a CSV file beside the Benchmarks page
    "execute_alone",  # pages that time themselves execute with no other notebook beside them
    "execution_report",  # the execution report's Status column in words
    "output_widths",  # printed outputs that are not tables wrap on a phone
    "figure_widths",  # every figure drawn again for a phone, served by a <picture>
    "library_cache",
    "notebook_download",
    "page_dependencies",
    "reader_frame",  # each tutorial's opening box (learn, before, track, run time, terms), Previous/Next by number
    "spread_notebooks",  # under -j, notebooks dealt out over the chunks read in parallel
    "viewcode_backlinks",  # the source pages' "[docs]" links find their anchors
    "wheel_download",  # the package's wheel at the site root, for `pip install <site>/<wheel>`
    "source_archive",  # the sources at the site root, for `make html` and `make test` without a clone
]

templates_path = [str(ROOT / "docs" / "_templates")]
exclude_patterns = [
    ".venv",
    "_build",
    "README.md",
    "ARCHITECTURE.md",
    "tests",
    "benchmarks",
    "unitscale",
    "notebooks",
    ".ci",
    ".git",
    ".pytest_cache",
    ".hypothesis",
    "**/.ipynb_checkpoints",
    "shared",
    "docs/_ext",
    "docs/_templates",
    "docs/_extra",
    "docs/_static",
]

# MyST and MyST-NB: every tutorial is executed; a failing cell fails the build.
# `cache` (jupyter-cache) locally: an unchanged notebook is not re-run. `force` under `make test`/CI.
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath", "substitution"]
# {{ build_machine }} on the execution report: the machine every page's run time was taken on
myst_substitutions = {"build_machine": __import__("reader_frame").machine()}
nb_execution_mode = os.environ.get("NB_EXECUTION_MODE", "force" if os.environ.get("CI") else "cache")
nb_execution_raise_on_error = True
nb_execution_show_tb = True
# The pipeline tutorial times real pipelines against the planner's prediction: under -j it
# executes alone (execute_alone extension), not beside another notebook on the same cores.
nb_execute_alone = ["tutorials/11_pipelines_at_scale"]
nb_execution_timeout = 300
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown outputs (the Benchmarks page's tables) get tables
# The cache holds outputs of one version of the library (library_cache extension): a folder per
# digest of unitscale's sources, and every executed page is re-read when those sources change.
# The kernels also run figure_widths (every figure drawn again for a phone): its code is in the digest.
KERNEL_CODE = [ROOT / "docs" / "_ext" / "figure_widths.py", ROOT / "docs" / "_ext" / "figure_widths_startup.py"]
nb_execution_cache_path = str(cache_path(ROOT / "_build" / ".jupyter_cache", ROOT / "unitscale", KERNEL_CODE))
# The Benchmarks and planner pages show the one recording of benchmarks/bench_*.py: re-read (and,
# by their front matter, re-run) them when it or the scripts change.
_KERNEL = ["unitscale/**/*.py", "docs/_ext/figure_widths*.py"]
page_dependencies = {
    "docs/benchmarks": ["benchmarks/*.py", "docs/benchmark_runs/recording.json", *_KERNEL],
    "docs/against-the-reference": _KERNEL,
    "docs/planner": ["benchmarks/record.py", "docs/benchmark_runs/recording.json", *_KERNEL],
    **{f"tutorials/{page.stem}": _KERNEL for page in sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))},
}

# The wheel served at the site root (wheel_download extension) is this project's.
wheel_project_root = str(ROOT)

# API reference: docs/api.md lists every name in `unitscale.__all__` (api_reference extension).
autosummary_generate = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_inherit_docstrings = False  # torch's docstrings (autograd.Function.forward, ...) are not ours
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Every reference must resolve. Objects of other packages cannot (no intersphinx: no network),
# so those, and only those, are ignored.
nitpicky = True
_external_packages = [
    "_?torch", "nn", "fx", "F", "numpy", "np", "matplotlib", "einops", "pygments",
    "typing", "typing_extensions", "collections", "types", "enum", "abc", "dataclasses", "pathlib",
    "functools", "contextlib", "builtins", "fractions", "numbers", "os",
]
# builtins, typing names and the short names docstrings use for torch/matplotlib types
_external_names = [
    "int", "float", "complex", "str", "bytes", "bool", "None", "NoneType", "object", "type", "tuple",
    "list", "dict", "set", "frozenset", "slice", "range", "Ellipsis", "callable", "Callable", "Any",
    "Sequence", "Mapping", "Iterable", "Iterator", "Optional", "Union", "Literal", "any", "optional",
    "Exception", "ValueError", "TypeError", "RuntimeError", "KeyError", "IndexError", "LookupError",
    "NotImplementedError", "AttributeError",
    "Argument", "Target", "TreeSpec", "Tensor", "Module", "GraphModule", "Node", "Graph", "Figure", "Axes", "T",
    r"(.*\.)?T_destination",
]
# Private type aliases, variables and protocols in signatures: named here one by one, so anything
# else still fails the build.
nitpick_ignore = [
    ("py:class", "Params"),
    ("py:class", "unitscale.scaling.parameter._P"),
    ("py:class", "unitscale.stages.partitioner.plan_files._Plan"),
    ("py:class", "unitscale.scaling.docs._T"),
    ("py:class", "RankRecord"),  # PipelineResult.records' item type, in the internal stages.runtime.measured
    ("py:class", "unitscale.stages.runtime.measured.RankRecord"),
    ("py:class", "unitscale.transforms._frozen.GradScales"),  # PassState.grad_scales: the frozen factors' buffers
]
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(_external_packages)})(\..+)?"),
    (r"py:.*", rf"({'|'.join(_external_names)})"),
]

# Theme.
html_theme = "sphinx_book_theme"
html_title = "unitscale"
html_static_path = [str(ROOT / "docs" / "_static")]
html_css_files = ["unitscale.css", "api.css"]  # docs/_static: readable figures, outputs, tables; API pages
# docs/_static: names break after a dot; figures open full size; a scrolling output shows a shadow
html_js_files = ["names.js", "figures.js", "outputs.js"]
html_extra_path = [str(ROOT / "docs" / "_extra")]  # index.html at the site root: a redirect to docs/index.html
html_context = {"default_mode": "light"}  # without it the theme logs "Got invalid theme mode"
html_last_updated_fmt = "%Y-%m-%d"  # from git (sphinx_last_updated_by_git), in the footer
# A page git does not know (the generated API pages) is dated by the files it documents. Outside a
# git checkout, or in a shallow one, pages simply have no date: not a reason to fail the build.
git_untracked_show_sourcelink = True
suppress_warnings = ["git.subprocess_error", "git.too_shallow", "git.command_not_found"]
# OpenGraph: the absolute address is the host's (Read the Docs sets it; elsewhere, none).
ogp_site_url = os.environ.get("READTHEDOCS_CANONICAL_URL", "")
ogp_site_name = "unitscale"
ogp_social_cards = {"enable": False}  # no generated preview images: they need a font download
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
    # the sidebar lists a section's pages (the API's 230) only on that section's pages: every page
    # carried the whole tree, and building it took most of the site's write time
    "collapse_navbar": True,
}

# Copy buttons on code (tutorial inputs, code blocks, doctests), never on cell outputs.
# (double quotes inside: sphinx-copybutton pastes this into a single-quoted JavaScript string)
copybutton_selector = 'div[class*="highlight-"]:not(.output) > div.highlight > pre'
copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True


def setup(app):
    # without an icon, browsers ask for /favicon.ico and log a 404 in the console
    app.add_css_file("favicon.svg", rel="icon", type="image/svg+xml")
