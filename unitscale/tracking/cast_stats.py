"""What casting one tensor to a low-precision format would cost: underflow, overflow and SQNR.

:func:`cast_stats` measures a tensor against an :class:`~unitscale.FPFormat`: its std and
abs-max, the fraction of its nonzero elements below the format's smallest subnormal
(underflow) or above its largest value (overflow), and the signal-to-quantisation-noise
ratio of the format's own simulated rounding (:meth:`FPFormat.round`, computed by a magic
number or torch's cast where the two are bit-identical), in dB:
``10 * log10(sum(x**2) / sum((x - round(x))**2))``.

:func:`raw_cast_stats` leaves the sums on the tensor's device (on an accelerator, no host
sync per tensor); :func:`finish_cast_stats` turns the sums, once read, into the statistics.
On the CPU its numbers are bit-identical to the plain definitions (``torch.std``-style sums,
``abs().max()``, ``count_nonzero``, ``fmt.round``), in about 15 passes over the data.
:class:`CastBatch` measures many small tensors together, where ~20 op calls per tensor, not
the data, would cost most.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch

from unitscale.formats import FPFormat
from unitscale.tracking.stats import Stat, reads_at_once, std_stat

__all__ = [
    "BATCH_MAX",
    "CastBatch",
    "CastStats",
    "Scratch",
    "cast_stats",
    "finish_cast_stats",
    "raw_cast_stats",
    "rounding_error",
]

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


# Scratch slots: the magnitudes, a 0/1 indicator (later the rounded values), the magic numbers
# (int32) and, only when something overflows, the clamped magnitudes.
_ABS, _WORK, _MAGIC, _CLAMPED = range(4)


class Scratch:
    """Reusable buffers, one per dtype, device and slot, grown to the largest tensor seen.

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


# Rounding by a magic number. For a float32 c whose format spacing there is ulp = 2**(e - m)
# (e = max(floor(log2|c|), emin)), M = 1.5 * 2**(e - m + 23) is a float32 whose own spacing is
# exactly ulp, and c + M stays in M's binade while |c| < M / 3. So the hardware's round-to-
# nearest-even of c + M rounds c to the format's grid (ties to even: M / ulp = 3 * 2**22 is
# even), and subtracting M again is exact. M is c's exponent field, clamped to the format's
# range, plus a constant: four vectorised passes where torch's float8 casts convert element by
# element (the E4M3 round trip costs about 4x more). Needs m <= 21 (so |c| < M / 3) and
# e - m + 23 within float32's normal exponents, which holds for E4M3, E5M2 and FP16 (not BF16).
_EXPONENT_FIELD = 0x7F800000


class _Magic(NamedTuple):
    low: int  # the smallest exponent field allowed (the format's emin)
    high: int  # the largest (the format's largest binade)
    add: int  # (23 - m) binades up, and the mantissa's top bit: 1.5 * 2**(e - m + 23)


@functools.lru_cache(maxsize=64)  # asked once per tensor measured
def _magic(fmt: FPFormat) -> _Magic | None:
    """Constants for rounding float32 to ``fmt`` by a magic number, or ``None`` where the trick does not apply."""
    if fmt.rounding != "nearest" or not fmt.saturate or fmt.mantissa_bits > 21:
        return None
    m, emin = fmt.mantissa_bits, 1 - fmt.bias
    emax = math.frexp(fmt.max_value)[1] - 1
    if not (-126 <= emin - m + 23 and emax - m + 23 <= 127):
        return None
    return _Magic((emin + 127) << 23, (emax + 127) << 23, ((23 - m) << 23) + (1 << 22))


def _round_magic(c: torch.Tensor, magic: _Magic, scratch: Scratch) -> torch.Tensor:
    """``c`` (1-D float32, within the format's range or NaN) rounded to the format, in a scratch buffer."""
    n = c.numel()
    big = torch.bitwise_and(c.view(torch.int32), _EXPONENT_FIELD, out=scratch.get(n, torch.int32, c.device, _MAGIC))
    big = big.clamp_(magic.low, magic.high).add_(magic.add).view(torch.float32)
    return torch.add(c, big, out=scratch.get(n, torch.float32, c.device, _WORK)).sub_(big)


# Formats that formats.py documents as bit-identical to a torch cast (round to nearest, and with
# saturation once clamped to the format's range), for those the magic number cannot round.
_TORCH_CASTS = {
    (4, 3, False): torch.float8_e4m3fn,
    (5, 2, True): torch.float8_e5m2,
    (5, 10, True): torch.float16,
    (8, 7, True): torch.bfloat16,
}


def rounding_error(x: torch.Tensor, fmt: FPFormat, scratch: Scratch | None = None) -> torch.Tensor:
    """``fmt.round(x) - x`` for a 1-D float32 or float64 tensor, in a scratch buffer where one is given.

    >>> from unitscale import FP8_E4M3
    >>> rounding_error(torch.tensor([0.3, 500.0]), FP8_E4M3).tolist()
    [0.012499988079071045, -52.0]
    """
    scratch = scratch or Scratch()
    n = x.numel()
    magic = _magic(fmt) if x.dtype == torch.float32 else None
    low = _TORCH_CASTS.get((fmt.exponent_bits, fmt.mantissa_bits, fmt.infinities))
    if magic is None and (low is None or fmt.rounding != "nearest" or not fmt.saturate or x.dtype != torch.float32):
        return fmt.round(x).sub_(x)
    clamped = torch.clamp(x, -fmt.max_value, fmt.max_value, out=scratch.get(n, x.dtype, x.device, _CLAMPED))
    if magic is not None:
        return _round_magic(clamped, magic, scratch).sub_(x)
    assert low is not None
    error = scratch.get(n, x.dtype, x.device, _WORK)
    return error.copy_(scratch.get(n, low, x.device).copy_(clamped)).sub_(x)


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
    x = t.detach()  # and so no graph is built: no torch.no_grad() needed (it costs a few us per tensor)
    if x.dtype != torch.float32 and x.dtype != torch.float64:
        x = x.float()
    x = x.reshape(-1)
    if x.numel() == 0:
        raise ValueError("raw_cast_stats needs a nonempty tensor")
    if reads_at_once(x.device):
        return _host_stats(x, fmt, scratch)
    return _device_stats(x, fmt, scratch)


# How the statistics are computed, in passes over the data (the old form took about 16, two of
# them torch's element-by-element float8 conversions): the sum and the dot product x.x give the
# std and the SQNR's signal; |x| is taken once and everything else reads it: its max, 0/1
# indicators (written as floats: a float compare-and-sum is about 4x faster than counting a bool
# tensor) for |x| < smallest subnormal, |x| == 0 and |x| > largest value, and the rounding error
# of |x| (rounding to nearest is symmetric, so its square equals that of x's). On the CPU each
# value is read as it comes, which lets a tensor skip what it does not need: the zero count
# when nothing is below the smallest subnormal, the overflow count and the clamp when the
# abs-max is in range.


def _count(flags: torch.Tensor) -> int:
    """The number of ones in a 0/1 float tensor; exact (every partial sum is an integer below 2**24)."""
    if flags.numel() < 2**24 or flags.dtype == torch.float64:
        return int(flags.sum().item())
    return int(flags.sum(dtype=torch.float64).item())


def _host_std(x: torch.Tensor, total: float, squares: float) -> float:
    """:func:`~unitscale.tracking.stats.std_stat` of ``x`` from its sum and dot product, already read."""
    n = x.numel()
    if n == 1:
        return 0.0
    mean = total / n
    var = (squares - total * mean) / (n - 1)
    if mean * mean <= var < math.inf:
        return math.sqrt(var)
    std = std_stat(x)  # cancellation or overflow: std_stat's careful path
    assert isinstance(std, float)
    return std


def _host_stats(x: torch.Tensor, fmt: FPFormat, scratch: Scratch) -> tuple[Stat, ...]:
    n, device = x.numel(), x.device
    total = x.sum().item()
    signal = torch.dot(x, x).item()
    a = torch.abs(x, out=scratch.get(n, x.dtype, device, _ABS))
    absmax = a.max().item()
    flags = scratch.get(n, x.dtype, device, _WORK)
    small = _count(torch.lt(a, fmt.min_subnormal, out=flags))
    zeros = _count(torch.eq(a, 0, out=flags)) if small else 0
    in_range = absmax <= fmt.max_value  # False for NaN too
    over = 0 if in_range else _count(torch.gt(a, fmt.max_value, out=flags))
    magic = _magic(fmt) if x.dtype == torch.float32 else None
    if magic is None:
        error = rounding_error(x, fmt, scratch)
    else:
        clamped = a if in_range else torch.clamp(a, max=fmt.max_value, out=scratch.get(n, x.dtype, device, _CLAMPED))
        error = _round_magic(clamped, magic, scratch).sub_(a)
    noise = torch.dot(error, error).item()
    return (_host_std(x, total, signal), absmax, n - zeros, small - zeros, over, signal, noise)


def _device_stats(x: torch.Tensor, fmt: FPFormat, scratch: Scratch) -> tuple[Stat, ...]:
    """:func:`_host_stats` with no value read: everything is computed, the results stay 0-dim tensors."""
    n, device = x.numel(), x.device
    std = std_stat(x)
    assert std is not None
    a = torch.abs(x, out=scratch.get(n, x.dtype, device, _ABS))
    zeros = torch.count_nonzero(torch.eq(a, 0))
    small = torch.count_nonzero(torch.lt(a, fmt.min_subnormal))
    over = torch.count_nonzero(torch.gt(a, fmt.max_value))
    magic = _magic(fmt) if x.dtype == torch.float32 else None
    if magic is None:
        error = rounding_error(x, fmt, scratch)
    else:
        clamped = torch.clamp(a, max=fmt.max_value, out=scratch.get(n, x.dtype, device, _CLAMPED))
        error = _round_magic(clamped, magic, scratch).sub_(a)
    return (std, a.max(), n - zeros, small - zeros, over, torch.dot(x, x), torch.dot(error, error))


BATCH_MAX = 8192
"""A :class:`CastBatch` takes tensors of at most this many elements (larger ones cost more per element than per op)."""

# Sums outside this range may have overflowed or lost terms to underflow in the float32 sums of
# raw_cast_stats; such rows are measured again by it, so both paths agree on inf and NaN SQNRs.
_SAFE_SUMS = (2.0**-60, 2.0**60)


class CastBatch:
    """Many small tensors measured against one format together: :func:`raw_cast_stats` in a few big ops.

    Measuring a tensor of a few hundred elements costs about 20 op calls, whatever its size;
    a ResNet's record step has a couple of hundred such tensors (norm weights, biases, their
    gradients). :meth:`add` keeps a float32 copy of each (the tensor itself may change in
    place before the step ends, as under an in-place ReLU); :meth:`finish` stacks the copies
    of equal length into one matrix and measures its rows with one set of row-wise ops.

    Compared with :func:`raw_cast_stats` the abs-max and the counts are identical; the sums
    (std about the mean, in two passes; signal; noise) are float32 sums in another order, so
    they agree with its own to float32 rounding. A row whose sums fall outside
    ``[2**-60, 2**60]`` (infinities, NaNs, values near float32's limits) is measured again by
    :func:`raw_cast_stats` itself. Memory: one copy of each added tensor until :meth:`finish`.

    >>> import torch
    >>> from unitscale import FP8_E4M3
    >>> batch = CastBatch(FP8_E4M3)
    >>> batch.add(torch.tensor([0.0, 1.0, 1e-4, 1e3])), batch.add(torch.tensor([0.5, 0.3, 0.0, 2.0]))
    (0, 1)
    >>> [row[2:5] for row in batch.finish()]
    [(3, 1, 1), (3, 0, 0)]
    """

    def __init__(self, fmt: FPFormat) -> None:
        self.fmt = fmt
        self._groups: dict[tuple[int, torch.device], list[tuple[int, torch.Tensor]]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    @staticmethod
    def takes(t: torch.Tensor) -> bool:
        """Whether ``t`` is batched: nonempty, at most :data:`BATCH_MAX` elements, not float64."""
        return 0 < t.numel() <= BATCH_MAX and t.dtype != torch.float64

    def add(self, t: torch.Tensor) -> int:
        """Keep a float32 copy of ``t`` (see :meth:`takes`); returns its row in :meth:`finish`."""
        x = t.detach().reshape(-1)
        x = x.clone() if x.dtype == torch.float32 else x.float()
        self._groups.setdefault((x.numel(), x.device), []).append((self._size, x))
        self._size += 1
        return self._size - 1

    def finish(self) -> list[tuple[float, ...]]:
        """Every added tensor's :func:`raw_cast_stats`, read to Python numbers, in the order added; then empty."""
        rows: list[tuple[float, ...]] = [()] * self._size
        for members in self._groups.values():
            stacked = torch.stack([x for _, x in members])
            for (i, x), row in zip(members, _row_stats(stacked, self.fmt), strict=True):
                low, high = _SAFE_SUMS
                if all(v == 0 or low <= v <= high for v in row[5:]):
                    rows[i] = row
                else:
                    rows[i] = tuple(float(v) for v in raw_cast_stats(x, self.fmt))
        self._groups, self._size = {}, 0
        return rows


def _row_stats(rows: torch.Tensor, fmt: FPFormat) -> list[tuple[float, ...]]:
    """:data:`RAW_FIELDS` of each row of a 2-D float32 tensor of at most :data:`BATCH_MAX` columns.

    Row sums, not einsum or bmm (several times slower here); the second pass of the std, the
    zero count and the overflow clamp are skipped for the whole group where no row needs them.
    """
    g, n = rows.shape
    total = rows.sum(1)
    signal = (rows * rows).sum(1)
    a = rows.abs()
    flags = torch.empty_like(a)  # 0/1 floats: their row sums are exact counts (n <= 2**24)
    small = torch.lt(a, fmt.min_subnormal, out=flags).sum(1)
    zeros = torch.eq(a, 0, out=flags).sum(1) if bool(small.any()) else torch.zeros_like(small)
    absmax = a.amax(1)
    in_range = bool((absmax <= fmt.max_value).all())
    over = torch.zeros_like(small) if in_range else torch.gt(a, fmt.max_value, out=flags).sum(1)
    magic = _magic(fmt)
    if magic is not None and in_range:
        error = _round_magic(a.view(-1), magic, Scratch()).sub_(a.view(-1)).view(g, n)
    else:
        error = rounding_error(a.view(-1), fmt).view(g, n)  # |x|'s error squares as x's does
    noise = error.mul_(error).sum(1)
    stats = torch.stack([absmax, n - zeros, small - zeros, over, signal, noise], 1).tolist()
    return [
        (std, r[0], int(r[1]), int(r[2]), int(r[3]), r[4], r[5])
        for std, r in zip(_row_std(rows, total, signal), stats, strict=True)
    ]


def _row_std(rows: torch.Tensor, total: torch.Tensor, squares: torch.Tensor) -> list[float]:
    """Each row's std from its sum and sum of squares where they do not cancel, else about the mean.

    As :func:`~unitscale.tracking.stats.std_stat` decides: where the mean squared exceeds the
    variance so found (a constant row, all-positive data) the group is summed again about its
    float32 mean, corrected by the deviations' own sum. For a constant row the deviations are
    one small multiple of the value's ulp, every sum is exact and the std exactly 0.
    """
    n = rows.shape[1]
    if n == 1:
        return [0.0] * rows.shape[0]
    total64, squares64 = total.double(), squares.double()
    mean = total64 / n
    var = (squares64 - total64 * mean) / (n - 1)
    if bool((mean * mean <= var).all()):
        return var.sqrt_().tolist()
    deviations = rows - (total / n)[:, None]
    shift = deviations.sum(1).double()
    squares64 = deviations.mul_(deviations).sum(1).double()
    return ((squares64 - shift * shift / n) / (n - 1)).clamp_(min=0).sqrt_().tolist()


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
    >>> from unitscale.tracking import cast_stats
    >>> s = cast_stats(torch.tensor([0.0, 0.5, 1e-4, 1000.0]), FP8_E4M3)
    >>> s.absmax, round(s.underflow, 3), round(s.overflow, 3)
    (1000.0, 0.333, 0.333)
    >>> cast_stats(torch.tensor([0.5, -2.0]), FP8_E4M3).sqnr_db
    inf
    """
    raw = raw_cast_stats(t, fmt)
    return finish_cast_stats(tuple(float(v) for v in raw))
