"""Checks of the arguments that unit-scaled ops and modules share (a probability, a residual tau, an α).

Each raises a typed error naming the op or module (``owner``) and the argument, and
returns the value as a float, so an op and the module over it refuse the same values
with the same words.

>>> from unitscale.scaling.checks import check_tau
>>> check_tau("residual_add", 0.25)
0.25
"""

from __future__ import annotations

import math
from typing import Any

from unitscale.errors import InputError, MultiplierError

__all__ = ["check_p", "check_tau", "check_mult", "check_approximate"]


def check_p(owner: str, p: Any, name: str = "p") -> float:
    """``p`` as a float if it is a probability (a number in ``[0, 1]``), else :class:`~unitscale.errors.InputError`.

    >>> from unitscale.scaling.checks import check_p
    >>> check_p("dropout", 0.1)
    0.1
    """
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise InputError(f"{owner}: {name}={p!r:.60} is not a probability; pass a number in [0, 1]")
    return float(p)


def check_tau(owner: str, tau: Any, name: str = "tau") -> float:
    """``tau`` as a float if it is strictly between 0 and 1, else :class:`~unitscale.errors.InputError`.

    >>> from unitscale.scaling.checks import check_tau
    >>> check_tau("TransformerLayer", 0.5, "mlp_tau")
    0.5
    """
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < 1:
        raise InputError(
            f"{owner}: {name}={tau!r:.60} is not a number strictly between 0 and 1; it is the share of the "
            f"output variance the residual branch carries (e.g. 0.01 for attention, 0.5 for an MLP)"
        )
    return float(tau)


def check_mult(owner: str, name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number > 0, else :class:`~unitscale.errors.MultiplierError`.

    Every α of u-μP is a positive factor: 0 switches a path off, a negative one flips it.

    >>> from unitscale.scaling.checks import check_mult
    >>> check_mult("Softmax", "mult", 2)
    2.0
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise MultiplierError(
            f"{owner}: {name}={value!r:.60} must be a finite number > 0 (an α of u-μP; 1 is the default)"
        )
    return float(value)


def check_approximate(owner: str, approximate: Any) -> str:
    """``approximate`` if it is GELU's ``"none"`` or ``"tanh"``, else :class:`~unitscale.errors.InputError`.

    >>> from unitscale.scaling.checks import check_approximate
    >>> check_approximate("gelu", "tanh")
    'tanh'
    """
    if approximate not in ("none", "tanh"):
        raise InputError(f"{owner}: approximate={approximate!r:.60} is unknown; pass 'none' or 'tanh'")
    return str(approximate)
