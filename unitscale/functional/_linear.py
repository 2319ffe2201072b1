"""Matmul-like ops: linear, matmul, addmm, conv2d."""

from __future__ import annotations

import math as _math
from typing import TYPE_CHECKING, Any

import torch as _torch
import torch.nn.functional as _F

from unitscale import errors as _errors
from unitscale.functional._scale import _constrain, _inv_sqrt, scale
from unitscale.scaling.checks import check_mult
from unitscale.scaling.docs import fill_docstring

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch import Tensor

    from unitscale.scaling.constraints import ConstraintArg


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


@fill_docstring
def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.linear`.

    For ``input (..., k)`` and ``weight (n, k)``: output × ``k**-0.5``, input gradient ×
    ``n**-0.5``, weight and bias gradients × ``batch**-0.5`` (the rows of ``input``).

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import linear
    >>> _ = torch.manual_seed(0)
    >>> x, w = torch.randn(512, 256, requires_grad=True), torch.randn(64, 256)
    >>> y = linear(x, w, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    _check_operands("linear", input, weight, "weight", -1)
    return _linear(input, weight, bias, constraint, weight.shape[-1] ** -0.5)


def _linear(
    input: Tensor, weight: Tensor, bias: Tensor | None, constraint: ConstraintArg, output_scale: float
) -> Tensor:
    fan_out, fan_in = weight.shape[0], weight.shape[-1]
    weight_grad_scale = _inv_sqrt(input.numel() / fan_in)
    output_scale, grad_scale = _constrain(constraint, output_scale, fan_out**-0.5)
    # The matmul itself sees unit-scaled operands (which is where a low-precision format is
    # simulated) and the scales act on its result: forward the output scale, backward the
    # input-gradient scale, so the input's gradient is unit-scaled as it leaves the matmul;
    # the weight takes the remaining factor of its own gradient scale.
    weight = scale(weight, 1.0, weight_grad_scale / grad_scale)
    output = scale(_F.linear(input, weight), output_scale, grad_scale)
    return output if bias is None else output + scale(bias, 1.0, weight_grad_scale)


@fill_docstring
def linear_readout(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    constraint: ConstraintArg = None,
    mult: float = 1.0,
) -> Tensor:
    """u-μP's readout (the last layer): output × ``mult / fan_in``, input gradient × ``fan_out**-0.5``.

    μP's ``1 / fan_in`` keeps the logits from growing with width once features and weights
    correlate (u-μP §4), so at initialisation they are small (std ``mult * fan_in**-0.5``).
    Every path to the loss goes through the readout, so ``constraint=None`` (the default) keeps
    gradients true. ``mult`` is u-μP's α_loss-softmax (here or on the loss, not both). A bias
    is added after the scaling.

    Args:
        {constraint}
        {mult}

    Raises:
        {constraint_errors}
        {mult_errors}

    >>> import torch
    >>> from unitscale.functional import linear_readout
    >>> _ = torch.manual_seed(0)
    >>> y = linear_readout(torch.randn(4096, 256), torch.randn(32, 256), mult=16.0)
    >>> round(y.std().item(), 1)
    1.0
    """
    mult = check_mult("linear_readout", "mult", mult)
    _check_operands("linear_readout", input, weight, "weight", -1)
    return _linear(input, weight, bias, constraint, mult / weight.shape[-1])


def _matmul_dims(left: Tensor, right: Tensor) -> tuple[int, int]:
    """``(inner size, number of output elements)`` of ``torch.matmul(left, right)``."""
    inner = left.shape[-1]
    m = left.shape[-2] if left.dim() >= 2 else 1
    n = right.shape[-1] if right.dim() >= 2 else 1
    batch = _torch.broadcast_shapes(left.shape[:-2], right.shape[:-2])
    return inner, _math.prod(batch) * m * n


@fill_docstring
def matmul(input: Tensor, other: Tensor, constraint: ConstraintArg = "gmean") -> Tensor:
    """Unit-scaled :func:`torch.matmul`.

    For ``(m, k) @ (k, n)``: output × ``k**-0.5``, ``input``'s gradient × ``n**-0.5``,
    ``other``'s × ``(m * batch)**-0.5``. The constraint takes all three, as either operand
    may be an activation (use :func:`linear` for weights).

    Args:
        {constraint}

    Raises:
        {constraint_errors}

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


@fill_docstring
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

    GPT-2's ``Conv1D`` form: ``mat1 @ mat2`` is scaled as :func:`linear` with weight
    ``mat2.T``; ``input`` (the bias) is added unscaled, its gradient × ``copies**-0.5``.

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import addmm
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(512, 256, requires_grad=True)
    >>> w, b = torch.randn(256, 64), torch.zeros(64)
    >>> y = addmm(b, x, w, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    product = linear(mat1, mat2.t(), None, constraint)
    bias = scale(input, 1.0, _inv_sqrt(product.numel() / max(input.numel(), 1)))
    if alpha != 1:
        product = product * alpha
    return product + (bias if beta == 1 else beta * bias)


def _valid_taps(size: int, kernel: int, stride: int, padding: int | str, dilation: int) -> tuple[int, int]:
    """``(taps on the input, output positions)`` along one axis: the (output, kernel tap) pairs that read the
    input rather than its zero padding (most of them on a map not much wider than the kernel)."""
    if padding == "same":
        pad, outputs = dilation * (kernel - 1) // 2, size
    else:
        pad = 0 if padding == "valid" else int(padding)
        outputs = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    taps = sum(1 for o in range(outputs) for k in range(kernel) if 0 <= o * stride - pad + k * dilation < size)
    return taps, outputs


def _tuple(value: int | tuple[int, ...] | list[int] | str, dims: int) -> tuple[int | str, ...]:
    if isinstance(value, (tuple, list)):
        return tuple(value) if len(value) == dims else (value[0],) * dims
    return (value,) * dims


def _conv(
    conv: Callable[..., Tensor],
    dims: int,
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    stride: int | tuple[int, ...],
    padding: int | tuple[int, ...] | str,
    dilation: int | tuple[int, ...],
    groups: int,
    constraint: ConstraintArg,
) -> Tensor:
    """A convolution over the last ``dims`` dims, scaled as a matmul over patches (see :func:`conv2d`)."""
    kernel = weight.shape[-dims:]
    strides, paddings, dilations = _tuple(stride, dims), _tuple(padding, dims), _tuple(dilation, dims)
    axes = [
        _valid_taps(input.shape[i - dims], kernel[i], int(strides[i]), paddings[i], int(dilations[i]))
        for i in range(dims)
    ]
    out_size = [outputs for _, outputs in axes]
    # The kernel taps an output reads from the input, on average (zero padding adds nothing).
    taps = _math.prod(t for t, _ in axes) / max(_math.prod(out_size), 1)
    fan_in = weight.shape[1] * taps
    batch = input.numel() // max(_math.prod(input.shape[-dims - 1 :]), 1)
    out_numel = batch * weight.shape[0] * _math.prod(out_size)
    weight_grad_scale = _inv_sqrt(out_numel / weight.shape[0])
    output_scale, grad_scale = _constrain(
        constraint, _inv_sqrt(fan_in), _inv_sqrt(out_numel * fan_in / max(input.numel(), 1))
    )
    # As in linear: the convolution sees unit-scaled operands, the scales act on its result.
    weight = scale(weight, 1.0, weight_grad_scale / grad_scale)
    output = scale(conv(input, weight, None, stride, padding, dilation, groups), output_scale, grad_scale)
    return output if bias is None else output + scale(bias, 1.0, weight_grad_scale).reshape(-1, *(1,) * dims)


@fill_docstring
def conv1d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, ...] = 1,
    padding: int | tuple[int, ...] | str = 0,
    dilation: int | tuple[int, ...] = 1,
    groups: int = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv1d`, scaled as :func:`conv2d` is (``fan_in = C_in / groups * k``).

    Args:
        {conv}
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import conv1d
    >>> _ = torch.manual_seed(0)
    >>> x, w = torch.randn(16, 32, 256, requires_grad=True), torch.randn(64, 32, 5)
    >>> y = conv1d(x, w, padding=2, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    return _conv(_F.conv1d, 1, input, weight, bias, stride, padding, dilation, groups, constraint)


@fill_docstring
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

    A matmul over patches: output × ``fan_in**-0.5``, ``fan_in = C_in / groups * kh * kw``
    counting only the taps that read the input, not its zero padding (on average); the input
    gradient × ``count**-0.5``, ``count`` the terms an element's gradient sums (fewer when
    strided); weight and bias gradients × ``(N * H_out * W_out)**-0.5``.

    Args:
        {conv}
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import conv2d
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 16, 32, 32, requires_grad=True)
    >>> w = torch.randn(32, 16, 3, 3)
    >>> y = conv2d(x, w, padding=1, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    return _conv(_F.conv2d, 2, input, weight, bias, stride, padding, dilation, groups, constraint)


@fill_docstring
def conv_transpose2d(
    input: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    stride: int | tuple[int, ...] = 1,
    padding: int | tuple[int, ...] = 0,
    output_padding: int | tuple[int, ...] = 0,
    groups: int = 1,
    dilation: int | tuple[int, ...] = 1,
    constraint: ConstraintArg = "gmean",
) -> Tensor:
    """Unit-scaled :func:`torch.nn.functional.conv_transpose2d`.

    The backward of :func:`conv2d`, so the two swap scales: output × ``fan_in**-0.5``,
    ``fan_in = C_in / groups * T / (H_out * W_out)``, and input gradient × ``fan_out**-0.5``,
    ``fan_out = C_out / groups * T / (H_in * W_in)``, where ``T`` counts the (input position,
    kernel tap) pairs inside the output (``padding`` crops some).

    Args:
        {constraint}

    Raises:
        {constraint_errors}

    >>> import torch
    >>> from unitscale.functional import conv_transpose2d
    >>> _ = torch.manual_seed(0)
    >>> x = torch.randn(8, 32, 16, 16, requires_grad=True)
    >>> w = torch.randn(32, 16, 4, 4)
    >>> y = conv_transpose2d(x, w, stride=2, padding=1, constraint=None)
    >>> y.backward(torch.randn_like(y))
    >>> round(y.std().item(), 1), round(x.grad.std().item(), 1)
    (1.0, 1.0)
    """
    strides, paddings, dilations, extra = (_tuple(v, 2) for v in (stride, padding, dilation, output_padding))
    kernel, in_size = weight.shape[-2:], input.shape[-2:]
    # torch's output size: the input's positions spread by the stride, the kernel added, the padding cropped.
    out_size = [
        (n - 1) * int(s) - 2 * int(p) + int(d) * (k - 1) + int(e) + 1
        for n, k, s, p, d, e in zip(in_size, kernel, strides, paddings, dilations, extra, strict=True)
    ]
    # The conv2d this transposes maps the output's positions to the input's: its valid taps are T.
    pairs = _math.prod(
        _valid_taps(out_size[i], kernel[i], int(strides[i]), paddings[i], int(dilations[i]))[0] for i in range(2)
    )
    fan_in = input.shape[-3] / groups * pairs / max(_math.prod(out_size), 1)
    fan_out = weight.shape[1] * pairs / max(_math.prod(in_size), 1)
    batch = input.numel() // max(_math.prod(input.shape[-3:]), 1)
    weight_grad_scale = _inv_sqrt(batch * pairs / max(_math.prod(kernel), 1))
    output_scale, grad_scale = _constrain(constraint, _inv_sqrt(fan_in), _inv_sqrt(fan_out))
    # Scales act on the result, as in linear; the weight's own gradient gets its count alone.
    weight = scale(weight, 1.0, weight_grad_scale / grad_scale)
    out = _F.conv_transpose2d(input, weight, None, stride, padding, output_padding, groups, dilation)
    out = scale(out, output_scale, grad_scale)
    return out if bias is None else out + scale(bias, 1.0, _inv_sqrt(batch * _math.prod(out_size))).reshape(-1, 1, 1)
