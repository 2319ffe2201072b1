"""Scaled dot-product attention with torch's fused kernels and fixed scales."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._checks import _TORCH_ERRORS, _misfit, _tracing
from unitscale.functional._scale import _constrain
from unitscale.functional._scale import scale as _scale
from unitscale.scaling import softmax_stats as _stats
from unitscale.scaling.checks import check_p

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


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
    (averaged over rows), and the gradients of ``query``, ``key`` and ``value`` by
    the inverse of their own expected std (see ``unitscale.scaling.softmax_stats``);
    the constraint reconciles all four. Dropout and grouped-query attention are
    accounted for; a custom ``attn_mask`` or ``scale`` is not (the scales assume
    every key visible and unit-std scores).

    Args:
        query: ``(..., L, E)``.
        key: ``(..., S, E)``.
        value: ``(..., S, Ev)``.
        attn_mask: as in torch.
        dropout_p: as in torch, in ``[0, 1)``.
        is_causal: as in torch.
        scale: as in torch (``None``: ``E**-0.5``, which makes the scores unit-std).
        enable_gqa: as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The attention output ``(..., L, Ev)``, scaled.

    Raises:
        InputError: ``dropout_p`` is not in ``[0, 1)``.
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import scaled_dot_product_attention
    >>> _ = torch.manual_seed(0)
    >>> q, k, v = torch.randn(3, 4, 8, 64, 32).unbind(0)
    >>> round(scaled_dot_product_attention(q, k, v, is_causal=True, constraint=None).std().item(), 1)
    1.0
    """
    dropout_p = check_p("scaled_dot_product_attention", dropout_p, "dropout_p")
    if dropout_p == 1:
        raise _errors.InputError("scaled_dot_product_attention: dropout_p=1 drops every weight; pass a value below 1")
    try:
        queries, keys = query.shape[-2], key.shape[-2]
        weight_sq, grad_sq = _stats.attention_row_stats(queries, keys, is_causal)
        keep = 1 - dropout_p
        # Key and value gradients sum over queries (and over the query heads sharing a key head).
        share = queries / keys * (query.shape[-3] // key.shape[-3] if enable_gqa and query.dim() >= 3 else 1)
        score_scale = query.shape[-1] ** -0.5 if scale is None else scale
        query_grad_var = score_scale**2 * value.shape[-1] * grad_sq / keep
        value_grad_var = share * weight_sq / keep
        # A row with one key (or scores scaled by 0) has a constant softmax: query and key get
        # no gradient at all, and take the value's scale rather than an infinite one.
        key_grad_var = share * query_grad_var if query_grad_var > 0 else value_grad_var
        query_grad_var = query_grad_var if query_grad_var > 0 else value_grad_var
        output_scale, query_scale, key_scale, value_scale = _constrain(
            constraint,
            (weight_sq / keep) ** -0.5,
            query_grad_var**-0.5,
            key_grad_var**-0.5,
            value_grad_var**-0.5,
        )
        # The output's backward scale reaches query, key and value; adjust the first two.
        query = _scale(query, 1.0, query_scale / value_scale)
        key = _scale(key, 1.0, key_scale / value_scale)
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
        return _scale(out, output_scale, value_scale)
    except _errors.UnitscaleError:
        raise
    except _TORCH_ERRORS as e:
        if _tracing(e, query, key, value, attn_mask):
            raise
        raise _misfit(
            "scaled_dot_product_attention",
            e,
            "query (..., L, E), key (..., S, E) and value (..., S, Ev) share their leading dims "
            "(key and value heads may divide query heads with enable_gqa=True), "
            "attn_mask broadcasts to (..., L, S)",
            query=query,
            key=key,
            value=value,
            attn_mask=attn_mask,
        ) from e
