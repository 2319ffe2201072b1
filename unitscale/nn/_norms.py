"""Unit-scaled normalisation layers: gain 1 (role ``"norm"``), bias 0 (role ``"bias"``), unit-scaled gradients."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.nn._roles import RoleModule
from unitscale.scaling.parameter import tag


class LayerNorm(RoleModule, nn.LayerNorm):
    """Unit-scaled :class:`torch.nn.LayerNorm`: gain 1 with role ``"norm"``, bias 0 with role ``"bias"``.

    Scaled as :func:`unitscale.functional.layer_norm`.

    Args:
        elementwise_affine: learn a gain (and bias).
        bias: learn a bias (with ``elementwise_affine``).

    >>> import torch
    >>> from unitscale.nn import LayerNorm
    >>> from unitscale.scaling import role_of
    >>> norm = LayerNorm(8)
    >>> y = norm(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3), role_of(norm.weight).role
    (1.0, 'norm')
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, bias=bias)
        if self.weight is not None:
            tag(self.weight, "norm")
        if self.bias is not None:
            tag(self.bias, "bias")

    def forward(self, input: Tensor) -> Tensor:
        return U.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)


class RMSNorm(RoleModule, nn.RMSNorm):
    """Unit-scaled :class:`torch.nn.RMSNorm`: gain 1 with role ``"norm"``, its gradient scaled to unit std.

    Args:
        eps: added to the mean square (``None``: the dtype's machine epsilon).

    >>> import torch
    >>> from unitscale.nn import RMSNorm
    >>> from unitscale.scaling import role_of
    >>> norm = RMSNorm(8)
    >>> y = norm(torch.arange(16.0).reshape(2, 8))
    >>> round(y.square().mean().item(), 3), role_of(norm.weight).role
    (1.0, 'norm')
    """

    def __init__(
        self,
        normalized_shape: int | list[int] | tuple[int, ...],
        eps: float | None = None,
        elementwise_affine: bool = True,
    ) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        if self.weight is not None:
            tag(self.weight, "norm")

    def forward(self, input: Tensor) -> Tensor:
        return U.rms_norm(input, self.normalized_shape, self.weight, self.eps)
