"""Pooling: max pooling to unit root-mean-square, average pooling to unit std."""

from __future__ import annotations

import functools as _functools
import math as _math
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._linear import _tuple
from unitscale.functional._normal import cdf, normal_mean
from unitscale.functional._scale import _constrained_scale, _inv_sqrt
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


@_functools.lru_cache(maxsize=64)
def _max_rms(k: int) -> float:
    """Root-mean-square of the largest of ``k`` independent ``N(0, 1)`` values (trapezoid rule on [-10, 10])."""
    # The largest has density k * pdf(x) * cdf(x)**(k - 1).
    return normal_mean(lambda x: x * x * k * cdf(x) ** (k - 1), 10.0, 4000) ** 0.5


@fill_docstring
def max_pool2d(
    input: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.max_pool2d`.

    The output is scaled to unit root-mean-square, as :func:`relu`'s is (× ``1 / 1.60`` for a
    3x3 window), and the input gradient × ``(inputs / outputs)**0.5``. Indices come unscaled.

    Args:
        {constraint}

    Returns:
        The scaled maxima (and their indices with ``return_indices=True``).

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import max_pool2d
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
    >>> y = max_pool2d(x, 3, 2, 1, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> rms = lambda t: round(t.pow(2).mean().sqrt().item(), 1)
    >>> rms(y), rms(x.grad)
    (1.0, 1.0)
    """
    window = _math.prod(int(k) for k in _tuple(kernel_size, 2))
    result = _F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)
    out, indices = result[0], result[1]
    grad_scale = _inv_sqrt(out.numel() / max(input.numel(), 1))
    out = _constrained_scale(out, constraint, 1 / _max_rms(window), grad_scale)
    return (out, indices) if return_indices else out  # type: ignore[return-value]


def _pool(input: Tensor, output: Tensor, window: int, constraint: ConstraintArg) -> Tensor:
    # Each output averages ``window`` values: std window**-0.5 for independent ones. Each input's
    # gradient sums ``cover`` output gradients divided by ``window``: std cover**0.5 / window.
    cover = output.numel() * window / max(input.numel(), 1)
    return _constrained_scale(output, constraint, window**0.5, window * _inv_sqrt(cover))


@fill_docstring
def avg_pool2d(
    input: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.avg_pool2d`.

    Output × ``k**0.5`` for a window of ``k`` values, and the input gradient (a sum of ``cover``
    output gradients over ``k``) × ``k / cover**0.5``. Spatially correlated inputs come out
    above 1 (at most ``k**0.5``).

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import avg_pool2d
    >>> _ = torch.manual_seed(0)
    >>> y = avg_pool2d(torch.randn(8, 16, 32, 32), 2, constraint=None)
    >>> round(y.std().item(), 1)
    1.0
    """
    out = _F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    return _pool(input, out, _math.prod(int(k) for k in _tuple(kernel_size, 2)), constraint)


@fill_docstring
def adaptive_avg_pool2d(
    input: Tensor,
    output_size: int | tuple[int | None, int | None],
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.adaptive_avg_pool2d`.

    As :func:`avg_pool2d`, with the window ``(H / H_out) * (W / W_out)``.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import adaptive_avg_pool2d
    >>> _ = torch.manual_seed(0)
    >>> y = adaptive_avg_pool2d(torch.randn(64, 32, 8, 8), 1, constraint=None)
    >>> round(y.std().item(), 1)
    1.0
    """
    out = _F.adaptive_avg_pool2d(input, output_size)
    window = max(round(input.shape[-2] * input.shape[-1] / max(out.shape[-2] * out.shape[-1], 1)), 1)
    return _pool(input, out, window, constraint)


@fill_docstring
def mean(
    input: Tensor,
    dim: int | tuple[int, ...] | list[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: _torch.dtype | None = None,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :meth:`torch.Tensor.mean`: a mean pool (``x.mean((2, 3))``, timm's global pool).

    Output × ``n**0.5`` and input gradient × ``n``, ``n`` being the elements each output
    averages. Values with a mean come out above 1: :func:`~unitscale.unit_scale` corrects
    for the mean of a ReLU or GELU it pools.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import mean
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(64, 32, 8, 8, requires_grad=True)
    >>> y = mean(x, (2, 3), constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    out = input.mean(dtype=dtype) if dim is None else input.mean(dim, keepdim, dtype=dtype)
    window = max(input.numel() // max(out.numel(), 1), 1)
    return _constrained_scale(out, constraint, window**0.5, float(window))
