"""The unit-scaled embedding table, role ``"embedding"``."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.nn._linear import _check_sizes
from unitscale.nn._roles import RoleModule
from unitscale.scaling.parameter import tag


class Embedding(RoleModule, nn.Embedding):
    """Unit-scaled :class:`torch.nn.Embedding`: table ``N(0, 1)`` with role ``"embedding"``, gradient unit-scaled.

    Under Adam its learning rate scales as ``embedding_dim**-0.5`` (u-μP's embedding rule).

    Args:
        padding_idx: as in torch (that row starts at zero and gets no gradient).

    Raises:
        InputError: a size is not an int >= 0.

    >>> import torch
    >>> from unitscale.nn import Embedding
    >>> from unitscale.scaling import role_of
    >>> table = Embedding(10, 4)
    >>> table(torch.tensor([[1, 2, 3]])).shape, role_of(table.weight)
    (torch.Size([1, 3, 4]), ParamRole(role='embedding', width=4, depth=None))
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None) -> None:
        _check_sizes("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        tag(self.weight, "embedding")

    def forward(self, input: Tensor) -> Tensor:
        return U.embedding(input, self.weight, self.padding_idx)
