"""Gates and hard activations: sigmoid, hardsigmoid and hardswish, scaled by their Gaussian moments.

A gate multiplies an activation, and ``x * g`` has RMS ``RMS(g)``: so a gate is scaled to unit
root-mean-square (its mean, near 0.5, is most of its value), and by default takes that forward
scale both ways (``constraint="to_output_scale"``), keeping its gradient true.
"""

from __future__ import annotations

import functools as _functools
import math as _math
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._normal import cdf, normal_mean, partial_moment
from unitscale.functional._scale import _constrain, _constrained_scale, scale
from unitscale.scaling.constraints import resolve_constraint
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


def _hardsigmoid_moments() -> tuple[float, float]:
    """Mean squares of ``hardsigmoid(x) = clamp(x / 6 + 1/2, 0, 1)`` and of its derivative (1/6 on ``|x| < 3``)."""
    m = [partial_moment(k, -3.0, 3.0) for k in range(3)]
    above = 1 - cdf(3.0)
    return m[2] / 36 + m[1] / 6 + m[0] / 4 + above, m[0] / 36


def _hardswish_moments() -> tuple[float, float, float]:
    """Mean, mean square of ``hardswish(x) = x * hardsigmoid(x)``, and mean square of its derivative.

    On ``|x| < 3`` hardswish is ``(x**2 + 3x) / 6`` with derivative ``(2x + 3) / 6``; above 3 it is
    ``x`` (derivative 1); below -3 it is 0.
    """
    m = [partial_moment(k, -3.0, 3.0) for k in range(5)]
    above = [partial_moment(k, 3.0, _math.inf) for k in range(3)]
    mean = (m[2] + 3 * m[1]) / 6 + above[1]
    square = (m[4] + 6 * m[3] + 9 * m[2]) / 36 + above[2]
    grad_square = (4 * m[2] + 12 * m[1] + 9 * m[0]) / 36 + above[0]
    return mean, square, grad_square


@_functools.lru_cache(maxsize=1)
def _sigmoid_moments() -> tuple[float, float]:
    """Mean squares of ``sigmoid(x)`` and of ``sigmoid'(x)`` for ``x ~ N(0, 1)`` (trapezoid rule on [-12, 12])."""
    sigmoid = lambda x: 1 / (1 + _math.exp(-x))  # noqa: E731
    value = normal_mean(lambda x: sigmoid(x) ** 2, 12.0, 6000)
    return value, normal_mean(lambda x: (sigmoid(x) * (1 - sigmoid(x))) ** 2, 12.0, 6000)


@fill_docstring
def sigmoid(input: Tensor, constraint: ConstraintArg = "to_output_scale") -> Tensor:
    """Unit-scaled :func:`torch.sigmoid` (``nn.Sigmoid``, the gate of squeeze-excitation blocks).

    Output × ``1 / 0.5417`` (to unit root-mean-square); the gradient's own scale would be
    ``1 / 0.2117``.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import sigmoid
    >>> _ = torch.manual_seed(0)
    >>> round(sigmoid(torch.randn(100_000)).pow(2).mean().sqrt().item(), 2)
    1.0
    """
    value, grad = _sigmoid_moments()
    return _constrained_scale(_torch.sigmoid(input), constraint, value**-0.5, grad**-0.5)


@fill_docstring
def hardsigmoid(input: Tensor, inplace: bool = False, constraint: ConstraintArg = "to_output_scale") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.hardsigmoid` (the gate of MobileNetV3's squeeze-excitation).

    Output × ``1 / 0.5270`` (to unit root-mean-square); the gradient's own scale would be 6.008.

    Args:
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import hardsigmoid
    >>> _ = torch.manual_seed(0)
    >>> round(hardsigmoid(torch.randn(100_000)).pow(2).mean().sqrt().item(), 2)
    1.0
    """
    value, grad = _hardsigmoid_moments()
    return _constrained_scale(_F.hardsigmoid(input), constraint, value**-0.5, grad**-0.5)


@fill_docstring
def hardswish(input: Tensor, inplace: bool = False, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.hardswish` (MobileNetV3, LeViT): ``x * hardsigmoid(x)``.

    An activation, not a gate, scaled as :func:`silu` is: output × ``1 / 0.5516``, input
    gradient × ``1 / 0.5989``.

    Args:
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import hardswish
    >>> _ = torch.manual_seed(0)
    >>> round(hardswish(torch.randn(100_000), constraint=None).std().item(), 2)
    1.0
    """
    mean, square, grad_square = _hardswish_moments()
    return _constrained_scale(_F.hardswish(input), constraint, (square - mean * mean) ** -0.5, grad_square**-0.5)


@fill_docstring
def mul(input: Tensor, other: Tensor, constraint: ConstraintArg = "to_output_scale") -> Tensor:
    """Unit-scaled product of two activations, one broadcast over the other (``x * gate``).

    The forward is the plain product. A broadcast operand's gradient sums its copies; with
    ``constraint=None`` it is × ``(output.numel() / operand.numel())**-0.5``, true only where
    the operands' gradients do not meet upstream or the gate's branch undoes it (as
    :func:`~unitscale.unit_scale` does for a squeeze-excitation pool). The default,
    ``to_output_scale``, is the plain product with torch's gradient.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import mul
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(64, 16, 32, 32)
    >>> gate = torch.randn(64, 16, 1, 1, requires_grad=True)
    >>> y = mul(x, gate, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(gate.grad.std().item(), 1)
    1.0
    """
    shape = _torch.broadcast_shapes(input.shape, other.shape)
    count = _math.prod(shape)
    operands = (input, other)
    grad_scales = [
        (count / o.numel()) ** -0.5 if isinstance(o, _torch.Tensor) and 0 < o.numel() < count else 1.0 for o in operands
    ]
    scales = _constrain(constraint, 1.0, *grad_scales)
    if resolve_constraint(constraint) is not None:
        return scale(input * other, scales[0], scales[0])
    scaled = [o if s == 1.0 else scale(o, 1.0, s) for o, s in zip(operands, scales[1:], strict=True)]
    return scaled[0] * scaled[1]


def layer_scale(input: Tensor, weight: Tensor) -> Tensor:
    """Unit-scaled layer scale: ``input * weight``, a learned per-channel gain (ConvNeXt's, CaiT's ``gamma``).

    The plain product (:func:`~unitscale.unit_scale` initialises the gain to 1, leaving the
    branch's weight to its residual's ``tau``); the gain's gradient × ``copies**-0.5``.

    Args:
        weight: the gain, broadcastable to ``input`` (``(C,)`` or ``(C, 1, 1)``).

    >>> import torch
    >>> from unitscale.functional import layer_scale
    >>> _ = torch.manual_seed(0)
    >>> x, gamma = torch.randn(32, 49, 512), torch.ones(512, requires_grad=True)
    >>> y = layer_scale(x, gamma)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(gamma.grad.std().item(), 1)
    (1.0, 1.0)
    """
    copies = _math.prod(_torch.broadcast_shapes(input.shape, weight.shape)) / max(weight.numel(), 1)
    return input * scale(weight, 1.0, copies**-0.5 if copies > 0 else 1.0)
