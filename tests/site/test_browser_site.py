"""The built site, in a real browser: Debian's Chromium driven by Playwright.

Serves the built site (``_build/html``, or ``$UNITSCALE_SITE``) on 127.0.0.1 from a thread and
checks what a reader sees (``test_browser_reading`` checks every page's console, requests,
figures, contrast and layout): the site root forwards to the home page, every executed figure
renders, search finds the API, the dark-mode toggle works, code cells (not outputs) have copy
buttons, and each tutorial's ``.ipynb`` download is a valid notebook. Run after the site build
(``make test`` does)."""

import os
from pathlib import Path

import nbformat
import pytest

import unitscale
from tests.site.browser_tab import Visit

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))

# every page a reader can reach (not the theme's template macros copied into _static)
PAGES = sorted(str(path) for path in (p.relative_to(SITE) for p in SITE.rglob("*.html")) if path.parts[0] != "_static")
TUTORIALS = sorted(p.stem for p in (ROOT / "tutorials").glob("[0-9][0-9]*_*.md"))


@pytest.fixture(scope="module")
def tab(browser):
    visit = Visit(browser)
    yield visit
    visit.close()


@pytest.fixture
def visit(tab, browser):
    """``visit(url)`` opens ``url`` in the shared tab (``fresh_context=True``: in a new one)."""
    fresh = []

    def open_(url, fresh_context=False):
        if not fresh_context:
            return tab.goto(url)
        v = Visit(browser)
        fresh.append(v)
        return v.goto(url)

    yield open_
    for v in fresh:
        v.close()


def test_site_has_every_kind_of_page():
    names = set(PAGES)
    for page in [
        "docs/index.html",
        "docs/api.html",
        "docs/concepts.html",
        "docs/install.html",
        "docs/run-locally.html",
        "docs/benchmarks.html",
        "docs/execution.html",
        "docs/glossary.html",
        "search.html",
    ]:
        assert page in names, f"{page} missing from the built site"
    for name in unitscale.__all__:
        assert f"docs/generated/unitscale.{name}.html" in names, f"no API page for unitscale.{name}"
    for tutorial in TUTORIALS:
        assert f"tutorials/{tutorial}.html" in names


def test_the_site_root_forwards_to_the_home_page(visit, base_url):
    """Every other page's console and requests are checked by ``test_browser_reading``."""
    v = visit(f"{base_url}/index.html")
    v.page.wait_for_url(f"{base_url}/docs/index.html")
    v.page.wait_for_load_state("load")
    assert v.errors == [] and v.external == set()


def test_a_request_off_the_machine_is_recorded_and_goes_nowhere(visit, base_url):
    """The check every page gets (``test_browser_reading``) sees a file asked for from outside."""
    v = visit(f"{base_url}/docs/index.html")
    v.page.set_content(
        '<img src="https://example.com/logo.png"><script src="http://203.0.113.5/x.js"></script>'
        '<img src="/_static/favicon.svg">'
    )
    assert v.external == {"example.com", "203.0.113.5"}
    assert v.page.evaluate("[...document.images].map(i => i.naturalWidth > 0)") == [False, True]
    assert not [e for e in v.errors if "request failed" in e]


def test_every_executed_figure_renders(visit, base_url):
    rendered = 0
    for tutorial in TUTORIALS:
        page = visit(f"{base_url}/tutorials/{tutorial}.html").page
        images = page.locator(".cell_output img")
        for i in range(images.count()):
            image = images.nth(i)
            image.scroll_into_view_if_needed()
            width = image.evaluate("img => img.complete ? img.naturalWidth : 0")
            assert width > 0, f"{tutorial}: figure {i} ({image.get_attribute('src')}) did not render"
            rendered += 1
    assert rendered > 0, "no tutorial drew a figure"


@pytest.mark.parametrize(
    ("term", "needs"),
    # each term is a public name another module provides
    [("analyse_module", "analysis"), ("partition", "stages")],
)
def test_search_finds_the_api(visit, base_url, term, needs):
    assert term in unitscale.__all__, f"unitscale.{term} ({needs}) is not exported"
    page = visit(f"{base_url}/search.html?q={term}").page
    page.wait_for_selector("#search-results ul.search li", timeout=15_000)
    results = page.locator("#search-results ul.search li a")
    links = [results.nth(i).get_attribute("href") or "" for i in range(results.count())]
    assert any(f"unitscale.{term}" in link for link in links), links


def test_search_finds_a_tutorial_word(visit, base_url):
    page = visit(f"{base_url}/search.html?q=tracking").page
    page.wait_for_selector("#search-results ul.search li", timeout=15_000)
    assert page.locator("#search-results ul.search li").count() > 0


def test_dark_mode_toggle_changes_the_theme(visit, base_url):
    page = visit(f"{base_url}/docs/index.html", fresh_context=True).page
    html = page.locator("html")
    assert html.get_attribute("data-theme") == "light"
    light = page.evaluate("getComputedStyle(document.body).backgroundColor")
    page.locator(".theme-switch-button:visible").first.click()  # opens the light/dark/system menu
    page.locator(".theme-change-button[data-mode=dark]:visible").first.click()
    assert html.get_attribute("data-theme") == "dark"
    assert page.evaluate("getComputedStyle(document.body).backgroundColor") != light


@pytest.mark.parametrize("tutorial", TUTORIALS)
def test_ipynb_download_is_a_valid_notebook(visit, base_url, tutorial):
    v = visit(f"{base_url}/tutorials/{tutorial}.html")
    link = v.page.locator("a.dropdown-item", has_text=".ipynb")
    assert link.count() == 1, "no .ipynb entry in the download menu"
    response = v.page.request.get(link.get_attribute("href") and v.page.evaluate("a => a.href", link.element_handle()))
    assert response.ok
    notebook = nbformat.reads(response.text(), as_version=4)
    nbformat.validate(notebook)
    assert notebook.metadata.kernelspec.name == "python3"
    assert [c.cell_type for c in notebook.cells].count("code") > 0


@pytest.mark.parametrize("page", ["docs/index.html", "docs/install.html"])
def test_the_wheel_link_downloads_the_wheel(visit, base_url, page):
    link = visit(f"{base_url}/{page}").page.locator("a", has_text="py3-none-any.whl")
    assert link.count() == 1, "no link to the wheel"
    response = link.page.request.get(link.page.evaluate("a => a.href", link.element_handle()))
    assert response.ok and response.body()[:4] == b"PK\x03\x04", "the link is not a wheel (a zip file)"


def test_copy_buttons_on_code_but_not_on_outputs(visit, base_url):
    page = visit(f"{base_url}/tutorials/{TUTORIALS[0]}.html").page
    assert page.locator(".cell_input button.copybtn").count() > 0
    assert page.locator(".cell_output button.copybtn").count() == 0
    install = visit(f"{base_url}/docs/install.html").page
    assert install.locator("div.highlight-bash button.copybtn").count() > 0


@pytest.mark.parametrize(
    ("page", "group", "elsewhere"),
    [
        ("unitscale.track_scales", "Tracking scales", "partition"),
        ("unitscale.functional.linear", "Unit-scaled ops", "Linear"),
        ("unitscale.StagePlan", "Pipeline stages", "track_scales"),
    ],
)
def test_an_api_page_sidebar_lists_its_group_not_the_whole_reference(visit, base_url, page, group, elsewhere):
    """The reference has some 230 pages; the sidebar of one shows the groups and the open group's names only.

    The names are short (``track_scales``): the group above them says where they live.
    """
    v = visit(f"{base_url}/docs/generated/{page}.html")
    shown = v.page.evaluate(
        """() => [...document.querySelectorAll('.bd-sidebar-primary nav a')]
            .filter(a => a.offsetParent !== null).map(a => a.textContent.trim())"""
    )
    assert group in shown and page.rsplit(".", 1)[-1] in shown, shown
    assert elsewhere not in shown
    assert len(shown) < 90, f"{len(shown)} links in the sidebar of {page}"


@pytest.mark.parametrize("group", ["functional", "tracking", "errors"])
def test_an_api_table_fits_the_desktop_column_and_keeps_short_names_on_one_line(visit, base_url, group):
    """Names break after a dot only where they must; the summaries beside them are not scrolled away."""
    v = visit(f"{base_url}/docs/api/{group}.html")
    fit = v.page.evaluate(
        """() => {
            const table = document.querySelector('.bd-article table.autosummary');
            const column = document.querySelector('.bd-article').clientWidth;
            const lines = [...table.querySelectorAll('td:first-child span.pre')].map(name => {
                const tops = new Set([...name.getClientRects()].map(r => Math.round(r.top)));
                return [name.textContent, tops.size];
            });
            return {width: table.getBoundingClientRect().width, column, lines};
        }"""
    )
    assert fit["width"] <= fit["column"], fit
    short = [(name, lines) for name, lines in fit["lines"] if len(name) <= 28]
    assert short and all(lines == 1 for _, lines in short), short
