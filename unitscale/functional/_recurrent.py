"""Recurrent layers: torch's LSTM, GRU and RNN kernels, scales from their cells' moments at the fixed point."""

from __future__ import annotations

import functools as _functools
import math as _math
from typing import TYPE_CHECKING

import torch as _torch

from unitscale import errors as _errors
from unitscale.functional._normal import normal_mean
from unitscale.functional._scale import _constrain, scale
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


def _mean(fn: Callable[[float], float], variance: float) -> float:
    """``E[fn(z)]``, ``z ~ N(0, variance)``."""
    return normal_mean(lambda z: fn(z * variance**0.5), 8.0, 160)  # smooth: trapezoid is spectrally exact


def _sigmoid(z: float) -> float:
    return 1 / (1 + _math.exp(-z))


def _d_sigmoid_sq(z: float) -> float:
    return (_sigmoid(z) * (1 - _sigmoid(z))) ** 2


def _tanh_sq(z: float) -> float:
    return _math.tanh(z) ** 2


def _d_tanh_sq(z: float) -> float:
    return (1 - _math.tanh(z) ** 2) ** 2


@_functools.cache
def _stationary(cell: str) -> tuple[float, float, float]:
    """``(E[h**2], x_dz, h_dz)`` of a cell at its stationary point, for unit inputs and weights.

    Forward: each gate's pre-activation is ``W_ih x / in**0.5 + W_hh h / H**0.5``, of variance
    ``1 + E[h**2]``, iterated to the fixed point of ``E[h**2]`` (gates independent, the LSTM's
    ``c`` Gaussian). Backward, per unit second moment ``G`` of the gradient on the output
    ``h``: ``x_dz`` is the mean second moment of the gradients on the gates' input-side
    pre-activations, ``h_dz`` on their recurrent side (they differ in a GRU alone, whose
    candidate reads ``r * W_hn h``), each including the gradient the recurrence brings back
    from later steps.
    """
    sigmoid_sq = lambda z: _sigmoid(z) ** 2  # noqa: E731
    h_sq, previous = 0.5, 0.0
    while abs(h_sq - previous) > 1e-9:
        previous, var = h_sq, 1 + h_sq
        if cell == "lstm":  # c = f c + i g: E[c**2] = E[i**2] E[g**2] / (1 - E[f**2]); h = o tanh(c)
            s2 = _mean(sigmoid_sq, var)
            c_sq = s2 * _mean(_tanh_sq, var) / (1 - s2)
            h_sq = s2 * _mean(_tanh_sq, c_sq)
        elif cell == "gru":  # h = (1 - u) n + u h, n = tanh(W_in x + r W_hn h): E[(1 - u)**2] = E[u**2]
            s2 = _mean(sigmoid_sq, var)
            h_sq = s2 * _mean(_tanh_sq, 1 + s2 * h_sq) / (1 - s2)
        else:
            h_sq = _mean(_tanh_sq if cell == "rnn_tanh" else (lambda z: max(z, 0.0) ** 2), var)
    var = 1 + h_sq
    if cell == "lstm":
        s2, ds2, g2, dg2 = (_mean(f, var) for f in (sigmoid_sq, _d_sigmoid_sq, _tanh_sq, _d_tanh_sq))
        dc = s2 * _mean(_d_tanh_sq, c_sq) / (1 - s2)  # E[dc**2] per E[dh**2], the forget gate's sum
        per_dh = (_mean(_tanh_sq, c_sq) * ds2 + dc * (g2 * ds2 + s2 * dg2 + c_sq * ds2)) / 4  # o, i, g, f
        return h_sq, per_dh / (1 - 4 * per_dh), per_dh / (1 - 4 * per_dh)
    if cell == "gru":
        s2, ds2 = _mean(sigmoid_sq, var), _mean(_d_sigmoid_sq, var)
        n_var = 1 + s2 * h_sq
        dn = s2 * _mean(_d_tanh_sq, n_var)  # the candidate's pre-activation, per E[dh**2]
        dr, du = dn * h_sq * ds2, (h_sq + _mean(_tanh_sq, n_var)) * ds2
        x_side, h_side = (dr + du + dn) / 3, (dr + du + s2 * dn) / 3
        back = 1 - s2 - 3 * h_side  # dh_(t-1) = u dh_t + W_h^T (dz_r, dz_u, r dn)
        return h_sq, x_side / back, h_side / back
    d2 = _mean(_d_tanh_sq, var) if cell == "rnn_tanh" else 0.5
    return h_sq, d2 / (1 - d2), d2 / (1 - d2)


def _recurrent(
    cell: str,
    torch_fn: Callable[..., tuple[Tensor, ...]],
    input: Tensor,
    hx: Tensor | Sequence[Tensor],
    params: Sequence[Tensor],
    flags: tuple[bool, int, float, bool, bool, bool],
    constraint: ConstraintArg,
) -> tuple[Tensor, ...]:
    """The twin of ``torch_fn``: scaled weights in, scaled output and ``h`` out (see :func:`lstm`)."""
    packed = isinstance(hx, _torch.Tensor) if cell == "lstm" else isinstance(params, _torch.Tensor)
    if packed:
        raise _errors.InputError(f"{cell}: packed sequences are not supported by the unit-scaled twin; pad them")
    has_biases, num_layers, _, _, bidirectional, _ = flags
    per, directions, gates = 4 if has_biases else 2, 2 if bidirectional else 1, _GATES[cell]
    if len(params) != per * num_layers * directions:
        raise _errors.InputError(
            f"{cell}: {len(params)} parameter tensors for {num_layers} layer(s) of {directions} direction(s); "
            f"projections (proj_size > 0) are not supported by the unit-scaled twin"
        )
    h_sq, x_dz, h_dz = _stationary(cell)
    hidden, tokens = params[1].shape[-1], input.numel() // max(input.shape[-1], 1)
    # The output's gradient moment G grows by ``down`` per layer, from the top down to the input.
    down = gates * x_dz / h_sq
    x_grad = (directions * gates * hidden * x_dz / max(input.shape[-1], 1) * down ** (num_layers - 1)) ** 0.5
    out_scale, grad_scale = _constrain(constraint, h_sq**-0.5, 1 / x_grad)
    # Only the input's gradient takes the rest: the weights' are cut edges, and h_0's must meet
    # the output's unchanged inside the kernel.
    input = scale(input, 1.0, grad_scale / out_scale)
    scaled = []
    for i, p in enumerate(params):
        layer, kind = divmod(i, per * directions)[0], i % per
        moment = out_scale**2 * down ** (num_layers - 1 - layer) * tokens * (x_dz if kind % 2 == 0 else h_dz)
        feeds = 1.0 if layer == 0 and kind == 0 else h_sq  # what a weight multiplies: the input, or an h
        if kind < 2:  # a weight: forward over its fan-in (and an h's RMS), its gradient to unit std
            scaled.append(scale(p, (p.shape[-1] * feeds) ** -0.5 if kind == 0 else p.shape[-1] ** -0.5,
                                (moment * feeds) ** -0.5))  # fmt: skip
        else:
            scaled.append(scale(p, 1.0, moment**-0.5))
    if cell == "lstm":
        hx = (scale(hx[0], 1 / out_scale, 1 / out_scale), hx[1])
    else:
        hx = scale(hx, 1 / out_scale, 1 / out_scale)  # type: ignore[arg-type]
    output, h_n, *c_n = torch_fn(input, hx, scaled, *flags)
    return scale(output, out_scale, out_scale), scale(h_n, out_scale, out_scale), *c_n


@fill_docstring
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
    constraint: ConstraintArg = "gmean",
) -> tuple[Tensor, Tensor, Tensor]:
    """Unit-scaled :func:`torch.lstm` (what :class:`torch.nn.LSTM` calls).

    Torch's kernel runs on weights scaled by their fan-in (``W_ih / in**0.5``, ``W_hh / H**0.5``).
    The output and ``h_n`` are × ``1 / RMS(h)`` at the cell's fixed point, both ways (0.19 here,
    0.41 in :func:`gru`, 0.68 in :func:`rnn_tanh`, 1 in :func:`rnn_relu`); ``h_0`` is read in
    those units, so ``h_n`` can be passed back as ``h_0``; ``c`` is torch's. The input gradient
    is brought to 1 from the gradient moments along the recurrence. Bias gradients come out
    above 1 (1.6 to 2.5) and a deeper layer's output drifts to 1.2 or 1.3: the moments leave
    out correlation along time.

    Args:
        params: per layer and direction ``w_ih, w_hh`` (and ``b_ih, b_hh`` with ``has_biases``).
        {constraint}

    Returns:
        ``(output, h_n, c_n)``, the output and ``h_n`` scaled.

    Raises:
        InputError: a packed sequence (``hx`` is a tensor of batch sizes), or projections
            (``proj_size > 0``): not supported.
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import lstm
    >>> _ = torch.manual_seed(0)
    >>> x, h0 = torch.randn(32, 64, 16, requires_grad=True), torch.zeros(1, 64, 128)
    >>> params = [torch.randn(512, 16), torch.randn(512, 128)]
    >>> out, _, _ = lstm(x, (h0, h0), params, False, 1, 0.0, True, False, False, None)
    >>> out.backward(torch.randn_like(out))
    >>> round(out.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    flags = (has_biases, num_layers, dropout, train, bidirectional, batch_first)
    return _recurrent("lstm", _torch.lstm, input, hx, params, flags, constraint)  # type: ignore[return-value]


# The end of a twin's example: output and input gradient both unit-std.
_UNIT_STD = ">>> round(out.std().item(), 1), round(x.grad.std().item(), 1)\n    (1.0, 1.0)"


def _twin(
    cell: str, torch_fn: Callable[..., tuple[Tensor, ...]], calls: str, check: str = _UNIT_STD
) -> Callable[..., tuple[Tensor, Tensor]]:
    """The twin of ``torch_fn`` (``torch.gru``, ``torch.rnn_tanh``, ...), whose arguments are :func:`lstm`'s."""

    def twin(
        input: Tensor,
        hx: Tensor,
        params: tuple[Tensor, ...] | list[Tensor],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
        constraint: ConstraintArg = "gmean",
    ) -> tuple[Tensor, Tensor]:
        flags = (has_biases, num_layers, dropout, train, bidirectional, batch_first)
        return _recurrent(cell, torch_fn, input, hx, params, flags, constraint)  # type: ignore[return-value]

    rows, gates = 128 * _GATES[cell], ", three gates" if _GATES[cell] == 3 else " and one gate"
    twin.__name__ = twin.__qualname__ = cell
    twin.__doc__ = f"""Unit-scaled :func:`torch.{cell}` ({calls}), scaled as :func:`lstm` is.

    Arguments as :func:`lstm`'s, with ``hx`` the tensor ``h_0``{gates} to a weight; returns
    ``(output, h_n)``, both scaled. Raises as :func:`lstm` does.

    >>> import torch
    >>> from unitscale.functional import {cell}
    >>> _ = torch.manual_seed(0)
    >>> x, h0 = torch.randn(32, 64, 16, requires_grad=True), torch.zeros(1, 64, 128)
    >>> params = [torch.randn({rows}, 16), torch.randn({rows}, 128)]
    >>> out, _ = {cell}(x, h0, params, False, 1, 0.0, True, False, False, None)
    >>> out.backward(torch.randn_like(out))
    {check}
    """
    return twin


gru = _twin("gru", _torch.gru, "what :class:`torch.nn.GRU` calls")
rnn_tanh = _twin("rnn_tanh", _torch.rnn_tanh, "what :class:`torch.nn.RNN` calls")
rnn_relu = _twin(
    "rnn_relu",
    _torch.rnn_relu,
    '``nn.RNN(nonlinearity="relu")``',
    ">>> rms = out.pow(2).mean().sqrt()  # not std: a ReLU's output is not centred\n"
    "    >>> round(rms.item(), 1), round(x.grad.std().item(), 1)\n    (0.9, 1.0)",
)
