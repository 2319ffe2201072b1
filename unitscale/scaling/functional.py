"""Unit-scaled ops (import as ``U``): for unit-normal inputs, outputs and gradients have std close to 1.

Each op is its torch twin with fixed scales applied in the forward pass (to the
output) and in the backward pass (to the input gradients), after Blake et al.,
"Unit Scaling" (arXiv 2303.11257). Signatures mirror torch's, plus a
``constraint=`` argument on ops whose forward and backward scales differ, so a
graph transform can swap a torch function for its twin by target
(``torch_map``).

>>> import torch
>>> import unitscale.scaling.functional as U
>>> _ = torch.manual_seed(0)
>>> x, w = torch.randn(256, 512), torch.randn(128, 512)
>>> round(U.linear(x, w, constraint=None).std().item(), 1), round(torch.nn.functional.linear(x, w).std().item())
(1.0, 23)

Only private names are imported here: ``DeepTracer`` wraps every public callable
of this module as a single graph node, and would otherwise patch an imported name
(``Tensor``, ``Callable``) in the traced model's module too.
"""

from __future__ import annotations

import functools as _functools
import math as _math
import operator as _operator
import sys as _sys
from typing import TYPE_CHECKING, Any

import torch as _torch
import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.fx.autowrap import register_autowrap_module as _register_autowrap_module
from unitscale.scaling import constraints as _constraints
from unitscale.scaling import softmax_stats as _stats

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch
    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg

__all__ = [
    "scale",
    "linear",
    "matmul",
    "gelu",
    "softmax",
    "add",
    "residual_split",
    "residual_add",
    "layer_norm",
    "embedding",
    "dropout",
    "cross_entropy",
    "scaled_dot_product_attention",
    "addmm",
    "conv2d",
    "silu",
    "relu",
    "hardtanh",
    "relu6",
    "rms_norm",
    "batch_norm",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "torch_map",
]


# Torch's own errors on arguments that do not fit (shapes, dtypes) are re-raised by the ops
# below as InputError naming the op, every argument's shape and what fits. A try block costs
# nothing until something raises, so the happy path pays no shape checks of ours.
_TORCH_ERRORS = (RuntimeError, ValueError, IndexError, TypeError)


def _describe(value: object) -> str:
    if isinstance(value, _torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return f"{value!r:.60}"


def _tracing(error: Exception, *args: object) -> bool:
    # Tracers raise through these ops too (fx proxies, symbolic shapes, TorchDynamo, fake
    # tensors): those failures are the tracer's to report, not a misfit of the caller's shapes.
    if type(error).__module__.startswith(("torch.fx", "torch._dynamo", "torch._subclasses")):
        return True
    return any(isinstance(a, _torch.fx.Proxy) for a in args)


def _misfit(op: str, error: Exception, fits: str, **args: object) -> _errors.InputError:
    got = ", ".join(f"{name}={_describe(v)}" for name, v in args.items() if v is not None)
    return _errors.InputError(f"{op}: {got} do not fit; {fits}. torch said {type(error).__name__}: {error}")


class _ScaleFwdBwd(_torch.autograd.Function):
    """Multiply by one number in the forward pass and by another in the backward pass."""

    @staticmethod
    def forward(ctx: _torch.autograd.function.FunctionCtx, input: Tensor, fwd: float, bwd: float) -> Tensor:
        ctx.bwd = bwd  # type: ignore[attr-defined]
        return input.view_as(input) if fwd == 1.0 else input * fwd

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


_scale = scale  # for scaled_dot_product_attention, whose torch-mirroring ``scale`` argument shadows the op


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


def _check_operands(op: str, left: Any, right: Any, right_name: str, right_dim: int) -> None:
    """Tensors whose inner sizes agree: ``left``'s last dim against ``right``'s ``right_dim``."""
    for name, value in (("input", left), (right_name, right)):
        if not isinstance(value, _torch.Tensor):
            raise _errors.InputError(f"{op}: {name} is a {type(value).__name__}; pass a tensor")
    if left.dim() == 0 or right.dim() == 0 or left.shape[-1] != right.shape[right_dim if right.dim() > 1 else 0]:
        raise _errors.InputError(
            f"{op}: input of shape {tuple(left.shape)} and {right_name} of shape {tuple(right.shape)} do not fit: "
            f"the input's last size must equal the {right_name}'s "
            f"{'last' if right_dim == -1 else 'second-to-last'} size"
        )


def _inv_sqrt(count: float) -> float:
    # An empty tensor sums no terms; any finite scale will do.
    return count**-0.5 if count > 0 else 1.0


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.linear`.

    For ``input (..., k)`` and ``weight (n, k)``: output × ``k**-0.5``, input
    gradient × ``n**-0.5``, weight and bias gradients × ``batch**-0.5`` (``batch``:
    the number of rows of ``input``). The constraint reconciles the output and
    input-gradient scales; weight gradients never need it.

    Args:
        input: tensor of shape ``(..., in_features)``.
        weight: tensor of shape ``(out_features, in_features)``.
        bias: optional tensor of shape ``(out_features,)``.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``
            (forward and backward scaled separately).

    Returns:
        ``input @ weight.T + bias``, scaled.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import linear
    >>> _ = torch.manual_seed(0)
    >>> x, w = torch.randn(512, 256, requires_grad=True), torch.randn(64, 256)
    >>> y = linear(x, w, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)

    With the default ``gmean`` constraint both miss 1 by ``(256 / 64) ** 0.25``:

    >>> x.grad = None
    >>> y = linear(x, w)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.4, 0.7)
    """
    _check_operands("linear", input, weight, "weight", -1)
    fan_out, fan_in = weight.shape[0], weight.shape[-1]
    weight_grad_scale = _inv_sqrt(input.numel() / fan_in)
    output_scale, grad_scale = _constrain(constraint, fan_in**-0.5, fan_out**-0.5)
    # The matmul itself sees unit-scaled operands (which is where a low-precision format is
    # simulated) and the scales act on its result: forward the output scale, backward the
    # input-gradient scale, so the input's gradient is unit-scaled as it leaves the matmul;
    # the weight takes the remaining factor of its own gradient scale.
    weight = scale(weight, 1.0, weight_grad_scale / grad_scale)
    output = scale(_F.linear(input, weight), output_scale, grad_scale)
    return output if bias is None else output + scale(bias, 1.0, weight_grad_scale)


def _matmul_dims(left: Tensor, right: Tensor) -> tuple[int, int]:
    """``(inner size, number of output elements)`` of ``torch.matmul(left, right)``."""
    inner = left.shape[-1]
    m = left.shape[-2] if left.dim() >= 2 else 1
    n = right.shape[-1] if right.dim() >= 2 else 1
    batch = _torch.broadcast_shapes(left.shape[:-2], right.shape[:-2])
    return inner, _math.prod(batch) * m * n


def matmul(input: Tensor, other: Tensor, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.matmul`.

    For ``(m, k) @ (k, n)`` (with any batch dims): output × ``k**-0.5``; each
    operand's gradient × ``count**-0.5``, where ``count`` is the number of terms
    summed into each of its elements (``n`` for ``input``; ``m`` times the
    broadcast batch for ``other``). The constraint reconciles all three, since
    either operand may be an activation (use :func:`linear` for weights).

    Args:
        input: left operand.
        other: right operand.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        ``input @ other``, scaled.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import matmul
    >>> _ = torch.manual_seed(0)
    >>> a, b = torch.randn(8, 64, 256), torch.randn(8, 256, 64)
    >>> round(matmul(a, b, constraint=None).std().item(), 1)
    1.0
    """
    _check_operands("matmul", input, other, "other", -2)
    inner, out_numel = _matmul_dims(input, other)
    output_scale, left_scale, right_scale = _constrain(
        constraint,
        inner**-0.5,
        _inv_sqrt(out_numel * inner / input.numel()),
        _inv_sqrt(out_numel * inner / other.numel()),
    )
    # As in linear: unit-scaled operands, scales on the result; ``other`` takes the rest of its own.
    other = scale(other, 1.0, right_scale / left_scale)
    return scale(_torch.matmul(input, other), output_scale, left_scale)


def _check_approximate(op: str, approximate: Any) -> None:
    if approximate not in ("none", "tanh"):
        raise _errors.InputError(f"{op}: approximate={approximate!r:.60} is unknown; pass 'none' or 'tanh'")


# Std of GELU(x) and of GELU'(x) for x ~ N(0, 1), by quadrature on [-12, 12]
# (tests/test_functional.py recomputes them). Exact and tanh forms agree to 1e-5.
_GELU_OUT_STD = 0.587915
_GELU_GRAD_STD = 0.675167


def gelu(input: Tensor, approximate: str = "none", constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.gelu`.

    Output × ``1 / 0.5879`` and input gradient × ``1 / 0.6752``: the std of GELU
    and of its derivative for ``N(0, 1)`` input.

    Args:
        input: any tensor.
        approximate: ``"none"`` or ``"tanh"``, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        ``gelu(input)``, scaled.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import gelu
    >>> _ = torch.manual_seed(0)
    >>> round(gelu(torch.randn(10_000), constraint=None).std().item(), 1)
    1.0
    """
    _check_approximate("gelu", approximate)
    output_scale, grad_scale = _constrain(constraint, 1 / _GELU_OUT_STD, 1 / _GELU_GRAD_STD)
    return scale(_F.gelu(input, approximate=approximate), output_scale, grad_scale)


def softmax(
    input: Tensor,
    dim: int | None = None,
    _stacklevel: int = 3,
    dtype: torch.dtype | None = None,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.softmax` (also the twin of :func:`torch.softmax`).

    A softmax over ``n`` elements of ``N(0, 1)`` logits has output std about
    ``1.31 / n`` and input-gradient std about ``1.64 / n`` (for large ``n``), so
    both scales grow with ``n``; exact values for small ``n`` come from a table.

    Args:
        input: logits.
        dim: the dimension to normalise over (required, unlike torch's deprecated implicit choice).
        _stacklevel: ignored; accepted because ``torch.nn.Softmax`` passes it.
        dtype: optional dtype to compute in, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        ``softmax(input, dim)``, scaled.

    Raises:
        InputError: ``dim`` is ``None``.
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import softmax
    >>> _ = torch.manual_seed(0)
    >>> round(softmax(torch.randn(1000, 64), dim=-1, constraint=None).std().item(), 1)
    1.0
    """
    if dim is None:
        raise _errors.InputError("softmax: dim=None; pass the dimension to normalise over, e.g. dim=-1")
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise _errors.InputError(f"softmax: dim={dim!r:.60} is a {type(dim).__name__}; pass an int, e.g. dim=-1")
    if isinstance(_stacklevel, _torch.dtype):  # torch.softmax(input, dim, dtype) passes dtype third
        dtype = _stacklevel
    output_scale, grad_scale = _constrain(constraint, *_stats.softmax_scales(input.shape[dim]))
    return scale(_F.softmax(input, dim, dtype=dtype), output_scale, grad_scale)


def add(
    input: Tensor | float,
    other: Tensor | float,
    alpha: float = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.add`: ``input + alpha * other``.

    Two independent unit-std tensors sum to std ``sqrt(1 + alpha**2)``: the output
    is scaled by its inverse, the two gradients (already unit) by 1, and the
    constraint reconciles all three. The gradient of a broadcast operand sums over
    the broadcast copies and is scaled by ``copies**-0.5``. Adding a number, or
    adding non-float values (shape arithmetic in a traced graph), is left
    unscaled.

    Args:
        input: first summand.
        other: second summand.
        alpha: multiplier of ``other``, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled sum.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import add
    >>> _ = torch.manual_seed(0)
    >>> a, b = torch.randn(10_000), torch.randn(10_000)
    >>> round(add(a, b, constraint=None).std().item(), 1)
    1.0
    >>> add(2, 3)
    5
    """
    if not (isinstance(input, _torch.Tensor) and isinstance(other, _torch.Tensor)) or not (
        input.is_floating_point() or other.is_floating_point()
    ):
        return input + other if alpha == 1 else input + alpha * other  # type: ignore[return-value]
    output_scale, grad_scale, _ = _constrain(constraint, (1 + alpha**2) ** -0.5, 1.0, 1.0)
    # A broadcast operand's gradient sums over the broadcast elements.
    out_numel = _math.prod(_torch.broadcast_shapes(input.shape, other.shape))
    input = _scale(input, 1.0, _inv_sqrt(out_numel / input.numel()))
    other = _scale(other, 1.0, _inv_sqrt(out_numel / other.numel()))
    return _scale(_torch.add(input, other, alpha=alpha), output_scale, grad_scale)


def _check_tau(op: str, tau: float, name: str = "tau") -> float:
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not 0 < tau < 1:
        raise _errors.InputError(
            f"{op}: {name}={tau!r} is not a number strictly between 0 and 1; it is the share of the "
            f"output variance the residual branch carries (e.g. 0.01 for attention, 0.5 for an MLP)"
        )
    return float(tau)


def residual_split(input: Tensor, tau: float = 0.5) -> tuple[Tensor, Tensor]:
    """Split ``input`` into the residual-branch input and the skip connection.

    Forward: both are ``input``. Backward: the gradients coming back through them
    are combined as ``sqrt(tau) * residual_grad + sqrt(1 - tau) * skip_grad``,
    mirroring :func:`residual_add`; with unit-std branch gradients the result is
    unit-std, and the pair together gives the true gradient of
    ``sqrt(tau) * f(x) + sqrt(1 - tau) * x``.

    Args:
        input: the residual stream.
        tau: share of the variance carried by the residual branch, in ``(0, 1)``.

    Returns:
        ``(residual, skip)``.

    Raises:
        InputError: ``tau`` is not strictly between 0 and 1.

    >>> import torch
    >>> from unitscale.functional import residual_split
    >>> x = torch.ones(3, requires_grad=True)
    >>> r, s = residual_split(x, tau=0.36)
    >>> (r + s).sum().backward()
    >>> [round(g, 2) for g in x.grad.tolist()]
    [1.4, 1.4, 1.4]
    """
    tau = _check_tau("residual_split", tau)
    return scale(input, 1.0, tau**0.5), scale(input, 1.0, (1 - tau) ** 0.5)


def residual_add(residual: Tensor, skip: Tensor, tau: float = 0.5) -> Tensor:
    """Join a residual branch and its skip connection: ``sqrt(tau) * residual + sqrt(1 - tau) * skip``.

    Forward weights only; the gradients of ``residual`` and ``skip`` are the
    output gradient unscaled, and :func:`residual_split` applies the weights in
    the backward pass. For unit-std, independent inputs the output is unit-std.

    Args:
        residual: output of the residual branch.
        skip: the skip connection from :func:`residual_split`.
        tau: share of the variance carried by the residual branch, in ``(0, 1)``.

    Returns:
        The weighted sum.

    Raises:
        InputError: ``tau`` is not strictly between 0 and 1.

    >>> import torch
    >>> from unitscale.functional import residual_add
    >>> residual_add(torch.ones(2), torch.zeros(2), tau=0.25).tolist()
    [0.5, 0.5]
    """
    tau = _check_tau("residual_add", tau)
    return scale(residual, tau**0.5, 1.0) + scale(skip, (1 - tau) ** 0.5, 1.0)


def layer_norm(
    input: Tensor,
    normalized_shape: list[int] | tuple[int, ...] | torch.Size,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.layer_norm`.

    Layer norm's output and input gradient are already unit-std; its weight and
    bias gradients sum over the batch, so they are scaled by ``batch**-0.5``.

    Args:
        input: tensor whose trailing dims are ``normalized_shape``.
        normalized_shape: the trailing shape to normalise over.
        weight: optional gain of shape ``normalized_shape``.
        bias: optional bias of shape ``normalized_shape``.
        eps: added to the variance, as in torch.

    Returns:
        The normalised tensor.

    >>> import torch
    >>> from unitscale.functional import layer_norm
    >>> _ = torch.manual_seed(0)
    >>> w = torch.ones(32, requires_grad=True)
    >>> y = layer_norm(torch.randn(4096, 32), (32,), w)
    >>> y.backward(torch.randn_like(y))
    >>> round(w.grad.std().item(), 1)
    1.0
    """
    try:
        batch_scale = _inv_sqrt(input.numel() / max(_math.prod(normalized_shape), 1))
        if weight is not None:
            weight = scale(weight, 1.0, batch_scale)
        if bias is not None:
            bias = scale(bias, 1.0, batch_scale)
        return _F.layer_norm(input, normalized_shape, weight, bias, eps)
    except _errors.UnitscaleError:
        raise
    except _TORCH_ERRORS as e:
        if _tracing(e, input, weight, bias):
            raise
        raise _misfit(
            "layer_norm",
            e,
            "input's trailing dims must equal normalized_shape (a tuple of ints); weight and bias have that shape",
            input=input,
            normalized_shape=normalized_shape,
            weight=weight,
            bias=bias,
        ) from e


def embedding(
    input: Tensor,
    weight: Tensor,
    padding_idx: int | None = None,
    max_norm: float | None = None,
    norm_type: float = 2.0,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.embedding`.

    The output is rows of ``weight`` (unit-std if ``weight`` is ``N(0, 1)``). A
    row's gradient sums the gradients of every lookup of it, about
    ``lookups / vocab`` terms on average, so the weight gradient is scaled by
    ``(lookups / vocab)**-0.5``.

    Args:
        input: integer indices.
        weight: the embedding table ``(vocab, dim)``.
        padding_idx: as in torch.
        max_norm: as in torch.
        norm_type: as in torch.
        scale_grad_by_freq: as in torch.
        sparse: as in torch.

    Returns:
        The looked-up rows.

    >>> import torch
    >>> from unitscale.functional import embedding
    >>> _ = torch.manual_seed(0)
    >>> w = torch.randn(64, 32, requires_grad=True)
    >>> out = embedding(torch.randint(0, 64, (16384,)), w)
    >>> out.backward(torch.randn_like(out))
    >>> round(w.grad.std().item(), 1)
    1.0
    """
    try:
        weight = scale(weight, 1.0, _inv_sqrt(input.numel() / weight.shape[0]))
        return _F.embedding(input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq, sparse)
    except _errors.UnitscaleError:
        raise
    except _TORCH_ERRORS as e:
        if _tracing(e, input, weight):
            raise
        raise _misfit(
            "embedding",
            e,
            "input holds integer indices (int64 or int32) below weight.shape[0], weight is 2-D (vocab, dim)",
            input=input,
            weight=weight,
        ) from e


def _check_p(op: str, p: float, name: str = "p") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 <= p <= 1:
        raise _errors.InputError(f"{op}: {name}={p!r} is not a probability; pass a number in [0, 1]")
    return float(p)


def dropout(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.dropout`.

    Torch's dropout divides the kept values by ``1 - p``, which raises the std to
    ``(1 - p)**-0.5``; this one multiplies by ``(1 - p)**0.5`` on top, in both
    passes, so values and gradients keep unit std. Identity when not training.

    Args:
        input: any tensor.
        p: probability of zeroing an element, in ``[0, 1]``.
        training: apply dropout (``False``: identity).
        inplace: as in torch.

    Returns:
        The tensor with dropout applied.

    Raises:
        InputError: ``p`` is not in ``[0, 1]``.

    >>> import torch
    >>> from unitscale.functional import dropout
    >>> _ = torch.manual_seed(0)
    >>> round(dropout(torch.randn(10_000), p=0.5).std().item(), 1)
    1.0
    """
    p = _check_p("dropout", p)
    if not isinstance(training, bool):
        raise _errors.InputError(
            f"dropout: training={training!r:.60} is a {type(training).__name__}; pass True or False"
        )
    if not training or p == 0:
        return input
    return _F.dropout(input, p, training, inplace) * (1 - p) ** 0.5


def cross_entropy(
    input: Tensor,
    target: Tensor,
    weight: Tensor | None = None,
    size_average: bool | None = None,
    ignore_index: int = -100,
    reduce: bool | None = None,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
) -> Tensor:
    """Cross-entropy whose loss value is torch's, with the logits' gradient scaled to unit std.

    The loss keeps its meaning (the value equals
    :func:`torch.nn.functional.cross_entropy`'s); only the backward pass changes:
    the logits' gradient ``(softmax - onehot) / batch`` is multiplied by ``batch``
    (for ``reduction="mean"``) and by the inverse of its std over ``n`` classes
    for ``N(0, 1)`` logits, about ``sqrt(n)``. Parameter gradients are then a fixed
    multiple of the true ones, which scale-invariant optimisers (Adam) ignore.

    Args:
        input: logits ``(batch, classes, ...)`` or ``(classes,)``.
        target: class indices or class probabilities, as in torch.
        weight: as in torch.
        size_average: deprecated, as in torch.
        ignore_index: as in torch (the batch count used for the scale includes ignored targets).
        reduce: deprecated, as in torch.
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.
        label_smoothing: as in torch.

    Returns:
        The loss.

    >>> import torch
    >>> from unitscale.functional import cross_entropy
    >>> _ = torch.manual_seed(0)
    >>> logits = torch.randn(512, 100, requires_grad=True)
    >>> target = torch.randint(0, 100, (512,))
    >>> loss = cross_entropy(logits, target)
    >>> torch.allclose(loss, torch.nn.functional.cross_entropy(logits, target))
    True
    >>> loss.backward()
    >>> round(logits.grad.std().item(), 1)
    1.0
    """
    try:
        classes = input.shape[1] if input.dim() >= 2 else input.shape[0]
        batch = input.numel() // max(classes, 1)
        # E[sum_j (s_j - y_j)^2] = E[sum_j s_j^2] - 2 E[s_target] + 1, with E[sum s^2] = (f^2 + 1) / n
        # and E[s_target] = 1 / n for a target independent of the logits.
        f = _stats.log_interp(classes, _stats.OUT)
        grad_var = (1 + (f * f - 1) / classes) / classes if classes > 1 else 1.0
        mean = reduction == "mean" and reduce is not False and size_average is not False
        grad_scale = grad_var**-0.5 * (batch if mean else 1)
        input = scale(input, 1.0, grad_scale)
        return _F.cross_entropy(input, target, weight, size_average, ignore_index, reduce, reduction, label_smoothing)
    except _errors.UnitscaleError:
        raise
    except _TORCH_ERRORS as e:
        if _tracing(e, input, target, weight):
            raise
        raise _misfit(
            "cross_entropy",
            e,
            "input is float logits (batch, classes, ...) or (classes,); target is int64 class indices "
            "(batch, ...) below classes, or float probabilities shaped like input; weight is (classes,)",
            input=input,
            target=target,
            weight=weight,
        ) from e


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
    dropout_p = _check_p("scaled_dot_product_attention", dropout_p, "dropout_p")
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
        output_scale, query_scale, key_scale, value_scale = _constrain(
            constraint,
            (weight_sq / keep) ** -0.5,
            query_grad_var**-0.5,
            (share * query_grad_var) ** -0.5,
            (share * weight_sq / keep) ** -0.5,
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


def addmm(
    input: Tensor,
    mat1: Tensor,
    mat2: Tensor,
    *,
    beta: float = 1,
    alpha: float = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.addmm`: ``beta * input + alpha * (mat1 @ mat2)``.

    The form of GPT-2's ``Conv1D`` projections (``mat2`` is the weight, ``(in, out)``).
    ``mat1 @ mat2`` is scaled as :func:`linear` with weight ``mat2.T``: output ×
    ``k**-0.5``, ``mat1``'s gradient × ``n**-0.5``, ``mat2``'s × ``m**-0.5``; ``input``
    (the bias) is added unscaled and its gradient, summed over the rows it is
    broadcast to, × ``copies**-0.5``.

    Args:
        input: the added term, broadcastable to ``(m, n)``.
        mat1: ``(m, k)``.
        mat2: ``(k, n)``.
        beta: multiplier of ``input``, as in torch.
        alpha: multiplier of the product, as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled ``beta * input + alpha * mat1 @ mat2``.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import addmm
    >>> _ = torch.manual_seed(0)
    >>> x, w, b = torch.randn(512, 256, requires_grad=True), torch.randn(256, 64), torch.zeros(64)
    >>> y = addmm(b, x, w, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    product = linear(mat1, mat2.t(), None, constraint)
    bias = _scale(input, 1.0, _inv_sqrt(product.numel() / max(input.numel(), 1)))
    if alpha != 1:
        product = product * alpha
    return product + (bias if beta == 1 else beta * bias)


def _conv_out_size(size: int, kernel: int, stride: int, padding: int | str, dilation: int) -> int:
    if padding == "same":
        return size
    pad = 0 if padding == "valid" else int(padding)
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def _pair(value: int | tuple[int, ...] | list[int] | str) -> tuple[int | str, int | str]:
    if isinstance(value, (tuple, list)):
        return (value[0], value[-1])
    return (value, value)


def conv2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, ...] = 1,
    padding: int | tuple[int, ...] | str = 0,
    dilation: int | tuple[int, ...] = 1,
    groups: int = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv2d`.

    A convolution is a matmul over patches: output × ``fan_in**-0.5`` with
    ``fan_in = C_in / groups * kh * kw``; input gradient × ``count**-0.5``, where
    ``count`` is the average number of terms summed into an input element's
    gradient (``C_out / groups * kh * kw`` at stride 1 with "same" padding, fewer
    when strided); weight and bias gradients × ``(N * H_out * W_out)**-0.5``. The
    constraint reconciles the output and input-gradient scales, as for :func:`linear`.

    Args:
        input: ``(N, C_in, H, W)`` (or unbatched ``(C_in, H, W)``).
        weight: ``(C_out, C_in / groups, kh, kw)``.
        bias: optional ``(C_out,)``.
        stride: as in torch.
        padding: as in torch (``"same"`` and ``"valid"`` included).
        dilation: as in torch.
        groups: as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled convolution.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import conv2d
    >>> _ = torch.manual_seed(0)
    >>> x, w = torch.randn(8, 16, 32, 32, requires_grad=True), torch.randn(32, 16, 3, 3)
    >>> y = conv2d(x, w, padding=1, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    fan_in = _math.prod(weight.shape[1:])
    kernel = weight.shape[-2:]
    strides, paddings, dilations = _pair(stride), _pair(padding), _pair(dilation)
    out_hw = [
        _conv_out_size(input.shape[-2 + i], kernel[i], int(strides[i]), paddings[i], int(dilations[i]))
        for i in range(2)
    ]
    batch = input.numel() // max(_math.prod(input.shape[-3:]), 1)
    out_numel = batch * weight.shape[0] * out_hw[0] * out_hw[1]
    weight_grad_scale = _inv_sqrt(out_numel / weight.shape[0])
    output_scale, grad_scale = _constrain(
        constraint, fan_in**-0.5, _inv_sqrt(out_numel * fan_in / max(input.numel(), 1))
    )
    # As in linear: the convolution sees unit-scaled operands, the scales act on its result.
    weight = _scale(weight, 1.0, weight_grad_scale / grad_scale)
    output = _scale(_F.conv2d(input, weight, None, stride, padding, dilation, groups), output_scale, grad_scale)
    if bias is None:
        return output
    return output + _scale(bias, 1.0, weight_grad_scale).reshape(-1, 1, 1)


# Std of SiLU(x) and of SiLU'(x) for x ~ N(0, 1), by quadrature on [-12, 12], as for GELU.
_SILU_OUT_STD = 0.559538
_SILU_GRAD_STD = 0.616021
# ReLU's output and derivative both have root-mean-square sqrt(1/2) for N(0, 1) input.
_RELU_SCALE = 2**0.5


def silu(input: Tensor, inplace: bool = False, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.silu` (the gate of Llama's SwiGLU).

    Output × ``1 / 0.5595`` and input gradient × ``1 / 0.6160``: the std of SiLU
    and of its derivative for ``N(0, 1)`` input.

    Args:
        input: any tensor.
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        ``silu(input)``, scaled.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import silu
    >>> _ = torch.manual_seed(0)
    >>> round(silu(torch.randn(10_000), constraint=None).std().item(), 1)
    1.0
    """
    output_scale, grad_scale = _constrain(constraint, 1 / _SILU_OUT_STD, 1 / _SILU_GRAD_STD)
    return scale(_F.silu(input), output_scale, grad_scale)


def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.relu` (also the twin of :func:`torch.relu`): ``2**0.5 * relu(x)``.

    Scaled to unit root-mean-square rather than unit std, as He initialisation does:
    for ``N(0, 1)`` input ReLU's output has mean 0.40 and std 0.58, and the next
    matmul or convolution passes on the second moment (``0.40**2 + 0.58**2 = 1/2``),
    so a std scale would grow the activations by ``1.21`` per layer in a network
    without normalisation. The derivative is 0 or 1, with RMS ``2**-0.5`` too, so
    both directions take the same scale and the gradient stays the true one of the
    scaled function (no constraint needed). Output std is then ``0.83``, RMS 1.

    Args:
        input: any tensor.
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.

    Returns:
        ``2**0.5 * relu(input)``.

    >>> import torch
    >>> from unitscale.functional import relu
    >>> _ = torch.manual_seed(0)
    >>> y = relu(torch.randn(100_000))
    >>> round(y.pow(2).mean().sqrt().item(), 2), round(y.std().item(), 1)
    (1.0, 0.8)
    """
    return _F.relu(input) * _RELU_SCALE


def _clamp_moments(low: float, high: float) -> tuple[float, float]:
    """Mean squares of ``clamp(x, low, high)`` and of its derivative for ``x ~ N(0, 1)``."""
    cdf = lambda v: 0.5 * (1.0 + _math.erf(v / 2**0.5))  # noqa: E731
    pdf = lambda v: _math.exp(-v * v / 2) / (2 * _math.pi) ** 0.5  # noqa: E731
    inside = cdf(high) - cdf(low)
    # E[x^2; low < x < high] = P(low < x < high) - (high pdf(high) - low pdf(low))
    output = inside - (high * pdf(high) - low * pdf(low)) + low * low * cdf(low) + high * high * (1 - cdf(high))
    return output, inside


def hardtanh(
    input: Tensor,
    min_val: float = -1.0,
    max_val: float = 1.0,
    inplace: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.hardtanh` (``nn.Hardtanh``, ``nn.ReLU6``): a clamp.

    Scaled to unit root-mean-square, as :func:`relu` is: output × ``1 / RMS(clamp(x))``
    and input gradient × ``1 / RMS(clamp'(x))`` for ``x ~ N(0, 1)`` (both from the normal
    distribution's closed forms). For ReLU6 (``min_val=0, max_val=6``) both are ``2**0.5``,
    as for ReLU, since a unit-scaled input almost never reaches 6; for the default
    ``[-1, 1]`` they differ and ``constraint`` reconciles them. A range no unit input
    reaches (an empty or far-off interval) is left unscaled in the direction it empties.

    Args:
        input: any tensor.
        min_val: the lower bound, as in torch.
        max_val: the upper bound, as in torch.
        inplace: ignored (the scaled result is a new tensor); accepted because torch's modules pass it.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        ``hardtanh(input, min_val, max_val)``, scaled.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import hardtanh
    >>> _ = torch.manual_seed(0)
    >>> y = hardtanh(torch.randn(100_000), 0.0, 6.0)
    >>> round(y.pow(2).mean().sqrt().item(), 2)
    1.0
    """
    output, inside = _clamp_moments(float(min_val), float(max_val))
    output_scale = output**-0.5 if output > 1e-12 else 1.0
    grad_scale = inside**-0.5 if inside > 1e-12 else 1.0
    output_scale, grad_scale = _constrain(constraint, output_scale, grad_scale)
    return scale(_F.hardtanh(input, min_val, max_val), output_scale, grad_scale)


def relu6(input: Tensor, inplace: bool = False) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.relu6`: :func:`hardtanh` on ``[0, 6]``, about ``2**0.5 * relu6(x)``.

    Args:
        input: any tensor.
        inplace: ignored (the scaled result is a new tensor).

    Returns:
        ``relu6(input)``, scaled to unit root-mean-square for unit-normal input.

    >>> import torch
    >>> from unitscale.functional import relu6
    >>> _ = torch.manual_seed(0)
    >>> round(relu6(torch.randn(100_000)).pow(2).mean().sqrt().item(), 2)
    1.0
    """
    return hardtanh(input, 0.0, 6.0)


def rms_norm(
    input: Tensor,
    normalized_shape: list[int] | tuple[int, ...] | torch.Size,
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.rms_norm` (and the ``LlamaRMSNorm``/``T5LayerNorm`` pattern).

    RMS norm's output has unit root-mean-square, so unit std for zero-mean input,
    and its input gradient is unit-std too; only the weight gradient, summed over
    the batch, is scaled (by ``batch**-0.5``), as in :func:`layer_norm`.

    Args:
        input: tensor whose trailing dims are ``normalized_shape``.
        normalized_shape: the trailing shape to normalise over.
        weight: optional gain of shape ``normalized_shape``.
        eps: added to the mean square (``None``: the dtype's machine epsilon, as in torch).

    Returns:
        The normalised tensor.

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


def batch_norm(
    input: Tensor,
    running_mean: Tensor | None,
    running_var: Tensor | None,
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    training: bool = False,
    momentum: float = 0.1,
    eps: float = 1e-5,
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.batch_norm`.

    In training mode (or without running statistics) the output is normalised
    with the batch's own statistics, so output and input gradient are already
    unit-std; the weight and bias gradients sum over ``N * H * W`` values per
    channel and are scaled by its inverse square root. In eval mode the running
    statistics normalise: the output is unit-std only if they describe the
    input. :func:`~unitscale.unit_scale` therefore resets them to mean 0 and
    variance 1, the statistics of the unit-scaled activations it produces (a
    model trained after unit scaling tracks its own).

    Args:
        input: ``(N, C, ...)``.
        running_mean: per-channel mean, or ``None``.
        running_var: per-channel variance, or ``None``.
        weight: optional per-channel gain.
        bias: optional per-channel bias.
        training: normalise with batch statistics (and update the running ones).
        momentum: as in torch.
        eps: as in torch.

    Returns:
        The normalised tensor.

    >>> import torch
    >>> from unitscale.functional import batch_norm
    >>> _ = torch.manual_seed(0)
    >>> w = torch.ones(256, requires_grad=True)
    >>> y = batch_norm(5 * torch.randn(32, 256, 4, 4), None, None, w, training=True)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(w.grad.std().item(), 1)
    (1.0, 1.0)
    """
    channels = input.shape[1] if input.dim() > 1 else 1
    batch_scale = _inv_sqrt(input.numel() / max(channels, 1))
    if weight is not None:
        weight = scale(weight, 1.0, batch_scale)
    if bias is not None:
        bias = scale(bias, 1.0, batch_scale)
    return _F.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


@_functools.lru_cache(maxsize=64)
def _max_rms(k: int) -> float:
    """Root-mean-square of the largest of ``k`` independent ``N(0, 1)`` values (trapezoid rule on [-10, 10])."""
    steps, lo, hi = 4000, -10.0, 10.0
    h = (hi - lo) / steps
    total = 0.0
    for i in range(steps + 1):
        x = lo + i * h
        density = (
            k * _math.exp(-x * x / 2) / _math.sqrt(2 * _math.pi) * (0.5 * (1 + _math.erf(x / _math.sqrt(2)))) ** (k - 1)
        )
        total += (0.5 if i in (0, steps) else 1.0) * x * x * density
    return (total * h) ** 0.5


def max_pool2d(
    input: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    dilation: int | tuple[int, int] = 1,
    ceil_mode: bool = False,
    return_indices: bool = False,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.max_pool2d`.

    The largest of ``k = kh * kw`` values of ``N(0, 1)`` has mean well above 0 (1.49
    for ``k = 9``), so, as for :func:`relu`, the output is scaled to unit
    root-mean-square (``1 / 1.60`` for ``k = 9``, by quadrature), the moment the next
    convolution passes on. Each output's gradient goes to one input, so an input's
    gradient has RMS ``(outputs / inputs)**0.5``, and is scaled by the inverse.

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)``.
        kernel_size: as in torch.
        stride: as in torch (``None``: the kernel size).
        padding: as in torch.
        dilation: as in torch.
        ceil_mode: as in torch.
        return_indices: as in torch (the indices are returned unscaled).
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled maxima (and their indices with ``return_indices=True``).

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import max_pool2d
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
    >>> y = max_pool2d(x, 3, 2, 1, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.pow(2).mean().sqrt().item(), 1), round(x.grad.pow(2).mean().sqrt().item(), 1)
    (1.0, 1.0)
    """
    kh, kw = _pair(kernel_size)
    result = _F.max_pool2d(input, kernel_size, stride, padding, dilation, ceil_mode, True)
    out, indices = result[0], result[1]
    output_scale, grad_scale = _constrain(
        constraint, 1 / _max_rms(int(kh) * int(kw)), _inv_sqrt(out.numel() / max(input.numel(), 1))
    )
    out = _scale(out, output_scale, grad_scale)
    return (out, indices) if return_indices else out  # type: ignore[return-value]


def _pool_scales(input: Tensor, output: Tensor, window: int, constraint: ConstraintArg) -> tuple[float, ...]:
    # Each output averages ``window`` values: std window**-0.5 for independent ones. Each input's
    # gradient sums ``cover`` output gradients divided by ``window``: std cover**0.5 / window.
    cover = output.numel() * window / max(input.numel(), 1)
    return _constrain(constraint, window**0.5, window * _inv_sqrt(cover))


def avg_pool2d(
    input: Tensor,
    kernel_size: int | tuple[int, int],
    stride: int | tuple[int, int] | None = None,
    padding: int | tuple[int, int] = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override: int | None = None,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.avg_pool2d`.

    The mean of ``k = kh * kw`` independent unit-std values has std ``k**-0.5``:
    the output is scaled by ``k**0.5``, and each input gradient (a sum of ``cover``
    output gradients divided by ``k``) by ``k / cover**0.5``. Spatially correlated
    inputs come out above 1 (at most ``k**0.5`` for constant windows).

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)``.
        kernel_size: as in torch.
        stride: as in torch (``None``: the kernel size).
        padding: as in torch.
        ceil_mode: as in torch.
        count_include_pad: as in torch.
        divisor_override: as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled average.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import avg_pool2d
    >>> _ = torch.manual_seed(0)
    >>> round(avg_pool2d(torch.randn(8, 16, 32, 32), 2, constraint=None).std().item(), 1)
    1.0
    """
    kh, kw = _pair(kernel_size)
    out = _F.avg_pool2d(input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
    output_scale, grad_scale = _pool_scales(input, out, int(kh) * int(kw), constraint)
    return _scale(out, output_scale, grad_scale)


def adaptive_avg_pool2d(
    input: Tensor,
    output_size: int | tuple[int | None, int | None],
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.adaptive_avg_pool2d`.

    As :func:`avg_pool2d`, with the window ``(H / H_out) * (W / W_out)`` (the
    whole feature map for ``output_size=1``, as at the end of a ResNet).

    Args:
        input: ``(N, C, H, W)`` or ``(C, H, W)``.
        output_size: as in torch.
        constraint: a name from ``unitscale.scaling.constraints``, a callable, or ``None``.

    Returns:
        The scaled average.

    Raises:
        UnknownConstraintError: ``constraint`` names no constraint.
        PredicateError: a callable ``constraint`` returned no positive, finite number.

    >>> import torch
    >>> from unitscale.functional import adaptive_avg_pool2d
    >>> _ = torch.manual_seed(0)
    >>> round(adaptive_avg_pool2d(torch.randn(64, 32, 8, 8), 1, constraint=None).std().item(), 1)
    1.0
    """
    out = _F.adaptive_avg_pool2d(input, output_size)
    window = max(round(input.shape[-2] * input.shape[-1] / max(out.shape[-2] * out.shape[-1], 1)), 1)
    output_scale, grad_scale = _pool_scales(input, out, window, constraint)
    return _scale(out, output_scale, grad_scale)


torch_map: dict[Callable[..., object], Callable[..., object]] = {
    _F.linear: linear,
    _torch.matmul: matmul,
    _torch.Tensor.matmul: matmul,
    _operator.matmul: matmul,
    _torch.mm: matmul,
    _torch.bmm: matmul,
    _F.gelu: gelu,
    _F.softmax: softmax,
    _torch.softmax: softmax,
    _torch.Tensor.softmax: softmax,
    _torch.add: add,
    _torch.Tensor.add: add,
    _operator.add: add,
    _F.layer_norm: layer_norm,
    _F.embedding: embedding,
    _F.dropout: dropout,
    _F.cross_entropy: cross_entropy,
    _F.scaled_dot_product_attention: scaled_dot_product_attention,
    _torch.addmm: addmm,
    _torch.Tensor.addmm: addmm,
    _F.conv2d: conv2d,
    _F.silu: silu,
    _F.relu: relu,
    _torch.relu: relu,
    _torch.Tensor.relu: relu,
    _F.hardtanh: hardtanh,
    _F.relu6: relu6,
    _torch._C._nn.hardtanh: hardtanh,
    _torch._C._nn.relu6: relu6,
    _F.rms_norm: rms_norm,
    _F.batch_norm: batch_norm,
    _F.max_pool2d: max_pool2d,
    _torch.max_pool2d: max_pool2d,
    _F.avg_pool2d: avg_pool2d,
    _F.adaptive_avg_pool2d: adaptive_avg_pool2d,
}
"""Each torch function (as a TorchDynamo or ``torch.fx`` graph names it) -> its unit-scaled twin."""

# Users import these as ``unitscale.functional``: graphs, generated code and pickles name a
# function by its ``__module__``, so they keep naming that path (``unitscale_functional_linear``).
for _name in __all__:
    _fn = globals()[_name]
    if callable(_fn):
        _fn.__module__ = "unitscale.functional"

# Tracers keep these ops as single nodes by default; fx learns of them here, not by
# importing this layer.
_register_autowrap_module(_sys.modules[__name__])
