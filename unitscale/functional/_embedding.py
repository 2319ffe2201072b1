"""Embedding lookup, its table's gradient scaled by the lookups per row."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as _F

from unitscale.functional._checks import _misfits
from unitscale.functional._scale import _inv_sqrt, scale

if TYPE_CHECKING:
    from torch import Tensor


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.embedding`.

    The table's gradient × ``(lookups / vocab)**-0.5``: a row's sums its lookups.

    Args:
        weight: the embedding table ``(vocab, dim)``.

    >>> import torch
    >>> from unitscale.functional import embedding
    >>> _ = torch.manual_seed(0)
    >>> w = torch.randn(64, 32, requires_grad=True)
    >>> out = embedding(torch.randint(0, 64, (16384,)), w)
    >>> out.backward(torch.randn_like(out))
    >>> round(w.grad.std().item(), 1)
    1.0
    """
    with _misfits(
        "embedding",
        "input holds integer indices (int64 or int32) below weight.shape[0], weight is 2-D (vocab, dim)",
        input=input,
        weight=weight,
    ):
        weight = scale(weight, 1.0, _inv_sqrt(input.numel() / weight.shape[0]))
        return _F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
