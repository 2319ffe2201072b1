"""Unit-scaled linear, readout and convolution layers: weights ``N(0, 1)``, no bias by default, roles tagged."""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.nn._roles import RoleModule
from unitscale.scaling.checks import check_mult
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint
from unitscale.scaling.docs import fill_docstring
from unitscale.scaling.parameter import tag


def _check_sizes(owner: str, **sizes: object) -> None:
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"{owner}: {name}={value!r:.60} must be an int >= 0")


class _UnitWeighted(RoleModule):
    """What Linear, Conv1d and Conv2d share: N(0, 1) weights, roles tagged, the constraint in the repr."""

    weight: Tensor
    constraint: ConstraintArg

    def _bias(self) -> Tensor | None:
        # torch's own attribute is typed per class (a Parameter on Linear, Optional on the convs)
        return self._parameters.get("bias")

    def _keep(self, constraint: ConstraintArg) -> None:
        # Called after torch's __init__. A conv weight's width is its fan-in, C_in / groups
        # times the kernel (ParamRole's default).
        resolve_constraint(constraint)
        self.constraint = constraint
        tag(self.weight, "weight")
        bias = self._bias()
        if bias is not None:
            tag(bias, "bias")

    def reset_parameters(self) -> None:
        # Unit scaling and u-μP (u-μP §4, the parametrization table: every weight initialised with unit variance,
        # the 1/sqrt(fan_in) moved into the op's multiplier): N(0, 1) weights, zero biases.
        nn.init.normal_(self.weight)
        bias = self._bias()
        if bias is not None:
            nn.init.zeros_(bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class _UnitConv(_UnitWeighted, nn.modules.conv._ConvNd):
    """What Conv1d and Conv2d share: torch's arguments, no bias by default, and the op in ``_op``."""

    _op: Callable[..., Tensor]

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int | tuple[int, ...],
        stride: int | tuple[int, ...] = 1,
        padding: int | tuple[int, ...] | str = 0,
        dilation: int | tuple[int, ...] = 1,
        groups: int = 1,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        # torch.nn.Conv1d or Conv2d, next in the MRO, takes these (mypy sees _ConvNd's own)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)  # type: ignore[call-arg, arg-type]
        self._keep(constraint)

    def forward(self, input: Tensor) -> Tensor:
        return self._op(
            input, self.weight, self._bias(), self.stride, self.padding, self.dilation, self.groups, self.constraint
        )


@fill_docstring
class Linear(_UnitWeighted, nn.Linear):
    """Unit-scaled :class:`torch.nn.Linear`: weight ``N(0, 1)`` with role ``"weight"``, no bias by default.

    Scaled as :func:`unitscale.functional.linear`; a bias has role ``"bias"``.

    Args:
        bias: add a learnable bias (initialised to zero).
        {constraint}

    Raises:
        InputError: a size is not an int >= 0.
        {constraint_errors}

    >>> import torch
    >>> from unitscale.nn import Linear
    >>> from unitscale.scaling import role_of
    >>> _ = torch.manual_seed(0)
    >>> layer = Linear(256, 256)
    >>> round(layer(torch.randn(64, 256)).std().item(), 1), role_of(layer.weight)
    (1.0, ParamRole(role='weight', width=256, depth=None))
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        constraint: ConstraintArg = "gmean",
    ) -> None:
        _check_sizes(type(self).__name__, in_features=in_features, out_features=out_features)
        super().__init__(in_features, out_features, bias=bias)
        self._keep(constraint)

    def forward(self, input: Tensor) -> Tensor:
        return U.linear(input, self.weight, self.bias, constraint=self.constraint)


@fill_docstring
class LinearReadout(Linear):
    """The u-μP readout (last layer): weight role ``"readout"``, forward × ``mult / fan_in``.

    Scaled as :func:`unitscale.functional.linear_readout`.

    Args:
        bias: add a bias (zeros, role ``"bias"``).
        {constraint}
        {mult}

    Raises:
        InputError: a size is not an int >= 0.
        {constraint_errors}
        {mult_errors}

    >>> from unitscale.nn import LinearReadout
    >>> from unitscale.scaling import role_of
    >>> role_of(LinearReadout(64, 10).weight).role
    'readout'
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        constraint: ConstraintArg = None,
        mult: float = 1.0,
    ) -> None:
        self.mult = check_mult("LinearReadout", "mult", mult)
        super().__init__(in_features, out_features, bias, constraint=constraint)
        tag(self.weight, "readout")

    def forward(self, input: Tensor) -> Tensor:
        return U.linear_readout(input, self.weight, self.bias, self.constraint, self.mult)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mult={self.mult}"


@fill_docstring
class Conv1d(_UnitConv, nn.Conv1d):
    """Unit-scaled :class:`torch.nn.Conv1d`: weight ``N(0, 1)`` with role ``"weight"``, no bias by default.

    Scaled as :func:`unitscale.functional.conv1d`; zero padding only (a ``padding_mode``
    other than ``"zeros"`` would add values the scales do not count).

    Args:
        {conv}
        bias: add a learnable bias (initialised to zero).
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.nn import Conv1d
    >>> _ = torch.manual_seed(0)
    >>> conv = Conv1d(32, 32, 5, padding=2, constraint=None)
    >>> round(conv(torch.randn(8, 32, 128)).std().item(), 1)
    1.0
    """

    _op = staticmethod(U.conv1d)


@fill_docstring
class Conv2d(_UnitConv, nn.Conv2d):
    """Unit-scaled :class:`torch.nn.Conv2d`: weight ``N(0, 1)`` with role ``"weight"``, no bias by default.

    Scaled as :func:`unitscale.functional.conv2d`; zero padding only.

    Args:
        {conv}
        bias: add a learnable bias (initialised to zero).
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.nn import Conv2d
    >>> _ = torch.manual_seed(0)
    >>> conv = Conv2d(32, 32, 3, padding=1, constraint=None)
    >>> round(conv(torch.randn(8, 32, 16, 16)).std().item(), 1)
    1.0
    """

    _op = staticmethod(U.conv2d)
