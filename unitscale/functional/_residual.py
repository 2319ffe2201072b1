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

    Two independent unit-std tensors sum to std ``sqrt(1 + alpha**2)``: the output
    is scaled by its inverse and the two gradients (already unit) by 1, and the
    constraint reconciles the three. Adding a number, or adding non-float values
    (shape arithmetic in a traced graph), is left unscaled; so is adding a
    one-element tensor (0-d or of shape ``(1,)``: a learned offset), which shifts
    every element by the same amount and adds no variance.

    A broadcast operand (a bias, an offset) is used once per broadcast copy, so its
    gradient is the output gradient summed over the copies. How it is scaled
    depends on ``constraint``:

    - Without a constraint (``None``) each gradient is unit-std: a broadcast
      operand's is scaled by ``copies**-0.5``, the other's by 1, the output by
      ``(1 + alpha**2)**-0.5``. The two operands' gradients are scaled apart, so
      this is for operands that meet nowhere upstream (a bias parameter, a cut
      edge); for ``z + z.mean(0)`` the gradient of ``z`` is no longer the true
      one.
    - With a constraint, the constraint chooses one number from the output scale
      and the two unit gradient scales, ``((1 + alpha**2)**-0.5, 1, 1)``, and the
      output and both gradients take it: every gradient is the true gradient of
      the forward that ran, times that number, whatever the operands share. The
      output of ``x + bias`` is scaled by ``2**(-1/6)`` under ``"gmean"``, by
      ``2**-0.5`` under ``"to_output_scale"``; the bias's gradient is the plain
      sum over its copies times the same number, so its std grows like
      ``sqrt(copies)``. The broadcast count is left out of the constraint on
      purpose: for a bias it is the batch size, and putting it in (as Graphcore's
      unit-scaling does) makes the forward pass, so every output, change with the
      batch size under the mean constraints. For a unit-std bias gradient, add
      the bias with ``constraint=None`` or give it to :func:`linear`.

    Args:
        input: first summand.
        other: second summand.
        alpha: multiplier of ``other``, as in torch.
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import add
    >>> _ = torch.manual_seed(0)
    >>> a, b = torch.randn(10_000), torch.randn(10_000)
    >>> round(add(a, b, constraint=None).std().item(), 1)
    1.0
    >>> x, bias = torch.randn(4, 3), torch.randn(3, requires_grad=True)
    >>> add(x, bias, constraint=None).sum().backward()
    >>> bias.grad  # four copies, each with gradient 1, summed and scaled by 4**-0.5
    tensor([2., 2., 2.])
    >>> add(2, 3)
    5
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

    Forward: both are ``input``. Backward: the gradients coming back through them
    are combined as ``sqrt(tau) * residual_grad + sqrt(1 - tau) * skip_grad``,
    mirroring :func:`residual_add`; with unit-std branch gradients the result is
    unit-std, and the pair together gives the true gradient of
    ``sqrt(tau) * f(x) + sqrt(1 - tau) * x``.

    Args:
        input: the residual stream.
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

    Forward weights only; the gradients of ``residual`` and ``skip`` are the
    output gradient unscaled, and :func:`residual_split` applies the weights in
    the backward pass. For unit-std, independent inputs the output is unit-std.

    Args:
        residual: output of the residual branch.
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
        input: the residual stream.
        tau: share of the variance carried by the branch, in ``(0, 1)``.

    Returns:
        ``sqrt(tau) * fn(input) + sqrt(1 - tau) * input``, with :func:`residual_split`'s
        backward weights.

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
