"""Batch norm, unit-scaled: its affine gradients, and its input gradient, which its input's variance sets.

Batch norm's input gradient grows as its input's per-channel variance shrinks (about 1.21 per
batch norm after a ReLU, 19 over a ResNet-18 at initialisation), and no forward scale can match
a backward one, since its output ignores its input's scale: tutorial 7b tells the story.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._scale import _inv_sqrt, scale
from unitscale.scaling.constraints import resolve_constraint

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


class _ScaleGrad(_torch.autograd.Function):
    """Identity forward; the gradient times a (detached, scalar) tensor backward."""

    @staticmethod
    def forward(ctx: _torch.autograd.function.FunctionCtx, input: Tensor, factor: Tensor) -> Tensor:
        ctx.save_for_backward(factor)
        return input.view_as(input)

    @staticmethod
    def backward(ctx: _torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        (factor,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * factor, None


def _scale_grad(input: Tensor, factor: Tensor) -> Tensor:
    if _torch.compiler.is_compiling():
        return input * factor + (input * (1 - factor)).detach()
    return _ScaleGrad.apply(input, factor)


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
    constraint: ConstraintArg = "to_output_scale",
    num_batches_tracked: Tensor | None = None,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.batch_norm`.

    Weight and bias gradients × ``(N * H * W)**-0.5``. The input gradient keeps scale 1
    under a constraint (a scale from the batch would change the function); with
    ``constraint=None`` it is × ``mean_c(1 / (var_c + eps))**-0.5``, from the variances the
    forward divides by, which undoes batch norm's growth but is true only on a cut edge.

    Running statistics at their reset values (mean 0, variance 1) mean "no batch seen": in eval
    mode the batch's own statistics then normalise (and the gradient goes through them), and
    the first training batches are averaged cumulatively, at rate ``max(1 / n, momentum)`` for
    the ``n``-th; without a count the first training batch replaces them. The choices are tensor
    ops, so a compiled model keeps one graph (eval mode computes the batch's statistics each call).

    Args:
        training: normalise with batch statistics (and update the running ones).
        constraint: ``None`` to scale the input gradient by the variances (on a cut edge only),
            else a constraint name or callable, which keeps 1 both ways.
        num_batches_tracked: the module's count of training batches, this one included (read,
            not changed; a count below 1 reads as 1), or ``None``.

    Raises:
        InputError: ``constraint`` is not a name from ``CONSTRAINTS``, a callable or ``None``.

    >>> import torch
    >>> from unitscale.functional import batch_norm
    >>> _ = torch.manual_seed(0)
    >>> x = (5 * torch.randn(32, 256, 4, 4)).requires_grad_()
    >>> w = torch.ones(256, requires_grad=True)
    >>> y = batch_norm(x, None, None, w, training=True, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> [round(t.std().item(), 1) for t in (y, x.grad, w.grad)]
    [1.0, 1.0, 1.0]
    """
    unconstrained = resolve_constraint(constraint) is None
    channels = input.shape[1] if input.dim() > 1 else 1
    batch_scale = _inv_sqrt(input.numel() / max(channels, 1))
    weight, bias = (None if t is None else scale(t, 1.0, batch_scale) for t in (weight, bias))
    if input.numel() <= channels:  # one value per channel: torch raises its own error in training mode
        return _F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    dims = [d for d in range(input.dim()) if d != 1] if input.dim() > 1 else [0]
    unseen: Tensor | None = None
    with _torch.no_grad():
        values = input.detach().float()
        if training or running_mean is None or running_var is None:
            variance = values.var(dim=dims, unbiased=False) if unconstrained else None
            if training and running_mean is not None and running_var is not None:
                _update_running_stats(values, dims, running_mean, running_var, momentum, num_batches_tracked)
                momentum = 0.0  # updated above: torch's own update is switched off
        else:
            # Statistics at their reset values describe no batch yet: the batch's normalise (below).
            unseen = _unseen(running_mean, running_var)
            variance = None
            if unconstrained:
                variance = _torch.where(unseen, values.var(dim=dims, unbiased=False), running_var.float())
        factor = None if variance is None else (1 / (variance + eps)).mean().rsqrt().to(input.dtype)
    if factor is not None and input.requires_grad:
        input = _scale_grad(input, factor)
    output = _F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    if unseen is None:
        return output
    # The batch's statistics with their gradient; chosen by a tensor op, so a compiled model keeps one graph.
    return _torch.where(unseen, _F.batch_norm(input, None, None, weight, bias, True, 0.0, eps), output)


def _unseen(running_mean: Tensor, running_var: Tensor) -> Tensor:
    """Whether the running statistics are at their reset values, mean 0 and variance 1 exactly (a bool tensor)."""
    return (running_mean == 0).all() & (running_var == 1).all()


def _update_running_stats(
    values: Tensor,
    dims: list[int],
    running_mean: Tensor,
    running_var: Tensor,
    momentum: float,
    count: Tensor | None,
) -> None:
    """Torch's update (unbiased batch variance) at rate ``max(1 / count, momentum)``; without a count, 1 at reset."""
    size = values.numel() / max(values.shape[1] if values.dim() > 1 else 1, 1)
    mean = values.mean(dim=dims)
    variance = values.var(dim=dims, unbiased=False) * (size / max(size - 1, 1))
    if count is None:
        rate = _torch.where(_unseen(running_mean, running_var), 1.0, float(momentum))
    else:
        rate = count.detach().clamp_min(1).float().reciprocal().clamp_min(float(momentum))
    running_mean.lerp_(mean.to(running_mean.dtype), rate.to(running_mean.dtype))
    running_var.lerp_(variance.to(running_var.dtype), rate.to(running_var.dtype))
