"""The pure min-max partition algorithms in ``unitscale.stages.search``."""

from __future__ import annotations

import itertools
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.stages.search import (
    block_partition_bounds,
    bottleneck,
    brute_force_bottleneck,
    equal_count_bounds,
    greedy_threshold_bounds,
    max_min_bounds,
    optimal_bounds,
    stage_sums,
)

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
