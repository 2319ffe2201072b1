"""Pipeline workers die with the process that started them, even when it is killed with SIGKILL (issue 37)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]

# stage 1 hangs (in the worker only), so the run is still going when its parent is killed
SCRIPT = textwrap.dedent(
    """
    import sys
    from tests.stages.test_pipeline_faults import faulty_plan
    from unitscale import run_pipeline
    import torch

    if __name__ == "__main__":
        plan = faulty_plan("hang", 1)
        print("running", flush=True)
        run_pipeline(plan, torch.randn(4, 4), num_microbatches=2, timeout=300)
    """
)


def _workers(parent: psutil.Process) -> list[psutil.Process]:
    return [p for p in parent.children(recursive=True) if "unitscale.stages.runtime.worker" in " ".join(p.cmdline())]


def _joined(workers: list[psutil.Process]) -> bool:
    """Whether both workers wrote the file that says they joined (in the scratch folder they were given)."""
    if len(workers) != 2:
        return False
    scratch = Path(workers[0].cmdline()[-1])
    return all((scratch / f"rank{r}.joined").exists() for r in range(2))


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_workers_exit_within_5_s_of_their_parent_being_killed(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    child = subprocess.Popen([sys.executable, str(script)], env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    parent = psutil.Process(child.pid)
    workers: list[psutil.Process] = []
    try:
        assert child.stdout is not None and child.stdout.readline() == "running\n"
        deadline = time.monotonic() + 90
        # both workers started and joined their group (past their imports, into the run)
        while time.monotonic() < deadline and child.poll() is None and not _joined(workers):
            workers = workers if len(workers) == 2 else _workers(parent)
            time.sleep(0.05)
        assert _joined(workers) and child.poll() is None, "the pipeline's workers did not start"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        while _alive(workers) and time.monotonic() < killed + 5:
            time.sleep(0.05)
        survivors = _alive(workers)
        assert not survivors, f"{len(survivors)} worker(s) still alive 5 s after their parent was killed"
    finally:
        for p in _alive(workers):
            p.kill()
        if child.poll() is None:
            child.kill()
            child.wait(10)
        assert child.stdout is not None
        child.stdout.close()
