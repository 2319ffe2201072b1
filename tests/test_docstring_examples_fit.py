"""Every docstring example fits the API pages' code blocks: no ``>>>`` line or output over 82 characters.

The API pages show a docstring's examples as written, in a code block that holds 82
characters at desktop width; a longer line scrolls sideways (the browser tests count those).
Ruff's W505 (``max-doc-length``) would measure the prose too, which the pages reflow, and the
indentation, which they strip; this check measures what the pages show: each example line with
its prompt (``>>> ``, ``... ``) and each line of its expected output.
"""

from __future__ import annotations

import ast
import doctest
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "unitscale"
LIMIT = 82
# Modules whose examples were over the limit when the check was written, each with the branch
# that owns them; the list may only shrink.
ALLOWED: dict[str, str] = {
    "transforms/__init__.py": "helper T's transforms branch",
    "transforms/aten.py": "helper T's transforms branch",
    "transforms/transformed_module.py": "helper T's transforms branch",
    "transforms/patterns.py": "helper T's transforms branch",
}


_DIRECTIVE = re.compile(r"\s*#\s*doctest:.*$")


def long_example_lines(source: str, limit: int = LIMIT) -> list[tuple[int, str]]:
    """``(line of the docstring's owner, shown line)`` for each example line over ``limit``."""
    parser = doctest.DocTestParser()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for example in parser.get_examples(ast.get_docstring(node) or ""):
            # Sphinx leaves ``# doctest: +FLAG`` comments off the page (trim_doctest_flags)
            source_lines = [_DIRECTIVE.sub("", line) for line in example.source.splitlines()]
            shown = [f"{'>>>' if i == 0 else '...'} {line}" for i, line in enumerate(source_lines)]
            shown += example.want.splitlines()
            found += [(getattr(node, "lineno", 1), line) for line in shown if len(line) > limit]
    return found


def test_the_check_measures_prompts_and_outputs_not_indentation() -> None:
    fits = 'def f():\n    """Doc.\n\n    >>> ' + "x" * 78 + "  # doctest: +ELLIPSIS\n    " + "y" * 82 + '\n    """\n'
    assert long_example_lines(fits) == []
    too_long = fits.replace("x" * 78, "x" * 79).replace("y" * 82, "y" * 83)
    assert [len(line) for _, line in long_example_lines(too_long)] == [83, 83]


def test_every_docstring_example_fits_the_api_pages() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative in ALLOWED:
            continue
        problems += [
            f"unitscale/{relative}:{line}: {len(text)} > {LIMIT}: {text}"
            for line, text in long_example_lines(path.read_text())
        ]
    assert not problems, "\n".join(problems)


def test_the_allowed_modules_still_need_their_place_on_the_list() -> None:
    fit = [name for name in ALLOWED if not long_example_lines((PACKAGE / name).read_text())]
    assert not fit, f"these now fit: remove them from ALLOWED: {fit}"
