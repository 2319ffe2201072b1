"""Simulated FP8 against torch's own float8 dtypes: round to nearest, ties, subnormals, saturation.

Two oracles that share nothing with ``FPFormat.round``: torch's ``float8_e4m3fn`` and
``float8_e5m2`` casts of float32 values, and, for float64 values, the nearest of the
format's 256 bit patterns read through those dtypes (ties to the even pattern). Torch's
cast of a float64 is no oracle there: it rounds to float32 first, and a value within
``2**-24`` of a midpoint lands on the midpoint and then on the even side (checked below).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.errors import NothingQuantisedWarning, UnitscaleError
from unitscale.formats import FP8_E4M3, FP8_E5M2, FPFormat
from unitscale.transforms import simulate_fp8

FORMATS = [(FP8_E4M3, torch.float8_e4m3fn), (FP8_E5M2, torch.float8_e5m2)]
IDS = ["e4m3", "e5m2"]


def torch_round(x: torch.Tensor, fmt: FPFormat, dtype: torch.dtype) -> torch.Tensor:
    """torch's cast, saturated where the format saturates (torch's e5m2 overflows to inf; its e4m3fn saturates)."""
    out = x.to(dtype).to(x.dtype)
    return out.clamp(-fmt.max_value, fmt.max_value) if fmt.saturate else out


def table(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite non-negative value of the dtype (ascending, float64) and whether its bit pattern is even."""
    codes = torch.arange(128, dtype=torch.uint8)
    values = codes.view(dtype).double()
    keep = torch.isfinite(values)
    return values[keep], (codes[keep] % 2 == 0)


def nearest(x: torch.Tensor, dtype: torch.dtype, max_value: float) -> torch.Tensor:
    """Round each float64 value to the nearest table entry, ties to the even pattern, saturating at max_value."""
    values, even = table(dtype)
    size = x.abs().clamp(max=max_value)
    upper = torch.searchsorted(values, size).clamp(max=len(values) - 1)
    lower = (upper - 1).clamp(min=0)
    below, above = values[lower], values[upper]
    pick_upper = (above - size < size - below) | ((above - size == size - below) & even[upper])
    return torch.where(pick_upper, above, below).copysign(x)


def float32_from_bits(bits: list[int]) -> torch.Tensor:
    x = torch.tensor(bits, dtype=torch.int64).to(torch.int32).view(torch.float32)
    return x[torch.isfinite(x)]


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
@settings(max_examples=30, deadline=None)
@given(bits=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=64))
def test_quantise_equals_torchs_cast_on_any_float32(fmt, dtype, bits):
    x = float32_from_bits(bits)
    assert torch.equal(fmt.quantise(x), torch_round(x, fmt, dtype))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
@settings(max_examples=30, deadline=None)
@given(values=st.lists(st.floats(-(2.0**-5), 2.0**-5, width=32), min_size=1, max_size=64))
def test_subnormals_and_underflow_equal_torchs_cast(fmt, dtype, values):
    x = torch.tensor(values, dtype=torch.float32) * 2.0 ** (1 - fmt.bias) / 2.0**-5
    assert torch.equal(fmt.round(x), torch_round(x, fmt, dtype))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
def test_every_tie_goes_to_the_even_pattern_as_in_torch(fmt, dtype):
    values, _ = table(dtype)
    mids = ((values[1:] + values[:-1]) / 2).float()
    mids = torch.cat([mids, -mids])
    assert torch.equal(fmt.round(mids), torch_round(mids, fmt, dtype))
    assert torch.equal(fmt.round(mids.double()), nearest(mids.double(), dtype, fmt.max_value))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
def test_float64_values_next_to_a_tie_round_to_the_nearest_where_torchs_cast_rounds_twice(fmt, dtype):
    values, _ = table(dtype)
    gaps = values[1:] - values[:-1]
    mids = (values[1:] + values[:-1]) / 2
    x = torch.cat([mids + gaps * 1e-9, mids - gaps * 1e-9])
    x = torch.cat([x, -x])
    assert torch.equal(fmt.round(x), nearest(x, dtype, fmt.max_value))
    # torch's own cast goes through float32 and lands on the even side of every tie it reaches.
    assert not torch.equal(x.to(dtype).double(), nearest(x, dtype, fmt.max_value))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
@settings(max_examples=30, deadline=None)
@given(bits=st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=64))
def test_quantise_of_float64_is_the_nearest_representable_value(fmt, dtype, bits):
    x = torch.tensor(bits, dtype=torch.int64).view(torch.float64)
    x = x[torch.isfinite(x)]
    assert torch.equal(fmt.quantise(x), nearest(x, dtype, fmt.max_value))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
def test_saturation_at_and_beyond_the_largest_value(fmt, dtype):
    big = torch.tensor([fmt.max_value, fmt.max_value * 1.01, 1e30, float("inf")])
    x = torch.cat([big, -big])
    expected = torch.tensor([fmt.max_value] * 4 + [-fmt.max_value] * 4)
    assert torch.equal(fmt.round(x), expected)
    assert torch.equal(fmt.round(x), torch_round(x, fmt, dtype))
    if dtype == torch.float8_e5m2:  # torch's e5m2 cast overflows to inf, as the format without saturation
        assert torch.equal(fmt.replace(saturate=False).round(x), x.to(dtype).float())


def test_gradients_round_to_e5m2_as_torchs_cast_does():
    torch.manual_seed(0)
    x = torch.randn(4096, requires_grad=True)
    grad = torch.randn(4096) * torch.exp2(torch.randint(-20, 18, (4096,)).float())
    FP8_E5M2.quantise_bwd(x).backward(grad)
    assert torch.equal(x.grad, torch_round(grad, FP8_E5M2, torch.float8_e5m2))


@pytest.mark.parametrize(("fmt", "dtype"), FORMATS, ids=IDS)
def test_stochastic_rounding_lands_on_the_two_neighbours_in_the_table(fmt, dtype):
    torch.manual_seed(0)
    x = (torch.randn(20_000) * 4).double().clamp(-fmt.max_value, fmt.max_value)
    out = fmt.replace(rounding="stochastic").round(x.float()).double()
    values, _ = table(dtype)
    upper = torch.searchsorted(values, x.abs()).clamp(max=len(values) - 1)
    lower = torch.where(values[upper] == x.abs(), upper, (upper - 1).clamp(min=0))
    assert bool(((out.abs() == values[lower]) | (out.abs() == values[upper])).all())


def test_quantising_a_list_raises_a_typed_error_naming_quantise():
    with pytest.raises(UnitscaleError, match="quantise"):
        FP8_E4M3.quantise([1.0, 2.0])  # type: ignore[arg-type]


def test_simulate_fp8_on_a_model_without_matmul_says_nothing_was_quantised():
    model = torch.nn.Sequential(torch.nn.LayerNorm(8), torch.nn.ReLU())
    x = torch.randn(4, 8)
    with pytest.warns(NothingQuantisedWarning, match="simulate_fp8"):
        out = simulate_fp8(model)(x)
    assert torch.equal(out, model(x))  # full precision, as the warning says
