"""The built site (``_build/html``, or ``$UNITSCALE_SITE``) serves the wheel of this checkout.

``test_reader_environment`` installs it from the site's URL into a fresh environment; this
checks that what it installs is this checkout's package, file for file.
"""

import os
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("UNITSCALE_SITE", ROOT / "_build" / "html"))
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from wheel_download import wheel_name  # noqa: E402


def test_the_site_serves_the_wheel_of_these_sources():
    wheel = SITE / wheel_name(ROOT)
    assert wheel.is_file(), f"the site has no {wheel.name} at its root"
    with zipfile.ZipFile(wheel) as archive:
        packaged = {name: archive.read(name) for name in archive.namelist() if name.endswith(".py")}
    sources = {str(p.relative_to(ROOT)): p.read_bytes() for p in (ROOT / "unitscale").rglob("*.py")}
    assert packaged == sources, "the served wheel is stale: rebuild the site"
