"""The exact schedule-aware planner (``unitscale.stages.planner.planner``)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale import StagePlan
from unitscale.errors import CostError, InputError, MemoryLimitError, StageCountError, UnitscaleError
from unitscale.stages.planner import formula as step_formula
from unitscale.stages.planner.branch_bound import Search
from unitscale.stages.planner.chain_arrays import ChainArrays
from unitscale.stages.planner.model_costs import chain_costs_for, piece_costs
from unitscale.stages.planner.planner import plan_chain, plan_pipeline
from unitscale.stages.planner.simulation import simulate, simulate_bounds
from unitscale.stages.schedules import ChainCosts, stage_ranks, valid_microbatches

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zero_bubble", 2), ("zbv", 2)]
Problem = tuple[ChainCosts, int, str, int, int, "float | None", list[float]]


@st.composite
def chain_costs(draw: st.DrawFn, n: int) -> ChainCosts:
    """Costs of ``n`` items: zero or positive times, memory, boundary bytes, a link."""
    item = st.one_of(st.just(0.0), st.floats(0.01, 4))
    f = draw(st.lists(item, min_size=n, max_size=n))
    # a backward that is not always twice the forward takes GPipe off its closed form
    b = [2 * x for x in f] if draw(st.booleans()) else draw(st.lists(item, min_size=n, max_size=n))
    return ChainCosts(
        tuple(f),
        tuple(b),
        tuple(draw(st.lists(st.floats(0, 5), min_size=n, max_size=n))),
        tuple(draw(st.lists(st.floats(0, 2), min_size=n, max_size=n))),
        (0.0, *draw(st.lists(st.floats(0, 3), min_size=n - 1, max_size=n - 1)), 0.0),
        bandwidth=draw(st.sampled_from([math.inf, 1.0, 4.0])),
        latency=draw(st.sampled_from([0.0, 0.1])),
        action_overhead=draw(st.sampled_from([0.0, 0.0, 0.3])),
    )


@st.composite
def problems(draw: st.DrawFn) -> Problem:
    n = draw(st.integers(2, 8))
    schedule, v = draw(st.sampled_from(SCHEDULES))
    p = draw(st.integers(1, max(1, min(3, n // v))))
    if n < p * v:
        schedule, v = "1f1b", 1
    m = draw(st.sampled_from([x for x in valid_microbatches(schedule, p, 6) if x <= 6 or x == 2 * p - 1]))
    costs = draw(chain_costs(n))
    limit = draw(st.one_of(st.none(), st.floats(2, 40)))
    speeds = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=p, max_size=p))
    return costs, p, schedule, m, v, limit, speeds


def _squares(costs: ChainCosts, bounds: list[int], speeds: list[float], schedule: str, v: int) -> float:
    placement = stage_ranks(schedule, len(speeds), v)
    return sum(
        ((sum(costs.forward[a:b]) + sum(costs.backward[a:b])) / speeds[placement[s]] + 2 * costs.action_overhead) ** 2
        for s, (a, b) in enumerate(itertools.pairwise(bounds))
    )


def _brute_force(costs: ChainCosts, p: int, schedule: str, m: int, v: int, limit: float | None, speeds: list[float]):
    """The least simulated step over every plan that fits, and the least sum of squares among its ties."""
    search = Search(ChainArrays(costs, p, schedule, m, v, limit, speeds))
    found = []
    for cuts in itertools.combinations(range(1, len(costs)), p * v - 1):
        bounds = [0, *cuts, len(costs)]
        if limit is not None and max(search.rank_memory(bounds)) > limit:
            continue
        t = simulate_bounds(costs, bounds, schedule, m, v, speeds).step_time
        found.append((t, _squares(costs, bounds, speeds, schedule, v)))
    if not found:
        return math.inf, math.inf
    best = min(t for t, _ in found)
    return best, min(q for t, q in found if t <= best * (1 + 1e-9))


@settings(max_examples=150, deadline=None)
@given(problems())
def test_plan_is_optimal_for_the_simulator_against_brute_force(problem: Problem) -> None:
    costs, p, schedule, m, v, limit, speeds = problem
    best, squares = _brute_force(*problem)
    if best == math.inf:
        with pytest.raises(MemoryLimitError) as info:
            plan_chain(costs, p, schedule, m, v, limit, speeds)
        # the limit it names is the least that works: just enough, and a hair less is not
        plan_chain(costs, p, schedule, m, v, info.value.needed, speeds)
        with pytest.raises(MemoryLimitError):
            plan_chain(costs, p, schedule, m, v, info.value.needed * (1 - 1e-9), speeds)
        return
    found = plan_chain(costs, p, schedule, m, v, limit, speeds)
    assert found.optimal
    assert found.step_time == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert found.step_time == simulate_bounds(costs, found.bounds, schedule, m, v, speeds).step_time
    # the certificate: a lower bound on every plan, met by the one returned
    assert found.lower_bound <= found.step_time
    assert found.lower_bound == pytest.approx(best, rel=1e-9, abs=1e-12)
    # ties go to the most even plan
    assert _squares(costs, found.bounds, speeds, schedule, v) <= squares * (1 + 1e-9) + 1e-12
    if limit is not None:
        assert max(found.rank_memory) <= limit


@settings(max_examples=60, deadline=None)
@given(problems(), st.data())
def test_bounds_never_exceed_the_step_of_any_completion(problem: Problem, data: st.DataObject) -> None:
    costs, p, schedule, m, v, _, speeds = problem
    search = Search(ChainArrays(costs, p, schedule, m, v, None, speeds))
    k, n = p * v, len(costs)
    j = data.draw(st.integers(0, k - 1))
    head = data.draw(st.sampled_from(list(itertools.combinations(range(1, n), j)))) if j else ()
    node = (0, *head)
    ends = search.children(node)
    if not len(ends):
        return
    bound, squares = search.bounds([node], [ends])
    for e, lb, sq in zip(ends.tolist(), bound.tolist(), squares.tolist(), strict=True):
        left = k - j - 1
        for rest in itertools.combinations(range(e + 1, n), left - 1) if left else [()]:
            bounds = [*node, e, *rest] + ([n] if left else [])
            t = simulate_bounds(costs, bounds, schedule, m, v, speeds).step_time
            assert lb <= t * (1 + 1e-12) + 1e-12
            assert sq <= _squares(costs, bounds, speeds, schedule, v) * (1 + 1e-12) + 1e-12


@st.composite
def chain_problems(draw: st.DrawFn) -> Problem:
    """One stage per rank (where the search confines cuts to windows), up to 4 ranks."""
    n = draw(st.integers(2, 9))
    schedule = draw(st.sampled_from(["gpipe", "1f1b"]))
    p = draw(st.integers(1, min(4, n)))
    m = draw(st.integers(p if schedule == "1f1b" else 1, 6))  # torch's 1F1B needs a microbatch per stage
    costs = draw(chain_costs(n))
    limit = draw(st.one_of(st.none(), st.floats(2, 40)))
    speed = st.sampled_from([0.5, 1.0, 1.5, 2.0])
    speeds = [draw(speed)] * p if draw(st.booleans()) else draw(st.lists(speed, min_size=p, max_size=p))
    return costs, p, schedule, m, 1, limit, speeds


@settings(max_examples=150, deadline=None)
@given(chain_problems(), st.data())
def test_windows_hold_every_plan_within_the_target(problem: Problem, data: st.DataObject) -> None:
    """Every plan that fits and whose step is at most the target lies inside the cut windows."""
    costs, p, schedule, m, v, limit, speeds = problem
    search = Search(ChainArrays(costs, p, schedule, m, v, limit, speeds))
    n = len(costs)
    plans = []
    for cuts in itertools.combinations(range(1, n), p - 1):
        bounds = [0, *cuts, n]
        if search.fits(bounds):
            plans.append((simulate_bounds(costs, bounds, schedule, m, v, speeds).step_time, bounds))
    if not plans:
        return
    target = data.draw(st.sampled_from(sorted(t for t, _ in plans)))
    assert search.narrow(target)
    assert search.window is not None
    lo, hi, reach = search.window
    inside = 0
    for t, bounds in plans:
        if t > target:
            continue
        inside += 1
        for c, b in enumerate(bounds):
            assert lo[c] <= b <= hi[c], (c, b, lo, hi)
        for s in range(p):
            assert bounds[s + 1] <= reach[s][bounds[s]]
    assert inside >= 1


@settings(max_examples=100, deadline=None)
@given(chain_problems())
def test_one_stage_per_rank_plans_are_optimal_against_brute_force(problem: Problem) -> None:
    costs, p, schedule, m, v, limit, speeds = problem
    best, squares = _brute_force(*problem)
    if best == math.inf:
        with pytest.raises(MemoryLimitError):
            plan_chain(costs, p, schedule, m, v, limit, speeds)
        return
    found = plan_chain(costs, p, schedule, m, v, limit, speeds)
    assert found.optimal
    assert found.step_time == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert found.lower_bound == pytest.approx(best, rel=1e-9, abs=1e-12)
    assert _squares(costs, found.bounds, speeds, schedule, v) <= squares * (1 + 1e-9) + 1e-12


def test_windows_certify_a_long_chain_within_a_small_budget() -> None:
    """2,000 items on 8 ranks with slow links: the windows leave so few positions per cut that
    1F1B is proven optimal, with and without a memory limit, in a tenth of the default budget."""
    rng = random.Random(0)
    n = 2000
    costs = ChainCosts.uniform(
        [rng.lognormvariate(0.0, 1.0) * 1e-4 for _ in range(n)],
        2.0,
        param_bytes=[rng.uniform(0, 1e6) for _ in range(n)],
        activation_bytes=[rng.uniform(0, 1e5) for _ in range(n)],
        boundary_bytes=[0.0, *[rng.uniform(1e4, 1e6) for _ in range(n - 1)], 0.0],
        bandwidth=1e9,
        latency=1e-4,
    )
    for limit, speeds in ((None, None), (1.8e8, None), (2.2e8, [1.0] * 8)):
        found = plan_chain(costs, 8, "1f1b", 16, memory_limit=limit, device_speeds=speeds, search_budget=5000)
        assert found.optimal, (limit, speeds)
        assert found.lower_bound == pytest.approx(found.step_time, rel=1e-12)
        if limit is not None:
            assert max(found.rank_memory) <= limit
        search = Search(ChainArrays(costs, 8, "1f1b", 16, 1, limit, speeds))
        assert search.narrow(found.step_time) and search.window is not None
        lo, hi, _ = search.window
        assert all(a <= b <= c for a, b, c in zip(lo, found.bounds, hi, strict=True))
        assert max(c - a + 1 for a, c in zip(lo, hi, strict=True)) < 100  # of 2,000 places


def test_one_f_one_b_plans_beat_the_formula_plans() -> None:
    """The 1F1B formula is exact on even stages without traffic; with uneven stages and slow links
    the simulated step of its optimum is beaten by the plan the search certifies."""
    rng = random.Random(0)
    gains = []
    for _ in range(20):
        f = [rng.lognormvariate(0, 1) for _ in range(12)]
        c = ChainCosts.uniform(f, 2.0, boundary_bytes=[0.0, *[rng.uniform(0, 1) for _ in range(11)], 0.0])
        formula = step_formula.formula_plan(step_formula.Problem(ChainArrays(c, 4, "1f1b", 8, 1, None, None)))[0]
        plan = plan_chain(c, 4, "1f1b", 8)
        assert plan.optimal and plan.lower_bound == pytest.approx(plan.step_time, rel=1e-9)
        gains.append(simulate_bounds(c, formula, "1f1b", 8).step_time / plan.step_time)
    assert min(gains) >= 1 - 1e-9
    assert max(gains) > 1.02


def test_a_spent_budget_still_certifies_a_gap() -> None:
    rng = random.Random(1)
    f = [rng.lognormvariate(0, 1) for _ in range(40)]
    c = ChainCosts.uniform(f, 2.0, boundary_bytes=[0.0, *[rng.uniform(0, 1) for _ in range(39)], 0.0])
    full = plan_chain(c, 4, "1f1b", 8)
    cut = plan_chain(c, 4, "1f1b", 8, search_budget=0)
    assert full.optimal and not cut.optimal
    assert cut.lower_bound <= full.step_time <= cut.step_time


def test_per_rank_memory_lets_interleaved_stages_share_a_device() -> None:
    # stage 0 holds more microbatches than stage 2 on the same rank; only their sum is capped
    costs = ChainCosts.uniform([1.0] * 8, activation_bytes=1.0, param_bytes=1.0)
    free = plan_chain(costs, 2, "interleaved_1f1b", 4, 2)
    held = free.rank_memory
    tight = plan_chain(costs, 2, "interleaved_1f1b", 4, 2, memory_limit=min(held))
    assert max(tight.rank_memory) <= min(held)
    assert sum(tight.stage_memory) == pytest.approx(sum(tight.rank_memory))


def test_memory_limit_moves_work_off_the_stage_that_holds_most() -> None:
    # 1F1B: stage 0 holds 4 microbatches of activations, stage 3 one
    costs = ChainCosts.uniform([1.0] * 16, activation_bytes=1.0)
    free = plan_chain(costs, 4, "1f1b", 8)
    tight = plan_chain(costs, 4, "1f1b", 8, memory_limit=12.0)
    assert free.bounds == [0, 4, 8, 12, 16]
    assert max(tight.stage_memory) <= 12.0
    assert tight.bounds[1] <= 3  # stage 0: 4 in flight * 3 items = 12 bytes
    assert tight.step_time > free.step_time


def test_slow_links_pull_cuts_to_small_tensors() -> None:
    sent = [0.0, 100.0, 100.0, 1.0, 100.0, 100.0, 0.0]
    costs = ChainCosts.uniform([1.0] * 6, 2.0, boundary_bytes=sent, bandwidth=10.0)
    assert plan_chain(costs, 2, "gpipe", 4).bounds == [0, 3, 6]
    fast = ChainCosts.uniform([1.0, 1.0, 1.0, 1.0, 1.0, 2.0], 2.0, boundary_bytes=sent, bandwidth=10.0)
    assert plan_chain(fast, 2, "gpipe", 4).bounds == [0, 3, 6]  # one slower stage beats a 10 s message


def test_faster_devices_get_more_work() -> None:
    costs = ChainCosts.uniform([1.0] * 12)
    assert plan_chain(costs, 2, "1f1b", 8, device_speeds=[1.0, 2.0]).bounds == [0, 4, 12]


def test_ties_break_toward_the_most_even_plan() -> None:
    costs = ChainCosts.uniform([5.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert plan_chain(costs, 4, "1f1b", 8).bounds == [0, 1, 4, 6, 8]


def test_ties_break_toward_the_most_even_plan_within_memory() -> None:
    # bottleneck 5 either way; stages hold 4, 3, 2, 1 microbatches, so at most 2, 2, 4, 8 items fit
    costs = ChainCosts.uniform([5.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0], activation_bytes=1.0)
    found = plan_chain(costs, 4, "1f1b", 8, memory_limit=8.0)
    assert found.bounds == [0, 2, 4, 6, 8]  # stage times 5, 2, 2, 2 (not 5, 1, 2, 3)
    assert found.stage_memory == [8.0, 6.0, 4.0, 2.0]


def test_memory_error_names_the_least_limit() -> None:
    costs = ChainCosts.uniform([1.0] * 4, param_bytes=100.0)
    with pytest.raises(MemoryLimitError, match=r"memory_limit=150 .* least limit that works is 200") as info:
        plan_chain(costs, 2, "gpipe", 2, memory_limit=150.0)
    assert info.value.needed == 200.0


def test_bad_planning_input_says_what_works() -> None:
    costs = ChainCosts.uniform([1.0] * 4)
    with pytest.raises(StageCountError, match="use at most 4 stages"):
        plan_chain(costs, 3, "interleaved_1f1b", 6, stages_per_rank=2)
    with pytest.raises(InputError, match="use num_microbatches in"):
        plan_chain(ChainCosts.uniform([1.0] * 16), 4, "interleaved_1f1b", 9, stages_per_rank=2)
    with pytest.raises(InputError, match="memory_limit=-1"):
        plan_chain(costs, 2, "1f1b", 2, memory_limit=-1)
    with pytest.raises(InputError, match="one finite number > 0 per rank"):
        plan_chain(costs, 2, "1f1b", 2, device_speeds=[1.0])
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(CostError, match="bandwidth=0 must be a number > 0"):
        plan_pipeline(model, torch.randn(2, 4), 2, bandwidth=0)
    with pytest.raises(CostError, match="bandwidth=-5"):
        plan_pipeline(model, torch.randn(2, 4), 2, bandwidth=-5.0)


def test_plan_pipeline_on_a_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())])
    x = torch.randn(8, 16)
    plan = plan_pipeline(
        model, x, 2, schedule="1f1b", num_microbatches=4, cost="flops", memory_limit=1e5, bandwidth=1e9
    )
    assert plan.num_stages == 2 and plan.verify(x)
    costs = plan.chain_costs
    assert costs is not None and costs.param_bytes[0] == 272 * 16  # weight + bias, Adam bytes
    assert costs.activation_bytes[0] == 2 * 16 * 4  # a microbatch of 2 rows, fp32
    assert costs.boundary_bytes[1] == 2 * 16 * 4
    timeline = simulate(plan, "1f1b", 4)
    assert max(timeline.rank_memory) <= 1e5
    inter = plan_pipeline(model, x, 2, schedule="interleaved_1f1b", num_microbatches=4, stages_per_rank=2, cost="flops")
    assert inter.num_stages == 4


def test_plan_pipeline_carries_the_certificate() -> None:
    from unitscale import partition

    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(16, 16), nn.ReLU())])
    x = torch.randn(8, 16)
    plan = plan_pipeline(model, x, 2, schedule="1f1b", num_microbatches=4, cost="flops", bandwidth=1e9)
    # the same numbers plan_chain certifies, and the simulator agrees on the step
    assert plan.schedule == "1f1b" and plan.optimal is True
    assert plan.step_time is not None and plan.lower_bound is not None
    assert plan.lower_bound <= plan.step_time
    assert plan.lower_bound == pytest.approx(plan.step_time, rel=1e-9)
    assert simulate(plan, "1f1b", 4).step_time == pytest.approx(plan.step_time, rel=1e-12)
    assert repr(plan).endswith(f"; 1f1b step {plan.step_time:.4g} s, optimal)")
    assert str(plan.report(4)).splitlines()[-1] == (
        f"planned for 1f1b: simulated step {plan.step_time:.4g} s, proven optimal (lower bound "
        f"{plan.lower_bound:.4g} s)"
    )
    # a search cut short states its gap instead
    plan.optimal, plan.lower_bound = False, plan.step_time / 1.25
    assert repr(plan).endswith("gap <= 25.00%)")
    assert "within 25.00% of optimal" in str(plan.report(4))
    # plans not made by the planner carry no certificate, nor does a plan moved off its bounds
    for other in (partition(model, 2, x), plan.with_bounds(plan.bounds)):
        assert (other.schedule, other.step_time, other.lower_bound, other.optimal) == (None, None, None, None)
        assert "step" not in repr(other) and "planned" not in str(other.report(4))
    # built whole: what the planner found is given when the plan is made, as plan_pipeline does
    again = plan.with_bounds(
        plan.bounds, schedule="1f1b", step_time=plan.step_time, lower_bound=plan.lower_bound, optimal=False
    )
    assert repr(again) == repr(plan) and again.chain_costs is plan.chain_costs


def test_chain_costs_take_a_backward_callable() -> None:
    from unitscale import partition

    plan = partition(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), 1, torch.randn(2, 4))
    costs = chain_costs_for(plan, 1, backward=lambda node: 3.0)
    assert costs.backward == (3.0, 3.0)
    with pytest.raises(CostError, match="bytes_per_param"):
        chain_costs_for(plan, 1, bytes_per_param=-1)


def test_memory_error_gives_a_limit_that_works_when_the_least_is_out_of_reach() -> None:
    rng = random.Random(2)
    n = 50
    costs = ChainCosts.uniform(
        [rng.lognormvariate(0, 1) for _ in range(n)],
        param_bytes=[rng.uniform(0, 10) for _ in range(n)],
        activation_bytes=[rng.uniform(0, 1) for _ in range(n)],
    )
    # the search for the least per-rank limit gives up on 50 pieces in 8 interleaved stages
    with pytest.raises(
        MemoryLimitError, match=r"memory_limit=1 .* bytes works \(the least limit that works lies"
    ) as info:
        plan_chain(costs, 4, "interleaved_1f1b", 8, 2, memory_limit=1.0)
    found = plan_chain(costs, 4, "interleaved_1f1b", 8, 2, memory_limit=info.value.needed, search_budget=100)
    assert max(found.rank_memory) <= info.value.needed


def test_plan_pipeline_bad_input_raises_the_exact_type_and_says_what_works() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(*[m for _ in range(3) for m in (nn.Linear(16, 16), nn.ReLU())])
    x = torch.randn(8, 16)

    def error(**kwargs: object) -> UnitscaleError:
        with pytest.raises(UnitscaleError) as info:
            plan_pipeline(model, x, 2, cost="params", **kwargs)  # type: ignore[arg-type]
        return info.value

    # a memory limit no plan meets: the least that works, which then does work
    tight = error(schedule="gpipe", num_microbatches=4, memory_limit=1000.0)
    assert isinstance(tight, MemoryLimitError) and type(tight) is MemoryLimitError and tight.needed == 10240.0
    assert str(tight) == (
        "no split of 6 pieces into 2 stages fits memory_limit=1000 bytes per device under gpipe with 4 "
        "microbatches; the least limit that works is 1.024e+04 bytes (raise the limit, or use more ranks, fewer "
        "microbatches in flight (1f1b) or fewer bytes per parameter)"
    )
    fits = plan_pipeline(model, x, 2, cost="params", schedule="gpipe", num_microbatches=4, memory_limit=tight.needed)
    assert fits.num_stages == 2 and max(simulate(fits, "gpipe", 4).rank_memory) <= tight.needed
    # a bandwidth <= 0
    for bad in (0.0, -1e9):
        slow = error(bandwidth=bad)
        assert type(slow) is CostError
        assert str(slow) == (
            f"bandwidth={bad!r} must be a number > 0 (bytes per second between ranks); use math.inf to ignore "
            "communication"
        )
    # more (virtual) stages than pieces to place
    many = error(schedule="interleaved_1f1b", num_microbatches=4, stages_per_rank=4)
    assert type(many) is StageCountError
    assert str(many) == (
        "ranks * stages_per_rank = 2 * 4 = 8 stages, but the chain has only 6 pieces to place; use at most 6 "
        "stages (fewer ranks or stages_per_rank)"
    )
    # fewer microbatches than stages, which torch's 1F1B refuses
    few = error(schedule="1f1b", num_microbatches=1)
    assert type(few) is InputError
    assert str(few) == (
        "num_microbatches=1 does not fit 1f1b on 2 ranks: 1f1b needs at least as many microbatches as stages (2); "
        "use num_microbatches in [2, 3, 4, 5] (any count >= 2 works, or schedule='gpipe')"
    )
    # a microbatch count the interleaved schedules cannot split into rounds of the rank count
    for schedule in ("interleaved_1f1b", "interleaved_zero_bubble"):
        odd = error(schedule=schedule, num_microbatches=5, stages_per_rank=2)
        assert type(odd) is InputError
        assert str(odd) == (
            f"num_microbatches=5 does not fit {schedule} on 2 ranks: {schedule} splits the microbatches into "
            "max(1, m // ranks) = 2 rounds of equal size, and 2 does not divide 5; use num_microbatches in "
            "[2, 3, 4, 6] (any multiple of 2 works)"
        )
        for m in (2, 3, 4, 6):
            plan = plan_pipeline(model, x, 2, cost="params", schedule=schedule, num_microbatches=m, stages_per_rank=2)
            assert plan.num_stages == 4


def test_the_schedules_bookkeeping_is_planned_for() -> None:
    """``action_overhead`` lands in the plan's costs and its step: GPipe on two equal stages
    takes ``(m + p - 1)`` forwards and as many backwards, each ``o`` longer."""
    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    x = torch.randn(4, 8)
    plain = plan_pipeline(model, x, 2, schedule="gpipe", num_microbatches=2, cost="params", seconds_per_cost=1.0)
    slow = plan_pipeline(
        model, x, 2, schedule="gpipe", num_microbatches=2, cost="params", seconds_per_cost=1.0, action_overhead=5.0
    )
    assert slow.chain_costs.action_overhead == 5.0  # type: ignore[union-attr]
    assert slow.bounds == plain.bounds == [0, 2, 4]
    assert slow.step_time == pytest.approx(plain.step_time + 2 * (2 + 2 - 1) * 5.0, rel=1e-12)
    assert slow.optimal and slow.step_time == simulate(slow, "gpipe", 2).step_time
    with pytest.raises(CostError) as info:
        plan_pipeline(model, x, 2, schedule="gpipe", num_microbatches=2, cost="params", action_overhead=-1.0)
    assert str(info.value) == "action_overhead=-1.0 must be a finite number of seconds >= 0"


def test_backward_time_times_each_nodes_backward_alone() -> None:
    """``backward="time"``: a node computed from the model's input alone needs no gradient (0 s);
    in-place ops work on their copy; the plan's per-microbatch backward is the timing over m."""
    from unitscale import partition
    from unitscale.stages.partitioner.costs import backward_times

    torch.manual_seed(0)
    model = nn.Sequential(nn.ReLU(), nn.Linear(64, 64), nn.ReLU(inplace=True), nn.Linear(64, 4))
    x = torch.randn(32, 64)
    base = partition(model, 1, x, cost="time")
    seconds = backward_times(base, x, repeats=3)
    assert [name for name, _ in base.node_costs] == ["_0", "_1", "_2", "_3"]
    assert seconds[0] == 0.0 and all(t > 0 for t in seconds[1:])
    plan = plan_pipeline(base, x, 2, schedule="gpipe", num_microbatches=2, backward="time", repeats=3)
    backward = plan.chain_costs.backward  # type: ignore[union-attr]
    assert backward[0] == 0.0 and all(b > 0 for b in backward[1:])
    assert plan.step_time == simulate(plan, "gpipe", 2).step_time
    # with FLOPs for the forward, the timed backward stays in seconds (not FLOP-scaled)
    flops = plan_pipeline(model, x, 2, schedule="gpipe", num_microbatches=2, cost="flops", backward="time")
    timed_seconds = [b for b in flops.chain_costs.backward if b > 0]  # type: ignore[union-attr]
    assert len(timed_seconds) == 3 and min(timed_seconds) > 1e-7  # microseconds, not 1e-11 of them
    with pytest.raises(CostError) as info:
        plan_pipeline(base, x, 2, schedule="gpipe", num_microbatches=2, backward="measured")
    assert str(info.value) == (
        "backward='measured' is not a backward model; use a ratio to the forward, \"time\" or a callable "
        "node -> seconds"
    )
    with pytest.raises(InputError, match=r"repeats=0 must be an int >= 1"):
        backward_times(base, x, repeats=0)


def test_calibration_scales_each_stage_to_what_it_measured_and_moves_the_cuts() -> None:
    """A run where the first stage measured four times its prediction: the calibrated planner
    moves a layer off it, and takes the measured link and bookkeeping."""
    from unitscale.stages import PipelineResult

    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    x = torch.randn(4, 8)

    def planned(**kwargs: object) -> StagePlan:
        return plan_pipeline(
            model,
            x,
            2,
            schedule="gpipe",
            num_microbatches=2,
            cost="params",
            seconds_per_cost=1.0,
            backward=1.0,
            **kwargs,  # type: ignore[arg-type]
        )

    first = planned()
    assert first.bounds == [0, 2, 4]
    per_layer = first.chain_costs.forward[0]  # type: ignore[union-attr]  # 72 parameters / 2 microbatches
    measured = ChainCosts(
        (8 * per_layer, 2 * per_layer),
        (8 * per_layer, 2 * per_layer),
        (0.0, 0.0),
        (0.0, 0.0),
        (0.0, 64.0, 0.0),
        bandwidth=1e3,
        latency=0.5,
        action_overhead=0.25,
    )
    run = PipelineResult(None, torch.tensor(0.0), {}, 1.0, measured, num_microbatches=2, bounds=first.bounds)
    again = planned(calibration=run)
    costs = again.chain_costs
    assert costs is not None
    assert costs.forward == pytest.approx([4 * per_layer] * 2 + [per_layer] * 2)
    assert (costs.bandwidth, costs.latency, costs.action_overhead) == (1e3, 0.5, 0.25)
    assert again.bounds == [0, 1, 4]  # 4 vs 4 + 1 + 1 layer-units: the slow first layers split
    assert again.step_time == simulate(again, "gpipe", 2).step_time


def test_calibration_that_is_not_a_run_of_this_graph_is_refused() -> None:
    from unitscale.stages import PipelineResult

    model = nn.Sequential(*[nn.Linear(8, 8) for _ in range(4)])
    x = torch.randn(4, 8)
    costs = ChainCosts.uniform([1.0, 1.0])
    cases = [
        (
            PipelineResult(None, torch.tensor(0.0), {}),
            "calibration=PipelineResult is not a measured pipeline run; pass the PipelineResult that "
            "run_pipeline(plan, ..., loss_fn=..., target=...) returns",
        ),
        (
            PipelineResult(None, torch.tensor(0.0), {}, 1.0, costs, bounds=[0, 3, 6]),
            "calibration ran a plan of 6 nodes in 2 stages, but this graph has 4 nodes; calibrate with a run of "
            "a plan of the same model and example inputs",
        ),
        (
            "fast",
            "calibration=str is not a measured pipeline run; pass the PipelineResult that "
            "run_pipeline(plan, ..., loss_fn=..., target=...) returns",
        ),
    ]
    for bad, message in cases:
        with pytest.raises(InputError) as info:
            plan_pipeline(model, x, 2, schedule="gpipe", num_microbatches=2, cost="params", calibration=bad)
        assert type(info.value) is InputError and str(info.value) == message


def test_pieces_keep_every_cost_field_the_simulator_reads() -> None:

    costs = ChainCosts(
        forward=(1.0, 2.0, 3.0),
        backward=(2.0, 4.0, 6.0),
        param_bytes=(1.0, 1.0, 1.0),
        activation_bytes=(1.0, 1.0, 1.0),
        boundary_bytes=(0.0, 5.0, 7.0, 0.0),
        bandwidth=10.0,
        latency=0.5,
        weight_grad_share=0.25,
        action_overhead=0.125,
    )
    pieces = piece_costs(costs, [0, 2, 3])
    assert (pieces.forward, pieces.backward, pieces.boundary_bytes) == ((3.0, 3.0), (6.0, 6.0), (0.0, 7.0, 0.0))
    link = (pieces.bandwidth, pieces.latency, pieces.weight_grad_share, pieces.action_overhead)
    assert link == (10.0, 0.5, 0.25, 0.125)
    # a step over pieces is the step over the items they hold
    over_pieces = simulate_bounds(pieces, [0, 1, 2], "1f1b", 2).step_time
    assert over_pieces == simulate_bounds(costs, [0, 2, 3], "1f1b", 2).step_time
