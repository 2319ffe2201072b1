"""Cast statistics of tensors whose squares leave float32's range, against exact arithmetic.

The std's oracle is :func:`statistics.pstdev` (rational arithmetic); the SQNR's is torch's own
cast to the format's dtype, with the signal and the rounding error summed as Python floats
(:func:`math.fsum` of float64 squares, which a float32 value's square never leaves). Both
paths are checked: :func:`~unitscale.tracking.cast_stats` alone and a
:class:`~unitscale.tracking.format_casts.CastBatch` of small tensors.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from unitscale.formats import BF16, FP8_E4M3, FPFormat
from unitscale.tracking import CastStats, cast_stats
from unitscale.tracking.format_casts import CastBatch, finish_cast_stats

DTYPES = {BF16: torch.bfloat16, FP8_E4M3: torch.float8_e4m3fn}


def _exact_sqnr_db(x: torch.Tensor, fmt: FPFormat) -> float:
    values = x.double().tolist()
    cast = x.to(DTYPES[fmt]).double().tolist()
    signal = math.fsum(v * v for v in values)
    noise = math.fsum((c - v) ** 2 for c, v in zip(cast, values, strict=True))
    return math.inf if noise == 0 else 10 * math.log10(signal / noise)


def _batched(x: torch.Tensor, fmt: FPFormat) -> CastStats:
    batch = CastBatch(fmt)
    batch.add(torch.randn(300))  # a neighbour in the same buffer, of ordinary size
    batch.add(x)
    return finish_cast_stats(batch.finish()[1])


@pytest.mark.parametrize("measure", [cast_stats, _batched], ids=["alone", "batched"])
@pytest.mark.parametrize(
    ("fmt", "scale"),
    [
        (BF16, 1e-23),  # squares below float32's subnormals: the SQNR read as inf, nothing lost
        (BF16, 1e-30),
        (BF16, 1e25),  # squares past float32's largest
        (FP8_E4M3, 1e-30),  # every value flushed to zero: 0 dB, once read as inf
        (FP8_E4M3, 1e-3),  # ordinary: most values below E4M3's smallest subnormal
    ],
)
def test_std_and_sqnr_match_exact_arithmetic_at_any_magnitude(measure: object, fmt: FPFormat, scale: float) -> None:
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale).float()
    got = measure(x, fmt)  # type: ignore[operator]
    assert got.std == pytest.approx(statistics.pstdev(x.double().tolist()), rel=1e-6)
    assert got.sqnr_db == pytest.approx(_exact_sqnr_db(x, fmt), abs=1e-4)


def test_an_all_zero_tensor_loses_nothing_and_a_tiny_one_is_not_all_zero() -> None:
    zero = _batched(torch.zeros(500), BF16)
    assert (zero.std, zero.sqnr_db) == (0.0, math.inf)
    tiny = _batched(torch.full((500,), 1e-30).index_fill_(0, torch.tensor([0]), 3e-30), BF16)
    assert tiny.std == pytest.approx(statistics.pstdev([3e-30] + [1e-30] * 499), rel=1e-5)


@pytest.mark.parametrize(("fmt", "scale"), [(BF16, 1e-23), (BF16, 1e25), (FP8_E4M3, 1e-30)])
def test_on_an_accelerator_the_sums_are_wide_enough(
    monkeypatch: pytest.MonkeyPatch, fmt: FPFormat, scale: float
) -> None:
    x = (torch.randn(1000, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * scale).float()
    # as on a GPU, here on the CPU: every statistic stays a tensor until the end
    monkeypatch.setattr("unitscale.tracking.format_casts.reads_at_once", lambda device: False)
    monkeypatch.setattr("unitscale.tracking.stats.reads_at_once", lambda device: False)
    got = cast_stats(x, fmt)
    assert got.std == pytest.approx(statistics.pstdev(x.double().tolist()), rel=1e-6)
    assert got.sqnr_db == pytest.approx(_exact_sqnr_db(x, fmt), abs=1e-4)
