"""Running a :class:`~unitscale.StagePlan` as a real pipeline: one process per stage.

The caller holds a :class:`torch.distributed.TCPStore` on a free loopback port;
each worker joins a gloo process group through it, wraps its stage in a
:class:`~torch.distributed.pipelining.PipelineStage` and steps a GPipe or 1F1B
schedule. Workers come from a ``forkserver`` that has already imported torch,
so a run costs a fork, not an interpreter start, and it works from a Jupyter
kernel (no fork of a threaded process). The workers do not re-run the caller's
script (so it needs no ``if __name__ == "__main__":`` guard) unless what they get
refers to something defined in it. Stages and payloads travel as pickled bytes;
every failure or timeout comes back as :class:`~unitscale.errors.PipelineError`,
naming the stage that failed first and its cause before its traceback.
"""

from __future__ import annotations

import io
import math
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import re
import signal
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

import torch
from torch.utils._pytree import TreeSpec, tree_unflatten

from unitscale.errors import InputError, PipelineError, UnknownScheduleError
from unitscale.stages.costs import flat_inputs

if TYPE_CHECKING:
    from unitscale.stages.plan import StagePlan

__all__ = ["PipelineResult", "run_pipeline"]

SCHEDULES = ("gpipe", "1f1b")
_PRELOAD = ["torch", "torch.distributed", "torch.distributed.pipelining", "unitscale.stages.pipeline"]


class _OnModelOutput:
    """A loss that sees the model's output as the model returns it (a dict, a ``ModelOutput``),
    rebuilt from the flat leaves the last stage sends."""

    def __init__(self, loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], spec: TreeSpec) -> None:
        self.loss_fn = loss_fn
        self.spec = spec

    def __call__(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        leaves = list(output) if isinstance(output, tuple) and self.spec.num_leaves != 1 else [output]
        return self.loss_fn(tree_unflatten(leaves, self.spec), target)


@dataclass
class PipelineResult:
    """What a training run of :func:`run_pipeline` returns.

    >>> import torch
    >>> from unitscale.stages import PipelineResult
    >>> PipelineResult(torch.zeros(2), torch.tensor(0.5), {}).loss.item()
    0.5

    Attributes:
        output: the model output for the whole batch (microbatches concatenated).
        loss: mean of the per-microbatch losses.
        grads: parameter name (as in the original model) -> gradient, summed over
            the stages that hold the parameter.
    """

    output: Any
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]


def _worker(
    rank: int,
    world: int,
    port: int,
    stage_bytes: bytes,
    job_bytes: bytes,
    results: Any,
    timeout: float,
    stack_file: str,
) -> None:
    import faulthandler
    import signal

    import torch.distributed as dist

    joined = False
    try:
        # On a timeout the caller asks every worker where it is (SIGUSR1), to tell the
        # stage stuck in its own code from the stages waiting for it.
        dump = open(stack_file, "w")  # noqa: SIM115 - open until the process ends
        faulthandler.register(signal.SIGUSR1, file=dump, all_threads=False)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        module = pickle.loads(stage_bytes)
        job = pickle.loads(job_bytes)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        joined = True
        payload = _run_stage(rank, world, module, job)
        results.put(("ok", rank, pickle.dumps(payload), time.time()))
    except BaseException as exc:
        # reported before leaving the group: neighbours only fail on the closed links after this time
        when = time.time()
        results.put(("error", rank, (type(exc).__name__, str(exc), traceback.format_exc()), when))
    finally:
        if joined:
            dist.destroy_process_group()


def _run_stage(rank: int, world: int, module: torch.nn.Module, job: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(module, rank, world, torch.device("cpu"))
    schedule_cls = ScheduleGPipe if job["schedule"] == "gpipe" else Schedule1F1B
    schedule = schedule_cls(stage, n_microbatches=job["num_microbatches"], loss_fn=job["loss_fn"])
    losses: list[torch.Tensor] = []
    kwargs: dict[str, Any] = {}
    if rank == world - 1 and job["loss_fn"] is not None:
        kwargs = {"target": job["target"], "losses": losses}
    args = job["inputs"] if rank == 0 else ()
    if job["loss_fn"] is None:
        with torch.no_grad():
            output = schedule.step(*args, **kwargs)
    else:
        output = schedule.step(*args, **kwargs)
    grads = {name: p.grad.detach().clone() for name, p in module.named_parameters() if p.grad is not None}
    return {"output": output if rank == world - 1 else None, "losses": losses, "grads": grads}


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)  # only takes effect before the server first starts
    return ctx


def _batch_size(x: torch.Tensor) -> int:
    return x.shape[0] if x.dim() else 0


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise InputError(
            f"run_pipeline(timeout=...) got {timeout!r}; pass a finite number of seconds > 0 (default 120)"
        )
    return float(timeout)


def _check_args(inputs: tuple[Any, ...], num_microbatches: int, schedule: str, num_stages: int) -> None:
    if schedule not in SCHEDULES:
        raise UnknownScheduleError(f"unknown schedule {schedule!r}; use one of {', '.join(map(repr, SCHEDULES))}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches={num_microbatches!r} must be an int >= 1")
    if not inputs:
        raise InputError("run_pipeline got no inputs; pass a tensor or a tuple of tensors (split on dim 0)")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise InputError(
                f"pipeline input {i} is a {type(x).__name__}; run_pipeline needs tensor inputs (split on dim 0)"
            )
        batch = _batch_size(x)
        if batch < num_microbatches:
            raise InputError(
                f"pipeline input {i} has batch size {batch} (dim 0), fewer than "
                f"num_microbatches={num_microbatches}; use a batch of at least num_microbatches rows"
            )
        if batch % num_microbatches:
            # A PipelineStage sizes its receive buffers from the first microbatch: a shorter
            # last one would come back padded with uninitialised rows.
            divisors = [d for d in range(1, min(batch, 64) + 1) if batch % d == 0]
            raise InputError(
                f"pipeline input {i} has batch size {batch} (dim 0), which num_microbatches={num_microbatches} "
                f"does not divide; microbatches must be equal: use num_microbatches in {divisors} "
                f"or a batch size that is a multiple of {num_microbatches}"
            )
        if batch != _batch_size(inputs[0]):
            raise InputError(
                f"pipeline input {i} has batch size {batch} (dim 0) but input 0 has {_batch_size(inputs[0])}; "
                "every input is split on dim 0, so all need the same batch size"
            )


def _check_target(target: Any, batch: int) -> None:
    if not isinstance(target, torch.Tensor):
        raise InputError(
            f"run_pipeline(target=...) got {type(target).__name__}; pass a tensor whose dim 0 is the batch ({batch})"
        )
    if _batch_size(target) != batch:
        raise InputError(
            f"run_pipeline(target=...) has batch size {_batch_size(target)} (dim 0) but the inputs have {batch}; "
            "the target is split into microbatches with the inputs, so give one target row per input row"
        )


def _check_importable(what: str, value: Any) -> None:
    """Workers import ``__main__`` only when it is a file; a notebook's or ``-c``'s objects cannot travel."""
    import sys

    owner = value if callable(value) and not isinstance(value, torch.nn.Module) else type(value)
    main = sys.modules.get("__main__")
    if getattr(owner, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise PipelineError(
            f"{what} {getattr(owner, '__qualname__', owner)!r} is defined in __main__ (a notebook or python -c), "
            "which the worker processes cannot import; define it in a module, or use a torch loss such as "
            "nn.CrossEntropyLoss()"
        )


class _MainSpotter(pickle.Pickler):
    """A pickler that notes the names it pickles by reference to ``__main__``."""

    def __init__(self, file: Any) -> None:
        super().__init__(file)
        self.from_main: list[str] = []

    def reducer_override(self, obj: Any) -> Any:
        owner = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
        if getattr(owner, "__module__", None) == "__main__":
            self.from_main.append(getattr(owner, "__qualname__", repr(owner)))
        return NotImplemented


def _pickled(what: str, value: Any, from_main: list[str]) -> bytes:
    """``value`` pickled; names it takes from ``__main__`` are appended to ``from_main``."""
    buffer = io.BytesIO()
    pickler = _MainSpotter(buffer)
    try:
        pickler.dump(value)
    except Exception as exc:
        raise PipelineError(
            f"{what} cannot be pickled for the worker processes ({type(exc).__name__}: {exc}); "
            "use a module-level function or an nn.Module instead of a lambda or local function"
        ) from exc
    data = buffer.getvalue()
    if b"__main__" in data and not pickler.from_main:
        # e.g. a GraphModule's import block naming a function wrapped in the script
        pickler.from_main.append(f"something {what} imports from __main__")
    from_main.extend(name for name in pickler.from_main if name not in from_main)
    return data


@contextmanager
def _main_hidden(hide: bool) -> Iterator[None]:
    """Start workers without re-running the caller's script.

    ``multiprocessing`` re-imports a script's ``__main__`` in each child, which runs an
    unguarded script's top level again (and its ``run_pipeline`` call fails there).
    Nothing the workers get refers to ``__main__`` when ``hide`` is true, so the children
    are told of a ``__main__`` without a file, as a notebook's is.
    """
    import sys

    if not hide:
        yield
        return
    real = sys.modules["__main__"]
    stand_in = types.ModuleType("__main__")
    stand_in.__spec__ = None
    sys.modules["__main__"] = stand_in
    try:
        yield
    finally:
        sys.modules["__main__"] = real


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def _exit_cause(code: int | None) -> str:
    if code is None:
        return "stopped without a result"
    if code < 0:
        return f"was killed by {_signal_name(code)} (exit code {code})"
    return f"exited with code {code} without a result"


@dataclass
class _Failure:
    rank: int
    cause: str  # "ExcType: message" or how the process ended
    when: float
    detail: str = ""  # the traceback


def _diagnose(
    procs: list[Any], results: Any, failures: list[_Failure], reported: set[int], main_hint: str
) -> PipelineError:
    """Blame the stage that failed first; its neighbours then fail on broken links.

    A worker that died without a word (``os._exit``, a signal, a crash in C) is the
    cause when it is among the failures: the others only saw its links close.
    """
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        try:
            kind, rank, data, when = results.get(timeout=0.05)
        except queue_module.Empty:
            if all(p.exitcode is not None or r in reported for r, p in enumerate(procs)):
                break
            continue
        reported.add(rank)
        if kind == "error":
            failures.append(_Failure(rank, f"{data[0]}: {data[1]}", when, data[2]))
    silent = [
        _Failure(r, _exit_cause(p.exitcode), 0.0)
        for r, p in enumerate(procs)
        if r not in reported and p.exitcode not in (None, 0)
    ]
    ordered = silent + sorted(failures, key=lambda f: f.when)
    first = ordered[0]
    lines = [
        f"stage {first.rank} worker failed: {first.cause}"
        if first.detail
        else f"stage {first.rank} worker {first.cause}"
    ]
    if not first.detail and main_hint:
        lines[0] += main_hint
    # later failures are mostly broken links to the first: one short line each
    lines += [f"(stage {f.rank} failed after it: {_first_line(f.cause, 160)})" for f in ordered[1:]]
    if first.detail:
        lines.append(f"\nTraceback of stage {first.rank}:\n{first.detail.rstrip()}")
    return PipelineError("\n".join(lines))


def _first_line(text: str, limit: int) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _stack_of(path: str) -> list[tuple[str, int, str]]:
    """``(file, line, function)`` frames of a faulthandler dump, innermost first."""
    frames: list[tuple[str, int, str]] = []
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return frames
    for match in re.finditer(r'File "([^"]+)", line (\d+) in (\S+)', text):
        frames.append((match.group(1), int(match.group(2)), match.group(3)))
    return frames


def _timeout_error(procs: list[Any], missing: list[int], timeout: float, stack_files: list[str]) -> PipelineError:
    """Which of the unfinished stages is busy in its own code, and which wait on a neighbour."""
    asked = []
    for r in missing:
        if procs[r].is_alive() and procs[r].pid is not None:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
                asked.append(r)
            except OSError:
                pass
    time.sleep(0.3 if asked else 0.0)
    busy, waiting = [], []
    for r in missing:
        frames = _stack_of(stack_files[r])
        if not frames:
            waiting.append((r, "its stack could not be read"))
            continue
        innermost = frames[0]
        if "/torch/distributed/" in innermost[0] or "/multiprocessing/" in innermost[0]:
            waiting.append((r, "waiting on a neighbour stage"))
        else:
            busy.append((r, f"busy at {innermost[0]}:{innermost[1]} in {innermost[2]}"))
    order = busy + waiting
    head = "; ".join(f"stage {r} {why}" for r, why in order)
    return PipelineError(
        f"pipeline timed out after {timeout:g} s: {head}. "
        f"Stage(s) {missing} had not finished; raise timeout= or check the model"
    )


def _collect(
    procs: list[Any], results: Any, timeout: float, stack_files: list[str], main_hint: str
) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    done: dict[int, dict[str, Any]] = {}
    reported: set[int] = set()
    while len(done) < len(procs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _timeout_error(procs, [r for r in range(len(procs)) if r not in done], timeout, stack_files)
        try:
            kind, rank, data, when = results.get(timeout=min(0.2, remaining))
        except queue_module.Empty:
            dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode not in (None, 0)]
            if dead:
                raise _diagnose(procs, results, [], reported, main_hint) from None
            continue
        reported.add(rank)
        if kind == "error":
            raise _diagnose(
                procs, results, [_Failure(rank, f"{data[0]}: {data[1]}", when, data[2])], reported, main_hint
            )
        done[rank] = pickle.loads(data)
    return done


@overload
def run_pipeline(
    plan: StagePlan,
    inputs: Any,
    num_microbatches: int,
    schedule: str = ...,
    *,
    loss_fn: None = ...,
    target: None = ...,
    timeout: float = ...,
) -> Any: ...


@overload
def run_pipeline(
    plan: StagePlan,
    inputs: Any,
    num_microbatches: int,
    schedule: str = ...,
    *,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    timeout: float = ...,
) -> PipelineResult: ...


def run_pipeline(
    plan: StagePlan,
    inputs: Any,
    num_microbatches: int,
    schedule: str = "gpipe",
    *,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    timeout: float = 120.0,
) -> Any:
    """Run ``plan``'s stages on ``torch.distributed.pipelining``, one CPU process per stage.

    Inputs (and ``target``) are split into ``num_microbatches`` microbatches on
    dim 0. Stages pass tensors only: a model whose output is a tuple, a dict or a
    ``transformers`` ``ModelOutput`` has its output sent as flat leaves and rebuilt
    here (and before ``loss_fn`` sees it), so the result has the model's own
    structure. Without ``loss_fn`` this is a forward pass and returns the output; with
    it, each microbatch's ``loss_fn(output, target)`` is back-propagated through
    the pipeline (gradients scaled by ``1 / num_microbatches``, which matches a
    mean-reduced loss over the whole batch).

    Workers start from a ``forkserver`` and do not re-run the caller's script, so
    it works from a notebook and from a script without an ``if __name__ ==
    "__main__":`` guard. Only when the stages or ``loss_fn`` use a class or function
    defined in the script itself do the workers import it, and then it needs that
    guard. A ``loss_fn`` must be importable by the workers: a torch loss module, or
    a function in a module (not one defined in a notebook).

    Args:
        plan: the :class:`~unitscale.StagePlan` (its :meth:`~unitscale.StagePlan.stage_modules` are run).
        inputs: a tensor or tuple of tensors, the model's inputs.
        num_microbatches: microbatch count (at most the batch size).
        schedule: ``"gpipe"`` or ``"1f1b"``.
        loss_fn: ``loss_fn(output, target) -> scalar`` for a training step (picklable).
        target: the targets for ``loss_fn``.
        timeout: seconds before a stuck run is abandoned (finite, > 0).

    Returns:
        The output (forward only), or a :class:`PipelineResult` with ``output``,
        ``loss`` and ``grads`` when ``loss_fn`` is given.

    Raises:
        InputError: inputs that are not tensors, have fewer rows than microbatches or
            a batch size ``num_microbatches`` does not divide; a ``target`` whose
            batch differs from the inputs'; a ``timeout`` that is not a finite
            number > 0; ``plan`` not a :class:`~unitscale.StagePlan`.
        UnknownScheduleError: a schedule other than ``"gpipe"`` and ``"1f1b"``.
        PipelineError: something unpicklable, a worker that
            failed or a timeout. The message's first line names the failing stage
            and its cause (exception type and message, exit code or signal); the
            worker's traceback follows.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition, run_pipeline
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> x = torch.randn(4, 4)
    >>> out = run_pipeline(partition(model, 2, x), x, num_microbatches=2)
    >>> torch.allclose(out, model(x), atol=1e-5)
    True
    """
    from unitscale.stages.plan import StagePlan

    if getattr(mp.current_process(), "_inheriting", False):
        # A worker is re-importing the caller's script (it refers to something defined there).
        raise PipelineError(
            "run_pipeline was called while a worker process re-imported your script; put the script's "
            'top-level code under `if __name__ == "__main__":`, or define the classes and functions '
            "the stages use in a module of their own"
        )
    if not isinstance(plan, StagePlan):
        raise InputError(
            f"run_pipeline(plan=...) got {type(plan).__name__} {plan!r:.60}; pass the StagePlan that "
            "unitscale.partition(model, num_stages, example_inputs) returns"
        )
    timeout = _check_timeout(timeout)
    args = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    args = flat_inputs(plan.graph, args)
    _check_args(args, num_microbatches, schedule, plan.num_stages)
    if (loss_fn is None) != (target is None):
        raise InputError("pass both loss_fn and target for a training step, or neither for a forward pass")
    if loss_fn is not None:
        if not callable(loss_fn):
            raise InputError(
                f"run_pipeline(loss_fn=...) got {type(loss_fn).__name__} {loss_fn!r:.60}; "
                "pass a callable loss_fn(output, target) -> scalar tensor"
            )
        _check_target(target, _batch_size(args[0]))
        _check_importable("loss_fn", loss_fn)
        if plan.output_spec is not None and not plan.output_spec.is_leaf():
            loss_fn = _OnModelOutput(loss_fn, plan.output_spec)
    stages = plan.stage_modules()
    world = len(stages)
    job = {"schedule": schedule, "num_microbatches": num_microbatches, "loss_fn": loss_fn, "target": None, "inputs": ()}
    from_main: list[str] = []
    stage_bytes = [_pickled(f"stage {s}", stage, from_main) for s, stage in enumerate(stages)]
    jobs = []
    for s in range(world):
        job_s = dict(job, inputs=args if s == 0 else (), target=target if s == world - 1 else None)
        jobs.append(_pickled("loss_fn" if loss_fn is not None else "the inputs", job_s, from_main))
    main_hint = ""
    if from_main:
        main_hint = (
            f"; the workers re-import your script for {', '.join(from_main[:3])} (defined in __main__): "
            'guard its top level with `if __name__ == "__main__":` or move them into a module'
        )

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    scratch = tempfile.TemporaryDirectory(prefix="unitscale-pipeline-")
    stack_files = [os.path.join(scratch.name, f"stage{s}.stack") for s in range(world)]
    procs: list[Any] = []
    results: Any = None
    try:
        with _main_hidden(hide=not from_main):
            ctx = _context()
            results = ctx.Queue()
            procs = [
                ctx.Process(
                    target=_worker,
                    args=(s, world, store.port, stage_bytes[s], jobs[s], results, timeout, stack_files[s]),
                    daemon=True,
                )
                for s in range(world)
            ]
            for p in procs:
                try:
                    p.start()
                except Exception as exc:
                    raise PipelineError(
                        f"could not start the stage worker processes: {type(exc).__name__}: {exc}{main_hint}"
                    ) from exc
        done = _collect(procs, results, timeout, stack_files, main_hint)
    finally:
        started = [p for p in procs if p.pid is not None]
        for p in started:
            if p.is_alive():
                p.terminate()
        for p in started:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        if results is not None:
            results.close()
        scratch.cleanup()
        del store
    output = plan.output_from_leaves(done[world - 1]["output"])
    if loss_fn is None:
        return output
    grads: dict[str, torch.Tensor] = {}
    for s in range(world):
        for name, g in done[s]["grads"].items():
            grads[name] = grads[name] + g if name in grads else g
    losses = done[world - 1]["losses"]
    return PipelineResult(output=output, loss=torch.stack([x.detach() for x in losses]).mean(), grads=grads)
