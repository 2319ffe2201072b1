"""Faults in pipeline workers: the right stage is blamed, first, and nothing is left running.

Each fault is a wrapped function (one graph node) that acts only inside the worker of
the chosen stage, so partitioning and the single-process reference are unaffected.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
import torch.fx
from torch import nn

from unitscale import partition, run_pipeline
from unitscale.errors import InputError, PipelineError

REPO = Path(__file__).resolve().parents[2]


def fault(x: torch.Tensor, mode: str, stage: int) -> torch.Tensor:
    import torch.distributed as dist

    # only inside a worker: the caller never joins a process group
    if not dist.is_initialized() or dist.get_rank() != stage:
        return x
    if mode == "raise":
        raise ValueError(f"fault injected in stage {stage}")
    if mode == "exit":
        os._exit(3)
    if mode == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":
        time.sleep(120)
    return x


torch.fx.wrap("fault")


class Fault(nn.Module):
    def __init__(self, mode: str, stage: int) -> None:
        super().__init__()
        self.mode, self.stage = mode, stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fault(x, self.mode, self.stage)


def faulty_plan(mode: str, stage: int) -> object:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), Fault(mode, stage), nn.Linear(8, 4), Fault(mode, stage))
    return partition(model, 2, torch.randn(4, 4))


def children() -> list[psutil.Process]:
    """Our live descendant processes, less multiprocessing's forkserver and resource tracker.

    Those two live on between runs by design; stage workers must not. Workers are forked by
    the forkserver (they are its children and share its command line), so the helpers are
    told apart as our direct children.
    """
    names = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")
    me = psutil.Process()
    helpers = {p.pid for p in me.children() if any(n in " ".join(p.cmdline()) for n in names)}
    alive = []
    for p in me.children(recursive=True):
        try:
            if p.pid not in helpers and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


@pytest.mark.parametrize(
    ("mode", "stage", "first_line"),
    [
        ("raise", 0, r"^stage 0 worker failed: ValueError: fault injected in stage 0\n"),
        ("raise", 1, r"^stage 1 worker failed: ValueError: fault injected in stage 1\n"),
        ("exit", 0, r"^stage 0 worker exited with code 3 without a result"),
        ("exit", 1, r"^stage 1 worker exited with code 3 without a result"),
        ("kill", 0, r"^stage 0 worker was killed by SIGKILL \(exit code -9\)"),
    ],
    ids=["raise-stage0", "raise-stage1", "exit-stage0", "exit-stage1", "kill-stage0"],
)
def test_a_failing_worker_is_named_first_with_its_cause(mode: str, stage: int, first_line: str) -> None:
    plan = faulty_plan(mode, stage)
    started = time.monotonic()
    with pytest.raises(PipelineError, match=first_line) as info:
        run_pipeline(plan, torch.randn(4, 4), num_microbatches=2, timeout=300)
    # A missed failure would wait out the 300 s timeout; the bound leaves room for starting
    # two fresh interpreters (each imports torch) on a loaded machine.
    assert time.monotonic() - started < 90
    message = str(info.value)
    if mode == "raise":
        # the traceback comes after the cause, not before it
        assert message.index("Traceback of stage") > message.index("ValueError")
    assert "connection reset" not in message.splitlines()[0].lower()
    assert children() == []


def test_a_hanging_worker_times_out_and_is_blamed_before_the_stage_waiting_for_it() -> None:
    plan = faulty_plan("hang", 0)
    started = time.monotonic()
    with pytest.raises(
        PipelineError,
        match=r"^pipeline timed out after 10 s: stage 0 busy at .*test_pipeline_faults\.py:\d+ in fault; "
        r"stage 1 waiting",
    ):
        # 10 s, not less: the count starts when both workers joined, and building the stages
        # that follows took over 3 s on a loaded two-core machine (a fresh clone, no bytecode yet)
        run_pipeline(plan, torch.randn(4, 4), num_microbatches=2, timeout=10)
    # the 10 s count from the moment both workers joined; starting them comes first
    assert time.monotonic() - started < 60
    assert children() == []


@pytest.mark.parametrize(
    "timeout", [0, -1, math.nan, math.inf, "10", True], ids=["zero", "negative", "nan", "inf", "str", "bool"]
)
def test_bad_timeouts_are_refused_before_any_worker_starts(timeout: object) -> None:
    plan = faulty_plan("none", 0)
    with pytest.raises(
        InputError, match=r"^run_pipeline\(timeout=\.\.\.\) got .*; pass a finite number of seconds > 0"
    ):
        run_pipeline(plan, torch.randn(4, 4), 2, timeout=timeout)  # type: ignore[arg-type]
    assert children() == []


def test_uneven_microbatches_are_refused_before_any_worker_starts() -> None:
    plan = faulty_plan("none", 0)
    with pytest.raises(InputError, match=r"batch size 5 \(dim 0\), which num_microbatches=2 does not divide.*\[1, 5\]"):
        run_pipeline(plan, torch.randn(5, 4), num_microbatches=2)
    assert children() == []


def test_a_target_whose_batch_differs_from_the_inputs_is_refused() -> None:
    plan = faulty_plan("none", 0)
    with pytest.raises(InputError, match=r"target=\.\.\.\) has batch size 6 \(dim 0\) but the inputs have 4"):
        run_pipeline(plan, torch.randn(4, 4), 2, loss_fn=nn.MSELoss(), target=torch.randn(6, 4))


def test_a_plain_script_without_a_main_guard_runs_a_pipeline(tmp_path: Path) -> None:
    script = tmp_path / "no_guard.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch
            from torch import nn
            from unitscale import partition, run_pipeline

            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
            x = torch.randn(6, 4)
            out = run_pipeline(partition(model, 2, x), x, num_microbatches=3, timeout=60)
            print("MATCH", torch.allclose(out, model(x), atol=1e-5), tuple(out.shape))
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("MATCH") == 1  # the script ran once: workers did not re-run it
    assert "MATCH True (6, 2)" in done.stdout


SCRIPT_WITH_OWN_LOSS = """
import torch
from torch import nn
from unitscale import partition, run_pipeline


def my_loss(output, target):
    return (output - target).pow(2).mean()


def main():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x, y = torch.randn(4, 4), torch.randn(4, 2)
    result = run_pipeline(partition(model, 2, x), x, 2, loss_fn=my_loss, target=y, timeout=60)
    print("LOSS", round(result.loss.item(), 4), round(my_loss(model(x), y).item(), 4))

"""


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_a_loss_defined_in_the_script_needs_the_main_guard_and_says_so(tmp_path: Path, guarded: bool) -> None:
    script = tmp_path / "own_loss.py"
    call = 'if __name__ == "__main__":\n    main()\n' if guarded else "main()\n"
    script.write_text(SCRIPT_WITH_OWN_LOSS + call)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path
    )
    if guarded:
        assert done.returncode == 0, done.stderr[-2000:]
        _, got, want = done.stdout.split()
        assert got == want
    else:
        assert done.returncode != 0
        errors = [line for line in done.stderr.splitlines() if line.startswith("unitscale.errors.PipelineError")]
        # the worker says why it stopped, the caller names the stage and the fix
        assert any("worker process re-imported your script" in line for line in errors)
        first = errors[-1]
        # both workers re-run the script on their own: whichever exits first is named
        assert re.match(r"unitscale\.errors\.PipelineError: stage [01] worker exited with code 1", first)
        assert 'guard its top level with `if __name__ == "__main__":`' in first and "my_loss" in first
