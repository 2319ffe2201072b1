"""A Chromium tab for the browser tests that records what went wrong on each page it visits."""

import re
from urllib.parse import urlparse

# only requests that leave the loopback server are intercepted: routing every request through
# Python would slow each page load
EXTERNAL = re.compile(r"^(?!http://127\.0\.0\.1[:/])[a-z]+://")


class Visit:
    """A browser tab that records console errors, page errors, failed and external requests.

    The site needs nothing from outside: a request that leaves the loopback server is answered
    empty and recorded (``external``), since a reader of a local build may have no network.

    Every navigation starts with empty ``localStorage``, as a first visit does (the theme's
    light/dark mode lives there), so one tab can visit many pages quickly.
    """

    def __init__(self, browser, viewport: dict[str, int] | None = None):
        self.context = browser.new_context(viewport=viewport) if viewport else browser.new_context()
        self.context.add_init_script("window.localStorage.clear()")
        self.context.route(EXTERNAL, self._route)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.external: set[str] = set()
        self.page.on("console", lambda m: m.type == "error" and self.errors.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        self.page.on("requestfailed", self._failed)

    def _failed(self, request):
        # ERR_ABORTED: a request the next navigation cancelled (a late favicon), not a fault;
        # a missing file is a 404, which the console reports as an error.
        if "ERR_ABORTED" not in (request.failure or ""):
            self.errors.append(f"request failed: {request.url} {request.failure}")

    def _route(self, route):
        self.external.add(urlparse(route.request.url).hostname or route.request.url)
        route.fulfill(status=200, body="", content_type="text/javascript")

    def goto(self, url):
        self.errors.clear()
        self.external.clear()
        response = self.page.goto(url, wait_until="load")
        assert response is not None and response.ok, f"{url}: HTTP {response and response.status}"
        return self

    def close(self):
        self.context.close()
