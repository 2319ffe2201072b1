"""Locally cached tutorial outputs are never those of an older version of the library."""

import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from library_cache import DIGEST_LENGTH, cache_path, source_digest, stale_caches  # noqa: E402


def test_digest_follows_the_sources_not_their_timestamps(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "notes.txt").write_text("not code")
    first = source_digest(package)
    assert len(first) == DIGEST_LENGTH
    (package / "a.py").write_text("x = 1\n")  # rewritten, same bytes
    (package / "notes.txt").write_text("edited")
    assert source_digest(package) == first
    (package / "sub" / "b.py").write_text("y = 3\n")
    assert source_digest(package) != first
    (package / "sub" / "b.py").write_text("y = 2\n")
    (package / "c.py").write_text("")  # a new, empty module changes it too
    assert source_digest(package) != first


def test_only_caches_of_other_versions_are_stale(tmp_path):
    current = cache_path(tmp_path / "cache", ROOT / "unitscale")
    current.mkdir(parents=True)
    older = tmp_path / "cache" / ("0" * DIGEST_LENGTH)
    older.mkdir()
    (tmp_path / "cache" / "global.db").write_text("")  # not a version's folder
    (tmp_path / "cache" / "executed").mkdir()
    assert stale_caches(current) == [older]
    assert stale_caches(tmp_path / "missing" / "x") == []


def test_every_executed_page_is_cached_per_library_version():
    conf = runpy.run_path(str(ROOT / "conf.py"))
    kernel_code = [ROOT / "docs" / "_ext" / "figure_widths.py", ROOT / "docs" / "_ext" / "figure_widths_startup.py"]
    assert conf["KERNEL_CODE"] == kernel_code
    digest = source_digest(ROOT / "unitscale", kernel_code)
    assert Path(conf["nb_execution_cache_path"]) == ROOT / "_build" / ".jupyter_cache" / digest
    executed = sorted(
        str(page.relative_to(ROOT).with_suffix(""))
        for folder in ("docs", "tutorials")
        for page in (ROOT / folder).glob("*.md")
        if "```{code-cell}" in page.read_text()
    )
    assert executed, "no executed pages found"
    for page in executed:
        patterns = conf["page_dependencies"].get(page, [])
        assert "unitscale/**/*.py" in patterns, f"{page} is not re-run when unitscale changes"
        assert "docs/_ext/figure_widths*.py" in patterns, f"{page} is not re-run when its kernels' figure code changes"


def test_code_the_kernels_run_besides_the_package_changes_the_digest(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "a.py").write_text("x = 1\n")
    hook = tmp_path / "hook.py"
    hook.write_text("y = 1\n")
    first = source_digest(package, [hook])
    assert first != source_digest(package)
    hook.write_text("y = 2\n")
    assert source_digest(package, [hook]) != first
