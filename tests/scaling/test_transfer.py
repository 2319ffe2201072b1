"""The transfer checks (coordinate check, learning-rate sweep), and the bars of u-μP at small settings."""

import math
from collections import OrderedDict

import pytest
import torch

import unitscale.optim as uopt
from unitscale.errors import InputError, NotCallableError, SweepGridError
from unitscale.examples import MarkovSource
from unitscale.examples.umup_models import SPGPT, UmupGPT, markov_batches
from unitscale.scaling.transfer import CoordCheck, LRSweep, coord_check, lr_sweep

VOCAB = 16


@pytest.fixture(scope="module")
def data():
    return markov_batches(MarkovSource(VOCAB, concentration=0.3), batch=8, seq_len=8)


def umup_model(width):
    return UmupGPT(VOCAB, width, depth=1, head_dim=8, max_len=8)


def sp_model(width):
    return SPGPT(VOCAB, width, depth=1, head_dim=8, max_len=8)


def test_best_lr_stays_put_under_umup_and_drifts_under_sp_across_8x_width(data):
    # The bar at small settings: widths 16 and 128, 12 Adam steps, one-octave grids.
    sp = lr_sweep(sp_model, [16, 128], [2.0**k for k in range(-12, -2)], data, steps=12, optimizer=torch.optim.Adam)
    u = lr_sweep(umup_model, [16, 128], [2.0**k for k in range(-6, 2)], data, steps=12, optimizer=uopt.Adam)
    assert sp.drift_octaves >= 2, sp.table()
    assert u.drift_octaves <= 1, u.table()
    # SP's best lr falls with width (μP predicts ~1/width for hidden weights under Adam).
    assert sp.best_lr[128] < sp.best_lr[16]


def test_best_lr_moves_at_most_one_octave_across_4x_depth_under_umup(data):
    # lr_sweep's ints are whatever make_model scales: here the depth (residual branches scaled
    # by u-μP's depth rule, the optimiser's lr by its depth rule). 60 Adam steps: at 12 the
    # losses are too flat to rank (the best moved 3 octaves). Measured, not contrasted: the
    # standard parametrisation also moved one octave from depth 1 to 4 at these tiny settings.
    sweep = lr_sweep(
        lambda depth: UmupGPT(VOCAB, 32, depth=depth, head_dim=8, max_len=8),
        [1, 4],
        [2.0**k for k in range(-5, -1)],  # the best (2**-4, 2**-3 measured) is inside, away from both ends
        data,
        steps=60,
        optimizer=uopt.Adam,
    )
    assert sweep.drift_octaves <= 1, sweep.table()
    assert 2**-5 <= min(sweep.best_lr.values()) and max(sweep.best_lr.values()) <= 2**-2


def test_coord_check_under_umup_keeps_every_hidden_activation_in_half_to_two_from_64_to_1024():
    tiny = markov_batches(MarkovSource(VOCAB), batch=1, seq_len=8)
    widths = [64, 128, 256, 512, 1024]
    check = coord_check(lambda w: UmupGPT(VOCAB, w, depth=1, max_len=8), widths, tiny, steps=5, lr=2**-3)
    low, high = check.extremes(exclude=["readout"])
    assert 0.5 <= low and high <= 2, check.table()
    assert check.widths == widths and check.steps == 5
    # Logits start at mult * fan_in**-0.5 (μP's readout), and training grows them.
    assert check.init["readout"][-1] == pytest.approx(1024**-0.5, rel=0.3)
    assert all(after > before for before, after in zip(check.init["readout"], check.trained["readout"], strict=True))
    # Every activation changed, by an amount that does not grow with width.
    for kind, change in check.change.items():
        assert change[-1] < 4 * change[0] + 0.1, kind


def test_coord_check_shows_sp_activations_growing_with_width():
    tiny = markov_batches(MarkovSource(VOCAB), batch=1, seq_len=8)
    check = coord_check(
        lambda w: SPGPT(VOCAB, w, depth=1, max_len=8), [32, 256], tiny, steps=5, lr=2**-6, optimizer=torch.optim.Adam
    )
    assert check.trained["blocks.*.down"][1] > 4 * check.trained["blocks.*.down"][0], check.table()


def test_lr_sweep_numbers_are_reproducible_and_consistent(data):
    lrs = [0.5, 0.01, 0.1]
    first = lr_sweep(umup_model, [32, 16], lrs, data, steps=3, tail=2)
    second = lr_sweep(umup_model, [16, 32], sorted(lrs), data, steps=3, tail=2)
    assert first.widths == [16, 32] and first.lrs == [0.01, 0.1, 0.5]
    assert first.losses == second.losses
    for width in first.widths:
        row = first.losses[width]
        assert first.best_lr[width] == first.lrs[row.index(min(row))]
    assert first.drift_octaves == pytest.approx(math.log2(max(first.best_lr.values()) / min(first.best_lr.values())))


def test_a_diverging_run_scores_inf_and_is_never_best(data):
    sweep = lr_sweep(sp_model, [16], [1e-3, 1e-2, 1e6], data, steps=6, optimizer=torch.optim.SGD)
    assert sweep.losses[16][-1] == math.inf and sweep.best_lr[16] != 1e6


def test_tables_and_plots_have_one_row_and_one_curve_per_width_and_kind():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = LRSweep([8, 16], [0.1, 0.2, 0.4], {8: [2.0, 1.0, 3.0], 16: [2.0, 3.0, math.inf]}, {8: 0.2, 16: 0.1}, 1.0)
    assert sweep.table().splitlines()[1].split() == ["8", "2", "1*", "3"]
    fig = sweep.plot()
    assert len(fig.axes[0].get_legend().get_texts()) == 2 and fig.get_size_inches()[0] <= 7.5
    check = CoordCheck([8, 16], 2, {"a": [1.0, 1.1], "b": [0.9, 1.0]}, {"a": [1.2, 1.3], "b": [1.0, 1.0]})
    assert "1 -> 1.2" in check.table().splitlines()[1]
    fig2 = check.plot()
    assert len(fig2.axes) == 2 and len(fig2.axes[0].get_lines()) == 2 and fig2.get_size_inches()[0] <= 7.5
    plt.close("all")


@pytest.mark.parametrize(
    ("lrs", "message"),
    [
        ([0.1, 0.2], r"lrs has 2 point\(s\); pass at least 3"),
        ([], r"lrs has 0 point\(s\)"),
        ([0.1, 0.2, 0.0], "every learning rate must be a finite number > 0"),
        ([0.1, 0.2, math.inf], "every learning rate must be a finite number > 0"),
        ([0.1, 0.2, 0.1], "repeats a learning rate"),
    ],
)
def test_sweep_grids_with_too_few_or_bad_points_are_refused(data, lrs, message):
    with pytest.raises(SweepGridError, match=message):
        lr_sweep(umup_model, [16], lrs, data, steps=1)


def test_bad_widths_steps_data_and_factories_are_refused(data):
    lrs = [0.1, 0.2, 0.4]
    with pytest.raises(SweepGridError, match="widths=.* must be one or more ints >= 1"):
        lr_sweep(umup_model, [], lrs, data, steps=1)
    with pytest.raises(SweepGridError, match="repeats a width"):
        coord_check(umup_model, [16, 16], data)
    with pytest.raises(NotCallableError, match="make_model is a int"):
        lr_sweep(3, [16], lrs, data, steps=1)
    with pytest.raises(NotCallableError, match="optimizer is a str"):
        coord_check(umup_model, [16], data, optimizer="adam")
    with pytest.raises(InputError, match="steps=0"):
        lr_sweep(umup_model, [16], lrs, data, steps=0)
    with pytest.raises(InputError, match=r"tail=5 must be an int in 1..steps=2"):
        lr_sweep(umup_model, [16], lrs, data, steps=2, tail=5)
    with pytest.raises(InputError, match="data is a list"):
        coord_check(umup_model, [16], [1, 2])


def _tiny(width):
    layers = {"embed": torch.nn.Embedding(VOCAB, width), "head": torch.nn.Linear(width, VOCAB)}
    return torch.nn.Sequential(OrderedDict(layers))


@pytest.mark.parametrize("steps", [0, 3])
def test_coord_check_measures_what_a_hand_written_training_loop_gives(data, steps):
    check = coord_check(_tiny, [8, 32], data, steps=steps, optimizer=torch.optim.SGD, lr=0.5)
    for index, width in enumerate([8, 32]):
        torch.manual_seed(0)
        model = _tiny(width)
        x0 = data(0)[0]
        with torch.no_grad():
            before = model(x0)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(steps):
            x, y = data(step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
            opt.step()
        with torch.no_grad():
            after = model(x0)
        assert check.init["head"][index] == pytest.approx(before.std(correction=0).item(), rel=1e-5)
        assert check.trained["head"][index] == pytest.approx(after.std(correction=0).item(), rel=1e-5)
        assert check.change["head"][index] == pytest.approx((after - before).std(correction=0).item(), abs=1e-6)


def test_coord_check_shows_a_diverged_run_as_nan_after_training(data):
    check = coord_check(_tiny, [8], data, steps=3, optimizer=torch.optim.SGD, lr=1e38)
    assert math.isfinite(check.init["head"][0])
    assert math.isnan(check.trained["head"][0]) and math.isnan(check.change["head"][0])
