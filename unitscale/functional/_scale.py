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

    The building block of every op here: with ``fwd_scale != bwd_scale`` the
    gradient is deliberately not the true gradient of the forward function.

    Args:
        input: any floating-point tensor.
        fwd_scale: factor applied to the value.
        bwd_scale: factor applied to the gradient flowing back to ``input``.

    Returns:
        ``input * fwd_scale`` (whose gradient is scaled by ``bwd_scale``).

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


def _inv_sqrt(count: float) -> float:
    # An empty tensor sums no terms; any finite scale will do.
    return count**-0.5 if count > 0 else 1.0


# A custom op rather than an autograd.Function: its backward reads the gradient it scales, which
# the detach trick ``scale`` uses under TorchDynamo cannot express, and one opaque node compiles.
@_torch.library.custom_op("unitscale::normalise_grad", mutates_args=())
def _normalise_grad_op(input: _torch.Tensor) -> _torch.Tensor:
    return input.clone()


@_normalise_grad_op.register_fake
def _normalise_grad_fake(input: _torch.Tensor) -> _torch.Tensor:
    return _torch.empty_like(input)


def _no_context(ctx: object, inputs: tuple[object, ...], output: object) -> None:
    return None


def _unit_rms_grad(ctx: object, grad: Tensor) -> Tensor:
    rms = grad.float().square().mean().sqrt()
    return grad * _torch.where(rms > 0, 1 / rms, 1.0).to(grad.dtype)


_normalise_grad_op.register_autograd(_unit_rms_grad, setup_context=_no_context)


def normalise_grad(input: Tensor) -> Tensor:
    """Identity in the forward pass; the gradient divided by its root-mean-square in the backward pass.

    One positive number per call, read from the gradient itself: the gradient keeps its
    direction, and is the true one times that number for everything upstream only where
    every path from the inputs to the loss passes through ``input`` (a cut edge, such as the
    residual stream between two blocks of a ResNet). :func:`~unitscale.unit_scale` puts it
    there, before a residual block that holds batch norm: batch norm's gradient grows as
    its input's per-channel variance shrinks, and inside a block no scale can undo that
    without changing the gradient's direction. A zero gradient stays zero.

    Args:
        input: any floating-point tensor.

    Returns:
        ``input`` (a copy), whose gradient has root-mean-square 1.

    >>> import torch
    >>> from unitscale.functional import normalise_grad
    >>> x = torch.ones(4, requires_grad=True)
    >>> normalise_grad(x).backward(torch.tensor([3.0, -3.0, 3.0, -3.0]))
    >>> x.grad.tolist()
    [1.0, -1.0, 1.0, -1.0]
    """
    return _torch.ops.unitscale.normalise_grad(input)
