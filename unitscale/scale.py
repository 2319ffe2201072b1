"""Per-tensor scales: the standard deviation of a tensor and of its gradient.

A :class:`ScaleRecord` holds the statistics of one tensor as 0-dim tensors on the
tensor's own device, so recording never waits for the device; :func:`read_records`
copies all of them to the host in one transfer at the end. :class:`ScaleTracker` is
an identity ``autograd.Function`` that fills a record in forward and backward.
:class:`ScalePair` is what a reader sees: ``(-> forward std, <- backward std)``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["ScalePair", "ScaleRecord", "ScaleTracker", "read_records", "scratch_space", "tensor_std", "tensor_abs_max"]


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    # Round to 3 significant digits, then let float's repr drop trailing zeros (1.0, 0.236).
    return repr(float(f"{value:.3g}"))


@dataclass(frozen=True)
class ScalePair:
    """A tensor's forward scale and its gradient's scale (standard deviations).

    Prints as ``(-> forward, <- backward)`` with 3 significant digits; a direction
    that was not recorded prints as ``n/a``.

    Args:
        forward: std of the tensor, or ``None`` if unknown.
        backward: std of its gradient, or ``None`` if unknown (no backward pass, or
            the tensor does not require grad).

    >>> ScalePair(1.0, 0.23649)
    (-> 1.0, <- 0.236)
    >>> print(ScalePair(0.000123456, None))
    (-> 0.000123, <- n/a)
    """

    forward: float | None = None
    backward: float | None = None

    def __repr__(self) -> str:
        return f"(-> {_fmt(self.forward)}, <- {_fmt(self.backward)})"

    __str__ = __repr__


class ScaleRecord:
    """Mutable holder of one tensor's statistics, kept as 0-dim device tensors.

    ``forward`` and ``backward`` are stds, ``abs_max`` the largest magnitude in
    forward; each is ``None`` until recorded (or when the tensor is empty).

    >>> record = ScaleRecord()
    >>> record.record_forward(torch.tensor([1.0, 3.0]), abs_max=True)
    >>> read_records([record])
    [(1.4142135381698608, None, 3.0)]
    """

    __slots__ = ("forward", "backward", "abs_max")

    def __init__(self) -> None:
        self.forward: torch.Tensor | None = None
        self.backward: torch.Tensor | None = None
        self.abs_max: torch.Tensor | None = None

    def record_forward(self, t: torch.Tensor, abs_max: bool = False) -> None:
        """Record the std (and optionally the abs-max) of ``t``; no host sync."""
        self.forward = tensor_std(t)
        if abs_max:
            self.abs_max = tensor_abs_max(t)

    def record_backward(self, grad: torch.Tensor) -> None:
        """Record the std of a gradient; no host sync."""
        self.backward = tensor_std(grad)


def tensor_std(t: torch.Tensor) -> torch.Tensor | None:
    """``torch.std`` of ``t`` as a float32 0-dim tensor on ``t``'s device.

    Empty tensors give ``None``; a one-element tensor gives 0 (``torch.std`` would give
    NaN and a warning). Low-precision tensors are reduced in float32.

    >>> tensor_std(torch.tensor([1.0, 2.0, 3.0]))
    tensor(1.)
    >>> tensor_std(torch.tensor([5.0])), tensor_std(torch.empty(0))
    (tensor(0.), None)
    """
    n = t.numel()
    if n == 0:
        return None
    t = t.detach()
    if t.dtype != torch.float32 and t.dtype != torch.float64:
        t = t.float()
    if n == 1:
        return torch.zeros((), dtype=t.dtype, device=t.device)
    scratch = getattr(_scratch, "buffer", None)
    if scratch is not None and t.device.type == "cpu":
        # A fresh multi-megabyte temporary per tensor costs page faults on CPU; reuse one.
        if scratch.numel() < n or scratch.dtype != t.dtype:
            scratch = _scratch.buffer = torch.empty(n, dtype=t.dtype)
        deviations = torch.sub(t, t.mean(), out=scratch[:n].view(t.shape))
        return torch.linalg.vector_norm(deviations) / math.sqrt(n - 1)
    # Two passes (mean, then the norm of the deviations) stay accurate when the mean
    # dwarfs the std, unlike a one-pass sum of squares, and are about 3x faster than
    # torch.std's Welford kernel on CPU.
    return torch.linalg.vector_norm(t - t.mean()) / math.sqrt(n - 1)


_scratch = threading.local()


@contextmanager
def scratch_space() -> Iterator[None]:
    """Within this context, :func:`tensor_std` on CPU reuses one buffer per thread.

    The buffer grows to the largest tensor seen and is released on exit.

    >>> with scratch_space():
    ...     tensor_std(torch.tensor([1.0, 2.0, 3.0]))
    tensor(1.)
    """
    previous = getattr(_scratch, "buffer", None)
    _scratch.buffer = torch.empty(0)
    try:
        yield
    finally:
        _scratch.buffer = previous


def tensor_abs_max(t: torch.Tensor) -> torch.Tensor | None:
    """Largest magnitude in ``t`` as a 0-dim tensor on its device; ``None`` if empty.

    >>> tensor_abs_max(torch.tensor([1.0, -4.0, 2.0]))
    tensor(4.)
    """
    if t.numel() == 0:
        return None
    low, high = torch.aminmax(t.detach())
    return torch.maximum(high, -low)


def read_records(records: Sequence[ScaleRecord]) -> list[tuple[float | None, float | None, float | None]]:
    """Copy every record's ``(forward, backward, abs_max)`` to Python floats in one transfer.

    All recorded values are stacked on their device and read with a single ``tolist()``
    per device and dtype, instead of one ``.item()`` (one host sync) per tensor.

    Args:
        records: the records to read.

    Returns:
        One ``(forward, backward, abs_max)`` tuple per record; ``None`` where not recorded.

    >>> r = ScaleRecord(); r.record_forward(torch.ones(4))
    >>> read_records([r, ScaleRecord()])
    [(0.0, None, None), (None, None, None)]
    """
    slots: list[tuple[int, int, torch.Tensor]] = []
    for i, record in enumerate(records):
        for j, value in enumerate((record.forward, record.backward, record.abs_max)):
            if value is not None:
                slots.append((i, j, value))
    rows: list[list[float | None]] = [[None, None, None] for _ in records]
    groups: dict[tuple[torch.device, torch.dtype], list[tuple[int, int, torch.Tensor]]] = {}
    for slot in slots:
        groups.setdefault((slot[2].device, slot[2].dtype), []).append(slot)
    for group in groups.values():
        values = torch.stack([v for _, _, v in group]).tolist()
        for (i, j, _), value in zip(group, values, strict=True):
            rows[i][j] = value
    return [(r[0], r[1], r[2]) for r in rows]


class ScaleTracker(torch.autograd.Function):
    """An identity op that records a tensor's std in forward and its gradient's std in backward.

    Call it as ``ScaleTracker.apply(tensor, record)`` with a :class:`ScaleRecord`; the
    stds stay on the device until :func:`read_records`. Like any custom Function that
    returns its input, its output must not be modified in place (clone it first).

    >>> x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    >>> record = ScaleRecord()
    >>> y = ScaleTracker.apply(x, record)
    >>> (y * 2).sum().backward()
    >>> ScalePair(*read_records([record])[0][:2])
    (-> 1.0, <- 0.0)
    """

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, record: ScaleRecord) -> torch.Tensor:
        ctx.record = record
        record.record_forward(x)
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.record.record_backward(grad)
        return grad, None
