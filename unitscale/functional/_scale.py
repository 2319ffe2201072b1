"""The building block of every op: one factor forward, another backward, and the constraint that reconciles them."""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING

import torch as _torch

from unitscale import errors as _errors
from unitscale.scaling import constraints as _constraints

if TYPE_CHECKING:
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


class _ScaleFwdBwd(_torch.autograd.Function):
    """Multiply by one number in the forward pass and by another in the backward pass."""

    @staticmethod
    def forward(ctx: _torch.autograd.function.FunctionCtx, input: Tensor, fwd: float, bwd: float) -> Tensor:
        ctx.bwd = bwd  # type: ignore[attr-defined]
        # A copy, not a view: callers may change the result in place (`x += 1` on a residual branch),
        # which autograd forbids on a view made inside a custom Function.
        return input.clone() if fwd == 1.0 else input * fwd

    @staticmethod
    def backward(ctx: _torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad * ctx.bwd, None, None  # type: ignore[attr-defined]


def scale(input: Tensor, fwd_scale: float, bwd_scale: float) -> Tensor:
    """Multiply ``input`` by ``fwd_scale`` in the forward pass and its gradient by ``bwd_scale`` in the backward pass.

    With ``fwd_scale != bwd_scale`` the gradient is deliberately not the true gradient.

    >>> import torch
    >>> from unitscale.functional import scale
    >>> x = torch.ones(2, requires_grad=True)
    >>> y = scale(x, 3.0, 0.5)
    >>> y.sum().backward()
    >>> y.tolist(), x.grad.tolist()
    ([3.0, 3.0], [0.5, 0.5])
    """
    for name, value in (("fwd_scale", fwd_scale), ("bwd_scale", bwd_scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not _math.isfinite(value):
            raise _errors.InputError(f"scale: {name}={value!r:.60} is not a finite number; pass a float")
    if fwd_scale == bwd_scale:
        return input if fwd_scale == 1.0 else input * fwd_scale
    if _torch.compiler.is_compiling():
        # TorchDynamo instantiates autograd.Function while tracing one, which raises a
        # DeprecationWarning; these plain ops give the same values and gradients, fused.
        return input * bwd_scale + (input * (fwd_scale - bwd_scale)).detach()
    return _ScaleFwdBwd.apply(input, float(fwd_scale), float(bwd_scale))


def _constrain(constraint: ConstraintArg, output_scale: float, *grad_input_scales: float) -> tuple[float, ...]:
    """The scales to use: as given without a constraint, else the constraint's single choice for all."""
    fn = _constraints.resolve_constraint(constraint)
    if fn is None:
        return (output_scale, *grad_input_scales)
    try:
        chosen = fn(output_scale, *grad_input_scales)
    except _errors.UnitscaleError:
        raise
    except Exception as e:
        raise _errors.PredicateError(
            f"constraint {getattr(fn, '__name__', fn)!r} raised {type(e).__name__}: {e}; a constraint takes "
            "(output_scale, *grad_input_scales) and returns one positive, finite number"
        ) from e
    if isinstance(chosen, bool) or not isinstance(chosen, (int, float)) or not 0 < chosen < _math.inf:
        scales = ", ".join(f"{s:.4g}" for s in (output_scale, *grad_input_scales))
        raise _errors.PredicateError(
            f"constraint {getattr(fn, '__name__', fn)!r} returned {chosen!r} for the scales ({scales}); "
            f"a constraint must return one positive, finite number"
        )
    return (float(chosen),) * (1 + len(grad_input_scales))


def _constrained_scale(input: Tensor, constraint: ConstraintArg, output_scale: float, grad_scale: float) -> Tensor:
    """:func:`scale` by ``output_scale`` forward and ``grad_scale`` backward, as ``constraint`` reconciles them."""
    return scale(input, *_constrain(constraint, output_scale, grad_scale))


def _inv_sqrt(count: float) -> float:
    # An empty tensor sums no terms; any finite scale will do.
    return count**-0.5 if count > 0 else 1.0


class _FrozenGradScale(_torch.autograd.Function):
    """Identity forward; backward, the gradient times ``factor``, which the first backward sets where it is 0."""

    @staticmethod
    def forward(ctx: _torch.autograd.function.FunctionCtx, input: Tensor, factor: Tensor) -> Tensor:
        ctx.factor = factor  # type: ignore[attr-defined]
        return input.clone()

    @staticmethod
    def backward(ctx: _torch.autograd.function.FunctionCtx, grad: Tensor) -> tuple[Tensor, None]:
        factor: Tensor = ctx.factor  # type: ignore[attr-defined]
        if not bool(factor > 0):
            rms = grad.detach().double().square().mean().sqrt()
            with _torch.no_grad():
                factor.fill_(1 / rms if 0 < rms < _math.inf else 1.0)
        return grad * factor.to(grad.dtype), None


def frozen_grad_scale(input: Tensor, factor: Tensor) -> Tensor:
    """Identity in the forward pass; the gradient times ``factor`` in the backward pass, measured once.

    A positive ``factor`` is a constant, so the backward pass stays linear (micro-batches add
    up to the batch). A 0 ("not measured") is set by the first backward pass to ``1 / RMS`` of
    the gradient it gets, and reused after; under ``torch.compile`` an unmeasured factor scales
    by 1 (call the model once eagerly first). :func:`~unitscale.unit_scale` puts one before
    each residual block holding batch norm, whose gradient growth no fixed scale undoes.

    Args:
        factor: a one-element floating-point tensor (a buffer, saved with the model).

    Raises:
        InputError: ``factor`` is not a one-element floating-point tensor.

    >>> import torch
    >>> from unitscale.functional import frozen_grad_scale
    >>> factor = torch.zeros(())
    >>> x = torch.ones(4, requires_grad=True)
    >>> frozen_grad_scale(x, factor).backward(torch.full((4,), 3.0))
    >>> round(factor.item(), 4), x.grad.tolist()
    (0.3333, [1.0, 1.0, 1.0, 1.0])
    >>> # frozen: the next gradient is not brought to 1 again
    >>> frozen_grad_scale(x, factor).backward(torch.full((4,), 30.0))
    >>> x.grad.tolist()
    [11.0, 11.0, 11.0, 11.0]
    """
    if not (isinstance(factor, _torch.Tensor) and factor.numel() == 1 and factor.is_floating_point()):
        raise _errors.InputError(
            f"frozen_grad_scale: factor={factor!r:.60} is not a one-element floating-point tensor; "
            "pass a buffer such as torch.zeros(()) (0 measures it on the first backward)"
        )
    if _torch.compiler.is_compiling():
        # No write in a compiled backward: an unmeasured factor (0) scales by 1.
        used = _torch.where(factor > 0, factor, _torch.ones_like(factor)).to(input.dtype).reshape(())
        return input * used + (input * (1 - used)).detach()
    return _FrozenGradScale.apply(input, factor)
