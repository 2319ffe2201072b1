"""Starting the pipeline's worker processes with torch's launcher, and saying what went wrong.

:func:`run_workers` starts one interpreter per rank with the launcher ``torchrun`` uses, on a
:class:`~torch.distributed.TCPStore` the caller holds (port picked by the OS). It adds what the
launcher lacks: results through files (:class:`Results`), blame for the worker that failed
first (:func:`diagnose`), where a timed-out worker is (:func:`timeout_error`), and the caller's
own signal handlers and ``Ctrl-C`` kept (:func:`_callers_process_kept`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import re
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException, start_processes

from unitscale.errors import PipelineError

__all__ = ["MAIN_ENV", "PARENT_ENV", "STARTUP_S", "TIMEOUT_ENV", "WORKER_ENV", "run_workers"]

WORKER_ENV = "UNITSCALE_PIPELINE_WORKER"
PARENT_ENV = "UNITSCALE_PIPELINE_PARENT"  # the caller's pid: a worker dies with it (see worker.py)
MAIN_ENV = "UNITSCALE_PIPELINE_MAIN"  # the caller's script, when the job names things defined in it
TIMEOUT_ENV = "UNITSCALE_PIPELINE_TIMEOUT"
STARTUP_S = 60.0  # allowance for starting the interpreters, on top of ``timeout``
_LAUNCHER_LOGGER = "torch.distributed.elastic.multiprocessing.api"


class Results:
    """The workers' result files (``rank{r}.result``), read one at a time as they appear."""

    def __init__(self, scratch: str, world: int) -> None:
        self.scratch, self.world = scratch, world
        self.seen: set[int] = set()

    def get(self, timeout: float) -> tuple[Any, ...] | None:
        """The next result not read yet, ``("ok" | "error", rank, data, when)``, or ``None`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            for rank in range(self.world):
                path = os.path.join(self.scratch, f"rank{rank}.result")
                if rank not in self.seen and os.path.exists(path):
                    self.seen.add(rank)
                    with open(path, "rb") as f:
                        message: tuple[Any, ...] = pickle.load(f)
                    return message
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.02)

    def joined(self) -> bool:
        """Whether every worker has joined the process group (the run's ``timeout`` counts from then)."""
        return all(os.path.exists(os.path.join(self.scratch, f"rank{r}.joined")) for r in range(self.world))


@dataclass
class Failure:
    """How one worker failed: its exception (``"Type: message"``, with ``detail`` the traceback) or its end."""

    rank: int
    cause: str
    when: float
    detail: str = ""

    @classmethod
    def reported(cls, message: tuple[Any, ...]) -> Failure:
        """The failure a worker's ``("error", rank, (type, message, traceback), when)`` report says."""
        _, rank, (kind, text, detail), when = message
        return cls(rank, f"{kind}: {text}", when, detail)


def _exit_cause(code: int | None) -> str:
    if code is None:
        return "stopped without a result"
    if code < 0:
        name = {s.value: s.name for s in signal.Signals}.get(-code, f"signal {-code}")
        return f"was killed by {name} (exit code {code})"
    return f"exited with code {code} without a result"


def _first_line(text: str, limit: int) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def diagnose(names: Sequence[str], failures: list[Failure], silent: dict[int, int], main_hint: str) -> PipelineError:
    """Blame the worker that failed first; its neighbours then fail on broken links.

    ``silent`` (rank -> exit code of workers that ended without a report) comes first: the others
    only saw its links close. ``main_hint`` is added then (it may have re-run an unguarded script).
    """
    ordered = [Failure(r, _exit_cause(code), 0.0) for r, code in sorted(silent.items())]
    ordered += sorted(failures, key=lambda f: f.when)
    first = ordered[0]
    name = names[first.rank]
    lines = [f"{name} worker failed: {first.cause}" if first.detail else f"{name} worker {first.cause}"]
    if not first.detail and main_hint:
        lines[0] += main_hint
    # later failures are mostly broken links to the first: one short line each
    lines += [f"({names[f.rank]} failed after it: {_first_line(f.cause, 160)})" for f in ordered[1:]]
    if first.detail:
        lines.append(f"\nTraceback of {name}:\n{first.detail.rstrip()}")
    return PipelineError("\n".join(lines))


def _stack_of(path: str) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` frames of a faulthandler dump, innermost first."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return []
    return [
        (m.group(1), int(m.group(2)), m.group(3)) for m in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', text)
    ]


def timeout_error(
    names: Sequence[str], pids: dict[int, int], missing: list[int], timeout: float, scratch: str
) -> PipelineError:
    """Which of the unfinished workers is busy in its own code, and which wait on a neighbour."""
    asked = False
    for r in missing:
        with contextlib.suppress(OSError, KeyError):
            os.kill(pids[r], signal.SIGUSR1)
            asked = True
    time.sleep(0.3 if asked else 0.0)
    busy, waiting = [], []
    for r in missing:
        frames = _stack_of(os.path.join(scratch, f"rank{r}.stack"))
        if not frames:
            waiting.append((r, "its stack could not be read"))
        elif "/torch/distributed/" in frames[0][0] or "/multiprocessing/" in frames[0][0]:
            waiting.append((r, "waiting on a neighbour stage"))
        else:
            file, line, function = frames[0]
            busy.append((r, f"busy at {file}:{line} in {function}"))
    head = "; ".join(f"{names[r]} {why}" for r, why in busy + waiting)
    which = "Stage(s)" if all(names[r].startswith("stage") for r in missing) else "Rank(s)"
    return PipelineError(
        f"pipeline timed out after {timeout:g} s: {head}. {which} {missing} had not finished; raise timeout= or "
        "check the model"
    )


@contextlib.contextmanager
def _callers_process_kept() -> Iterator[None]:
    """Restore the signal handlers torch's launcher installs, and keep its log lines off stderr."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)}
    log = logging.getLogger(_LAUNCHER_LOGGER)
    disabled, log.disabled = log.disabled, True
    try:
        yield
    finally:
        log.disabled = disabled
        for sig, handler in kept.items():
            if handler is not None:
                signal.signal(sig, handler)


def _worker_env(rank: int, world: int, port: int, timeout: float, main_path: str | None) -> dict[str, str]:
    """What ``torchrun`` sets for a worker, and what ours read (the launcher adds the caller's environment)."""
    # the workers import what this process can: the same unitscale, the modules a loss comes from
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    return {
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo"),
        TIMEOUT_ENV: repr(timeout),
        WORKER_ENV: "1",
        MAIN_ENV: main_path or "",
        PARENT_ENV: str(os.getpid()),
    }


def _collect(
    context: Any, results: Results, names: Sequence[str], timeout: float, scratch: str, main_hint: str
) -> dict[int, Any]:
    # Starting interpreters and importing torch is not the run: ``timeout`` counts from the
    # moment every worker has joined the group; the start has its own allowance on top.
    world = len(names)
    deadline = time.monotonic() + timeout + STARTUP_S
    started = False
    done: dict[int, Any] = {}
    while len(done) < world:
        if not started and results.joined():
            started, deadline = True, time.monotonic() + timeout
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = [r for r in range(world) if r not in done]
            raise timeout_error(names, context.pids(), missing, timeout, scratch)
        message = results.get(timeout=min(0.2, remaining))
        if message is None:
            ended = context.wait(0)  # torch's launcher: how each worker ended (it stops the rest on a failure)
            if ended is not None and ended.failures:
                raise _blame(context, ended.failures, results, names, main_hint, done)
            continue
        if message[0] == "error":
            raise _blame(context, {}, results, names, main_hint, done, Failure.reported(message))
        done[message[1]] = pickle.loads(message[2])
    return done


def _blame(
    context: Any,
    ended: dict[int, Any],
    results: Results,
    names: Sequence[str],
    main_hint: str,
    done: dict[int, Any],
    *first: Failure,
) -> PipelineError:
    """Gather the reports the other workers write as their links break, and how each worker
    ended (torch's launcher), then :func:`diagnose`."""
    failures = list(first)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and len(results.seen) < len(names):
        message = results.get(timeout=0.05)
        if message is not None and message[0] == "error":
            failures.append(Failure.reported(message))
    if not ended:
        finished = context.wait(0)
        ended = dict(finished.failures) if finished is not None else {}
    # torch's launcher stops the workers still running once one has failed (SIGTERM) and lists
    # them among the failures: only a worker that ended on its own, without a report, is a cause
    stopped = -signal.SIGTERM.value
    silent = {
        r: f.exitcode for r, f in ended.items() if r not in results.seen and r not in done and f.exitcode != stopped
    }
    if not silent and not failures:
        silent = {r: f.exitcode for r, f in ended.items() if r not in results.seen}
    return diagnose(names, failures, silent, main_hint)


def run_workers(
    jobs: Sequence[bytes], names: Sequence[str], timeout: float, main_hint: str, main_path: str | None
) -> dict[int, Any]:
    """Start one worker per job (rank order) with torch's launcher and return what each returned, by rank.

    Raises:
        PipelineError: a worker failed (the first one named, with its cause and traceback) or
            the run did not finish within ``timeout`` seconds of every worker joining.
    """
    world = len(jobs)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout + STARTUP_S)
    )
    with tempfile.TemporaryDirectory(prefix="unitscale-pipeline-") as scratch, _callers_process_kept():
        for r, job in enumerate(jobs):
            with open(os.path.join(scratch, f"rank{r}.job"), "wb") as f:
                f.write(job)
        try:
            context = start_processes(
                name="unitscale-pipeline",
                entrypoint=sys.executable,
                args={r: ("-m", "unitscale.stages.runtime.worker", scratch) for r in range(world)},
                envs={r: _worker_env(r, world, store.port, timeout, main_path) for r in range(world)},
                logs_specs=DefaultLogsSpecs(log_dir=os.path.join(scratch, "logs")),
            )
        except OSError as exc:
            raise PipelineError(
                f"could not start the pipeline's worker processes: {type(exc).__name__}: {exc}"
            ) from exc
        try:
            return _collect(context, Results(scratch, world), names, timeout, scratch, main_hint)
        except SignalException as exc:
            # the launcher's handler turns Ctrl-C into its own exception; a caller expects KeyboardInterrupt
            if exc.sigval == signal.SIGINT:
                raise KeyboardInterrupt from exc
            raise
        finally:
            context.close(timeout=5)
            del store
