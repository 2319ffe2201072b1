"""Event-driven simulation of a pipeline schedule: step time, bubble, memory, timeline.

Each rank runs its work in the schedule's order; a piece starts when its rank is free and its
inputs have arrived (:func:`_program`), a value from another rank ``latency + bytes / bandwidth``
after it was made (sends do not block compute, links do not contend).

>>> from unitscale.stages.schedules import ChainCosts
>>> from unitscale.stages.planner.simulation import simulate_bounds
>>> costs = ChainCosts.uniform([1.0] * 4, backward_ratio=2.0)
>>> t = simulate_bounds(costs, [0, 1, 2, 3, 4], "gpipe", num_microbatches=4)
>>> t.step_time, round(t.bubble, 3)  # (m + p - 1) * (f + b) = 7 * 3
(21.0, 0.429)
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from unitscale.errors import InputError, StageCountError
from unitscale.stages.schedules import ChainCosts, check_schedule, in_flight, schedule_order, stage_ranks

if TYPE_CHECKING:
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure

    from unitscale.stages.partitioner.plan import StagePlan

__all__ = ["TimelineBlock", "Timeline", "simulate", "simulate_bounds", "step_times"]

_FitLabel: type  # made by _fit_label, on first use: pickle (a figure's copy) looks for it here


@functools.cache
def _fit_label() -> type:
    """A block's label drawn only where its block, as drawn, holds it with room: a copy drawn narrower
    for a phone (``docs/_ext/figure_widths.py``) decides again. Made on first use, with matplotlib."""
    from matplotlib.text import Text  # lazy: as Timeline.plot's imports

    global _FitLabel

    class _FitLabel(Text):
        span = (0.0, 0.0)

        def draw(self, renderer: RendererBase) -> None:
            left, right = self.axes.transData.transform([(x, 0) for x in self.span])[:, 0]  # type: ignore[union-attr]
            # half its width of the block's colour on each side: a number reads as its block's, not a neighbour's
            if 2 * self.get_window_extent(renderer).width + 4 < abs(right - left):
                super().draw(renderer)

    return _FitLabel


@dataclass(frozen=True)
class TimelineBlock:
    """One piece of work on the timeline: ``kind`` ``F``/``B``/``I``/``W`` of ``stage`` on ``microbatch``.

    >>> from unitscale.stages.planner import TimelineBlock
    >>> TimelineBlock(rank=0, stage=1, kind="F", microbatch=2, start=0.5, end=1.5).end
    1.5
    """

    rank: int
    stage: int
    kind: str
    microbatch: int
    start: float
    end: float


@dataclass
class Timeline:
    """What :func:`~unitscale.stages.simulate` predicts for one training step.

    Attributes:
        blocks: every piece of work, with start and end times.
        step_time: when the last backward ends.
        stage_memory: peak bytes per stage (parameters, gradients, optimiser state and
            the activations the schedule holds at once).
        rank_memory: peak bytes per rank (its stages together).
    """

    schedule: str
    ranks: int
    num_microbatches: int
    blocks: list[TimelineBlock]
    step_time: float
    stage_memory: list[float]
    rank_memory: list[float]
    stage_ranks: list[int] = field(default_factory=list)

    @property
    def busy(self) -> list[float]:
        """Seconds of work per rank."""
        return [sum((b.end - b.start for b in self.blocks if b.rank == r), 0.0) for r in range(self.ranks)]

    @property
    def bubble(self) -> float:
        """Share of ``ranks * step_time`` the ranks spend idle."""
        if self.step_time <= 0:
            return 0.0
        return 1.0 - sum(self.busy) / (self.ranks * self.step_time)

    def __repr__(self) -> str:
        return (
            f"Timeline({self.schedule}, {self.ranks} ranks, m={self.num_microbatches}: step {self.step_time:.4g}, "
            f"bubble {self.bubble:.1%}, peak memory {max(self.rank_memory):.4g} B)"
        )

    def plot(self, ax: object | None = None, title: str | None = None, labels: bool = True) -> Figure:
        """Draw the timeline: one row per rank, one block per piece of work, labelled with its microbatch.

        Args:
            ax: matplotlib axes to draw on (default: a new figure 7.5 in wide).
            title: the axes' title (default: schedule, step time and bubble).
            labels: write the microbatch index in blocks wide enough to hold it.
        """
        # lazy: matplotlib.pyplot adds 1.9 s to `import unitscale` (python -X importtime); only plots need it
        import matplotlib.pyplot as plt
        from matplotlib.axes import Axes
        from matplotlib.patches import Patch

        if ax is None:
            fig, axes = plt.subplots(figsize=(7.5, 0.45 * self.ranks + 1.2))
        else:
            assert isinstance(ax, Axes)
            axes, fig = ax, ax.figure  # type: ignore[assignment]
        colours = {"F": "#4C72B0", "B": "#DD8452", "I": "#DD8452", "W": "#55A868"}
        chunks = max((self.stage_ranks.count(r) for r in range(self.ranks)), default=1)
        for b in self.blocks:
            chunk = sorted(s for s, r in enumerate(self.stage_ranks) if r == b.rank).index(b.stage)
            alpha = 1.0 - 0.45 * chunk / max(chunks - 1, 1) if chunks > 1 else 1.0
            axes.barh(b.rank, b.end - b.start, 0.8, b.start, color=colours[b.kind], alpha=alpha, ec="white", lw=0.5)
            if labels:  # drawn where the block, as drawn, holds it: a phone's copy has narrower blocks
                label = _fit_label()((b.start + b.end) / 2, b.rank, str(b.microbatch), ha="center", va="center", size=9)
                label.span = (b.start, b.end)
                axes._add_text(label)  # type: ignore[attr-defined]  # as axes.text does: one of ax.texts
        axes.set_yticks(range(self.ranks), [f"rank {r}" for r in range(self.ranks)])
        axes.invert_yaxis()
        axes.set_xlim(0, self.step_time * 1.01 if self.step_time > 0 else 1)
        axes.set_xlabel("time")
        kinds = sorted({b.kind for b in self.blocks}, key="FBIW".index)
        names = {"F": "forward", "B": "backward", "I": "input grad", "W": "weight grad"}
        axes.legend(
            handles=[Patch(color=colours[k], label=names[k]) for k in kinds],
            fontsize=9,
            loc="lower right",
            bbox_to_anchor=(1.0, 1.0),
            ncols=len(kinds),
            frameon=False,
            borderaxespad=0.1,
        )
        axes.set_title(
            title or f"{self.schedule}: step {self.step_time:.3g}, bubble {self.bubble:.0%}", fontsize=10, loc="left"
        )
        return fig


def _check_bounds(bounds: Sequence[int], n: int, stages: int) -> None:
    if len(bounds) == stages + 1 and (bounds[0] != 0 or bounds[-1] != n):
        raise StageCountError(
            f"bounds {list(bounds)} must run from 0 to the chain's {n} items; the costs and the plan disagree"
        )
    if len(bounds) != stages + 1:
        raise StageCountError(
            f"the plan has {len(bounds) - 1} stages but the schedule needs ranks * stages_per_rank = {stages}; "
            f"partition into {stages} stages"
        )
    if any(b <= a for a, b in zip(bounds, bounds[1:], strict=False)):
        raise StageCountError(f"bounds {list(bounds)} hold an empty stage; every stage needs at least one item")


def _speeds(device_speeds: Sequence[float] | None, ranks: int) -> list[float]:
    if device_speeds is None:
        return [1.0] * ranks
    speeds = [float(s) for s in device_speeds]
    if len(speeds) != ranks or not all(math.isfinite(s) and s > 0 for s in speeds):
        raise InputError(
            f"device_speeds={list(device_speeds)!r} must hold one finite number > 0 per rank ({ranks}); "
            "1.0 is the speed the costs were measured at"
        )
    return speeds


def simulate_bounds(
    costs: ChainCosts,
    bounds: Sequence[int],
    schedule: str,
    num_microbatches: int,
    stages_per_rank: int = 1,
    device_speeds: Sequence[float] | None = None,
) -> Timeline:
    """The :class:`Timeline` of one step of ``schedule`` for the stages ``bounds`` of a chain with ``costs``.

    Args:
        bounds: stage ``s`` holds items ``bounds[s]:bounds[s + 1]``; ``ranks * stages_per_rank`` stages.
        device_speeds: relative speed of each rank (default all 1.0).

    >>> from unitscale.stages.schedules import ChainCosts
    >>> from unitscale.stages.planner.simulation import simulate_bounds
    >>> c = ChainCosts.uniform([1.0, 1.0], boundary_bytes=1.0, bandwidth=2.0)
    >>> simulate_bounds(c, [0, 1, 2], "gpipe", 1).step_time  # f, send, f, b, send, b
    7.0
    """
    num_stages = len(bounds) - 1
    ranks = check_schedule(schedule, num_stages, stages_per_rank, num_microbatches)
    _check_bounds(bounds, len(costs), num_stages)
    placement = stage_ranks(schedule, ranks, stages_per_rank)
    speeds = _speeds(device_speeds, ranks)
    stages = list(zip(bounds, bounds[1:], strict=False))
    fwd, bwd = (
        [math.fsum(times[a:b]) / speeds[placement[s]] + costs.action_overhead for s, (a, b) in enumerate(stages)]
        for times in (costs.forward, costs.backward)
    )
    share = costs.weight_grad_share
    duration = {"F": fwd, "B": bwd, "I": [b * (1 - share) for b in bwd], "W": [b * share for b in bwd]}
    comm = [costs.comm_time(b) for b in bounds]  # comm[s]: between stage s - 1 and s
    ends: list[float] = []
    free = [0.0] * ranks
    blocks: list[TimelineBlock] = []
    for r, kind, s, i, deps in _program(schedule, ranks, stages_per_rank, num_microbatches):
        ready = max([free[r], *(ends[d] + (comm[c] if c >= 0 else 0.0) for d, c in deps)])
        end = ready + duration[kind][s]
        ends.append(end)
        blocks.append(TimelineBlock(r, s, kind, i, ready, end))
        free[r] = end
    held = in_flight(schedule, ranks, stages_per_rank, num_microbatches)
    stage_memory = [
        math.fsum(costs.param_bytes[a:b]) + held[s] * math.fsum(costs.activation_bytes[a:b])
        for s, (a, b) in enumerate(stages)
    ]
    rank_memory = [sum((q for s, q in enumerate(stage_memory) if placement[s] == r), 0.0) for r in range(ranks)]
    return Timeline(
        schedule=schedule,
        ranks=ranks,
        num_microbatches=num_microbatches,
        blocks=blocks,
        step_time=max(free),
        stage_memory=stage_memory,
        rank_memory=rank_memory,
        stage_ranks=placement,
    )


def simulate(
    plan: StagePlan,
    schedule: str,
    num_microbatches: int,
    stages_per_rank: int = 1,
    device_speeds: Sequence[float] | None = None,
    costs: ChainCosts | None = None,
) -> Timeline:
    """Predict one training step of ``plan`` under ``schedule``: step time, bubble, memory, timeline.

    Args:
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        stages_per_rank: stages per rank (looped placement; a V for ``"zbv"``).
        device_speeds: relative speed of each rank (default all 1.0).
        costs: per-node costs (default: the plan's own ``plan.chain_costs`` from ``plan_pipeline``, else
            its node costs as forward times, backward twice that, no memory or communication).

    Returns:
        The :class:`Timeline` (``.step_time``, ``.bubble``, ``.stage_memory``, ``.plot()``).

    Raises:
        UnknownScheduleError: an unknown schedule name.
        StageCountError: the plan's stage count is not ``ranks * stages_per_rank``.
        InputError: a microbatch count the schedule cannot run, or bad ``device_speeds``.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages import simulate
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    >>> plan = partition(model, 2, torch.randn(2, 4))
    >>> simulate(plan, "1f1b", num_microbatches=4).step_time
    300.0
    """
    if costs is None:
        costs = plan.chain_costs or ChainCosts.uniform([c for _, c in plan.node_costs])
    return simulate_bounds(costs, plan.bounds, schedule, num_microbatches, stages_per_rank, device_speeds)


@functools.lru_cache(maxsize=32)
def _program(schedule: str, ranks: int, stages_per_rank: int, num_microbatches: int) -> tuple[tuple, ...]:
    """The simulator's work as a straight-line programme: per op, in an order that respects every
    dependency, ``(rank, kind, stage, microbatch, deps)`` with ``deps`` pairs ``(op index, cut or -1)``:
    the op waits for that op's end plus the time of the cut (``-1``: same rank, no message).

    A forward needs the previous stage's forward of its microbatch; a backward (or ``I``) its own
    forward and the next stage's gradient; a weight gradient ``W`` its own ``I``."""
    orders = schedule_order(schedule, ranks, stages_per_rank, num_microbatches)
    placement = stage_ranks(schedule, ranks, stages_per_rank)
    last = ranks * stages_per_rank - 1
    grad = "I" if any(op.kind == "I" for o in orders for op in o) else "B"
    index: dict[tuple[str, int, int], int] = {}
    program: list[tuple] = []
    nxt = [0] * ranks
    remaining = sum(len(o) for o in orders)
    while remaining:
        before = remaining
        for r in range(ranks):
            while nxt[r] < len(orders[r]):
                op = orders[r][nxt[r]]
                s, i = op.stage, op.microbatch
                if op.kind == "F":
                    deps = [] if s == 0 else [(("F", s - 1, i), s - 1)]
                elif op.kind == "W":
                    deps = [(("I", s, i), s)]
                else:
                    deps = [(("F", s, i), s)] + ([] if s == last else [((grad, s + 1, i), s + 1)])
                if any(key not in index for key, _ in deps):
                    break
                wired = tuple((index[key], -1 if placement[src] == placement[s] else max(src, s)) for key, src in deps)
                index[(op.kind, s, i)] = len(program)
                program.append((r, op.kind, s, i, wired))
                nxt[r] += 1
                remaining -= 1
        if remaining == before:  # pragma: no cover - torch's orders are deadlock-free
            raise RuntimeError(f"schedule {schedule} deadlocked in simulation at {nxt}")
    return tuple(program)


def step_times(
    schedule: str,
    ranks: int,
    stages_per_rank: int,
    num_microbatches: int,
    forward: np.ndarray,
    backward: np.ndarray,
    comm: np.ndarray,
    weight_grad_share: float = 0.5,
) -> np.ndarray:
    """Simulated ``(plans,)`` step times of many plans at once (the same model as :func:`simulate_bounds`).

    The step time never falls when a duration grows (it is a longest path), so durations that
    are lower bounds give a lower bound.

    Args:
        forward: ``(plans, p * v)`` forward time of each stage on its rank (speed applied).
        backward: ``(plans, p * v)`` backward time of each stage on its rank.
        comm: ``(plans, p * v)``; ``comm[:, s]`` is the message time between stages ``s - 1`` and ``s``.
        weight_grad_share: the weight-gradient part of the backward (zero-bubble schedules).

    >>> import numpy as np
    >>> from unitscale.stages.planner.simulation import step_times
    >>> ones = np.ones((1, 4))
    >>> step_times("1f1b", 4, 1, 4, ones, 2 * ones, 0 * ones)  # (m + p - 1) * 3
    array([21.])
    """
    check_schedule(schedule, ranks * stages_per_rank, stages_per_rank, num_microbatches)
    program = _program(schedule, ranks, stages_per_rank, num_microbatches)
    forward, backward, comm = (np.asarray(a, dtype=np.float64) for a in (forward, backward, comm))
    share = weight_grad_share
    duration = {"F": forward.T, "B": backward.T, "I": (backward * (1 - share)).T, "W": (backward * share).T}
    free = np.zeros((ranks, forward.shape[0]))
    ends: list[np.ndarray] = []
    for r, kind, s, _, deps in program:
        ready = free[r]
        for d, c in deps:
            ready = np.maximum(ready, ends[d] if c < 0 else ends[d] + comm[:, c])
        end = ready + duration[kind][s]
        ends.append(end)
        free[r] = end
    return free.max(axis=0) if ranks else np.zeros(forward.shape[0])
