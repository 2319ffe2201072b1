"""ScaleMonitor: its numbers, when it records, that it leaves the model as it was, and its errors."""

from __future__ import annotations

import math

import matplotlib
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale.errors import (
    InputError,
    MonitorSettingError,
    MonitorStateError,
    NoRecordsError,
    NotAModuleError,
    UnknownStatError,
)
from unitscale.examples import TinyGPT
from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FPFormat
from unitscale.tracking import MonitorRecord, ScaleHistory, ScaleMonitor, cast_stats, track_scales
from unitscale.tracking.format_casts import (
    CastBatch,
    Scratch,
    finish_cast_stats,
    raw_cast_stats,
    rounding_error,
)
from unitscale.tracking.recording import ScaleRecording, Step
from unitscale.tracking.stats import std_stat

matplotlib.use("Agg")


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _normed_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.LayerNorm(16, elementwise_affine=False), nn.Linear(16, 4)
    )


def _train(model: nn.Module, monitor: ScaleMonitor, steps: int, lr: float = 0.01, hook=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(1)
    for step in range(steps):
        if hook is not None:
            hook(step)
        with monitor.step():
            model(torch.randn(32, 8, generator=gen)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()


# Numbers --------------------------------------------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 300), st.floats(-12, 12), st.integers(0, 2**31 - 1))
def test_std_and_absmax_equal_torchs(n: int, log2_scale: float, seed: int) -> None:
    t = torch.randn(n, generator=torch.Generator().manual_seed(seed)) * 2.0**log2_scale
    s = cast_stats(t, FP8_E4M3)
    assert s.std == pytest.approx(torch.std(t, correction=0).item(), rel=1e-4)
    assert s.absmax == t.abs().max().item()


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.integers(1, 40), st.integers(0, 40))
def test_underflow_and_overflow_fractions_are_exact(zeros: int, small: int, normal: int, big: int) -> None:
    fmt = FP8_E4M3
    t = torch.cat(
        [
            torch.zeros(zeros),
            torch.full((small,), fmt.min_subnormal * 0.75),  # below the smallest subnormal
            torch.full((normal,), 1.5),
            torch.full((big,), -fmt.max_value * 2),  # above the largest value
        ]
    )
    s = cast_stats(t, fmt)
    nonzero = small + normal + big
    assert s.underflow == small / nonzero
    assert s.overflow == big / nonzero


def test_fractions_of_an_all_zero_tensor_are_zero_and_its_sqnr_inf() -> None:
    s = cast_stats(torch.zeros(5), FP8_E4M3)
    assert (s.underflow, s.overflow, s.sqnr_db) == (0.0, 0.0, math.inf)


def test_sqnr_is_inf_on_values_the_format_holds_exactly() -> None:
    exact = torch.tensor([0.0, 1.0, -2.5, 448.0, FP8_E4M3.min_subnormal, 1.125])
    assert cast_stats(exact, FP8_E4M3).sqnr_db == math.inf
    assert cast_stats(exact, FP8_E5M2).sqnr_db < math.inf  # 1.125 needs 3 mantissa bits


def test_sqnr_matches_its_definition_and_mantissa_bits() -> None:
    t = torch.randn(10_000, generator=torch.Generator().manual_seed(0))
    q = FP8_E4M3.round(t)
    expected = 10 * math.log10((t * t).sum().item() / ((t - q) ** 2).sum().item())
    assert cast_stats(t, FP8_E4M3).sqnr_db == pytest.approx(expected, rel=1e-4)
    # Each mantissa bit halves the rounding error: +6.02 dB (20 log10 2) per bit.
    e5m2, e4m3, fp16 = (cast_stats(t, fmt).sqnr_db for fmt in (FP8_E5M2, FP8_E4M3, FP16))
    assert e4m3 - e5m2 == pytest.approx(6.02, abs=0.5)
    assert fp16 - e4m3 == pytest.approx(7 * 6.02, abs=0.5)


@settings(max_examples=30, deadline=None)
@given(st.sampled_from([FP8_E4M3, FP8_E5M2, FP16, BF16]), st.floats(-30, 20), st.integers(0, 2**31 - 1))
def test_fast_rounding_error_equals_the_formats_own_rounding(fmt: FPFormat, log2_scale: float, seed: int) -> None:
    t = torch.randn(500, generator=torch.Generator().manual_seed(seed)) * 2.0**log2_scale
    t = torch.cat([t, torch.tensor([0.0, -0.0, math.inf, -math.inf, 1e30, fmt.min_subnormal / 2])])
    expected = fmt.round(t) - t
    assert torch.equal(rounding_error(t, fmt, Scratch()).nan_to_num(nan=7.0), expected.nan_to_num(nan=7.0))


def test_nan_gives_nan_sqnr() -> None:
    assert math.isnan(cast_stats(torch.tensor([1.0, float("nan")]), FP8_E4M3).sqnr_db)


def test_monitor_records_the_numbers_of_the_tensors_it_saw() -> None:
    model = _net()
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(3))
    seen: dict[str, torch.Tensor] = {}
    handles = [model[0].register_forward_hook(lambda m, a, out: seen.__setitem__("0", out.detach().clone()))]
    with ScaleMonitor(model, every=1) as monitor, monitor.step():
        y = model(x)
        y.retain_grad()
        y.sum().backward()
    handles[0].remove()
    rec = {(r.tensor, r.direction): r for r in monitor.history}
    assert rec["0", "fwd"].std == pytest.approx(seen["0"].std(correction=0).item(), rel=1e-5)
    assert rec["0", "fwd"].absmax == seen["0"].abs().max().item()
    assert rec["2", "bwd"].std == pytest.approx(y.grad.std(correction=0).item(), abs=1e-7)  # all ones: std 0
    w = model[0].weight
    assert rec["0.weight", "fwd"].std == pytest.approx(w.std(correction=0).item(), rel=1e-5)
    assert rec["0.weight", "bwd"].std == pytest.approx(w.grad.std(correction=0).item(), rel=1e-5)
    assert rec["0.weight", "bwd"].sqnr_db == pytest.approx(cast_stats(w.grad, FP8_E5M2).sqnr_db)
    assert {r.kind for r in monitor.history if r.tensor.endswith(("weight", "bias"))} == {"parameter"}


# When it records ------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(st.integers(1, 7), st.integers(1, 20))
def test_records_only_at_multiples_of_every(every: int, steps: int) -> None:
    model = _net()
    monitor = ScaleMonitor(model, every=every)
    _train(model, monitor, steps)
    assert monitor.history.steps == list(range(0, steps, every))


def test_explicit_step_numbers_decide_and_yield_whether_it_records() -> None:
    model = _net()
    monitor = ScaleMonitor(model, every=5)
    flags = []
    for step in (3, 5, 7, 10):
        with monitor.step(step) as recording:
            model(torch.randn(2, 8)).sum().backward()
        flags.append(recording)
    assert flags == [False, True, False, True]
    assert monitor.history.steps == [5, 10]
    with monitor.step() as recording:  # counts on from the last step given
        pass
    assert not recording


def test_a_parent_returning_its_childs_output_is_recorded_once() -> None:
    monitor = ScaleMonitor(_net(), every=1, parameters=False)
    with monitor.step():
        monitor.model(torch.randn(4, 8)).sum().backward()
    names = [r.tensor for r in monitor.history if r.direction == "fwd"]
    assert names == ["0", "1", "2"]  # the Sequential's output is "2"'s: no "(root)" row


def test_inplace_module_output_is_recorded_under_its_own_name() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(inplace=True))
    monitor = ScaleMonitor(model, every=1, parameters=False)
    with monitor.step():
        model(torch.randn(64, 4)).sum().backward()
    fwd = {r.tensor: r for r in monitor.history if r.direction == "fwd"}
    assert set(fwd) == {"0", "1"}
    assert fwd["1"].std < fwd["0"].std  # the ReLU's output, measured after it zeroed the negatives


def test_failed_step_records_nothing_and_leaves_no_hooks() -> None:
    model = _net()
    monitor = ScaleMonitor(model, every=1)
    with pytest.raises(ZeroDivisionError), monitor.step():
        model(torch.randn(2, 8))
        raise ZeroDivisionError
    assert len(monitor.history) == 0
    assert all(not m._forward_hooks for m in model.modules())
    with monitor.step():  # usable again
        model(torch.randn(2, 8)).sum().backward()
    assert monitor.history.steps == [1]


# The model is left as it was -------------------------------------------------------------------


def _hooks(model: nn.Module) -> list[int]:
    return [
        len(getattr(m, a))
        for m in model.modules()
        for a in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_forward_hooks_with_kwargs")
    ]


def test_hooks_are_removed_and_the_model_is_unchanged() -> None:
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=1, n_heads=2, seq_len=8)
    idx = torch.randint(0, 16, (2, 8))
    before_out = model(idx).detach()
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before_hooks, before_dict = _hooks(model), set(vars(model))
    monitor = ScaleMonitor(model, every=2)
    for step in range(3):
        with monitor.step():
            model(idx).sum().backward()
            if step == 0:
                assert sum(_hooks(model)) > 0  # armed while a record step runs
        model.zero_grad(set_to_none=True)
        assert _hooks(model) == before_hooks  # disarmed between steps
    monitor.close()
    assert _hooks(model) == before_hooks and set(vars(model)) == before_dict
    assert all(p._post_accumulate_grad_hooks is None for p in model.parameters())
    assert all(torch.equal(v, before_state[k]) for k, v in model.state_dict().items())
    assert torch.equal(model(idx), before_out)


def test_closed_monitor_refuses_steps_and_nested_steps_are_refused() -> None:
    monitor = ScaleMonitor(_net())
    with monitor.step(), pytest.raises(MonitorStateError, match="already open"), monitor.step():
        pass
    monitor.close()
    with pytest.raises(MonitorStateError, match="closed"), monitor.step():
        pass


# Drift ----------------------------------------------------------------------------------------


def test_a_weight_scaled_by_2_to_the_8_mid_training_drifts_first() -> None:
    model = _normed_net()  # the layer norm after layer 2 keeps the jump from spreading downstream
    monitor = ScaleMonitor(model, every=2)

    def bump(step: int) -> None:
        if step == 5:
            with torch.no_grad():
                model[2].weight.mul_(2.0**8)

    _train(model, monitor, 10, lr=1e-3, hook=bump)
    top = monitor.drifted(top=5)
    # layer 2's weight and output go up 8 octaves, the gradients reaching them down about 8
    assert {d.tensor for d in top} <= {"2", "2.weight", "2.bias"}
    assert all(abs(d.octaves) > 6 for d in top)
    assert all(abs(d.octaves) < 1 for d in monitor.drifted(top=20)[len(top) + 1 :])
    weight = monitor.drifted(top=1, kind="parameter", direction="fwd")[0]
    assert (weight.tensor, weight.first_step, weight.last_step) == ("2.weight", 0, 8)
    assert weight.octaves == pytest.approx(8.0, abs=0.05)
    assert "2.weight" in repr(monitor.drifted())


def test_drift_leaves_out_zero_std_and_ranks_by_absmax_on_request() -> None:
    records = [MonitorRecord(s, "ln.weight", "parameter", "fwd", 0.0, 1.0 + s, 0, 0, math.inf) for s in (0, 10)] + [
        MonitorRecord(s, "fc", "activation", "fwd", 1.0 + s, 2.0, 0, 0, 30.0) for s in (0, 10)
    ]
    history = ScaleHistory(records)
    assert [d.tensor for d in history.drifted()] == ["fc"]
    assert [d.tensor for d in history.drifted(stat="absmax")] == ["ln.weight", "fc"]
    assert history.drifted(stat="absmax")[0].octaves == pytest.approx(math.log2(11))


@given(st.integers(-1074, 1023), st.integers(-1074, 1023))
@settings(max_examples=60, deadline=None)
def test_drift_in_octaves_is_exact_for_stds_far_apart(first: int, last: int) -> None:
    """Stds 2**first then 2**last drift by last - first octaves, integer arithmetic the oracle.

    The ratio of the two leaves float range where they are far apart (1e10 over 1e-300 is inf,
    1e-310 over 1e300 is 0); the drift must not.
    """
    records = [MonitorRecord(s, "fc", "activation", "fwd", 2.0**e, 1.0, 0, 0, 30.0) for s, e in ((0, first), (9, last))]
    drifts = ScaleHistory(records).drifted()
    assert [d.octaves for d in drifts] == [float(last - first)]


# Heat map -------------------------------------------------------------------------------------


@pytest.mark.parametrize("stat", ["std", "absmax", "underflow", "overflow", "sqnr_db"])
def test_heatmap_is_a_tensor_by_step_grid_that_fits_the_page(stat: str) -> None:
    import matplotlib.pyplot as plt

    model = _net()
    monitor = ScaleMonitor(model, every=2)
    _train(model, monitor, 5)
    fig = monitor.heatmap(stat)
    assert fig.get_size_inches()[0] <= 7.5
    assert [ax.get_title().split()[0] for ax in fig.axes[:2]] == ["forward", "backward"]
    image = fig.axes[0].images[0].get_array()
    assert image.shape == (len(monitor.history.tensors()), 3)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[:3] == ["0", "1", "2"] and "0.weight" in labels
    sizes = [t.get_fontsize() for ax in fig.axes for t in ax.get_yticklabels() + ax.get_xticklabels()]
    assert min(sizes) >= 9
    if stat == "std":
        row = [r for r in monitor.history if r.tensor == "0" and r.direction == "fwd"]
        assert image[0, 0] == pytest.approx(math.log2(row[0].std))
    plt.close(fig)


def test_relative_heatmap_starts_every_row_at_zero() -> None:
    import matplotlib.pyplot as plt

    model = _net()
    monitor = ScaleMonitor(model, every=1)
    _train(model, monitor, 3, lr=0.5)
    fig = monitor.heatmap(direction="fwd", kind="activation", relative=True)
    image = fig.axes[0].images[0].get_array()
    assert len(fig.axes) == 2  # one panel and its colour bar
    assert list(image[:, 0]) == [0.0, 0.0, 0.0]
    plt.close(fig)


# Real models ----------------------------------------------------------------------------------


def test_tinygpt_records_every_layer_in_both_directions() -> None:
    model = TinyGPT(vocab_size=16, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    with ScaleMonitor(model, every=1) as monitor, monitor.step():
        model(torch.randint(0, 16, (2, 8))).sum().backward()
    acts = monitor.history.tensors("activation")
    assert acts[:3] == ["tok_emb", "pos_emb", "blocks.0.ln1"]
    assert "blocks.1" in acts and acts[-1] == "head"  # block outputs (the residual stream) are rows
    assert "blocks.0.attn" not in acts  # its output is its proj's
    bwd = {r.tensor for r in monitor.history if r.direction == "bwd" and r.kind == "activation"}
    assert bwd == set(acts)
    params = {r.tensor for r in monitor.history if r.kind == "parameter" and r.direction == "bwd"}
    assert params == {n for n, _ in model.named_parameters()}


def test_llama_from_transformers() -> None:
    real_models = pytest.importorskip("tests.real_models")
    model, (ids,) = real_models.llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with ScaleMonitor(model, every=1) as monitor, monitor.step():
        model(ids).logits.float().pow(2).mean().backward()
    acts = monitor.history.tensors("activation")
    assert "model.layers.0.self_attn.q_proj" in acts and "model.layers.1.mlp.down_proj" in acts
    assert acts[-1] == "lm_head"
    assert all(math.isfinite(r.std) for r in monitor.history)
    assert {r.tensor for r in monitor.history if r.direction == "bwd"} >= {"lm_head", "model.layers.1"}
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(not m._forward_hooks for m in model.modules())


# Errors ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("every", [0, -3, 2.5, "10", True])
def test_every_must_be_a_positive_int(every: object) -> None:
    with pytest.raises(MonitorSettingError, match=r"every=.* must be an int >= 1"):
        ScaleMonitor(_net(), every=every)  # type: ignore[arg-type]


def test_bad_settings_are_typed_errors() -> None:
    with pytest.raises(NotAModuleError, match="not a torch.nn.Module"):
        ScaleMonitor(lambda x: x)  # type: ignore[arg-type]
    with pytest.raises(MonitorSettingError, match="fwd_format=.*FPFormat"):
        ScaleMonitor(_net(), fwd_format="e4m3")  # type: ignore[arg-type]
    with pytest.raises(MonitorSettingError, match="step=-1"), ScaleMonitor(_net()).step(-1):
        pass


def test_heatmap_and_drift_errors() -> None:
    monitor = ScaleMonitor(_net())
    with pytest.raises(NoRecordsError, match="nothing recorded"):
        monitor.heatmap()
    with pytest.raises(NoRecordsError, match="nothing recorded"):
        monitor.drifted()
    _train(monitor.model, monitor, 1)
    with pytest.raises(UnknownStatError, match="stat='mean' is not known; use one of std, absmax"):
        monitor.heatmap("mean")
    with pytest.raises(UnknownStatError, match="use one of std, absmax$"):
        monitor.drifted(stat="sqnr_db")
    with pytest.raises(InputError, match="direction='forward'"):
        monitor.heatmap(direction="forward")
    with pytest.raises(InputError, match="top=0"):
        monitor.drifted(top=0)
    assert issubclass(NoRecordsError, RuntimeError) and issubclass(UnknownStatError, ValueError)


# The fast paths equal the plain definitions ---------------------------------------------------


def _plain_raw(x: torch.Tensor, fmt: FPFormat) -> tuple[float, ...]:
    """raw_cast_stats as first written: one torch op per statistic, fmt.round for the cast."""
    x = x.detach().float().reshape(-1)
    a = x.abs()
    error = fmt.round(x) - x
    return (
        std_stat(x),
        a.max().item(),
        torch.count_nonzero(x).item(),
        torch.count_nonzero((a > 0) & (a < fmt.min_subnormal)).item(),
        torch.count_nonzero(a > fmt.max_value).item(),
        torch.linalg.vector_norm(x, dtype=torch.float64).item() ** 2,  # float32's squares under- and overflow
        torch.linalg.vector_norm(error, dtype=torch.float64).item() ** 2,
    )


_SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan, 1e30, 1e-40, 448.0, 460.0, 2.0**-10]


def _values(n: int, log2_scale: float, seed: int, zeros: float, special: int, offset: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=gen) * 2.0**log2_scale + offset
    t[torch.rand(n, generator=gen) < zeros] = 0.0
    if special >= 0:
        t[0] = _SPECIALS[special]
    return t


_FORMATS = st.sampled_from([FP8_E4M3, FP8_E5M2, FP16, BF16, FPFormat(3, 1), FPFormat(6, 4, infinities=False)])
_TENSORS = st.builds(
    _values,
    st.integers(1, 3000),
    st.floats(-30, 25),
    st.integers(0, 2**31 - 1),
    st.sampled_from([0.0, 0.0, 0.5]),
    st.integers(-5, len(_SPECIALS) - 1),
    st.sampled_from([0.0, 0.0, 5.0]),
)


def _same(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


@settings(max_examples=60, deadline=None)
@given(_TENSORS, _FORMATS)
def test_raw_cast_stats_are_bit_identical_to_the_plain_definitions(t: torch.Tensor, fmt: FPFormat) -> None:
    # abs once, float 0/1 counts, the magic-number rounding and the shared dot product change
    # how the numbers are computed, not one bit of them; the two sums of squares (float32 dot
    # products where they stay in float32's range) only in their last digits
    got, plain = tuple(float(v) for v in raw_cast_stats(t, fmt)), _plain_raw(t, fmt)
    assert _same(got[:5], plain[:5])
    assert got[5:] == pytest.approx(plain[5:], rel=1e-5, nan_ok=True)


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.integers(0, 23), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))
def test_magic_number_rounding_equals_the_formats_own(e: int, m: int, inf: bool, saturate: bool, seed: int) -> None:
    if not inf and m == 0:
        return
    fmt = FPFormat(e, m, infinities=inf, saturate=saturate)
    if fmt.max_value > torch.finfo(torch.float32).max:  # an 8-bit "fn" format: float32 cannot simulate it
        return
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(2000, generator=gen) * 2.0 ** (torch.rand(2000, generator=gen) * 60 - 30)
    t = torch.cat([t, fmt.min_subnormal * torch.tensor([0.5, 1.5, 2.5, -0.5]), torch.tensor([0.0, fmt.max_value])])
    expected = fmt.round(t) - t
    assert torch.equal(rounding_error(t, fmt, Scratch()).nan_to_num(nan=7.0), expected.nan_to_num(nan=7.0))


@settings(max_examples=40, deadline=None)
@given(st.lists(_TENSORS, min_size=1, max_size=6), _FORMATS, st.booleans())
def test_a_batch_measures_as_raw_cast_stats_does(tensors: list[torch.Tensor], fmt: FPFormat, constant: bool) -> None:
    if constant:
        tensors = tensors + [torch.full((len(tensors[0]),), 0.1), torch.full((3,), -7.0)]
    batch = CastBatch(fmt)
    assert [batch.add(t) for t in tensors] == list(range(len(tensors)))
    for t, row in zip(tensors, batch.finish(), strict=True):
        own = tuple(float(v) for v in raw_cast_stats(t, fmt))
        assert _same(row[1:5], own[1:5])  # abs-max and counts: identical
        for got, want in zip(finish_cast_stats(row), finish_cast_stats(own), strict=True):
            assert got == pytest.approx(want, rel=1e-5, abs=1e-4, nan_ok=True)
        if not t.isfinite().all():
            assert _same(row, own)  # measured again by raw_cast_stats itself
        if t.numel() > 1 and bool((t == t[0]).all()):
            assert row[0] == 0.0 and own[0] <= 1e-12 * abs(t[0].item())  # a constant tensor's std is 0 (all zeros too)
    assert len(batch) == 0  # finish empties it


@settings(max_examples=20, deadline=None)
@given(_TENSORS, _FORMATS)
@example(torch.tensor([5.0001, 5.0]), FP8_E4M3)  # found by hypothesis: a float32 mean cancelled digits
def test_the_device_path_agrees_with_the_host_path(t: torch.Tensor, fmt: FPFormat) -> None:
    host = tuple(float(v) for v in raw_cast_stats(t, fmt))
    with pytest.MonkeyPatch.context() as patch:  # as on a GPU: nothing read until the end
        for module in ("format_casts", "stats"):
            patch.setattr(f"unitscale.tracking.{module}.reads_at_once", lambda device: False)
        left = raw_cast_stats(t, fmt, Scratch())
    assert all(isinstance(v, torch.Tensor) or isinstance(v, int) for v in left)
    device = tuple(float(v) for v in left)
    assert _same(device[1:5], host[1:5])
    assert device == pytest.approx(host, rel=1e-5, abs=1e-30, nan_ok=True)


def test_monitor_records_small_and_large_tensors_as_cast_stats_measures_them() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(inplace=True), nn.Linear(256, 4))
    x = torch.randn(64, 64)
    seen: dict[str, torch.Tensor] = {}
    hook = model[0].register_forward_hook(lambda m, a, out: seen.__setitem__("0", out.detach().clone()))
    with ScaleMonitor(model, every=1) as monitor, monitor.step():
        model(x).pow(2).sum().backward()
    hook.remove()
    rec = {(r.tensor, r.direction): r for r in monitor.history}
    for key, t, fmt in [
        (("0", "fwd"), seen["0"], FP8_E4M3),  # 16384 elements: measured at once
        (("2", "fwd"), model(x).detach(), FP8_E4M3),  # 256: batched
        (("0.weight", "bwd"), model[0].weight.grad, FP8_E5M2),  # 16384
        (("2.bias", "bwd"), model[2].bias.grad, FP8_E5M2),  # 4: batched
    ]:
        want = cast_stats(t, fmt)
        got = rec[key]
        assert (got.absmax, got.underflow, got.overflow) == (want.absmax, want.underflow, want.overflow)
        assert (got.std, got.sqnr_db) == pytest.approx((want.std, want.sqnr_db), rel=1e-5)


@pytest.mark.parametrize("rows", [16, 2**17 // 16 + 1])  # measured in the step's batch / where the hook meets it
def test_monitor_numbers_equal_eager_tracking_and_torchs(rows: int) -> None:
    """A module's output and its gradient: the monitor, ``track_scales(route="eager")`` and torch agree."""
    gen = torch.Generator().manual_seed(rows)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
    x = torch.randn(rows, 8, generator=gen)
    g = torch.randn(rows, 4, generator=gen)
    seen: list[torch.Tensor] = []

    def keep(module: nn.Module, args: object, out: torch.Tensor) -> None:
        out.retain_grad()
        seen.append(out)

    handle = model[0].register_forward_hook(keep)
    with ScaleMonitor(model, every=1) as monitor, monitor.step():
        model(x).backward(g)  # the model's own backward pass
    handle.remove()
    out = seen[0]
    assert out.grad is not None
    torch_fwd, torch_bwd = out.std(correction=0).item(), out.grad.std(correction=0).item()
    rec = {(r.tensor, r.direction): r for r in monitor.history}
    (row,) = [r for r in track_scales(model, x, backward=g, route="eager") if r.module_path == "0"]
    for mine, eager, torchs in (
        (rec["0", "fwd"].std, row.forward, torch_fwd),
        (rec["0", "bwd"].std, row.backward, torch_bwd),
    ):
        assert eager == pytest.approx(torchs, rel=1e-5)
        assert mine == pytest.approx(eager, rel=1e-5)


def test_a_gradient_reaching_two_module_outputs_is_measured_once_with_torchs_std() -> None:
    """Both operands of an add get the one gradient tensor: one measure (scale tracking's recording), two rows."""

    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x) + self.b(x)

    model, gen = Two(), torch.Generator().manual_seed(0)
    x, g = torch.randn(8, 4, generator=gen), torch.randn(8, 4, generator=gen)
    added: list[int] = []
    with pytest.MonkeyPatch.context() as patch, ScaleMonitor(model, every=1, parameters=False) as monitor:
        add = CastBatch.add
        patch.setattr(CastBatch, "add", lambda self, t: added.append(t.numel()) or add(self, t))
        with monitor.step():
            model(x).backward(g)
    rec = {(r.tensor, r.direction): r.std for r in monitor.history}
    assert rec["a", "bwd"] == rec["b", "bwd"] == pytest.approx(g.std(correction=0).item(), rel=1e-5)
    assert len(added) == 3 + 1  # a, b, (root) forward; the one gradient all three get


@pytest.mark.parametrize("width", [8, 512])  # 512 x 512 weights: past BATCH_LIMIT, measured alone
def test_parameters_are_recorded_by_scale_trackings_one_recording_function(width: int) -> None:
    """Every parameter goes through ``ScaleRecording.record``, and its numbers are torch's (value, ``.grad``)."""
    torch.manual_seed(width)
    model = nn.Sequential(nn.Linear(width, width), nn.Tanh(), nn.Linear(width, 2))
    recorded: list[str] = []
    record = ScaleRecording.record

    def spy(self: ScaleRecording, value: object, step: Step, source: object = None) -> object:
        recorded.append(step.name)
        return record(self, value, step, source)

    with pytest.MonkeyPatch.context() as patch, ScaleMonitor(model, every=1) as monitor:
        patch.setattr(ScaleRecording, "record", spy)
        with monitor.step():
            model(torch.randn(16, width)).pow(2).mean().backward()
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in recorded if n in names] == names
    rec = {(r.tensor, r.direction): r for r in monitor.history if r.kind == "parameter"}
    assert len(rec) == 2 * len(names)
    for name, p in model.named_parameters():
        assert p.grad is not None
        assert rec[name, "fwd"].std == pytest.approx(p.detach().std(correction=0).item(), rel=1e-5)
        assert rec[name, "bwd"].std == pytest.approx(p.grad.std(correction=0).item(), rel=1e-5)
        assert rec[name, "fwd"].absmax == p.detach().abs().max().item()
