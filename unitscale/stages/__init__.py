"""Pipeline stages: exact min-max partitioning over execution order, ``split_module``, and
a real pipeline on :mod:`torch.distributed.pipelining`.

>>> import torch
>>> from unitscale.stages import partition
>>> model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(4)])
>>> partition(model, 2, torch.randn(2, 8)).stage_costs
[144.0, 144.0]
"""

from unitscale.stages.partitioner import SavedPlan as SavedPlan
from unitscale.stages.partitioner import StagePlan as StagePlan
from unitscale.stages.partitioner import StageReport as StageReport
from unitscale.stages.partitioner import StageRow as StageRow
from unitscale.stages.partitioner import backward_times as backward_times
from unitscale.stages.partitioner import bubble_fraction as bubble_fraction
from unitscale.stages.partitioner import partition as partition
from unitscale.stages.planner import ChainPlan as ChainPlan
from unitscale.stages.planner import Timeline as Timeline
from unitscale.stages.planner import TimelineBlock as TimelineBlock
from unitscale.stages.planner import plan_chain as plan_chain
from unitscale.stages.planner import plan_pipeline as plan_pipeline
from unitscale.stages.planner import rule_splits as rule_splits
from unitscale.stages.planner import simulate as simulate
from unitscale.stages.runtime import PipelineResult as PipelineResult
from unitscale.stages.runtime import RankPipeline as RankPipeline
from unitscale.stages.runtime import pipeline_stage as pipeline_stage
from unitscale.stages.runtime import run_pipeline as run_pipeline
from unitscale.stages.schedules import ChainCosts as ChainCosts
from unitscale.stages.schedules import check_schedule as check_schedule
from unitscale.stages.schedules import placement as placement

__all__ = [
    "partition",
    "StagePlan",
    "StageReport",
    "StageRow",
    "run_pipeline",
    "PipelineResult",
    "bubble_fraction",
    "plan_pipeline",
    "plan_chain",
    "rule_splits",
    "ChainPlan",
    "ChainCosts",
    "simulate",
    "Timeline",
    "TimelineBlock",
    "pipeline_stage",
    "RankPipeline",
    "SavedPlan",
    "placement",
    "check_schedule",
    "backward_times",
]
