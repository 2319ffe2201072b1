"""Batch norm, unit-scaled: its affine gradients, and its input gradient, which its input's variance sets.

Batch norm's output does not depend on its input's scale, ``BN(a * x) = BN(x)``; its input
gradient does, as ``1 / a``: per channel it is ``(g - mean(g) - x_hat * mean(g * x_hat)) /
sigma_c`` in training mode and ``g / sqrt(running_var_c)`` in eval mode. Unit-scaled
activations are unit-scaled as a whole tensor, not per channel: after a ReLU (mean 0.56 at
unit root-mean-square) each output channel of the next convolution has its own mean, and a
per-channel variance near ``1 - 0.56**2 = 0.68``. So every batch norm multiplies the
gradient by about ``1 / 0.68**0.5 = 1.21``, and 17 of them in a row (ResNet-18) by 19: the
gradient explosion of batch-normalised networks at initialisation. The unit-scaling rule
(Blake et al., arXiv 2303.11257, section 4: scale each op's backward so that a unit
gradient in gives a unit gradient out) applied to batch norm is a backward scale of
``mean_c(1 / var_c)**-0.5``, with the variances batch norm divides by: the batch's in
training mode, the running ones in eval mode. It is one positive number per call, and it
scales the backward alone: batch norm's output does not depend on its input's scale, so
no forward scale could match it. That keeps gradients true only on a cut edge, where the
input's gradient does not meet another path's upstream (the stem of a ResNet). Inside a
residual branch the scaled gradient would meet the skip's unscaled one at the fork, and
their sum would point elsewhere than the true gradient (in a ResNet-18, the other way).
So the backward scale is opt-in, ``constraint=None``, as for the other ops with two
scales; :func:`~unitscale.unit_scale` passes it where an op's two scales may differ.
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

    The output is normalised, so unit-std where the statistics it uses describe the
    input. With ``constraint=None`` the input gradient is scaled by ``mean_c(1 / (var_c +
    eps))**-0.5``, from the variances the forward divides by (the batch's in training mode
    or without running statistics, the running ones in eval mode): batch norm's gradient
    grows as its input's per-channel variance shrinks, and this undoes it (see the module
    docstring). That scale is the backward's alone, so it keeps the gradient true only on
    a cut edge. With a constraint (the default, or any name or callable a ``constraint=``
    takes) both directions keep the forward's scale, 1: the backward scale depends on the
    batch, and a forward scale computed from the batch would change the function whose
    gradient is taken. The weight and bias gradients sum over ``N * H * W`` values per
    channel and are scaled by its inverse square root, whatever the constraint.

    Running statistics: :func:`~unitscale.unit_scale` resets them to mean 0 and variance
    1, the values torch starts from. Unit scaling sets every scale at initialisation, with
    no data (Blake et al.): the statistics of the original model describe activations of
    another scale, and the unit-scaled activations have, over the random initialisation,
    expected per-channel mean 0 and mean square 1, but each channel its own mean (after a
    ReLU, a spread of about 0.56). So the reset values stand for "no batch seen yet", and
    are treated so. With ``num_batches_tracked`` (the module's count, this batch included:
    torch's batch norm modules, and so every graph :func:`~unitscale.unit_scale` makes, add 1
    before the call) the ``n``-th training batch updates them at rate ``max(1 / n,
    momentum)``: the first ``1 / momentum`` batches are averaged cumulatively (torch's
    ``momentum=None``), then the exponential average takes over, so a few training steps
    leave statistics that stand for every batch seen, not mostly the first one, taken with
    the initial weights. :func:`~unitscale.unit_scale` resets the count with the statistics.
    Without it (the function called by hand), the first training batch replaces statistics at
    their reset values and later ones update them with ``momentum``. In eval mode before any
    training batch, the batch's own statistics normalise. The choices
    are tensor ops (no ``.item()``), so a compiled model keeps one graph; in eval mode the
    batch's mean and variance are computed on every call for that (one pass over the input).
    The output is thus unit-std in training mode, and in eval mode before and after training.
    Where the batch's statistics normalise in eval mode, the gradient goes through them,
    as in training mode: it is the gradient of the function computed.

    Args:
        input: ``(N, C, ...)``.
        running_mean: per-channel mean, or ``None``.
        running_var: per-channel variance, or ``None``.
        weight: optional per-channel gain.
        bias: optional per-channel bias.
        training: normalise with batch statistics (and update the running ones).
        momentum, eps: as in torch.
        constraint: ``None`` to scale the input gradient by the batch's variances (on a cut
            edge only), else a constraint name or callable, which keeps 1 both ways.
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
    """Torch's update (unbiased batch variance) at rate ``max(1 / count, momentum)``, or, without a count, 1 at reset.

    See :func:`batch_norm`'s running statistics for why.
    """
    size = values.numel() / max(values.shape[1] if values.dim() > 1 else 1, 1)
    mean = values.mean(dim=dims)
    variance = values.var(dim=dims, unbiased=False) * (size / max(size - 1, 1))
    if count is None:
        rate = _torch.where(_unseen(running_mean, running_var), 1.0, float(momentum))
    else:
        rate = count.detach().clamp_min(1).float().reciprocal().clamp_min(float(momentum))
    running_mean.lerp_(mean.to(running_mean.dtype), rate.to(running_mean.dtype))
    running_var.lerp_(variance.to(running_var.dtype), rate.to(running_var.dtype))
