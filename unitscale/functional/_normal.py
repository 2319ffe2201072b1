"""Moments of functions of a standard normal ``x ~ N(0, 1)``: the numbers most fixed scales here are made of."""

from __future__ import annotations

import math as _math
from collections.abc import Callable


def pdf(v: float) -> float:
    return _math.exp(-v * v / 2) / (2 * _math.pi) ** 0.5 if _math.isfinite(v) else 0.0


def cdf(v: float) -> float:
    return 0.5 * (1.0 + _math.erf(v / 2**0.5))


def partial_moment(k: int, low: float, high: float) -> float:
    """``E[x**k; low < x < high]``.

    By parts: ``M_k = low**(k-1) pdf(low) - high**(k-1) pdf(high) + (k - 1) M_(k-2)``,
    from ``M_0 = cdf(high) - cdf(low)`` and ``M_1 = pdf(low) - pdf(high)``.
    """
    if k == 0:
        return cdf(high) - cdf(low)
    if k == 1:
        return pdf(low) - pdf(high)
    edge = sum(sign * v ** (k - 1) * pdf(v) for sign, v in ((1, low), (-1, high)) if _math.isfinite(v))
    return edge + (k - 1) * partial_moment(k - 2, low, high)


def normal_mean(fn: Callable[[float], float], bound: float, steps: int) -> float:
    """``E[fn(x)]``, by the trapezoid rule in ``steps`` steps on ``[-bound, bound]``."""
    h = 2 * bound / steps
    total = 0.0
    for i in range(steps + 1):
        x = -bound + i * h
        total += (0.5 if i in (0, steps) else 1.0) * pdf(x) * fn(x)
    return total * h
