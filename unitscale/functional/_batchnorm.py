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
training mode, the running ones in eval mode. It is one positive number per call, so
the gradient keeps its direction within the branch; it depends on the data, as batch
norm's own normalisation does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._scale import _inv_sqrt, scale

if TYPE_CHECKING:
    from torch import Tensor


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
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.batch_norm`.

    The output is normalised, so unit-std where the statistics it uses describe the
    input. The input gradient is scaled by ``mean_c(1 / (var_c + eps))**-0.5``, from the
    variances the forward divides by (the batch's in training mode or without running
    statistics, the running ones in eval mode): batch norm's gradient grows as its
    input's per-channel variance shrinks, and this undoes it (see the module docstring).
    The weight and bias gradients sum over ``N * H * W`` values per channel and are
    scaled by its inverse square root.

    Running statistics: :func:`~unitscale.unit_scale` resets them to mean 0 and variance
    1, the values torch starts from. Unit scaling sets every scale at initialisation, with
    no data (Blake et al.): the statistics of the original model describe activations of
    another scale, and the unit-scaled activations have, over the random initialisation,
    expected per-channel mean 0 and mean square 1, but each channel its own mean (after a
    ReLU, a spread of about 0.56). So the reset values stand for "no batch seen yet", and
    are treated so: the first training batch replaces them (torch's cumulative average does
    the same with its first batch), later ones update them with the model's momentum; in
    eval mode before any training batch, the batch's own statistics normalise. The choices
    are tensor ops (no ``.item()``), so a compiled model keeps one graph; in eval mode the
    batch's mean and variance are computed on every call for that (one pass over the input).
    The output is thus unit-std in training mode, and in eval mode before and after training.

    Args:
        input: ``(N, C, ...)``.
        running_mean: per-channel mean, or ``None``.
        running_var: per-channel variance, or ``None``.
        weight: optional per-channel gain.
        bias: optional per-channel bias.
        training: normalise with batch statistics (and update the running ones).
        momentum: as in torch.
        eps: as in torch.

    Returns:
        The normalised tensor.

    >>> import torch
    >>> from unitscale.functional import batch_norm
    >>> _ = torch.manual_seed(0)
    >>> x = (5 * torch.randn(32, 256, 4, 4)).requires_grad_()
    >>> w = torch.ones(256, requires_grad=True)
    >>> y = batch_norm(x, None, None, w, training=True)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1), round(w.grad.std().item(), 1)
    (1.0, 1.0, 1.0)
    """
    channels = input.shape[1] if input.dim() > 1 else 1
    batch_scale = _inv_sqrt(input.numel() / max(channels, 1))
    if weight is not None:
        weight = scale(weight, 1.0, batch_scale)
    if bias is not None:
        bias = scale(bias, 1.0, batch_scale)
    if input.numel() <= channels:  # one value per channel: torch raises its own error in training mode
        return _F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)
    dims = [d for d in range(input.dim()) if d != 1] if input.dim() > 1 else [0]
    with _torch.no_grad():
        values = input.detach().float()
        if training or running_mean is None or running_var is None:
            variance = values.var(dim=dims, unbiased=False)
            if training and running_mean is not None and running_var is not None:
                _update_running_stats(values, dims, running_mean, running_var, momentum)
                momentum = 0.0  # updated above: torch's own update is switched off
        else:
            # Statistics at their reset values describe no batch yet: normalise with the batch's.
            unseen = _unseen(running_mean, running_var)
            variance = _torch.where(unseen, values.var(dim=dims, unbiased=False), running_var.float())
            mean = _torch.where(unseen, values.mean(dim=dims), running_mean.float())
            running_mean, running_var = mean.to(running_mean.dtype), variance.to(running_var.dtype)
        factor = (1 / (variance + eps)).mean().rsqrt().to(input.dtype)
    if input.requires_grad:
        input = _scale_grad(input, factor)
    return _F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _unseen(running_mean: Tensor, running_var: Tensor) -> Tensor:
    """Whether the running statistics are at their reset values, mean 0 and variance 1 exactly (a bool tensor)."""
    return (running_mean == 0).all() & (running_var == 1).all()


def _update_running_stats(
    values: Tensor, dims: list[int], running_mean: Tensor, running_var: Tensor, momentum: float
) -> None:
    """Torch's update (unbiased batch variance), except that statistics at their reset values are replaced.

    Mean 0 and variance 1 exactly are the values :func:`~unitscale.unit_scale` (and torch)
    start from: they describe no batch, so the first training batch replaces them, as torch's
    cumulative average (``momentum=None``) does with its first batch. The choice is made with
    tensor ops (no ``.item()``), so a compiled model keeps one graph.
    """
    count = values.numel() / max(values.shape[1] if values.dim() > 1 else 1, 1)
    mean = values.mean(dim=dims)
    variance = values.var(dim=dims, unbiased=False) * (count / max(count - 1, 1))
    rate = _torch.where(_unseen(running_mean, running_var), 1.0, float(momentum))
    running_mean.lerp_(mean.to(running_mean.dtype), rate.to(running_mean.dtype))
    running_var.lerp_(variance.to(running_var.dtype), rate.to(running_var.dtype))
