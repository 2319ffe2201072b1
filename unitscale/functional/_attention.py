"""Scaled dot-product attention with torch's fused kernels and fixed scales."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._checks import _misfits
from unitscale.functional._linear import linear as _linear
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

    Fused kernels kept. Output × ``E[sum w**2]**-0.5`` over the softmax weights of a row (about
    ``sqrt(keys / e)``, less for a causal mask's short rows). ``query``, ``key`` and ``value``
    share one gradient scale that makes the three together unit-std (``query`` and ``key`` get
    far less than ``value``): they are projections of one input in self-attention, where their
    gradients meet, and separate scales would make its gradient no gradient at all. Dropout,
    grouped-query attention and a custom ``scale`` (scores of std ``scale * E**0.5``) are
    accounted for; a custom ``attn_mask`` is not (the scales assume every key visible).

    Args:
        {constraint}

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


def _project(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    weights: tuple[Tensor, ...],
    biases: tuple[Tensor | None, ...],
    constraint: ConstraintArg,
) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v projections as torch's ``_in_projection_packed`` groups them: one matmul per distinct input.

    So an input read by several projections gets one backward scale (its gradient stays true).
    """
    if len(weights) == 1:
        w, b = weights[0], biases[0]
        e = w.shape[0] // 3
        if query is key and key is value:
            q, k, v = _linear(query, w, b, constraint).split(e, dim=-1)
            return q, k, v
        if key is value:
            k, v = _linear(key, w[e:], None if b is None else b[e:], constraint).split(e, dim=-1)
            return _linear(query, w[:e], None if b is None else b[:e], constraint), k, v
        weights, biases = w.split(e), (None,) * 3 if b is None else b.split(e)
    q, k, v = (_linear(x, w, b, constraint) for x, w, b in zip((query, key, value), weights, biases, strict=True))
    return q, k, v


@fill_docstring
def multi_head_attention_forward(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    embed_dim_to_check: int,
    num_heads: int,
    in_proj_weight: Tensor | None,
    in_proj_bias: Tensor | None,
    bias_k: Tensor | None,
    bias_v: Tensor | None,
    add_zero_attn: bool,
    dropout_p: float,
    out_proj_weight: Tensor,
    out_proj_bias: Tensor | None,
    training: bool = True,
    key_padding_mask: Tensor | None = None,
    need_weights: bool = True,
    attn_mask: Tensor | None = None,
    use_separate_proj_weight: bool = False,
    q_proj_weight: Tensor | None = None,
    k_proj_weight: Tensor | None = None,
    v_proj_weight: Tensor | None = None,
    static_k: Tensor | None = None,
    static_v: Tensor | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
    constraint: ConstraintArg = "gmean",
) -> tuple[Tensor, Tensor | None]:
    """Unit-scaled :func:`torch.nn.functional.multi_head_attention_forward` (:class:`torch.nn.MultiheadAttention`'s).

    Built from :func:`linear` projections (one per distinct input, as torch groups them) and
    :func:`scaled_dot_product_attention`. With ``need_weights=True`` the attention weights are
    returned as torch computes them, unscaled and without dropout. Arguments as in torch;
    ``bias_k``, ``bias_v``, ``static_k`` and ``static_v`` must be ``None`` and ``add_zero_attn``
    ``False`` (not supported).

    Args:
        {constraint}

    Returns:
        ``(attn_output, attn_weights)``, the output unit-scaled.

    Raises:
        InputError: ``bias_k``, ``bias_v``, ``add_zero_attn``, ``static_k`` or ``static_v`` given;
            ``embed_dim_to_check`` or ``num_heads`` does not fit the query.
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import multi_head_attention_forward
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(32, 16, 64)
    >>> w_in, w_out = torch.randn(192, 64), torch.randn(64, 64)
    >>> y, _ = multi_head_attention_forward(x, x, x, 64, 4, w_in, None, None, None,
    ...     False, 0.0, w_out, None, need_weights=False, constraint=None)
    >>> round(y.std().item())
    1
    """
    name = "multi_head_attention_forward"
    for arg, given in (("bias_k", bias_k), ("bias_v", bias_v), ("static_k", static_k), ("static_v", static_v)):
        if given is not None:
            raise _errors.InputError(f"{name}: {arg} is not supported by the unit-scaled twin; pass None")
    if add_zero_attn:
        raise _errors.InputError(f"{name}: add_zero_attn=True is not supported by the unit-scaled twin; pass False")
    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    length, batch, embed = query.shape
    if embed != embed_dim_to_check or num_heads < 1 or embed % num_heads:
        raise _errors.InputError(
            f"{name}: query of shape {tuple(query.shape)} does not fit embed_dim_to_check={embed_dim_to_check} "
            f"and num_heads={num_heads}; the query's last size must be embed_dim_to_check, divisible by num_heads"
        )
    if use_separate_proj_weight:
        weights: tuple[Tensor, ...] = (q_proj_weight, k_proj_weight, v_proj_weight)  # type: ignore[assignment]
        biases: tuple[Tensor | None, ...] = (None,) * 3 if in_proj_bias is None else in_proj_bias.split(embed)
    else:
        weights, biases = (in_proj_weight,), (in_proj_bias,)  # type: ignore[assignment]
    q, k, v = _project(query, key, value, weights, biases, constraint)
    source = k.shape[0]
    head = embed // num_heads

    def heads(t: Tensor, rows: int) -> Tensor:  # (rows, N, E) -> (N, heads, rows, head)
        return t.reshape(rows, batch, num_heads, head).permute(1, 2, 0, 3)

    q, k, v = heads(q, length), heads(k, source), heads(v, source)
    mask = None
    if attn_mask is not None or key_padding_mask is not None:
        is_causal = False
        mask = torch.zeros(batch, num_heads, length, source, dtype=q.dtype, device=q.device)
        padding = None if key_padding_mask is None else key_padding_mask.reshape(batch, 1, 1, source)
        for given in (attn_mask, padding):
            if given is not None:
                if given.dtype == torch.bool:
                    given = torch.zeros_like(given, dtype=q.dtype).masked_fill(given, float("-inf"))
                mask = mask + (given.reshape(mask.shape) if given.dim() == 3 else given).to(q.dtype)
    p = dropout_p if training else 0.0
    out = scaled_dot_product_attention(q, k, v, mask, p, is_causal, constraint=constraint)
    out = out.permute(2, 0, 1, 3).reshape(length, batch, embed)
    out = _linear(out, out_proj_weight, out_proj_bias, constraint)
    weights_out = None
    if need_weights:
        scores = (q * head**-0.5) @ k.transpose(-2, -1)
        if mask is not None:
            scores = scores + mask
        elif is_causal:
            causal = torch.ones(length, source, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        weights_out = scores.softmax(-1)
        if average_attn_weights:
            weights_out = weights_out.mean(1)
        if not batched:
            weights_out = weights_out.squeeze(0)
    if not batched:
        out = out.squeeze(1)
    return out, weights_out
