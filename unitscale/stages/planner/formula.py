"""The step-time formula and its dynamic programmes: the planner's first incumbent, and GPipe's certificate.

With stage times ``c_s = (F_s + B_s) / speed`` and cut times ``t``, the formula is
``T = (m - 1) v max_s c_s + κ (Σ_s c_s + 2 Σ t)``, ``κ = (v + p - 1) / (p v)``. For GPipe with a
backward that is a fixed multiple of the forward it *is* the simulated step (the forward phase
is a flow shop of ``m`` identical jobs; the backward mirrors it).

>>> from unitscale.stages.planner.chain_arrays import ChainArrays
>>> from unitscale.stages.planner.formula import Problem, formula_plan
>>> from unitscale.stages.schedules import ChainCosts
>>> costs = ChainCosts.uniform([1.0] * 4)  # forward 1, backward 2 each
>>> problem = Problem(ChainArrays(costs, 2, "gpipe", 4, 1, None, None))
>>> formula_plan(problem)[:2]  # (m+p-1) * 6
([0, 2, 4], 30.0)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from unitscale.stages.partitioner import search
from unitscale.stages.planner.chain_arrays import ChainArrays, prefix_sums

__all__ = ["FORMULA_PROBES", "NoFit", "Problem", "formula_plan", "most_even", "smallest_memory"]

#: dynamic programmes for the formula's plan where it is only the first incumbent (not GPipe's certificate)
FORMULA_PROBES = 40


class Problem:
    """The formula's view of one planning problem (:class:`ChainArrays`): each stage's time
    prefix on its rank, its share of the rank's memory limit, and the formula's weights."""

    def __init__(self, arrays: ChainArrays) -> None:
        a = self.arrays = arrays
        self.n, self.k = a.n, a.k
        # each item's f + b, then summed (not a.pw = pf + pb, which can round differently)
        items = np.asarray(a.costs.forward, dtype=np.float64) + np.asarray(a.costs.backward, dtype=np.float64)
        work = prefix_sums(items)
        #: x[s][i] - x[s][j]: time of stage s over items j:i on its rank
        self.x = [work / a.speed[s] for s in range(self.k)]
        #: q[s][b] - q[s][a]: bytes of stage s over items a:b (:class:`ChainArrays`)
        self.q, self.comm = a.q, a.comm
        #: bytes per stage: the rank's limit shared by its v stages
        self.limit = math.inf if a.memory_limit is None else a.memory_limit / a.v
        self.kappa = (a.v + a.p - 1) / (a.p * a.v)
        self.weight = (a.m - 1) * a.v
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
            raise NoFit
        return _least_float(self.feasible, hi)

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
            best, arg = range_min(val, lo, hi)
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


class NoFit(Exception):
    """No plan fits the memory limit (the caller says what limit would)."""


def range_min(val: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    level = np.minimum(np.floor(np.log2(np.where(empty, 1, length))).astype(np.int64), len(table) - 1)
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


def most_even(problem: Problem, cap: float) -> list[int] | None:
    """Among plans with every stage ``<= cap`` and in memory, one with the least sum of squared
    stage times (``None`` when that programme exceeds ``search.BALANCE_BUDGET``)."""
    starts = [problem.starts(s, cap, False).tolist() for s in range(problem.k)]
    return search.least_squares_bounds(problem.x[0].tolist(), problem.k, starts)


def smallest_memory(problem: Problem) -> float:
    """The least per-stage memory limit some plan meets (bisection over the float line)."""
    saved = problem.limit

    def fits(limit: float) -> bool:
        problem.limit = limit
        return problem.feasible(math.inf)

    try:
        return _least_float(fits, max(float(q[-1]) for q in problem.q))
    finally:
        problem.limit = saved


def _least_float(holds: Callable[[float], bool], top: float) -> float:
    """The least float in ``[0, top]`` where ``holds`` (false below a point, true on) holds; bisects the bits."""
    lo_bits, hi_bits = -1, int(np.float64(top).view(np.int64))
    while hi_bits - lo_bits > 1:
        mid = (lo_bits + hi_bits) // 2
        if holds(float(np.int64(mid).view(np.float64))):
            hi_bits = mid
        else:
            lo_bits = mid
    return float(np.int64(hi_bits).view(np.float64))


def formula_plan(problem: Problem, max_probes: int | None = None) -> tuple[list[int], float, float, int]:
    """The plan minimising the step-time formula ``(m - 1) v max c_s + κ A`` (walking down the
    bottleneck caps, each with its least ``A``: :meth:`Problem.cheapest`), that minimum,
    a lower bound certifying it, and the programmes run (raises ``NoFit``). With
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
