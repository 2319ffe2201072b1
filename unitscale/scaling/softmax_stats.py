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

Logits of another std ``s`` (a softmax multiplier, u-μP's α, or attention scores
scaled by ``mult / d_head``) change both numbers, towards the flat limit as ``s``
falls and the one-hot limit as it grows. :func:`table` measures them the same way
on the grid of :data:`N` for that ``s`` (a seeded float64 Monte Carlo, about 5M
logits, once per ``s``); every function here takes ``s`` (``spread``), 1 by default.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

N = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
OUT = (
    0.0, 0.5231, 0.6668, 0.7540, 0.8140, 0.8599, 0.9265, 1.0073, 1.0583, 1.1175,
    1.1524, 1.1926, 1.2225, 1.2586, 1.2832, 1.2986, 1.3007, 1.3068, 1.3080, 1.3081,
)  # fmt: skip
GRAD = (
    0.0, 0.5443, 0.7093, 0.8140, 0.8903, 0.9494, 1.0374, 1.1506, 1.2232, 1.3139,
    1.3695, 1.4361, 1.4785, 1.5474, 1.5943, 1.6216, 1.6316, 1.6408, 1.6441, 1.6453,
)  # fmt: skip


_TABLES: dict[float, tuple[tuple[float, ...], tuple[float, ...]]] = {1.0: (OUT, GRAD)}


@torch.compiler.disable
def _measure(spread: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    generator = torch.Generator().manual_seed(0)
    out, grad = [0.0], [0.0]
    for n in N[1:]:
        rows = max(2**18 // n, 64)
        logits = spread * torch.randn(rows, n, dtype=torch.float64, generator=generator)
        w = torch.softmax(logits, dim=-1)
        g = torch.randn(rows, n, dtype=torch.float64, generator=generator)
        grad_logits = w * (g - (w * g).sum(-1, keepdim=True))
        out.append(n * float(w.std()))
        grad.append(n * float(grad_logits.std()))
    return tuple(out), tuple(grad)


def table(spread: float = 1.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(OUT, GRAD)`` on the grid :data:`N` for logits ``N(0, spread**2)`` (measured once per spread).

    ``GRAD`` is the gradient with respect to the logits themselves; a softmax of
    ``mult * x`` has, with respect to ``x``, ``mult`` times it.

    >>> out, grad = table(1.0)
    >>> out is OUT, grad is GRAD
    (True, True)
    >>> round(table(0.5)[0][N.index(1024)], 2)
    0.53
    """
    spread = float(spread)
    if spread not in _TABLES:
        _TABLES[spread] = _measure(spread)
    return _TABLES[spread]


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


def softmax_scales(n: int, spread: float = 1.0) -> tuple[float, float]:
    """(output scale, logit-gradient scale) that make a softmax over ``n`` elements unit-std.

    Args:
        n: the number of elements normalised over.
        spread: the std of the logits.

    Returns:
        The inverse of the output's std and of the logits' gradient's std.

    >>> [round(s, 2) for s in softmax_scales(64)]
    [52.35, 43.29]
    """
    if n <= 1:
        return 1.0, 1.0  # a softmax over one element is the constant 1: nothing to scale
    out, grad = table(spread)
    return n / log_interp(n, out), n / log_interp(n, grad)


def _weight_sq(n: int, out: tuple[float, ...] = OUT) -> float:
    return (log_interp(n, out) ** 2 + 1) / n


def _grad_sq(n: int, grad: tuple[float, ...] = GRAD) -> float:
    return log_interp(n, grad) ** 2 / n


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


_CAUSAL: dict[tuple[int, float], tuple[float, float]] = {}


@torch.compiler.disable
def _causal_sums(full: int, out: tuple[float, ...], grad: tuple[float, ...]) -> tuple[float, float]:
    rows = range(1, min(full, _LIMIT) + 1)
    # Past the table both terms fall as 1 / n: their sum over rows grows as log.
    tail = _LIMIT * math.log(full / _LIMIT) if full > _LIMIT else 0.0
    return (
        sum(_weight_sq(n, out) for n in rows) + tail * _weight_sq(_LIMIT, out),
        sum(_grad_sq(n, grad) for n in rows) + tail * _grad_sq(_LIMIT, grad),
    )


def attention_row_stats(queries: int, keys: int, is_causal: bool, spread: float = 1.0) -> tuple[float, float]:
    """Mean over attention rows of ``E[sum w**2]`` and of the query-gradient term (see module docstring).

    Args:
        queries: number of rows (query positions).
        keys: number of key positions.
        is_causal: row ``i`` sees keys ``0..i`` (torch's top-left causal mask).
        spread: the std of the attention scores.

    Returns:
        ``(mean E[sum w**2], mean GRAD(n)**2 / n)``.

    >>> [round(v, 3) for v in attention_row_stats(64, 64, is_causal=False)]
    [0.039, 0.034]
    """
    out, grad = table(spread)
    if not is_causal:
        return _weight_sq(keys, out), _grad_sq(keys, grad)
    full = min(queries, keys)
    extra = max(queries - keys, 0)
    if spread == 1.0:
        weight_sum, grad_sum = _prefix(_WEIGHT_SQ_SUMS, full), _prefix(_GRAD_SQ_SUMS, full)
    else:
        key = (full, float(spread))
        if key not in _CAUSAL:
            _CAUSAL[key] = _causal_sums(full, out, grad)
        weight_sum, grad_sum = _CAUSAL[key]
    weight = (weight_sum + extra * _weight_sq(keys, out)) / queries
    grad_mean = (grad_sum + extra * _grad_sq(keys, grad)) / queries
    return weight, grad_mean
