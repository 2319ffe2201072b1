"""Format the tutorials' code cells with ruff, at the width of the site's code column.

``make format-tutorials`` runs ``python docs/_ext/format_tutorials.py tutorials/*.md``; with
``--check`` it changes nothing and exits 1 if a cell would change (``tests/site`` runs that).

A tutorial is a MyST text notebook (jupytext's ``myst`` format): jupytext finds its code cells,
ruff formats each one's source at :data:`LINE_LENGTH` columns, and only the cells' bodies are
written back, so the front matter, the prose and the cells' options stay byte for byte as they
were. Formatting twice changes nothing.

Why 88 columns: at 1280 px the site's text column shows about 90 characters of code, so a
formatted cell never scrolls sideways. The package itself keeps ruff's 120 (``pyproject.toml``).
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
import textwrap
import tokenize
from pathlib import Path

import jupytext

LINE_LENGTH = 88
FENCE = re.compile(r"^```\{code-cell\}[^\n]*\n", re.MULTILINE)
RUFF = [
    sys.executable,
    "-m",
    "ruff",
    "format",
    "--isolated",
    f"--line-length={LINE_LENGTH}",
    "--stdin-filename=cell.py",
    "-",
]


def lift_long_comments(source: str) -> str:
    """``source`` with its comments fitted to :data:`LINE_LENGTH` columns: a trailing comment that
    makes its line too long moves onto a line of its own above it (left in place, ruff would split
    the code around it: ``torch.set_num_threads(\\n    1\\n)  # why``), and a comment line still too
    long is wrapped. Pragmas (``# noqa``, ``# type:``) stay where they are."""
    lines = source.split("\n")
    moves = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type != tokenize.COMMENT or re.match(r"#\s*(noqa|type:|pragma)", token.string):
            continue
        row, col = token.start
        if len(lines[row - 1]) > LINE_LENGTH:
            moves[row - 1] = col
    for row in sorted(moves, reverse=True):
        line, col = lines[row], moves[row]
        indent = line[: len(line) - len(line.lstrip())]
        comment = line[col:].lstrip("#").strip()
        wrapped = textwrap.wrap(comment, LINE_LENGTH - len(indent) - 2, break_long_words=False)
        code = [line[:col].rstrip()] if line[:col].strip() else []
        lines[row : row + 1] = [f"{indent}# {part}" for part in wrapped] + code
    return "\n".join(lines)


def format_source(source: str) -> str:
    """``source`` (one cell's code) formatted by ruff, without the trailing newline ruff adds."""
    done = subprocess.run(RUFF, input=lift_long_comments(source) + "\n", capture_output=True, text=True)
    if done.returncode != 0:
        raise ValueError(f"ruff could not format this cell:\n{source}\n{done.stderr}")
    return done.stdout.rstrip("\n")


def _cell_bodies(text: str) -> list[tuple[int, int]]:
    """(start, end) offsets of every code cell's source in ``text``: after its options, up to
    (not including) the closing fence."""
    spans = []
    for fence in FENCE.finditer(text):
        start = fence.end()
        end = start if text.startswith("```", start) else text.index("\n```", start - 1) + 1
        body = text[start:end]
        if body.startswith("---\n"):  # options as a YAML block
            start += body.index("\n---\n", 3) + len("\n---\n")
        else:  # options as `:key: value` lines, then a blank line
            for line in body.splitlines(keepends=True):
                if not re.match(r"^:[\w-]+:", line):
                    break
                start += len(line)
            if start > fence.end() and text.startswith("\n", start):
                start += 1
        spans.append((start, end))
    return spans


def format_text(text: str) -> str:
    """The tutorial ``text`` with every code cell formatted."""
    cells = [c.source for c in jupytext.reads(text, fmt="md:myst").cells if c.cell_type == "code"]
    spans = _cell_bodies(text)
    if len(spans) != len(cells):
        raise ValueError(f"found {len(spans)} code-cell fences but jupytext reads {len(cells)} code cells")
    out, last = [], 0
    for (start, end), source in zip(spans, cells, strict=True):
        body = text[start:end].rstrip("\n")
        if body.strip() != source.strip():
            raise ValueError(f"a cell's text differs from jupytext's reading of it:\n{body}\n---\n{source}")
        out += [text[last:start], format_source(source) + "\n" if source.strip() else text[start:end]]
        last = end
    out.append(text[last:])
    return "".join(out)


def main(argv: list[str]) -> int:
    check = "--check" in argv
    changed = []
    for path in (Path(a) for a in argv if a != "--check"):
        text = path.read_text()
        formatted = format_text(text)
        if formatted != text:
            changed.append(path)
            if not check:
                path.write_text(formatted)
    verb = "would reformat" if check else "reformatted"
    for path in changed:
        print(f"{verb} {path}")
    return 1 if check and changed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
