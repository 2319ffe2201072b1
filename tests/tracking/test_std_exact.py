"""``std_stat`` against exact arithmetic, where float32's squares and running sums give way.

The oracle is :func:`statistics.pstdev` on the tensor's values as Python floats: it sums in
exact rational arithmetic, so it shares no rounding, no algorithm and no code with
``std_stat``. Large tensors of two values are checked against the std written out from
the counts of each value, also in rationals.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from fractions import Fraction

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from unitscale.tracking.stats import scratch_space, std_stat

LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda x: x,
    "strided": lambda x: torch.stack((x, -x), 1)[:, 0],  # every other element: copied to read
    "transposed": lambda x: x.view(2, -1).t() if x.numel() % 2 == 0 else x,  # dense: read in place
    "expanded": lambda x: x[:1].expand(x.numel()),  # one value, stride 0
}


def _exact(x: torch.Tensor) -> float:
    return statistics.pstdev(x.double().flatten().tolist())


def _std(x: torch.Tensor, scratch: bool) -> float:
    if scratch:  # as scale tracking runs it: copies and deviations in one reused buffer
        with scratch_space():
            value = std_stat(x)
    else:
        value = std_stat(x)
    assert isinstance(value, float)  # read at once on the CPU
    return value


@settings(max_examples=150, deadline=None)
@given(
    n=st.integers(2, 400),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    exponent=st.integers(-140, 120),  # the values' magnitude: 2**exponent
    ratio=st.sampled_from([0.0, 0.5, 30.0, 2e4, 3e7]),  # mean over std
    layout=st.sampled_from(sorted(LAYOUTS)),
    scratch=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_std_matches_exact_arithmetic_at_any_magnitude_mean_and_layout(
    n: int, dtype: torch.dtype, exponent: int, ratio: float, layout: str, scratch: bool, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    values = (torch.randn(n, generator=g, dtype=torch.float64) + ratio) * 2.0**exponent
    x = LAYOUTS[layout](values.to(dtype))
    assume(bool(torch.isfinite(x).all()))  # 3e7 times 2**104 is past float32's largest
    exact = _exact(x)
    got = _std(x, scratch)
    if exact == 0.0:  # all equal: nothing but rounding of the mean may show
        assert got <= 1e-12 * abs(x.double().mean().item()), (got, x.flatten()[:3])
    else:
        # float32 values quantised by a mean 3e7 times their spread keep 5 digits of it, not 6
        assert got == pytest.approx(exact, rel=1e-5 if dtype == torch.float32 else 1e-11), (got, exact)


def test_a_constant_copied_to_the_scratch_buffer_has_std_zero() -> None:
    # the copy of a strided tensor and the deviations once shared the buffer: 0.48 here
    x = torch.full((1,), 3.3e7).expand(70)
    with scratch_space():
        assert std_stat(x) == 0.0


@pytest.mark.parametrize(
    ("dtype", "scale"),
    [
        (torch.float32, 1e-23),  # a gradient: its squares are float32 subnormals (read as 2.6e-24)
        (torch.float32, 1e-40),  # values subnormal themselves
        (torch.float32, 1e25),  # squares past float32's largest
        (torch.float64, 1e-160),  # squares below float64's range (read as 0)
        (torch.float64, 1e200),
    ],
)
def test_std_of_tensors_whose_squares_leave_the_dtype_range(dtype: torch.dtype, scale: float) -> None:
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale).to(dtype)
    assert _std(x, scratch=False) == pytest.approx(_exact(x), rel=1e-6)


@pytest.mark.parametrize("scale", [1e-23, 1e25])
def test_on_an_accelerator_the_squares_are_summed_wide_enough(monkeypatch: pytest.MonkeyPatch, scale: float) -> None:
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale).float()
    monkeypatch.setattr("unitscale.tracking.stats.reads_at_once", lambda device: False)  # as on a GPU
    got = std_stat(x)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float32
    assert got.item() == pytest.approx(_exact(x), rel=1e-6)


def _two_values(n: int, low: float, high: float) -> tuple[torch.Tensor, float]:
    """``n`` float32 values, each ``low`` or ``high``, and their std worked out from the counts."""
    x = torch.where(torch.rand(n, generator=torch.Generator().manual_seed(0)) < 0.5, high, low).float()
    a, b = Fraction(x.min().item()), Fraction(x.max().item())
    highs = int((x == x.max()).sum())
    mean = (a * (n - highs) + b * highs) / n
    var = ((a - mean) ** 2 * (n - highs) + (b - mean) ** 2 * highs) / n
    return x, math.sqrt(var)


@pytest.mark.parametrize(
    ("low", "high"),
    [
        (-1.37, 1.37),  # mean near 0, every square the same: BLAS's dot alone drifts by 2e-3
        (1.0, 4.7),  # mean above the std: every deviation's square the same
    ],
)
def test_the_third_digit_holds_for_four_million_values_of_two_kinds(low: float, high: float) -> None:
    x, exact = _two_values(2**22, low, high)
    assert _std(x, scratch=True) == pytest.approx(exact, rel=2e-4)
