"""Running a :class:`~unitscale.StagePlan` as a real pipeline: one process per rank.

The caller holds a :class:`torch.distributed.TCPStore` on a free loopback port and
starts each worker as torchrun would: a fresh interpreter (``python -m
unitscale.stages._worker``) with ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT`` set. It reads its stages and job from a pickled
file, joins a gloo process group, wraps its stages in
:class:`~torch.distributed.pipelining.PipelineStage` objects and steps the schedule
(GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble or ZBV; the same
:func:`~unitscale.stages.launch.build_rank` that :func:`~unitscale.stages.pipeline_stage`
uses under torchrun). A fresh interpreter does not re-run the caller's script, so it
needs no ``if __name__ == "__main__":`` guard, and a notebook or ``python -`` works,
unless what the workers get refers to something defined in the script. Every failure
or timeout comes back as :class:`~unitscale.errors.PipelineError`, naming the rank
that failed first and its cause before its traceback.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import queue as queue_module
import re
import signal
import statistics
import subprocess
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

import torch

from unitscale.errors import InputError, PipelineError, UnknownScheduleError
from unitscale.stages.costs import check_input_shapes, flat_inputs, pytree_specs_quiet
from unitscale.stages.launch import SCHEDULES, loss_on_model_output

if TYPE_CHECKING:
    from unitscale.stages.measured import RankRecord
    from unitscale.stages.plan import StagePlan
    from unitscale.stages.schedule_costs import ChainCosts
    from unitscale.stages.simulate import Timeline

__all__ = ["PipelineResult", "run_pipeline"]

_WORKER_ENV = "UNITSCALE_PIPELINE_WORKER"
_MAIN_ENV = "UNITSCALE_PIPELINE_MAIN"  # the caller's script, when the job names things defined in it
_TIMEOUT_ENV = "UNITSCALE_PIPELINE_TIMEOUT"
_STARTUP_S = 60.0  # allowance for starting the interpreters, on top of ``timeout``


@dataclass
class PipelineResult:
    """What a training run of :func:`run_pipeline` returns.

    >>> import torch
    >>> from unitscale.stages import PipelineResult
    >>> PipelineResult(torch.zeros(2), torch.tensor(0.5), {}, step_time=0.01).loss.item()
    0.5

    Attributes:
        output: the model output for the whole batch (microbatches concatenated).
        loss: mean of the per-microbatch losses.
        grads: parameter name (as in the original model) -> gradient, summed over
            the stages that hold the parameter.
        step_time: seconds per training step, the median over the timed steps of the
            slowest rank's time (each step starts on a barrier).
        stage_costs: what the workers measured, as :class:`~unitscale.stages.ChainCosts` with
            one item per stage: mean forward and backward seconds per microbatch, the bytes
            each stage sends, the gloo link (ping-pong latency and bandwidth) and the
            schedule's bookkeeping per action (see ``unitscale.stages.measured``).
        timeline: the measured :class:`~unitscale.stages.Timeline` of the timed step whose time
            is ``step_time`` (every action's start and end on its rank).
        schedule: the schedule that ran.
        num_microbatches: microbatches per step.
        stages_per_rank: stages each rank held.
        records: each rank's raw measurements (``unitscale.stages.measured.RankRecord``):
            every timed action and message wait, the steps' starts and ends.
        bounds: the node-index bounds of the plan's stages (``StagePlan.bounds``), so that the
            measured durations can calibrate another plan of the graph
            (``plan_pipeline(..., calibration=result)``).
    """

    output: Any
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]
    step_time: float = math.nan
    stage_costs: ChainCosts | None = None
    timeline: Timeline | None = None
    schedule: str = "gpipe"
    num_microbatches: int = 1
    stages_per_rank: int = 1
    records: list[RankRecord] = field(default_factory=list)
    bounds: list[int] | None = None

    def predicted(self, device_speeds: Sequence[float] | None = None) -> Timeline:
        """The simulator's step for the durations measured in the workers (:attr:`stage_costs`).

        The same simulator the planner uses (``simulate_bounds``), fed
        with what the pipeline's own processes measured instead of a planning estimate:
        how close its ``step_time`` comes to :attr:`step_time` tests the timing model.

        Raises:
            InputError: the result carries no measurements (built by hand).

        >>> import torch
        >>> from unitscale.stages import ChainCosts, PipelineResult
        >>> costs = ChainCosts.uniform([1.0, 1.0], backward_ratio=2.0)
        >>> r = PipelineResult(None, torch.tensor(0.0), {}, 12.0, costs, None, "gpipe", 3)
        >>> r.predicted().step_time  # (m + p - 1) * (f + b)
        12.0
        """
        from unitscale.stages.simulate import simulate_bounds

        if self.stage_costs is None:
            raise InputError(
                "this PipelineResult carries no measured stage_costs; use the one run_pipeline(..., loss_fn=..., "
                "target=...) returns"
            )
        stages = len(self.stage_costs)
        return simulate_bounds(
            self.stage_costs,
            list(range(stages + 1)),
            self.schedule,
            self.num_microbatches,
            self.stages_per_rank,
            device_speeds,
        )


def run_rank(rank: int, job: dict[str, Any]) -> dict[str, Any]:
    """Build this rank's stages and schedule (a group is joined) and step it ``warmup + steps`` times."""
    import torch.distributed as dist

    from unitscale.stages.launch import build_rank
    from unitscale.stages.measured import ActionClock, RankRecord, measure_link

    with pytree_specs_quiet():  # an exported module's specs, as they load
        modules: dict[int, torch.nn.Module] = {i: pickle.loads(b) for i, b in job["modules"].items()}
        loss_fn = pickle.loads(job["loss_fn"])
        built = build_rank(
            modules, job["num_stages"], job["schedule"], job["num_microbatches"], loss_fn, torch.device("cpu")
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
        kwargs: dict[str, Any] = {}
        if built.is_last and loss_fn is not None:
            kwargs = {"target": job["target"], "losses": losses}
        args = job["inputs"] if built.is_first else ()
        dist.barrier()
        started = time.perf_counter()
        with torch.set_grad_enabled(loss_fn is not None), clock.timing_waits():
            output = built.schedule.step(*args, **kwargs)
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
        "output": output if built.is_last else None,
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
    import runpy
    import sys

    module = types.ModuleType("__mp_main__")
    module.__dict__.update(runpy.run_path(path, run_name="__mp_main__"))
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module


def worker_main(scratch: str) -> None:
    """A stage worker, started as a fresh interpreter with torchrun's environment variables."""
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    timeout = float(os.environ[_TIMEOUT_ENV])
    main_path = os.environ.get(_MAIN_ENV)
    if main_path:
        # outside the try: a failure here (an unguarded script calling run_pipeline again)
        # prints its traceback and exits 1, which the caller explains
        _import_callers_script(main_path)
    joined = False
    try:
        torch.set_num_threads(1)
        with open(os.path.join(scratch, f"rank{rank}.job"), "rb") as f:
            job = pickle.load(f)
        store = dist.TCPStore(addr, port, is_master=False, timeout=timedelta(seconds=timeout + _STARTUP_S))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        joined = True
        open(os.path.join(scratch, f"rank{rank}.joined"), "w").close()
        payload = run_rank(rank, job)
        _report(scratch, rank, ("ok", rank, pickle.dumps(payload), time.time()))
    except BaseException as exc:
        # reported before leaving the group: neighbours only fail on the closed links after this time
        when = time.time()
        _report(scratch, rank, ("error", rank, (type(exc).__name__, str(exc), traceback.format_exc()), when))
    finally:
        if joined:
            dist.destroy_process_group()


class _Worker:
    """A worker interpreter, with the few ``multiprocessing.Process`` names the diagnosis reads."""

    def __init__(self, popen: subprocess.Popen[bytes], name: str) -> None:
        self.popen = popen
        self.name = name  # "stage 1" with one stage per rank, else "rank 1 (stages 1, 3)"
        self.pid: int | None = popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def join(self, timeout: float) -> None:
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class _Results:
    """The workers' result files, read as a queue."""

    def __init__(self, scratch: str, world: int) -> None:
        self.scratch, self.world = scratch, world
        self.seen: set[int] = set()

    def get(self, timeout: float) -> tuple[Any, ...]:
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
                raise queue_module.Empty
            time.sleep(0.02)

    def joined(self) -> bool:
        return all(os.path.exists(os.path.join(self.scratch, f"rank{r}.joined")) for r in range(self.world))


def _batch_size(x: torch.Tensor) -> int:
    return x.shape[0] if x.dim() else 0


def _check_timeout(timeout: Any) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise InputError(
            f"run_pipeline(timeout=...) got {timeout!r}; pass a finite number of seconds > 0 (default 120)"
        )
    return float(timeout)


def _check_args(inputs: tuple[Any, ...], num_microbatches: int) -> None:
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
        f"{procs[first.rank].name} worker failed: {first.cause}"
        if first.detail
        else f"{procs[first.rank].name} worker {first.cause}"
    ]
    if not first.detail and main_hint:
        lines[0] += main_hint
    # later failures are mostly broken links to the first: one short line each
    lines += [f"({procs[f.rank].name} failed after it: {_first_line(f.cause, 160)})" for f in ordered[1:]]
    if first.detail:
        lines.append(f"\nTraceback of {procs[first.rank].name}:\n{first.detail.rstrip()}")
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
    head = "; ".join(f"{procs[r].name} {why}" for r, why in order)
    which = "Stage(s)" if all(procs[r].name.startswith("stage") for r in missing) else "Rank(s)"
    return PipelineError(
        f"pipeline timed out after {timeout:g} s: {head}. "
        f"{which} {missing} had not finished; raise timeout= or check the model"
    )


def _collect(
    procs: list[Any], results: Any, timeout: float, stack_files: list[str], main_hint: str
) -> dict[int, dict[str, Any]]:
    # Starting interpreters and importing torch is not the run: ``timeout`` counts from the
    # moment every worker has joined the group; the start has its own allowance on top.
    deadline = time.monotonic() + timeout + _STARTUP_S
    started = False
    done: dict[int, dict[str, Any]] = {}
    reported: set[int] = set()
    while len(done) < len(procs):
        if not started and results.joined():
            started = True
            deadline = time.monotonic() + timeout
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
    stages_per_rank: int = ...,
    loss_fn: None = ...,
    target: None = ...,
    timeout: float = ...,
    steps: int = ...,
    warmup: int = ...,
) -> Any: ...


@overload
def run_pipeline(
    plan: StagePlan,
    inputs: Any,
    num_microbatches: int,
    schedule: str = ...,
    *,
    stages_per_rank: int = ...,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor],
    target: torch.Tensor,
    timeout: float = ...,
    steps: int = ...,
    warmup: int = ...,
) -> PipelineResult: ...


def run_pipeline(
    plan: StagePlan,
    inputs: Any,
    num_microbatches: int,
    schedule: str = "gpipe",
    *,
    stages_per_rank: int = 1,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    target: torch.Tensor | None = None,
    timeout: float = 120.0,
    steps: int = 1,
    warmup: int = 0,
) -> Any:
    """Run ``plan``'s stages on ``torch.distributed.pipelining``, one CPU process per rank.

    Inputs (and ``target``) are split into ``num_microbatches`` microbatches on
    dim 0. Stages pass tensors only: a model whose output is a tuple, a dict or a
    ``transformers`` ``ModelOutput`` has its output sent as flat leaves and rebuilt
    here (and before ``loss_fn`` sees it), so the result has the model's own
    structure. Without ``loss_fn`` this is a forward pass and returns the output; with
    it, each microbatch's ``loss_fn(output, target)`` is back-propagated through
    the pipeline (gradients scaled by ``1 / num_microbatches``, which matches a
    mean-reduced loss over the whole batch).

    The plan's ``num_stages`` stages run on ``num_stages // stages_per_rank`` ranks.
    ``"gpipe"`` and ``"1f1b"`` hold one stage per rank; ``"interleaved_1f1b"`` and
    ``"interleaved_zero_bubble"`` hold ``stages_per_rank`` stages, looped (rank ``r``
    holds stages ``r, r + ranks, r + 2 * ranks, ...``); ``"zbv"`` holds two in a V
    (rank ``r`` holds stages ``r`` and ``2 * ranks - 1 - r``). See
    :func:`~unitscale.stages.placement`.

    Workers are fresh interpreters (``python -m unitscale.stages._worker``) with the
    environment ``torchrun`` gives (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
    ``MASTER_ADDR``, ``MASTER_PORT``); stages and job travel as pickled files. So it
    works from a notebook, from stdin and from a script without an ``if __name__ ==
    "__main__":`` guard. Only when the stages or ``loss_fn`` use a class or function
    defined in the script itself do the workers run the script first (as
    ``multiprocessing`` does), and then it needs that guard. A ``loss_fn`` must be
    importable by the workers: a torch loss module, or a function in a module (not
    one defined in a notebook).

    Args:
        plan: the :class:`~unitscale.StagePlan` (its :meth:`~unitscale.StagePlan.stage_modules` are run).
        inputs: a tensor or tuple of tensors, the model's inputs.
        num_microbatches: microbatch count (at most the batch size).
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        stages_per_rank: stages each rank holds (must divide ``plan.num_stages``).
        loss_fn: ``loss_fn(output, target) -> scalar`` for a training step (picklable).
        target: the targets for ``loss_fn``.
        timeout: seconds before a stuck run is abandoned (finite, > 0), counted from the
            moment every worker has joined the group (starting them has 60 s more).
        steps: timed steps (the result is the last one's; gradients are zeroed before each).
        warmup: untimed steps before them.

    Returns:
        The output (forward only), or a :class:`PipelineResult` with ``output``,
        ``loss``, ``grads`` and ``step_time`` when ``loss_fn`` is given.

    Raises:
        InputError: inputs that are not tensors, have fewer rows than microbatches or
            a batch size ``num_microbatches`` does not divide; a ``target`` whose
            batch differs from the inputs'; a ``timeout`` that is not a finite
            number > 0; ``plan`` not a :class:`~unitscale.StagePlan`; a
            ``stages_per_rank`` that does not divide the stages or fit the schedule;
            a microbatch count the schedule cannot use (see
            :func:`~unitscale.stages.check_schedule`).
        UnknownScheduleError: a schedule not named above.
        PipelineError: something unpicklable, a worker that
            failed or a timeout. The message's first line names the failing rank
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
    import sys

    from unitscale.stages.launch import check_schedule, placement
    from unitscale.stages.measured import measured_costs, measured_timeline
    from unitscale.stages.plan import StagePlan
    from unitscale.stages.schedule_costs import stage_ranks as stage_ranks_of

    if os.environ.get(_WORKER_ENV):
        # A worker is running the caller's script (it refers to something defined there).
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
    for name, value, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"run_pipeline({name}={value!r}) must be an int >= {least}")
    args = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    args = flat_inputs(plan.graph, args)
    check_input_shapes(plan.graph, args, "run_pipeline")
    if schedule not in SCHEDULES:
        raise UnknownScheduleError(f"unknown schedule {schedule!r}; use one of {', '.join(map(repr, SCHEDULES))}")
    _check_args(args, num_microbatches)
    world = check_schedule(schedule, plan.num_stages, stages_per_rank, num_microbatches, training=loss_fn is not None)
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
        loss_fn = loss_on_model_output(loss_fn, plan.output_spec)
    stages = plan.stage_modules()
    held = placement(schedule, world, stages_per_rank)
    last = plan.num_stages - 1
    from_main: list[str] = []
    # pickled one by one, so that what cannot travel is named
    stage_bytes = [_pickled(f"stage {s}", stage, from_main) for s, stage in enumerate(stages)]
    loss_bytes = _pickled("loss_fn", loss_fn, from_main)
    jobs = []
    for r in range(world):
        job = {
            "modules": {i: stage_bytes[i] for i in held[r]},
            "num_stages": plan.num_stages,
            "schedule": schedule,
            "num_microbatches": num_microbatches,
            "loss_fn": loss_bytes,
            "inputs": args if 0 in held[r] else (),
            "target": target if last in held[r] else None,
            "steps": steps,
            "warmup": warmup,
        }
        jobs.append(_pickled("the inputs" if loss_fn is None else "the inputs or target", job, from_main))
    main = sys.modules.get("__main__")
    main_file = getattr(main, "__file__", None)
    main_hint = ""
    if from_main:
        if not main_file:
            raise PipelineError(
                f"{', '.join(from_main[:3])} is defined in __main__ (a notebook, stdin or python -c), which the "
                "worker processes cannot import; define it in a module of its own"
            )
        main_hint = (
            f"; the workers re-import your script for {', '.join(from_main[:3])} (defined in __main__): "
            'guard its top level with `if __name__ == "__main__":` or move them into a module'
        )
    done = _launch(jobs, held, timeout, main_hint, os.path.abspath(main_file) if from_main and main_file else None)
    held_last = next(r for r in range(world) if last in held[r])
    output = plan.output_from_leaves(done[held_last]["output"])
    if loss_fn is None:
        return output
    grads: dict[str, torch.Tensor] = {}
    for r in range(world):
        for name, g in done[r]["grads"].items():
            grads[name] = grads[name] + g if name in grads else g
    losses = done[held_last]["losses"]
    per_step = [max(col) for col in zip(*(done[r]["times"] for r in range(world)), strict=True)]
    step_time = statistics.median(per_step)
    records = [done[r]["record"] for r in range(world)]
    shown = min(range(len(per_step)), key=lambda i: abs(per_step[i] - step_time))
    return PipelineResult(
        output=output,
        loss=torch.stack([x.detach() for x in losses]).mean(),
        grads=grads,
        step_time=step_time,
        stage_costs=measured_costs(records, plan.num_stages),
        timeline=measured_timeline(
            records, shown, schedule, num_microbatches, stage_ranks_of(schedule, world, stages_per_rank)
        ),
        schedule=schedule,
        num_microbatches=num_microbatches,
        stages_per_rank=stages_per_rank,
        records=records,
        bounds=list(plan.bounds),
    )


def _worker_env(rank: int, world: int, port: int, timeout: float, main_path: str | None) -> dict[str, str]:
    import sys

    env = dict(os.environ)
    # the workers import what this process can: the same unitscale, the modules a loss comes from
    paths = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
        **{_TIMEOUT_ENV: repr(timeout), _WORKER_ENV: "1"},
    )
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    env.pop(_MAIN_ENV, None)
    if main_path:
        env[_MAIN_ENV] = main_path
    return env


def _launch(
    jobs: list[bytes], held: list[list[int]], timeout: float, main_hint: str, main_path: str | None
) -> dict[int, dict[str, Any]]:
    """Start one interpreter per rank, as torchrun would, and collect what each returns."""
    import sys

    import torch.distributed as dist

    world = len(jobs)
    store = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout + _STARTUP_S)
    )
    scratch = tempfile.TemporaryDirectory(prefix="unitscale-pipeline-")
    stack_files = [os.path.join(scratch.name, f"rank{r}.stack") for r in range(world)]
    for r, job in enumerate(jobs):
        with open(os.path.join(scratch.name, f"rank{r}.job"), "wb") as f:
            f.write(job)
    procs: list[_Worker] = []
    try:
        for r in range(world):
            try:
                popen = subprocess.Popen(
                    [sys.executable, "-m", "unitscale.stages._worker", scratch.name],
                    env=_worker_env(r, world, store.port, timeout, main_path),
                    stdin=subprocess.DEVNULL,
                )
            except OSError as exc:
                raise PipelineError(
                    f"could not start the worker process of rank {r}: {type(exc).__name__}: {exc}"
                ) from exc
            name = f"stage {held[r][0]}" if len(held[r]) == 1 else f"rank {r} (stages {', '.join(map(str, held[r]))})"
            procs.append(_Worker(popen, name))
        return _collect(procs, _Results(scratch.name, world), timeout, stack_files, main_hint)
    finally:
        for p in procs:
            if p.is_alive():
                p.popen.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.popen.kill()
                p.join(timeout=5)
        scratch.cleanup()
        del store
