"""This rank's pipeline stages and schedule, for a script launched by ``torchrun``.

Save a plan where the model is (``plan.save("plan.pt")``), then in the script that
``torchrun`` starts on every machine (the whole recipe: ``docs/torchrun.md``)::

    # train.py, run as: torchrun --nnodes 2 --nproc-per-node 2 --rdzv-endpoint host0:29500 train.py
    import torch
    from torch import nn
    from unitscale.stages import pipeline_stage

    rank = pipeline_stage("plan.pt", num_microbatches=4, schedule="1f1b", loss_fn=nn.MSELoss())
    x, y = torch.randn(8, 16), torch.randn(8, 4)
    output = rank.step(x, target=y)  # the model's output on the last stage's rank, else None
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import TreeSpec

from unitscale.errors import InputError, PipelineError
from unitscale.stages.partitioner.costs import as_tuple
from unitscale.stages.partitioner.plan_files import SavedPlan, load_plan, output_from_leaves
from unitscale.stages.runtime.boundaries import StageExample, stage_examples
from unitscale.stages.schedules import check_schedule, placement, torch_schedule_class

if TYPE_CHECKING:
    from unitscale.stages.partitioner.plan import StagePlan

__all__ = ["RankPipeline", "pipeline_stage"]


def _loss_on_leaves(loss_fn: Callable[..., torch.Tensor], spec: TreeSpec, leaves: Any, target: Any) -> torch.Tensor:
    return loss_fn(output_from_leaves(leaves, spec), target)


def loss_on_model_output(
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor], spec: TreeSpec | None
) -> Callable[[Any, torch.Tensor], torch.Tensor]:
    """``loss_fn`` seeing the model's own output structure (a dict, a ``ModelOutput``), where the last
    stage sends flat leaves; picklable when ``loss_fn`` is."""
    if spec is None or spec.is_leaf():
        return loss_fn
    return functools.partial(_loss_on_leaves, loss_fn, spec)


@dataclass
class RankPipeline:
    """The stages one rank holds and the schedule that steps them (what :func:`pipeline_stage` returns).

    Unpacks as ``stages, schedule = rank_pipeline``.

    >>> from unitscale.stages import RankPipeline
    >>> pipeline = RankPipeline([], None, stage_indices=[0], num_stages=2)
    >>> pipeline.is_first
    True

    Attributes:
        stages: this rank's :class:`~torch.distributed.pipelining.PipelineStage`\\ s, by stage index.
        stage_indices: the plan's stage index of each of ``stages``.
        output_from_leaves: rebuilds the model's output structure from the last stage's leaves.
    """

    stages: list[Any]
    schedule: Any
    stage_indices: list[int]
    num_stages: int
    output_from_leaves: Callable[[Any], Any] = field(default=lambda out: out)

    def __iter__(self) -> Iterator[Any]:
        yield self.stages
        yield self.schedule

    @property
    def is_first(self) -> bool:
        """Whether this rank holds stage 0 (it feeds the inputs)."""
        return 0 in self.stage_indices

    @property
    def is_last(self) -> bool:
        """Whether this rank holds the last stage (it sees the target and the output)."""
        return self.num_stages - 1 in self.stage_indices

    def step(self, *inputs: Any, target: Any = None, losses: list[Any] | None = None) -> Any:
        """One schedule step over the whole batch; every rank may pass the same ``inputs`` and ``target``.

        Returns the model's output (its own structure) on the rank holding the last stage, else ``None``.
        """
        args = inputs if self.is_first else ()
        kwargs: dict[str, Any] = {}
        if self.is_last and target is not None:
            kwargs = {"target": target, "losses": losses}
        out = self.schedule.step(*args, **kwargs)
        return self.output_from_leaves(out) if self.is_last and out is not None else None


def build_rank(
    modules: Mapping[int, nn.Module],
    num_stages: int,
    schedule: str,
    num_microbatches: int,
    loss_fn: Callable[..., Any] | None,
    device: torch.device,
    group: Any = None,
    examples: Mapping[int, StageExample] | None = None,
) -> RankPipeline:
    """``PipelineStage``\\ s for ``modules`` (stage index -> module) and their schedule, in a joined group;
    with ``examples`` (:func:`~unitscale.stages.runtime.boundaries.stage_examples`) of their real shapes."""
    from torch.distributed.pipelining import PipelineStage  # lazy, as in torch_schedule_class

    indices = sorted(modules)
    stages = []
    for i in indices:
        ins, outs = examples[i] if examples is not None else (None, None)
        stages.append(PipelineStage(modules[i], i, num_stages, device, ins, outs, group=group))
    runner = torch_schedule_class(schedule)(
        stages[0] if schedule in ("gpipe", "1f1b") else stages, n_microbatches=num_microbatches, loss_fn=loss_fn
    )
    return RankPipeline(stages, runner, indices, num_stages)


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None or not value.isdigit():
        raise InputError(
            f"pipeline_stage needs the environment variable {name} (got {value!r}); run the script with "
            "torchrun --nproc-per-node N script.py, which sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR "
            "and MASTER_PORT"
        )
    return int(value)


def _join_group(backend: str) -> None:
    """``init_process_group`` from ``torchrun``'s environment; a port in use is said as such, with the fix."""
    try:
        dist.init_process_group(backend)
    except dist.DistNetworkError as exc:
        addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        in_use = "EADDRINUSE" in str(exc) or "address already in use" in str(exc)
        why = "that port is taken by another process (an earlier run still alive?)" if in_use else "it is unreachable"
        raise PipelineError(
            f"pipeline_stage could not join the process group at MASTER_ADDR={addr} MASTER_PORT={port}: {why} "
            f"({(str(exc).splitlines() or [''])[0]}); launch with another port (torchrun --master-port PORT, or "
            "--rdzv-endpoint host:PORT), or stop the process that holds it"
        ) from exc


def pipeline_stage(
    plan: StagePlan | SavedPlan | str | os.PathLike[str],
    num_microbatches: int,
    schedule: str = "1f1b",
    *,
    loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None = None,
    stages_per_rank: int = 1,
    device: torch.device | str | None = None,
    backend: str | None = None,
    example_inputs: Any = None,
    functions: Sequence[Callable[..., Any]] = (),
) -> RankPipeline:
    """This rank's pipeline stages and schedule, built from ``torchrun``'s environment.

    Joins the default process group if the script has not, and keeps the stages
    :func:`placement` gives this rank. Needs ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK``
    (``torchrun`` sets them) and ``WORLD_SIZE * stages_per_rank == plan.num_stages``.

    Args:
        plan: a :class:`~unitscale.StagePlan`, a plan loaded by :meth:`~unitscale.StagePlan.load`,
            or the path :meth:`~unitscale.StagePlan.save` wrote.
        loss_fn: ``loss_fn(output, target)`` for training (sees the model's own output structure);
            ``None`` for forward-only steps.
        stages_per_rank: stages on each rank (2 for ``"zbv"``; 2 or more for the interleaved schedules).
        device: where the stages run (default ``cuda:LOCAL_RANK`` with CUDA, else CPU).
        backend: process-group backend when this call starts the group (default ``"nccl"`` on
            CUDA, else ``"gloo"``).
        example_inputs: a batch like those ``step`` will get: each stage is then built with the
            real shapes and dtypes of what it receives and sends (needed where a boundary carries
            integer or boolean tensors, such as token ids); without it, torch infers them at the
            first step from uninitialised tensors.
        functions: for a path, the functions its graphs may call beyond the allow-list
            (as :meth:`~unitscale.StagePlan.load` takes them).

    Returns:
        A :class:`RankPipeline`; ``rank.step(x, target=y)`` runs one step.

    Raises:
        InputError: a missing environment variable, a world size that does not match the plan.
        PlanFileError: ``plan`` is a path to something that is not a plan file (nothing in it runs).
        PipelineError: the process group cannot be joined (``MASTER_PORT`` in use, say).
        UnknownScheduleError: an unknown schedule.

    >>> import os
    >>> from unitscale.stages import pipeline_stage
    >>> "RANK" in os.environ or callable(pipeline_stage)  # run it under torchrun
    True
    """
    rank, world, local_rank = _env_int("RANK"), _env_int("WORLD_SIZE"), _env_int("LOCAL_RANK")
    loaded = load_plan(plan, functions) if isinstance(plan, (str, os.PathLike)) else plan
    if not isinstance(loaded, SavedPlan):
        loaded = SavedPlan.from_plan(loaded)
    ranks = check_schedule(schedule, loaded.num_stages, stages_per_rank, num_microbatches, training=loss_fn is not None)
    if ranks != world:
        raise InputError(
            f"the plan has {loaded.num_stages} stages, {stages_per_rank} per rank, so it needs {ranks} ranks, "
            f"but WORLD_SIZE={world}; launch with --nproc-per-node/--nnodes giving {ranks} processes, or "
            f"partition into {world * stages_per_rank} stages"
        )
    cuda = torch.cuda.is_available()
    where = torch.device(device) if device is not None else torch.device(f"cuda:{local_rank}" if cuda else "cpu")
    if not dist.is_initialized():
        _join_group(backend or ("nccl" if cuda and where.type == "cuda" else "gloo"))
    mine = placement(schedule, ranks, stages_per_rank)[rank]
    modules = {i: loaded.stage_modules[i].to(where) for i in mine}
    examples = None
    if example_inputs is not None:
        found = stage_examples(
            loaded.stage_modules, as_tuple(example_inputs), num_microbatches, loss_fn is not None, "pipeline_stage"
        )
        examples = {i: found[i] for i in mine}
    if loss_fn is not None:
        loss_fn = loss_on_model_output(loss_fn, loaded.output_spec)
    built = build_rank(modules, loaded.num_stages, schedule, num_microbatches, loss_fn, where, examples=examples)
    built.output_from_leaves = loaded.output_from_leaves
    return built
