"""The unit-scaled embedding table."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.nn._linear import _check_sizes


class Embedding(nn.Embedding):
    """Unit-scaled :class:`torch.nn.Embedding`: table ``N(0, 1)``, gradient scaled to unit std.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: size of each row.
        padding_idx: as in torch (that row starts at zero and gets no gradient).

    >>> import torch
    >>> from unitscale.nn import Embedding
    >>> Embedding(10, 4)(torch.tensor([[1, 2, 3]])).shape
    torch.Size([1, 3, 4])
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> None:
        _check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight, self.padding_idx)
