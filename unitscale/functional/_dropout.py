"""Dropout that keeps unit std."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.scaling.checks import check_p

if TYPE_CHECKING:
    from torch import Tensor


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.dropout`.

    Torch's dropout divides the kept values by ``1 - p``, which raises the std to
    ``(1 - p)**-0.5``; this one multiplies by ``(1 - p)**0.5`` on top, in both
    passes, so values and gradients keep unit std. Identity when not training.

    Args:
        input: any tensor.
        p: probability of zeroing an element, in ``[0, 1]``.
        training: apply dropout (``False``: identity).
        inplace: as in torch.

    Returns:
        The tensor with dropout applied.

    Raises:
        InputError: ``p`` is not in ``[0, 1]``.

    >>> import torch
    >>> from unitscale.functional import dropout
    >>> _ = torch.manual_seed(0)
    >>> round(dropout(torch.randn(10_000), p=0.5).std().item(), 1)
    1.0
    """
    p = check_p("dropout", p)
    if not isinstance(training, bool):
        raise _errors.InputError(
            f"dropout: training={training!r:.60} is a {type(training).__name__}; pass True or False"
        )
    if not training or p == 0:
        return input
    return _F.dropout(input, p, training, inplace) * (1 - p) ** 0.5
