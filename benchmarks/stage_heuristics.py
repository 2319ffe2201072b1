"""Two more contiguous split rules that ``bench_stages.py`` compares the exact search against (the
library offers only equal counts and a greedy threshold as baselines): a torchgpipe-style local
search and a max-min dynamic programme.

>>> from stage_heuristics import block_partition_bounds, max_min_bounds
>>> block_partition_bounds([1, 1, 1, 1, 4], 2), max_min_bounds([3, 1, 1, 3], 2)
([0, 4, 5], [0, 2, 4])
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from unitscale.stages.partitioner.search import equal_count_bounds

__all__ = ["block_partition_bounds", "max_min_bounds"]


def _prefix(costs: Sequence[float]) -> list[float]:
    return [0.0, *itertools.accumulate(float(c) for c in costs)]


def block_partition_bounds(costs: Sequence[float], k: int) -> list[int]:
    """Local search in the style of torchgpipe's block partition.

    Start from equal item counts and move one item at a time off the heaviest
    stage onto a neighbour while that lowers the heavier of the two; stop when no
    move helps. Fast and usually close to optimal, but it can get stuck.

    """
    n = len(costs)
    prefix = _prefix(costs)
    bounds = equal_count_bounds(n, k)

    def s(i: int) -> float:
        return prefix[bounds[i + 1]] - prefix[bounds[i]]

    for _ in range(4 * n * k):
        heavy = max(range(k), key=s)
        moved = False
        for nb in (heavy - 1, heavy + 1):
            if not 0 <= nb < k:
                continue
            cut = heavy if nb < heavy else heavy + 1
            step = 1 if nb < heavy else -1
            new = bounds[cut] + step
            if not bounds[cut - 1] < new < bounds[cut + 1]:
                continue
            before = max(s(heavy), s(nb))
            bounds[cut] = new
            if max(s(heavy), s(nb)) < before:
                moved = True
                break
            bounds[cut] = new - step
        if not moved:
            break
    return bounds


def max_min_bounds(costs: Sequence[float], k: int) -> list[int]:
    """Maximise the *smallest* stage sum by dynamic programming (``O(n^2 k)``, small ``n`` only).

    A common stand-in for balance; it is not the same objective as the bottleneck.

    """
    n = len(costs)
    prefix = _prefix(costs)
    neg = -math.inf
    # best[j][i]: best smallest stage over the first i items in j stages
    best = [[neg] * (n + 1) for _ in range(k + 1)]
    arg = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = math.inf
    for j in range(1, k + 1):
        for i in range(j, n + 1):
            for m in range(j - 1, i):
                v = min(best[j - 1][m], prefix[i] - prefix[m])
                if v > best[j][i]:
                    best[j][i], arg[j][i] = v, m
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(arg[j][bounds[-1]])
    return bounds[::-1]
