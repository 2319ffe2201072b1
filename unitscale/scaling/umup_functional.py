"""u-μP ops: the unit-scaled ops of :mod:`unitscale.functional` with the paper's multipliers (α).

u-μP (Blake et al., arXiv 2407.17465, Section 4) keeps unit scaling's rule that every op's
output starts unit-std, and adds a few named multipliers (``mult=``, an α of the paper) at
the places where a nonlinearity's input scale is a real hyperparameter: the SwiGLU gate
(α_ffn-act), the attention softmax (α_attn-softmax), the loss softmax (α_loss-softmax, which
may sit on the readout or the loss), and the residual weights (:func:`residual_taus`).
Each op here divides out the scale change its multiplier would cause at initialisation, so
α moves the shape of the nonlinearity, not the scale of what comes out.

>>> import torch
>>> from unitscale.scaling.umup import silu_glu
>>> _ = torch.manual_seed(0)
>>> round(silu_glu(torch.randn(100_000), torch.randn(100_000)).std().item(), 1)
1.0
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

import unitscale.functional as U
from unitscale.scaling.checks import check_mult

__all__ = ["silu_glu", "linear_readout", "attention", "cross_entropy"]


# A plain dict, not functools.lru_cache: TorchDynamo (simulate_fp8) reads a dict of floats
# without a warning, and SwiGLU fills it when built, so a traced forward only looks up.
_RMS: dict[tuple[str, float], float] = {}


def _gauss_rms(kind: str, mult: float) -> float:
    """Root-mean-square of ``x·sigmoid(mult·x)`` (``kind="value"``) or of its derivative, x ~ N(0, 1)."""
    if (kind, mult) not in _RMS:
        x = torch.linspace(-12.0, 12.0, 48_001, dtype=torch.float64)
        density = torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
        s = torch.sigmoid(mult * x)
        f = x * s if kind == "value" else s + mult * x * s * (1 - s)
        _RMS[kind, mult] = float(torch.trapezoid(f * f * density, x).sqrt())
    return _RMS[kind, mult]


def silu_glu(input: Tensor, gate: Tensor, mult: float = 1.0) -> Tensor:
    """Unit-scaled SwiGLU: ``input * gate·sigmoid(mult·gate)``, scaled to unit std.

    For independent ``N(0, 1)`` ``input`` and ``gate`` the product's std is the RMS
    of ``silu_mult(gate)`` (0.66 at ``mult=1``, computed by quadrature for any ``mult``);
    the output is divided by it in both passes, so the gradient is the true gradient
    of the scaled function (the ``to_output_scale`` constraint). ``mult`` is u-μP's
    α_ffn-act (Section 4): a larger α makes the gate more like ReLU, a smaller one more
    linear. The reference library scales the two gradients apart with an empirical model of
    the std; this uses exact Gaussian moments.

    Args:
        input: the linear branch.
        gate: the gate branch, same shape.
        mult: α_ffn-act, a finite number > 0.

    Returns:
        The gated product, unit-std for unit-normal inputs.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import silu_glu
    >>> _ = torch.manual_seed(0)
    >>> x, g = torch.randn(2, 100_000)
    >>> round(silu_glu(x, g, mult=4.0).std().item(), 1)
    1.0
    """
    mult = check_mult("silu_glu", "mult", mult)
    out_scale = 1 / _gauss_rms("value", mult)
    return input * gate * torch.sigmoid(gate * mult) * out_scale


def linear_readout(input: Tensor, weight: Tensor, bias: Tensor | None = None, mult: float = 1.0) -> Tensor:
    """u-μP's readout: output × ``mult / fan_in`` (μP's readout multiplier), input gradient × ``fan_out**-0.5``.

    μP scales the last layer by ``1 / fan_in`` rather than ``fan_in**-0.5`` so that, as
    the width grows, the logits do not grow when the features the readout sees become
    correlated with its weights during training (u-μP, Section 4, the output weight's
    multiplier). At initialisation the logits are therefore small (std
    ``mult * fan_in**-0.5``). The readout comes after the last residual add, so its
    backward scale needs no constraint: the input gradient is unit-scaled by
    ``fan_out**-0.5`` as in :func:`~unitscale.functional.linear`. ``mult`` is the paper's
    α_loss-softmax, placed here (the reference library puts it on the loss; the two are
    the same number in the forward pass).

    Args:
        input: ``(..., fan_in)``.
        weight: ``(fan_out, fan_in)``.
        bias: optional ``(fan_out,)``, added after the multiplier (its gradient × ``batch**-0.5``).
        mult: α_loss-softmax, a finite number > 0.

    Returns:
        The logits.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import linear_readout
    >>> _ = torch.manual_seed(0)
    >>> y = linear_readout(torch.randn(4096, 256), torch.randn(32, 256), mult=16.0)
    >>> round(y.std().item(), 1)
    1.0
    """
    mult = check_mult("linear_readout", "mult", mult)
    fan_in = weight.shape[-1]
    out = U.scale(U.linear(input, weight, constraint=None), mult * fan_in**-0.5, 1.0)
    if bias is None:
        return out
    # Added after the multiplier, as LinearReadout does: a bias moves the logits by itself at any width.
    return out + U.scale(bias, 1.0, max(out.numel() // max(out.shape[-1], 1), 1) ** -0.5)


def attention(query: Tensor, key: Tensor, value: Tensor, mult: float = 1.0, is_causal: bool = True) -> Tensor:
    """u-μP attention: scores × ``mult / d_head`` (μP), output rescaled to unit std.

    μP divides the scores by ``d_head`` rather than ``sqrt(d_head)``, because trained
    queries and keys become correlated and their dot product then grows like ``d_head``
    (u-μP, Section 4, the attention-logit multiplier; ``mult`` is α_attn-softmax). With
    unit-std queries and keys the scores start with std ``s = mult / sqrt(d_head)``,
    flatter than unit scaling's unit-std scores, so the averaged values are smaller: a
    softmax over many log-normal weights has ``E[sum w²] ≈ exp(s²) / keys`` against
    ``e / keys`` at ``s = 1``. The output of
    :func:`~unitscale.functional.scaled_dot_product_attention` (scaled for ``s = 1``)
    is multiplied by ``exp((1 - s²) / 2)`` in both passes to undo that (by
    ``exp(0.27 (1 - s²))`` with a causal mask, whose short rows flatten less: a fit). The reference
    library interpolates an empirical model between the flat and the one-hot limits
    instead.

    Args:
        query: ``(..., heads, L, d_head)``.
        key: ``(..., heads, S, d_head)``.
        value: ``(..., heads, S, d_head)``.
        mult: α_attn-softmax, a finite number > 0.
        is_causal: apply a causal mask.

    Returns:
        ``(..., heads, L, d_head)``, about unit-std for unit-normal inputs.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import attention
    >>> _ = torch.manual_seed(0)
    >>> q, k, v = torch.randn(3, 8, 4, 64, 16).unbind(0)
    >>> round(attention(q, k, v).std().item(), 1)
    1.0
    """
    mult = check_mult("attention", "mult", mult)
    d_head = query.shape[-1]
    spread = mult * d_head**-0.5
    # Causal rows are short near the start, and a short row's weights are far from flat at any
    # spread, so the flattening costs less there: 0.27 is fitted on seq 64, d_head 8..64.
    correction = math.exp((0.27 if is_causal else 0.5) * (1 - min(spread, 1.0) ** 2))
    out = U.scaled_dot_product_attention(query, key, value, is_causal=is_causal, scale=mult / d_head, constraint=None)
    return U.scale(out, correction, correction)


def cross_entropy(logits: Tensor, target: Tensor, mult: float = 1.0) -> Tensor:
    """Unit-scaled cross-entropy over the last dim, with α_loss-softmax (``mult``) on the logits.

    The value is torch's cross-entropy of ``mult * logits`` (mean over every position);
    the logits' gradient is unit-scaled as in :func:`~unitscale.functional.cross_entropy`.
    Use ``mult`` here or on :func:`linear_readout`, not both (u-μP, Section 4: one α
    multiplies the logits entering the loss softmax).

    Args:
        logits: ``(..., classes)``.
        target: int64 ``(...)``.
        mult: α_loss-softmax, a finite number > 0.

    Returns:
        The mean loss.

    Raises:
        MultiplierError: ``mult`` is not a finite number > 0.

    >>> import torch
    >>> from unitscale.scaling.umup import cross_entropy
    >>> logits, target = torch.zeros(2, 5, 10), torch.zeros(2, 5, dtype=torch.long)
    >>> round(cross_entropy(logits, target).item(), 4) == round(__import__("math").log(10), 4)
    True
    """
    mult = check_mult("cross_entropy", "mult", mult)
    flat = logits.reshape(-1, logits.shape[-1])
    if mult != 1.0:
        flat = U.scale(flat, mult, 1.0)
    return U.cross_entropy(flat, target.reshape(-1))
