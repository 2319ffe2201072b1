"""Exact pipeline planning for a schedule: the split with the least simulated step time that fits in memory.

What is minimised
-----------------
The step time that :func:`~unitscale.stages.simulate` predicts for the chosen schedule
(GPipe, 1F1B, interleaved 1F1B, interleaved zero bubble, ZBV): stage ``s`` takes
``F_s / speed`` and ``B_s / speed`` per microbatch on its rank, a cut costs
``t = latency + bytes / bandwidth`` each way, and each rank runs its work in the
schedule's order. A plan fits when every rank's stages together (parameters with
gradients and optimiser state, plus the activations of the microbatches the schedule
keeps in flight, :func:`~unitscale.stages.schedule_costs.in_flight`) need at most
``memory_limit`` bytes. Among plans whose step times agree within ``1e-9`` (relative),
the one with the least sum of squared stage times ``Σ_s c_s²`` wins, with communication
and device speeds too (``c_s = (F_s + B_s) / speed``).

The search (a branch and bound with a lower-bound certificate)
--------------------------------------------------------------
The simulated step is a longest path through a graph whose shape the schedule fixes
and whose weights are the stage times and cut times, so it never falls when a weight
grows. A partial plan fixes stages ``0..j``; a lower bound on every completion is the
maximum of

* the simulated step with the stages not yet placed taking no time (the simulator
  itself, :func:`~unitscale.stages.simulate.step_times`, many plans at once);
* a water level: the work left, ``X``, runs on the ranks of the later stages;
* with one stage per rank, for each placed stage ``s``: the fill ``H_s`` (microbatch 0's
  forward reaching it), the drain ``D_s`` (the backward of every stage before it), and what
  its rank must do in between: under 1F1B ``max(w F, F + R) + (m - w) c + max(w B, R + B)``
  (``w = min(m, p - s)`` forwards before its first backward, which waits for microbatch 0's
  round trip ``R`` through the later stages, as the last ``w`` backwards wait for microbatch
  ``m - 1``'s), under GPipe ``m F + R + m B``;
* with one stage per rank, for the later stages: rank ``s`` takes at least
  ``Σ_{j<s'<s} c_s' + m c_s`` after the fill (over every split of their time ``X`` the least
  largest such time is ``X / (1 - ((m - 1) / m)^L)``, ``L`` later stages, the ``c_s``
  geometric), and under 1F1B also ``Σ_{j<s'<s} c_s' + (m - w + 1) c_s + 2 Σ_{s'>s} c_s'`` (its
  round trips): the least largest of all of these over the splits of ``X`` is the value of a
  small matrix game, bounded from below by a mixture that multiplicative weights find.

With one stage per rank (GPipe, 1F1B), the search also branches only inside windows: two of
the per-rank bounds above hold for every complete plan and tie a stage's time ``c_s`` to the
time ``x_s`` before it (``m c_s + x_s`` and, under 1F1B, ``(m - w + 1) c_s + x_s + 2 (X - x_{s+1})``,
with the least message time for every cut; ``x_s`` and ``X - x_{s+1}`` at least the least time
any split inside the windows takes before and after the cut, exact on devices of one speed),
so with the stage's memory they cap cut ``s + 1`` by a function of cut ``s``.
Sweeping those caps forward (furthest reach) and backward (least start) until nothing moves
confines each cut to the positions a plan within the incumbent can use
(:meth:`_Search.narrow`, redone when the incumbent improves); with a memory limit this is where
the limit enters the pruning, which the bounds above ignore.

The first incumbent is the optimum of the formula
``(m - 1) v max_s c_s + κ (Σ_s c_s + 2 Σ t)``, ``κ = (v + p - 1) / (p v)`` (a dynamic
programme over prefixes, walked down through its realised bottlenecks), polished one cut
at a time with the simulator. Best first, the search expands the partial plan of least
bound and stops when that bound exceeds the best simulated plan: ``lower_bound`` is then
the certificate (``ChainPlan.optimal``). For GPipe with a backward that is a fixed multiple
of the forward the formula *is* the simulated step (the forward phase is a flow shop of
``m`` identical jobs, makespan ``Σ F_s + Σ t + (m - 1) max F_s``; the backward mirrors
it), so the programme's optimum is certified on its own and the search only breaks ties.

What it costs: the search finishes (a proof of optimality) on the pieces
:func:`plan_pipeline` cuts between (module boundaries: tens to a few hundred) for GPipe and
1F1B, and on small interleaved problems; the bounds for several stages per rank are weaker
(and have no windows), so 8 interleaved stages over a few dozen pieces can already spend the
budget, which then stops the search with the best plan found, ``optimal=False`` and a
``lower_bound`` that certifies the gap. On a 20,000-item chain for 8 ranks and 16
microbatches with communication the windows leave at most a few dozen positions per cut (a
handful with a memory limit), and 1F1B is proven optimal in about 0.3 s without a memory limit
and in about 0.25 s with one, as GPipe is with one (``benchmarks/bench_stages.py``; one loaded
core, against 0.003 s for the min-max search on the same chain; the formula's programmes take
half of it, the search a few hundred to a few thousand simulated plans). On devices of
different speeds the windows are wider: the same chain on four ranks of speed 1 and four of
1.5 is proven optimal under 1F1B without a memory limit (about 1.5 s; other random chains of
that size may stop at the budget, 1 to 3 s, certified within 0.05%), but with the limit the
search spends its budget (about 0.5 s) certified only within 12%: there the step exceeds
every bound above by about 1% (later ranks held at the limit delay the bottleneck's round
trips), so the windows stay a hundred positions wide. GPipe is proven optimal by its formula.

>>> from unitscale.stages.planner import plan_chain
>>> from unitscale.stages.schedule_costs import ChainCosts
>>> costs = ChainCosts.uniform([4, 1, 1, 1, 1, 1, 1, 1, 1], backward_ratio=2.0)
>>> found = plan_chain(costs, ranks=2, schedule="1f1b", num_microbatches=4)
>>> found.bounds, found.step_time == found.lower_bound, found.optimal
([0, 3, 9], True, True)
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
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
    schedule_order,
    stage_ranks,
)
from unitscale.stages.simulate import simulate_bounds, step_times

__all__ = ["ChainPlan", "plan_chain", "plan_pipeline", "model_step_time", "chain_costs_for"]


@dataclass(frozen=True)
class ChainPlan:
    """The result of :func:`~unitscale.stages.plan_chain`.

    Attributes:
        bounds: stage ``s`` holds items ``bounds[s]:bounds[s + 1]``.
        step_time: the simulated step time of this plan (:func:`~unitscale.stages.simulate`).
        lower_bound: a proven lower bound on the simulated step time of every plan that fits;
            equal to ``step_time`` (up to rounding, and ties within ``1e-9`` relative) when the
            search finished: the certificate of optimality.
        bottleneck: the largest per-microbatch stage time ``max_s (F_s + B_s) / speed``.
        stage_memory: bytes each stage needs.
        probes: dynamic programmes run for the first plans (the step-time formula's optimum).
        simulated: plans and partial plans whose step the search simulated.
        optimal: whether ``lower_bound`` proves ``step_time`` optimal (``False``: the search hit
            its budget, and ``lower_bound`` bounds how far from optimal ``step_time`` can be; for
            GPipe the formula's programme proves it, and a spent budget only cuts the tie-break short).
        rank_memory: bytes each rank needs (its stages together), the quantity ``memory_limit`` caps.
    """

    bounds: list[int]
    step_time: float
    lower_bound: float
    bottleneck: float
    stage_memory: list[float]
    probes: int
    simulated: int = 0
    optimal: bool = True
    rank_memory: list[float] = field(default_factory=list)


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


#: relative tolerance within which two simulated step times count as equal (ties go to the most even plan)
TIE = 1e-9
#: plans whose bound the search evaluates before it stops with a certified gap (``ChainPlan.optimal`` False)
SEARCH_BUDGET = 50_000
#: dynamic programmes for the formula's plan where it is only the first incumbent (not GPipe's certificate)
FORMULA_PROBES = 40


class _Search:
    """Branch and bound over the cuts, judged by the simulator itself.

    A node fixes stages ``0..j-1``; its children fix stage ``j`` at every end that fits in
    memory. A child's bound is the simulated step with every later stage (and cut) taking
    no time, which never exceeds the step of any completion (a longest path only grows
    with its weights), raised by a water level: the work left must run on the ranks of
    the later stages. A child with every stage fixed is a plan and its bound is its
    simulated step. Where :meth:`narrow` has set windows, a child's end lies inside its cut's
    window and within reach of its start. Children are evaluated a batch at a time
    (:func:`~unitscale.stages.simulate.step_times`).
    """

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
        self.costs, self.schedule = costs, schedule
        self.n, self.p, self.v, self.m = len(costs), ranks, stages_per_rank, num_microbatches
        self.k = ranks * stages_per_rank
        self.placement = stage_ranks(schedule, ranks, stages_per_rank)
        speeds = [1.0] * ranks if device_speeds is None else [float(s) for s in device_speeds]
        self.rank_speed = np.asarray(speeds)
        self.speed = np.asarray([speeds[r] for r in self.placement])

        def prefix(values: Sequence[float]) -> np.ndarray:
            return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))

        self.pf, self.pb = prefix(costs.forward), prefix(costs.backward)
        self.pw = self.pf + self.pb
        #: the schedule's bookkeeping, added to every forward and backward of every stage (not scaled by speed)
        self.overhead = float(costs.action_overhead)
        #: a lower bound on what each stage not yet placed adds to the work left: two actions'
        #: bookkeeping, counted at the slowest speed so that dividing by any speed stays below it
        self.unplaced_overhead = 2 * self.overhead * float(np.min(self.speed))
        self.pp, self.pa = prefix(costs.param_bytes), prefix(costs.activation_bytes)
        self.held = np.asarray(in_flight(schedule, ranks, stages_per_rank, num_microbatches), dtype=np.float64)
        #: q[s][b] - q[s][a]: bytes of stage s over items a:b (the same arithmetic as _Problem's)
        self.q = [self.pp + self.held[s] * self.pa for s in range(self.k)]
        self.comm = np.array([costs.comm_time(j) for j in range(self.n + 1)], dtype=np.float64)
        self.limit = math.inf if memory_limit is None else float(memory_limit)
        # 1F1B-like orders (one stage per rank) give a sharper water level: see _bounds
        self.chain = stages_per_rank == 1
        orders = schedule_order(schedule, ranks, stages_per_rank, num_microbatches)
        #: per rank, the stage of its first op (a forward) and the kind and stage of its last
        self.first_stage = [o[0].stage for o in orders]
        self.last_op = [(o[-1].kind, o[-1].stage) for o in orders]
        #: crossing[c]: 1 where the cut before stage c joins two ranks (a message), else 0
        self.crossing = np.array(
            [0.0] + [float(self.placement[c - 1] != self.placement[c]) for c in range(1, self.k)] + [1.0]
        )
        self.fits_after = self._fits_after()
        self._shares: dict[int, float] = {}
        #: per cut, the window its position must lie in for a step within the incumbent, and per
        #: stage the furthest end from each start (:meth:`narrow`); ``None``: every position
        self.window: tuple[list[int], list[int], list[np.ndarray]] | None = None
        self.evaluated = 0  # plans and partial plans simulated
        self.considered = 0  # children bounded (in closed form, and simulated where that cannot prune)

    def _fits_after(self) -> list[np.ndarray]:
        """``fits_after[s][a]``: items ``a:n`` split into stages ``s..k-1``, each alone within the limit
        (necessary for a rank's sum to fit; exact with one stage per rank)."""
        n, k = self.n, self.k
        ok = [np.zeros(n + 1, dtype=bool) for _ in range(k + 1)]
        ok[k][n] = True
        idx = np.arange(n + 1)
        for s in range(k - 1, -1, -1):
            # the first end b > a where the rest fits; the stage a:b holds least memory at the first such b
            later = np.where(ok[s + 1], idx, n + 1)
            first = np.minimum.accumulate(later[::-1])[::-1]
            nxt = np.concatenate((first[1:], [n + 1]))
            valid = nxt <= n
            b = np.where(valid, nxt, n)
            mem = self.q[s][b] - self.q[s]
            ok[s] = valid & (mem <= self.limit)
        return ok

    def narrow(self, target: float) -> bool:
        """Confine every cut to the positions a plan with step ``<= target`` can use (one stage per
        rank, 1F1B or GPipe); ``False`` when no position is left (no such plan).

        Two of :meth:`_rank_terms`'s bounds hold for every complete plan and tie each stage's
        time ``c_s`` to the time ``x_s = Σ_{s'<s} c_s'`` before it (``t``: the least message time):
        ``x_s + m c_s + 2 s t`` (rank ``s`` is busy ``m c_s`` between the fill and the drain) and,
        under 1F1B with ``m > w = p - s``, ``x_s + (m - w + 1) c_s + 2 (X - x_{s+1}) + 2 (k - 1) t``
        (its first and last ``w`` backwards wait for a round trip; GPipe: ``x_s + m c_s + X - x_{s+1}
        + 2 (k - 1) t``). With ``x_s`` at least the least time of any split before cut ``s`` and
        ``X - x_{s+1}`` the least after cut ``s + 1`` (both over the windows found so far, and
        exact on devices of one speed), each bound and the stage's memory cap cut ``s + 1`` by a
        function of cut ``s`` (made never to fall by taking the furthest reach of any earlier start,
        a relaxation). Sweeps forward (furthest reach) and backward (least start) until nothing
        moves give intervals that every such plan respects; the search branches only inside them.
        """
        if not self.chain or self.schedule not in ("gpipe", "1f1b"):
            return True
        n, k, m, inf = self.n, self.k, self.m, math.inf
        # a margin above the tie tolerance: prefix sums and the simulator round differently
        top = target * (1 + 2 * TIE) + 1e-12 * abs(target)
        work = self.pw
        least_t = float(np.min(self.comm[1:n])) if n > 1 else 0.0
        speed = [float(u) for u in self.speed]
        idx = np.arange(n + 1)
        # (a, factor of X - x_{s+1}, constant): the bound x_s + a c_s + factor (X - x_{s+1}) + constant
        terms: list[list[tuple[int, float, float]]] = []
        for s in range(k):
            mine = [(m, 0.0, 2 * s * least_t)]
            if self.schedule == "gpipe" and m > 1:
                mine.append((m, 1.0, 2 * (k - 1) * least_t))
            w = min(m, self.p - s)
            if self.schedule == "1f1b" and m > w:
                mine.append((m - w + 1, 2.0, 2 * (k - 1) * least_t))
            terms.append(mine)
        lo, hi = list(range(k + 1)), [n - (k - s) for s in range(k + 1)]
        hi[0], lo[k] = 0, n
        for _ in range(4):
            outer = (list(lo), list(hi))
            # least time before cut s (stages 0..s-1) and after cut s (stages s..k-1), cuts in windows
            before = [np.where(idx == 0, 0.0, inf)]
            for s in range(1, k + 1):
                g = np.where((idx >= lo[s - 1]) & (idx <= hi[s - 1]), before[-1] - work / speed[s - 1], inf)
                least = np.concatenate(([inf], np.minimum.accumulate(g)[:-1]))  # over cuts b' < b
                before.append(work / speed[s - 1] + least)
            after = [np.empty(0)] * k + [np.where(idx == n, 0.0, inf)]
            for s in range(k - 1, -1, -1):
                h = np.where((idx >= lo[s + 1]) & (idx <= hi[s + 1]), work / speed[s] + after[s + 1], inf)
                least = np.concatenate((np.minimum.accumulate(h[::-1])[::-1][1:], [inf]))  # over cuts b' > b
                after[s] = least - work / speed[s]
            reach: list[np.ndarray] = []
            for s in range(k):
                furthest = np.full(n + 1, n, dtype=np.int64)
                for a, factor, constant in terms[s]:
                    r = a / speed[s]
                    # x_s + r (P_{s+1} - P_s) + factor (X - x_{s+1}) + constant <= top, as
                    # G(b_{s+1}) <= top - constant - x_s + r P_s with G made never to fall
                    rising = r * work + factor * after[s + 1] if factor else r * work
                    rising = np.minimum.accumulate(rising[::-1])[::-1]
                    with np.errstate(invalid="ignore"):
                        room = top - constant - before[s] + r * work
                    room = np.where(np.isnan(room), -inf, room)
                    furthest = np.minimum(furthest, np.searchsorted(rising, room, side="right") - 1)
                if self.limit < inf:
                    cap = self.q[s] + self.limit * (1 + 1e-12)
                    furthest = np.minimum(furthest, np.searchsorted(self.q[s], cap, side="right") - 1)
                reach.append(np.maximum.accumulate(furthest))  # the furthest of any earlier start
            for _ in range(2 * k + 2):
                inner = (list(lo), list(hi))
                for s in range(k):
                    hi[s + 1] = min(hi[s + 1], int(reach[s][hi[s]]))
                    lo[s + 1] = max(lo[s + 1], lo[s] + 1)
                for s in range(k - 1, -1, -1):
                    lo[s] = max(lo[s], int(np.searchsorted(reach[s], lo[s + 1], side="left")))
                    hi[s] = min(hi[s], hi[s + 1] - 1)
                if any(a > b for a, b in zip(lo, hi, strict=True)):
                    self.window = None  # cannot happen with a plan at ``target``; search unconfined
                    return False
                if (lo, hi) == inner:
                    break
            self.window = (lo, hi, reach)
            if (lo, hi) == outer:
                break
        return True

    def stage_memory(self, bounds: Sequence[int]) -> list[float]:
        return [float(self.q[s][b] - self.q[s][a]) for s, (a, b) in enumerate(itertools.pairwise(bounds))]

    def rank_memory(self, bounds: Sequence[int]) -> list[float]:
        total = [0.0] * self.p
        for s, q in enumerate(self.stage_memory(bounds)):
            total[self.placement[s]] += q
        return total

    def fits(self, bounds: Sequence[int]) -> bool:
        return max(self.rank_memory(bounds)) <= self.limit

    def times(self, bounds: Sequence[int]) -> list[float]:
        """Per-microbatch time ``(F + B) / speed`` of each stage, with its two actions' bookkeeping."""
        return [
            float((self.pw[b] - self.pw[a]) / self.speed[s]) + 2 * self.overhead
            for s, (a, b) in enumerate(itertools.pairwise(bounds))
        ]

    def evaluate(self, plans: Sequence[Sequence[int]]) -> np.ndarray:
        """Simulated step times of complete plans."""
        b = np.asarray(plans, dtype=np.int64)
        forward = (self.pf[b[:, 1:]] - self.pf[b[:, :-1]]) / self.speed + self.overhead
        backward = (self.pb[b[:, 1:]] - self.pb[b[:, :-1]]) / self.speed + self.overhead
        comm = self.comm[b[:, :-1]]
        comm[:, 0] = 0.0
        self.evaluated += len(b)
        return step_times(self.schedule, self.p, self.v, self.m, forward, backward, comm, self.costs.weight_grad_share)

    def children(self, node: tuple[int, ...]) -> np.ndarray:
        """Ends for the next stage after ``node`` that fit in memory (with room for the stages after)."""
        j, a = len(node) - 1, node[-1]
        first, last = a + 1, self.n - (self.k - 1 - j)
        if j == self.k - 1:
            first = self.n
        if self.window is not None:
            lo, hi, reach = self.window
            first, last = max(first, lo[j + 1]), min(last, hi[j + 1], int(reach[j][a]))
        ends = np.arange(first, last + 1, dtype=np.int64)
        rank = self.placement[j]
        used = sum(float(self.q[s][node[s + 1]] - self.q[s][node[s]]) for s in range(j) if self.placement[s] == rank)
        mem = used + (self.q[j][ends] - self.q[j][a])
        keep = (mem <= self.limit) & self.fits_after[j + 1][ends]
        return ends[keep]

    def _rank_terms(self, forward: np.ndarray, backward: np.ndarray, comm: np.ndarray, rest: np.ndarray) -> np.ndarray:
        """For one stage per rank: a lower bound on the step from each placed stage's own rank.

        Stage ``s`` (rank ``s``) starts after microbatch 0's forward reaches it (``H``) and its
        last backward is followed by the backward of every stage before (``D``). Under 1F1B it
        runs ``w = min(m, p - s)`` forwards before its first backward, which also waits for
        microbatch 0's round trip through the later stages (``R``); its last ``w`` backwards
        wait for microbatch ``m - 1``'s. Under GPipe the first backward waits for the last
        forward's round trip. ``R`` counts the stages not yet placed by their work alone.
        """
        j = forward.shape[1] - 1
        cut = comm[:, : j + 1]
        sent = np.cumsum(cut, axis=1)  # Σ of cuts 1..s
        zero = np.zeros((forward.shape[0], 1))
        head = np.concatenate((zero, np.cumsum(forward, axis=1)[:, :-1]), axis=1) + sent
        tail = np.concatenate((zero, np.cumsum(backward, axis=1)[:, :-1]), axis=1) + sent
        work = forward + backward
        after = np.sum(work, axis=1, keepdims=True) - np.cumsum(work, axis=1)
        links = np.sum(comm[:, : j + 2], axis=1, keepdims=True) - sent
        trip = after + 2 * links + rest[:, None]
        f, b, m = forward, backward, self.m
        if self.schedule == "gpipe":
            own = m * f + trip + m * b
        else:
            w = np.minimum(m, self.p - np.arange(j + 1))[None, :]
            steady = np.maximum(w * f, f + trip) + (m - w) * work + np.maximum(w * b, trip + b)
            drained = np.maximum(np.maximum(m * f, f + trip) + m * b, m * f + trip + b)
            own = np.where(m > w, steady, drained)
        return np.max(head + own + tail, axis=1)

    def _later_share(self, j: int) -> float:
        """One stage per rank, stages ``0..j`` placed: ``κ`` with every completion's step at least
        the fill plus ``κ X`` (``X``: the time of the stages left, ``Σ_{s>j} c_s``).

        Rank ``s > j`` takes at least ``Σ_{j<s'<s} c_s' + m c_s`` after the fill, and under 1F1B
        also ``Σ_{j<s'<s} c_s' + (m - w + 1) c_s + 2 Σ_{s'>s} c_s'`` (its first and last backwards
        wait for a round trip through the later stages; under GPipe ``m c_s + Σ_{s'>s} c_s'``).
        ``κ`` is the least, over splits of ``X = 1``, of the largest of these: a matrix game
        between the split and the bound, whose value any mixture of bounds bounds from below.
        A few hundred rounds of multiplicative weights find a good mixture; the value returned
        is that mixture's own guarantee, so it is a valid bound however far the rounds got.
        """
        if j in self._shares:
            return self._shares[j]
        later = list(range(j + 1, self.k))
        m, rows = self.m, []
        for s in later:
            before = [1.0 if i < s else 0.0 for i in later]
            rows.append([b + (m if i == s else 0.0) for b, i in zip(before, later, strict=True)])
            if self.schedule == "gpipe":
                rows.append([b + (m if i == s else 1.0 if i > s else 0.0) for b, i in zip(before, later, strict=True)])
            else:
                w = min(m, self.p - s)
                if m > w:
                    row = [
                        b + (m - w + 1 if i == s else 2.0 if i > s else 0.0) for b, i in zip(before, later, strict=True)
                    ]
                    rows.append(row)
        game = np.asarray(rows)  # game[r, i]: bound r when all of X sits in stage i
        scale = float(np.max(game))
        split = np.full(len(later), 1.0 / len(later))
        mixture = np.zeros(len(rows))
        for _ in range(400):
            worst = int(np.argmax(game @ split))
            mixture[worst] += 1.0
            split = split * np.exp(-0.5 * game[worst] / scale)
            split /= split.sum()
        share = float(np.min(mixture @ game) / mixture.sum())
        self._shares[j] = share
        return share

    def _water_level(
        self, forward: np.ndarray, backward: np.ndarray, comm: np.ndarray, ranks_left: list[int], rest: np.ndarray
    ) -> np.ndarray:
        """Several stages per rank: the ranks of the later stages share the work left, ``m X``.

        Rank ``r`` is busy from its first op (which starts after microbatch 0's forward reaches
        that stage) to its last (which the backward of the stages before still follows): a base
        ``H_r + m Σ(placed c on r) + D_r``, counting stages not yet placed as free, plus its share of
        the rest. The step is at least the water level ``τ`` with ``Σ_r speed_r (τ - base_r)^+ = m X``,
        the least over the ranks of lowest bases of ``(m X + Σ speed base) / Σ speed``.
        """
        j = forward.shape[1] - 1
        rows, m = forward.shape[0], self.m
        sent = np.cumsum(comm[:, : j + 2] * self.crossing[: j + 2], axis=1)  # Σ of cuts 1..s that change rank
        heads = np.concatenate((np.zeros((rows, 1)), np.cumsum(forward, axis=1)), axis=1)
        share = self.costs.weight_grad_share
        base = np.zeros((rows, len(ranks_left)))
        for i, r in enumerate(ranks_left):
            first, (kind, last) = self.first_stage[r], self.last_op[r]
            f = min(first, j + 1)
            base[:, i] = heads[:, f] + sent[:, f]
            if kind != "W":
                grads = backward * (1 - share if kind == "I" else 1.0)
                t = min(last, j + 1)
                base[:, i] += np.sum(grads[:, :t], axis=1) + sent[:, t]
            mine = [s for s in range(j + 1) if self.placement[s] == r]
            if mine:
                base[:, i] += m * np.sum(forward[:, mine] + backward[:, mine], axis=1)
        order = np.argsort(base, axis=1)
        sorted_base = np.take_along_axis(base, order, axis=1)
        speed = self.rank_speed[np.asarray(ranks_left)][order]
        levels = (m * rest[:, None] + np.cumsum(speed * sorted_base, axis=1)) / np.cumsum(speed, axis=1)
        return np.min(levels, axis=1)

    def bounds(
        self, nodes: Sequence[tuple[int, ...]], ends: Sequence[np.ndarray], cutoff: float = math.inf
    ) -> tuple[np.ndarray, np.ndarray]:
        """Lower bounds on the step time and on the sum of squared stage times of every plan below
        each child (``node`` + one end), for a batch of nodes; children whose closed-form bound
        already exceeds ``cutoff`` are not simulated."""
        sizes = [len(e) for e in ends]
        offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        self.considered += int(offsets[-1])
        found, squares = np.empty(offsets[-1]), np.empty(offsets[-1])
        depths: dict[int, list[int]] = {}
        for i, node in enumerate(nodes):
            depths.setdefault(len(node), []).append(i)
        for depth, members in depths.items():
            cuts = np.concatenate(
                [np.column_stack((np.broadcast_to(np.asarray(nodes[i]), (sizes[i], depth)), ends[i])) for i in members]
            )
            at = np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in members])
            found[at], squares[at] = self._bound_rows(cuts, cutoff)
        return found, squares

    def _bound_rows(self, cuts: np.ndarray, cutoff: float) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`bounds` for rows of cuts ``b_0 .. b_{j+1}`` (stages ``0..j`` placed)."""
        k, rows = self.k, cuts.shape[0]
        j = cuts.shape[1] - 2
        lo, hi = cuts[:, :-1], cuts[:, 1:]
        forward, backward, comm = np.zeros((rows, k)), np.zeros((rows, k)), np.zeros((rows, k))
        forward[:, : j + 1] = (self.pf[hi] - self.pf[lo]) / self.speed[: j + 1] + self.overhead
        backward[:, : j + 1] = (self.pb[hi] - self.pb[lo]) / self.speed[: j + 1] + self.overhead
        comm[:, 1 : j + 1] = self.comm[cuts[:, 1 : j + 1]]
        stage = forward[:, : j + 1] + backward[:, : j + 1]
        squares = np.sum(stage * stage, axis=1)
        closed = np.zeros(rows)
        if j + 1 < k:
            end = cuts[:, -1]
            comm[:, j + 1] = self.comm[end]
            rest = self.pw[self.n] - self.pw[end] + self.unplaced_overhead * (k - j - 1)
            # Σ (w_s / speed_s)^2 with Σ w_s = rest is least with w_s ∝ speed_s^2
            squares += rest * rest / float(np.sum(self.speed[j + 1 :] ** 2))
            ranks_left = sorted({self.placement[s] for s in range(j + 1, k)})
            if self.chain:
                capacity = float(np.sum(self.rank_speed[ranks_left]))
                # every op of a later stage starts after microbatch 0's forward reaches it, and the
                # rank's last backward is followed by the backward of every stage before
                fill = np.sum(stage, axis=1) + 2 * np.sum(comm[:, : j + 2], axis=1)
                closed = fill + self.m * rest / capacity
                # ... and rank s > j takes at least Σ_{j<s'<s} c_s' + m c_s after that fill; for
                # Σ c = X the least max over s is X / (1 - r^L), r = (m - 1) / m, with the c_s geometric
                spread = rest / float(np.max(self.speed[j + 1 :]))
                closed = np.maximum(closed, fill + spread / (1 - ((self.m - 1) / self.m) ** (k - j - 1)))
                closed = np.maximum(closed, fill + spread * self._later_share(j))
                unplaced = spread + 2 * self.costs.latency * (k - j - 2)
                terms = self._rank_terms(forward[:, : j + 1], backward[:, : j + 1], comm[:, : j + 2], unplaced)
                closed = np.maximum(closed, terms)
            else:
                closed = self._water_level(
                    forward[:, : j + 1], backward[:, : j + 1], comm[:, : j + 2], ranks_left, rest
                )
        run = closed <= cutoff
        found = closed.copy()
        if run.any():
            self.evaluated += int(run.sum())
            simulated = step_times(
                self.schedule,
                self.p,
                self.v,
                self.m,
                forward[run],
                backward[run],
                comm[run],
                self.costs.weight_grad_share,
            )
            found[run] = np.maximum(simulated, closed[run])
        return found, squares

    def run(self, seeds: Sequence[Sequence[int]], budget: int) -> tuple[list[int], float, float, bool]:
        """The plan with the least simulated step (ties: least sum of squared stage times), a lower
        bound on every plan's step, and whether the search finished (else the bound is a gap)."""
        leaves: list[tuple[float, float, tuple[int, ...]]] = []
        plans = [tuple(s) for s in seeds if self.fits(s)]
        if plans:
            for t, plan in zip(self.evaluate(plans).tolist(), plans, strict=True):
                leaves.append((float(t), sum(x * x for x in self.times(plan)), plan))
        best_t = min((t for t, _, _ in leaves), default=math.inf)

        def best_square() -> float:
            return min((q for t, q, _ in leaves if t <= best_t * (1 + TIE)), default=math.inf)

        best_q = best_square()
        if best_t < math.inf:
            self.narrow(best_t)
        heap: list[tuple[float, float, int, tuple[int, ...]]] = [(0.0, 0.0, 0, (0,))]
        count, floor = 1, math.inf  # floor: least bound of a node dropped for its squares
        finished = True
        while heap:
            top = heap[0][0]
            if top > best_t * (1 + TIE):
                break
            spent = self.evaluated >= budget or self.considered >= 10 * budget
            if spent and best_t < math.inf and self.considered:  # the root is always expanded
                finished = False
                break
            batch: list[tuple[int, ...]] = []
            ends: list[np.ndarray] = []
            rows = 0
            while heap and len(batch) < 64 and rows < 50_000 and heap[0][0] <= best_t * (1 + TIE):
                bound, square, _, node = heapq.heappop(heap)
                if bound >= best_t * (1 - TIE) and square >= best_q:
                    floor = min(floor, bound)
                    continue
                end = self.children(node)
                if len(end):
                    batch.append(node)
                    ends.append(end)
                    rows += len(end)
            if not batch:
                continue
            found, squares = self.bounds(batch, ends, best_t * (1 + TIE))
            at = 0
            for node, end in zip(batch, ends, strict=True):
                leaf = len(node) == self.k
                t_all, q_all = found[at : at + len(end)], squares[at : at + len(end)]
                at += len(end)
                keep = np.nonzero(t_all <= best_t * (1 + TIE))[0]
                if leaf:
                    before = best_t
                    for i in keep.tolist():
                        leaves.append((float(t_all[i]), float(q_all[i]), (*node, int(end[i]))))
                        best_t = min(best_t, float(t_all[i]))
                    best_q = best_square()
                    if best_t < before:
                        self.narrow(best_t)
                    continue
                for i in keep.tolist():
                    t, q = float(t_all[i]), float(q_all[i])
                    if t > best_t * (1 + TIE):
                        continue
                    if t >= best_t * (1 - TIE) and q >= best_q:
                        floor = min(floor, t)
                    else:
                        heapq.heappush(heap, (t, q, count, (*node, int(end[i]))))
                        count += 1
        if best_t == math.inf:
            raise _NoFit
        lower = min(best_t, floor, heap[0][0] if heap and not finished else math.inf)
        chosen = min((q, plan) for t, q, plan in leaves if t <= best_t * (1 + TIE))[1]
        return list(chosen), lower, best_t, finished


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
    """The step-time formula ``(m - 1) v max c_s + κ (Σ c_s + 2 Σ t)`` for ``bounds`` (the simulated
    step for GPipe with ``backward`` a fixed multiple of the forward; the first incumbent otherwise).

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


def _formula_plan(problem: _Problem, max_probes: int | None = None) -> tuple[list[int], float, float, int]:
    """The plan minimising the step-time formula ``(m - 1) v max c_s + κ A``, that minimum,
    a lower bound certifying it, and the programmes run (raises ``_NoFit``). With
    ``max_probes``, the best plan after that many programmes (the lower bound then certifies less)."""
    floor = problem.least_cap()
    probes = 2
    first = problem.cheapest(floor, strict=False)
    unbounded = problem.cheapest(math.inf, strict=False)
    assert first is not None and unbounded is not None
    best_a, best_bounds = first
    best_t = problem.weight * problem.bottleneck(best_bounds) + problem.kappa * best_a
    if problem.weight == 0:
        best_a, best_bounds = unbounded
        best_t = problem.kappa * best_a
        cap = -math.inf
    else:
        cap = floor + problem.kappa * (best_a - unbounded[0]) / problem.weight
    strict = False
    lower = best_t
    while cap >= floor and (max_probes is None or probes < max_probes):
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
    return list(best_bounds), best_t, min(lower, best_t), probes


def _polish(search: _Search, bounds: list[int], rounds: int = 2, window: int = 64) -> list[int]:
    """Move one cut at a time to where the simulated step is least (a good first incumbent)."""
    bounds = list(bounds)
    best = float(search.evaluate([bounds])[0])
    for _ in range(rounds):
        moved = False
        for c in range(1, search.k):
            lo, hi = max(bounds[c - 1] + 1, bounds[c] - window), min(bounds[c + 1] - 1, bounds[c] + window)
            plans = [bounds[:c] + [b] + bounds[c + 1 :] for b in range(lo, hi + 1) if b != bounds[c]]
            plans = [q for q in plans if search.fits(q)]
            if not plans:
                continue
            times = search.evaluate(plans)
            i = int(np.argmin(times))
            if times[i] < best * (1 - TIE):
                best, bounds, moved = float(times[i]), plans[i], True
        if not moved:
            break
    return bounds


def _least_rank_memory(search: _Search, budget: int = 500) -> tuple[float, list[int] | None]:
    """The least per-rank memory any plan needs, and such a plan; or, past ``budget`` partial
    plans, a lower bound on it and ``None``.

    Best first over the cuts: a rank's memory only grows as stages are added, and the ranks
    of the stages not yet placed share at least the parameters and the fewest activations in
    flight of the items left, so a partial plan's priority (the larger of its worst rank and
    that average) bounds every completion, and the first complete plan popped is optimal. A
    partial plan ending where another ended with no rank holding less is dropped.
    """
    saved, search.limit = search.limit, math.inf
    saved_fits, search.fits_after = search.fits_after, search._fits_after()
    saved_window, search.window = search.window, None  # windows assume a step target, not memory's
    n, k = search.n, search.k
    try:
        heap: list[tuple[float, tuple[int, ...], tuple[float, ...]]] = [(0.0, (0,), (0.0,) * search.p)]
        seen: dict[tuple[int, int], list[tuple[float, ...]]] = {}
        pops = 0
        while heap:
            worst, node, used = heapq.heappop(heap)
            if len(node) == k + 1:
                return worst, list(node)
            pops += 1
            if pops > budget:
                return worst, None
            j, a = len(node) - 1, node[-1]
            left = sorted({search.placement[s] for s in range(j + 1, k)})
            least_held = float(min(search.held[j + 1 :], default=0.0))
            for b in search.children(node).tolist():
                ranks = list(used)
                ranks[search.placement[j]] += float(search.q[j][b] - search.q[j][a])
                mine = tuple(ranks)
                bucket = seen.setdefault((j, b), [])
                if any(all(x <= y for x, y in zip(other, mine, strict=True)) for other in bucket):
                    continue
                if len(bucket) < 8:
                    bucket.append(mine)
                share = 0.0
                if left:
                    rest = float(search.pp[n] - search.pp[b]) + least_held * float(search.pa[n] - search.pa[b])
                    share = (sum(mine[r] for r in left) + rest) / len(left)
                heapq.heappush(heap, (max(worst, *mine, share), (*node, b), mine))
        raise AssertionError("a chain with at least k items always has a plan")  # pragma: no cover
    finally:
        search.limit, search.fits_after, search.window = saved, saved_fits, saved_window


def _proportional(costs: ChainCosts) -> bool:
    """Whether every item's backward is the same multiple of its forward (GPipe's formula is then exact)."""
    ratio = next((b / f for f, b in zip(costs.forward, costs.backward, strict=True) if f > 0), None)
    if ratio is None:
        return not any(costs.backward)
    return all(
        math.isclose(b, ratio * f, rel_tol=1e-12, abs_tol=0.0)
        for f, b in zip(costs.forward, costs.backward, strict=True)
    )


def plan_chain(
    costs: ChainCosts,
    ranks: int,
    schedule: str = "1f1b",
    num_microbatches: int = 8,
    stages_per_rank: int = 1,
    memory_limit: float | None = None,
    device_speeds: Sequence[float] | None = None,
    search_budget: int = SEARCH_BUDGET,
) -> ChainPlan:
    """The split of a chain into ``ranks * stages_per_rank`` stages with the least simulated step time.

    The step time is what :func:`~unitscale.stages.simulate` predicts for ``schedule``
    (stage ``s`` takes ``(F_s + B_s) / speed`` per microbatch on its rank, a cut
    ``latency + bytes / bandwidth`` each way), and a plan fits when every rank's stages
    together (parameters with gradients and optimiser state, plus the activations of the
    microbatches the schedule holds at once) need at most ``memory_limit`` bytes.

    The search is a branch and bound over the cuts, stage by stage, whose bounds are the
    simulator's own step with the stages not yet placed taking no time (never more than the
    step of any completion), raised by the work those stages must still do. Its first
    incumbent is the optimum of the formula ``T = (m - 1) v max_s c_s + κ (Σ_s c_s + 2 Σ t)``,
    ``κ = (v + p - 1) / (p v)`` (a dynamic programme over prefixes), polished cut by cut.
    It stops when no open branch can beat the best simulated plan: ``lower_bound`` is then
    the certificate. For GPipe with a backward that is a fixed multiple of the forward the
    formula is the simulated step exactly (the forward phase is a flow shop of ``m``
    identical jobs, makespan ``Σ F_s + Σ t + (m - 1) max F_s``, the backward mirrors it), so
    the programme's optimum is certified by itself. Among plans with the same step time
    (within ``1e-9`` relative) the one with the least sum of squared stage times is kept.
    After ``search_budget`` simulated partial plans the search stops with the best plan found,
    ``optimal=False`` and a ``lower_bound`` below it (the gap is certified). The bounds are
    listed in the module's docstring (``unitscale.stages.planner``).

    Args:
        costs: per-item costs (:class:`~unitscale.stages.ChainCosts`).
        ranks: devices in the pipeline.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        num_microbatches: microbatches per step.
        stages_per_rank: stages per rank (``v``).
        memory_limit: bytes per device, for all its stages (``None``: unlimited).
        device_speeds: relative speed of each rank (default all 1.0).
        search_budget: partial plans the branch and bound may simulate (and ten times as many
            it may bound in closed form) before it stops.

    Returns:
        A :class:`ChainPlan`.

    Raises:
        MemoryLimitError: no split fits ``memory_limit``; the message gives the least limit that works
            (with several stages per rank, where finding the least takes too long: a limit that
            works and the range the least lies in; ``needed`` is a limit that works).
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
    if isinstance(search_budget, bool) or not isinstance(search_budget, int) or search_budget < 0:
        raise InputError(f"search_budget={search_budget!r} must be an int >= 0 (partial plans to simulate)")
    # the formula's programme caps each stage at limit / v: a subset of the plans that fit each rank
    problem = _Problem(costs, ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds)
    search = _Search(costs, ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds)
    seeds: list[list[int]] = []
    probes, certified = 0, None
    try:
        exact = schedule == "gpipe" and _proportional(costs) and costs.action_overhead == 0
        # elsewhere the formula's plan is only the first incumbent: a few dozen programmes do
        # (devices of different speeds can otherwise take hundreds)
        bounds, formula, formula_lower, probes = _formula_plan(problem, None if exact else FORMULA_PROBES)
        seeds.append(bounds)
        if exact:
            certified = formula_lower
            if not problem.comm.any() and len({float(x[-1]) for x in problem.x}) == 1:
                even = _most_even(problem, problem.bottleneck(bounds))
                if even is not None:
                    seeds.append(even)
    except _NoFit:
        if stages_per_rank == 1:
            need, plan = _smallest_memory(problem), None
            least = f"the least limit that works is {need:.4g} bytes"
        else:
            need, plan = _least_rank_memory(search)
            least = f"the least limit that works is {need:.4g} bytes"
            if plan is None:
                # the search for the least gave up: a plan within limit / v per stage fits v times that
                low, need = need, _smallest_memory(problem) * stages_per_rank
                least = f"{need:.4g} bytes works (the least limit that works lies between {low:.4g} and that)"
        if plan is None or memory_limit is None or need > memory_limit:
            raise MemoryLimitError(
                f"no split of {len(costs)} pieces into {k} stages fits memory_limit={memory_limit:.4g} bytes per "
                f"device under {schedule} with {num_microbatches} microbatches; {least} (raise the limit, or "
                "use more ranks, fewer microbatches in flight (1f1b) or fewer bytes per parameter)",
                needed=need,
            ) from None
        seeds.append(plan)
    if certified is None:
        seeds.append(_polish(search, seeds[0]))
    chosen, lower, best, finished = search.run(seeds, search_budget)
    if certified is not None:
        lower, finished = certified, True  # the programme's optimum is the simulator's
    step = simulate_bounds(costs, chosen, schedule, num_microbatches, stages_per_rank, device_speeds).step_time
    return ChainPlan(
        bounds=chosen,
        step_time=step,
        lower_bound=min(lower, step),  # equal up to the rounding of prefix sums against fsum
        bottleneck=max(search.times(chosen)),
        stage_memory=search.stage_memory(chosen),
        probes=probes,
        simulated=search.evaluated,
        optimal=finished,
        rank_memory=search.rank_memory(chosen),
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
        action_overhead=costs.action_overhead,
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
    action_overhead: float = 0.0,
) -> ChainCosts:
    """Per-node :class:`~unitscale.stages.ChainCosts` of a :class:`~unitscale.StagePlan`.

    The plan's node costs are taken as measured on the whole batch of one step, so a
    microbatch's forward time is the node cost times ``seconds_per_cost`` (1 for
    ``cost="time"``; ``1 / FLOP rate`` for ``cost="flops"``) over ``num_microbatches``;
    backward is ``backward`` times the forward, or a callable ``node -> seconds`` per
    microbatch. Parameters take ``bytes_per_param`` each (16 for Adam with fp32 master
    weights); each node keeps its output for the backward; a cut sends the
    tensors that cross it. Activations and traffic are per microbatch (the example batch
    split ``num_microbatches`` ways). ``action_overhead`` is the schedule's own seconds per
    forward or backward of a stage (what ``run_pipeline`` measures as ``stage_costs.action_overhead``).

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
        action_overhead=action_overhead,
    )


def calibrated(costs: ChainCosts, result: Any, costs_at: Callable[[int], ChainCosts]) -> ChainCosts:
    """Per-node ``costs`` scaled, stage by stage, to the durations a pipeline run measured.

    ``result`` is a :class:`~unitscale.stages.PipelineResult` of a plan of the same graph;
    ``costs_at(m)`` gives the uncalibrated costs at that run's microbatch count ``m``. Every
    node of stage ``s`` of that run has its forward scaled by ``measured F_s / predicted F_s``
    (its backward likewise); a stage the costs predict as free takes the ratio of the totals.
    The link, the bookkeeping per action and the weight-gradient share of the backward (measured
    by the zero-bubble schedules, else the default half) become the measured ones.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages import ChainCosts, PipelineResult
    >>> from unitscale.stages.planner import calibrated, chain_costs_for
    >>> plan = partition(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), 2, torch.randn(8, 4), cost="params")
    >>> at = lambda m: chain_costs_for(plan, m, backward=1.0)
    >>> zero = (0.0, 0.0)
    >>> ran = ChainCosts((2.0, 1.0), (6.0, 3.0), zero, zero, (0.0, *zero), latency=0.5, action_overhead=0.25)
    >>> run = PipelineResult(None, torch.tensor(0.0), {}, 1.0, ran, num_microbatches=2, bounds=[0, 1, 2])
    >>> c = calibrated(at(4), run, at)  # each node ran at 2 s and 1 s a microbatch of 2; now 4 microbatches
    >>> c.forward, c.backward, c.latency, c.action_overhead
    ((1.0, 0.5), (3.0, 1.5), 0.5, 0.25)
    """
    measured, bounds = getattr(result, "stage_costs", None), getattr(result, "bounds", None)
    if measured is None or bounds is None:
        raise InputError(
            f"calibration={type(result).__name__} is not a measured pipeline run; pass the PipelineResult that "
            "run_pipeline(plan, ..., loss_fn=..., target=...) returns"
        )
    if bounds[-1] != len(costs) or len(bounds) != len(measured) + 1:
        raise InputError(
            f"calibration ran a plan of {bounds[-1]} nodes in {len(bounds) - 1} stages, but this graph has "
            f"{len(costs)} nodes; calibrate with a run of a plan of the same model and example inputs"
        )
    ran = costs_at(result.num_microbatches)

    def ratios(predicted: Sequence[float], seen: Sequence[float]) -> list[float]:
        sums = [math.fsum(predicted[a:b]) for a, b in itertools.pairwise(bounds)]
        total = math.fsum(sums)
        overall = math.fsum(seen) / total if total > 0 else 1.0
        return [t / p if p > 0 else overall for p, t in zip(sums, seen, strict=True)]

    forward, backward = list(costs.forward), list(costs.backward)
    scales = zip(ratios(ran.forward, measured.forward), ratios(ran.backward, measured.backward), strict=True)
    for s, (rf, rb) in enumerate(scales):
        for i in range(bounds[s], bounds[s + 1]):
            forward[i] *= rf
            backward[i] *= rb
    return replace(
        costs,
        forward=tuple(forward),
        backward=tuple(backward),
        bandwidth=measured.bandwidth,
        latency=measured.latency,
        weight_grad_share=measured.weight_grad_share,
        action_overhead=measured.action_overhead,
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
    backward: float | str | Callable[[fx.Node], float] = 2.0,
    memory_limit: float | None = None,
    bytes_per_param: float = ADAM_BYTES_PER_PARAM,
    bandwidth: float = math.inf,
    latency: float = 0.0,
    device_speeds: Sequence[float] | None = None,
    boundary_depth: int | None = None,
    repeats: int = 5,
    action_overhead: float = 0.0,
    calibration: Any = None,
) -> Any:
    """Split ``module`` for ``schedule`` on ``ranks`` devices with the least step time that fits in memory.

    The model is captured and costed as :func:`~unitscale.partition` does; then
    :func:`~unitscale.stages.plan_chain` picks, over the pieces a cut may fall between, the split
    with the least simulated step time that fits (a branch and bound with a lower-bound
    certificate, exact unless its budget runs out). The plan keeps its costs (``plan.chain_costs``), so
    :func:`~unitscale.stages.simulate` predicts its timeline.

    Args:
        module: the model, or a :class:`~unitscale.StagePlan` of it (``partition(model, 1, x, cost="time")``)
            whose graph, cut places and node costs are reused (``cost`` and ``boundary_depth``
            are then ignored), so that timing the nodes once serves many plans.
        example_inputs: a tensor or tuple, the whole batch of one step (split into microbatches).
        ranks: devices in the pipeline.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        num_microbatches: microbatches per step.
        stages_per_rank: stages per rank (several for the interleaved schedules, 2 for ``"zbv"``).
        cost: node cost as in :func:`~unitscale.partition` (``"time"``: measured seconds).
        seconds_per_cost: seconds per unit of ``cost`` (default 1 for ``"time"``, ``1e-11`` otherwise,
            about 100 GFLOP/s for ``"flops"``).
        backward: backward time as a multiple of the forward, ``"time"`` (each node's backward
            timed alone on the example batch, ``unitscale.stages.costs.backward_times``; with
            ``cost="time"`` scaled by ``seconds_per_cost`` as the forward's timings are), or a
            callable ``node -> seconds`` per microbatch.
        memory_limit: bytes per device (all its stages together), or ``None``.
        bytes_per_param: bytes per parameter for weights, gradients and optimiser state.
        bandwidth: bytes per second between ranks (``math.inf``: free).
        latency: seconds per message between ranks.
        device_speeds: relative speed of each rank.
        boundary_depth: cut only between modules at this depth (as in :func:`~unitscale.partition`).
        repeats: timings per node for ``cost="time"`` and ``backward="time"``.
        action_overhead: seconds the schedule itself spends per forward or backward of a stage
            (posting messages, the loss); ``run_pipeline`` measures it.
        calibration: a :class:`~unitscale.stages.PipelineResult` of an earlier run of a plan of
            the same graph (``run_pipeline`` with ``loss_fn``). Each node's forward and backward
            time is scaled by what the workers measured for the stage it ran in over what these
            costs predict for it, and the link (``bandwidth``, ``latency``) and
            ``action_overhead`` become the measured ones: a plan made from the pipeline's own
            durations, as on the cluster it will run on.

    Returns:
        The :class:`~unitscale.StagePlan` with ``ranks * stages_per_rank`` stages, carrying the
        certificate: ``schedule``, the simulated ``step_time`` (seconds), a ``lower_bound`` on
        every split that fits, and ``optimal`` (whether the search proved ``step_time`` the least).

    Raises:
        MemoryLimitError: no split fits; the message says the least ``memory_limit`` that works.
        CostError: ``bandwidth <= 0``, a negative latency or ``action_overhead``, or a bad cost model.
        StageCountError: more stages than places to cut.
        InputError: a microbatch count ``schedule`` cannot run (the message lists ones that can),
            or a ``calibration`` that is not a measured run of this graph.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.stages.planner import plan_pipeline
    >>> model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    >>> plan = plan_pipeline(model, torch.randn(4, 8), 2, schedule="gpipe", num_microbatches=2, cost="params")
    >>> plan.stage_costs
    [216.0, 216.0]
    >>> plan.optimal, plan.step_time == plan.lower_bound  # the search's certificate
    (True, True)
    """
    from unitscale.stages.launch import check_schedule as check_runnable
    from unitscale.stages.plan import StagePlan, partition

    check_schedule(schedule, ranks, stages_per_rank, num_microbatches)
    # the plan is made to run: what torch's schedule refuses (1F1B with fewer microbatches than
    # stages), say now rather than in the workers
    check_runnable(schedule, ranks * stages_per_rank, stages_per_rank, num_microbatches)
    check_link(bandwidth, latency)
    if isinstance(module, StagePlan):
        base = module  # its graph and node costs, measured once, serve every schedule
    else:
        base = partition(module, 1, example_inputs, cost, boundary_depth=boundary_depth, repeats=repeats)
    scale = seconds_per_cost if seconds_per_cost is not None else (1.0 if base.cost == "time" else 1e-11)
    timed: dict[fx.Node, float] | None = None
    if isinstance(backward, str):
        if backward != "time":
            raise CostError(
                f'backward={backward!r} is not a backward model; use a ratio to the forward, "time" or a '
                "callable node -> seconds"
            )
        from unitscale.stages.costs import backward_times

        timed = dict(zip(base._compute_nodes(), backward_times(base, example_inputs, repeats), strict=True))

    def costs_at(microbatches: int) -> ChainCosts:
        per_node: Any = backward
        if timed is not None:  # measured on the whole batch, as the forward: a microbatch is 1/m of it
            # seconds, corrected as the forward's timings are when the forward is timed too
            seconds = scale if base.cost == "time" else 1.0
            per_node = lambda node: timed[node] * seconds / microbatches  # noqa: E731
        return chain_costs_for(
            base,
            microbatches,
            seconds_per_cost=scale,
            backward=per_node,
            bytes_per_param=bytes_per_param,
            bandwidth=bandwidth,
            latency=latency,
            action_overhead=action_overhead,
        )

    costs = costs_at(num_microbatches)
    if calibration is not None:
        costs = calibrated(costs, calibration, costs_at)
    pieces = base.pieces
    found = plan_chain(
        _units(costs, pieces), ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds
    )
    plan = base.with_bounds([pieces[b] for b in found.bounds])
    plan.chain_costs = costs
    plan.schedule, plan.step_time, plan.lower_bound, plan.optimal = (
        schedule,
        found.step_time,
        found.lower_bound,
        found.optimal,
    )
    return plan
