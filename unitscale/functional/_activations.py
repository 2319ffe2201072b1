"""Pointwise nonlinearities and softmax, scaled by their Gaussian moments."""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._normal import cdf, partial_moment, pdf
from unitscale.functional._scale import _constrain, _constrained_scale, scale
from unitscale.scaling import softmax_stats as _stats
from unitscale.scaling.checks import check_approximate, check_mult
from unitscale.scaling.constant import constant_result as _constant_result
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    import torch
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


# Std of GELU(x) and of GELU'(x) for x ~ N(0, 1), by quadrature on [-12, 12]
# (tests/test_functional.py recomputes them). Exact and tanh forms agree to 1e-5.
_GELU_OUT_STD = 0.587915
_GELU_GRAD_STD = 0.675167
# Std of SiLU(x) and of SiLU'(x) for x ~ N(0, 1), by quadrature on [-12, 12], as for GELU.
_SILU_OUT_STD = 0.559538
_SILU_GRAD_STD = 0.616021
# ReLU's output and derivative both have root-mean-square sqrt(1/2) for N(0, 1) input.
_RELU_SCALE = 2**0.5

# (kind, mult) -> (mean, mean square, mean square of the derivative) of x * gate(mult * x) for
# x ~ N(0, 1), computed once each.
_MOMENTS: dict[tuple[str, float], tuple[float, float, float]] = {}


def _gate(kind: str, z: float) -> tuple[float, float]:
    """The gate of GELU (the normal cdf) or SiLU (the sigmoid) at ``z``, and its derivative."""
    if kind == "gelu":
        return cdf(z), pdf(z)
    s = 1.0 / (1.0 + _math.exp(-z)) if z > -700 else 0.0
    return s, s * (1.0 - s)


# TorchDynamo and torch.export run this once and keep its result, rather than trace 4801 steps.
@_constant_result
def _quadrature(kind: str, mult: float) -> tuple[float, float, float]:
    steps, lo, hi = 4800, -12.0, 12.0
    h = (hi - lo) / steps
    sums = [0.0, 0.0, 0.0]
    for i in range(steps + 1):
        x = lo + i * h
        weight = (1 if i in (0, steps) else 4 if i % 2 else 2) * _math.exp(-x * x / 2)
        gate, slope = _gate(kind, mult * x)
        value, derivative = x * gate, gate + mult * x * slope
        sums[0] += weight * value
        sums[1] += weight * value * value
        sums[2] += weight * derivative * derivative
    norm = h / 3 / (2 * _math.pi) ** 0.5
    return sums[0] * norm, sums[1] * norm, sums[2] * norm


def _moments(kind: str, mult: float) -> tuple[float, float, float]:
    """Mean, mean square and mean square of the derivative of ``x * gate(mult * x)``, ``x ~ N(0, 1)``."""
    key = (kind, mult)
    if key not in _MOMENTS:
        _MOMENTS[key] = _quadrature(kind, mult)
    return _MOMENTS[key]


def _gated_scales(kind: str, mult: float) -> tuple[float, float]:
    """(1 / std of the output, 1 / RMS of the derivative) of ``x * gate(mult * x)``, ``x ~ N(0, 1)``."""
    if mult == 1.0:
        return (1 / _GELU_OUT_STD, 1 / _GELU_GRAD_STD) if kind == "gelu" else (1 / _SILU_OUT_STD, 1 / _SILU_GRAD_STD)
    mean, square, slope = _moments(kind, mult)
    return (square - mean * mean) ** -0.5, slope**-0.5


@fill_docstring
def gelu(input: Tensor, approximate: str = "none", constraint: ConstraintArg = "gmean", mult: float = 1.0) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.gelu`, with u-μP's multiplier: ``gelu(mult * x) / mult``.

    Output × ``1 / std`` and input gradient × ``1 / RMS(derivative)`` for ``N(0, 1)`` input:
    ``1 / 0.5879`` and ``1 / 0.6752`` at ``mult=1``, by quadrature for any other ``mult`` (a
    larger one is more like ReLU, a smaller one more linear).

    Args:
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import gelu
    >>> _ = torch.manual_seed(0)
    >>> round(gelu(torch.randn(10_000), constraint=None, mult=4.0).std().item(), 1)
    1.0
    """
    check_approximate("gelu", approximate)
    mult = check_mult("gelu", "mult", mult)
    output_scale, grad_scale = _constrain(constraint, *_gated_scales("gelu", mult))
    output = _F.gelu(input if mult == 1.0 else input * mult, approximate=approximate)
    return scale(output, output_scale / mult, grad_scale / mult)


@fill_docstring
def silu(input: Tensor, inplace: bool = False, constraint: ConstraintArg = "gmean", mult: float = 1.0) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.silu`, with u-μP's multiplier: ``x * sigmoid(mult * x)``.

    Scaled as :func:`gelu` is: ``1 / 0.5595`` and ``1 / 0.6160`` at ``mult=1``.

    Args:
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import silu
    >>> _ = torch.manual_seed(0)
    >>> round(silu(torch.randn(10_000), constraint=None, mult=0.5).std().item(), 1)
    1.0
    """
    mult = check_mult("silu", "mult", mult)
    output_scale, grad_scale = _constrain(constraint, *_gated_scales("silu", mult))
    return scale(_F.silu(input if mult == 1.0 else input * mult), output_scale / mult, grad_scale / mult)


@fill_docstring
def silu_glu(input: Tensor, gate: Tensor, mult: float = 1.0) -> Tensor:
    """Unit-scaled SwiGLU: ``input * gate * sigmoid(mult * gate)``, scaled to unit std in both passes.

    Divided in both passes by the RMS of ``gate * sigmoid(mult * gate)`` for ``N(0, 1)`` input
    (0.66 at ``mult=1``), so the gradient stays true.

    Args:
        gate: the gate branch, same shape as ``input``.
        {mult}

    Raises:
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import silu_glu
    >>> _ = torch.manual_seed(0)
    >>> x, g = torch.randn(2, 100_000)
    >>> round(silu_glu(x, g, mult=4.0).std().item(), 1)
    1.0
    """
    mult = check_mult("silu_glu", "mult", mult)
    rms = _moments("silu", mult)[1] ** 0.5
    return input * gate * _torch.sigmoid(gate * mult) * (1 / rms)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.relu` (also the twin of :func:`torch.relu`): ``2**0.5 * relu(x)``.

    Scaled to unit root-mean-square (std 0.83), as He initialisation does: the next matmul
    passes on the second moment, and a std scale would grow activations 1.21-fold per layer.
    The derivative has the same RMS, so one scale serves both ways.

    Args:
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.

    >>> import torch
    >>> from unitscale.functional import relu
    >>> _ = torch.manual_seed(0)
    >>> y = relu(torch.randn(100_000))
    >>> round(y.pow(2).mean().sqrt().item(), 2), round(y.std().item(), 1)
    (1.0, 0.8)
    """
    return _F.relu(input) * _RELU_SCALE


def _clamp_moments(low: float, high: float) -> tuple[float, float]:
    """Mean squares of ``clamp(x, low, high)`` and of its derivative for ``x ~ N(0, 1)``."""
    tails = low * low * cdf(low) + high * high * (1 - cdf(high))
    return partial_moment(2, low, high) + tails, partial_moment(0, low, high)


@fill_docstring
def hardtanh(
    input: Tensor,
    min_val: float = -1.0,
    max_val: float = 1.0,
    inplace: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.hardtanh` (``nn.Hardtanh``, ``nn.ReLU6``): a clamp.

    Output × ``1 / RMS(clamp(x))``, input gradient × ``1 / RMS(clamp'(x))`` for ``N(0, 1)``
    input (both ``2**0.5`` on ``[0, 6]``). A range no unit input reaches is left unscaled in
    the direction it empties.

    Args:
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import hardtanh
    >>> _ = torch.manual_seed(0)
    >>> y = hardtanh(torch.randn(100_000), 0.0, 6.0)
    >>> round(y.pow(2).mean().sqrt().item(), 2)
    1.0
    """
    output, inside = _clamp_moments(float(min_val), float(max_val))
    output_scale = output**-0.5 if output > 1e-12 else 1.0
    grad_scale = inside**-0.5 if inside > 1e-12 else 1.0
    return _constrained_scale(_F.hardtanh(input, min_val, max_val), constraint, output_scale, grad_scale)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.relu6`: :func:`hardtanh` on ``[0, 6]``, about ``2**0.5 * relu6(x)``.

    Args:
        inplace: ignored (the scaled result is a new tensor).

    >>> import torch
    >>> from unitscale.functional import relu6
    >>> _ = torch.manual_seed(0)
    >>> round(relu6(torch.randn(100_000)).pow(2).mean().sqrt().item(), 2)
    1.0
    """
    return hardtanh(input, 0.0, 6.0)


@fill_docstring
def softmax(
    input: Tensor,
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: torch.dtype | None = None,
    constraint: ConstraintArg = "gmean",
    mult: float = 1.0,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.softmax` (also the twin of :func:`torch.softmax`) of ``mult * input``.

    Output × about ``n / 1.31`` and input gradient × about ``n / 1.64`` over ``n`` elements
    (from a table for small ``n``, measured for logits of std ``mult``).

    Args:
        dim: the dimension to normalise over (required, unlike torch's deprecated implicit choice).
        _stacklevel: ignored; accepted because ``torch.nn.Softmax`` passes it.
        {constraint}
        {mult}

    Raises:
        InputError: ``dim`` is ``None``.
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import softmax
    >>> _ = torch.manual_seed(0)
    >>> y = softmax(torch.randn(1000, 64), dim=-1, constraint=None, mult=0.25)
    >>> round(y.std().item(), 1)
    1.0
    """
    if dim is None:
        raise _errors.InputError("softmax: dim=None; pass the dimension to normalise over, e.g. dim=-1")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise _errors.InputError(f"softmax: dim={dim!r:.60} is a {type(dim).__name__}; pass an int, e.g. dim=-1")
    if isinstance(_stacklevel, _torch.dtype):  # torch.softmax(input, dim, dtype) passes dtype third
        dtype = _stacklevel
    mult = check_mult("softmax", "mult", mult)
    output_scale, grad_scale = _stats.softmax_scales(input.shape[dim], mult)
    output_scale, grad_scale = _constrain(constraint, output_scale, grad_scale / mult)
    if mult != 1.0:
        input = scale(input, mult, mult)  # the logits; its own factor is part of the gradient's std
    return scale(_F.softmax(input, dim, dtype=dtype), output_scale, grad_scale)
