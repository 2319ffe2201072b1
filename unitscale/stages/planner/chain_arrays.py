"""The arrays of one planning problem (:class:`ChainArrays`), computed once per plan for the
formula's programmes and the search, which both read them.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from unitscale.stages.schedules import ChainCosts, in_flight, stage_ranks

__all__ = ["ChainArrays", "prefix_sums"]


def prefix_sums(values: Sequence[float] | np.ndarray) -> np.ndarray:
    """``[0, v0, v0 + v1, ...]`` in float64: ``out[b] - out[a]`` is the sum of ``values[a:b]``.

    >>> from unitscale.stages.planner.chain_arrays import prefix_sums
    >>> prefix_sums([1.0, 2.0, 3.0]).tolist()
    [0.0, 1.0, 3.0, 6.0]
    """
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))


class ChainArrays:
    """Prefix arrays of one planning problem: ``costs`` split into ``ranks * stages_per_rank``
    stages under ``schedule`` with ``num_microbatches``, on devices of ``device_speeds``.

    Attributes:
        costs, schedule, memory_limit: as given (``memory_limit``: bytes per rank, or ``None``).
        n, p, v, m, k: items, ranks, stages per rank, microbatches, stages (``p * v``).
        placement: the rank of each stage.
        rank_speed, speed: the speed of each rank, and of each stage's rank.
        pf, pb, pw: prefix sums of the items' forward and backward time, and ``pf + pb``.
        pp, pa: prefix sums of the items' parameter and activation bytes.
        held: the microbatches each stage holds in flight at its peak.
        q: ``q[s][b] - q[s][a]``, the bytes of stage ``s`` over items ``a:b``.
        comm: the message time of a cut before each item (``costs.comm_time``).

    >>> from unitscale.stages.planner.chain_arrays import ChainArrays
    >>> from unitscale.stages.schedules import ChainCosts
    >>> costs = ChainCosts.uniform([1.0] * 4, param_bytes=10.0, activation_bytes=1.0)
    >>> a = ChainArrays(costs, 2, "1f1b", 4, 1, None, [1.0, 2.0])
    >>> a.held.tolist(), a.speed.tolist()  # stage 0 keeps 2 microbatches, stage 1 one
    ([2.0, 1.0], [1.0, 2.0])
    >>> a.stage_memory([0, 1, 4])  # 10 + 2 * 1, then 3 * (10 + 1 * 1)
    [12.0, 33.0]
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
        self.costs, self.schedule, self.memory_limit = costs, schedule, memory_limit
        self.n, self.p, self.v, self.m = len(costs), ranks, stages_per_rank, num_microbatches
        self.k = ranks * stages_per_rank
        self.placement = stage_ranks(schedule, ranks, stages_per_rank)
        speeds = [1.0] * ranks if device_speeds is None else [float(s) for s in device_speeds]
        self.rank_speed = np.asarray(speeds)
        self.speed = np.asarray([speeds[r] for r in self.placement])
        self.pf, self.pb = prefix_sums(costs.forward), prefix_sums(costs.backward)
        self.pw = self.pf + self.pb
        self.pp, self.pa = prefix_sums(costs.param_bytes), prefix_sums(costs.activation_bytes)
        self.held = np.asarray(in_flight(schedule, ranks, stages_per_rank, num_microbatches), dtype=np.float64)
        self.q = [self.pp + self.held[s] * self.pa for s in range(self.k)]
        self.comm = np.array([costs.comm_time(j) for j in range(self.n + 1)], dtype=np.float64)

    def stage_memory(self, bounds: Sequence[int]) -> list[float]:
        """The bytes each stage of the plan ``bounds`` holds at its peak (see :attr:`q`)."""
        return [float(self.q[s][b] - self.q[s][a]) for s, (a, b) in enumerate(itertools.pairwise(bounds))]
