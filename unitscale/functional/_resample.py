"""Resampling: interpolate, scaled by the exact norms of its (separable) interpolation weights."""

from __future__ import annotations

import functools as _functools
import math as _math
from typing import TYPE_CHECKING

import torch as _torch
import torch.nn.functional as _F

from unitscale.functional._scale import _constrained_scale
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg

_MODE_DIMS = {"linear": 1, "bilinear": 2, "bicubic": 2, "trilinear": 3}


@_functools.lru_cache(maxsize=256)
def _axis_weight_norm(
    mode: str, spatial: int, axis: int, size_in: int, size_out: int, align_corners: bool | None, factor: float | None
) -> float:
    """``||W||_F**2`` of the interpolation matrix along one axis (``(size_out, size_in)``), from torch's own op.

    Torch interpolates each axis on its own, so the matrix of a 2-D mode is the Kronecker
    product of its axes', and its squared norm the product of theirs. One axis's matrix
    is read by interpolating the identity: ``size_in`` unit impulses along ``axis``, the
    other axes of size 1 (which any mode copies).
    """
    shape = [1] * spatial
    shape[axis] = size_in
    impulses = _torch.eye(size_in, dtype=_torch.float64).reshape(size_in, 1, *shape)
    sizes = [1] * spatial
    sizes[axis] = size_out
    kwargs: dict[str, object] = {"mode": mode}
    if mode not in ("nearest", "nearest-exact", "area"):
        kwargs["align_corners"] = align_corners
    if factor is None:
        kwargs["size"] = tuple(sizes)
    else:
        factors = [1.0] * spatial
        factors[axis] = factor
        kwargs["scale_factor"] = tuple(factors)
    out = _F.interpolate(impulses, **kwargs)  # type: ignore[arg-type]
    return float(out.square().sum())


@fill_docstring
def interpolate(
    input: Tensor,
    size: int | tuple[int, ...] | list[int] | None = None,
    scale_factor: float | tuple[float, ...] | list[float] | None = None,
    mode: str = "nearest",
    align_corners: bool | None = None,
    recompute_scale_factor: bool | None = None,
    antialias: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.interpolate`.

    Interpolation is ``y = W x`` with fixed weights ``W`` (``out x in``): output ×
    ``(out / ||W||**2)**0.5`` and input gradient × ``(in / ||W||**2)**0.5``, with ``||W||**2``
    read exactly from torch's own interpolation of unit impulses. ``antialias=True`` is scaled
    as without it.

    Args:
        input: ``(N, C, *spatial)`` with 1 to 3 spatial dims.
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import interpolate
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
    >>> y = interpolate(x, scale_factor=2, mode="bilinear", constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    out = _F.interpolate(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
    spatial = input.dim() - 2
    factors: list[float | None] = [None] * spatial
    if scale_factor is not None and not recompute_scale_factor:
        given = scale_factor if isinstance(scale_factor, (tuple, list)) else [scale_factor] * spatial
        factors = [float(f) for f in given]
    norm = _math.prod(
        _axis_weight_norm(mode, spatial, axis, input.shape[2 + axis], out.shape[2 + axis], align_corners, factors[axis])
        for axis in range(spatial)
    )
    positions_in, positions_out = _math.prod(input.shape[2:]), _math.prod(out.shape[2:])
    output_scale, grad_scale = ((positions_out / norm) ** 0.5, (positions_in / norm) ** 0.5) if norm else (1.0, 1.0)
    return _constrained_scale(out, constraint, output_scale, grad_scale)
