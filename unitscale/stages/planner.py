"""Exact pipeline planning for a schedule: the split with the smallest step time that fits in memory.

The step-time model
-------------------
Stage ``s`` (of ``p * v``: ``p`` ranks, ``v`` stages per rank) takes
``c_s = (F_s + B_s) / speed`` per microbatch on its rank; a cut costs
``t = latency + bytes / bandwidth`` each way. The planner minimises

.. math::

    T = (m - 1)\\, v \\max_s c_s + \\kappa \\Big(\\sum_s c_s + 2 \\sum_{\\text{cuts}} t\\Big),
    \\qquad \\kappa = \\frac{v + p - 1}{p\\, v}.

For GPipe (``v = 1``, ``κ = 1``) this is the simulator's step time exactly whenever the
backward is a fixed multiple of the forward (the default, ``backward=2.0``): GPipe's
forward phase is a flow shop of ``m`` identical jobs, whose makespan is
``Σ F_s + Σ t + (m - 1) max F_s`` (the longest path through the grid of microbatches and
stages spends its ``m - 1`` extra steps at the slowest stage), and the backward phase is
the same in reverse. For 1F1B it is the textbook ``(m + p - 1)``-slot formula of
Narayanan et al. (2021); with uneven stages or slow links the simulator
(:mod:`~unitscale.stages.simulate`) can differ from it (``tests/stages/test_planner.py``
measures by how much). For interleaved schedules ``v max c_s`` bounds a rank's work and
``κ`` is the ``(p - 1) / v`` bubble of the interleaved schedule.

Memory: stage ``s`` holds its parameters with gradients and optimiser state plus the
activations of every microbatch in flight (GPipe ``m``, 1F1B ``p - s``, interleaved and
zero-bubble as torch's orders say, :func:`~unitscale.stages.schedule_costs.in_flight`);
with ``v`` stages per rank each stage gets ``memory_limit / v``.

The search (exact for the model)
--------------------------------
``T = (m - 1) v M + κ A(plan)`` with ``M`` the bottleneck. For a cap ``U``, a dynamic
programme over prefixes finds ``A*(U)``, the least ``A`` with every stage ``<= U`` and in
memory (range minima over the window of feasible starts: ``O(k n log n)`` with numpy).
``A*`` only falls as ``U`` grows, so the optimum lies at some realised bottleneck between
``M0`` (the least bottleneck, by bisection over the float line with a feasibility
programme) and ``M0 + κ (A*(M0) - A*(∞)) / ((m - 1) v)``. The search walks down that range
through the programme's own realised bottlenecks, each time asking for plans strictly
below the last, and stops once ``(m - 1) v M0 + κ A`` (a lower bound on everything
left) cannot beat the best plan: the returned plan is optimal, and ``lower_bound``
certifies it.

>>> from unitscale.stages.planner import plan_chain
>>> from unitscale.stages.schedule_costs import ChainCosts
>>> costs = ChainCosts.uniform([4, 1, 1, 1, 1, 1, 1, 1, 1], backward_ratio=2.0)
>>> plan_chain(costs, ranks=2, schedule="gpipe", num_microbatches=4).bounds
[0, 3, 9]
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import fx, nn

from unitscale.errors import CostError, InputError, MemoryLimitError, StageCountError
from unitscale.stages import search
from unitscale.stages.schedule_costs import (
    ADAM_BYTES_PER_PARAM,
    ChainCosts,
    check_link,
    check_schedule,
    in_flight,
    stage_ranks,
)

__all__ = ["ChainPlan", "plan_chain", "plan_pipeline", "model_step_time", "chain_costs_for"]


@dataclass(frozen=True)
class ChainPlan:
    """The result of :func:`~unitscale.stages.plan_chain`.

    Attributes:
        bounds: stage ``s`` holds items ``bounds[s]:bounds[s + 1]``.
        step_time: the model's step time of this plan (the minimum).
        lower_bound: a proven lower bound on the model's step time of every plan that fits
            (equal to ``step_time`` up to rounding: the certificate of optimality).
        bottleneck: the largest per-microbatch stage time ``max_s c_s``.
        stage_memory: bytes each stage needs.
        probes: dynamic programmes run by the search.
    """

    bounds: list[int]
    step_time: float
    lower_bound: float
    bottleneck: float
    stage_memory: list[float]
    probes: int


class _Problem:
    """Prefix arrays of one planning problem, in the units the search compares."""

    def __init__(
        self,
        costs: ChainCosts,
        ranks: int,
        schedule: str,
        num_microbatches: int,
        stages_per_rank: int,
        memory_limit: float | None,
        device_speeds: Sequence[float] | None,
    ) -> None:
        self.n = len(costs)
        self.k = ranks * stages_per_rank
        self.m, self.v, self.p = num_microbatches, stages_per_rank, ranks
        placement = stage_ranks(schedule, ranks, stages_per_rank)
        speeds = [1.0] * ranks if device_speeds is None else [float(s) for s in device_speeds]
        work = np.cumsum(np.asarray(costs.forward, dtype=np.float64) + np.asarray(costs.backward, dtype=np.float64))
        work = np.concatenate(([0.0], work))
        #: x[s][i] - x[s][j]: time of stage s over items j:i on its rank
        self.x = [work / speeds[placement[s]] for s in range(self.k)]
        held = in_flight(schedule, ranks, stages_per_rank, num_microbatches)
        params = np.concatenate(([0.0], np.cumsum(np.asarray(costs.param_bytes, dtype=np.float64))))
        acts = np.concatenate(([0.0], np.cumsum(np.asarray(costs.activation_bytes, dtype=np.float64))))
        self.q = [params + held[s] * acts for s in range(self.k)]
        self.limit = math.inf if memory_limit is None else memory_limit / stages_per_rank
        self.comm = np.array([costs.comm_time(j) for j in range(self.n + 1)], dtype=np.float64)
        self.kappa = (stages_per_rank + ranks - 1) / (ranks * stages_per_rank)
        self.weight = (num_microbatches - 1) * stages_per_rank
        self.idx = np.arange(self.n + 1)
        self._memory_starts: dict[tuple[int, float], np.ndarray] = {}
        #: the most one item takes on any stage (time, memory): at or above, any item fits any stage
        self.single_time = max(float(np.max(np.diff(x))) for x in self.x)
        self.single_memory = max(float(np.max(np.diff(q))) for q in self.q)

    def starts(self, s: int, cap: float, strict: bool) -> np.ndarray:
        """For every end ``i``, the first start ``j`` with stage ``s`` over ``j:i`` within ``cap`` and memory."""
        key = (s, self.limit)
        if key not in self._memory_starts:
            self._memory_starts[key] = self._first(self.q[s], self.limit, False)
        return np.maximum(np.maximum(self._first(self.x[s], cap, strict), self._memory_starts[key]), s)

    def _first(self, prefix: np.ndarray, cap: float, strict: bool) -> np.ndarray:
        if cap == math.inf:
            return np.zeros(self.n + 1, dtype=np.int64)
        j = np.searchsorted(prefix, prefix - cap, side="left").astype(np.int64)

        # the very differences the plan is judged by decide, not the rounded target
        def fits(j: np.ndarray) -> np.ndarray:
            d = prefix - prefix[np.minimum(j, self.n)]
            return (d < cap) if strict else (d <= cap)

        while True:
            back = (j > 0) & fits(np.maximum(j - 1, 0))
            if not back.any():
                break
            j = j - back
        while True:
            ahead = (j <= self.idx) & ~fits(j)
            if not ahead.any():
                break
            j = j + ahead
        return j

    def _furthest(self, prefix: np.ndarray, start: int, cap: float) -> int:
        """The last end ``i`` with ``prefix[i] - prefix[start] <= cap`` (the same subtraction the plan uses)."""
        i = int(np.searchsorted(prefix, prefix[start] + cap, side="right")) - 1
        i = max(min(i, self.n), start)
        while i < self.n and prefix[i + 1] - prefix[start] <= cap:
            i += 1
        while i > start and prefix[i] - prefix[start] > cap:
            i -= 1
        return i

    def feasible(self, cap: float, strict: bool = False) -> bool:
        """Whether some plan has every stage within ``cap`` (``< cap`` if ``strict``) and in memory."""
        if not strict and cap >= self.single_time and self.limit >= self.single_memory:
            # every item fits every stage alone, so the ends reachable with s stages are an
            # interval [s, e_s]: the greedy furthest reach decides (O(k log n))
            end = 0
            for s in range(self.k):
                end = min(self._furthest(self.x[s], end, cap), self._furthest(self.q[s], end, self.limit))
                if end == self.n:
                    return s == self.k - 1 or self.n >= self.k
            return False
        reach = np.zeros(self.n + 1, dtype=bool)
        reach[0] = True
        for s in range(self.k):
            lo = self.starts(s, cap, strict)
            count = np.concatenate(([0], np.cumsum(reach)))  # reachable starts in [a, b): count[b] - count[a]
            hi = self.idx  # a start j < i
            ok = (lo < hi) & (count[np.maximum(hi, 0)] - count[np.minimum(lo, hi)] > 0)
            ok[: s + 1] = False
            reach = ok
        return bool(reach[self.n])

    def least_cap(self) -> float:
        """The least bottleneck any plan in memory reaches (bisection over the float line)."""
        hi = max(float(max(x[-1] for x in self.x)), 0.0)
        if not self.feasible(hi):
            raise _NoFit
        lo_bits, hi_bits = -1, int(np.float64(hi).view(np.int64))
        while hi_bits - lo_bits > 1:
            mid = (lo_bits + hi_bits) // 2
            if self.feasible(float(np.int64(mid).view(np.float64))):
                hi_bits = mid
            else:
                lo_bits = mid
        return float(np.int64(hi_bits).view(np.float64))

    def cheapest(self, cap: float, strict: bool) -> tuple[float, list[int]] | None:
        """The least ``Σ c_s + 2 Σ t`` over plans whose stages are all within ``cap`` (and memory)."""
        inf = math.inf
        prev = np.full(self.n + 1, inf)
        prev[0] = 0.0
        args = []
        for s in range(self.k):
            val = prev - self.x[s] + (2 * self.comm if s else 0.0)
            lo = self.starts(s, cap, strict)
            hi = self.idx - 1
            best, arg = _range_min(val, lo, hi)
            cur = best + self.x[s]
            cur[: s + 1] = inf
            cur[self.n - (self.k - 1 - s) + 1 :] = inf
            prev = cur
            args.append(arg)
        if not math.isfinite(prev[self.n]):
            return None
        bounds = [self.n]
        for arg in reversed(args):
            bounds.append(int(arg[bounds[-1]]))
        return float(prev[self.n]), bounds[::-1]

    def bottleneck(self, bounds: Sequence[int]) -> float:
        return max(float(self.x[s][b] - self.x[s][a]) for s, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)))

    def memory(self, bounds: Sequence[int]) -> list[float]:
        return [float(self.q[s][b] - self.q[s][a]) for s, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False))]


class _NoFit(Exception):
    pass


def _range_min(val: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum of ``val[lo[i]:hi[i] + 1]`` and where it is, for every ``i`` (``inf`` where empty)."""
    n = len(val)
    table, where = [val], [np.arange(n)]
    width = 1
    while 2 * width <= n:
        # table[k][j] = min(val[j : j + 2**k])
        t, w = table[-1], where[-1]
        a, b = t[: len(t) - width], t[width:]
        take_right = b < a
        table.append(np.where(take_right, b, a))
        where.append(np.where(take_right, w[width:], w[: len(w) - width]))
        width *= 2
    length = hi - lo + 1
    empty = length <= 0
    safe_len = np.where(empty, 1, length)
    level = np.floor(np.log2(safe_len)).astype(np.int64)
    level = np.minimum(level, len(table) - 1)
    lo_safe = np.where(empty, 0, lo)
    hi_start = np.where(empty, 0, hi - (1 << level) + 1)
    best = np.full(len(lo), math.inf)
    arg = np.zeros(len(lo), dtype=np.int64)
    for lv in np.unique(level[~empty]):
        rows = np.nonzero((level == lv) & ~empty)[0]
        t, w = table[lv], where[lv]
        a_val, b_val = t[lo_safe[rows]], t[hi_start[rows]]
        pick_b = b_val < a_val
        best[rows] = np.where(pick_b, b_val, a_val)
        arg[rows] = np.where(pick_b, w[hi_start[rows]], w[lo_safe[rows]])
    return best, arg


def _most_even(problem: _Problem, cap: float) -> list[int] | None:
    """Among plans with every stage ``<= cap`` and in memory, one with the least sum of squared
    stage times (``None`` when that quadratic programme exceeds ``search.BALANCE_BUDGET``)."""
    n, k = problem.n, problem.k
    starts = [problem.starts(s, cap, False).tolist() for s in range(k)]
    if sum(i - lo[i] for lo in starts for i in range(n + 1) if lo[i] < i) > search.BALANCE_BUDGET:
        return None
    x = problem.x[0].tolist()
    inf = math.inf
    best = [0.0] + [inf] * n
    args = []
    for s in range(k):
        lo = starts[s]
        new, arg = [inf] * (n + 1), [0] * (n + 1)
        for i in range(s + 1, n - (k - 1 - s) + 1):
            for j in range(lo[i], i):
                if best[j] == inf:
                    continue
                w = x[i] - x[j]
                v = best[j] + w * w
                if v < new[i]:
                    new[i], arg[i] = v, j
        best = new
        args.append(arg)
    if best[n] == inf:
        return None
    bounds = [n]
    for arg in reversed(args):
        bounds.append(arg[bounds[-1]])
    return bounds[::-1]


def _smallest_memory(problem: _Problem) -> float:
    """The least per-stage memory limit some plan meets (bisection over the float line)."""
    saved = problem.limit
    try:
        top = max(float(q[-1]) for q in problem.q)
        lo_bits, hi_bits = -1, int(np.float64(top).view(np.int64))
        while hi_bits - lo_bits > 1:
            mid = (lo_bits + hi_bits) // 2
            problem.limit = float(np.int64(mid).view(np.float64))
            if problem.feasible(math.inf):
                hi_bits = mid
            else:
                lo_bits = mid
        return float(np.int64(hi_bits).view(np.float64))
    finally:
        problem.limit = saved


def model_step_time(
    costs: ChainCosts,
    bounds: Sequence[int],
    schedule: str,
    num_microbatches: int,
    stages_per_rank: int = 1,
    device_speeds: Sequence[float] | None = None,
) -> float:
    """The planner's step-time model ``(m - 1) v max c_s + κ (Σ c_s + 2 Σ t)`` for ``bounds``.

    >>> from unitscale.stages.planner import model_step_time
    >>> from unitscale.stages.schedule_costs import ChainCosts
    >>> model_step_time(ChainCosts.uniform([1.0] * 4), [0, 1, 2, 3, 4], "gpipe", 4)  # (m + p - 1) * 3
    21.0
    """
    ranks = (len(bounds) - 1) // stages_per_rank
    check_schedule(schedule, ranks, stages_per_rank, num_microbatches)
    problem = _Problem(costs, ranks, schedule, num_microbatches, stages_per_rank, None, device_speeds)
    pairs = enumerate(itertools.pairwise(bounds))
    work = sum(float(problem.x[s][b] - problem.x[s][a]) for s, (a, b) in pairs)
    comm = 2 * sum(float(problem.comm[b]) for b in bounds[1:-1])
    return problem.weight * problem.bottleneck(bounds) + problem.kappa * (work + comm)


def plan_chain(
    costs: ChainCosts,
    ranks: int,
    schedule: str = "1f1b",
    num_microbatches: int = 8,
    stages_per_rank: int = 1,
    memory_limit: float | None = None,
    device_speeds: Sequence[float] | None = None,
) -> ChainPlan:
    """The split of a chain into ``ranks * stages_per_rank`` stages with the least modelled step time.

    The model: stage ``s`` takes ``c_s = (F_s + B_s) / speed`` per microbatch, a cut
    ``t = latency + bytes / bandwidth`` each way, and a step
    ``T = (m - 1) v max_s c_s + κ (Σ_s c_s + 2 Σ_cuts t)`` with ``κ = (v + p - 1) / (p v)``
    (``p`` ranks, ``v`` stages per rank). For GPipe with a backward that is a fixed multiple
    of the forward this is exactly the simulated step (:func:`~unitscale.stages.simulate`):
    the forward phase is a flow shop of ``m`` identical jobs, whose makespan is
    ``Σ F_s + Σ t + (m - 1) max F_s``, and the backward phase mirrors it. For 1F1B it is the
    textbook ``(m + p - 1)``-slot formula, which the simulator can beat or exceed by a few
    percent when stages are uneven or links slow; for interleaved schedules ``v max c_s``
    bounds a rank's work and ``κ`` is their ``(p - 1) / v`` bubble. Each stage must fit
    ``memory_limit / v``: its parameters with gradients and optimiser state, plus the
    activations of the microbatches the schedule holds at once.

    The search: for a cap ``U`` on every stage, a dynamic programme over prefixes (range
    minima with numpy) finds the least ``A = Σ c_s + 2 Σ t``; ``A`` only falls as ``U``
    grows, so the optimum sits at a realised bottleneck between the least one ``M0``
    (bisection) and ``M0 + κ (A(M0) - A(∞)) / ((m - 1) v)``. The search walks down that
    range through the programme's own bottlenecks and stops once ``(m - 1) v M0 + κ A``
    cannot beat the best plan; that bound is ``lower_bound``, the certificate. Among
    optimal plans without traffic, speeds or memory limits, the most even one is kept
    (``search.balanced_bounds``).

    Args:
        costs: per-item costs (:class:`~unitscale.stages.ChainCosts`).
        ranks: devices in the pipeline.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        num_microbatches: microbatches per step.
        stages_per_rank: stages per rank (``v``).
        memory_limit: bytes per device (``None``: unlimited).
        device_speeds: relative speed of each rank (default all 1.0).

    Returns:
        A :class:`ChainPlan`.

    Raises:
        MemoryLimitError: no split fits ``memory_limit``; the message gives the least limit that works.
        StageCountError: more stages than items.
        InputError: a microbatch count the schedule cannot run, or bad ``device_speeds``/``memory_limit``.
        UnknownScheduleError: an unknown schedule.

    >>> from unitscale.stages.planner import plan_chain
    >>> from unitscale.stages.schedule_costs import ChainCosts
    >>> costs = ChainCosts.uniform([1.0] * 6, activation_bytes=10.0)
    >>> plan_chain(costs, 2, "gpipe", 4, memory_limit=120.0).bounds  # 4 microbatches * 10 B * 3 items
    [0, 3, 6]
    """
    check_schedule(schedule, ranks, stages_per_rank, num_microbatches)
    k = ranks * stages_per_rank
    if k > len(costs):
        raise StageCountError(
            f"ranks * stages_per_rank = {ranks} * {stages_per_rank} = {k} stages, but the chain has only "
            f"{len(costs)} pieces to place; use at most {len(costs)} stages (fewer ranks or stages_per_rank)"
        )
    if device_speeds is not None and (
        len(device_speeds) != ranks or not all(math.isfinite(s) and s > 0 for s in device_speeds)
    ):
        raise InputError(f"device_speeds={list(device_speeds)!r} must hold one finite number > 0 per rank ({ranks})")
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not memory_limit > 0
    ):
        raise InputError(f"memory_limit={memory_limit!r} must be a number of bytes > 0, or None for no limit")
    problem = _Problem(costs, ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds)
    try:
        floor = problem.least_cap()
    except _NoFit:
        need = _smallest_memory(problem) * stages_per_rank
        raise MemoryLimitError(
            f"no split of {len(costs)} pieces into {k} stages fits memory_limit={memory_limit:.4g} bytes per device "
            f"under {schedule} with {num_microbatches} microbatches; the least limit that works is {need:.4g} bytes "
            "(raise the limit, or use more ranks, fewer microbatches in flight (1f1b) or fewer bytes per parameter)",
            needed=need,
        ) from None
    probes = 0
    first = problem.cheapest(floor, strict=False)
    unbounded = problem.cheapest(math.inf, strict=False)
    probes += 2
    assert first is not None and unbounded is not None
    best_a, best_bounds = first
    best_t = problem.weight * problem.bottleneck(best_bounds) + problem.kappa * best_a
    least_a = unbounded[0]
    if problem.weight == 0:
        best_a, best_bounds = unbounded
        best_t = problem.kappa * best_a
        cap = -math.inf
    else:
        cap = floor + problem.kappa * (best_a - least_a) / problem.weight
    strict = False
    lower = best_t
    while cap >= floor:
        found = problem.cheapest(cap, strict)
        probes += 1
        if found is None:
            break
        a, bounds = found
        top = problem.bottleneck(bounds)
        t = problem.weight * top + problem.kappa * a
        if t < best_t:
            best_t, best_a, best_bounds = t, a, bounds
        # every plan left has bottleneck >= floor and A >= a
        lower = problem.weight * floor + problem.kappa * a
        if lower >= best_t:
            break
        cap, strict = top, True
    lower = min(lower, best_t)
    same_speed = len({float(x[-1]) for x in problem.x}) == 1
    if problem.weight and not problem.comm.any() and same_speed:
        # A is the same for every plan, so every plan within the bottleneck (and memory) is optimal:
        # keep the most even of them (a stage of cost 0 beside the heaviest helps nobody)
        even = _most_even(problem, problem.bottleneck(best_bounds))
        if even is not None:
            best_bounds = even
    return ChainPlan(
        bounds=list(best_bounds),
        step_time=best_t,
        lower_bound=lower,
        bottleneck=problem.bottleneck(best_bounds),
        stage_memory=problem.memory(best_bounds),
        probes=probes,
    )


def _units(costs: ChainCosts, pieces: Sequence[int]) -> ChainCosts:
    """``costs`` summed over each piece (the runs of nodes no cut may split)."""

    def summed(values: Sequence[float]) -> tuple[float, ...]:
        return tuple(math.fsum(values[a:b]) for a, b in zip(pieces, pieces[1:], strict=False))

    return ChainCosts(
        forward=summed(costs.forward),
        backward=summed(costs.backward),
        param_bytes=summed(costs.param_bytes),
        activation_bytes=summed(costs.activation_bytes),
        boundary_bytes=tuple(costs.boundary_bytes[b] for b in pieces),
        bandwidth=costs.bandwidth,
        latency=costs.latency,
        weight_grad_share=costs.weight_grad_share,
    )


def chain_costs_for(
    plan: Any,
    num_microbatches: int,
    *,
    seconds_per_cost: float = 1.0,
    backward: float | Callable[[fx.Node], float] = 2.0,
    bytes_per_param: float = ADAM_BYTES_PER_PARAM,
    bandwidth: float = math.inf,
    latency: float = 0.0,
) -> ChainCosts:
    """Per-node :class:`~unitscale.stages.ChainCosts` of a :class:`~unitscale.StagePlan`.

    The plan's node costs are taken as measured on the whole batch of one step, so a
    microbatch's forward time is the node cost times ``seconds_per_cost`` (1 for
    ``cost="time"``; ``1 / FLOP rate`` for ``cost="flops"``) over ``num_microbatches``;
    backward is ``backward`` times the forward, or a callable ``node -> seconds`` per
    microbatch. Parameters take ``bytes_per_param`` each (16 for Adam with fp32 master
    weights); each node keeps its output for the backward; a cut sends the
    tensors that cross it. Activations and traffic are per microbatch (the example batch
    split ``num_microbatches`` ways).

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages.planner import chain_costs_for
    >>> plan = partition(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), 1, torch.randn(4, 4))
    >>> c = chain_costs_for(plan, num_microbatches=2)
    >>> c.param_bytes, c.activation_bytes, c.boundary_bytes
    ((640.0, 288.0), (64.0, 16.0), (0.0, 64.0, 0.0))
    """
    from unitscale.stages.costs import _params_per_node, output_bytes

    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches={num_microbatches!r} must be an int >= 1")
    check_link(bandwidth, latency)
    if not (isinstance(bytes_per_param, (int, float)) and bytes_per_param >= 0 and math.isfinite(bytes_per_param)):
        raise CostError(f"bytes_per_param={bytes_per_param!r} must be a finite number >= 0 (Adam in fp32: 16)")
    nodes = plan._compute_nodes()
    position = {node: i for i, node in enumerate(nodes)}
    n = len(nodes)
    # node costs were measured on the whole example batch; a microbatch is 1/m of it
    forward = [c * seconds_per_cost / num_microbatches for _, c in plan.node_costs]
    if callable(backward):
        from unitscale.stages.costs import _call_cost, _checked

        bwd = [_checked(node, _call_cost(backward, node)) for node in nodes]
    else:
        if not (isinstance(backward, (int, float)) and backward >= 0 and math.isfinite(backward)):
            raise CostError(f"backward={backward!r} must be a ratio >= 0 to the forward, or a callable node -> seconds")
        bwd = [f * backward for f in forward]
    params = _params_per_node(plan._root, nodes)
    acts = [output_bytes(node.meta.get("tensor_meta")) / num_microbatches for node in nodes]
    crossing = [0.0] * (n + 2)
    for node in plan.graph.nodes:
        if node.op not in ("placeholder", "call_function", "call_method", "call_module") or not node.users:
            continue
        size = output_bytes(node.meta.get("tensor_meta")) / num_microbatches
        made = position.get(node, -1)
        last = max(position.get(u, n) for u in node.users)
        # crosses the cut before item i for made < i <= last
        crossing[made + 1] += size
        crossing[min(last, n) + 1] -= size
    boundary, running = [], 0.0
    for i in range(n + 1):
        running += crossing[i]
        boundary.append(running if 0 < i < n else 0.0)
    return ChainCosts(
        forward=tuple(forward),
        backward=tuple(bwd),
        param_bytes=tuple(params[node] * bytes_per_param for node in nodes),
        activation_bytes=tuple(acts),
        boundary_bytes=tuple(max(b, 0.0) for b in boundary),
        bandwidth=bandwidth,
        latency=latency,
    )


def plan_pipeline(
    module: nn.Module | Any,
    example_inputs: Any,
    ranks: int,
    *,
    schedule: str = "1f1b",
    num_microbatches: int = 8,
    stages_per_rank: int = 1,
    cost: str | Callable[[fx.Node], float] = "time",
    seconds_per_cost: float | None = None,
    backward: float | Callable[[fx.Node], float] = 2.0,
    memory_limit: float | None = None,
    bytes_per_param: float = ADAM_BYTES_PER_PARAM,
    bandwidth: float = math.inf,
    latency: float = 0.0,
    device_speeds: Sequence[float] | None = None,
    boundary_depth: int | None = None,
    repeats: int = 5,
) -> Any:
    """Split ``module`` for ``schedule`` on ``ranks`` devices with the least step time that fits in memory.

    The model is captured and costed as :func:`~unitscale.partition` does; then
    :func:`~unitscale.stages.plan_chain` picks the split (exact for the step-time model in its
    docstring). The plan keeps its costs (``plan.chain_costs``), so
    :func:`~unitscale.stages.simulate` predicts its timeline.

    Args:
        module: the model, or a :class:`~unitscale.StagePlan` of it (``partition(model, 1, x, cost="time")``)
            whose graph, cut places and node costs are reused (``cost``, ``boundary_depth`` and
            ``repeats`` are then ignored), so that timing the nodes once serves many plans.
        example_inputs: a tensor or tuple, the whole batch of one step (split into microbatches).
        ranks: devices in the pipeline.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        num_microbatches: microbatches per step.
        stages_per_rank: stages per rank (several for the interleaved schedules, 2 for ``"zbv"``).
        cost: node cost as in :func:`~unitscale.partition` (``"time"``: measured seconds).
        seconds_per_cost: seconds per unit of ``cost`` (default 1 for ``"time"``, ``1e-11`` otherwise,
            about 100 GFLOP/s for ``"flops"``).
        backward: backward time as a multiple of the forward, or a callable ``node -> seconds``.
        memory_limit: bytes per device, or ``None``.
        bytes_per_param: bytes per parameter for weights, gradients and optimiser state.
        bandwidth: bytes per second between ranks (``math.inf``: free).
        latency: seconds per message between ranks.
        device_speeds: relative speed of each rank.
        boundary_depth: cut only between modules at this depth (as in :func:`~unitscale.partition`).
        repeats: timings per node for ``cost="time"``.

    Returns:
        The :class:`~unitscale.StagePlan` with ``ranks * stages_per_rank`` stages.

    Raises:
        MemoryLimitError: no split fits; the message says the least ``memory_limit`` that works.
        CostError: ``bandwidth <= 0``, a negative latency, or a bad cost model.
        StageCountError: more stages than places to cut.
        InputError: a microbatch count ``schedule`` cannot run (the message lists ones that can).

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.stages.planner import plan_pipeline
    >>> model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    >>> plan = plan_pipeline(model, torch.randn(4, 8), 2, schedule="gpipe", num_microbatches=2, cost="params")
    >>> plan.stage_costs
    [216.0, 216.0]
    """
    from unitscale.stages.plan import StagePlan, partition

    check_schedule(schedule, ranks, stages_per_rank, num_microbatches)
    check_link(bandwidth, latency)
    if isinstance(module, StagePlan):
        base = module  # its graph and node costs, measured once, serve every schedule
    else:
        base = partition(module, 1, example_inputs, cost, boundary_depth=boundary_depth, repeats=repeats)
    scale = seconds_per_cost if seconds_per_cost is not None else (1.0 if base.cost == "time" else 1e-11)
    costs = chain_costs_for(
        base,
        num_microbatches,
        seconds_per_cost=scale,
        backward=backward,
        bytes_per_param=bytes_per_param,
        bandwidth=bandwidth,
        latency=latency,
    )
    pieces = base.pieces
    found = plan_chain(
        _units(costs, pieces), ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds
    )
    plan = base.with_bounds([pieces[b] for b in found.bounds])
    plan.chain_costs = costs
    return plan
