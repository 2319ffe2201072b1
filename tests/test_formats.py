"""FPFormat: bit-exact against torch's casts, straight-through gradients, bad bit counts."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.errors import FormatError
from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FPFormat, underflow_fraction

CASTS = [
    (FP8_E4M3, torch.float8_e4m3fn),
    (FP8_E5M2, torch.float8_e5m2),
    (FP16, torch.float16),
    (BF16, torch.bfloat16),
]


def _probe_values(fmt: FPFormat) -> torch.Tensor:
    """Every representable value, the midpoints between neighbours (ties), values just off the
    midpoints, subnormals, and values far outside the range, both signs."""
    torch.manual_seed(0)
    steps = 2**fmt.mantissa_bits
    exps = torch.arange(1 - fmt.bias - fmt.mantissa_bits - 2, 2**fmt.exponent_bits - fmt.bias + 2)
    grid = (1 + torch.arange(0, steps + 1) / steps)[None, :] * torch.exp2(exps.float())[:, None]
    grid = grid.flatten()
    mids = (grid[1:] + grid[:-1]) / 2
    near = torch.cat(
        [torch.nextafter(mids, torch.zeros_like(mids)), torch.nextafter(mids, torch.full_like(mids, 1e38))]
    )
    rand = torch.exp2(torch.empty(20_000).uniform_(-2 - fmt.bias - fmt.mantissa_bits, fmt.bias + 3))
    values = torch.cat([grid, mids, near, rand, torch.tensor([0.0, 1e30, 3e38])])
    values = values[torch.isfinite(values)]
    return torch.cat([values, -values])


@pytest.mark.parametrize(("fmt", "dtype"), CASTS, ids=["e4m3", "e5m2", "fp16", "bf16"])
def test_round_to_nearest_equals_torch_cast_everywhere_in_range(fmt: FPFormat, dtype: torch.dtype) -> None:
    x = _probe_values(fmt)
    x = x[x.abs() <= fmt.max_value * (1 + 2.0 ** -(fmt.mantissa_bits + 2))]
    assert torch.equal(fmt.round(x), x.to(dtype).float())


@pytest.mark.parametrize(("fmt", "dtype"), CASTS[1:], ids=["e5m2", "fp16", "bf16"])
def test_non_saturating_formats_overflow_exactly_like_torch(fmt: FPFormat, dtype: torch.dtype) -> None:
    x = torch.cat([_probe_values(fmt), torch.tensor([float("inf"), -float("inf"), float("nan")])])
    assert torch.equal(fmt.replace(saturate=False).round(x[:-1]), x[:-1].to(dtype).float())
    assert torch.isnan(fmt.replace(saturate=False).round(x[-1:])).all()


def test_e4m3_saturates_like_torch_including_infinity() -> None:
    x = torch.cat([_probe_values(FP8_E4M3), torch.tensor([float("inf"), -float("inf"), 1e6, 465.0])])
    assert torch.equal(FP8_E4M3.round(x), x.to(torch.float8_e4m3fn).float())


@pytest.mark.parametrize("fmt", [FP8_E5M2, FP16, BF16], ids=["e5m2", "fp16", "bf16"])
def test_saturating_formats_clamp_overflow_to_max_value(fmt: FPFormat) -> None:
    x = torch.tensor([fmt.max_value * 1.01, -fmt.max_value * 1.5, -float("inf")])
    assert fmt.round(x).tolist() == [fmt.max_value, -fmt.max_value, -fmt.max_value]


def test_e4m3_without_saturation_overflows_to_nan_and_keeps_448() -> None:
    fmt = FP8_E4M3.replace(saturate=False)
    out = fmt.round(torch.tensor([448.0, 463.9, 464.0, 464.1, 1e6, float("inf")]))
    assert out[:3].tolist() == [448.0, 448.0, 448.0]
    assert torch.isnan(out[3:]).all()


@pytest.mark.parametrize(
    ("fmt", "max_value", "min_normal", "min_subnormal"),
    [
        (FP8_E4M3, 448.0, 2.0**-6, 2.0**-9),
        (FP8_E5M2, 57344.0, 2.0**-14, 2.0**-16),
        (FP16, 65504.0, 2.0**-14, 2.0**-24),
        (BF16, torch.finfo(torch.bfloat16).max, 2.0**-126, 2.0**-133),
    ],
)
def test_range_properties_match_the_formats(
    fmt: FPFormat, max_value: float, min_normal: float, min_subnormal: float
) -> None:
    assert (fmt.max_value, fmt.min_normal, fmt.min_subnormal) == (max_value, min_normal, min_subnormal)


def test_float32_format_is_the_identity_on_float32() -> None:
    torch.manual_seed(0)
    x = torch.randn(1000) * torch.exp2(torch.randint(-140, 120, (1000,)).float())
    assert torch.equal(FPFormat(8, 23).round(x), x)


@settings(max_examples=40, deadline=None)
@given(st.floats(min_value=-6e4, max_value=6e4, allow_nan=False, width=32))
def test_fp16_rounding_agrees_with_half_cast_on_any_float(value: float) -> None:
    x = torch.tensor([value])
    assert torch.equal(FP16.round(x), x.half().float())


def test_stochastic_rounding_is_unbiased_and_lands_on_neighbours() -> None:
    torch.manual_seed(0)
    fmt = FP8_E4M3.replace(rounding="stochastic")
    x = torch.full((100_000,), 1.3)
    out = fmt.round(x)
    assert set(out.unique().tolist()) == {1.25, 1.375}
    assert out.mean().item() == pytest.approx(1.3, abs=2e-3)


def test_quantise_fwd_is_straight_through_and_quantise_bwd_rounds_only_the_gradient() -> None:
    x = torch.tensor([0.1, 3.3], requires_grad=True)
    g = torch.tensor([0.1, 1e-6])
    y = FP8_E4M3.quantise_fwd(x)
    y.backward(g)
    assert y.tolist() == [0.1015625, 3.25]
    assert torch.equal(x.grad, g)
    x.grad = None
    y = FP8_E5M2.quantise_bwd(x)
    y.backward(g)
    assert torch.equal(y, x.detach())
    assert x.grad.tolist() == [0.09375, 0.0]


def test_quantise_keeps_the_input_dtype() -> None:
    assert FP8_E4M3.quantise(torch.ones(2, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"exponent_bits": 1, "mantissa_bits": 3}, "exponent_bits=1 is outside 2..8"),
        ({"exponent_bits": 4, "mantissa_bits": 24}, "mantissa_bits=24 is outside 0..23"),
        ({"exponent_bits": 4, "mantissa_bits": -1}, "mantissa_bits=-1 is outside 0..23"),
        ({"exponent_bits": 4.0, "mantissa_bits": 3}, "exponent_bits=4.0 must be an int"),
        (
            {"exponent_bits": 4, "mantissa_bits": 3, "rounding": "up"},
            "rounding='up' is unknown; use 'nearest' or 'stochastic'",
        ),
        ({"exponent_bits": 4, "mantissa_bits": 0, "infinities": False}, "infinities=False needs mantissa_bits >= 1"),
    ],
)
def test_impossible_formats_raise_format_error(kwargs: dict, message: str) -> None:
    with pytest.raises(FormatError, match=message.replace("(", r"\(")):
        FPFormat(**kwargs)


@pytest.mark.parametrize("method", ["quantise", "quantise_fwd", "quantise_bwd", "round"])
def test_quantising_a_list_raises_a_typed_error_naming_the_format_and_the_fix(method: str) -> None:
    expected = (
        rf"FPFormat\(4, 3, infinities=False\)\.{method}: x is a list \(\[1.0, 2.0\]\); pass a floating-point tensor"
    )
    with pytest.raises(FormatError, match=expected):
        getattr(FP8_E4M3, method)([1.0, 2.0])


def test_quantising_integers_raises_format_error() -> None:
    with pytest.raises(FormatError, match=r"can only quantise floating-point tensors, got dtype torch.int64"):
        FP16.round(torch.arange(3))


SMALL_FLOATS = st.floats(min_value=-(2.0**-10), max_value=2.0**-10, width=32, allow_subnormal=False)


@settings(max_examples=50, deadline=None)
@given(st.lists(SMALL_FLOATS, min_size=1, max_size=40))
def test_underflow_fraction_counts_the_nonzeros_torchs_e5m2_cast_sends_to_zero(values: list[float]) -> None:
    x = torch.tensor(values)
    nonzero = x != 0
    expected = (nonzero & (x.to(torch.float8_e5m2).float() == 0)).sum().item() / max(1, nonzero.sum().item())
    assert underflow_fraction(x, FP8_E5M2) == pytest.approx(expected)


def test_underflow_fraction_threshold_is_half_the_smallest_subnormal() -> None:
    half = FP8_E5M2.min_subnormal / 2  # 2**-17: a tie, rounded to the even neighbour, zero
    above = torch.nextafter(torch.tensor(half), torch.tensor(1.0)).item()
    assert underflow_fraction(torch.tensor([half, -half]), FP8_E5M2) == 1.0
    assert underflow_fraction(torch.tensor([above, -above]), FP8_E5M2) == 0.0
    assert underflow_fraction(torch.tensor([half, above, 1.0, 1e-30]), FP8_E5M2) == 0.5


def test_underflow_fraction_ignores_zeros_and_non_finite_values() -> None:
    x = torch.tensor([0.0, -0.0, float("nan"), float("inf"), 1e-9, 1.0])
    assert underflow_fraction(x, FP8_E5M2) == 0.5
    assert underflow_fraction(torch.zeros(3), FP8_E5M2) == 0.0
    assert underflow_fraction(torch.empty(0), FP16) == 0.0


def test_underflow_fraction_of_a_unit_normal_gradient_scaled_down() -> None:
    torch.manual_seed(0)
    g = torch.randn(100_000)
    # |z| <= 2**-17 / sigma for z ~ N(0, 1): erf(t / sqrt(2)).
    for fmt, sigma in ((FP8_E5M2, 2.0**-14), (FP8_E5M2, 2.0**-17), (FP8_E5M2, 2.0**-20), (FP16, 2.0**-17)):
        t = fmt.min_subnormal / 2 / sigma
        expected = torch.erf(torch.tensor(t / 2**0.5)).item()
        assert underflow_fraction(g * sigma, fmt) == pytest.approx(expected, abs=0.01)


def test_underflow_fraction_rejects_a_non_format_and_integer_tensors() -> None:
    with pytest.raises(FormatError, match=r"fmt='e5m2' is not an FPFormat"):
        underflow_fraction(torch.ones(2), "e5m2")  # type: ignore[arg-type]
    with pytest.raises(FormatError, match=r"floating-point tensor, got a tensor of dtype torch.int64"):
        underflow_fraction(torch.ones(2, dtype=torch.long), FP8_E5M2)
    with pytest.raises(FormatError, match=r"floating-point tensor, got list"):
        underflow_fraction([1.0], FP8_E5M2)  # type: ignore[arg-type]
