"""Losses whose value is torch's and whose gradient is unit-scaled.

Each loss multiplies its input's gradient by one number fixed by shapes, kept as
``loss.grad_scale``. Losses that are added must share it, or the sum's gradient is not the
true gradient's direction: ``mse = U.mse_loss(out, t, grad_scale=ce.grad_scale)``.
:func:`~unitscale.unit_scale` does so itself (``result.loss_scales`` says which factor each got).
"""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._checks import _misfits
from unitscale.functional._scale import scale
from unitscale.scaling import softmax_stats as _stats
from unitscale.scaling.checks import check_mult
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from torch import Tensor


@fill_docstring
def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    mult: float = 1.0,
    grad_scale: float | None = None,
) -> Tensor:
    """Cross-entropy of ``mult * input`` whose loss value is torch's, with the logits' gradient scaled to unit std.

    The logits' gradient is × ``batch`` (for ``reduction="mean"``) and × the inverse of its
    std for ``N(0, mult**2)`` logits over ``n`` classes, about ``sqrt(n)``: a fixed multiple
    of the true gradient. ``mult`` is u-μP's α_loss-softmax (here or on :func:`linear_readout`,
    not both). The batch count includes ignored targets.

    Args:
        {mult}
        grad_scale: the gradient factor to use instead (a positive number), to share one
            among losses that are added.

    Raises:
        InputError: the shapes or dtypes do not fit.
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import cross_entropy
    >>> _ = torch.manual_seed(0)
    >>> logits = torch.randn(512, 100, requires_grad=True)
    >>> target = torch.randint(0, 100, (512,))
    >>> loss = cross_entropy(logits, target)
    >>> torch.allclose(loss, torch.nn.functional.cross_entropy(logits, target))
    True
    >>> loss.backward()
    >>> round(logits.grad.std().item(), 1), round(loss.grad_scale, 1)
    (1.0, 5105.9)
    """
    mult = check_mult("cross_entropy", "mult", mult)
    _check_grad_scale("cross_entropy", grad_scale)
    with _misfits(
        "cross_entropy",
        "input is float logits (batch, classes, ...) or (classes,); target is int64 class indices "
        "(batch, ...) below classes, or float probabilities shaped like input; weight is (classes,)",
        input=input,
        target=target,
        weight=weight,
    ):
        classes = input.shape[1] if input.dim() >= 2 else input.shape[0]
        batch = input.numel() // max(classes, 1)
        # E[sum_j (s_j - y_j)^2] = E[sum_j s_j^2] - 2 E[s_target] + 1, with E[sum s^2] = (f^2 + 1) / n
        # and E[s_target] = 1 / n for a target independent of the logits.
        f = _stats.log_interp(classes, _stats.table(mult)[0])
        grad_var = (1 + (f * f - 1) / classes) / classes if classes > 1 else 1.0
        mean = reduction == "mean" and reduce is not False and size_average is not False
        factor = grad_var**-0.5 * (batch if mean else 1) if grad_scale is None else grad_scale
        # The backward leaves out mult's own factor: one positive number on the loss's only path.
        input = scale(input, mult, factor)
        loss = _F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        return _stated(loss, factor)


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
    grad_scale: float | None = None,
) -> Tensor:
    """Mean squared error whose value is torch's, with the gradients scaled to unit std.

    Both gradients are × ``8**-0.5`` (``2 (input - target)`` has std ``8**0.5`` for unit-normal
    operands), times the element count for ``reduction="mean"``.

    Args:
        target: the same shape as ``input`` (no broadcasting, which torch only warns about).
        grad_scale: the gradient factor to use instead (a positive number), to share one
            among losses that are added.

    Raises:
        InputError: ``input`` and ``target`` differ in shape, or ``grad_scale`` is not a
            positive number.

    >>> import torch
    >>> from unitscale.functional import mse_loss
    >>> _ = torch.manual_seed(0)
    >>> x, y = torch.randn(4096, requires_grad=True), torch.randn(4096)
    >>> loss = mse_loss(x, y)
    >>> torch.allclose(loss, torch.nn.functional.mse_loss(x, y))
    True
    >>> loss.backward()
    >>> round(x.grad.std().item(), 1), round(loss.grad_scale, 1)
    (1.0, 1448.2)
    """
    _check_grad_scale("mse_loss", grad_scale)
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, _torch.Tensor):
            raise _errors.InputError(f"mse_loss: {name} is a {type(value).__name__}; pass a tensor")
    if input.shape != target.shape:
        raise _errors.InputError(
            f"mse_loss: input of shape {tuple(input.shape)} and target of shape {tuple(target.shape)} differ; "
            "pass tensors of one shape (broadcast target yourself if you mean it)"
        )
    mean = reduction == "mean" and reduce is not False and size_average is not False
    factor = 8**-0.5 * (max(input.numel(), 1) if mean else 1) if grad_scale is None else grad_scale
    input, target = scale(input, 1.0, factor), scale(target, 1.0, factor)
    return _stated(_F.mse_loss(input, target, size_average, reduce, reduction), factor)


def _check_grad_scale(function: str, grad_scale: float | None) -> None:
    if grad_scale is None:
        return
    if isinstance(grad_scale, bool) or not isinstance(grad_scale, (int, float)) or not 0 < grad_scale < _math.inf:
        raise _errors.InputError(
            f"{function}: grad_scale={grad_scale!r:.60} is not a positive, finite number; pass one "
            "(another loss's loss.grad_scale, to add the two), or None for the unit-scaling factor"
        )


def _stated(loss: Tensor, factor: float) -> Tensor:
    """``loss``, carrying its gradient factor as ``loss.grad_scale`` (not under compilation: no tensor attributes)."""
    if not _torch.compiler.is_compiling():
        loss.grad_scale = float(factor)  # type: ignore[attr-defined]
    return loss
