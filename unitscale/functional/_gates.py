"""Gates and hard activations: sigmoid, hardsigmoid and hardswish, scaled by their Gaussian moments.

A gate (a squeeze-excitation block's sigmoid, MobileNetV3's hardsigmoid) multiplies an
activation: for a unit-scaled activation ``x`` and a gate ``g`` computed from another
branch, ``x * g`` has root-mean-square ``RMS(g)``. So a gate is scaled to unit
root-mean-square (not unit std: its mean, near 0.5, is most of its value), and the
product keeps the activation's scale. Its backward only feeds the small branch that
computes the gate, so by default the gate takes its forward scale both ways
(``constraint="to_output_scale"``): the gradient stays the true gradient of the
scaled function, and the gate's value, which the main path sees, is the one at unit scale.

Every scale is a moment of the function or its derivative for ``x ~ N(0, 1)``: in closed
form from the normal distribution's partial moments for the piecewise-polynomial hard
functions, by quadrature for the sigmoid; ``tests/scaling/test_gates.py`` measures them.
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

    Scaled to unit root-mean-square, the scale a gate passes on to the activation it
    multiplies: output × ``1 / 0.5417`` (``E[sigmoid(x)**2]**-0.5`` for ``x ~ N(0, 1)``);
    the input gradient's own scale would be ``1 / 0.2117`` (the RMS of ``sigmoid'``), and
    the default constraint gives it the output's (see the module docstring).

    Args:
        input: any tensor.
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

    ``clamp(x / 6 + 1/2, 0, 1)``, scaled to unit root-mean-square as :func:`sigmoid` is:
    output × ``1 / 0.5270``, from the normal distribution's partial moments on ``[-3, 3]``;
    the derivative's own scale would be ``6 / P(|x| < 3)**0.5 = 6.008``.

    Args:
        input: any tensor.
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

    An activation, not a gate, scaled as :func:`~unitscale.functional.silu` (which it
    approximates) is: output × ``1 / 0.5516`` (its std) and input gradient ×
    ``1 / 0.5989`` (the RMS of its derivative), both for ``x ~ N(0, 1)`` in closed form
    from the normal distribution's partial moments.

    Args:
        input: any tensor.
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

    The forward is the plain product: a unit-scaled activation times a gate of unit
    root-mean-square has unit root-mean-square. The backward sums the gradient of a
    broadcast operand over every position it was broadcast to (a squeeze-excitation gate
    of shape ``(N, C, 1, 1)`` over ``H * W`` pixels), which grows its std by the square
    root of that count. With ``constraint=None`` each operand's gradient is scaled by
    ``(output.numel() / operand.numel())**-0.5``, as a weight's gradient, summed over the
    batch, is (Blake et al.); operands of the output's own shape are not scaled. That scale
    is the backward's alone, so it keeps the gradient true only where the operands'
    gradients do not meet upstream, or where the gate's branch undoes it (in a
    squeeze-excitation block, :func:`~unitscale.unit_scale` gives the pool the inverse
    backward scale). With a constraint (the default) the one scale it picks from the
    forward's 1 and those backward scales applies both ways: ``to_output_scale`` is the
    plain product and torch's gradient.

    Args:
        input: a tensor.
        other: a tensor broadcastable with ``input``.
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

    The forward is the plain product, so a gain of 1 (what :func:`~unitscale.unit_scale`
    initialises it to, as a norm's gain) keeps a unit-scaled input's scale; a gain of
    ``1e-6`` would silence its branch, which unit scaling weights with its residual's
    ``tau`` instead. The input's gradient is ``weight`` times the output's, unscaled. The
    gain's gradient sums over the ``copies`` positions it is broadcast to (the batch and
    the spatial or token dims) and is scaled by ``copies**-0.5``, as a weight's is
    (Blake et al.): a parameter read by this one op is a cut edge, so that scale keeps
    its gradient a positive multiple of the true one.

    Args:
        input: a tensor.
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
