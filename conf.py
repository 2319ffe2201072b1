"""Sphinx configuration. The source root is the repository root; the pages live in
``docs/`` (guides, reference) and ``tutorials/`` (MyST notebooks executed at build time)."""

import os
import sys

sys.path.insert(0, os.path.abspath("."))

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
]

exclude_patterns = [
    ".venv",
    "_build",
    "README.md",
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
]

# MyST and MyST-NB: every tutorial is executed; a failing cell fails the build.
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath"]
nb_execution_mode = os.environ.get("NB_EXECUTION_MODE", "force" if os.environ.get("CI") else "cache")
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 300
nb_merge_streams = True

# API reference.
autosummary_generate = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
napoleon_google_docstring = True
napoleon_numpy_docstring = False

# Theme.
html_theme = "sphinx_book_theme"
html_title = "unitscale"
html_context = {"default_mode": "light"}
html_theme_options = {
    "use_download_button": True,
    "use_fullscreen_button": False,
    "show_toc_level": 2,
}

copybutton_prompt_text = r">>> |\.\.\. |\$ "
copybutton_prompt_is_regexp = True
