"""Argument checks for the reference models and data: one message shape for every setting."""

from __future__ import annotations

import math
from typing import Any

from unitscale.errors import ConfigError

__all__ = ["check_int", "check_positive", "check_tinygpt"]


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


def check_tinygpt(vocab_size: Any, d_model: Any, n_layers: Any, n_heads: Any, seq_len: Any) -> None:
    """Check ``TinyGPT``'s sizes: positive ints, and ``n_heads`` dividing ``d_model``.

    >>> check_tinygpt(64, 10, 2, 3, 64)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.ConfigError: TinyGPT: d_model=10 is not divisible by ...
    """
    for name, value in (("vocab_size", vocab_size), ("d_model", d_model), ("n_heads", n_heads), ("seq_len", seq_len)):
        check_int("TinyGPT", name, value, 1)
    check_int("TinyGPT", "n_layers", n_layers, 0)
    if d_model % n_heads:
        divisors = [h for h in range(1, d_model + 1) if d_model % h == 0][:8]
        raise ConfigError(
            f"TinyGPT: d_model={d_model} is not divisible by n_heads={n_heads}; "
            f"pick n_heads dividing d_model (e.g. one of {divisors})"
        )
