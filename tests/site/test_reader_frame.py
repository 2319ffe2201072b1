"""Every tutorial opens with a reader's frame, and Previous/Next follow the reading tracks.

Reads the built pages (``_build/html``, or ``$UNITSCALE_SITE``; no browser): under each
tutorial's title, the box of ``docs/_ext/reader_frame.py`` says what the page teaches, what it
builds on, where it sits in its track, how long it ran in this build (a number of seconds, from
the execution data, the same as the execution report's) and which glossary terms it uses; the
footer's Previous and Next follow the sidebar, track by track, so Next from the first guide page
reaches every page of the sidebar (the scaling track's "Against the reference" among them).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import reader_frame  # noqa: E402


def test_every_tutorial_has_a_frame_and_a_track() -> None:
    labels = sorted(reader_frame.number(f"tutorials/{t}") for t in TUTORIALS)
    assert sorted(reader_frame.TUTORIALS) == labels
    assert sorted(n for _, members in reader_frame.TRACKS.values() for n in members) == labels
    for n, frame in reader_frame.TUTORIALS.items():
        members = reader_frame.TRACKS[frame.track][1]
        assert n in members
        assert members == sorted(members, key=reader_frame.order), f"track {frame.track} is out of order"
        later = [m for m in frame.before if reader_frame.order(m) >= reader_frame.order(n)]
        assert later == [], f"tutorial {n} builds on a later one"


def test_a_tutorials_label_comes_from_its_file_name() -> None:
    assert reader_frame.number("tutorials/06a_unit_scaled_ops") == "6a"
    assert reader_frame.number("tutorials/10_umup") == "10"
    assert reader_frame.number("docs/glossary") is None
    assert sorted(["10", "7b", "6b", "7a", "6a"], key=reader_frame.order) == ["6a", "6b", "7a", "7b", "10"]


def test_terms_are_found_in_prose_and_only_in_their_context() -> None:
    found = reader_frame.terms_used("A pipeline's bubble shrinks with more microbatches under 1F1B.")
    assert found == ["bubble", "1F1B", "microbatch"]
    assert reader_frame.terms_used("Soap makes a bubble.") == []  # no pipeline: another sense
    assert reader_frame.terms_used("u-μP gives each parameter one of five roles.") == ["roles", "u-μP"]


@pytest.mark.built
@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_the_page_opens_with_the_frame(tutorial: str) -> None:
    page = (SITE / "tutorials" / f"{tutorial}.html").read_text(encoding="utf-8")
    title = page.index("<h1>")
    frame = page.index('class="reader-frame', title)
    assert page.find("<p>", title) > frame or page.find("<p>", title) == -1, "the frame is not under the title"
    text = re.sub(r"<[^>]+>", " ", page[frame : page.index("</dl>", frame)])
    text = re.sub(r"\s+", " ", text)
    for field in ("You will learn", "Before this", "Track", "Run time"):
        assert field in text, f"no {field!r} in the frame: {text[:300]}"
    assert re.search(r"Run time\s*:?\s*[\d.]+ s\s*, executed \d{4}-\d\d-\d\d", text), text
    assert "cores, torch" in text, "the run time names no machine"


def reading_order() -> list[str]:
    """The guide and the three tracks in the order of the home page's toctrees (the sidebar's),
    as built paths; the reference section, whose API page has toctrees of its own, is left out."""
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    order = []
    for block in re.findall(r"```\{toctree\}\n(.*?)```", index, re.S):
        if ":caption: Reference" in block:
            continue
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith(":"):
                order.append(line.lstrip("/") if line.startswith("/") else f"docs/{line}")
    return order


@pytest.mark.built
def test_next_leads_through_every_page_in_the_sidebars_order() -> None:
    """From the first guide page, Next visits every page of the sidebar once, track by track."""
    order = reading_order()
    assert "tutorials/07b_unit_scale_beyond" in order and "docs/against-the-reference" in order
    for here, there in zip(order, order[1:], strict=False):
        page = (SITE / f"{here}.html").read_text(encoding="utf-8")
        links = dict(re.findall(r'<a class="(left-prev|right-next)"\s+href="([^"]+)"', page))
        target = os.path.normpath(os.path.join(os.path.dirname(here), links.get("right-next", "")))
        assert target == f"{there}.html", f"{here}: Next leads to {target}, the sidebar's next page is {there}"
        back = (SITE / f"{there}.html").read_text(encoding="utf-8")
        links = dict(re.findall(r'<a class="(left-prev|right-next)"\s+href="([^"]+)"', back))
        target = os.path.normpath(os.path.join(os.path.dirname(there), links.get("left-prev", "")))
        assert target == f"{here}.html", f"{there}: Previous leads to {target}, not {here}"


#: jargon a reader meets before a page explains it: its first use in reading order must link
#: its glossary entry (``{term}`...```)
FIRST_USE_LINKED = {
    "TorchDynamo": r"\b(Torch)?Dynamo\b",
    "u-μP": r"u-μP",
    "quadrature": r"\bquadrature\b",
    "subnormal": r"\bsubnormals?\b",
    "octave": r"\boctaves?\b",
    "loss scaling": r"\bloss scaling\b",
}


def source_prose(docname: str) -> str:
    """A page's Markdown source without its front matter, headings (a title links nothing: the
    sentence under it does), code cells and fenced blocks (a ``{table}`` directive's rows are prose)."""
    text = (ROOT / f"{docname}.md").read_text(encoding="utf-8")
    text = re.sub(r"\A---\n.*?\n---\n", "", text, flags=re.S)
    text = re.sub(r"^#+ .*$", "", text, flags=re.M)
    text = re.sub(r"^```\{table\}.*?\n(.*?)^```\s*$", r"\1", text, flags=re.S | re.M)
    return re.sub(r"^(```|~~~).*?^\1\s*$", "", text, flags=re.S | re.M)


def test_jargon_links_its_glossary_entry_where_a_reader_first_meets_it() -> None:
    pages = [(page, source_prose(page)) for page in reading_order()]
    for term, word in FIRST_USE_LINKED.items():
        page, prose, first = next((p, s, m) for p, s in pages if (m := re.search(word, s)))
        linked = any(role.start() <= first.start() < role.end() for role in re.finditer(r"\{term\}`[^`]*`", prose))
        line = prose[: first.start()].count("\n")
        assert linked, f"{term!r} is first used in {page} (prose line {line}) without a {{term}} link"
