"""The schedule vocabulary the three rooms share: names, checks, placement, orders, costs.

The one place that says what a schedule name means (placement, the order each rank runs its
work in, as :mod:`torch.distributed.pipelining` does, so the simulator and the runtime agree),
and :class:`ChainCosts`, the cost model of a chain of *items* the planner and simulator share.

>>> from unitscale.stages.schedules import in_flight, stage_ranks
>>> in_flight("1f1b", ranks=4, stages_per_rank=1, num_microbatches=8)
[4, 3, 2, 1]
>>> stage_ranks("zbv", ranks=2, stages_per_rank=2)
[0, 1, 1, 0]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from unitscale.errors import CostError, InputError, StageCountError, UnknownScheduleError

__all__ = [
    "SCHEDULES",
    "ChainCosts",
    "Op",
    "schedule_order",
    "stage_ranks",
    "in_flight",
    "check_schedule",
    "placement",
    "torch_schedule_class",
    "valid_microbatches",
]

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv")
#: Adam in mixed precision: fp32 master weight, gradient, two moments (4 + 4 + 8 bytes per parameter).
ADAM_BYTES_PER_PARAM = 16.0


class Op(NamedTuple):
    """One unit of work on a rank: ``kind`` is ``"F"`` (forward), ``"B"`` (full backward),
    ``"I"`` (backward to the input) or ``"W"`` (backward to the weights)."""

    kind: str
    stage: int
    microbatch: int


@dataclass(frozen=True)
class ChainCosts:
    """Costs of a chain of ``n`` items, per microbatch.

    Attributes:
        forward: forward time of each item at speed 1 (seconds, or any unit used throughout).
        backward: backward time of each item (input and weight gradients together).
        param_bytes: bytes each item's parameters hold with gradients and optimiser state.
        activation_bytes: bytes each item keeps per microbatch from its forward to its backward.
        boundary_bytes: ``n + 1`` values; ``boundary_bytes[i]`` crosses a cut before item ``i``
            (ends are 0); a cut costs ``latency + bytes / bandwidth`` each way.
        bandwidth: bytes per second between neighbouring ranks (``inf``: free).
        weight_grad_share: the part of ``backward`` that is the weight gradient (zero-bubble
            schedules run it apart, as ``"W"``).
        action_overhead: seconds of the schedule's own bookkeeping added to every forward and
            every backward; not scaled by device speed. :func:`~unitscale.run_pipeline` measures it.

    >>> from unitscale.stages.schedules import ChainCosts
    >>> c = ChainCosts.uniform(
    ...     [1.0, 2.0, 3.0], backward_ratio=2.0, boundary_bytes=100.0, bandwidth=1e3
    ... )
    >>> c.backward, c.comm_time(1)
    ((2.0, 4.0, 6.0), 0.1)
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    param_bytes: tuple[float, ...]
    activation_bytes: tuple[float, ...]
    boundary_bytes: tuple[float, ...]
    bandwidth: float = math.inf
    latency: float = 0.0
    weight_grad_share: float = 0.5
    action_overhead: float = 0.0

    def __post_init__(self) -> None:
        n = len(self.forward)
        if n == 0:
            raise StageCountError("ChainCosts needs at least one item")
        for name in ("backward", "param_bytes", "activation_bytes"):
            if len(getattr(self, name)) != n:
                raise CostError(f"ChainCosts.{name} has {len(getattr(self, name))} values for {n} items; give one each")
        if len(self.boundary_bytes) != n + 1:
            raise CostError(
                f"ChainCosts.boundary_bytes has {len(self.boundary_bytes)} values; give n + 1 = {n + 1} "
                "(one per possible cut, ends included)"
            )
        for name in ("forward", "backward", "param_bytes", "activation_bytes", "boundary_bytes"):
            values = getattr(self, name)
            bad = next((v for v in values if not (math.isfinite(v) and v >= 0)), None)
            if bad is not None:
                raise CostError(f"ChainCosts.{name} holds {bad}; every cost must be finite and >= 0")
        check_link(self.bandwidth, self.latency)
        if not 0.0 <= self.weight_grad_share <= 1.0:
            raise CostError(f"weight_grad_share={self.weight_grad_share} must be between 0 and 1")
        if not (math.isfinite(self.action_overhead) and self.action_overhead >= 0):
            raise CostError(f"action_overhead={self.action_overhead} must be a finite number of seconds >= 0")

    @classmethod
    def uniform(
        cls,
        forward: Sequence[float],
        backward_ratio: float = 2.0,
        param_bytes: float | Sequence[float] = 0.0,
        activation_bytes: float | Sequence[float] = 0.0,
        boundary_bytes: float | Sequence[float] = 0.0,
        bandwidth: float = math.inf,
        latency: float = 0.0,
    ) -> ChainCosts:
        """Costs from forward times alone: backward ``backward_ratio`` times the forward (2 for
        matmul-heavy layers), scalars broadcast to every item (and every inner cut).

        >>> from unitscale.stages.schedules import ChainCosts
        >>> ChainCosts.uniform([1.0, 1.0], boundary_bytes=8.0).boundary_bytes
        (0.0, 8.0, 0.0)
        """
        n = len(forward)

        def each(value: float | Sequence[float], count: int) -> tuple[float, ...]:
            return tuple(float(v) for v in value) if isinstance(value, Sequence) else (float(value),) * count

        inner = each(boundary_bytes, n - 1) if not isinstance(boundary_bytes, Sequence) else None
        return cls(
            forward=tuple(float(f) for f in forward),
            backward=tuple(float(f) * backward_ratio for f in forward),
            param_bytes=each(param_bytes, n),
            activation_bytes=each(activation_bytes, n),
            boundary_bytes=(0.0, *inner, 0.0) if inner is not None else each(boundary_bytes, n + 1),
            bandwidth=bandwidth,
            latency=latency,
        )

    def __len__(self) -> int:
        return len(self.forward)

    def comm_time(self, cut: int) -> float:
        """Seconds to send what crosses a cut before item ``cut`` (one microbatch, one way)."""
        if cut <= 0 or cut >= len(self):
            return 0.0
        return self.latency + self.boundary_bytes[cut] / self.bandwidth


def check_link(bandwidth: float, latency: float) -> None:
    """Typed errors for a bandwidth that is not > 0 or a latency that is not >= 0."""
    if isinstance(bandwidth, bool) or not isinstance(bandwidth, (int, float)) or not bandwidth > 0:
        raise CostError(
            f"bandwidth={bandwidth!r} must be a number > 0 (bytes per second between ranks); "
            "use math.inf to ignore communication"
        )
    if isinstance(latency, bool) or not isinstance(latency, (int, float)) or not (latency >= 0 and latency < math.inf):
        raise CostError(f"latency={latency!r} must be a finite number >= 0 (seconds per message)")


def valid_microbatches(schedule: str, ranks: int, near: int) -> list[int]:
    """Microbatch counts up to about ``2 * near`` that ``schedule`` accepts on ``ranks`` ranks (one stage each
    for GPipe and 1F1B).

    >>> from unitscale.stages.schedules import valid_microbatches
    >>> valid_microbatches("interleaved_1f1b", 4, 6)
    [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 15, 16]
    """
    return _counts_that_fit(schedule, ranks, ranks, near)


def _counts_that_fit(schedule: str, ranks: int, num_stages: int, near: int) -> list[int]:
    counts = range(1, max(2 * near, 4 * num_stages) + 1)
    return [m for m in counts if _microbatch_problem(schedule, ranks, num_stages, m) is None]


def _microbatch_problem(schedule: str, ranks: int, num_stages: int, m: int) -> str | None:
    """Why torch (2.13) refuses ``m`` microbatches for ``schedule``, or ``None``."""
    if schedule in ("interleaved_1f1b", "interleaved_zero_bubble"):
        rounds = max(1, m // ranks)
        if m % rounds:
            return (
                f"{schedule} splits the microbatches into max(1, m // ranks) = {rounds} rounds of equal size, "
                f"and {rounds} does not divide {m}"
            )
    if schedule == "1f1b" and m < num_stages:
        return f"1f1b needs at least as many microbatches as stages ({num_stages})"
    # zbv takes any count: torch's ScheduleZBVZeroBubble runs (and its order holds every
    # action) with fewer microbatches than stages too
    return None


def check_schedule(
    schedule: str, num_stages: int, stages_per_rank: int, num_microbatches: int, *, training: bool = True
) -> int:
    """Check that ``schedule`` runs ``num_stages`` stages, ``stages_per_rank`` per rank, on
    ``num_microbatches`` microbatches; return the number of ranks.

    The rules are torch's (2.13): GPipe and 1F1B hold one stage per rank, ZBV two (a V), the
    interleaved schedules any number; 1F1B needs at least one microbatch per stage; the
    interleaved schedules take any count below ``2 * ranks`` and, from there on, a count that
    ``m // ranks`` divides (any multiple of ``ranks`` works); ZBV cannot run a forward-only step
    (``training=False``).

    >>> from unitscale.stages import check_schedule
    >>> check_schedule("interleaved_1f1b", 8, stages_per_rank=2, num_microbatches=10)
    4

    Raises:
        UnknownScheduleError: ``schedule`` is not one of ``SCHEDULES``.
        StageCountError: ``stages_per_rank`` that does not divide ``num_stages`` or fit the schedule.
        InputError: a microbatch count the schedule cannot use (the message lists counts near it
            that work), or a forward-only step with ``"zbv"``.
    """
    if schedule not in SCHEDULES:
        raise UnknownScheduleError(f"unknown schedule {schedule!r}; use one of {', '.join(map(repr, SCHEDULES))}")
    for name, value in (("num_stages", num_stages), ("stages_per_rank", stages_per_rank)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise StageCountError(f"{name}={value!r} must be an int >= 1")
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches={num_microbatches!r} must be an int >= 1")
    if num_stages % stages_per_rank:
        divisors = [d for d in range(1, num_stages + 1) if num_stages % d == 0]
        raise StageCountError(
            f"{num_stages} stages cannot be spread evenly with stages_per_rank={stages_per_rank}; use "
            f"stages_per_rank in {divisors} or a multiple of {stages_per_rank} stages"
        )
    ranks = num_stages // stages_per_rank
    if schedule in ("gpipe", "1f1b") and stages_per_rank != 1:
        raise StageCountError(
            f"schedule {schedule!r} runs one stage per rank, got stages_per_rank={stages_per_rank}; "
            "use 'interleaved_1f1b' or 'interleaved_zero_bubble' for several (or 'zbv' for two), or stages_per_rank=1"
        )
    if schedule == "zbv" and stages_per_rank != 2:
        raise StageCountError(
            f"schedule 'zbv' places exactly 2 stages per rank (a V), got stages_per_rank={stages_per_rank}; "
            "pass stages_per_rank=2 with a plan of 2 * ranks stages, or use 'interleaved_1f1b'"
        )
    if schedule == "zbv" and not training:
        raise InputError(
            "schedule='zbv' cannot run a forward-only step (torch's ZBV schedule steps its backward actions "
            "even without a loss); use schedule='interleaved_1f1b' with the same plan and stages_per_rank=2, "
            "or pass loss_fn and target for a training step"
        )
    problem = _microbatch_problem(schedule, ranks, num_stages, num_microbatches)
    if problem is not None:
        good = _counts_that_fit(schedule, ranks, num_stages, num_microbatches)
        nearby = sorted(sorted(good, key=lambda m: (abs(m - num_microbatches), m))[:4])
        also = (
            f"any count >= {num_stages} works, or schedule='gpipe'"
            if schedule == "1f1b"
            else f"any multiple of {ranks} works"
        )
        raise InputError(
            f"num_microbatches={num_microbatches} does not fit {schedule} on {ranks} ranks: {problem}; "
            f"use num_microbatches in {nearby} ({also})"
        )
    return ranks


def stage_ranks(schedule: str, ranks: int, stages_per_rank: int) -> list[int]:
    """The rank that runs each stage: in order for one stage per rank, looped for interleaved
    schedules, a V for ``"zbv"``."""
    total = ranks * stages_per_rank
    if schedule == "zbv":
        return [s if s < ranks else total - 1 - s for s in range(total)]
    return [s % ranks for s in range(total)]


def placement(schedule: str, num_ranks: int, stages_per_rank: int = 1) -> list[list[int]]:
    """The stage indices each rank holds, rank by rank.

    >>> from unitscale.stages.runtime import placement
    >>> placement("interleaved_1f1b", 2, 2), placement("zbv", 2, 2)
    ([[0, 2], [1, 3]], [[0, 3], [1, 2]])
    """
    ranks = stage_ranks(schedule, num_ranks, 2 if schedule == "zbv" else stages_per_rank)
    return [[s for s, rank in enumerate(ranks) if rank == r] for r in range(num_ranks)]


def _gpipe(ranks: int, m: int) -> list[list[Op]]:
    return [[Op("F", r, i) for i in range(m)] + [Op("B", r, i) for i in range(m)] for r in range(ranks)]


def _one_f_one_b(ranks: int, m: int) -> list[list[Op]]:
    orders = []
    for r in range(ranks):
        warmup = min(m, ranks - r)
        ops = [Op("F", r, i) for i in range(warmup)]
        for i in range(m - warmup):
            ops += [Op("B", r, i), Op("F", r, warmup + i)]
        ops += [Op("B", r, i) for i in range(m - warmup, m)]
        orders.append(ops)
    return orders


def torch_schedule_class(schedule: str) -> Any:
    """The :mod:`torch.distributed.pipelining` class that runs ``schedule``."""
    # lazy: torch.distributed.pipelining adds 4.6 s to `import unitscale` (python -X importtime)
    from torch.distributed import pipelining as pp

    return {
        "gpipe": pp.ScheduleGPipe,
        "1f1b": pp.Schedule1F1B,
        "interleaved_1f1b": pp.ScheduleInterleaved1F1B,
        "interleaved_zero_bubble": pp.ScheduleInterleavedZeroBubble,
        "zbv": pp.ScheduleZBVZeroBubble,
    }[schedule]


def _from_torch(schedule: str, ranks: int, v: int, m: int) -> list[list[Op]]:
    """The per-rank order torch's own schedule class computes (no process group needed)."""
    cls = torch_schedule_class(schedule)
    sched: Any = cls.__new__(cls)
    # the attributes _calculate_single_rank_operations reads, as the constructor sets them
    sched.pp_group_size = ranks
    sched.n_local_stages = v
    sched._n_microbatches = m
    sched.number_of_rounds = max(1, m // ranks)
    sched.microbatches_per_round = m // sched.number_of_rounds
    sched.num_stages = sched._num_stages = ranks * v
    per_rank = {}
    for r in range(ranks):
        sched.rank = r
        per_rank[r] = sched._calculate_single_rank_operations(r)
    if schedule == "interleaved_zero_bubble":
        sched.pipeline_order = per_rank
        per_rank = sched._add_bubbles_to_actions(ranks * v)
    return [
        [
            Op(str(a.computation_type.value), a.stage_index, a.microbatch_index)
            for a in per_rank[r]
            if a is not None and a.microbatch_index is not None and a.microbatch_index < m
        ]
        for r in range(ranks)
    ]


@functools.lru_cache(maxsize=64)
def _order(schedule: str, ranks: int, v: int, m: int) -> tuple[tuple[Op, ...], ...]:
    written = {"gpipe": _gpipe, "1f1b": _one_f_one_b}.get(schedule)  # else read from torch's class
    return tuple(tuple(o) for o in (written(ranks, m) if written else _from_torch(schedule, ranks, v, m)))


def schedule_order(schedule: str, ranks: int, stages_per_rank: int, num_microbatches: int) -> list[list[Op]]:
    """Each rank's work in the order ``schedule`` runs it.

    >>> from unitscale.stages.schedules import schedule_order
    >>> [f"{op.kind}{op.microbatch}" for op in schedule_order("1f1b", 2, 1, 3)[0]]
    ['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
    """
    check_schedule(schedule, ranks * stages_per_rank, stages_per_rank, num_microbatches)
    return [list(o) for o in _order(schedule, ranks, stages_per_rank, num_microbatches)]


def in_flight(schedule: str, ranks: int, stages_per_rank: int, num_microbatches: int) -> list[int]:
    """Per stage, the most microbatches whose activations it holds at once under ``schedule``
    (freed when the backward ends: the ``"W"`` part, for zero-bubble schedules)."""
    orders = schedule_order(schedule, ranks, stages_per_rank, num_microbatches)
    held, peak = [0] * (ranks * stages_per_rank), [0] * (ranks * stages_per_rank)
    for ops in orders:
        for op in ops:
            if op.kind == "F":
                held[op.stage] += 1
                peak[op.stage] = max(peak[op.stage], held[op.stage])
            elif op.kind in ("B", "W"):
                held[op.stage] -= 1
    return peak
