"""``pip install <site URL>/unitscale-<version>-py3-none-any.whl`` works against the built site.

Serves the built site (``_build/html``, or ``$UNITSCALE_SITE``) on 127.0.0.1 as the browser
tests do, installs the wheel from its URL into a fresh folder (offline: ``--no-deps
--no-index``), and checks that the installed package is this checkout's, file for file.
"""

import os
import subprocess
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


def test_pip_installs_the_wheel_from_the_base_url(base_url, tmp_path):
    target = tmp_path / "site-packages"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PYTHONPATH": ""}
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target)]
    install = subprocess.run([*command, f"{base_url}/{wheel_name(ROOT)}"], env=env, capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-2000:]
    where = subprocess.run(
        [sys.executable, "-c", "import unitscale; print(unitscale.__file__)"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
    )
    assert where.returncode == 0, where.stderr[-2000:]
    assert Path(where.stdout.strip()) == target / "unitscale" / "__init__.py"
