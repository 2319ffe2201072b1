"""Running a :class:`~unitscale.StagePlan` as a real pipeline on one machine: one process per rank
(:func:`run_pipeline`).
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Callable
from typing import Any, overload

import torch

from unitscale.errors import InputError, PipelineError, UnknownScheduleError
from unitscale.stages.partitioner.costs import as_tuple, check_input_shapes, flat_inputs
from unitscale.stages.partitioner.plan import StagePlan
from unitscale.stages.partitioner.split import bake_constant_inputs, constant_inputs
from unitscale.stages.runtime.boundaries import stage_examples
from unitscale.stages.runtime.launch import loss_on_model_output
from unitscale.stages.runtime.measured import measured_costs, measured_timeline
from unitscale.stages.runtime.pickling import check_importable, main_script, pickled
from unitscale.stages.runtime.result import PipelineResult
from unitscale.stages.runtime.workers import WORKER_ENV, run_workers
from unitscale.stages.schedules import SCHEDULES, check_schedule, placement, stage_ranks

__all__ = ["run_pipeline"]


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

    Inputs (and ``target``) are split into ``num_microbatches`` microbatches on dim 0. Without
    ``loss_fn`` this is a forward pass and returns the output, in the model's own structure (a
    tuple, dict or ``ModelOutput`` travels as flat leaves); with it, each microbatch's
    ``loss_fn(output, target)`` is back-propagated (gradients scaled by ``1 / num_microbatches``,
    as for a mean-reduced loss over the whole batch).

    Workers are fresh interpreters started by torch's launcher with ``torchrun``'s environment,
    so it works from a notebook, from stdin and from an unguarded script; only when the stages or
    ``loss_fn`` use a class or function defined in the script itself do the workers run the
    script first, which then needs an ``if __name__ == "__main__":`` guard. ``loss_fn`` must be
    importable by the workers (a torch loss module, or a function in a module, not a notebook).

    Args:
        num_microbatches: microbatch count (at most the batch size).
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        stages_per_rank: stages each rank holds (must divide ``plan.num_stages``; placed as
            :func:`~unitscale.stages.runtime.placement` says).
        loss_fn: ``loss_fn(output, target) -> scalar`` for a training step (picklable).
        timeout: seconds before a stuck run is abandoned (finite, > 0), counted from the
            moment every worker has joined the group (starting them has 60 s more).
        steps: timed steps (the result is the last one's; gradients are zeroed before each).
        warmup: untimed steps before them.

    Returns:
        The output (forward only), or a :class:`PipelineResult` when ``loss_fn`` is given.

    Raises:
        InputError: inputs that are not tensors, have fewer rows than microbatches or
            a batch size ``num_microbatches`` does not divide; a ``target`` whose
            batch differs from the inputs'; a ``timeout`` that is not a finite
            number > 0; ``plan`` not a :class:`~unitscale.StagePlan`; a microbatch
            count the schedule cannot use (see :func:`~unitscale.stages.check_schedule`);
            an input that was a constant (``None``) in the example inputs but is not now;
            an input (or a microbatch of it) whose shape an exported graph fixed otherwise
            (as :meth:`~unitscale.StagePlan.verify` says).
        StageCountError: a ``stages_per_rank`` that does not divide the stages or fit the schedule.
        UnknownScheduleError: a schedule not named above.
        PipelineError: something unpicklable, a worker that failed or a timeout. The message's
            first line names the failing rank and its cause (exception type and message, exit
            code or signal); the worker's traceback follows.

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
    if os.environ.get(WORKER_ENV):
        raise PipelineError(
            "run_pipeline was called while a worker process re-imported your script; put the script's "
            'top-level code under `if __name__ == "__main__":`, or define the classes and functions '
            "the stages use in a module of their own"
        )
    args, world, loss_fn = _checked(plan, inputs, num_microbatches, schedule, stages_per_rank, loss_fn, target)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise InputError(
            f"run_pipeline(timeout=...) got {timeout!r}; pass a finite number of seconds > 0 (default 120)"
        )
    for name, value, least in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise InputError(f"run_pipeline({name}={value!r}) must be an int >= {least}")
    held = placement(schedule, world, stages_per_rank)
    jobs, main_path, main_hint = _jobs(plan, args, held, schedule, num_microbatches, loss_fn, target, steps, warmup)
    names = [
        f"stage {h[0]}" if len(h) == 1 else f"rank {r} (stages {', '.join(map(str, h))})" for r, h in enumerate(held)
    ]
    done = run_workers(jobs, names, float(timeout), main_hint, main_path)
    last = next(r for r in range(world) if plan.num_stages - 1 in held[r])
    output = plan.output_from_leaves(done[last]["output"])
    if loss_fn is None:
        return output
    return _training_result(plan, done, last, output, schedule, num_microbatches, stages_per_rank)


def _checked(
    plan: Any,
    inputs: Any,
    num_microbatches: int,
    schedule: str,
    stages_per_rank: int,
    loss_fn: Any,
    target: Any,
) -> tuple[tuple[Any, ...], int, Any]:
    """The graph's own inputs, the rank count and the loss as the last stage calls it; typed errors first."""
    if not isinstance(plan, StagePlan):
        raise InputError(
            f"run_pipeline(plan=...) got {type(plan).__name__} {plan!r:.60}; pass the StagePlan that "
            "unitscale.partition(model, num_stages, example_inputs) returns"
        )
    args = flat_inputs(plan.graph, as_tuple(inputs))
    check_input_shapes(plan.graph, args, "run_pipeline")
    if schedule not in SCHEDULES:
        raise UnknownScheduleError(f"unknown schedule {schedule!r}; use one of {', '.join(map(repr, SCHEDULES))}")
    _check_args(_sent_inputs(plan, args), num_microbatches)
    if num_microbatches > 1:  # the stages run on microbatches: the one check verify() makes, on their shape
        micro = tuple(a[: len(a) // num_microbatches] if isinstance(a, torch.Tensor) and a.dim() else a for a in args)
        check_input_shapes(plan.graph, micro, f"run_pipeline(num_microbatches={num_microbatches})'s microbatch")
    world = check_schedule(schedule, plan.num_stages, stages_per_rank, num_microbatches, training=loss_fn is not None)
    if (loss_fn is None) != (target is None):
        raise InputError("pass both loss_fn and target for a training step, or neither for a forward pass")
    if loss_fn is not None:
        if not callable(loss_fn):
            raise InputError(
                f"run_pipeline(loss_fn=...) got {type(loss_fn).__name__} {loss_fn!r:.60}; "
                "pass a callable loss_fn(output, target) -> scalar tensor"
            )
        _check_target(target, _batch_size(_sent_inputs(plan, args)[0]))
        check_importable("loss_fn", loss_fn)
        loss_fn = loss_on_model_output(loss_fn, plan.output_spec)
    return args, world, loss_fn


def _sent_inputs(plan: StagePlan, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The inputs stage 0 is sent: those whose example value was a constant (``None``) are baked into it."""
    constants = constant_inputs(plan.graph)
    for i, value in constants.items():
        if i < len(args) and not (args[i] is value or (not isinstance(args[i], torch.Tensor) and args[i] == value)):
            raise InputError(
                f"pipeline input {i} is {type(args[i]).__name__}, but it was {value!r} in the example inputs, and "
                "every stage was built with that value; partition again with example inputs like these"
            )
    return tuple(a for i, a in enumerate(args) if i not in constants)


def _jobs(
    plan: StagePlan,
    args: tuple[Any, ...],
    held: list[list[int]],
    schedule: str,
    num_microbatches: int,
    loss_fn: Any,
    target: Any,
    steps: int,
    warmup: int,
) -> tuple[list[bytes], str | None, str]:
    """Each rank's job pickled, and the caller's script the workers must run first (with its advice)."""
    stages = plan.stage_modules()
    examples = stage_examples(
        stages, args, num_microbatches, loss_fn is not None, who="run_pipeline", expected=plan._example_inputs
    )
    stages[0] = bake_constant_inputs(stages[0])
    sent = _sent_inputs(plan, args)
    last = plan.num_stages - 1
    from_main: list[str] = []
    # pickled one by one, so that what cannot travel is named
    stage_bytes = [pickled(f"stage {s}", stage, from_main) for s, stage in enumerate(stages)]
    loss_bytes = pickled("loss_fn", loss_fn, from_main)
    jobs = []
    for ranks_stages in held:
        job = {
            "modules": {i: stage_bytes[i] for i in ranks_stages},
            "examples": {i: examples[i] for i in ranks_stages},
            "num_stages": plan.num_stages,
            "schedule": schedule,
            "num_microbatches": num_microbatches,
            "loss_fn": loss_bytes,
            "inputs": sent if 0 in ranks_stages else (),
            "target": target if last in ranks_stages else None,
            "steps": steps,
            "warmup": warmup,
        }
        jobs.append(pickled("the inputs" if loss_fn is None else "the inputs or target", job, from_main))
    main_path, main_hint = main_script(from_main)
    return jobs, main_path, main_hint


def _training_result(
    plan: StagePlan,
    done: dict[int, Any],
    last: int,
    output: Any,
    schedule: str,
    num_microbatches: int,
    stages_per_rank: int,
) -> PipelineResult:
    """The workers' gradients summed by parameter, their step times and measurements put together."""
    world = len(done)
    grads: dict[str, torch.Tensor] = {}
    for r in range(world):
        for stage_name, g in done[r]["grads"].items():
            name = plan.gradient_key(stage_name)  # tied weights: one key, as in model.named_parameters()
            grads[name] = grads[name] + g if name in grads else g
    per_step = [max(col) for col in zip(*(done[r]["times"] for r in range(world)), strict=True)]
    step_time = statistics.median(per_step)
    records = [done[r]["record"] for r in range(world)]
    shown = min(range(len(per_step)), key=lambda i: abs(per_step[i] - step_time))
    return PipelineResult(
        output=output,
        loss=torch.stack([x.detach() for x in done[last]["losses"]]).mean(),
        grads=grads,
        step_time=step_time,
        stage_costs=measured_costs(records, plan.num_stages),
        timeline=measured_timeline(
            records, shown, schedule, num_microbatches, stage_ranks(schedule, world, stages_per_rank)
        ),
        schedule=schedule,
        num_microbatches=num_microbatches,
        stages_per_rank=stages_per_rank,
        records=records,
        bounds=list(plan.bounds),
    )


def _batch_size(x: torch.Tensor) -> int:
    return x.shape[0] if x.dim() else 0


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
