"""The API reference pages at a phone's width and a desktop's, measured in Chromium.

Every API page (``docs/api/*`` and ``docs/generated/*``, the list comes from the build) is
opened at 390 and 1280 px in one tab, and three faults are counted:

- **Wider than its column.** No element of the article reaches past its column (the article's
  content box, its table cell, or the box that scrolls around it): in the ``functional`` page's
  table, ``torch.nn.functional.scaled_dot_product_attention()`` ran 443 px past a phone's 356 px
  column, out of its cell. A box that scrolls sideways shows the site's cue (a shadow at the
  hidden edge: ``outputs.js`` marks it, ``unitscale.css`` draws it).
- **Cut sidebar entries.** At 1280 px no entry of the right-hand "On this page" column is wider
  than its box (``TransformedModule``'s method names: 333 px of entries in 240 px).
- **Names broken inside a word.** A name (in code, a signature, a title, a sidebar entry) breaks
  only at a name boundary: after a dot or an underscore, between CamelCase words, at a space or
  a ``<wbr>`` (``names.js``); never between two letters of one word (``scal|ed``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.site.browser_tab import Visit

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
PAGES = sorted(str(p.relative_to(SITE)) for p in [*SITE.glob("docs/api/*.html"), *SITE.glob("docs/generated/*.html")])
WIDTHS = {"phone": {"width": 390, "height": 844}, "desktop": {"width": 1280, "height": 900}}

# Elements of the article that reach past their column, boxes that scroll without a cue.
WIDE_JS = """() => {
  const root = document.querySelector('.bd-article');
  const style = getComputedStyle(root);
  const box = root.getBoundingClientRect();
  const column = {left: box.left + parseFloat(style.paddingLeft), right: box.right - parseFloat(style.paddingRight)};
  const clips = e => getComputedStyle(e).overflowX !== 'visible';
  const scrolls = e => ['auto', 'scroll'].includes(getComputedStyle(e).overflowX);
  const name = e => e.tagName.toLowerCase() + (typeof e.className === 'string' && e.className.trim()
    ? '.' + e.className.trim().split(/\\s+/).join('.') : '');
  const bad = [];
  for (const el of root.querySelectorAll('*')) {
    if (!el.getClientRects().length || el.closest('details:not([open]) > :not(summary)')) continue;
    // the box it must fit in: the nearest table cell or box that clips or scrolls, else the
    // article's column
    let outer = el.parentElement;
    while (outer !== root && !clips(outer) && !['TD', 'TH'].includes(outer.tagName)) outer = outer.parentElement;
    if (outer !== root && scrolls(outer)) continue;  // reached by scrolling: its scroller is checked
    let {left, right} = column;
    if (outer !== root) ({left, right} = outer.getBoundingClientRect());
    const r = el.getBoundingClientRect();
    if (r.right > right + 1 || r.left < left - 1) {
      bad.push(`${name(el)} ${r.width.toFixed(0)} px reaches past its ${(right - left).toFixed(0)} px column: `
        + `"${(el.innerText || el.textContent).trim().slice(0, 50).replace(/\\s+/g, ' ')}"`);
    }
    if (scrolls(el) && el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).boxShadow === 'none') {
      bad.push(`${name(el)} scrolls (${el.scrollWidth} px in ${el.clientWidth}) with no cue: `
        + `"${(el.innerText || '').trim().slice(0, 50).replace(/\\s+/g, ' ')}"`);
    }
  }
  if (document.documentElement.scrollWidth > window.innerWidth + 1)
    bad.push(`the page scrolls sideways: ${document.documentElement.scrollWidth} px`);
  return bad;
}"""

# Entries of the right-hand sidebar ("On this page") cut at its edge, and the sidebar itself.
SIDEBAR_JS = """() => {
  const side = document.querySelector('.bd-sidebar-secondary');
  if (!side || !side.getClientRects().length) return [];
  const bad = [];
  for (const el of [side, ...side.querySelectorAll('nav, ul, li, a, code, span')]) {
    if (el.getClientRects().length && getComputedStyle(el).display !== 'inline'
        && el.scrollWidth > el.clientWidth + 1)
      bad.push(`${el.tagName.toLowerCase()} ${el.scrollWidth} px in ${el.clientWidth}: `
        + `"${el.textContent.trim().slice(0, 50)}"`);
  }
  return bad;
}"""

# Names broken between two letters of one word: a line break inside a text node of a name where
# neither a dot, an underscore, a space nor a CamelCase boundary is. (A <wbr> splits the text
# node: a break there is between nodes and allowed.)
BROKEN_NAMES_JS = """() => {
  const scopes = '.bd-article code, .bd-article .sig, .bd-article h1, .bd-article h2, .bd-article h3, '
    + '.bd-article table.autosummary td:first-child, .bd-sidebar-secondary a, .bd-sidebar-primary a';
  const allowed = (a, b) => !/\\w/.test(a) || !/\\w/.test(b) || a === '_' || b === '_'
    || (/[a-z0-9]/.test(a) && /[A-Z]/.test(b));
  const bad = new Set();
  const range = document.createRange();
  for (const scope of document.querySelectorAll(scopes)) {
    if (!scope.getClientRects().length) continue;
    const walk = document.createTreeWalker(scope, NodeFilter.SHOW_TEXT);
    for (let node; (node = walk.nextNode()); ) {
      const text = node.textContent;
      if (text.trim().length < 2) continue;
      range.selectNodeContents(node);
      const lines = new Set([...range.getClientRects()].map(r => Math.round(r.top)));
      if (lines.size < 2) continue;
      let top = null;
      for (let i = 0; i < text.length; i++) {
        if (/\\s/.test(text[i])) continue;
        range.setStart(node, i);
        range.setEnd(node, i + 1);
        const rect = range.getBoundingClientRect();
        if (!rect.width) continue;
        if (top !== null && rect.top > top + 2 && !allowed(text[i - 1], text[i]))
          bad.add(`"${text.slice(Math.max(0, i - 20), i)}|${text.slice(i, i + 20)}"`);
        top = rect.top;
      }
    }
  }
  return [...bad];
}"""


@pytest.fixture(scope="module")
def measured(browser, base_url) -> dict[str, dict[str, tuple[list[str], list[str], list[str]]]]:
    """``width -> page -> (wide elements, cut sidebar entries, broken names)``, every API page
    visited once at each width."""
    found: dict[str, dict[str, tuple[list[str], list[str], list[str]]]] = {}
    for width, viewport in WIDTHS.items():
        tab = Visit(browser, viewport)
        try:
            found[width] = {}
            for page in PAGES:
                tab.goto(f"{base_url}/{page}")
                found[width][page] = (
                    tab.page.evaluate(WIDE_JS),
                    tab.page.evaluate(SIDEBAR_JS),
                    tab.page.evaluate(BROKEN_NAMES_JS),
                )
        finally:
            tab.close()
    return found


def _report(measured, width: str, kind: int) -> list[str]:
    return [f"{page}: {line}" for page, lists in measured[width].items() for line in lists[kind]]


def test_the_api_pages_are_found():
    assert len(PAGES) > 100 and "docs/api/functional.html" in PAGES, PAGES[:5]


@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_is_wider_than_its_column(measured, width):
    bad = _report(measured, width, 0)
    assert bad == [], f"{len(bad)} at {width} width:\n" + "\n".join(bad[:40])


def test_no_on_this_page_entry_is_cut(measured):
    bad = _report(measured, "desktop", 1)
    assert bad == [], f"{len(bad)}:\n" + "\n".join(bad[:40])


@pytest.mark.parametrize("width", WIDTHS)
def test_no_name_breaks_inside_a_word(measured, width):
    bad = _report(measured, width, 2)
    assert bad == [], f"{len(bad)} at {width} width:\n" + "\n".join(bad[:40])


def test_the_checks_see_each_fault(browser, base_url):
    """Each check, on a page made to show its fault: none is vacuous."""
    tab = Visit(browser, WIDTHS["desktop"])
    try:
        tab.goto(f"{base_url}/{PAGES[0]}")
        tab.page.set_content(
            '<div class="bd-article" style="width:300px;padding:0 10px">'
            '<table style="width:100px;table-layout:fixed"><tr><td><span style="white-space:nowrap">'
            + "wide "
            * 40
            + "</span></td></tr></table>"
            '<div style="overflow-x:auto"><pre>' + "x" * 200 + "</pre></div>"
            '<p style="width:60px;overflow-wrap:anywhere"><code>scaled_dot_product_attention</code></p></div>'
            '<div class="bd-sidebar-secondary" style="width:80px"><a style="display:block;overflow:hidden;'
            'white-space:nowrap">unitscale.TransformedModule.forward</a></div>'
        )
        wide = tab.page.evaluate(WIDE_JS)
        assert any("reaches past" in line and "wide wide" in line for line in wide), wide
        assert any("no cue" in line for line in wide), wide
        assert tab.page.evaluate(SIDEBAR_JS), "the cut sidebar entry is not seen"
        assert any("scaled" in line for line in tab.page.evaluate(BROKEN_NAMES_JS))
    finally:
        tab.close()


@pytest.mark.parametrize(
    "scope",
    [".prev-next-area .prev-next-title", ".bd-article code.literal"],
    ids=["footer titles", "inline code"],
)
def test_no_name_breaks_inside_a_word_on_a_phone_on_guide_and_tutorial_pages(browser, base_url, scope):
    """On the guide and tutorial pages at 390 px: the footer's Previous/Next titles, in half a
    phone's width ("Benchmar|ks" broke at the theme's font size), and names in inline code
    (ScaleTrackingInterpret|er, underflow_fraction(|)) break between words or at a name's parts,
    never inside a word."""
    pages = sorted(str(p.relative_to(SITE)) for p in [*SITE.glob("docs/*.html"), *SITE.glob("tutorials/*.html")])
    assert len(pages) > 20, pages
    start = "const scopes = '"
    assert start in BROKEN_NAMES_JS
    check = BROKEN_NAMES_JS.replace(
        "for (const scope of document.querySelectorAll(scopes))",
        f"for (const scope of document.querySelectorAll({scope!r}))",
    )
    tab = Visit(browser, WIDTHS["phone"])
    try:
        bad = []
        for page in pages:
            tab.goto(f"{base_url}/{page}")
            bad += [f"{page}: {line}" for line in tab.page.evaluate(check)]
    finally:
        tab.close()
    assert bad == [], "\n".join(bad)
