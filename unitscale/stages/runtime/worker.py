"""A pipeline worker: ``python -m unitscale.stages.runtime.worker SCRATCH_DIR``, started by
:func:`~unitscale.run_pipeline`; it steps its stages and reports to a file in ``SCRATCH_DIR``.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import math
import os
import pickle
import runpy
import signal
import sys
import threading
import time
import traceback
import types
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from unitscale.fx.module_state import pytree_specs_quiet
from unitscale.stages.runtime.launch import build_rank
from unitscale.stages.runtime.measured import ActionClock, RankRecord, measure_link
from unitscale.stages.runtime.workers import MAIN_ENV, PARENT_ENV, STARTUP_S, TIMEOUT_ENV

__all__ = ["worker_main"]


def run_rank(rank: int, job: dict[str, Any]) -> dict[str, Any]:
    """Build this rank's stages and schedule (a group is joined) and step it ``warmup + steps`` times."""
    with pytree_specs_quiet():  # an exported module's specs, as they load
        modules: dict[int, torch.nn.Module] = {i: pickle.loads(b) for i, b in job["modules"].items()}
        loss_fn = pickle.loads(job["loss_fn"])
        built = build_rank(
            modules,
            job["num_stages"],
            job["schedule"],
            job["num_microbatches"],
            loss_fn,
            torch.device("cpu"),
            examples=job["examples"],
        )
    clock = ActionClock()
    for stage in built.stages:
        clock.watch(stage)
    steps: list[tuple[float, float]] = []
    output: Any = None
    losses: list[torch.Tensor] = []
    for _ in range(job["warmup"] + job["steps"]):
        for module in modules.values():
            module.zero_grad(set_to_none=True)
        losses = []
        dist.barrier()
        started = time.perf_counter()
        with torch.set_grad_enabled(loss_fn is not None), clock.timing_waits():
            output = built.step(*job["inputs"], target=job["target"], losses=losses)
        steps.append((started, time.perf_counter()))
    timed = steps[job["warmup"] :]
    since = timed[0][0] if timed else math.inf
    record = RankRecord(
        actions=[a for a in clock.actions if a[3] >= since],
        waits=[w for w in clock.waits if w[0] >= since],
        steps=timed,
        output_bytes=clock.output_bytes,
    )
    record.latency, record.bandwidth = measure_link(rank, dist.get_world_size())
    grads: dict[str, torch.Tensor] = {}
    for module in modules.values():
        for name, p in module.named_parameters():
            if p.grad is not None:
                g = p.grad.detach().clone()
                grads[name] = grads[name] + g if name in grads else g
    return {
        "output": output,
        "losses": losses,
        "grads": grads,
        "times": [end - start for start, end in timed],
        "record": record,
    }


def _report(scratch: str, rank: int, message: tuple[Any, ...]) -> None:
    """Write a worker's result where the caller polls for it (renamed into place: never read half-written)."""
    final = os.path.join(scratch, f"rank{rank}.result")
    with open(final + ".tmp", "wb") as f:
        pickle.dump(message, f)
    os.replace(final + ".tmp", final)


def _import_callers_script(path: str) -> None:
    """Run the caller's script as ``__mp_main__`` and alias it as ``__main__``, as ``multiprocessing``'s
    spawn does, so names pickled by reference to ``__main__`` resolve."""
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def _users_exception(exc: BaseException) -> BaseException:
    """The exception the stage's own code raised, where torch's stage wraps it in a ``RuntimeError``
    ("[Stage 1] failed to run forward: args: ...") that says only where; the traceback keeps both."""
    while isinstance(exc, RuntimeError) and exc.__cause__ is not None and "] failed to run " in str(exc):
        exc = exc.__cause__
    return exc


def _die_with_parent(parent: int) -> None:
    """Exit when the process that started this worker dies, however it dies (``SIGKILL`` included).

    Linux: the kernel sends ``SIGKILL`` when the parent goes (``prctl(PR_SET_PDEATHSIG)``); a parent
    already gone before that call shows as a changed ``getppid()``. Elsewhere a daemon thread polls it.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            # 1: PR_SET_PDEATHSIG; 0 on success, else fall back to the thread below
            if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL.value, 0, 0, 0) == 0:
                if os.getppid() != parent:
                    os._exit(1)
                return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="unitscale-parent-watch", daemon=True).start()


def worker_main(scratch: str) -> None:
    """Run this rank's part of the job in ``scratch`` and report how it went."""
    if os.environ.get(PARENT_ENV, "").isdigit():
        _die_with_parent(int(os.environ[PARENT_ENV]))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = float(os.environ[TIMEOUT_ENV])
    dump = open(os.path.join(scratch, f"rank{rank}.stack"), "w")  # noqa: SIM115 - open until exit
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False)  # where a timed-out run is
    main_path = os.environ.get(MAIN_ENV)
    if main_path:
        # outside the try: a failure here (an unguarded script calling run_pipeline again)
        # prints its traceback and exits 1, which the caller explains
        _import_callers_script(main_path)
    joined = False
    try:
        torch.set_num_threads(1)
        with open(os.path.join(scratch, f"rank{rank}.job"), "rb") as f:
            job = pickle.load(f)
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout + STARTUP_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        joined = True
        open(os.path.join(scratch, f"rank{rank}.joined"), "w").close()
        payload = run_rank(rank, job)
        _report(scratch, rank, ("ok", rank, pickle.dumps(payload), time.time()))
    except BaseException as exc:
        # reported before leaving the group: neighbours only fail on the closed links after this time
        when = time.time()
        cause = _users_exception(exc)
        _report(scratch, rank, ("error", rank, (type(cause).__name__, str(cause), traceback.format_exc()), when))
    finally:
        if joined:
            dist.destroy_process_group()


if __name__ == "__main__":
    worker_main(sys.argv[1])
