"""Normalisations: layer and RMS norm (only their affine gradients need a scale); batch norm is in ``_batchnorm``."""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch.nn.functional as _F

from unitscale.functional._checks import _misfits
from unitscale.functional._scale import _inv_sqrt, scale

if TYPE_CHECKING:
    import torch
    from torch import Tensor


def layer_norm(
    input: Tensor,
    normalized_shape: list[int] | tuple[int, ...] | torch.Size,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.layer_norm`.

    Its output and input gradient are already unit-std; weight and bias gradients × ``batch**-0.5``.

    >>> import torch
    >>> from unitscale.functional import layer_norm
    >>> _ = torch.manual_seed(0)
    >>> w = torch.ones(32, requires_grad=True)
    >>> y = layer_norm(torch.randn(4096, 32), (32,), w)
    >>> y.backward(torch.randn_like(y))
    >>> round(w.grad.std().item(), 1)
    1.0
    """
    with _misfits(
        "layer_norm",
        "input's trailing dims must equal normalized_shape (a tuple of ints); weight and bias have that shape",
        input=input,
        normalized_shape=normalized_shape,
        weight=weight,
        bias=bias,
    ):
        batch_scale = _inv_sqrt(input.numel() / max(_math.prod(normalized_shape), 1))
        weight, bias = (None if t is None else scale(t, 1.0, batch_scale) for t in (weight, bias))
        return _F.layer_norm(input, normalized_shape, weight, bias, eps)


def rms_norm(
    input: Tensor,
    normalized_shape: list[int] | tuple[int, ...] | torch.Size,
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.rms_norm` (and the ``LlamaRMSNorm``/``T5LayerNorm`` pattern).

    Only the weight gradient is scaled, × ``batch**-0.5``, as in :func:`layer_norm`.

    Args:
        eps: added to the mean square (``None``: the dtype's machine epsilon, as in torch).

    >>> import torch
    >>> from unitscale.functional import rms_norm
    >>> _ = torch.manual_seed(0)
    >>> w = torch.ones(32, requires_grad=True)
    >>> y = rms_norm(3 * torch.randn(4096, 32), (32,), w)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(w.grad.std().item(), 1)
    (1.0, 1.0)
    """
    if weight is not None:
        weight = scale(weight, 1.0, _inv_sqrt(input.numel() / max(_math.prod(normalized_shape), 1)))
    return _F.rms_norm(input, list(normalized_shape), weight, eps)
