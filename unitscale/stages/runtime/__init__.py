"""The runtime: a plan run as a real pipeline on :mod:`torch.distributed.pipelining`.

:func:`run_pipeline` starts one worker process per rank and returns a :class:`PipelineResult`;
:func:`pipeline_stage` builds this rank's :class:`RankPipeline` in a script ``torchrun`` starts.
The top room: it uses the partitioner (plans and plan files) and the planner (the timeline).

>>> from unitscale.stages.runtime import RankPipeline
>>> RankPipeline([], None, stage_indices=[1], num_stages=2).is_last
True
"""

from unitscale.stages.runtime.launch import RankPipeline as RankPipeline
from unitscale.stages.runtime.launch import pipeline_stage as pipeline_stage
from unitscale.stages.runtime.pipeline import run_pipeline as run_pipeline
from unitscale.stages.runtime.result import PipelineResult as PipelineResult
from unitscale.stages.schedules import placement as placement

__all__ = ["run_pipeline", "PipelineResult", "pipeline_stage", "RankPipeline", "placement"]
