"""Unit-scaled loss modules."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.scaling.checks import check_mult
from unitscale.scaling.docs import fill_docstring


@fill_docstring
class CrossEntropyLoss(nn.CrossEntropyLoss):
    """:class:`torch.nn.CrossEntropyLoss` of ``mult * input``, its logits' gradient unit-scaled.

    The value is torch's; see :func:`unitscale.functional.cross_entropy`.

    Args:
        {mult}

    Raises:
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import CrossEntropyLoss
    >>> logits, target = torch.zeros(4, 10), torch.zeros(4, dtype=torch.long)
    >>> loss = CrossEntropyLoss()(logits, target)
    >>> round(loss.item(), 4) == round(torch.log(torch.tensor(10.0)).item(), 4)
    True
    """

    def __init__(
        self,
        weight: Tensor | None = None,
        ignore_index: int = -100,
        reduction: str = "mean",
        label_smoothing: float = 0.0,
        mult: float = 1.0,
    ) -> None:
        super().__init__(weight=weight, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
        self.mult = check_mult("CrossEntropyLoss", "mult", mult)

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return U.cross_entropy(
            input,
            target,
            self.weight,
            ignore_index=self.ignore_index,
            reduction=self.reduction,
            label_smoothing=self.label_smoothing,
            mult=self.mult,
        )


class MSELoss(nn.MSELoss):
    """:class:`torch.nn.MSELoss` whose gradients are unit-scaled: :func:`unitscale.functional.mse_loss`.

    >>> import torch
    >>> from unitscale.nn import MSELoss
    >>> MSELoss()(torch.ones(3), torch.zeros(3)).item()
    1.0
    """

    def forward(self, input: Tensor, target: Tensor) -> Tensor:
        return U.mse_loss(input, target, reduction=self.reduction)
