"""Adds: the plain scaled add and the residual split/add pair."""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch as _torch

from unitscale.functional._scale import _constrain, _inv_sqrt, scale
from unitscale.scaling.checks import check_tau
from unitscale.scaling.constraints import resolve_constraint as _resolve_constraint
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


@fill_docstring
def add(
    input: Tensor | float,
    other: Tensor | float,
    alpha: float = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.add`: ``input + alpha * other``.

    Output × ``(1 + alpha**2)**-0.5``, gradients × 1. A number, non-float values (shape
    arithmetic in a traced graph) and a one-element tensor (an offset, which adds no variance)
    are added unscaled. A broadcast operand's gradient sums its ``copies``: with
    ``constraint=None`` it is × ``copies**-0.5`` (true only where the operands meet nowhere
    upstream, not for ``z + z.mean(0)``); under a constraint it is the plain sum times the one
    scale, since counting the batch in the constraint would make outputs depend on the batch
    size. For a unit-std bias gradient use ``constraint=None`` or :func:`linear`'s bias.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import add
    >>> _ = torch.manual_seed(0)
    >>> a, b = torch.randn(10_000), torch.randn(10_000)
    >>> round(add(a, b, constraint=None).std().item(), 1)
    1.0
    """
    if not (isinstance(input, _torch.Tensor) and isinstance(other, _torch.Tensor)) or not (
        input.is_floating_point() or other.is_floating_point()
    ):
        return input + other if alpha == 1 else input + alpha * other  # type: ignore[return-value]
    # A one-element summand is the same number at every position: it adds no variance.
    summed = 1.0 if input.numel() == 1 or other.numel() == 1 else 1 + alpha**2
    output_scale, grad_scale, _ = _constrain(constraint, summed**-0.5, 1.0, 1.0)
    if _resolve_constraint(constraint) is None:
        # Unconstrained: each broadcast operand's gradient, a sum over its copies, is made unit-std on its own.
        out_numel = _math.prod(_torch.broadcast_shapes(input.shape, other.shape))
        input = scale(input, 1.0, _inv_sqrt(out_numel / input.numel()))
        other = scale(other, 1.0, _inv_sqrt(out_numel / other.numel()))
    return scale(_torch.add(input, other, alpha=alpha), output_scale, grad_scale)


def residual_split(input: Tensor, tau: float = 0.5) -> tuple[Tensor, Tensor]:
    """Split ``input`` into the residual-branch input and the skip connection.

    Both are ``input``; backward their gradients combine as ``sqrt(tau) * residual_grad +
    sqrt(1 - tau) * skip_grad``, so with :func:`residual_add` the pair gives the true gradient
    of ``sqrt(tau) * f(x) + sqrt(1 - tau) * x``.

    Args:
        tau: share of the variance carried by the residual branch, in ``(0, 1)``.

    Returns:
        ``(residual, skip)``.

    Raises:
        InputError: ``tau`` is not strictly between 0 and 1.

    >>> import torch
    >>> from unitscale.functional import residual_split
    >>> x = torch.ones(3, requires_grad=True)
    >>> r, s = residual_split(x, tau=0.36)
    >>> (r + s).sum().backward()
    >>> [round(g, 2) for g in x.grad.tolist()]
    [1.4, 1.4, 1.4]
    """
    tau = check_tau("residual_split", tau)
    return scale(input, 1.0, tau**0.5), scale(input, 1.0, (1 - tau) ** 0.5)


def residual_add(residual: Tensor, skip: Tensor, tau: float = 0.5) -> Tensor:
    """Join a residual branch and its skip connection: ``sqrt(tau) * residual + sqrt(1 - tau) * skip``.

    Forward weights only: :func:`residual_split` applies them in the backward pass.

    Args:
        skip: the skip connection from :func:`residual_split`.
        tau: share of the variance carried by the residual branch, in ``(0, 1)``.

    Raises:
        InputError: ``tau`` is not strictly between 0 and 1.

    >>> import torch
    >>> from unitscale.functional import residual_add
    >>> residual_add(torch.ones(2), torch.zeros(2), tau=0.25).tolist()
    [0.5, 0.5]
    """
    tau = check_tau("residual_add", tau)
    return scale(residual, tau**0.5, 1.0) + scale(skip, (1 - tau) ** 0.5, 1.0)


def residual_apply(fn: Callable[[Tensor], Tensor], input: Tensor, tau: float = 0.5) -> Tensor:
    """A residual branch in one call: ``residual_add(fn(r), s, tau)`` with ``r, s = residual_split(input, tau)``.

    Args:
        fn: the branch (a module or function of one tensor).
        tau: share of the variance carried by the branch, in ``(0, 1)``.

    Raises:
        InputError: ``tau`` is not strictly between 0 and 1.

    >>> import torch
    >>> from unitscale.functional import residual_apply
    >>> y = residual_apply(lambda x: -x, torch.ones(2), tau=0.36)
    >>> [round(v, 4) for v in y.tolist()]
    [0.2, 0.2]
    """
    split = residual_split(input, tau)
    return residual_add(fn(split[0]), split[1], tau)
