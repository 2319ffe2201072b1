"""Fixtures of the site tests."""

from __future__ import annotations

import functools
import http.server
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: every request but the loopback server's goes to a proxy nobody listens on: it fails at once,
#: and the tab (``browser_tab.Visit``) records it
NO_NETWORK = {"server": "http://127.0.0.1:9", "bypass": "127.0.0.1"}


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    """The built site, served on 127.0.0.1 (a free port) for the whole run."""
    if not (SITE / "index.html").is_file():
        pytest.fail(f"no built site at {SITE}: run `make html` (or set UNITSCALE_SITE)")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(SITE)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, driven by Playwright, for the module's tests."""
    from playwright.sync_api import sync_playwright

    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no Chromium at {CHROMIUM}: `make chromium` installs Debian's package")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, proxy=NO_NETWORK)
        yield browser
        browser.close()
