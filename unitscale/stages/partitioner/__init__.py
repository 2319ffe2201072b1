"""The partitioner: an exact min-max split of a captured model into contiguous stages.

:func:`partition` returns a :class:`StagePlan`, which builds, checks, reports and saves the stages.

>>> import torch
>>> from unitscale.stages.partitioner import partition
>>> model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
>>> partition(model, 2, torch.randn(2, 8)).bounds
[0, 2, 4]
"""

from unitscale.stages.partitioner.costs import backward_times as backward_times
from unitscale.stages.partitioner.plan import StagePlan as StagePlan
from unitscale.stages.partitioner.plan import StageReport as StageReport
from unitscale.stages.partitioner.plan import StageRow as StageRow
from unitscale.stages.partitioner.plan import bubble_fraction as bubble_fraction
from unitscale.stages.partitioner.plan import partition as partition
from unitscale.stages.partitioner.plan_files import SavedPlan as SavedPlan

__all__ = ["partition", "StagePlan", "StageReport", "StageRow", "SavedPlan", "bubble_fraction", "backward_times"]
