"""Unit-scaled activation and dropout layers."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.scaling.checks import check_approximate, check_p
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint


class GELU(nn.GELU):
    """Unit-scaled :class:`torch.nn.GELU`.

    Args:
        approximate: ``"none"`` or ``"tanh"``, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import GELU
    >>> _ = torch.manual_seed(0)
    >>> round(GELU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, approximate: str = "none", constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        check_approximate("GELU", approximate)
        super().__init__(approximate=approximate)
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.gelu(input, approximate=self.approximate, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class Softmax(nn.Softmax):
    """Unit-scaled :class:`torch.nn.Softmax`.

    Args:
        dim: the dimension to normalise over.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import Softmax
    >>> _ = torch.manual_seed(0)
    >>> round(Softmax(dim=-1, constraint=None)(torch.randn(1000, 64)).std().item(), 1)
    1.0
    """

    dim: int

    def __init__(self, dim: int, constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InputError(f"Softmax: dim={dim!r:.60} is a {type(dim).__name__}; pass an int, e.g. dim=-1")
        super().__init__(dim=dim)
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.softmax(input, self.dim, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, constraint={self.constraint!r}"


class SiLU(nn.SiLU):
    """Unit-scaled :class:`torch.nn.SiLU` (Llama's gate activation).

    Args:
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.

    >>> import torch
    >>> from unitscale.nn import SiLU
    >>> _ = torch.manual_seed(0)
    >>> round(SiLU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, constraint: ConstraintArg = "gmean") -> None:
        resolve_constraint(constraint)
        super().__init__()
        self.constraint = constraint

    def forward(self, input: Tensor) -> Tensor:
        return U.silu(input, constraint=self.constraint)

    def extra_repr(self) -> str:
        return f"constraint={self.constraint!r}"


class Dropout(nn.Dropout):
    """Unit-scaled :class:`torch.nn.Dropout`: kept values times ``(1 - p)**-0.5``, not ``(1 - p)**-1``.

    Args:
        p: probability of zeroing an element, in ``[0, 1]``.
        inplace: as in torch.

    Raises:
        InputError: ``p`` is not in ``[0, 1]``.

    >>> import torch
    >>> from unitscale.nn import Dropout
    >>> _ = torch.manual_seed(0)
    >>> round(Dropout(0.5)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__(check_p("Dropout", p), inplace)

    def forward(self, input: Tensor) -> Tensor:
        return U.dropout(input, self.p, self.training, self.inplace)
