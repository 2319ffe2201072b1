"""A Chromium tab for the browser tests that records what went wrong on each page it visits."""

import re
from urllib.parse import urlparse

# a request that would leave the loopback server
EXTERNAL = re.compile(r"^(?!http://127\.0\.0\.1[:/])[a-z]+://")


class Visit:
    """A browser tab that records console errors, page errors, failed and external requests.

    The site needs nothing from outside: a request that leaves the loopback server is recorded
    (``external``), since a reader of a local build may have no network. The browser
    (``conftest.browser``) sends such requests to a proxy that is not there, so none leaves the
    machine. They are not intercepted with ``route``: Playwright turns the HTTP cache off for a
    context that routes, and every page then fetched the theme's 1.5 MB of scripts again (0.24 s
    a page against 0.14 s, over 600 page visits).

    Every navigation starts with empty ``localStorage``, as a first visit does (the theme's
    light/dark mode lives there), so one tab can visit many pages quickly. ``theme="dark"``
    stores the dark mode instead, before the page's scripts run, as a reader's choice does.
    """

    def __init__(self, browser, viewport: dict[str, int] | None = None, theme: str | None = None):
        self.context = browser.new_context(viewport=viewport) if viewport else browser.new_context()
        store = "localStorage.setItem('mode', '{0}'); localStorage.setItem('theme', '{0}');"
        chosen = "" if theme is None else " " + store.format(theme)
        self.context.add_init_script("window.localStorage.clear();" + chosen)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.external: set[str] = set()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("request", self._request)
        self.page.on("requestfailed", self._failed)

    def _request(self, request):
        if EXTERNAL.match(request.url):
            self.external.add(urlparse(request.url).hostname or request.url)

    def _failed(self, request):
        # ERR_ABORTED: a request the next navigation cancelled (a late favicon), not a fault;
        # a missing file is a 404, which the console reports as an error; an external request
        # fails at the proxy and is already recorded.
        if "ERR_ABORTED" not in (request.failure or "") and not EXTERNAL.match(request.url):
            self.errors.append(f"request failed: {request.url} {request.failure}")

    def goto(self, url):
        self.errors.clear()
        self.external.clear()
        response = self.page.goto(url, wait_until="load")
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        return self

    def close(self):
        self.context.close()
