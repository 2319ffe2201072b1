"""The pure min-max partition algorithms in ``unitscale.stages.partitioner.search``."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.stage_heuristics import block_partition_bounds, max_min_bounds
from unitscale.stages.partitioner.search import (
    balanced_bounds,
    bottleneck,
    equal_count_bounds,
    greedy_threshold_bounds,
    optimal_bounds,
    stage_sums,
    sum_of_squares,
)


def brute_force_bottleneck(costs: list[float], k: int) -> float:
    """Smallest bottleneck over every partition into ``k`` non-empty stages (the oracle; tiny inputs only)."""
    n = len(costs)
    return min(bottleneck(costs, [0, *cuts, n]) for cuts in itertools.combinations(range(1, n), k - 1))


costs_and_k = st.lists(
    st.one_of(st.integers(0, 20), st.floats(0, 10, allow_nan=False, allow_infinity=False)), min_size=1, max_size=10
).flatmap(lambda c: st.tuples(st.just(c), st.integers(1, len(c))))


def _is_valid(bounds: list[int], n: int, k: int) -> bool:
    return (
        len(bounds) == k + 1
        and bounds[0] == 0
        and bounds[-1] == n
        and all(a < b for a, b in itertools.pairwise(bounds))
    )


@settings(max_examples=200, deadline=None)
@given(costs_and_k)
def test_partition_is_optimal_on_random_chains(case: tuple[list[float], int]) -> None:
    costs, k = case
    bounds = optimal_bounds(costs, k)
    assert _is_valid(bounds, len(costs), k)
    assert bottleneck(costs, bounds) == brute_force_bottleneck(costs, k)


@settings(max_examples=100, deadline=None)
@given(costs_and_k)
def test_heuristics_give_k_nonempty_stages_and_never_beat_the_optimum(case: tuple[list[float], int]) -> None:
    costs, k = case
    best = bottleneck(costs, optimal_bounds(costs, k))
    for heuristic in (
        lambda c, k: equal_count_bounds(len(c), k),
        greedy_threshold_bounds,
        block_partition_bounds,
        max_min_bounds,
    ):
        bounds = heuristic(costs, k)
        assert _is_valid(bounds, len(costs), k)
        assert bottleneck(costs, bounds) >= best


def test_partition_of_all_zero_costs_still_has_k_nonempty_stages() -> None:
    bounds = optimal_bounds([0.0] * 10, 4)
    assert _is_valid(bounds, 10, 4)
    assert stage_sums([0.0] * 10, bounds) == [0.0] * 4


def test_extra_stages_split_the_heaviest_stage_first() -> None:
    # the bottleneck is the lone 10; the three extra cuts go into the ones, not around the zeros
    costs = [10, 0, 0, 0, 1, 1, 1, 1, 1, 1]
    bounds = optimal_bounds(costs, 4)
    assert bottleneck(costs, bounds) == 10
    assert bounds[:2] == [0, 1]


def test_partition_of_one_stage_holds_everything() -> None:
    assert optimal_bounds([3, 1, 2], 1) == [0, 3]


def test_partition_with_as_many_stages_as_items_puts_one_item_in_each() -> None:
    assert optimal_bounds([3, 1, 2], 3) == [0, 1, 2, 3]


def test_partition_is_exact_on_a_large_random_chain() -> None:
    rng = random.Random(0)
    costs = [rng.randint(1, 1000) for _ in range(20_000)]
    for k in (2, 8, 64):
        bounds = optimal_bounds(costs, k)
        best = bottleneck(costs, bounds)
        # one unit less is infeasible: greedy packing under best - 1 needs more than k stages
        stages, acc = 1, 0
        for c in costs:
            if acc + c > best - 1:
                stages, acc = stages + 1, 0
            acc += c
        assert stages > k


def test_equal_count_gives_earlier_stages_the_remainder() -> None:
    assert equal_count_bounds(10, 4) == [0, 3, 6, 8, 10]


def test_greedy_threshold_can_be_far_from_optimal() -> None:
    costs = [1, 2, 4, 1, 2]
    assert bottleneck(costs, greedy_threshold_bounds(costs, 3)) == 7
    assert bottleneck(costs, optimal_bounds(costs, 3)) == 4


@settings(max_examples=200, deadline=None)
@given(costs_and_k)
def test_balanced_partition_keeps_the_optimal_bottleneck_and_is_most_even(case: tuple[list[float], int]) -> None:
    costs, k = case
    n = len(costs)
    best = brute_force_bottleneck(costs, k)
    bounds = balanced_bounds(costs, k)
    assert bounds is not None and _is_valid(bounds, n, k)
    assert bottleneck(costs, bounds) == best
    optimal_plans = [
        [0, *cuts, n] for cuts in itertools.combinations(range(1, n), k - 1) if bottleneck(costs, [0, *cuts, n]) == best
    ]
    fewest = min(sum_of_squares(costs, b) for b in optimal_plans)
    assert sum_of_squares(costs, bounds) == pytest.approx(fewest, rel=1e-9, abs=1e-9)


def test_balanced_partition_fills_the_stage_min_max_leaves_empty() -> None:
    # issue 14's shape: the bottleneck stands alone and min-max is happy with an empty stage beside it
    costs = [4.96, 0.0, 0.5, 0.5, 0.39, 0.5, 0.62]
    assert stage_sums(costs, optimal_bounds(costs, 4)) == pytest.approx([4.96, 0.0, 1.39, 1.12])
    assert stage_sums(costs, balanced_bounds(costs, 4) or []) == pytest.approx([4.96, 1.0, 0.89, 0.62])


def test_balanced_partition_gives_up_beyond_its_budget() -> None:
    assert balanced_bounds([1.0] * 3000, 4, limit=3000.0) is None
