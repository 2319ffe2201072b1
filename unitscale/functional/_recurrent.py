"""Recurrent layers: torch's LSTM kernel on weights scaled by their fan-in, the output by its stationary RMS."""

from __future__ import annotations

import functools as _functools
import math as _math
from typing import TYPE_CHECKING

import torch as _torch

from unitscale import errors as _errors
from unitscale.functional._normal import normal_mean
from unitscale.functional._scale import _inv_sqrt, scale

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor


@_functools.lru_cache(maxsize=1)
def _lstm_output_rms() -> float:
    """Root-mean-square of an LSTM's ``h`` at its stationary point, for unit-scaled inputs and weights.

    Each gate's pre-activation is ``W_ih x / in**0.5 + W_hh h / H**0.5``, of variance ``1 + E[h**2]``;
    the cell keeps ``E[c**2] = E[i**2] E[g**2] / (1 - E[f**2])`` and ``E[h**2] = E[o**2] E[tanh(c)**2]``
    (gates independent, ``c`` Gaussian), iterated to the fixed point.
    """
    sigmoid_sq = lambda z: (1 / (1 + _math.exp(-z))) ** 2  # noqa: E731
    tanh_sq = lambda z: _math.tanh(z) ** 2  # noqa: E731

    def mean(fn: Callable[[float], float], variance: float) -> float:  # E[fn(z)], z ~ N(0, variance)
        return normal_mean(lambda z: fn(z * variance**0.5), 10.0, 2000)

    h_sq = 0.1
    for _ in range(30):
        gate_var = 1 + h_sq
        s2, g2 = mean(sigmoid_sq, gate_var), mean(tanh_sq, gate_var)
        c_sq = s2 * g2 / (1 - s2)
        h_sq = s2 * mean(tanh_sq, c_sq)
    return h_sq**0.5


def lstm(
    input: Tensor,
    hx: tuple[Tensor, Tensor] | list[Tensor],
    params: tuple[Tensor, ...] | list[Tensor],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Unit-scaled :func:`torch.lstm` (what :class:`torch.nn.LSTM` calls).

    Torch's kernel runs on weights scaled by their fan-in, both ways: ``W_ih / in**0.5`` and
    ``W_hh / H**0.5``, so each gate's pre-activation has unit variance from the input, plus
    the recurrent part. The recurrence reads its own output, so every gradient inside meets
    again at earlier steps: the scales are forward scales of the weights (the gradient stays
    the true one of the scaled function); a weight's own gradient, summed over the ``N * T``
    tokens, is scaled by ``(N * T)**-0.5`` as a linear layer's is (a cut edge: each weight
    is read by this op alone), and a bias's likewise, added unscaled. The output sequence is
    scaled by the inverse of ``h``'s stationary root-mean-square (0.19, computed from the gates'
    Gaussian moments), both ways; the final ``h`` and ``c`` are returned as torch computes them.
    The input's gradient is left as that scale makes it, not brought to 1 (std 3.6 for 16
    inputs and 128 hidden units, a gradient on every step): a backward scale of its own would
    need the gate derivatives' moments along the recurrence, and would break the gradient
    where the input has other readers.

    Args:
        input: ``(T, N, in)``, or ``(N, T, in)`` with ``batch_first``.
        hx: ``(h_0, c_0)``.
        params: per layer and direction ``w_ih, w_hh`` (and ``b_ih, b_hh`` with ``has_biases``).
        has_biases: as in torch.
        num_layers: as in torch.
        dropout: as in torch.
        train: as in torch.
        bidirectional: as in torch.
        batch_first: as in torch.

    Returns:
        ``(output, h_n, c_n)``, the output scaled.

    Raises:
        InputError: a packed sequence (``hx`` is a tensor of batch sizes), or projections
            (``proj_size > 0``): not supported.

    >>> import torch
    >>> from unitscale.functional import lstm
    >>> _ = torch.manual_seed(0)
    >>> x, h0 = torch.randn(32, 64, 16), torch.zeros(1, 64, 128)
    >>> params = [torch.randn(512, 16), torch.randn(512, 128)]
    >>> out, _, _ = lstm(x, (h0, h0), params, False, 1, 0.0, False, False, False)
    >>> round(out.std().item(), 1)
    1.0
    """
    if isinstance(hx, _torch.Tensor):
        raise _errors.InputError("lstm: packed sequences are not supported by the unit-scaled twin; pad them")
    per = 4 if has_biases else 2
    directions = 2 if bidirectional else 1
    if len(params) != per * num_layers * directions:
        raise _errors.InputError(
            f"lstm: {len(params)} parameter tensors for {num_layers} layer(s) of {directions} direction(s); "
            f"projections (proj_size > 0) are not supported by the unit-scaled twin"
        )
    tokens = input.numel() // max(input.shape[-1], 1)
    token_scale = _inv_sqrt(tokens)
    scaled = []
    for i, p in enumerate(params):
        if i % per < 2:  # a weight: forward by its fan-in, its own gradient by the tokens it sums over
            fan_in = p.shape[-1]
            scaled.append(scale(p, fan_in**-0.5, token_scale))
        else:
            scaled.append(scale(p, 1.0, token_scale))
    output, h_n, c_n = _torch.lstm(
        input, tuple(hx), scaled, has_biases, num_layers, dropout, train, bidirectional, batch_first
    )
    factor = 1 / _lstm_output_rms()
    return scale(output, factor, factor), h_n, c_n
