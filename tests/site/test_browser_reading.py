"""Can a reader read every page? Figures, code outputs and layout, measured in Chromium.

Every page of the built site (today's and any added later: the list comes from the build) is
checked for what a reader notices and a build does not:

- **Nothing broken or fetched from outside**: no console or page error, no failed request, no
  request that leaves the machine (see :class:`browser_tab.Visit`).

- **Figure text size.** Tutorials draw figures at 100 dpi with text of at least 9 pt (12.5 px at
  native size). A figure shown at a fraction ``s`` of its native width shows that text at
  ``12.5 * s`` px; below :data:`MIN_FIGURE_SCALE` it falls under 9 px. Checked at desktop and
  phone width, from each image's rendered width and its ``naturalWidth``.
- **Contrast of code and outputs** (every ``pre``, every cell output) in light and dark mode:
  each piece of text against the background it is drawn on, from computed styles, at least
  WCAG's 4.5:1 for body text.
- **Nothing wider than its container** at desktop and phone width: an element whose content is
  wider than its box must scroll (``overflow-x: auto``/``scroll``), never stick out or be cut off;
  and the page itself never scrolls sideways.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.site.browser_tab import Visit

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))

PAGES = sorted(
    str(p.relative_to(SITE))
    for p in SITE.rglob("*.html")
    if p.relative_to(SITE).parts[0] != "_static" and 'http-equiv="refresh"' not in p.read_text()  # not a redirect
)
VIEWPORTS = {"desktop": {"width": 1280, "height": 900}, "phone": {"width": 390, "height": 844}}
FIGURE_DPI, MIN_FIGURE_PT, MIN_TEXT_PX = 100, 9, 9
# the smallest rendered / native width at which 9 pt text at 100 dpi is still 9 px tall
MIN_FIGURE_SCALE = MIN_TEXT_PX / (MIN_FIGURE_PT * FIGURE_DPI / 72)
MIN_CONTRAST = 4.5

# What a page shows, not its redirect stub (the site root's index.html only forwards).
CONTENT = "document.querySelector('.bd-article') || document.querySelector('.bd-content') || document.body"

FIGURES_JS = f"""() => {{
  const root = {CONTENT};
  return [...root.querySelectorAll('img')]
    .filter(img => img.complete && img.naturalWidth > 0 && img.getClientRects().length)
    .map(img => {{
      const cs = getComputedStyle(img);
      const px = name => parseFloat(cs[name]) || 0;
      const width = img.getBoundingClientRect().width - px('paddingLeft') - px('paddingRight')
        - px('borderLeftWidth') - px('borderRightWidth');
      return {{src: img.getAttribute('src'), natural: img.naturalWidth, rendered: width}};
    }});
}}"""

OVERFLOW_JS = f"""() => {{
  const root = {CONTENT};
  const bad = [];
  const name = el => el.tagName.toLowerCase() + (el.className && typeof el.className === 'string'
    ? '.' + el.className.trim().split(/\\s+/).join('.') : '');
  const scrolls = el => ['auto', 'scroll'].includes(getComputedStyle(el).overflowX);
  const inScroller = el => {{  // content a reader reaches by scrolling an enclosing box
    for (let e = el.parentElement; e && root.contains(e); e = e.parentElement) if (scrolls(e)) return true;
    return false;
  }};
  for (const el of [root, ...root.querySelectorAll('*')]) {{
    if (el instanceof SVGElement || !el.getClientRects().length || inScroller(el)) continue;
    const cs = getComputedStyle(el);
    // inline boxes have no scroll box; a scrolling box is the cure, not the fault
    if (cs.display.startsWith('inline') && cs.display !== 'inline-block') continue;
    if (cs.overflowX === 'auto' || cs.overflowX === 'scroll') continue;
    if (el.scrollWidth > el.clientWidth + 1) {{
      const text = (el.innerText || '').trim().slice(0, 60).replace(/\\s+/g, ' ');
      bad.push(`${{name(el)}} (overflow-x ${{cs.overflowX}}): content ${{el.scrollWidth}} px `
        + `in a ${{el.clientWidth}} px box: "${{text}}"`);
    }}
  }}
  const page = document.documentElement;
  if (page.scrollWidth > window.innerWidth + 1)
    bad.push(`the page scrolls sideways: ${{page.scrollWidth}} > ${{window.innerWidth}} px`);
  return bad;
}}"""

CONTRAST_JS = f"""() => {{
  const root = {CONTENT};
  const rgba = s => {{
    const m = s.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return [0, 0, 0, 0];
    const v = m[1].split(/[ ,\\/]+/).filter(Boolean).map(Number);
    return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
  }};
  const over = (top, below) => {{  // alpha-composite a colour over an opaque one
    const a = top[3];
    return [0, 1, 2].map(i => top[i] * a + below[i] * (1 - a)).concat([1]);
  }};
  const background = el => {{
    const layers = [];
    for (let e = el; e; e = e.parentElement) {{
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }}
    let colour = [255, 255, 255, 1];  // the canvas
    for (const layer of layers.reverse()) colour = over(layer, colour);
    return colour;
  }};
  const luminance = c => {{
    const linear = v => (v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4;
    const [r, g, b] = c.slice(0, 3).map(linear);
    return 0.2126 * r + 0.7152 * g + 0.0722 * b;
  }};
  const worst = new Map();
  const texts = [...root.querySelectorAll('pre, .cell_output')].flatMap(box => [box, ...box.querySelectorAll('*')]);
  for (const el of new Set(texts)) {{
    const own = [...el.childNodes].filter(n => n.nodeType === 3 && n.textContent.trim()).map(n => n.textContent.trim());
    if (!own.length || !el.getClientRects().length) continue;
    const bg = background(el);
    const fg = over(rgba(getComputedStyle(el).color), bg);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    const key = getComputedStyle(el).color + ' on ' + bg.slice(0, 3).join(',');
    if (!worst.has(key) || worst.get(key).ratio > ratio) worst.set(key, {{ratio, key, text: own[0].slice(0, 40)}});
  }}
  return [...worst.values()];
}}"""


@pytest.fixture(scope="module")
def pages(browser):
    """``open(url, viewport)``: a :class:`browser_tab.Visit` at that viewport, one tab per viewport."""
    tabs: dict[str, Visit] = {}

    def open_(url, viewport):
        if viewport not in tabs:
            tabs[viewport] = Visit(browser, VIEWPORTS[viewport])
        return tabs[viewport].goto(url)

    yield open_
    for tab in tabs.values():
        tab.close()


def _figure_problems(tab) -> list[str]:
    return [
        f"figure {f['src']} shown at {f['rendered']:.0f} of its {f['natural']} px (under "
        f"{MIN_FIGURE_SCALE:.0%}, so 9 pt text reads under {MIN_TEXT_PX} px: draw it at most 7.5 in wide "
        f"at dpi {FIGURE_DPI}, figsize=(7.5, h))"
        for f in tab.evaluate(FIGURES_JS)
        if f["rendered"] < MIN_FIGURE_SCALE * f["natural"] - 0.5
    ]


def _contrast_problems(tab) -> list[str]:
    tab.add_style_tag(content="*, *::before, *::after { transition: none !important; }")
    problems = []
    for mode in ("light", "dark"):
        tab.evaluate(f"document.documentElement.dataset.theme = '{mode}'")
        problems += [
            f"{mode} mode: {c['key']} is {c['ratio']:.2f}:1 (under {MIN_CONTRAST}:1), e.g. {c['text']!r}"
            for c in tab.evaluate(CONTRAST_JS)
            if c["ratio"] < MIN_CONTRAST
        ]
    return problems


@pytest.mark.parametrize("viewport", VIEWPORTS)
@pytest.mark.parametrize("page", PAGES)
def test_page_reads(pages, base_url, page, viewport):
    """No console error or request off the machine; figures' text >= 9 px; nothing wider than its box;
    at desktop width, code contrast in both modes."""
    visit = pages(f"{base_url}/{page}", viewport)
    tab = visit.page
    problems = visit.errors + [f"asks for {host} (a reader may have no network)" for host in sorted(visit.external)]
    problems += _figure_problems(tab) + tab.evaluate(OVERFLOW_JS)
    if viewport == "desktop":
        problems += _contrast_problems(tab)
    assert problems == [], f"{page} at {viewport} width:\n" + "\n".join(problems)


def test_the_checks_see_a_shrunk_figure_clipped_text_and_low_contrast(pages, base_url):
    """The three checks, on a page made to fail each: they are not vacuous."""
    tab = pages(f"{base_url}/{PAGES[0]}", "desktop").page
    tab.set_content(
        '<div class="bd-article" style="width:300px">'
        '<img style="width:100px" src="data:image/svg+xml,'
        "%3Csvg xmlns='http://www.w3.org/2000/svg' width='400' height='10'/%3E\">"
        '<div style="overflow:hidden;white-space:nowrap">' + "x" * 200 + "</div>"
        '<pre style="background:#222;color:#333">faint</pre></div>'
    )
    tab.wait_for_function("document.images[0].complete")
    figure = tab.evaluate(FIGURES_JS)[0]
    assert figure["natural"] == 400 and figure["rendered"] == 100
    assert any("overflow-x hidden" in line for line in tab.evaluate(OVERFLOW_JS))
    assert min(c["ratio"] for c in tab.evaluate(CONTRAST_JS)) < 1.5
