"""Per-tensor scales: the standard deviation of a tensor and of its gradient, and the records holding them."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from unitscale.errors import InputError

__all__ = [
    "KEEP_SCRATCH_BYTES",
    "ScaleRecord",
    "ScaleTracker",
    "Stat",
    "abs_max_stat",
    "reads_at_once",
    "scratch_space",
    "std_from_sums",
    "std_stat",
    "sum_of_squares",
]


@dataclass(eq=False, slots=True)
class ScaleRecord:
    """Mutable holder of one tensor's statistics, filled in forward and in backward by :meth:`fill`.

    ``forward`` and ``backward`` are stds, ``abs_max`` the largest magnitude in forward: each a
    ``float`` on the CPU, a 0-dim tensor on an accelerator's device, ``None`` until recorded.

    >>> import torch
    >>> from unitscale.tracking import ScaleRecord
    >>> record = ScaleRecord()
    >>> record.fill(torch.tensor([1.0, 3.0]), abs_max=True)
    >>> record.fill(torch.tensor([2.0, 2.0]), "backward")
    >>> record
    ScaleRecord(forward=1.0, backward=0.0, abs_max=3.0)
    """

    forward: Stat | None = None
    backward: Stat | None = None
    abs_max: Stat | None = None

    def fill(self, t: torch.Tensor, slot: str = "forward", abs_max: bool = False, known: Stat | None = None) -> None:
        """Record the std of ``t`` in ``slot``, ``"forward"`` (with its abs-max where ``abs_max``) or ``"backward"``.

        In backward ``t`` is the gradient. ``known``: its std, measured already. No host sync.
        Any other ``slot`` raises :class:`~unitscale.errors.InputError`.
        """
        if slot == "backward":
            self.backward = std_stat(t) if known is None else known
            return
        if slot != "forward":
            raise InputError(f"ScaleRecord.fill: slot={slot!r:.60} is not known; pass 'forward' or 'backward'")
        self.forward = std_stat(t) if known is None else known
        if abs_max:
            self.abs_max = abs_max_stat(t)


Stat = float | torch.Tensor
"""What a record holds for one statistic, a ``float`` on the CPU and a 0-dim tensor on an accelerator's device."""


def reads_at_once(device: torch.device) -> bool:
    """Whether a value on ``device`` is read without waiting for the device: only the CPU's.

    >>> reads_at_once(torch.device("cpu")), reads_at_once(torch.device("meta"))
    (True, False)
    """
    return device.type == "cpu"


def std_stat(t: torch.Tensor) -> Stat | None:
    """The std of ``t``: the one definition every statistic of unitscale uses (see ``Stat``).

    The population std over all elements, ``torch.std(t, correction=0)``: the root mean square
    about the mean, what unit scaling calls a tensor's scale (so one element gives 0). Where
    ``torch.std`` has no answer or raises:

    - empty: ``None`` (no statistic to record);
    - an infinity or a NaN anywhere: NaN, as ``torch.std``;
    - integers, booleans, float16 and bfloat16: their values in float32.

    >>> import torch
    >>> from unitscale.tracking.stats import std_stat
    >>> std_stat(torch.tensor([1.0, 3.0]))
    1.0
    >>> std_stat(torch.tensor([5.0])), std_stat(torch.empty(0))
    (0.0, None)
    >>> std_stat(torch.tensor([1, 5]))  # integers: in float32
    2.0
    """
    n = t.numel()
    if n == 0:
        return None
    t = t.detach()
    if t.dtype != torch.float32 and t.dtype != torch.float64:
        t = t.float()
    if not reads_at_once(t.device):
        if t.device.type == "mps":  # no float64 there
            deviations = t - t.mean()
        else:  # about the mean in float64, as the host's careful path: no digit cancels
            deviations = t.to(torch.float64) - t.mean(dtype=torch.float64)
        return (torch.linalg.vector_norm(deviations) / math.sqrt(n)).to(t.dtype)
    flat = _flat(t)
    std = std_from_sums(n, flat.sum().item(), sum_of_squares(flat), flat.dtype)
    if std is not None:
        return std
    # About the mean, summed in float64: no digit cancels. Float64 values whose squares would
    # leave float64's range are first brought to a largest magnitude in [0.5, 1) by a power of
    # two, which changes no digit. An infinity or a NaN gives NaN, as torch.std.
    unscale = (1.0, 1.0)
    if flat.dtype == torch.float64:
        low, high = torch.aminmax(flat)
        peak = max(-low.item(), high.item())
        if peak == 0.0 or not math.isfinite(peak):
            return 0.0 if peak == 0.0 else math.nan
        if not 2.0**-400 < peak < 2.0**400:
            exponent = math.frexp(peak)[1]  # peak / 2**exponent lies in [0.5, 1)
            half = exponent // 2  # in two steps: 2**exponent alone can overflow a float
            flat = flat.mul(2.0**-half).mul_(2.0 ** (half - exponent))
            unscale = (2.0**half, 2.0 ** (exponent - half))
    # In float64 a block at a time: a float64 copy of a large tensor costs its page faults every time.
    blocks = flat.split(_DOT_BLOCK // 4)
    sums = []
    for block in blocks:  # not a generator: one more function that backward enters first (test_walk.py)
        sums.append(block.sum(dtype=torch.float64).item())
    mean = math.fsum(sums) / n
    if not math.isfinite(mean):
        return math.nan
    shift = squares = 0.0
    for block in blocks:
        deviations = block.to(torch.float64, copy=True).sub_(mean)
        shift += deviations.sum().item()
        squares += torch.dot(deviations, deviations).item()
    var = (squares - shift * shift / n) / n
    return math.sqrt(max(var, 0.0)) * unscale[0] * unscale[1] if math.isfinite(var) else math.nan


# BLAS's dot keeps a few running float32 sums: over 2**22 equal squares they drift by 2e-3 (the
# third digit a table shows); per block of 2**18 elements, the blocks added as floats, by 1.2e-4.
_DOT_BLOCK = 2**18


def sum_of_squares(x: torch.Tensor) -> float:
    """The sum of squares of ``x`` (1-D, contiguous, on the CPU), read: BLAS's dot per block of 2**18 elements.

    >>> import torch
    >>> from unitscale.tracking.stats import sum_of_squares
    >>> sum_of_squares(torch.tensor([1.0, 2.0, 2.0]))
    9.0
    """
    if x.numel() <= _DOT_BLOCK:
        return torch.dot(x, x).item()
    return math.fsum(torch.dot(block, block).item() for block in x.split(_DOT_BLOCK))


def std_from_sums(n: int, total: float, squares: float, dtype: torch.dtype) -> float | None:
    """The std of ``n`` values of ``dtype`` from their sum and :func:`sum_of_squares`, where they give it.

    ``None`` where they do not: the mean is above the std (the two sums cancel), or the
    squares under- or overflow ``dtype`` (then :func:`std_stat` measures the values again).

    >>> import torch
    >>> from unitscale.tracking.stats import std_from_sums
    >>> std_from_sums(2, 2.0, 4.0, torch.float32)  # 0, 2
    1.0
    >>> std_from_sums(3, 3000.0, 3000002.0, torch.float32) is None  # 999, 1000, 1001
    True
    """
    # Below this mean square, some squares fall under the dtype's smallest normal number (2**-126 in
    # float32) and lose digits; above it, such squares add less than 2**-26 of the sum.
    least = 2.0**-990 if dtype == torch.float64 else 2.0**-100
    if n < 1 or not n * least <= squares < math.inf:
        return None
    mean = total / n
    var = (squares - total * mean) / n
    return math.sqrt(var) if mean * mean <= var else None


def _flat(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a contiguous 1-D tensor: a view where its memory is dense, else a copy (to a scratch)."""
    dense = t if t.is_contiguous() else t.permute(sorted(range(t.dim()), key=t.stride, reverse=True))
    if dense.is_contiguous():
        return dense.view(-1)
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None:
        return t.contiguous().view(-1)
    if buffer.numel() < t.numel() or buffer.dtype != t.dtype:
        # A fresh multi-megabyte temporary per tensor costs page faults; reuse one.
        buffer = _scratch.buffer = torch.empty(t.numel(), dtype=t.dtype)
    return buffer[: t.numel()].view(t.shape).copy_(t).view(-1)


_scratch = threading.local()


KEEP_SCRATCH_BYTES = 16 * 2**20
"""A scratch buffer up to this size is kept for the thread's next :func:`scratch_space`."""


@contextmanager
def scratch_space() -> Iterator[None]:
    """Within this context, CPU stds that need a copy reuse one buffer per thread.

    The buffer grows to the largest tensor seen; on exit it is kept if :data:`KEEP_SCRATCH_BYTES` allow.

    >>> with scratch_space():
    ...     std_stat(torch.tensor([1.0, 3.0]).expand(3, 2))
    1.0
    """
    previous = getattr(_scratch, "buffer", None), getattr(_scratch, "owner", None)
    kept = getattr(_scratch, "kept", None)
    if kept is None or (kept.is_inference() and not torch.is_inference_mode_enabled()):
        kept = torch.empty(0)  # one made under torch.inference_mode() cannot be written outside it
    _scratch.buffer, _scratch.kept = kept, None
    _scratch.owner = owner = object()
    try:
        yield
    finally:
        # Only this thread's innermost scratch space puts the previous one back: one entered by a
        # recording never closed (its ``cleanup``) ends when it is collected, anywhere, any time.
        if getattr(_scratch, "owner", None) is owner:
            buffer = _scratch.buffer
            if buffer.numel() * buffer.element_size() <= KEEP_SCRATCH_BYTES:
                _scratch.kept = buffer
            _scratch.buffer, _scratch.owner = previous


def abs_max_stat(t: torch.Tensor) -> Stat | None:
    """Largest magnitude in ``t`` as a statistic to record (see :data:`Stat`); ``None`` if empty.

    >>> abs_max_stat(torch.tensor([1.0, -4.0, 2.0])), abs_max_stat(torch.empty(0))
    (4.0, None)
    """
    if t.numel() == 0:
        return None
    low, high = torch.aminmax(t.detach())
    value = torch.maximum(high, -low)
    return value.item() if reads_at_once(value.device) else value


class ScaleTracker(torch.autograd.Function):
    """An identity op that records a tensor's std in forward and its gradient's std in backward.

    Call it as ``ScaleTracker.apply(tensor, record)`` with a :class:`ScaleRecord`. Like any
    custom Function that returns its input, its output must not be modified in place.

    >>> import torch
    >>> from unitscale.tracking import ScalePair, ScaleRecord, ScaleTracker
    >>> x = torch.tensor([1.0, 3.0], requires_grad=True)
    >>> record = ScaleRecord()
    >>> (ScaleTracker.apply(x, record) * 2).sum().backward()
    >>> ScalePair(record.forward, record.backward)  # floats on the CPU
    (-> 1.0, <- 0.0)
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, record: ScaleRecord) -> torch.Tensor:
        if not isinstance(record, ScaleRecord) or not isinstance(x, torch.Tensor):
            raise InputError(
                f"ScaleTracker.apply(tensor, record) got ({type(x).__name__}, {type(record).__name__}); "
                "pass a tensor and a ScaleRecord()"
            )
        ctx.record = record
        record.fill(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.record.fill(grad, "backward")
        return grad, None
