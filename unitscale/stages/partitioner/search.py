"""Contiguous min-max partitioning of a sequence of costs, exact and heuristic.

A partition of ``n`` costs into ``k`` stages is given by its ``k + 1`` *bounds* ``[0, b1, ..., n]``:
stage ``s`` holds items ``bounds[s]:bounds[s + 1]``. Stage sums are always differences of one
prefix-sum array, so the exact search and every check compare the same floating-point numbers.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

__all__ = [
    "optimal_bounds",
    "balanced_bounds",
    "least_squares_bounds",
    "sum_of_squares",
    "bottleneck",
    "stage_sums",
    "equal_count_bounds",
    "greedy_threshold_bounds",
]


def _prefix(costs: Sequence[float], k: int | None = None) -> list[float]:
    """Prefix sums of ``costs``; with ``k``, refused unless ``1 <= k <= len(costs)``."""
    if k is not None and not 1 <= k <= len(costs):
        raise ValueError(f"k={k} must be between 1 and len(costs)={len(costs)}")
    return [0.0, *itertools.accumulate(float(c) for c in costs)]


def stage_sums(costs: Sequence[float], bounds: Sequence[int]) -> list[float]:
    """Sum of the costs in each stage (computed from prefix sums).

    >>> stage_sums([1, 2, 3], [0, 1, 3])
    [1.0, 5.0]
    """
    prefix = _prefix(costs)
    return [prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds)]


def bottleneck(costs: Sequence[float], bounds: Sequence[int]) -> float:
    """The largest stage sum of the partition ``bounds``.

    >>> bottleneck([4, 1, 1], [0, 1, 3])
    4.0
    """
    return max(stage_sums(costs, bounds))


def _greedy(prefix: list[float], k: int, limit: float) -> tuple[list[int] | None, float]:
    """Greedy probe filling each stage up to ``limit``: ``(bounds or None, next_limit)``, where every limit
    below ``next_limit`` gives the same run (so is infeasible too when ``limit`` is)."""
    n = len(prefix) - 1
    bounds = [0]
    next_limit = math.inf
    start = 0
    for _ in range(k):
        base = prefix[start]

        def since_start(p: float, base: float = base) -> float:
            return p - base

        end = bisect.bisect_right(prefix, limit, lo=start, key=since_start) - 1
        if end < n:
            next_limit = min(next_limit, prefix[end + 1] - base)
        if end == start:  # not even one item fits
            return None, next_limit
        bounds.append(end)
        start = end
        if start == n:
            return bounds, next_limit
    return None, next_limit


def _fill_to(prefix: list[float], bounds: list[int], k: int) -> list[int]:
    """Split the costliest stages (at their balance point) until there are exactly ``k``; the bottleneck stays."""
    bounds = list(bounds)
    while len(bounds) < k + 1:
        splittable = [s for s in range(len(bounds) - 1) if bounds[s + 1] - bounds[s] > 1]
        s = max(splittable, key=lambda s: prefix[bounds[s + 1]] - prefix[bounds[s]])
        a, b = bounds[s], bounds[s + 1]
        half = prefix[a] + (prefix[b] - prefix[a]) / 2
        mid = min(max(bisect.bisect_left(prefix, half, lo=a + 1, hi=b), a + 1), b - 1)
        # the better of the two cuts around the middle
        if mid - 1 > a and max(prefix[mid - 1] - prefix[a], prefix[b] - prefix[mid - 1]) < max(
            prefix[mid] - prefix[a], prefix[b] - prefix[mid]
        ):
            mid -= 1
        bounds.insert(s + 1, mid)
    return bounds


def optimal_bounds(costs: Sequence[float], k: int) -> list[int]:
    """Exact min-max contiguous partition of ``costs`` into exactly ``k`` non-empty stages.

    Args:
        costs: non-negative cost per item, in order.
        k: number of stages, ``1 <= k <= len(costs)``.

    >>> optimal_bounds([5, 1, 1, 1, 1, 1], 2)
    [0, 1, 6]
    """
    # bisection on the bottleneck; an infeasible probe lifts ``lo`` to the next reachable stage sum
    prefix = _prefix(costs, k)
    n = len(costs)
    # a hair under total / k: a true lower bound despite rounding in the prefix sums
    lo = prefix[n] / k * (1 - 1e-9)
    best = [0, n]
    hi = prefix[n]
    while lo < hi:
        mid = lo + (hi - lo) / 2
        if not lo <= mid < hi:
            mid = lo
        bounds, next_limit = _greedy(prefix, k, mid)
        if bounds is None:
            lo = next_limit
        else:
            best = bounds
            hi = max(prefix[b] - prefix[a] for a, b in itertools.pairwise(bounds))
    return _fill_to(prefix, best, k)


def sum_of_squares(costs: Sequence[float], bounds: Sequence[int]) -> float:
    """Sum of squared stage sums: for a fixed total, smaller is more balanced.

    >>> sum_of_squares([1, 2, 3], [0, 2, 3])
    18.0
    """
    return sum(c * c for c in stage_sums(costs, bounds))


#: ``balanced_bounds`` is a quadratic dynamic programme; above this many steps it is skipped.
BALANCE_BUDGET = 4_000_000


def least_squares_bounds(
    prefix: Sequence[float], k: int, starts: Sequence[Sequence[int]], limit: float | None = None
) -> list[int] | None:
    """Among partitions into ``k`` non-empty stages where stage ``s`` ending at item ``i`` starts at
    ``starts[s][i]`` or later (and, with ``limit``, sums to at most ``limit``), the one with the
    least sum of squared stage sums; ``None`` when there is none or the programme would take more
    than :data:`BALANCE_BUDGET` steps. ``prefix[i]`` is the sum of the first ``i`` items.

    >>> from unitscale.stages.partitioner.search import least_squares_bounds
    >>> least_squares_bounds([0, 5, 5, 6, 7, 8, 9, 10, 11], 4, [[0] * 9] * 4, limit=5)
    [0, 1, 4, 6, 8]
    """
    n = len(prefix) - 1
    if sum(i - lo[i] for lo in starts for i in range(n + 1) if lo[i] < i) > BALANCE_BUDGET:
        return None
    inf = math.inf
    best = [0.0] + [inf] * n
    args: list[list[int]] = []
    for s in range(k):
        lo = starts[s]
        new, arg = [inf] * (n + 1), [0] * (n + 1)
        for i in range(s + 1, n - (k - 1 - s) + 1):
            for j in range(max(lo[i], s), i):
                if best[j] == inf:
                    continue
                w = prefix[i] - prefix[j]
                if limit is not None and w > limit:
                    continue
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


def balanced_bounds(costs: Sequence[float], k: int, limit: float | None = None) -> list[int] | None:
    """The most balanced partition among those whose bottleneck is at most ``limit`` (default: the optimum).

    Balanced means the least sum of squared stage sums; ``None`` when the programme would be too large.

    Args:
        costs: non-negative cost per item, in order.
        k: number of non-empty stages, ``1 <= k <= len(costs)``.

    >>> balanced_bounds([5, 0, 1, 1, 1, 1, 1, 1], 4)
    [0, 1, 4, 6, 8]
    """
    prefix = _prefix(costs, k)
    n = len(costs)
    if limit is None:
        limit = bottleneck(costs, optimal_bounds(costs, k))
    # one item early: bisect's subtraction may round; the programme tests the very differences
    first_fit = [max(bisect.bisect_left(prefix, prefix[i] - limit, hi=i) - 1, 0) for i in range(n + 1)]
    return least_squares_bounds(prefix, k, [first_fit] * k, limit)


def equal_count_bounds(n: int, k: int) -> list[int]:
    """Megatron-style split: the same number of items per stage (earlier stages get the remainder).

    >>> equal_count_bounds(7, 3)
    [0, 3, 5, 7]
    """
    q, r = divmod(n, k)
    return [s * q + min(s, r) for s in range(k + 1)]


def greedy_threshold_bounds(costs: Sequence[float], k: int) -> list[int]:
    """Greedy size-threshold split: close a stage once it reaches ``total / k`` (always ``k`` non-empty stages).

    >>> greedy_threshold_bounds([1, 2, 4, 1, 2], 3)  # sums 7, 1, 2; optimum 3, 4, 3
    [0, 3, 4, 5]
    """
    n = len(costs)
    threshold = sum(float(c) for c in costs) / k
    bounds = [0]
    acc = 0.0
    for i, c in enumerate(costs):
        acc += float(c)
        stages_left = k - len(bounds)  # stages still to open after the current one
        if stages_left == 0:
            break
        if acc >= threshold or n - (i + 1) == stages_left:
            bounds.append(i + 1)
            acc = 0.0
    bounds.append(n)
    return bounds
