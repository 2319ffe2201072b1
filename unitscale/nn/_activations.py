"""Unit-scaled activation, softmax and dropout layers, each with u-μP's multiplier where the paper has one."""

from __future__ import annotations

from torch import Tensor, nn

import unitscale.functional as U
from unitscale.errors import InputError
from unitscale.scaling.checks import check_approximate, check_mult, check_p
from unitscale.scaling.constraints import ConstraintArg, resolve_constraint
from unitscale.scaling.docs import fill_docstring


class _Multiplied(nn.Module):
    """What the modules with a ``constraint`` and u-μP's ``mult`` share: both checked, kept and in the repr."""

    constraint: ConstraintArg
    mult: float

    def _keep(self, constraint: ConstraintArg, mult: float) -> None:
        resolve_constraint(constraint)
        self.constraint = constraint
        self.mult = check_mult(type(self).__name__, "mult", mult)

    def extra_repr(self) -> str:
        return ", ".join(filter(None, (super().extra_repr(), f"constraint={self.constraint!r}, mult={self.mult}")))


@fill_docstring
class GELU(_Multiplied, nn.GELU):
    """Unit-scaled :class:`torch.nn.GELU` of ``mult * x`` (divided by ``mult``): :func:`unitscale.functional.gelu`.

    Args:
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import GELU
    >>> _ = torch.manual_seed(0)
    >>> round(GELU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, approximate: str = "none", constraint: ConstraintArg = "gmean", mult: float = 1.0) -> None:
        check_approximate("GELU", approximate)
        super().__init__(approximate=approximate)
        self._keep(constraint, mult)

    def forward(self, input: Tensor) -> Tensor:
        return U.gelu(input, approximate=self.approximate, constraint=self.constraint, mult=self.mult)


@fill_docstring
class Softmax(_Multiplied, nn.Softmax):
    """Unit-scaled :class:`torch.nn.Softmax` of ``mult * x``: :func:`unitscale.functional.softmax`.

    Args:
        {constraint}
        {mult}

    Raises:
        InputError: ``dim`` is not an int.
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import Softmax
    >>> _ = torch.manual_seed(0)
    >>> round(Softmax(dim=-1, constraint=None)(torch.randn(1000, 64)).std().item(), 1)
    1.0
    """

    dim: int

    def __init__(self, dim: int, constraint: ConstraintArg = "gmean", mult: float = 1.0) -> None:
        if isinstance(dim, bool) or not isinstance(dim, int):
            raise InputError(f"Softmax: dim={dim!r:.60} is a {type(dim).__name__}; pass an int, e.g. dim=-1")
        super().__init__(dim=dim)
        self._keep(constraint, mult)

    def forward(self, input: Tensor) -> Tensor:
        return U.softmax(input, self.dim, constraint=self.constraint, mult=self.mult)


@fill_docstring
class SiLU(_Multiplied, nn.SiLU):
    """Unit-scaled :class:`torch.nn.SiLU` of ``x * sigmoid(mult * x)``: :func:`unitscale.functional.silu`.

    Args:
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.nn import SiLU
    >>> _ = torch.manual_seed(0)
    >>> round(SiLU(constraint=None)(torch.randn(10_000)).std().item(), 1)
    1.0
    """

    def __init__(self, constraint: ConstraintArg = "gmean", mult: float = 1.0) -> None:
        super().__init__()
        self._keep(constraint, mult)

    def forward(self, input: Tensor) -> Tensor:
        return U.silu(input, constraint=self.constraint, mult=self.mult)


class Dropout(nn.Dropout):
    """Unit-scaled :class:`torch.nn.Dropout`: kept values times ``(1 - p)**-0.5``; in eval mode ``(1 - p)**0.5 * x``.

    Both modes have the same expectation (:func:`unitscale.functional.dropout`).

    Args:
        p: probability of zeroing an element, in ``[0, 1]``.

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
