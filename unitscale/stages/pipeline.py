"""Running a :class:`~unitscale.StagePlan` as a real pipeline: one process per stage.

The caller holds a :class:`torch.distributed.TCPStore` on a free loopback port;
each worker joins a gloo process group through it, wraps its stage in a
:class:`~torch.distributed.pipelining.PipelineStage` and steps a GPipe or 1F1B
schedule. Workers come from a ``forkserver`` that has already imported torch,
so a run costs a fork, not an interpreter start, and it works from a Jupyter
kernel (no fork of a threaded process, nothing pickled by reference to
``__main__``). Stages and payloads travel as pickled bytes; every failure or
timeout comes back as :class:`~unitscale.errors.PipelineError`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_module
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, overload

import torch
from torch.utils._pytree import TreeSpec, tree_unflatten

from unitscale.errors import InputError, PipelineError
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
) -> None:
    import torch.distributed as dist

    joined = False
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        module = pickle.loads(stage_bytes)
        job = pickle.loads(job_bytes)
        store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=timeout))
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout))
        joined = True
        payload = _run_stage(rank, world, module, job)
        results.put(("ok", rank, pickle.dumps(payload), time.time()))
    except BaseException:
        # reported before leaving the group: neighbours only fail on the closed links after this time
        when = time.time()
        results.put(("error", rank, traceback.format_exc(), when))
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


def _check_args(inputs: tuple[Any, ...], num_microbatches: int, schedule: str, num_stages: int) -> None:
    if schedule not in SCHEDULES:
        raise PipelineError(f"unknown schedule {schedule!r}; use one of {', '.join(map(repr, SCHEDULES))}")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches={num_microbatches!r} must be an int >= 1")
    for i, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise InputError(
                f"pipeline input {i} is a {type(x).__name__}; run_pipeline needs tensor inputs (split on dim 0)"
            )
        if x.dim() == 0 or x.shape[0] < num_microbatches:
            raise InputError(
                f"pipeline input {i} has batch size {x.shape[0] if x.dim() else 0} (dim 0), fewer than "
                f"num_microbatches={num_microbatches}; use a batch of at least num_microbatches rows"
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


def _pickled(what: str, value: Any) -> bytes:
    try:
        return pickle.dumps(value)
    except Exception as exc:
        raise PipelineError(
            f"{what} cannot be pickled for the worker processes ({type(exc).__name__}: {exc}); "
            "use a module-level function or an nn.Module instead of a lambda or local function"
        ) from exc


def _first_failure(results: Any, errors: list[tuple[float, int, str]]) -> PipelineError:
    """The error of the worker that failed first; its neighbours then fail on broken links."""
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        try:
            kind, rank, data, when = results.get(timeout=0.1)
        except queue_module.Empty:
            continue
        if kind == "error":
            errors.append((when, rank, data))
    errors.sort()
    _, rank, data = errors[0]
    later = "".join(f"\n(stage {r} failed after it)" for _, r, _ in errors[1:])
    return PipelineError(f"stage {rank} worker failed:\n{data}{later}")


def _collect(procs: list[Any], results: Any, timeout: float) -> dict[int, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    done: dict[int, dict[str, Any]] = {}
    while len(done) < len(procs):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = [r for r in range(len(procs)) if r not in done]
            raise PipelineError(
                f"pipeline timed out after {timeout:g} s waiting for stage(s) {missing}; "
                "raise timeout= or check the model"
            )
        try:
            kind, rank, data, when = results.get(timeout=min(0.2, remaining))
        except queue_module.Empty:
            dead = [r for r, p in enumerate(procs) if r not in done and p.exitcode not in (None, 0)]
            if dead and results.empty():
                time.sleep(0.5)  # a dying worker's last message may still be in flight
                if results.empty():
                    r = dead[0]
                    raise PipelineError(
                        f"stage {r} worker exited with code {procs[r].exitcode} without a result"
                    ) from None
            continue
        if kind == "error":
            raise _first_failure(results, [(when, rank, data)])
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

    Workers start from a ``forkserver``: it works from a notebook, and a script
    must guard its top level with ``if __name__ == "__main__":`` (as for any
    ``multiprocessing`` code). A ``loss_fn`` must be importable by the workers: a
    torch loss module, or a function in a module (not one defined in a notebook).

    Args:
        plan: the :class:`~unitscale.StagePlan` (its :meth:`~unitscale.StagePlan.stage_modules` are run).
        inputs: a tensor or tuple of tensors, the model's inputs.
        num_microbatches: microbatch count (at most the batch size).
        schedule: ``"gpipe"`` or ``"1f1b"``.
        loss_fn: ``loss_fn(output, target) -> scalar`` for a training step (picklable).
        target: the targets for ``loss_fn``.
        timeout: seconds before a stuck run is abandoned.

    Returns:
        The output (forward only), or a :class:`PipelineResult` with ``output``,
        ``loss`` and ``grads`` when ``loss_fn`` is given.

    Raises:
        InputError: inputs that are not tensors or have fewer rows than microbatches.
        PipelineError: an unknown schedule, something unpicklable, a worker that
            failed (its traceback is in the message) or a timeout.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
    <torch._C.Generator object at ...>
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    >>> x = torch.randn(4, 4)
    >>> out = run_pipeline(partition(model, 2, x), x, num_microbatches=2)
    >>> torch.allclose(out, model(x), atol=1e-5)
    True
    """
    args = inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(inputs, list) else (inputs,)
    args = flat_inputs(plan.graph, args)
    _check_args(args, num_microbatches, schedule, plan.num_stages)
    if (loss_fn is None) != (target is None):
        raise InputError("pass both loss_fn and target for a training step, or neither for a forward pass")
    if loss_fn is not None:
        _check_importable("loss_fn", loss_fn)
        if plan.output_spec is not None and not plan.output_spec.is_leaf():
            loss_fn = _OnModelOutput(loss_fn, plan.output_spec)
    stages = plan.stage_modules()
    world = len(stages)
    job = {"schedule": schedule, "num_microbatches": num_microbatches, "loss_fn": loss_fn, "target": None, "inputs": ()}
    stage_bytes = [_pickled(f"stage {s}", stage) for s, stage in enumerate(stages)]
    jobs = []
    for s in range(world):
        job_s = dict(job, inputs=args if s == 0 else (), target=target if s == world - 1 else None)
        jobs.append(_pickled("loss_fn" if loss_fn is not None else "the inputs", job_s))

    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout))
    ctx = _context()
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(s, world, store.port, stage_bytes[s], jobs[s], results, timeout), daemon=True)
        for s in range(world)
    ]
    try:
        for p in procs:
            try:
                p.start()
            except Exception as exc:
                raise PipelineError(f"could not start the stage worker processes: {type(exc).__name__}: {exc}") from exc
        done = _collect(procs, results, timeout)
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
        results.close()
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
