"""Exact pipeline planning for a schedule: the split with the least simulated step time that fits in memory.

:func:`plan_chain` seeds a branch and bound (:mod:`unitscale.stages.planner.branch_bound`) with the
optimum of a step-time formula (:mod:`unitscale.stages.planner.formula`) and the rules of
:func:`rule_splits`, so its plan is never worse than a rule's; :func:`plan_pipeline` plans a model
as a chain of pieces (:mod:`unitscale.stages.planner.model_costs`).

>>> from unitscale.stages.planner import plan_chain
>>> from unitscale.stages.schedules import ChainCosts
>>> costs = ChainCosts.uniform([4, 1, 1, 1, 1, 1, 1, 1, 1], backward_ratio=2.0)
>>> found = plan_chain(costs, ranks=2, schedule="1f1b", num_microbatches=4)
>>> found.bounds, found.step_time == found.lower_bound, found.optimal
([0, 3, 9], True, True)
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import fx, nn

from unitscale.errors import CostError, InputError, MemoryLimitError, StageCountError
from unitscale.stages.partitioner.costs import backward_times
from unitscale.stages.partitioner.plan import StagePlan, partition
from unitscale.stages.partitioner.search import balanced_bounds, equal_count_bounds, optimal_bounds
from unitscale.stages.planner.branch_bound import SEARCH_BUDGET, TIE, Search, descend, least_rank_memory, polish
from unitscale.stages.planner.chain_arrays import ChainArrays
from unitscale.stages.planner.formula import FORMULA_PROBES, NoFit, Problem, formula_plan, most_even, smallest_memory
from unitscale.stages.planner.model_costs import calibrated, chain_costs_for, piece_costs
from unitscale.stages.planner.simulation import _speeds, simulate_bounds
from unitscale.stages.schedules import ADAM_BYTES_PER_PARAM, ChainCosts, check_link, check_schedule

__all__ = ["ChainPlan", "plan_chain", "plan_pipeline", "rule_splits"]


@dataclass(frozen=True)
class ChainPlan:
    """The result of :func:`~unitscale.stages.planner.plan_chain`.

    Attributes:
        bounds: stage ``s`` holds items ``bounds[s]:bounds[s + 1]``.
        step_time: the simulated step time of this plan (:func:`~unitscale.stages.simulate`).
        lower_bound: a proven lower bound on the simulated step time of every plan that fits;
            equal to ``step_time`` (up to rounding) when the search finished.
        bottleneck: the largest per-microbatch stage time ``max_s (F_s + B_s) / speed``.
        stage_memory: bytes each stage needs.
        probes: dynamic programmes run for the first plans (the step-time formula's optimum).
        simulated: plans and partial plans whose step the search simulated.
        optimal: whether ``lower_bound`` proves ``step_time`` optimal (``False``: the search hit
            its budget; for GPipe the formula proves it, and a spent budget only cuts the tie-break short).
        rank_memory: bytes each rank needs (its stages together), the quantity ``memory_limit`` caps.
        origin: where the plan came from: ``"search"``, ``"formula"`` (``"polished formula"``
            after moving single cuts; ``"least memory"`` when the formula's caps fit nothing), a
            rule of :func:`~unitscale.stages.planner.rule_splits`, or ``"local search from ..."``.
            Names joined by ``" / "`` gave the same split.
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
    origin: str = "search"


def proportional(costs: ChainCosts) -> bool:
    """Whether every item's backward is the same multiple of its forward (GPipe's formula is then exact)."""
    ratio = next((b / f for f, b in zip(costs.forward, costs.backward, strict=True) if f > 0), None)
    if ratio is None:
        return not any(costs.backward)
    return all(math.isclose(b, ratio * f, rel_tol=1e-12) for f, b in zip(costs.forward, costs.backward, strict=True))


def rule_splits(costs: ChainCosts, num_stages: int) -> dict[str, list[int]]:
    """The splits of a chain that people use without a planner, by name (each as ``num_stages + 1`` bounds).

    Each rule sees one number per item, its work ``F + B`` (speed 1), and nothing of the
    schedule, the links or memory:

    * ``"equal count"``: the same number of items per stage, the remainder to the first stages
      (torchtitan's and Megatron's default when the items are layers);
    * ``"equal cost"``: stage ``s`` ends at the item boundary nearest to ``(s + 1) / k`` of the
      total work (a split by hand from per-layer costs);
    * ``"min-max"``: the contiguous split with the least largest stage;
    * ``"balanced"``: among min-max splits, the one with the least sum of squared stage times
      (left out when its programme is too large).

    >>> from unitscale.stages.planner import rule_splits
    >>> from unitscale.stages.schedules import ChainCosts
    >>> rules = rule_splits(ChainCosts.uniform([3, 1, 1, 1, 1, 1]), 2)
    >>> rules["equal count"], rules["min-max"]
    ([0, 3, 6], [0, 2, 6])
    """
    n, k = len(costs), num_stages
    if not 1 <= k <= n:
        raise StageCountError(f"num_stages={num_stages} must be between 1 and the chain's {n} items")
    work = [f + b for f, b in zip(costs.forward, costs.backward, strict=True)]
    prefix = [0.0, *itertools.accumulate(work)]
    total = prefix[-1]
    cost = [0]
    for s in range(1, k):
        target = total * s / k
        i = bisect.bisect_left(prefix, target)
        if i > 0 and (i > n or target - prefix[i - 1] <= prefix[i] - target):
            i -= 1
        cost.append(min(max(i, cost[-1] + 1), n - (k - s)))
    rules = {"equal count": equal_count_bounds(n, k), "equal cost": [*cost, n], "min-max": optimal_bounds(work, k)}
    balanced = balanced_bounds(work, k)
    if balanced is not None:
        rules["balanced"] = balanced
    return rules


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

    A plan fits when every rank's stages together need at most ``memory_limit`` bytes; among plans
    whose step times agree within ``1e-9`` (relative) the least sum of squared stage times wins.
    When the search spends ``search_budget``, a local search improves the best plans it holds and,
    unless that reaches the bound, the result has ``optimal=False`` and a ``lower_bound`` below its
    step time (a certified gap).

    Args:
        costs: per-item costs.
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        memory_limit: bytes per device, for all its stages (``None``: unlimited).
        device_speeds: relative speed of each rank (default all 1.0).
        search_budget: partial plans the branch and bound may simulate (and ten times as many
            it may bound in closed form) before it stops.

    Raises:
        MemoryLimitError: no split fits ``memory_limit``; the message gives the least limit that works
            (with several stages per rank, where finding the least takes too long: a limit that
            works and the range the least lies in; ``needed`` is a limit that works).
        StageCountError: more stages than items.
        InputError: a microbatch count the schedule cannot run, or bad ``device_speeds``/``memory_limit``.
        UnknownScheduleError: an unknown schedule.

    >>> from unitscale.stages.planner import plan_chain
    >>> from unitscale.stages.schedules import ChainCosts
    >>> costs = ChainCosts.uniform([1.0] * 6, activation_bytes=10.0)
    >>> plan_chain(costs, 2, "gpipe", 4, memory_limit=120.0).bounds  # 4 * 10 B * 3
    [0, 3, 6]
    """
    check_schedule(schedule, ranks * stages_per_rank, stages_per_rank, num_microbatches)
    k = ranks * stages_per_rank
    if k > len(costs):
        raise StageCountError(
            f"ranks * stages_per_rank = {ranks} * {stages_per_rank} = {k} stages, but the chain has only "
            f"{len(costs)} pieces to place; use at most {len(costs)} stages (fewer ranks or stages_per_rank)"
        )
    _speeds(device_speeds, ranks)
    if memory_limit is not None and (
        isinstance(memory_limit, bool) or not isinstance(memory_limit, (int, float)) or not memory_limit > 0
    ):
        raise InputError(f"memory_limit={memory_limit!r} must be a number of bytes > 0, or None for no limit")
    if isinstance(search_budget, bool) or not isinstance(search_budget, int) or search_budget < 0:
        raise InputError(f"search_budget={search_budget!r} must be an int >= 0 (partial plans to simulate)")
    # the formula's programme caps each stage at limit / v: a subset of the plans that fit each rank
    arrays = ChainArrays(costs, ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds)
    problem, search = Problem(arrays), Search(arrays)
    seeds, probes, certified = _first_seeds(costs, problem, search, k, memory_limit)
    if certified is None:
        first = next(iter(seeds))
        seeds[f"polished {first}"] = polish(search, seeds[first])
    seeds.update(rule_splits(costs, k))  # the rules people use anyway: the plan is never worse than theirs
    chosen, lower, best, finished = search.run(list(seeds.values()), search_budget)
    if certified is not None:
        lower, finished = certified, True  # the programme's optimum is the simulator's

    def named(plan: list[int]) -> str:
        return " / ".join(name for name, b in seeds.items() if list(b) == plan)

    origin = named(chosen) or "search"
    if not finished:
        # a local search from the best plans the unfinished search holds
        starts = [chosen, *(b for b in seeds.values() if list(b) != chosen and search.fits(b))]
        unique = list(dict.fromkeys(tuple(b) for b in starts))
        better, at = descend(search, [list(b) for b in unique])
        old, new = search.evaluate([chosen, better]).tolist()
        if new < old * (1 - TIE):
            chosen, origin, best = better, f"local search from {named(list(unique[at])) or origin}", new
            finished = best <= lower * (1 + TIE)
    step = simulate_bounds(costs, chosen, schedule, num_microbatches, stages_per_rank, device_speeds).step_time
    return ChainPlan(
        bounds=chosen,
        step_time=step,
        lower_bound=min(lower, step),  # equal up to the rounding of prefix sums against fsum
        bottleneck=max(search.times(chosen)),
        stage_memory=search.arrays.stage_memory(chosen),
        probes=probes,
        simulated=search.evaluated,
        optimal=finished,
        rank_memory=search.rank_memory(chosen),
        origin=origin,
    )


def _first_seeds(
    costs: ChainCosts, problem: Problem, search: Search, k: int, memory_limit: float | None
) -> tuple[dict[str, list[int]], int, float | None]:
    """The first incumbents by name (the formula's plan, or the least-memory plan when none fits
    at ``memory_limit / v`` per stage), the probe count, and the formula's bound where it is exact."""
    schedule, num_microbatches, stages_per_rank = search.schedule, search.m, search.v
    seeds: dict[str, list[int]] = {}  # by where each came from (ChainPlan.origin)
    probes, certified = 0, None
    try:
        exact = schedule == "gpipe" and proportional(costs) and costs.action_overhead == 0
        # elsewhere the formula's plan is only the first incumbent: a few dozen programmes do
        # (devices of different speeds can otherwise take hundreds)
        bounds, formula, formula_lower, probes = formula_plan(problem, None if exact else FORMULA_PROBES)
        seeds["formula"] = bounds
        if exact:
            certified = formula_lower
            if not problem.comm.any() and len({float(x[-1]) for x in problem.x}) == 1:
                even = most_even(problem, problem.bottleneck(bounds))
                if even is not None:
                    seeds["formula, most even"] = even
    except NoFit:
        need, plan = (smallest_memory(problem), None) if stages_per_rank == 1 else least_rank_memory(search)
        least = f"the least limit that works is {need:.4g} bytes"
        if stages_per_rank > 1 and plan is None:
            # the search for the least gave up: a plan within limit / v per stage fits v times that
            low, need = need, smallest_memory(problem) * stages_per_rank
            least = f"{need:.4g} bytes works (the least limit that works lies between {low:.4g} and that)"
        if plan is None or memory_limit is None or need > memory_limit:
            raise MemoryLimitError(
                f"no split of {len(costs)} pieces into {k} stages fits memory_limit={memory_limit:.4g} bytes per "
                f"device under {schedule} with {num_microbatches} microbatches; {least} (raise the limit, or "
                "use more ranks, fewer microbatches in flight (1f1b) or fewer bytes per parameter)",
                needed=need,
            ) from None
        seeds["least memory"] = plan
    return seeds, probes, certified


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

    The model is captured and costed as :func:`~unitscale.partition` does, then split by
    :func:`~unitscale.stages.planner.plan_chain` over the pieces a cut may fall between. The plan
    keeps its costs (``plan.chain_costs``), so :func:`~unitscale.stages.simulate` predicts its timeline.

    Args:
        module: the model, or a :class:`~unitscale.StagePlan` of it (``partition(model, 1, x, cost="time")``)
            whose graph, cut places and node costs are reused (``cost`` and ``boundary_depth``
            are then ignored), so that timing the nodes once serves many plans.
        example_inputs: a tensor or tuple, the whole batch of one step (split into microbatches).
        schedule: ``"gpipe"``, ``"1f1b"``, ``"interleaved_1f1b"``, ``"interleaved_zero_bubble"`` or ``"zbv"``.
        stages_per_rank: stages per rank (several for the interleaved schedules, 2 for ``"zbv"``).
        cost: node cost as in :func:`~unitscale.partition` (``"time"``: measured seconds).
        seconds_per_cost: seconds per unit of ``cost`` (default 1 for ``"time"``, ``1e-11`` otherwise,
            about 100 GFLOP/s for ``"flops"``).
        backward: backward time as a multiple of the forward, ``"time"`` (each node's backward
            timed alone on the example batch, scaled by ``seconds_per_cost`` as the forward's
            timings are with ``cost="time"``), or a callable ``node -> seconds`` per microbatch.
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
            the same graph (``run_pipeline`` with ``loss_fn``): node times are scaled to what the
            workers measured per stage, and the link and ``action_overhead`` become the measured ones.

    Returns:
        The :class:`~unitscale.StagePlan` with ``ranks * stages_per_rank`` stages, carrying the
        certificate: ``schedule``, the simulated ``step_time`` (seconds), a ``lower_bound`` on
        every split that fits, and ``optimal`` (whether the search proved ``step_time`` the least).

    Raises:
        MemoryLimitError: no split fits; the message says the least ``memory_limit`` that works.
        CostError: ``bandwidth <= 0``, a negative latency or ``action_overhead``, a ``seconds_per_cost``
            that is not a finite number > 0, or a bad cost model.
        StageCountError: more stages than places to cut.
        InputError: a microbatch count ``schedule`` cannot run (the message lists ones that can),
            or a ``calibration`` that is not a measured run of this graph.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.stages import plan_pipeline
    >>> model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(6)])
    >>> x = torch.randn(4, 8)
    >>> plan = plan_pipeline(
    ...     model, x, 2, schedule="gpipe", num_microbatches=2, cost="params"
    ... )
    >>> plan.stage_costs, plan.optimal
    ([216.0, 216.0], True)
    """
    check_schedule(schedule, ranks * stages_per_rank, stages_per_rank, num_microbatches)
    check_link(bandwidth, latency)
    if seconds_per_cost is not None and (
        isinstance(seconds_per_cost, bool)
        or not isinstance(seconds_per_cost, (int, float))
        or not math.isfinite(seconds_per_cost)
        or seconds_per_cost <= 0
    ):
        raise CostError(
            f"plan_pipeline(seconds_per_cost={seconds_per_cost!r}): pass a finite number of seconds > 0 per unit "
            "of cost (1 for cost='time', about 1e-11 for cost='flops'), or None for that default"
        )
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
        timed = dict(zip(base.compute_nodes(), backward_times(base, example_inputs, repeats), strict=True))

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
        piece_costs(costs, pieces), ranks, schedule, num_microbatches, stages_per_rank, memory_limit, device_speeds
    )
    return base.with_bounds(
        [pieces[b] for b in found.bounds],
        chain_costs=costs,
        schedule=schedule,
        step_time=found.step_time,
        lower_bound=found.lower_bound,
        optimal=found.optimal,
    )
