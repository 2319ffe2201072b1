"""The schedule simulator and the schedule cost model (``unitscale.stages.planner.simulation``, ``schedules``)."""

from __future__ import annotations

import itertools
import math
import pickle

import matplotlib
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.errors import CostError, InputError, StageCountError, UnknownScheduleError
from unitscale.stages import bubble_fraction
from unitscale.stages.planner.simulation import simulate, simulate_bounds
from unitscale.stages.schedules import ChainCosts, check_schedule, in_flight, schedule_order, stage_ranks

matplotlib.use("Agg")


def _even(p: int, v: int = 1, f: float = 1.0, **kw: float) -> tuple[ChainCosts, list[int]]:
    return ChainCosts.uniform([f] * (p * v), 2.0, **kw), list(range(p * v + 1))  # type: ignore[arg-type]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (2, 4), (4, 8), (3, 5)])
def test_even_stages_take_m_plus_p_minus_1_slots(schedule: str, p: int, m: int) -> None:
    costs, bounds = _even(p)
    t = simulate_bounds(costs, bounds, schedule, m)
    assert t.step_time == pytest.approx((m + p - 1) * 3.0)
    assert t.bubble == pytest.approx(bubble_fraction(p, m))
    assert len(t.blocks) == 2 * m * p


def test_communication_delays_each_hop_both_ways() -> None:
    costs = ChainCosts.uniform([1.0, 1.0], 2.0, boundary_bytes=100.0, bandwidth=50.0, latency=0.5)
    # f, send (0.5 + 2), f, b, send back, b
    assert simulate_bounds(costs, [0, 1, 2], "gpipe", 1).step_time == pytest.approx(1 + 2.5 + 1 + 2 + 2.5 + 2)


def test_a_faster_rank_takes_less_time() -> None:
    costs, bounds = _even(2)
    slow = simulate_bounds(costs, bounds, "1f1b", 4)
    fast = simulate_bounds(costs, bounds, "1f1b", 4, device_speeds=[1.0, 2.0])
    assert [b.end - b.start for b in fast.blocks if b.rank == 1 and b.kind == "F"] == [0.5] * 4
    assert fast.step_time < slow.step_time


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.floats(0.01, 5), min_size=1, max_size=5),
    st.integers(1, 6),
    st.lists(st.floats(0, 3), min_size=4, max_size=4),
)
def test_gpipe_matches_its_closed_form(f: list[float], m: int, sent: list[float]) -> None:
    p = len(f)
    cuts = [0.0, *sent[: p - 1], 0.0]
    costs = ChainCosts.uniform(f, 2.0, boundary_bytes=cuts, bandwidth=1.0)
    t = simulate_bounds(costs, list(range(p + 1)), "gpipe", m)
    comm = sum(cuts)
    closed = 3 * sum(f) + 2 * comm + (m - 1) * 3 * max(f)
    assert t.step_time == pytest.approx(closed)


def test_memory_follows_what_each_schedule_holds() -> None:
    costs, bounds = _even(4, param_bytes=10.0, activation_bytes=1.0)
    gpipe = simulate_bounds(costs, bounds, "gpipe", 8)
    one = simulate_bounds(costs, bounds, "1f1b", 8)
    assert gpipe.stage_memory == [18.0] * 4  # parameters + 8 microbatches
    assert one.stage_memory == [14.0, 13.0, 12.0, 11.0]  # parameters + p - rank
    assert in_flight("gpipe", 4, 1, 8) == [8] * 4


def test_interleaving_shrinks_the_bubble_and_zero_bubble_more() -> None:
    costs, bounds = _even(4, v=2, f=0.5)
    one = simulate_bounds(*_even(4), "1f1b", 8)
    inter = simulate_bounds(costs, bounds, "interleaved_1f1b", 8, stages_per_rank=2)
    zb = simulate_bounds(costs, bounds, "interleaved_zero_bubble", 8, stages_per_rank=2)
    assert inter.busy == pytest.approx(one.busy)
    assert zb.bubble < inter.bubble < one.bubble
    assert {b.kind for b in zb.blocks} == {"F", "I", "W"}
    assert inter.stage_ranks == [0, 1, 2, 3, 0, 1, 2, 3]


def test_zbv_places_stages_in_a_v() -> None:
    costs, bounds = _even(2, v=2)
    t = simulate_bounds(costs, bounds, "zbv", 4, stages_per_rank=2)
    assert stage_ranks("zbv", 2, 2) == [0, 1, 1, 0]
    assert {(b.stage, b.rank) for b in t.blocks} == {(0, 0), (1, 1), (2, 1), (3, 0)}
    assert sum(b.end - b.start for b in t.blocks) == pytest.approx(4 * 4 * 3.0)


def test_orders_hold_every_op_once() -> None:
    for schedule, v in [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zero_bubble", 3)]:
        ops = [op for rank in schedule_order(schedule, 3, v, 6) for op in rank]
        kinds = ("F", "I", "W") if "zero" in schedule else ("F", "B")
        assert sorted(ops) == sorted((k, s, i) for k in kinds for s in range(3 * v) for i in range(6))


def test_plot_has_one_row_per_rank_and_fits_the_page() -> None:
    costs, bounds = _even(3)
    fig = simulate_bounds(costs, bounds, "1f1b", 4).plot()
    assert fig.get_size_inches()[0] <= 7.5
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0", "rank 1", "rank 2"]
    assert len(ax.patches) == 2 * 3 * 4
    assert "0" in {t.get_text() for t in ax.texts}


def _drawn_labels(fig: object) -> list[tuple[object, object]]:
    """(label's extent, its block's extent) of every microbatch label the figure draws, in pixels."""
    import io
    from unittest import mock

    from matplotlib.text import Text

    drawn: list[Text] = []
    original = Text.draw

    def record(self: Text, renderer: object) -> None:
        drawn.append(self)
        original(self, renderer)

    ax = fig.axes[0]  # type: ignore[attr-defined]
    with mock.patch.object(Text, "draw", record):
        fig.savefig(io.BytesIO(), format="png")  # type: ignore[attr-defined]
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    blocks = {(p.get_x() + p.get_width() / 2, p.get_y() + p.get_height() / 2): p for p in ax.patches}
    return [
        (t.get_window_extent(renderer), blocks[t.get_position()].get_window_extent(renderer))
        for t in drawn
        if t in ax.texts
    ]


@pytest.mark.parametrize("width_in", [7.5, 4.2])
def test_plot_labels_only_blocks_that_hold_their_number_at_any_width(width_in: float) -> None:
    """Issue 40: on a phone (the figure drawn 4.2 in wide, text 11 pt) the numbers in narrow
    blocks ran together. A label is drawn inside its own block, as drawn, clear of its edges, or
    not at all."""
    costs = ChainCosts.uniform([1.0, 1.0, 3.0], 2.0)  # a short stage: narrow blocks beside wide ones
    fig = simulate_bounds(costs, [0, 1, 2, 3], "1f1b", 6).plot()
    fig = pickle.loads(pickle.dumps(fig))  # as the site copies a figure to draw it for a phone
    fig.set_size_inches(width_in, fig.get_size_inches()[1])
    for text in fig.axes[0].texts:
        text.set_fontsize(11)
    labels = _drawn_labels(fig)
    assert 0 < len(labels) < len(fig.axes[0].texts), "the wide blocks keep their numbers, the narrow lose them"
    for text, block in labels:  # inside, with half its width of the block's colour on each side
        assert block.x0 + text.width / 2 <= text.x0 and text.x1 + text.width / 2 <= block.x1, (text, block)
    boxes = [text for text, _ in labels]
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))


def test_simulate_uses_the_plan_and_its_costs() -> None:
    import torch
    from torch import nn

    from unitscale import partition

    plan = partition(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)), 2, torch.randn(2, 4))
    assert simulate(plan, "gpipe", 2).step_time == pytest.approx(3 * 20 * 3)


def test_bad_schedule_arguments_say_what_works() -> None:
    costs, bounds = _even(2)
    with pytest.raises(UnknownScheduleError, match="'1f1b'"):
        simulate_bounds(costs, bounds, "pipedream", 2)
    with pytest.raises(StageCountError, match="spread evenly with stages_per_rank=2"):
        simulate_bounds(costs, [0, 1, 2, 3], "interleaved_1f1b", 4, stages_per_rank=2)
    with pytest.raises(StageCountError, match="exactly 2 stages per rank"):
        check_schedule("zbv", 2, 1, 4)
    with pytest.raises(StageCountError, match="one stage per rank"):
        check_schedule("1f1b", 4, 2, 4)
    with pytest.raises(InputError, match=r"num_microbatches=9 .* use num_microbatches in .*multiple of 4"):
        check_schedule("interleaved_1f1b", 8, 2, 9)
    check_schedule("zbv", 6, 2, 4)  # fewer microbatches than stages: torch's ZBV runs it (test_pipeline_schedules)
    with pytest.raises(InputError, match="device_speeds"):
        simulate_bounds(costs, bounds, "1f1b", 2, device_speeds=[1.0, 0.0])
    with pytest.raises(CostError, match="bandwidth=0"):
        ChainCosts.uniform([1.0], bandwidth=0)
    with pytest.raises(CostError, match="n \\+ 1 = 3"):
        ChainCosts((1.0, 1.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0), (0.0, 0.0))
    with pytest.raises(CostError, match="finite and >= 0"):
        ChainCosts.uniform([1.0, math.nan])


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from([("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_zero_bubble", 2), ("zbv", 2)]),
    st.integers(1, 3),
    st.data(),
)
def test_step_times_of_many_plans_match_the_simulator(schedule: tuple[str, int], p: int, data: st.DataObject) -> None:
    import numpy as np

    from unitscale.stages.planner.simulation import step_times
    from unitscale.stages.schedules import valid_microbatches

    name, v = schedule
    k = p * v
    m = data.draw(st.sampled_from([x for x in valid_microbatches(name, p, 5) if x <= 5 or x == 2 * p - 1]))
    f = data.draw(st.lists(st.floats(0, 3), min_size=k + 2, max_size=k + 2))
    b = data.draw(st.lists(st.floats(0, 3), min_size=k + 2, max_size=k + 2))
    sent = data.draw(st.lists(st.floats(0, 2), min_size=k + 1, max_size=k + 1))
    costs = ChainCosts(tuple(f), tuple(b), (0.0,) * (k + 2), (0.0,) * (k + 2), (0.0, *sent, 0.0), 2.0, 0.1)
    speeds = data.draw(st.lists(st.sampled_from([0.5, 1.0, 3.0]), min_size=p, max_size=p))
    plans = [[0, *range(1, k), k + 2], [0, *range(3, k + 2), k + 2]]
    place = stage_ranks(name, p, v)
    fwd = np.array([[sum(f[a:e]) / speeds[place[s]] for s, (a, e) in enumerate(itertools.pairwise(q))] for q in plans])
    bwd = np.array([[sum(b[a:e]) / speeds[place[s]] for s, (a, e) in enumerate(itertools.pairwise(q))] for q in plans])
    comm = np.array([[costs.comm_time(a) for a in q[:-1]] for q in plans])
    batch = step_times(name, p, v, m, fwd, bwd, comm, costs.weight_grad_share)
    for plan, t in zip(plans, batch.tolist(), strict=True):
        assert t == pytest.approx(simulate_bounds(costs, plan, name, m, v, speeds).step_time, rel=1e-12, abs=1e-12)
