"""Every measured number in a page's prose comes from an output on the same page.

A tutorial's prose may only state a number that the page itself computes: glued into the text
(``{glue:text}`` renders it inside a ``pasted-*`` span; the build's own measurements, such as a
tutorial's run time, are in ``measured`` spans), printed or displayed by a cell, or set
in a cell's code (a width, a seed, a learning rate). A number typed into the prose by hand goes
stale the day the code changes, and the page then says one thing while its output shows another.

The check reads the built HTML of every executed page. From the prose (paragraphs, list items
and table cells outside the cells, with glued spans and inline code taken out) it takes each
*measured-looking* number: a decimal (``0.160``), a percentage (``68%``) or a ratio (``1.3x``).
Whole numbers are left alone: in prose they count things the reader can see (layers, stages,
tutorials). Each one must appear on the same page in a cell's code or output, or in a glued
value, either as written or as a longer number that rounds to it (``0.16`` for ``0.1603``).
``ALLOWED`` lists the numbers a page may state without computing them, each with its reason
(a paper's figure, a format's constant); keep it short.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from pathlib import Path

import pytest

from tests.site.conftest import SITE

pytestmark = pytest.mark.built

bs4 = pytest.importorskip("bs4")

#: decimals, percentages and ratios: ``0.160``, ``−0.5``, ``68%``, ``1.3x``, ``1.3×``
NUMBER = re.compile(r"(?<![\w.\-/])[-−]?(\d+\.\d+|\d+(?=\s?%)|\d+(?:\.\d+)?(?=[x×]\b))(?![\w.]*\d)")
#: tokens that look like numbers but are names: versions, arXiv ids, section numbers
NOT_A_MEASUREMENT = re.compile(r"arXiv\s*$|v$|version\s*$|torch\s*$|§\s*$|\d\.$")

#: page (as in PAGES) -> {number as written in prose: why it needs no output}
ALLOWED: dict[str, dict[str, str]] = {}


ROOT = Path(__file__).resolve().parents[2]
#: the executed pages, by source: every tutorial, and the guide pages whose cells compute
GUIDE_PAGES = ("benchmarks", "against-the-reference", "planner")
PAGES = [f"tutorials/{p.stem}" for p in sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))]
PAGES += [f"docs/{name}" for name in GUIDE_PAGES if (ROOT / "docs" / f"{name}.md").is_file()]


def _decimal(token: str) -> Decimal | None:
    try:
        return Decimal(token.replace("−", "-"))
    except InvalidOperation:
        return None


def _rounds_to(value: Decimal, written: Decimal) -> bool:
    """Whether ``value``, rounded to as many places as ``written`` shows, is ``written``."""
    exponent = written.as_tuple().exponent
    if not isinstance(exponent, int) or value.as_tuple().exponent >= exponent:
        return value == written
    quantum = Decimal(1).scaleb(exponent)
    return any(value.quantize(quantum, rounding=mode) == written for mode in (ROUND_HALF_UP, ROUND_HALF_EVEN))


def prose_and_evidence(html: str) -> tuple[list[tuple[str, str]], str]:
    """The page's prose numbers (number, the sentence it stands in) and its evidence text."""
    soup = bs4.BeautifulSoup(html, "html.parser")
    main = soup.find("main") or soup
    evidence: list[str] = []
    for cell in main.select("div.cell"):
        evidence.append(cell.get_text(" "))
        cell.decompose()
    for glued in main.select('[class*="pasted-"], .measured'):
        evidence.append(glued.get_text(" "))
        glued.decompose()
    for code in main.select("code, pre, .math, math, script, style"):
        evidence.append(code.get_text(" "))
        code.decompose()
    found: list[tuple[str, str]] = []
    for block in main.find_all(["p", "li", "td", "th", "dd", "figcaption", "caption"]):
        if block.find(["p", "li", "td"]):  # the innermost block holds the sentence
            continue
        text = " ".join(block.get_text(" ").split())
        for match in NUMBER.finditer(text):
            if NOT_A_MEASUREMENT.search(text[: match.start()]):
                continue
            found.append((match.group(1), text))
    return found, "\n".join(evidence)


def unbound_numbers(html: str, allowed: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """The prose numbers of one page that nothing on the page computes."""
    found, evidence = prose_and_evidence(html)
    values = [d for d in (_decimal(t) for t in re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", evidence)) if d is not None]
    exact = set(re.findall(r"\d+(?:\.\d+)?", evidence))
    missing = []
    for token, sentence in found:
        if token in exact or token in (allowed or {}):
            continue
        written = _decimal(token)
        if written is not None and any(_rounds_to(v.copy_abs(), written.copy_abs()) for v in values):
            continue
        missing.append((token, sentence))
    return missing


def test_a_number_typed_into_prose_is_caught() -> None:
    page = """<main><p>The std goes from 0.160 to 1.003, and the plan is within 25%.</p>
    <div class="cell"><div class="cell_output"><pre>std 0.1603 -> 2.42</pre></div></div></main>"""
    missing = [token for token, _ in unbound_numbers(page)]
    assert missing == ["1.003", "25"]  # 0.160 is 0.1603 rounded: bound


def test_glued_and_coded_numbers_are_bound() -> None:
    page = """<main><p>Best rate <span class="pasted-text">0.0078</span>, so 0.008 it is;
    the sweep of 5 rates spans 1.5x (<code>span = 1.5</code>), per arXiv 2303.11257.</p></main>"""
    assert unbound_numbers(page) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_prose_number_comes_from_an_output_on_its_page(page: str) -> None:
    built = SITE / f"{page}.html"
    if not built.is_file():
        pytest.fail(f"no built page at {built}: run `make html` (or set UNITSCALE_SITE)")
    missing = unbound_numbers(built.read_text(encoding="utf-8"), ALLOWED.get(page))
    assert not missing, f"{page}: numbers in prose that no output, glue or code on the page produces:\n" + "\n".join(
        f"  {token!r} in: {sentence[:160]}" for token, sentence in missing
    )
