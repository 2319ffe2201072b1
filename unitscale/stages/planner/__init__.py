"""The planner: the split and microbatch count with the least simulated step time.

:func:`plan_pipeline` plans a captured model, :func:`plan_chain` a chain of :class:`ChainCosts`;
:func:`simulate` gives a split's step time and :class:`Timeline` under a schedule. Uses the
partitioner; the runtime uses it (for the timeline), never the reverse.

>>> from unitscale.stages.planner import ChainCosts, plan_chain
>>> costs = ChainCosts.uniform([1.0, 1.0, 1.0, 1.0])
>>> plan_chain(costs, ranks=2, schedule="gpipe").bounds
[0, 2, 4]
"""

from unitscale.stages.planner.planner import ChainPlan as ChainPlan
from unitscale.stages.planner.planner import plan_chain as plan_chain
from unitscale.stages.planner.planner import plan_pipeline as plan_pipeline
from unitscale.stages.planner.planner import rule_splits as rule_splits
from unitscale.stages.planner.simulation import Timeline as Timeline
from unitscale.stages.planner.simulation import TimelineBlock as TimelineBlock
from unitscale.stages.planner.simulation import simulate as simulate
from unitscale.stages.schedules import ChainCosts as ChainCosts

__all__ = [
    "plan_pipeline",
    "plan_chain",
    "ChainPlan",
    "ChainCosts",
    "rule_splits",
    "simulate",
    "Timeline",
    "TimelineBlock",
]
