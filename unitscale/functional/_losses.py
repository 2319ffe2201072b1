"""Losses whose value is torch's and whose gradient is unit-scaled."""

from __future__ import annotations

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
) -> Tensor:
    """Cross-entropy of ``mult * input`` whose loss value is torch's, with the logits' gradient scaled to unit std.

    The loss keeps its meaning (the value equals
    :func:`torch.nn.functional.cross_entropy`'s); only the backward pass changes:
    the logits' gradient ``(softmax - onehot) / batch`` is multiplied by ``batch``
    (for ``reduction="mean"``) and by the inverse of its std over ``n`` classes
    for ``N(0, 1)`` logits, about ``sqrt(n)``. Parameter gradients are then a fixed
    multiple of the true ones, which scale-invariant optimisers (Adam) ignore.
    ``mult`` is u-μP's α_loss-softmax (Section 4; here or on
    :func:`linear_readout`, not both): the loss is torch's of ``mult * input``, and
    the gradient's std is taken for logits of std ``mult``.

    Args:
        input: logits ``(batch, classes, ...)`` or ``(classes,)``.
        target: class indices or class probabilities, as in torch.
        weight: as in torch.
        size_average: deprecated, as in torch.
        ignore_index: as in torch (the batch count used for the scale includes ignored targets).
        reduce: deprecated, as in torch.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: as in torch.
        {mult}

    Returns:
        The loss.

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
    >>> round(logits.grad.std().item(), 1)
    1.0
    """
    mult = check_mult("cross_entropy", "mult", mult)
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
        grad_scale = grad_var**-0.5 * (batch if mean else 1)
        # The backward leaves out mult's own factor: one positive number on the loss's only path.
        input = scale(input, mult, grad_scale)
        return _F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)


def mse_loss(
    input: Tensor,
    target: Tensor,
    size_average: bool | None = None,
    reduce: bool | None = None,
    reduction: str = "mean",
) -> Tensor:
    """Mean squared error whose value is torch's, with the gradients scaled to unit std.

    The gradient of ``sum((input - target)**2)`` is ``2 (input - target)``: std
    ``8**0.5`` for independent unit-normal ``input`` and ``target``. Both gradients are
    scaled by ``8**-0.5`` (times the element count for ``reduction="mean"``, whose
    ``1 / count`` they undo), so they are unit-std, a fixed multiple of the true ones.

    Args:
        input: predictions.
        target: targets, the same shape as ``input`` (no broadcasting, which torch only warns about).
        size_average: deprecated, as in torch.
        reduce: deprecated, as in torch.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        The loss.

    Raises:
        InputError: ``input`` and ``target`` differ in shape.

    >>> import torch
    >>> from unitscale.functional import mse_loss
    >>> _ = torch.manual_seed(0)
    >>> x, y = torch.randn(4096, requires_grad=True), torch.randn(4096)
    >>> loss = mse_loss(x, y)
    >>> torch.allclose(loss, torch.nn.functional.mse_loss(x, y))
    True
    >>> loss.backward()
    >>> round(x.grad.std().item(), 1)
    1.0
    """
    for name, value in (("input", input), ("target", target)):
        if not isinstance(value, _torch.Tensor):
            raise _errors.InputError(f"mse_loss: {name} is a {type(value).__name__}; pass a tensor")
    if input.shape != target.shape:
        raise _errors.InputError(
            f"mse_loss: input of shape {tuple(input.shape)} and target of shape {tuple(target.shape)} differ; "
            "pass tensors of one shape (broadcast target yourself if you mean it)"
        )
    mean = reduction == "mean" and reduce is not False and size_average is not False
    grad_scale = 8**-0.5 * (max(input.numel(), 1) if mean else 1)
    input, target = scale(input, 1.0, grad_scale), scale(target, 1.0, grad_scale)
    return _F.mse_loss(input, target, size_average, reduce, reduction)
