"""Scaled dot-product attention with torch's fused kernels and fixed scales."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._checks import _misfits
from unitscale.functional._scale import _constrain
from unitscale.functional._scale import scale as _scale
from unitscale.scaling import softmax_stats as _stats
from unitscale.scaling.checks import check_p
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


@fill_docstring
def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attn_mask: Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.scaled_dot_product_attention`.

    Torch's attention (fused kernels kept) with fixed scales. Each output row is
    an average of values with softmax weights ``w``, so its std is
    ``sqrt(sum w**2)``: about ``sqrt(e / keys)`` for ``N(0, 1)`` scores, more for
    the short rows of a causal mask. The output is scaled by the inverse of that
    (averaged over rows). The gradients of ``query``, ``key`` and ``value`` are
    scaled by one number, the one that makes the three together unit-std (the mean
    of their expected variances 1; see ``unitscale.scaling.softmax_stats``), as a
    fused QKV projection's gradient is: in self-attention the three are
    projections of one input, where their gradients meet again, and separate scales
    would make that input's gradient a mixture that is not the gradient of anything
    (so the three are not each unit-std: at initialisation ``query`` and ``key`` get
    far smaller gradients than ``value``). The constraint reconciles that number with
    the output scale (``None``: each direction on its own). Dropout, grouped-query attention and a
    custom ``scale`` are accounted for (for unit-std ``query`` and ``key`` the scores
    have std ``scale * E**0.5``, and the softmax statistics are measured for that
    spread: u-μP's ``scale = mult / E`` gives flatter weights at initialisation); a
    custom ``attn_mask`` is not (the scales assume every key visible).

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``.
        value: ``(..., S, Ev)``.
        attn_mask: as in torch.
        dropout_p: as in torch, in ``[0, 1)``.
        is_causal: as in torch.
        scale: as in torch (``None``: ``E**-0.5``, which makes the scores unit-std).
        enable_gqa: as in torch.
        {constraint}

    Returns:
        The attention output ``(..., L, Ev)``, scaled.

    Raises:
        InputError: ``dropout_p`` is not in ``[0, 1)``.
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import scaled_dot_product_attention
    >>> _ = torch.manual_seed(0)
    >>> q, k, v = torch.randn(3, 4, 8, 64, 32).unbind(0)
    >>> y = scaled_dot_product_attention(q, k, v, is_causal=True, constraint=None)
    >>> round(y.std().item(), 1)
    1.0
    """
    dropout_p = check_p("scaled_dot_product_attention", dropout_p, "dropout_p")
    if dropout_p == 1:
        raise _errors.InputError("scaled_dot_product_attention: dropout_p=1 drops every weight; pass a value below 1")
    with _misfits(
        "scaled_dot_product_attention",
        "query (..., L, E), key (..., S, E) and value (..., S, Ev) share their leading dims "
        "(key and value heads may divide query heads with enable_gqa=True), "
        "attn_mask broadcasts to (..., L, S)",
        query=query,
        key=key,
        value=value,
        attn_mask=attn_mask,
    ):
        queries, keys = query.shape[-2], key.shape[-2]
        score_scale = query.shape[-1] ** -0.5 if scale is None else scale
        # Three significant digits: a spread the statistics are measured for once.
        spread = float(f"{score_scale * query.shape[-1] ** 0.5:.3g}")
        weight_sq, grad_sq = _stats.attention_row_stats(queries, keys, is_causal, spread)
        keep = 1 - dropout_p
        # Key and value gradients sum over queries (and over the query heads sharing a key head).
        share = queries / keys * (query.shape[-3] // key.shape[-3] if enable_gqa and query.dim() >= 3 else 1)
        query_grad_var = score_scale**2 * value.shape[-1] * grad_sq / keep
        # query, key and value usually come from one input, where their gradients meet again: one
        # backward scale for the three, so that input's gradient stays true; the one that makes the
        # three gradients together unit-std (the mean of their variances 1).
        grad_scale = (query_grad_var * (1 + share) / 3 + share * weight_sq / keep / 3) ** -0.5
        output_scale, grad_scale = _constrain(constraint, (weight_sq / keep) ** -0.5, grad_scale)
        out = _F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        return _scale(out, output_scale, grad_scale)
