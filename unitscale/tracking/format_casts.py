"""What casting one tensor to a low-precision format would cost: underflow, overflow and SQNR.

On the CPU the statistics are bit-identical to the plain definitions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import torch

from unitscale.formats import FPFormat
from unitscale.tracking.report import read_stats
from unitscale.tracking.stats import Stat, reads_at_once, std_from_sums, std_stat, sum_of_squares

__all__ = [
    "BLOCK",
    "CAPACITY",
    "DEVICE_CAPACITY",
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
        std: standard deviation (:func:`~unitscale.tracking.std_stat`'s, ``torch.std(correction=0)``).
        underflow, overflow: fractions of the nonzero elements (zeros cast exactly) whose magnitude
            is below the format's smallest subnormal, or above its largest finite value (or infinite).
        sqnr_db: ``10 * log10(signal power / quantisation-noise power)`` of the format's
            rounding; ``inf`` where the format holds the tensor exactly (all-zero
            tensors included); NaN where the tensor holds a NaN or an infinity.

    >>> import torch
    >>> from unitscale.formats import FP8_E5M2
    >>> from unitscale.tracking import cast_stats
    >>> stats = cast_stats(torch.tensor([1.0, -3.0]), FP8_E5M2)
    >>> stats.std, stats.absmax, stats.underflow, stats.overflow
    (2.0, 3.0, 0.0, 0.0)
    >>> stats.sqnr_db  # both values are exact in E5M2: no noise
    inf
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
    """Reusable buffers, one per dtype, device and slot, grown to the largest tensor seen (no page faults per op)."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.dtype, torch.device, int], torch.Tensor] = {}

    def get(self, n: int, dtype: torch.dtype, device: torch.device, slot: int = 0) -> torch.Tensor:
        """``n`` elements of scratch of ``dtype`` on ``device`` (``slot`` tells two live buffers apart)."""
        key = (dtype, device, slot)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < n:
            buffer = self._buffers[key] = torch.empty(n, dtype=dtype, device=device)
        return buffer[:n]


# Rounding by a magic number, about 4x faster than torch's E4M3 round trip. For a float32 c whose
# format spacing is ulp = 2**(e - m) (e = max(floor(log2|c|), emin)), M = 1.5 * 2**(e - m + 23) has
# spacing ulp and c + M stays in M's binade while |c| < M / 3, so the hardware's round-to-nearest-
# even of c + M rounds c to the grid and subtracting M is exact. Needs m <= 21 and e - m + 23 in
# float32's normal exponents: E4M3, E5M2 and FP16 (not BF16).
_EXPONENT_FIELD = 0x7F800000
_FLOAT32_TINY = 2.0**-126  # float32's smallest normal


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


def _binade(c: torch.Tensor, scratch: Scratch) -> torch.Tensor:
    """|c|'s binade 2**floor(log2|c|) as a float (0: subnormals, zeros), from 1-D float32 ``c``'s exponent bits."""
    bits = scratch.get(c.numel(), torch.int32, c.device, _MAGIC)
    return torch.bitwise_and(c.view(torch.int32), _EXPONENT_FIELD, out=bits).view(torch.float32)


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

    >>> from unitscale.formats import FP8_E4M3
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
        return _round_binade(clamped, _binade(clamped, scratch), magic, scratch).sub_(x)
    assert low is not None
    error = scratch.get(n, x.dtype, x.device, _WORK)
    return error.copy_(scratch.get(n, low, x.device).copy_(clamped)).sub_(x)


def raw_cast_stats(t: torch.Tensor, fmt: FPFormat, scratch: Scratch | None = None) -> tuple[Stat, ...]:
    """The sums behind :class:`CastStats` (see :data:`RAW_FIELDS`): floats on the CPU, 0-dim tensors elsewhere.

    ``t``: a nonempty floating-point tensor.

    >>> import torch
    >>> from unitscale.formats import FP8_E4M3
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
    # x's binade gives the underflow and the magic number, so no |x| is written unless something
    # overflows. Indicators are 0/1 floats (a float compare-and-sum is ~4x faster than counting bools).
    # On the CPU each value is read as it comes, so a tensor skips the counts nothing needs.
    n, device = x.numel(), x.device
    host = reads_at_once(device)
    flags = scratch.get(n, x.dtype, device, _WORK)
    magic = _magic(fmt) if x.dtype == torch.float32 else None
    binade = _binade(x, scratch) if magic is not None and fmt.min_subnormal >= _FLOAT32_TINY else None
    under = binade if binade is not None else torch.abs(x, out=scratch.get(n, x.dtype, device, _ABS))
    a = None if binade is not None else under  # |x|, where written

    def count(flagged: torch.Tensor) -> Stat:  # 0/1 floats: every partial sum below 2**24 is exact
        wide = flagged.sum(dtype=torch.float64 if n >= 2**24 else None)
        return int(wide.item()) if host else wide

    std: Stat | None = None
    signal: Any
    noise: Any
    peak = a.max() if a is not None else torch.maximum(x.amax(), x.amin().neg_())
    if host:
        total, signal = x.sum().item(), sum_of_squares(x)
        std = std_from_sums(n, total, signal, x.dtype)
        absmax: Stat = peak.item() + 0.0  # + 0.0: a -0.0 maximum reads as |x|'s 0.0
    else:
        absmax, signal = peak, math.nan
    if std is None:  # an accelerator's, or where the sums cancel: std_stat's
        std = std_stat(x)
    small = count(torch.lt(under, fmt.min_subnormal, out=flags))
    zeros = count(torch.eq(x, 0, out=flags)) if small or not host else 0
    over: Stat = 0
    in_range = host and absmax <= fmt.max_value  # False for NaN too
    if not in_range:
        a = a if a is not None else torch.abs(x, out=scratch.get(n, x.dtype, device, _ABS))
        over = count(torch.gt(a, fmt.max_value, out=flags))
    if magic is not None and binade is not None and in_range:
        error = _round_binade(x, binade, magic, scratch).sub_(x)
    else:
        error = rounding_error(x, fmt, scratch)
    noise = sum_of_squares(error) if host else math.nan
    low, high = _SAFE_SUMS
    if not (host and low <= signal <= high and (noise == 0 or low <= noise <= high)):
        # squares past float32's range (values below about 1e-19 or above 1e19, or all zero), or an
        # accelerator's sums, left there: in float64 (not on MPS)
        wide = None if device.type == "mps" else torch.float64
        sums = [torch.linalg.vector_norm(v, dtype=wide).square() for v in (x, error)]
        signal, noise = (sums[0].item(), sums[1].item()) if host else (sums[0], sums[1])
    assert std is not None  # x is not empty
    return (std, absmax, n - zeros, small - zeros, over, signal, noise)


BLOCK = 256
""":class:`CastBatch` lays each tensor out in rows of this many elements, its last row padded with zeros."""

CAPACITY = 2**20
"""Elements a :class:`CastBatch` holds in CPU memory before it measures them (4 MB): larger
buffers fall out of cache, smaller ones pay the ~25 op calls of a measurement more often."""

DEVICE_CAPACITY = 2**23
"""The same on an accelerator, where each measurement ends in one read (a host sync): 32 MB."""

# Sums outside this range may have overflowed or lost terms to underflow in float32 block sums;
# such tensors are measured again by raw_cast_stats, so both paths agree on inf and NaN SQNRs.
_SAFE_SUMS = (2.0**-60, 2.0**60)


class _Segment(NamedTuple):
    """One added tensor's place in a device's buffer."""

    row: int  # its index in finish()
    start: int  # its first block
    blocks: int
    n: int  # its elements (the rest of its last block is zeros)


@dataclass
class _Flat:
    """A device's buffer of copies waiting to be measured, in blocks of :data:`BLOCK`."""

    buffer: torch.Tensor
    used: int = 0
    segments: list[_Segment] = field(default_factory=list)


class CastBatch:
    """Many tensors measured against one format together: :func:`raw_cast_stats` in a few big ops.

    :meth:`add` copies each (as float32: it may change in place before the step ends) into one
    buffer per device; a full buffer (or :meth:`finish`) measures them all. The counts and
    abs-max are :func:`raw_cast_stats`'s, the sums agree with its to float32 rounding. Memory:
    the buffer and about four work buffers of its size per device, kept for reuse.

    Args:
        capacity: elements per buffer (at least :data:`DEVICE_CAPACITY` on an accelerator; grown
            to the largest tensor added).

    >>> import torch
    >>> from unitscale.formats import FP8_E4M3
    >>> batch = CastBatch(FP8_E4M3)
    >>> a, b = torch.tensor([0.0, 1.0, 1e-4, 1e3]), torch.tensor([0.5, 0.3, 0.0, 2.0])
    >>> batch.add(a), batch.add(b)
    (0, 1)
    >>> [row[2:5] for row in batch.finish()]
    [(3, 1, 1), (3, 0, 0)]
    """

    def __init__(self, fmt: FPFormat, capacity: int = CAPACITY) -> None:
        self.fmt = fmt
        self._capacity = max(BLOCK, -(-capacity // BLOCK) * BLOCK)
        self._flats: dict[torch.device, _Flat] = {}
        self._scratch = Scratch()
        self.clear()

    def __len__(self) -> int:
        return self._size

    def clear(self) -> None:
        """Forget every tensor added and not yet read (the buffers stay, for reuse)."""
        self._size = 0
        self._done: list[tuple[list[int], list[tuple[float, ...]]]] = []
        self._raw: dict[int, tuple[Stat, ...]] = {}
        for flat in self._flats.values():
            flat.used, flat.segments = 0, []

    def add(self, t: torch.Tensor) -> int:
        """Copy a nonempty floating-point ``t`` into the batch; returns its row in :meth:`finish`."""
        n = t.numel()
        if n == 0:
            raise ValueError("CastBatch.add needs a nonempty tensor")
        row = self._size
        self._size += 1
        if t.dtype == torch.float64:
            self._raw[row] = raw_cast_stats(t, self.fmt, self._scratch)
            return row
        blocks = -(-n // BLOCK)
        need = blocks * BLOCK
        flat = self._flats.get(t.device)
        if flat is None or flat.used + need > flat.buffer.numel():
            if flat is not None and flat.segments:
                self._measure(flat)
            if flat is None or need > flat.buffer.numel():
                capacity = self._capacity if reads_at_once(t.device) else max(self._capacity, DEVICE_CAPACITY)
                buffer = torch.empty(max(capacity, need), dtype=torch.float32, device=t.device)
                flat = self._flats[t.device] = _Flat(buffer)
        used = flat.used
        if n < need:  # the last block's tail is padding: zeros
            flat.buffer.narrow(0, used + need - BLOCK, BLOCK).zero_()
        flat.buffer.narrow(0, used, n).view(t.shape).copy_(t.detach())
        flat.segments.append(_Segment(row, used // BLOCK, blocks, n))
        flat.used = used + need
        return row

    def finish(self) -> list[tuple[float, ...]]:
        """Every added tensor's :func:`raw_cast_stats`, read to Python numbers, in the order added; then empty."""
        for flat in self._flats.values():
            if flat.segments:
                self._measure(flat)
        rows = {i: row for members, measured in self._done for i, row in zip(members, measured, strict=True)}
        rows.update((i, tuple(float(v) for v in raw)) for i, raw in self._raw.items())
        size = self._size
        self.clear()
        return [rows[i] for i in range(size)]

    def _measure(self, flat: _Flat) -> None:
        measured = _segment_stats(flat.buffer[: flat.used], flat.segments, self.fmt, self._scratch)
        self._done.append(([s.row for s in flat.segments], measured))
        flat.used, flat.segments = 0, []


def _segment_stats(
    data: torch.Tensor, segments: list[_Segment], fmt: FPFormat, scratch: Scratch
) -> list[tuple[float, ...]]:
    """:data:`RAW_FIELDS` of each segment of ``data`` (float32, whole blocks, zeros after each segment)."""
    device, size = data.device, data.numel()
    host = reads_at_once(device)
    x = data.view(-1, BLOCK)
    flags = scratch.get(size, torch.float32, device, _WORK).view_as(x)  # 0/1 floats: exact row counts
    total = x.sum(1)
    root_signal = torch.linalg.vector_norm(x, dim=1)  # one read, where x * x then a sum is a write and two reads
    absmax = torch.maximum(x.amax(1), x.amin(1).neg_())  # aminmax(dim=1) is many times slower on the CPU
    binade = _binade(data, scratch).view_as(x)
    if fmt.min_subnormal >= _FLOAT32_TINY:
        small = torch.lt(binade, fmt.min_subnormal, out=flags).sum(1)
    else:  # float32's own subnormals may be above it: compare magnitudes
        small = torch.lt(torch.abs(x, out=flags), fmt.min_subnormal, out=flags).sum(1)
    padding = size - sum(s.n for s in segments)
    # Padding is zeros, below the smallest subnormal: only where something else is, count zeros.
    need_zeros = not host or small.sum(dtype=torch.float64).item() > padding
    zeros = torch.eq(x, 0, out=flags).sum(1) if need_zeros else torch.zeros_like(small)
    in_range = host and bool(absmax.max() <= fmt.max_value)  # False for NaN too
    if in_range:
        over = torch.zeros_like(small)
    else:
        a = torch.abs(x, out=scratch.get(size, torch.float32, device, _ABS).view_as(x))
        over = torch.gt(a, fmt.max_value, out=flags).sum(1)
    magic = _magic(fmt)
    if magic is not None and in_range:
        error = _round_binade(data, binade.view(-1), magic, scratch).sub_(data)
    else:
        error = rounding_error(data, fmt, scratch)
    root_noise = torch.linalg.vector_norm(error.view_as(x), dim=1)
    parts = torch.stack([total, root_signal, small, zeros, over, root_noise], 1).double()
    parts[:, 1::4].square_()  # the signal and noise per block
    lengths = torch.tensor([s.blocks for s in segments], device=device)
    sums = torch.segment_reduce(parts, "sum", lengths=lengths, axis=0).tolist()  # the one read per buffer
    maxes = torch.segment_reduce(absmax, "max", lengths=lengths).tolist()
    low, high = _SAFE_SUMS
    rows: list[tuple[float, ...]] = []
    careful: list[int] = []
    for i, (s, (t, signal, smalls, zero, over_, noise), absmax_) in enumerate(zip(segments, sums, maxes, strict=True)):
        pad = s.blocks * BLOCK - s.n
        zero = zero - pad if need_zeros else 0.0
        # A signal of 0 is an all-zero tensor only where its abs-max says so: float32 squares of
        # values below about 4e-23 are 0 too. NaN is out of range.
        zero_signal = signal == 0 and absmax_ == 0
        if not ((zero_signal or low <= signal <= high) and (noise == 0 or low <= noise <= high)):
            raw = raw_cast_stats(data[s.start * BLOCK : s.start * BLOCK + s.n], fmt)
            rows.append(tuple(float(v) for v in raw))
            continue
        std = std_from_sums(s.n, t, signal, torch.float32)
        if std is None:  # one element, or the sums cancel: std_stat of the tensor's copy, read with the others
            careful.append(i)
            std = math.nan
        rows.append((std, absmax_, s.n - int(zero), int(smalls - pad - zero), int(over_), signal, noise))
    if careful:
        stds = [std_stat(data.narrow(0, segments[i].start * BLOCK, segments[i].n)) for i in careful]
        for i, value in zip(careful, read_stats(stds), strict=True):
            rows[i] = (math.nan if value is None else value, *rows[i][1:])
    return rows


def _round_binade(c: torch.Tensor, binade: torch.Tensor, magic: _Magic, scratch: Scratch) -> torch.Tensor:
    """``c`` (1-D float32, in the format's range or NaN) rounded to it in scratch; ``binade``: its :func:`_binade`.

    The binade clamped to the format's, times ``1.5 * 2**(23 - m)``, is exactly the magic number.
    """
    p = binade.clamp_(_pow2(magic.low), _pow2(magic.high))
    k = _pow2(magic.add - (1 << 22) + (127 << 23)) * 1.5
    return torch.add(c, p, alpha=k, out=scratch.get(c.numel(), torch.float32, c.device, _WORK)).sub_(p, alpha=k)


@functools.cache
def _pow2(bits: int) -> float:
    """The float32 whose bits are a given exponent field (mantissa zero)."""
    return math.ldexp(1.0, (bits >> 23) - 127)


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
    """Std, abs-max, underflow and overflow fractions and SQNR of casting ``t`` to ``fmt``, as Python floats.

    ``t``: a nonempty floating-point tensor (low-precision dtypes are measured in float32).

    >>> import torch
    >>> from unitscale.formats import FP8_E4M3
    >>> from unitscale.tracking import cast_stats
    >>> s = cast_stats(torch.tensor([0.0, 0.5, 1e-4, 1000.0]), FP8_E4M3)
    >>> s.absmax, round(s.underflow, 3), round(s.overflow, 3)
    (1000.0, 0.333, 0.333)
    """
    raw = raw_cast_stats(t, fmt)
    return finish_cast_stats(tuple(float(v) for v in raw))
