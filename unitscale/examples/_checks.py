"""Argument checks for the reference models and data: one message shape for every setting."""

from __future__ import annotations

import math
from typing import Any

from unitscale.errors import ConfigError

__all__ = ["check_int", "check_positive"]


def check_int(owner: str, name: str, value: Any, low: int, high: int | None = None) -> int:
    """``value`` if it is an int in ``low..high``; else :class:`~unitscale.errors.ConfigError`.

    >>> check_int("MLP", "d", 4, 1)
    4
    """
    accepts = f"an int >= {low}" if high is None else f"an int in {low}..{high}"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{owner}: {name}={value!r:.60} is a {type(value).__name__}; pass {accepts}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"{owner}: {name}={value!r} must be {accepts}")
    return value


def check_positive(owner: str, name: str, value: Any) -> float:
    """``value`` as a float if it is a finite number > 0; else :class:`~unitscale.errors.ConfigError`.

    >>> check_positive("MarkovSource", "concentration", 0.5)
    0.5
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigError(f"{owner}: {name}={value!r:.60} must be a finite number > 0")
    return float(value)
