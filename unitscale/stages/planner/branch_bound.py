"""Branch and bound over the cuts of a chain, judged by the simulator itself (:class:`Search`).

Best first, the search expands the partial plan of least lower bound and stops when that bound
exceeds the best simulated plan, which certifies it optimal. The bounds for several stages per
rank are weaker, so large interleaved problems can spend the budget and stop with a certified
gap (``benchmarks/bench_stages.py`` measures it); :func:`descend` then improves the plan held.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

from unitscale.stages.planner.chain_arrays import ChainArrays
from unitscale.stages.planner.formula import NoFit
from unitscale.stages.planner.simulation import step_times
from unitscale.stages.schedules import schedule_order

__all__ = ["SEARCH_BUDGET", "TIE", "Search", "descend", "least_rank_memory", "polish"]

#: relative tolerance within which two simulated step times count as equal (ties go to the most even plan)
TIE = 1e-9
#: plans whose bound the search evaluates before it stops with a certified gap (``ChainPlan.optimal`` False)
SEARCH_BUDGET = 50_000


class Search:
    """Branch and bound over the cuts: a node fixes stages ``0..j-1``, its children stage ``j``.

    A partial plan's bound is the larger of the simulated step with the stages not yet placed
    taking no time and the closed-form bounds of :meth:`_rank_terms`, :meth:`_later_share` and
    :meth:`_water_level`; with one stage per rank :meth:`narrow` also confines each cut to a window
    (where a memory limit enters the pruning).
    """

    def __init__(self, arrays: ChainArrays) -> None:
        a = self.arrays = arrays
        self.costs, self.schedule = a.costs, a.schedule
        self.n, self.p, self.v, self.m, self.k = a.n, a.p, a.v, a.m, a.k
        self.placement, self.rank_speed, self.speed = a.placement, a.rank_speed, a.speed
        self.pf, self.pb, self.pw = a.pf, a.pb, a.pw
        self.pp, self.pa, self.held, self.q, self.comm = a.pp, a.pa, a.held, a.q, a.comm
        #: the schedule's bookkeeping, added to every forward and backward of every stage (not scaled by speed)
        self.overhead = float(a.costs.action_overhead)
        #: what each stage not yet placed adds at least: two actions' bookkeeping at the slowest speed
        self.unplaced_overhead = 2 * self.overhead * float(np.min(self.speed))
        #: bytes per rank (``inf``: no limit); :func:`least_rank_memory` lifts it for a while
        self.limit = math.inf if a.memory_limit is None else float(a.memory_limit)
        orders = schedule_order(a.schedule, a.p, a.v, a.m)
        # orders of whole forwards and backwards, one stage per rank, give a sharper water level: see _bound_rows
        self.chain = a.v == 1 and all(op.kind in ("F", "B") for o in orders for op in o)
        #: per rank, the forwards before its first backward and the backwards after its last forward
        self.warmup = [next((i for i, op in enumerate(o) if op.kind != "F"), len(o)) for o in orders]
        self.cooldown = [next((i for i, op in enumerate(reversed(o)) if op.kind == "F"), len(o)) for o in orders]
        #: per rank, the stage of its first op (a forward) and the kind and stage of its last
        self.first_stage = [o[0].stage for o in orders]
        self.last_op = [(o[-1].kind, o[-1].stage) for o in orders]
        #: crossing[c]: 1 where the cut before stage c joins two ranks (a message), else 0
        self.crossing = np.array(
            [0.0] + [float(self.placement[c - 1] != self.placement[c]) for c in range(1, self.k)] + [1.0]
        )
        self.fits_after = self._fits_after()
        self._shares: dict[int, float] = {}
        #: per cut, its window, and per stage the furthest end from each start (:meth:`narrow`)
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

        Two of :meth:`_rank_terms`'s bounds tie each stage's time ``c_s`` to the time
        ``x_s = Σ_{s'<s} c_s'`` before it (``t``: the least message time): ``x_s + m c_s + 2 s t``
        and, under 1F1B with ``m > w = p - s``, ``x_s + (m - w + 1) c_s + 2 (X - x_{s+1}) + 2 (k - 1) t``
        (GPipe: ``x_s + m c_s + X - x_{s+1} + 2 (k - 1) t``). These and the memory cap bound cut
        ``s + 1`` by cut ``s`` (:meth:`_reach`); sweeps forward and backward until nothing moves
        give the windows.
        """
        if not self.chain or self.schedule not in ("gpipe", "1f1b"):
            return True
        n, k, m = self.n, self.k, self.m
        # a margin above the tie tolerance: prefix sums and the simulator round differently
        top = target * (1 + 2 * TIE) + 1e-12 * abs(target)
        least_t = float(np.min(self.comm[1:n])) if n > 1 else 0.0
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
            reach = self._reach(top, terms, *self._least_outside(lo, hi))
            if not self._sweep(lo, hi, reach):
                self.window = None  # cannot happen with a plan at ``target``; search unconfined
                return False
            self.window = (lo, hi, reach)
            if (lo, hi) == outer:
                break
        return True

    def _least_outside(self, lo: list[int], hi: list[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The least time before cut ``s`` (stages ``0..s-1``) and after it (stages ``s..k-1``), for
        each position of the cut, with every cut inside its window ``lo..hi``."""
        n, k, inf, work = self.n, self.k, math.inf, self.pw
        speed = [float(u) for u in self.speed]
        idx = np.arange(n + 1)
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
        return before, after

    def _reach(
        self,
        top: float,
        terms: list[list[tuple[int, float, float]]],
        before: list[np.ndarray],
        after: list[np.ndarray],
    ) -> list[np.ndarray]:
        """Per stage ``s``, the furthest cut ``s + 1`` may reach from each cut ``s`` under the
        bounds ``terms`` and the memory cap (made never to fall: the furthest of any earlier start)."""
        n, inf, work = self.n, math.inf, self.pw
        reach: list[np.ndarray] = []
        for s in range(self.k):
            speed = float(self.speed[s])
            furthest = np.full(n + 1, n, dtype=np.int64)
            for a, factor, constant in terms[s]:
                r = a / speed
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
            reach.append(np.maximum.accumulate(furthest))
        return reach

    def _sweep(self, lo: list[int], hi: list[int], reach: list[np.ndarray]) -> bool:
        """Tighten the windows ``lo..hi`` in place, forward by ``reach`` and backward by least
        start, until nothing moves; ``False`` when a window empties."""
        k = self.k
        for _ in range(2 * k + 2):
            inner = (list(lo), list(hi))
            for s in range(k):
                hi[s + 1] = min(hi[s + 1], int(reach[s][hi[s]]))
                lo[s + 1] = max(lo[s + 1], lo[s] + 1)
            for s in range(k - 1, -1, -1):
                lo[s] = max(lo[s], int(np.searchsorted(reach[s], lo[s + 1], side="left")))
                hi[s] = min(hi[s], hi[s + 1] - 1)
            if any(a > b for a, b in zip(lo, hi, strict=True)):
                return False
            if (lo, hi) == inner:
                break
        return True

    def rank_memory(self, bounds: Sequence[int]) -> list[float]:
        total = [0.0] * self.p
        for s, q in enumerate(self.arrays.stage_memory(bounds)):
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

        Stage ``s`` starts after microbatch 0's forward reaches it and its last backward is
        followed by the backward of every stage before; its ``w`` forwards before its first
        backward and ``c`` backwards after its last forward each wait for a round trip ``R``
        through the later stages (the stages not yet placed counted by their work alone).
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
            w = np.asarray(self.warmup[: j + 1])[None, :]
            c = np.asarray(self.cooldown[: j + 1])[None, :]
            steady = np.maximum(w * f, f + trip) + (m - w) * f + (m - c) * b + np.maximum(c * b, trip + b)
            drained = np.maximum(np.maximum(m * f, f + trip) + m * b, m * f + trip + b)
            own = np.where(m > w, steady, drained)
        return np.max(head + own + tail, axis=1)

    def _later_share(self, j: int) -> float:
        """One stage per rank, stages ``0..j`` placed: ``κ`` with every completion's step at least
        the fill plus ``κ X`` (``X``: the time of the stages left, ``Σ_{s>j} c_s``).

        Rank ``s > j`` takes at least ``Σ_{j<s'<s} c_s' + m c_s`` after the fill, and under 1F1B
        also ``Σ_{j<s'<s} c_s' + (m - w + 1) c_s + 2 Σ_{s'>s} c_s'`` (GPipe: ``m c_s + Σ_{s'>s} c_s'``).
        ``κ``, the least over splits of ``X = 1`` of the largest of these, is a matrix game's value;
        multiplicative weights find a mixture of bounds whose own guarantee is returned, a valid
        bound however far the rounds got.
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
                # the bound below adds whole stage times, so it needs as many backwards after the
                # last forward as forwards before the first backward (1F1B's order); else it is left out
                w = self.warmup[s]
                if m > w and self.cooldown[s] == w:
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

        Rank ``r`` is busy for a base ``H_r + m Σ(placed c on r) + D_r`` (fill, its placed work,
        drain) plus its share of the rest: the step is at least the water level ``τ`` with
        ``Σ_r speed_r (τ - base_r)^+ = m X``.
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
            raise NoFit
        lower = min(best_t, floor, heap[0][0] if heap and not finished else math.inf)
        chosen = min((q, plan) for t, q, plan in leaves if t <= best_t * (1 + TIE))[1]
        return list(chosen), lower, best_t, finished


def polish(search: Search, bounds: list[int], rounds: int = 2, window: int = 64) -> list[int]:
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


def descend(
    search: Search, starts: Sequence[Sequence[int]], rounds: int = 40, window: int = 64
) -> tuple[list[int], int]:
    """The best plan a local search reaches from any of ``starts`` (each must fit), and the index of
    the start it came from; ties (within :data:`TIE`) go to the least sum of squared stage times.

    A neighbour moves one cut (within ``window`` items), or shifts a run of consecutive cuts by one
    or two items together: on equal layers with one heavy end, the better plan often differs by
    every cut moving one layer, which no single move on the way improves.
    """
    k, n = search.k, search.n
    best_plan: list[int] | None = None
    best_key, best_start = (math.inf, math.inf), 0
    moves = [(i, j, d) for i in range(1, k) for j in range(i, k) for d in (-2, -1, 1, 2)]
    for index, start in enumerate(starts):
        bounds = list(start)
        t = float(search.evaluate([bounds])[0])
        for _ in range(rounds):
            plans: list[list[int]] = []
            for c in range(1, k):
                lo, hi = max(bounds[c - 1] + 1, bounds[c] - window), min(bounds[c + 1] - 1, bounds[c] + window)
                plans += [bounds[:c] + [b] + bounds[c + 1 :] for b in range(lo, hi + 1) if b != bounds[c]]
            for i, j, d in moves:
                if bounds[i] + d <= bounds[i - 1] or bounds[j] + d >= bounds[j + 1]:
                    continue
                plans.append(bounds[:i] + [b + d for b in bounds[i : j + 1]] + bounds[j + 1 :])
            if search.limit < math.inf:
                plans = [q for q in plans if search.fits(q)]
            if not plans:
                break
            times = search.evaluate(plans)
            i = int(np.argmin(times))
            if not times[i] < t * (1 - TIE):
                break
            t, bounds = float(times[i]), plans[i]
        key = (t, sum(x * x for x in search.times(bounds)))
        if best_plan is None or t < best_key[0] * (1 - TIE) or (t <= best_key[0] * (1 + TIE) and key[1] < best_key[1]):
            best_plan, best_key, best_start = bounds, key, index
    assert best_plan is not None and len(best_plan) == k + 1 and best_plan[-1] == n
    return best_plan, best_start


def least_rank_memory(search: Search, budget: int = 500) -> tuple[float, list[int] | None]:
    """The least per-rank memory any plan needs, and such a plan; or, past ``budget`` partial
    plans, a lower bound on it and ``None``.

    Best first: a partial plan's priority (its worst rank, or the average the later ranks must
    share of what is left, if larger) bounds every completion, so the first complete plan popped
    is optimal.
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
