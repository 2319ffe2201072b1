"""A page listed in ``nb_execute_alone`` executes with no other notebook beside it, even under ``-j``.

The pipeline tutorial compares a predicted step time with a measured one; in a parallel build
another notebook would share its cores. A tiny site of seven pages, built with ``-j 2``, records
when each notebook's cell ran: the listed page's interval overlaps no other, while two ordinary
pages do overlap (the control: the build really ran notebooks side by side).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.site.test_build_failures import CONF, SPHINX, notebook

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from execute_alone import HeldWhileExecuting  # noqa: E402


def _build(tmp_path: Path, pages: dict[str, str], alone: list[str]) -> subprocess.CompletedProcess:
    """Build ``pages`` with ``-j 2`` and the project's settings, listing ``alone`` in ``nb_execute_alone``."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(CONF + f"nb_execute_alone = {alone!r}\n")
    (src / "index.md").write_text("# Tiny\n\n```{toctree}\n" + "\n".join(pages) + "\n```\n")
    for name, text in pages.items():
        (src / f"{name}.md").write_text(text)
    env = {**os.environ, "NB_EXECUTION_MODE": "force", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    return subprocess.run(
        [*SPHINX, "-j", "2", str(src), str(tmp_path / "html"), "-d", str(tmp_path / "doctrees")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


CELL = """\
import json, time
start = time.time()
time.sleep(1.0)
with open({log!r}, "a") as f:
    f.write(json.dumps([{name!r}, start, time.time()]) + "\\n")
"""


@pytest.mark.slow
def test_a_listed_page_executes_alone_in_a_parallel_build(tmp_path):
    log = tmp_path / "intervals.jsonl"
    names = ["alone", *(f"page{i}" for i in range(5))]
    pages = {name: notebook(name, CELL.format(log=str(log), name=name)) for name in names}
    result = _build(tmp_path, pages, alone=["alone"])
    assert result.returncode == 0, result.stdout + result.stderr
    intervals = {name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())}
    assert sorted(intervals) == sorted(names)

    def overlap(a: str, b: str) -> bool:
        return intervals[a][0] < intervals[b][1] and intervals[b][0] < intervals[a][1]

    assert not [name for name in names[1:] if overlap("alone", name)]
    assert any(overlap(a, b) for a in names[1:] for b in names[1:] if a < b)


class _Client:
    def __init__(self, events: list[str]) -> None:
        self.events = events

    def __enter__(self) -> "_Client":
        self.events.append("enter")
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append("exit")


class _Failing(_Client):
    def __enter__(self) -> "_Client":
        raise RuntimeError("the notebook failed")


def test_the_lock_is_released_after_the_client_and_when_it_fails(tmp_path):
    import fcntl

    lock = tmp_path / "lock"
    events: list[str] = []
    with HeldWhileExecuting(_Client(events), lock, exclusive=True) as client:
        assert isinstance(client, _Client)  # the real client, as MyST-NB expects
        with open(lock) as other, pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # held exclusively meanwhile
    assert events == ["enter", "exit"]
    with pytest.raises(RuntimeError, match="the notebook failed"), HeldWhileExecuting(_Failing([]), lock, True):
        pass
    with open(lock) as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free again: no exception


@pytest.mark.slow
def test_a_listed_name_that_is_no_page_fails_the_build(tmp_path):
    result = _build(tmp_path, {"tutorial": notebook("Works", "print(6 * 7)")}, alone=["tutorials/typo"])
    assert result.returncode != 0
    message = "nb_execute_alone lists 'tutorials/typo', which is not a page of this site"
    assert message in result.stdout + result.stderr
