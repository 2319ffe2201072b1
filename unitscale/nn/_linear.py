"""Unit-scaled linear and convolution layers: weights ``N(0, 1)``, no bias by default."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint


def _check_sizes(owner: str, **sizes: object) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{owner}: {name}={value!r:.60} must be an int >= 0")


class Linear(nn.Linear):
    """Unit-scaled :class:`torch.nn.Linear`: weight ``N(0, 1)``, no bias by default.

    Args:
        in_features: size of each input row.
        out_features: size of each output row.
        bias: add a learnable bias (initialised to zero).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Linear
    >>> _ = torch.manual_seed(0)
    >>> round(Linear(256, 256)(torch.randn(64, 256)).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        resolve_constraint(constraint)
        _check_sizes("Linear", in_features=in_features, out_features=out_features)
        super().__init__(in_features, out_features, bias=bias)
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.linear(input, self.weight, self.bias, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class Conv2d(nn.Conv2d):
    """Unit-scaled :class:`torch.nn.Conv2d`: weight ``N(0, 1)``, no bias by default, zero padding only.

    Args:
        in_channels: input channels.
        out_channels: output channels.
        kernel_size: as in torch.
        stride: as in torch.
        padding: as in torch (``"same"`` and ``"valid"`` included).
        dilation: as in torch.
        groups: as in torch.
        bias: add a learnable bias (initialised to zero).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Conv2d
    >>> _ = torch.manual_seed(0)
    >>> conv = Conv2d(32, 32, 3, padding=1, constraint=None)
    >>> round(conv(torch.randn(8, 32, 16, 16)).std().item(), 1)
    1.0
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, int],
        stride: int | tuple[int, int] = 1,
        padding: int | tuple[int, int] | str = 0,
        dilation: int | tuple[int, int] = 1,
        groups: int = 1,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        resolve_constraint(constraint)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        self.constraint = constraint

    def reset_parameters(self) -> None:
        nn.init.normal_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return U.conv2d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.dilation,
            self.groups,
            self.constraint,
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"
