"""CastBatch's flat buffers: several buffers, clear, and its accelerator branch, against raw_cast_stats."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FPFormat
from unitscale.tracking.format_casts import BLOCK, CastBatch, finish_cast_stats, raw_cast_stats

cast_stats_module = importlib.import_module("unitscale.tracking.format_casts")

_FORMATS = st.sampled_from([FP8_E4M3, FP8_E5M2, BF16, FPFormat(3, 1)])


def _tensor(n: int, log2_scale: float, seed: int, zeros: bool, offset: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    t = torch.randn(n, generator=gen) * 2.0**log2_scale + offset
    if zeros:
        t[torch.rand(n, generator=gen) < 0.5] = 0.0
    return t


_TENSORS = st.lists(
    st.builds(
        _tensor,
        st.integers(1, 3 * BLOCK + 7),
        st.floats(-20, 10),
        st.integers(0, 2**31 - 1),
        st.booleans(),
        st.sampled_from([0.0, 3.0]),
    ),
    min_size=1,
    max_size=8,
)


def _agree(row: tuple[float, ...], t: torch.Tensor, fmt: FPFormat) -> None:
    own = tuple(float(v) for v in raw_cast_stats(t, fmt))
    assert row[1:5] == own[1:5]  # abs-max and counts: identical
    for got, want in zip(finish_cast_stats(row), finish_cast_stats(own), strict=True):
        # float32 sums in another order: Hypothesis found a std 1.1e-5 apart (a table shows 3 digits)
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6, nan_ok=True)


@settings(max_examples=25, deadline=None)
@given(_TENSORS, _FORMATS)
def test_several_small_buffers_measure_as_raw_cast_stats(tensors: list[torch.Tensor], fmt: FPFormat) -> None:
    # a buffer of two blocks: most tensors start a new one, some are larger than it (it grows)
    batch = CastBatch(fmt, capacity=2 * BLOCK)
    rows = [batch.add(t) for t in tensors]
    assert rows == list(range(len(tensors)))
    for t, row in zip(tensors, batch.finish(), strict=True):
        _agree(row, t, fmt)


@settings(max_examples=15, deadline=None)
@given(_TENSORS, _FORMATS)
def test_the_accelerator_branch_agrees(tensors: list[torch.Tensor], fmt: FPFormat) -> None:
    # On an accelerator nothing is skipped (zero count, overflow count, clamp are always computed)
    host = CastBatch(fmt)
    for t in tensors:
        host.add(t)
    expected = host.finish()
    original = cast_stats_module.reads_at_once
    cast_stats_module.reads_at_once = lambda device: False
    try:
        device = CastBatch(fmt)
        for t in tensors:
            device.add(t)
        got = device.finish()
    finally:
        cast_stats_module.reads_at_once = original
    for a, b in zip(got, expected, strict=True):
        assert a[1:5] == b[1:5]
        assert a == pytest.approx(b, rel=1e-6, abs=1e-30)


def test_add_takes_any_dtype_and_skips_nothing() -> None:
    tensors = [
        torch.tensor([1.0, -2.0], dtype=torch.float64),  # measured at once by raw_cast_stats
        torch.tensor([0.5, 0.25, 0.0], dtype=torch.bfloat16),
        torch.full((BLOCK + 1,), 0.1),  # constant over two blocks: the careful std, exactly 0
        torch.tensor([1e30, math.inf]),  # sums out of range: measured again by raw_cast_stats
    ]
    batch = CastBatch(FP8_E4M3)
    assert [batch.add(t) for t in tensors] == [0, 1, 2, 3]
    assert len(batch) == 4
    rows = batch.finish()
    for t, row in zip(tensors, rows, strict=True):
        _agree(row, t, FP8_E4M3)
    assert rows[2][0] == 0.0
    assert rows[1][2:4] == (2, 0)  # the zero is not counted as nonzero or as underflow
    assert math.isinf(rows[3][5]) and rows[3][4] == 2


def test_clear_forgets_and_finish_empties() -> None:
    batch = CastBatch(FP8_E5M2)
    batch.add(torch.ones(5))
    batch.clear()
    assert len(batch) == 0 and batch.finish() == []
    assert batch.add(torch.tensor([2.0, 2.0, 0.0])) == 0
    ((std, absmax, nonzero, under, over, signal, noise),) = batch.finish()
    assert (absmax, nonzero, under, over, noise) == (2.0, 2, 0, 0, 0.0)
    assert signal == pytest.approx(8.0, rel=1e-6)  # a float32 norm, squared
    assert std == pytest.approx(torch.tensor([2.0, 2.0, 0.0]).std(correction=0).item(), rel=1e-6)
    with pytest.raises(ValueError, match="nonempty"):
        batch.add(torch.zeros(0))
