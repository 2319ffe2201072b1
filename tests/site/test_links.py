"""Every internal link of the built site leads somewhere: the file exists and so does the anchor.

Reads the HTML files of the built site (``_build/html``, or ``$UNITSCALE_SITE``) with Python's
own parser, no browser: every ``href`` and ``src`` that stays on the site (no scheme, not
``mailto:``) must name a file of the build, and a ``#fragment`` an ``id`` (or ``name``) on the
page it points to. External links are not fetched: the build and its tests run offline.
"""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

pytestmark = pytest.mark.built

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
# the theme's own template fragments, copied into _static, are not pages
SKIP = ("_static/",)
EXTERNAL = {"http", "https", "mailto", "ftp", "data", "javascript", "tel"}


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        for key in ("id", "name") if tag == "a" else ("id",):
            if values.get(key):
                self.ids.add(values[key] or "")
        for key in ("href", "src"):
            if values.get(key):
                self.links.append(values[key] or "")


def site_pages(site: Path) -> list[Path]:
    """Every HTML page of ``site`` (resolved), the theme's fragments in ``_static`` left out."""
    root = site.resolve()
    return [p for p in sorted(root.rglob("*.html")) if not p.relative_to(root).as_posix().startswith(SKIP)]


@pytest.fixture
def built_site() -> Path:
    """The built site, or a failure that says how to build it."""
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `make html` (or set UNITSCALE_SITE)")
    return SITE


def broken_links(site: Path) -> list[str]:
    """``page: link (why)`` for every internal link of ``site`` that leads nowhere."""
    pages: dict[Path, _Page] = {}

    def parse(path: Path) -> _Page:
        if path not in pages:
            page = _Page()
            page.feed(path.read_text(encoding="utf-8", errors="replace"))
            pages[path] = page
        return pages[path]

    broken = []
    root = site.resolve()
    for path in site_pages(root):
        name = path.relative_to(root).as_posix()
        for link in parse(path).links:
            parts = urlsplit(link)
            if parts.scheme in EXTERNAL or parts.netloc:
                continue
            if parts.scheme:  # `file.py:12` reads as the scheme `file.py`: a browser finds nothing there
                broken.append(f"{name}: {link} (not a link a browser can follow)")
                continue
            target = (path.parent / unquote(parts.path)).resolve() if parts.path else path
            if parts.path.endswith("/") or target.is_dir():
                target = target / "index.html"
            shown = target.relative_to(root) if target.is_relative_to(root) else target
            if not target.is_file():
                broken.append(f"{name}: {link} (no file {shown})")
                continue
            fragment = unquote(parts.fragment)
            if fragment and target.suffix == ".html" and fragment not in parse(target).ids:
                broken.append(f"{name}: {link} (no id {fragment!r} on {shown})")
    return broken


def test_every_internal_link_and_anchor_resolves(built_site):
    broken = broken_links(built_site)
    assert broken == [], f"{len(broken)} broken internal links:\n" + "\n".join(broken[:40])


def test_the_link_check_sees_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.html").write_text('<h1 id="top">A</h1><a href="b.html#top">ok</a><a href="b.html#gone">x</a>')
    links = '<a href="missing.html">y</a><a href="a.py:12">z</a><a href="#top">t</a>'
    (tmp_path / "b.html").write_text(f'<p id="top">B</p>{links}')
    assert broken_links(tmp_path) == [
        "a.html: b.html#gone (no id 'gone' on b.html)",
        "b.html: missing.html (no file missing.html)",
        "b.html: a.py:12 (not a link a browser can follow)",
    ]


def test_source_pages_are_the_packages_own_modules(built_site):
    """viewcode writes a page per module it reads; only ``unitscale``'s sources are the site's to show."""
    modules = built_site / "_modules"
    pages = sorted(p.relative_to(modules).as_posix() for p in modules.rglob("*.html"))
    assert "unitscale/tracking/analysis.html" in pages  # a module the API reference documents
    assert [p for p in pages if p != "index.html" and not p.startswith("unitscale/")] == []


def test_every_page_names_its_icon(built_site):
    """A page without ``<link rel="icon">`` makes the browser ask for ``/favicon.ico``: a 404 in the
    console, logged or not depending on whether a redirect wins the race (CI saw it on the root page)."""
    root = built_site.resolve()
    pages = site_pages(root)
    assert root / "index.html" in pages and len(pages) > 50
    iconless = [p.relative_to(root).as_posix() for p in pages if 'rel="icon"' not in p.read_text(encoding="utf-8")]
    assert iconless == []
