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
falls and the one-hot limit as it grows. They were measured the same way (2M logits
per point, float64) on the grid of :data:`N` for every ``s = 2**(k / 2)``, ``k`` from
-8 to 6 (1/16 to 8); :func:`table` interpolates between spreads, linearly in
``log s`` and ``log`` of the value. Below 1/16 a softmax is nearly linear in its
logits (``OUT`` proportional to ``s``, ``GRAD`` constant); above 8 the last column is
used. Every function here takes ``s`` (``spread``), 1 by default.
"""

from __future__ import annotations

import math

from unitscale.scaling.constant import constant_result

N = (1, 2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
OUT = (
    0.0, 0.5231, 0.6668, 0.7540, 0.8140, 0.8599, 0.9265, 1.0073, 1.0583, 1.1175,
    1.1524, 1.1926, 1.2225, 1.2586, 1.2832, 1.2986, 1.3007, 1.3068, 1.3080, 1.3081,
)  # fmt: skip
GRAD = (
    0.0, 0.5443, 0.7093, 0.8140, 0.8903, 0.9494, 1.0374, 1.1506, 1.2232, 1.3139,
    1.3695, 1.4361, 1.4785, 1.5474, 1.5943, 1.6216, 1.6316, 1.6408, 1.6441, 1.6453,
)  # fmt: skip


_SPREAD_OUT: dict[int, tuple[float, ...]] = {
    -8: (0.0, 0.04405, 0.05101, 0.05413, 0.05591, 0.05704, 0.05853, 0.0599, 0.06061, 0.06122,
         0.06155, 0.06192, 0.06207, 0.0623, 0.06241, 0.06247, 0.06252, 0.06251, 0.06253, 0.06255),
    -7: (0.0, 0.06217, 0.07206, 0.0765, 0.07903, 0.0807, 0.08279, 0.08475, 0.08569, 0.08675,
         0.0871, 0.08764, 0.08782, 0.08821, 0.08834, 0.08848, 0.08856, 0.08851, 0.08865, 0.08859),
    -6: (0.0, 0.08756, 0.1016, 0.1081, 0.1117, 0.1142, 0.1172, 0.1198, 0.1214, 0.1227,
         0.1234, 0.1241, 0.1245, 0.1251, 0.1253, 0.1254, 0.1254, 0.1254, 0.1255, 0.1255),
    -5: (0.0, 0.1231, 0.1432, 0.1525, 0.1578, 0.1613, 0.1657, 0.1699, 0.1719, 0.174,
         0.175, 0.1762, 0.1768, 0.1775, 0.1779, 0.1782, 0.1782, 0.1781, 0.1783, 0.1782),
    -4: (0.0, 0.1719, 0.2011, 0.2146, 0.2228, 0.2284, 0.2347, 0.2414, 0.2444, 0.2478,
         0.2492, 0.2507, 0.2515, 0.2527, 0.2535, 0.2536, 0.2537, 0.2538, 0.254, 0.2541),
    -3: (0.0, 0.2364, 0.2799, 0.3012, 0.3139, 0.3222, 0.333, 0.3431, 0.3489, 0.3535,
         0.3569, 0.3594, 0.3608, 0.3626, 0.3638, 0.3644, 0.365, 0.3646, 0.3653, 0.3646),
    -2: (0.0, 0.3186, 0.3847, 0.4183, 0.4392, 0.4538, 0.4716, 0.4916, 0.501, 0.512,
         0.5167, 0.5215, 0.5246, 0.5284, 0.5314, 0.5325, 0.5326, 0.5327, 0.5331, 0.5329),
    -1: (0.0, 0.4166, 0.5159, 0.5707, 0.6062, 0.6321, 0.6666, 0.7055, 0.7265, 0.7504,
         0.7621, 0.7762, 0.7831, 0.7931, 0.8003, 0.8028, 0.8034, 0.804, 0.804, 0.8061),
    1: (0.0, 0.628, 0.8234, 0.9511, 1.047, 1.122, 1.238, 1.396, 1.503, 1.647,
        1.751, 1.872, 1.958, 2.138, 2.274, 2.375, 2.446, 2.471, 2.512, 2.51),
    2: (0.0, 0.7204, 0.9688, 1.139, 1.273, 1.382, 1.56, 1.822, 2.015, 2.302,
        2.509, 2.816, 3.056, 3.618, 4.178, 4.735, 5.277, 5.476, 6.139, 6.876),
    3: (0.0, 0.7967, 1.089, 1.299, 1.467, 1.611, 1.849, 2.213, 2.501, 2.945,
        3.295, 3.831, 4.252, 5.446, 6.913, 8.56, 10.66, 13.17, 15.5, 18.97),
    4: (0.0, 0.8549, 1.181, 1.422, 1.62, 1.789, 2.078, 2.531, 2.896, 3.479,
        3.948, 4.708, 5.319, 7.122, 9.526, 12.63, 16.75, 21.97, 28.23, 38.8),
    5: (0.0, 0.8976, 1.25, 1.514, 1.733, 1.922, 2.245, 2.766, 3.185, 3.869,
        4.438, 5.36, 6.111, 8.4, 11.48, 15.72, 21.36, 29.08, 39.79, 53.33),
    6: (0.0, 0.9281, 1.299, 1.579, 1.812, 2.015, 2.365, 2.931, 3.394, 4.152,
        4.783, 5.816, 6.672, 9.286, 12.9, 17.9, 24.65, 34.6, 48, 64.17),
}  # fmt: skip
_SPREAD_GRAD: dict[int, tuple[float, ...]] = {
    -8: (0.0, 0.7052, 0.8169, 0.8662, 0.8958, 0.9134, 0.9363, 0.959, 0.9692, 0.9811,
         0.985, 0.9904, 0.9935, 0.9985, 0.999, 1.001, 1.001, 1.001, 1.001, 1.002),
    -7: (0.0, 0.7044, 0.8153, 0.8657, 0.8955, 0.9146, 0.9368, 0.9605, 0.9716, 0.982,
         0.9872, 0.9919, 0.9962, 0.9999, 1.003, 1.002, 1.004, 1.004, 1.004, 1.004),
    -6: (0.0, 0.7016, 0.8143, 0.8654, 0.8962, 0.9148, 0.9388, 0.9632, 0.975, 0.9855,
         0.9912, 0.9963, 0.9988, 1.003, 1.006, 1.007, 1.008, 1.008, 1.008, 1.008),
    -5: (0.0, 0.697, 0.812, 0.8656, 0.8967, 0.9172, 0.9419, 0.9678, 0.9803, 0.992,
         0.9977, 1.003, 1.007, 1.011, 1.014, 1.015, 1.015, 1.016, 1.016, 1.016),
    -4: (0.0, 0.6869, 0.8081, 0.8651, 0.8999, 0.9215, 0.9486, 0.9776, 0.9896, 1.004,
         1.011, 1.018, 1.022, 1.027, 1.03, 1.031, 1.031, 1.031, 1.031, 1.032),
    -3: (0.0, 0.6696, 0.8, 0.8643, 0.903, 0.9291, 0.9613, 0.9946, 1.011, 1.03,
         1.038, 1.047, 1.051, 1.059, 1.061, 1.063, 1.065, 1.064, 1.065, 1.064),
    -2: (0.0, 0.641, 0.7829, 0.8588, 0.9064, 0.9394, 0.9817, 1.029, 1.052, 1.079,
         1.091, 1.104, 1.111, 1.121, 1.127, 1.129, 1.133, 1.132, 1.134, 1.132),
    -1: (0.0, 0.599, 0.7541, 0.844, 0.9046, 0.9483, 1.011, 1.082, 1.125, 1.169,
         1.192, 1.219, 1.234, 1.258, 1.272, 1.279, 1.28, 1.282, 1.279, 1.283),
    1: (0.0, 0.4818, 0.6496, 0.7639, 0.8521, 0.9258, 1.042, 1.205, 1.323, 1.487,
        1.6, 1.758, 1.865, 2.098, 2.315, 2.439, 2.55, 2.601, 2.74, 2.692),
    2: (0.0, 0.4191, 0.5792, 0.6951, 0.7904, 0.872, 1.003, 1.21, 1.369, 1.61,
        1.787, 2.064, 2.28, 2.824, 3.401, 3.985, 4.666, 5.087, 5.995, 7.227),
    3: (0.0, 0.3581, 0.5065, 0.619, 0.7139, 0.7956, 0.935, 1.158, 1.344, 1.619,
        1.844, 2.226, 2.518, 3.343, 4.444, 5.767, 7.426, 9.752, 11.32, 14.62),
    4: (0.0, 0.3038, 0.4379, 0.5414, 0.6297, 0.7067, 0.841, 1.061, 1.246, 1.551,
        1.796, 2.213, 2.534, 3.569, 4.926, 6.778, 9.157, 12.69, 17.25, 22.96),
    5: (0.0, 0.2562, 0.3742, 0.4661, 0.5447, 0.6161, 0.7435, 0.9495, 1.126, 1.415,
        1.652, 2.054, 2.386, 3.447, 4.889, 7.073, 10.04, 13.67, 18.97, 27.42),
    6: (0.0, 0.2159, 0.3172, 0.397, 0.4696, 0.533, 0.643, 0.8308, 0.9853, 1.251,
        1.472, 1.851, 2.176, 3.162, 4.544, 6.563, 9.513, 12.99, 17.95, 27.59),
}  # fmt: skip

_TABLES: dict[float, tuple[tuple[float, ...], tuple[float, ...]]] = {1.0: (OUT, GRAD)}
_SPREAD_OUT[0], _SPREAD_GRAD[0] = OUT, GRAD
_KS = sorted(_SPREAD_OUT)


def _between(low: tuple[float, ...], high: tuple[float, ...], t: float) -> tuple[float, ...]:
    return tuple(
        a if a == 0 else math.exp((1 - t) * math.log(a) + t * math.log(b)) for a, b in zip(low, high, strict=True)
    )


def table(spread: float = 1.0) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(OUT, GRAD)`` on the grid :data:`N` for logits ``N(0, spread**2)``.

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
        k = 2 * math.log2(spread) if spread > 0 else -math.inf
        if k <= _KS[0]:
            factor = spread / 2 ** (_KS[0] / 2)
            _TABLES[spread] = tuple(v * factor for v in _SPREAD_OUT[_KS[0]]), _SPREAD_GRAD[_KS[0]]
        elif k >= _KS[-1]:
            _TABLES[spread] = _SPREAD_OUT[_KS[-1]], _SPREAD_GRAD[_KS[-1]]
        else:
            low = math.floor(k)
            out, grad = (_between(t[low], t[low + 1], k - low) for t in (_SPREAD_OUT, _SPREAD_GRAD))
            _TABLES[spread] = out, grad
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
    """(output scale, logit-gradient scale): the inverse stds of a softmax over ``n`` elements and its logits' gradient.

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
_CAUSAL: dict[tuple[int, float], tuple[float, float]] = {}


# TorchDynamo and torch.export run this once and keep its result, rather than trace a loop of up to 8192 rows.
@constant_result
def _causal_sums(full: int, out: tuple[float, ...], grad: tuple[float, ...]) -> tuple[float, float]:
    rows = range(1, min(full, _LIMIT) + 1)
    # Past the table both terms fall as 1 / n: their sum over rows grows as log.
    tail = _LIMIT * math.log(full / _LIMIT) if full > _LIMIT else 0.0
    return (
        sum(_weight_sq(n, out) for n in rows) + tail * _weight_sq(_LIMIT, out),
        sum(_grad_sq(n, grad) for n in rows) + tail * _grad_sq(_LIMIT, grad),
    )


def attention_row_stats(queries: int, keys: int, is_causal: bool, spread: float = 1.0) -> tuple[float, float]:
    """``(mean E[sum w**2], mean GRAD(n)**2 / n)`` over attention rows (see the module docstring).

    With ``is_causal``, row ``i`` sees keys ``0..i`` (torch's top-left causal mask).

    >>> [round(v, 3) for v in attention_row_stats(64, 64, is_causal=False)]
    [0.039, 0.034]
    """
    out, grad = table(spread)
    if not is_causal:
        return _weight_sq(keys, out), _grad_sq(keys, grad)
    full, extra = min(queries, keys), max(queries - keys, 0)
    key = (full, float(spread))
    if key not in _CAUSAL:
        _CAUSAL[key] = _causal_sums(full, out, grad)
    weight_sum, grad_sum = _CAUSAL[key]
    return (weight_sum + extra * _weight_sq(keys, out)) / queries, (grad_sum + extra * _grad_sq(keys, grad)) / queries
