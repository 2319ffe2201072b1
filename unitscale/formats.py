"""Floating-point formats for simulating low-precision training in float32.

:class:`FPFormat` rounds to a sign/exponent/mantissa format, subnormals included, bit-exact
against torch's casts: ``FP8_E4M3`` equals ``x.to(torch.float8_e4m3fn)``; ``FP8_E5M2``, ``FP16``
and ``BF16`` equal ``x.to(torch.float8_e5m2)``, ``x.half()`` and ``x.bfloat16()`` in range, and
everywhere with ``saturate=False``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import torch

from unitscale.errors import FormatError

__all__ = ["FPFormat", "FP8_E4M3", "FP8_E5M2", "FP16", "BF16", "underflow_fraction"]

_ROUNDING_MODES = ("nearest", "stochastic")
# per float dtype: the integer view, the exponent field's mask, the largest power of two
_EXPONENT_BITS = {
    torch.float32: (torch.int32, 0x7F800000, 2.0**127),
    torch.float64: (torch.int64, 0x7FF0000000000000, 2.0**1023),
}


@dataclasses.dataclass(frozen=True)
class FPFormat:
    """A sign/exponent/mantissa floating-point format, simulated in float32.

    Args:
        exponent_bits: exponent width, 2 to 8 (float32's range bounds what can be simulated).
        mantissa_bits: stored mantissa width (without the implicit bit), 0 to 23.
        rounding: ``"nearest"`` (ties to even, as hardware casts) or ``"stochastic"``.
        infinities: ``True`` for IEEE-style formats whose top exponent holds inf and NaN;
            ``False`` for "fn" formats (such as E4M3) that keep only the all-ones pattern for NaN.
        saturate: clamp out-of-range results, infinities included, to ``±max_value`` (``True``,
            as FP8 recipes do) or overflow to ``±inf`` / NaN like an IEEE cast (``False``).
            NaN stays NaN either way.

    Raises:
        FormatError: for bit counts outside the ranges above, a non-integer count, an
            unknown rounding mode, ``infinities`` or ``saturate`` not a ``bool``, or an
            "fn" format with no mantissa bits.

    >>> from unitscale.formats import FP8_E4M3, FPFormat
    >>> fmt = FPFormat(4, 3, infinities=False)
    >>> fmt == FP8_E4M3, fmt.max_value, fmt.min_normal, fmt.min_subnormal
    (True, 448.0, 0.015625, 0.001953125)
    """

    exponent_bits: int
    mantissa_bits: int
    rounding: str = "nearest"
    infinities: bool = True
    saturate: bool = True

    def __post_init__(self) -> None:
        for name, value, low, high in (
            ("exponent_bits", self.exponent_bits, 2, 8),
            ("mantissa_bits", self.mantissa_bits, 0, 23),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise FormatError(f"FPFormat: {name}={value!r} must be an int")
            if not low <= value <= high:
                raise FormatError(
                    f"FPFormat: {name}={value} is outside {low}..{high}; "
                    f"float32 simulates formats with at most 8 exponent bits and 23 mantissa bits"
                )
        for name, flag in (("infinities", self.infinities), ("saturate", self.saturate)):
            if not isinstance(flag, bool):
                raise FormatError(f"FPFormat: {name}={flag!r} must be True or False")
        if not isinstance(self.rounding, str) or self.rounding not in _ROUNDING_MODES:
            raise FormatError(f"FPFormat: rounding={self.rounding!r} is unknown; use 'nearest' or 'stochastic'")
        if not self.infinities and self.mantissa_bits == 0:
            raise FormatError(
                "FPFormat: infinities=False needs mantissa_bits >= 1 (the top exponent would hold only NaN)"
            )

    def __repr__(self) -> str:
        extras = "" if self.rounding == "nearest" else f", rounding={self.rounding!r}"
        extras += "" if self.infinities else ", infinities=False"
        extras += "" if self.saturate else ", saturate=False"
        return f"FPFormat({self.exponent_bits}, {self.mantissa_bits}{extras})"

    @property
    def bias(self) -> int:
        """The exponent bias, ``2**(exponent_bits - 1) - 1``."""
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max_value(self) -> float:
        """The largest finite value (448 for E4M3, 57344 for E5M2, 65504 for FP16)."""
        top = 2**self.exponent_bits - 1 - self.bias
        if self.infinities:
            return 2.0 ** (top - 1) * (2 - 2.0**-self.mantissa_bits)
        return 2.0**top * (2 - 2.0 ** (1 - self.mantissa_bits))

    @property
    def min_normal(self) -> float:
        """The smallest positive normal value, ``2**(1 - bias)``."""
        return 2.0 ** (1 - self.bias)

    @property
    def min_subnormal(self) -> float:
        """The smallest positive value, ``2**(1 - bias - mantissa_bits)``."""
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    def replace(self, **changes: Any) -> FPFormat:
        """A copy with some fields changed.

        >>> from unitscale.formats import FP8_E5M2
        >>> FP8_E5M2.replace(saturate=False)
        FPFormat(5, 2, saturate=False)
        """
        return dataclasses.replace(self, **changes)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Round ``x`` without autograd (see :meth:`quantise`), in float32 (float64 stays float64); same dtype out.

        >>> import torch
        >>> from unitscale.formats import FP16
        >>> FP16.round(torch.tensor([1 + 2**-11, 1 + 3 * 2**-11])).tolist()
        [1.0, 1.001953125]
        """
        self._check_tensor("round", x)
        if not x.is_floating_point():
            raise FormatError(f"{self!r}: can only quantise floating-point tensors, got dtype {x.dtype}")
        work = x if x.dtype == torch.float64 else x.float()
        # 2**floor(log2|x|), read from the exponent bits (frexp and ldexp cost five times more);
        # the spacing of values is that times 2**-mantissa_bits, fixed below the normal range.
        # Infinities and NaNs have the top exponent: capped, so inf / ulp stays inf.
        bits, exponent_mask, top = _EXPONENT_BITS[work.dtype]
        power = (work.view(bits) & exponent_mask).view(work.dtype)
        step = 2.0**-self.mantissa_bits
        ulp = (power * step).clamp_(self.min_subnormal, top * step)
        scaled = work / ulp
        if self.rounding == "stochastic":
            out = torch.floor(scaled + torch.rand_like(scaled)) * ulp
        else:
            out = torch.round(scaled) * ulp
        limit = self.max_value
        if self.saturate:
            out = torch.clamp(out, -limit, limit)
        elif self.infinities:
            out = torch.where(out.abs() > limit, torch.copysign(torch.full_like(out, float("inf")), work), out)
        else:
            out = torch.where(out.abs() > limit, torch.full_like(out, float("nan")), out)
        return out.to(x.dtype)

    def _check_tensor(self, method: str, x: Any) -> None:
        # A list or a number would reach torch's custom-op dispatcher, which raises an untyped error.
        if not isinstance(x, (torch.Tensor, torch.fx.Proxy)):
            raise FormatError(
                f"{self!r}.{method}: x is a {type(x).__name__} ({x!r:.40}); pass a floating-point tensor, "
                "e.g. torch.tensor(x)"
            )

    def _op_args(self) -> tuple[int, int, bool, bool, bool]:
        return (self.exponent_bits, self.mantissa_bits, self.infinities, self.saturate, self.rounding == "stochastic")

    def quantise(self, x: torch.Tensor) -> torch.Tensor:
        """Round ``x`` in the forward pass and its gradient in the backward pass.

        >>> import torch
        >>> from unitscale.formats import FP8_E4M3
        >>> x = torch.tensor([0.1], requires_grad=True)
        >>> y = FP8_E4M3.quantise(x)
        >>> y.backward(torch.tensor([0.1]))
        >>> y.item(), x.grad.item()
        (0.1015625, 0.1015625)

        Raises:
            FormatError: ``x`` is not a tensor (a list, a number).
        """
        self._check_tensor("quantise", x)
        return self.quantise_bwd(self.quantise_fwd(x))

    def quantise_fwd(self, x: torch.Tensor) -> torch.Tensor:
        """Round ``x`` in the forward pass; pass the gradient through unchanged (straight-through).

        One opaque op (``torch.ops.unitscale.quantise_fwd``) to TorchDynamo, ``torch.compile`` and fx.

        >>> import torch
        >>> from unitscale.formats import FP8_E4M3
        >>> x = torch.tensor([0.1], requires_grad=True)
        >>> FP8_E4M3.quantise_fwd(x).backward(torch.tensor([0.1]))
        >>> x.grad.item() == torch.tensor(0.1).item()
        True
        """
        self._check_tensor("quantise_fwd", x)
        return torch.ops.unitscale.quantise_fwd(x, *self._op_args())

    def quantise_bwd(self, x: torch.Tensor) -> torch.Tensor:
        """Return ``x`` unchanged; round its gradient in the backward pass.

        >>> import torch
        >>> from unitscale.formats import FP8_E5M2
        >>> x = torch.tensor([0.1], requires_grad=True)
        >>> y = FP8_E5M2.quantise_bwd(x)
        >>> y.backward(torch.tensor([0.1]))
        >>> y.item() == torch.tensor(0.1).item(), x.grad.item()
        (True, 0.09375)
        """
        self._check_tensor("quantise_bwd", x)
        return torch.ops.unitscale.quantise_bwd(x, *self._op_args())


@functools.cache  # called twice per rounded tensor per step: FPFormat validates its fields
def _format_of(exponent_bits: int, mantissa_bits: int, infinities: bool, saturate: bool, stochastic: bool) -> FPFormat:
    rounding = "stochastic" if stochastic else "nearest"
    return FPFormat(exponent_bits, mantissa_bits, rounding, infinities, saturate)


# Custom ops rather than autograd.Functions: one opaque node for TorchDynamo, torch.compile and fx
# symbolic tracing alike, with the format passed as plain numbers.
@torch.library.custom_op("unitscale::quantise_fwd", mutates_args=())
def _quantise_fwd(x: torch.Tensor, e: int, m: int, infinities: bool, saturate: bool, stochastic: bool) -> torch.Tensor:
    return _format_of(e, m, infinities, saturate, stochastic).round(x)


@torch.library.custom_op("unitscale::quantise_bwd", mutates_args=())
def _quantise_bwd(x: torch.Tensor, e: int, m: int, infinities: bool, saturate: bool, stochastic: bool) -> torch.Tensor:
    return x.clone()


@_quantise_fwd.register_fake
@_quantise_bwd.register_fake
def _quantise_fake(x: torch.Tensor, e: int, m: int, infinities: bool, saturate: bool, stochastic: bool) -> torch.Tensor:
    return torch.empty_like(x)


def _save_format(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    ctx.format_args = inputs[1:]


def _straight_through(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return (grad, None, None, None, None, None)


def _round_grad(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
    return (_format_of(*ctx.format_args).round(grad), None, None, None, None, None)


_quantise_fwd.register_autograd(_straight_through, setup_context=_save_format)
_quantise_bwd.register_autograd(_round_grad, setup_context=_save_format)


FP8_E4M3 = FPFormat(4, 3, infinities=False)
FP8_E5M2 = FPFormat(5, 2)
FP16 = FPFormat(5, 10)
BF16 = FPFormat(8, 7)


def underflow_fraction(x: torch.Tensor, fmt: FPFormat) -> float:
    """The fraction of the nonzero finite elements of ``x`` that ``fmt`` rounds to zero (0.0 if none).

    Zeros already in ``x`` (masked values, unused embedding rows), NaN and infinities are not
    counted. With stochastic rounding the result is one random draw.

    Raises:
        FormatError: ``fmt`` is not an :class:`FPFormat`, or ``x`` is not a
            floating-point tensor.

    >>> import torch
    >>> from unitscale.formats import FP8_E5M2, FP16, underflow_fraction
    >>> grad = torch.tensor([0.0, 1e-3, 1e-5, 1e-6, 2.0**-17, -2.0**-18])
    >>> underflow_fraction(grad, FP8_E5M2)  # 1e-6, 2**-17, -2**-18 of five nonzero
    0.6
    """
    if not isinstance(fmt, FPFormat):
        raise FormatError(f"underflow_fraction: fmt={fmt!r} is not an FPFormat (e.g. unitscale.formats.FP8_E5M2)")
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        got = f"a tensor of dtype {x.dtype}" if isinstance(x, torch.Tensor) else type(x).__name__
        raise FormatError(f"underflow_fraction: x must be a floating-point tensor, got {got}")
    x = x.detach()
    nonzero = (x != 0) & torch.isfinite(x)
    count = int(nonzero.sum())
    return int((nonzero & (fmt.round(x) == 0)).sum()) / count if count else 0.0
