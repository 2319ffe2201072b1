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

    Torch's result × ``(1 - p)**0.5`` in both passes, so values and gradients keep unit std.
    When not training the value is its training expectation, ``(1 - p)**0.5 * input``, as
    with torch (the layers after it were trained on that mean).

    Args:
        p: probability of zeroing an element, in ``[0, 1]``.

    Raises:
        InputError: ``p`` is not in ``[0, 1]``, or ``training`` is not a bool.

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
    if p == 0:
        return input
    keep = (1 - p) ** 0.5
    if inplace:
        return (_F.dropout(input, p, True, True) if training else input).mul_(keep)
    return _F.dropout(input, p, True) * keep if training else input * keep
