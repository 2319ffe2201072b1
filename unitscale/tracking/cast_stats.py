"""What casting one tensor to a low-precision format would cost: underflow, overflow and SQNR.

:func:`cast_stats` measures a tensor against an :class:`~unitscale.FPFormat`: its std and
abs-max, the fraction of its nonzero elements below the format's smallest subnormal
(underflow) or above its largest value (overflow), and the signal-to-quantisation-noise
ratio of the format's own simulated rounding (:meth:`FPFormat.round`, or torch's cast where
formats.py documents the two as bit-identical), in dB:
``10 * log10(sum(x**2) / sum((x - round(x))**2))``.

:func:`raw_cast_stats` leaves the sums on the tensor's device (on an accelerator, no host
sync per tensor); :func:`finish_cast_stats` turns the sums, once read, into the statistics.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from unitscale.formats import FPFormat
from unitscale.tracking.stats import Stat, reads_at_once, std_stat

__all__ = ["CastStats", "Scratch", "cast_stats", "finish_cast_stats", "raw_cast_stats", "rounding_error"]

RAW_FIELDS = ("std", "absmax", "nonzero", "under", "over", "signal", "noise")
"""What :func:`raw_cast_stats` returns, in order."""


class CastStats(NamedTuple):
    """One tensor measured against a format.

    Attributes:
        std: standard deviation (``torch.std``; 0 for one element).
        absmax: largest magnitude.
        underflow: fraction of the nonzero elements whose magnitude is below the format's
            smallest subnormal (exact zeros are not counted: they cast exactly).
        overflow: fraction of the nonzero elements whose magnitude is above the format's
            largest finite value (infinities included).
        sqnr_db: ``10 * log10(signal power / quantisation-noise power)`` of the format's
            rounding; ``inf`` where the format holds the tensor exactly (all-zero
            tensors included); NaN where the tensor holds a NaN or an infinity.

    >>> import torch
    >>> from unitscale import FP8_E5M2
    >>> from unitscale.tracking import cast_stats
    >>> cast_stats(torch.tensor([1.0, -3.0]), FP8_E5M2)
    CastStats(std=2.8284271247461903, absmax=3.0, underflow=0.0, overflow=0.0, sqnr_db=inf)
    """

    std: float
    absmax: float
    underflow: float
    overflow: float
    sqnr_db: float


def _value(t: torch.Tensor) -> Stat:
    return t.item() if reads_at_once(t.device) else t


# Formats that formats.py documents as bit-identical to a torch cast (round to nearest, and with
# saturation once clamped to the format's range): one vectorised cast instead of FPFormat.round's
# frexp/ldexp arithmetic, several times faster. tests/tracking/test_monitor.py checks them equal.
_TORCH_CASTS = {
    (4, 3, False): torch.float8_e4m3fn,
    (5, 2, True): torch.float8_e5m2,
    (5, 10, True): torch.float16,
    (8, 7, True): torch.bfloat16,
}


class Scratch:
    """Reusable buffers, one per dtype and device, grown to the largest tensor seen.

    A fresh multi-megabyte temporary per op costs its page faults again every time; a
    monitor's record step measures hundreds of tensors, so it lends them one set of buffers.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = {}

    def get(self, n: int, dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
        """``n`` elements of scratch of ``dtype`` on ``device`` (``slot`` tells two live buffers apart)."""
        key = (dtype, device, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < n:
            buffer = self._buffers[key] = torch.empty(n, dtype=dtype, device=device)
        return buffer[:n]


def rounding_error(x: torch.Tensor, fmt: FPFormat, scratch: Scratch | None = None) -> torch.Tensor:
    """``fmt.round(x) - x`` for a 1-D float32 or float64 tensor, in a scratch buffer where one is given.

    >>> from unitscale import FP8_E4M3
    >>> rounding_error(torch.tensor([0.3, 500.0]), FP8_E4M3).tolist()
    [0.012499988079071045, -52.0]
    """
    low = _TORCH_CASTS.get((fmt.exponent_bits, fmt.mantissa_bits, fmt.infinities))
    if low is None or fmt.rounding != "nearest" or not fmt.saturate or x.dtype != torch.float32:
        return fmt.round(x).sub_(x)
    scratch = scratch or Scratch()
    n = x.numel()
    error = torch.clamp(x, -fmt.max_value, fmt.max_value, out=scratch.get(n, x.dtype, x.device, 1))
    error.copy_(scratch.get(n, low, x.device).copy_(error))
    return error.sub_(x)


def raw_cast_stats(t: torch.Tensor, fmt: FPFormat, scratch: Scratch | None = None) -> tuple[Stat, ...]:
    """The sums behind :class:`CastStats` (see :data:`RAW_FIELDS`): floats on the CPU, 0-dim tensors elsewhere.

    Args:
        t: a nonempty floating-point tensor.
        fmt: the format.
        scratch: buffers to reuse across calls (default: fresh ones).

    >>> import torch
    >>> from unitscale import FP8_E4M3
    >>> raw_cast_stats(torch.tensor([0.0, 1.0, 1e-4, 1e3]), FP8_E4M3)[2:5]
    (3, 1, 1)
    """
    scratch = scratch or Scratch()
    with torch.no_grad():
        x = t.detach()
        if x.dtype != torch.float32 and x.dtype != torch.float64:
            x = x.float()
        x = x.reshape(-1)
        n = x.numel()
        std = std_stat(x)
        if std is None:
            raise ValueError("raw_cast_stats needs a nonempty tensor")
        low, high = torch.aminmax(x)
        absmax = torch.maximum(high, -low)
        a = torch.abs(x, out=scratch.get(n, x.dtype, x.device))
        flags = scratch.get(n, torch.bool, x.device)
        nonzero = torch.count_nonzero(x)
        # a < smallest subnormal also holds for the exact zeros, which are not underflow
        under = torch.count_nonzero(torch.lt(a, fmt.min_subnormal, out=flags)) - (n - nonzero)
        over = torch.count_nonzero(torch.gt(a, fmt.max_value, out=flags))
        signal = torch.dot(x, x)
        error = rounding_error(x, fmt, scratch)
        noise = torch.dot(error, error)
    return (std, *(_value(v) for v in (absmax, nonzero, under, over, signal, noise)))


def finish_cast_stats(raw: tuple[float, ...]) -> CastStats:
    """:class:`CastStats` from the values of :func:`raw_cast_stats`, read to floats.

    >>> finish_cast_stats((1.0, 2.0, 4, 1, 0, 8.0, 0.08))
    CastStats(std=1.0, absmax=2.0, underflow=0.25, overflow=0.0, sqnr_db=20.0)
    """
    std, absmax, nonzero, under, over, signal, noise = raw
    underflow = under / nonzero if nonzero else 0.0
    overflow = over / nonzero if nonzero else 0.0
    if not (math.isfinite(signal) and math.isfinite(noise)):
        sqnr = math.nan
    elif noise == 0:  # all-zero tensors too: nothing is lost
        sqnr = math.inf
    else:
        sqnr = 10 * math.log10(signal / noise)
    return CastStats(float(std), float(absmax), float(underflow), float(overflow), sqnr)


def cast_stats(t: torch.Tensor, fmt: FPFormat) -> CastStats:
    """Std, abs-max, underflow and overflow fractions and SQNR of casting ``t`` to ``fmt``.

    Args:
        t: a nonempty floating-point tensor (low-precision dtypes are measured in float32).
        fmt: the format it would be cast to.

    Returns:
        A :class:`CastStats`, read to Python floats.

    >>> import torch
    >>> from unitscale import FP8_E4M3
    >>> s = cast_stats(torch.tensor([0.0, 0.5, 1e-4, 1000.0]), FP8_E4M3)
    >>> s.absmax, round(s.underflow, 3), round(s.overflow, 3)
    (1000.0, 0.333, 0.333)
    >>> cast_stats(torch.tensor([0.5, -2.0]), FP8_E4M3).sqnr_db
    inf
    """
    raw = raw_cast_stats(t, fmt)
    return finish_cast_stats(tuple(float(v) for v in raw))
