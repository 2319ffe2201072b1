"""Pipeline stages: split a model into contiguous stages, the costliest as cheap as possible,
and run them as a real pipeline on :mod:`torch.distributed.pipelining`.

The names a user calls: :func:`partition`, :func:`plan_pipeline`, :func:`run_pipeline` and
:func:`pipeline_stage`; their helpers live in :mod:`unitscale.stages.partitioner`,
:mod:`unitscale.stages.planner` and :mod:`unitscale.stages.runtime`.

>>> import torch
>>> from unitscale.stages import partition
>>> model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
>>> partition(model, 2, torch.randn(2, 8)).stage_costs
[144.0, 144.0]
"""

from unitscale.stages.partitioner import SavedPlan as SavedPlan
from unitscale.stages.partitioner import StagePlan as StagePlan
from unitscale.stages.partitioner import bubble_fraction as bubble_fraction
from unitscale.stages.partitioner import partition as partition
from unitscale.stages.planner import ChainPlan as ChainPlan
from unitscale.stages.planner import plan_pipeline as plan_pipeline
from unitscale.stages.planner import simulate as simulate
from unitscale.stages.runtime import PipelineResult as PipelineResult
from unitscale.stages.runtime import RankPipeline as RankPipeline
from unitscale.stages.runtime import pipeline_stage as pipeline_stage
from unitscale.stages.runtime import run_pipeline as run_pipeline
from unitscale.stages.schedules import check_schedule as check_schedule

__all__ = [
    "partition",
    "StagePlan",
    "SavedPlan",
    "bubble_fraction",
    "plan_pipeline",
    "ChainPlan",
    "simulate",
    "run_pipeline",
    "PipelineResult",
    "pipeline_stage",
    "RankPipeline",
    "check_schedule",
]
