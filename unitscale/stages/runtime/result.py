"""What a training run of :func:`~unitscale.run_pipeline` returns: output, loss, gradients and the step measured."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from unitscale.errors import InputError
from unitscale.stages.planner.simulation import Timeline, simulate_bounds
from unitscale.stages.runtime.measured import RankRecord
from unitscale.stages.schedules import ChainCosts

__all__ = ["PipelineResult"]


@dataclass
class PipelineResult:
    """What a training run of :func:`run_pipeline` returns.

    >>> import torch
    >>> from unitscale.stages import PipelineResult
    >>> result = PipelineResult(torch.zeros(2), torch.tensor(0.5), {}, step_time=0.01)
    >>> result.loss.item()
    0.5

    Attributes:
        output: the model output for the whole batch (microbatches concatenated).
        loss: mean of the per-microbatch losses.
        grads: one gradient per parameter, keyed as ``model.named_parameters()`` names it, summed
            over the stages that use it; a tied weight appears once, under its first name, with
            its whole gradient (:meth:`~unitscale.StagePlan.gradient_key` maps a stage's name for it).
        step_time: seconds per training step, the median over the timed steps of the
            slowest rank's time (each step starts on a barrier).
        stage_costs: what the workers measured, as :class:`~unitscale.stages.planner.ChainCosts` with
            one item per stage (durations, bytes sent, the gloo link and the bookkeeping per action).
        timeline: the measured :class:`~unitscale.stages.planner.Timeline` of the timed step whose time
            is ``step_time``.
        records: each rank's raw measurements (``unitscale.stages.runtime.measured.RankRecord``).
        bounds: the node-index bounds of the plan's stages, so that the measured durations can
            calibrate another plan of the graph (``plan_pipeline(..., calibration=result)``).
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
        """The simulator's step for the durations measured in the workers (:attr:`stage_costs`):
        how close its ``step_time`` comes to :attr:`step_time` tests the timing model.

        Raises:
            InputError: the result carries no measurements (built by hand).

        >>> import torch
        >>> from unitscale.stages import PipelineResult
        >>> from unitscale.stages.planner import ChainCosts
        >>> costs = ChainCosts.uniform([1.0, 1.0], backward_ratio=2.0)
        >>> r = PipelineResult(None, torch.tensor(0.0), {}, 12.0, costs, None, "gpipe", 3)
        >>> r.predicted().step_time  # (m + p - 1) * (f + b)
        12.0
        """
        if self.stage_costs is None:
            raise InputError(
                "this PipelineResult carries no measured stage_costs; use the one run_pipeline(..., loss_fn=..., "
                "target=...) returns"
            )
        bounds = list(range(len(self.stage_costs) + 1))  # one item per stage
        return simulate_bounds(
            self.stage_costs, bounds, self.schedule, self.num_microbatches, self.stages_per_rank, device_speeds
        )
