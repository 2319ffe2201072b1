"""ScalePair printing, std recording on the device, ScaleTracker, format ranges."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from unitscale.tracking import ScalePair, ScaleTracker
from unitscale.tracking.report import FORMAT_RANGES, ScaleRow, read_rows
from unitscale.tracking.stats import ScaleRecord, abs_max_stat, std_stat


@pytest.mark.parametrize(
    ("pair", "text"),
    [
        (ScalePair(1.0, 0.23649), "(-> 1.0, <- 0.236)"),
        (ScalePair(0.5776, 0.2041), "(-> 0.578, <- 0.204)"),
        (ScalePair(123456.0, 1.5e-7), "(-> 123000.0, <- 1.5e-07)"),
        (ScalePair(None, 2.0), "(-> n/a, <- 2.0)"),
        (ScalePair(), "(-> n/a, <- n/a)"),
        (ScalePair(math.inf, math.nan), "(-> inf, <- nan)"),
    ],
)
def test_scale_pair_prints_three_significant_digits_and_na(pair: ScalePair, text: str) -> None:
    assert repr(pair) == text
    assert str(pair) == text


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 7), min_size=1, max_size=3),
    scale=st.floats(1e-3, 1e3),
    shift=st.floats(-10, 10),
    seed=st.integers(0, 2**16),
)
def test_std_stat_matches_torch_std(shape: list[int], scale: float, shift: float, seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64) * scale + shift
    got = std_stat(x)
    assert got == pytest.approx(torch.std(x, correction=0).item(), rel=1e-9, abs=1e-12)


def test_std_stat_stays_accurate_when_the_mean_dwarfs_the_std() -> None:
    torch.manual_seed(0)
    x = torch.randn(100_000) * 1e-3 + 1e3  # a sum of squares would lose every digit here
    got = std_stat(x)
    assert got == pytest.approx(torch.std(x.double(), correction=0).item(), rel=1e-2)
    assert std_stat(torch.full((1000,), 3.7)) < 1e-6  # type: ignore[operator]


def test_std_stat_of_empty_is_none_and_of_one_element_is_zero() -> None:
    assert std_stat(torch.empty(0, 3)) is None
    assert abs_max_stat(torch.empty(0)) is None
    assert std_stat(torch.tensor([[2.5]])) == 0.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_std_stat_of_low_precision_is_computed_in_float32(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.randn(4096) * 300).to(dtype)  # squares overflow float16
    got = std_stat(x)
    assert got == pytest.approx(x.float().std(correction=0).item(), rel=1e-6)


def test_abs_max_stat_is_the_largest_magnitude() -> None:
    assert abs_max_stat(torch.tensor([1.0, -7.0, 3.0])) == 7.0


def test_scale_tracker_records_forward_and_gradient_std() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8, requires_grad=True)
    record = ScaleRecord()
    y = ScaleTracker.apply(x, record)
    grad = torch.randn(64, 8) * 3
    y.backward(grad)
    forward, backward = record.forward, record.backward  # floats on the CPU
    assert forward == pytest.approx(x.std(correction=0).item(), rel=1e-6)
    assert backward == pytest.approx(grad.std(correction=0).item(), rel=1e-6)
    torch.testing.assert_close(x.grad, grad)  # identity in both directions


def test_read_rows_reads_every_value_with_one_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("unitscale.tracking.stats.reads_at_once", lambda device: False)  # as on an accelerator
    entries = []
    for i in range(5):
        r = ScaleRecord()
        r.fill(torch.arange(4.0) * i, abs_max=True)
        r.fill(torch.arange(3.0, dtype=torch.float64), "backward")
        entries.append((ScaleRow(f"x{i}", "", "input", (4,), "float32"), r))
    expected = 2 * torch.arange(4.0).std(correction=0).item()
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(1) or original(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("item() syncs once per tensor"))
    rows = read_rows(entries)
    assert len(calls) == 2  # one per (device, dtype): float32 forward stds, float64 grads
    assert rows[2][5:] == (pytest.approx(expected), pytest.approx((2 / 3) ** 0.5), 6.0)  # 0, 1, 2: variance 2/3
    assert [row.node for row in rows] == [f"x{i}" for i in range(5)]


def test_format_ranges_match_torch_finfo() -> None:
    for name, dtype in [
        ("FP16", torch.float16),
        ("BF16", torch.bfloat16),
        ("FP8 E4M3", torch.float8_e4m3fn),
        ("FP8 E5M2", torch.float8_e5m2),
    ]:
        info = torch.finfo(dtype)
        low, high = FORMAT_RANGES[name]
        assert high == info.max
        mantissa_bits = round(-math.log2(info.eps))
        assert low == info.smallest_normal * 2.0**-mantissa_bits
    assert FORMAT_RANGES["FP8 E4M3"] == (2.0**-9, 448.0)
    assert FORMAT_RANGES["FP8 E5M2"] == (2.0**-16, 57344.0)


def test_scratch_space_gives_the_same_stds_and_is_released() -> None:
    from unitscale.tracking import stats as scale

    torch.manual_seed(0)
    tensors = [
        torch.randn(50, 30).t(),  # dense, transposed: read in place
        torch.randn(7),
        torch.randn(3, 4, 5, dtype=torch.float64),
        torch.randn(40, 60)[:, :50],  # not dense: copied into the scratch buffer
        torch.randn(1000) + 50,  # mean above the std: taken again about the mean, no scratch
    ]
    scale._scratch.kept = None
    with scale.scratch_space():
        got = [std_stat(t) for t in tensors]
        buffer = scale._scratch.buffer
        assert buffer.numel() == 2000
    for t, g in zip(tensors, got, strict=True):
        assert g == pytest.approx(torch.std(t.double(), correction=0).item(), rel=1e-5)
    assert getattr(scale._scratch, "buffer", None) is None
    assert scale._scratch.kept is buffer  # small: kept for the next call
    with scale.scratch_space():
        assert scale._scratch.buffer is buffer
        std_stat(torch.randn(3000, 2000)[:, :1500])  # 18 MB: over the limit
    assert scale._scratch.kept is None  # released


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 300_000),
    scale=st.floats(1e-4, 1e4),
    shift=st.floats(-1e3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_cpu_std_of_float32_matches_float64_std(n: int, scale: float, shift: float, seed: int) -> None:
    torch.manual_seed(seed)
    x = torch.randn(n) * scale + shift
    expected = torch.std(x.double(), correction=0).item()
    got = std_stat(x)
    assert isinstance(got, float)  # read at once on the CPU
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-30)


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(2, 200_000),
    ratio=st.floats(1.5, 1e5),
    sign=st.sampled_from([-1.0, 1.0]),
    seed=st.integers(0, 2**16),
)
# found by Hypothesis: BLAS's float32 dot biased the squares of deviations quantised by the mean's ulp
@example(n=94_004, ratio=71669.0, sign=-1.0, seed=2)
@example(n=200_000, ratio=7e4, sign=-1.0, seed=14)
def test_cpu_std_where_the_mean_dwarfs_the_std_matches_float64_std(
    n: int, ratio: float, sign: float, seed: int
) -> None:
    # mean > std sends std_stat around the mean: the float32 sums of the deviations keep 5 digits
    torch.manual_seed(seed)
    x = torch.randn(n) + sign * ratio
    got = std_stat(x)
    assert got == pytest.approx(torch.std(x.double(), correction=0).item(), rel=1e-5)


def test_cpu_std_of_a_constant_tensor_is_zero_to_the_last_digit_of_its_mean() -> None:
    assert std_stat(torch.ones(512)) == 0.0  # a norm's weight: its sums are exact
    for value in (-3.7, 1e20, 1e-20):
        got = std_stat(torch.full((512,), value))
        assert isinstance(got, float) and got <= 1e-14 * abs(value)


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.randn(8, 16, 5, 5).to(memory_format=torch.channels_last),
        lambda: torch.randn(4, 6, 10).transpose(0, 2),
        lambda: torch.randn(30, 40)[::2, 5:],
        lambda: torch.randn(1, 64).expand(32, 64),
        lambda: torch.randn(3, 4, 5).permute(2, 0, 1)[1:],
    ],
    ids=["channels_last", "transposed", "strided_slice", "expanded", "permuted_slice"],
)
def test_cpu_std_of_any_layout_matches_torch_std(make: Any) -> None:
    torch.manual_seed(0)
    x = make()
    assert std_stat(x) == pytest.approx(torch.std(x.double(), correction=0).item(), rel=1e-5)


def test_cpu_std_of_non_finite_values_is_nan_or_inf_like_torch_std() -> None:
    x = torch.randn(1000)
    x[3] = math.inf
    assert math.isnan(std_stat(x))  # type: ignore[arg-type]
    x[3] = math.nan
    assert math.isnan(std_stat(x))  # type: ignore[arg-type]
    big = torch.randn(1000) * 1e30  # finite, but its squares overflow float32
    assert std_stat(big) == pytest.approx(torch.std(big.double(), correction=0).item(), rel=1e-6)


def test_a_scratch_space_never_exited_leaves_a_later_one_whole_when_collected() -> None:
    import gc

    from unitscale.tracking import stats as scale

    abandoned = scale.scratch_space()
    abandoned.__enter__()  # as a recording whose cleanup nobody closes
    outer = getattr(scale._scratch, "buffer", None)
    x = torch.randn(40, 60)[:, :50]  # not dense: copied into the scratch buffer
    with scale.scratch_space():
        del abandoned
        gc.collect()  # its generator ends here, inside the later scratch space
        assert std_stat(x) == pytest.approx(torch.std(x.double(), correction=0).item(), rel=1e-5)
    assert scale._scratch.buffer is outer  # the later one put back what it found
    scale._scratch.buffer = scale._scratch.owner = None  # this thread outside any scratch space again
