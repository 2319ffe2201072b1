"""Statistics of softmax over N(0, 1) logits, which fix the scales of ``softmax``, attention and cross-entropy.

For a softmax ``w`` over ``n`` i.i.d. ``N(0, 1)`` logits and an ``N(0, 1)`` output
gradient ``g``, the input gradient is ``w * (g - sum(w * g))``. Two numbers per ``n``
describe it: ``n * std(w)`` (:data:`OUT`) and ``n * std(input gradient)``
(:data:`GRAD`). Neither has a closed form for small ``n``; they were measured by
Monte Carlo (about 8M logits per ``n``, float64) and tend to the lognormal limits
``sqrt(e - 1)`` and ``sqrt(e)`` as ``n`` grows. Between grid points, interpolate in
``log n``. tests/test_functional.py re-measures a few of them.

From these, per attention row over ``n`` keys:

- ``E[sum w**2] = (OUT(n)**2 + 1) / n``: the variance of a weighted average of
  unit-std values (an attention output row, or a value gradient);
- ``E[sum_j w_j**2 (1 - 2 w_j + sum w**2)] = GRAD(n)**2 / n``: the variance that
  reaches the query and key gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

N = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
OUT = (
    0.0, 0.5231, 0.6668, 0.7540, 0.8140, 0.8599, 0.9265, 1.0073, 1.0583, 1.1175,
    1.1524, 1.1926, 1.2225, 1.2586, 1.2832, 1.2986, 1.3007, 1.3068, 1.3080, 1.3081,
)  # fmt: skip
GRAD = (
    0.0, 0.5443, 0.7093, 0.8140, 0.8903, 0.9494, 1.0374, 1.1506, 1.2232, 1.3139,
    1.3695, 1.4361, 1.4785, 1.5474, 1.5943, 1.6216, 1.6316, 1.6408, 1.6441, 1.6453,
)  # fmt: skip


def log_interp(n: int, ys: tuple[float, ...]) -> float:
    """``ys`` at ``n``: linear in ``log n`` between the points of :data:`N`, clamped at the ends.

    >>> log_interp(4, OUT), round(log_interp(10_000, OUT), 4)
    (0.754, 1.3081)
    """
    if n <= N[0]:
        return ys[0]
    for i in range(1, len(N)):
        if n <= N[i]:
            t = (math.log(n) - math.log(N[i - 1])) / (math.log(N[i]) - math.log(N[i - 1]))
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    return ys[-1]


def softmax_scales(n: int) -> tuple[float, float]:
    """(output scale, input-gradient scale) that make a softmax over ``n`` elements unit-std.

    >>> [round(s, 2) for s in softmax_scales(64)]
    [52.35, 43.29]
    """
    if n <= 1:
        return 1.0, 1.0  # a softmax over one element is the constant 1: nothing to scale
    return n / log_interp(n, OUT), n / log_interp(n, GRAD)


def _weight_sq(n: int) -> float:
    return (log_interp(n, OUT) ** 2 + 1) / n


def _grad_sq(n: int) -> float:
    return log_interp(n, GRAD) ** 2 / n


_LIMIT = N[-1]


def _prefix_sums(term: Callable[[int], float]) -> tuple[float, ...]:
    sums = [0.0]
    for n in range(1, _LIMIT + 1):
        sums.append(sums[-1] + term(n))
    return tuple(sums)


# Row i of a causal mask sees min(i + 1, keys) keys: prefix sums over row lengths.
_WEIGHT_SQ_SUMS = _prefix_sums(_weight_sq)
_GRAD_SQ_SUMS = _prefix_sums(_grad_sq)


def _prefix(sums: tuple[float, ...], m: int) -> float:
    if m <= _LIMIT:
        return sums[m]
    # Past the table both terms are e / n.
    return sums[_LIMIT] + math.e * math.log(m / _LIMIT)


def attention_row_stats(queries: int, keys: int, is_causal: bool) -> tuple[float, float]:
    """Mean over attention rows of ``E[sum w**2]`` and of the query-gradient term (see module docstring).

    Args:
        queries: number of rows (query positions).
        keys: number of key positions.
        is_causal: row ``i`` sees keys ``0..i`` (torch's top-left causal mask).

    Returns:
        ``(mean E[sum w**2], mean GRAD(n)**2 / n)``.

    >>> [round(v, 3) for v in attention_row_stats(64, 64, is_causal=False)]
    [0.039, 0.034]
    """
    if not is_causal:
        return _weight_sq(keys), _grad_sq(keys)
    full = min(queries, keys)
    extra = max(queries - keys, 0)
    weight = (_prefix(_WEIGHT_SQ_SUMS, full) + extra * _weight_sq(keys)) / queries
    grad = (_prefix(_GRAD_SQ_SUMS, full) + extra * _grad_sq(keys)) / queries
    return weight, grad
