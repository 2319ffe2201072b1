"""Unit-scaled normalisation layers: gain 1, bias 0, affine gradients scaled to unit std."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U


class LayerNorm(nn.LayerNorm):
    """Unit-scaled :class:`torch.nn.LayerNorm`: gain 1, bias 0, affine gradients scaled to unit std.

    Args:
        normalized_shape: the trailing shape to normalise over.
        eps: added to the variance.
        elementwise_affine: learn a gain (and bias).
        bias: learn a bias (with ``elementwise_affine``).

    >>> import torch
    >>> from unitscale.nn import LayerNorm
    >>> y = LayerNorm(8)(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3)
    1.0
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.RMSNorm):
    """Unit-scaled :class:`torch.nn.RMSNorm`: gain 1, its gradient scaled to unit std.

    Args:
        normalized_shape: the trailing shape to normalise over.
        eps: added to the mean square (``None``: the dtype's machine epsilon).
        elementwise_affine: learn a gain.

    >>> import torch
    >>> from unitscale.nn import RMSNorm
    >>> y = RMSNorm(8)(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3)
    1.0
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)
