"""The unit-scaling pass's rules for ops a torch function alone does not name: mean pools and layer scales.

:data:`unitscale.functional.torch_map` swaps an op by the function it calls. Two ops need
more than that to be told apart from ops that look the same:

- ``x.mean(dims)`` is a pool (timm's global pool ``x.mean((2, 3))``, a ViT's mean over
  tokens) or a statistic (a loss's ``.mean()``, a hand-written norm's
  ``x - x.mean(-1, keepdim=True)`` and ``(x - u).pow(2).mean(-1)``). Only a pool is
  scaled: a mean over some dims, of a value that is not a square, that nothing subtracts
  or takes a root of;
- ``gamma * x`` with ``gamma`` a parameter broadcast over an activation is a layer scale
  (ConvNeXt's, CaiT's): it becomes :func:`~unitscale.functional.layer_scale`, whose gain
  :func:`~unitscale.transforms.unit_scale_pass.unit_init_` sets to 1 like a norm's.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

import unitscale.functional as U
from unitscale.transforms._graph import _attr, _function_of, _is_float_node, _is_mul, _member, _producer

_MEANS: set[Any] = {torch.mean, torch.Tensor.mean}
# What reads a mean that is a statistic, not a pool: centring, a variance's root, an epsilon.
_STATISTIC_READERS: set[Any] = {
    operator.sub, torch.sub, torch.Tensor.sub, torch.Tensor.__rsub__, torch.rsub,
    torch.sqrt, torch.Tensor.sqrt, torch.rsqrt, torch.Tensor.rsqrt, torch.var, torch.Tensor.var,
}  # fmt: skip
_SQUARES: set[Any] = {torch.square, torch.Tensor.square, torch.pow, torch.Tensor.pow, operator.pow}


def _reduced_dims(node: fx.Node) -> tuple[Any, bool] | None:
    """``(dim, keepdim)`` of a mean over some but not all dims, else ``None``."""
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    value, source = node.meta.get("example_value"), node.args[0] if node.args else None
    before = source.meta.get("example_value") if isinstance(source, fx.Node) else None
    if dim is None or not isinstance(keepdim, bool) or "dtype" in node.kwargs:
        return None
    if not (isinstance(value, torch.Tensor) and isinstance(before, torch.Tensor)):
        return None
    if value.numel() <= 1 or value.numel() > before.numel():  # a mean over size-1 dims is one of 1: scale 1
        return None
    return dim, keepdim


def _is_pool(node: fx.Node) -> bool:
    if not _member(_function_of(node), _MEANS) or not node.args or not _is_float_node(node.args[0]):
        return False
    if _reduced_dims(node) is None:
        return False
    made_by = _producer(node.args[0])
    if isinstance(made_by, fx.Node) and (_member(_function_of(made_by), _SQUARES) or _is_square(made_by)):
        return False
    return not any(_member(_function_of(user), _STATISTIC_READERS) for user in node.users)


def _is_square(node: fx.Node) -> bool:
    return _is_mul(node) and len(node.args) >= 2 and node.args[0] is node.args[1]


def _parameter(gm: fx.GraphModule, arg: Any) -> bool:
    """Whether ``arg`` is a parameter, read through reshapes and casts."""
    source = _producer(arg)
    if not (isinstance(source, fx.Node) and source.op == "get_attr"):
        return False
    try:
        return isinstance(_attr(gm, str(source.target)), torch.nn.Parameter)
    except AttributeError:
        return False


def _layer_scale_operands(gm: fx.GraphModule, node: fx.Node, stream: set[fx.Node]) -> tuple[fx.Node, fx.Node] | None:
    """``(x, gamma)`` if ``node`` is ``x * gamma``: an activation times a parameter broadcast over it."""
    if not _is_mul(node) or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    for x, gamma in ((a, b), (b, a)):
        if not (isinstance(x, fx.Node) and x in stream and _is_float_node(x) and _is_float_node(gamma)):
            continue
        if gamma in stream or not _parameter(gm, gamma):
            continue
        out, small = node.meta.get("example_value"), gamma.meta.get("example_value")  # type: ignore[union-attr]
        if isinstance(out, torch.Tensor) and isinstance(small, torch.Tensor) and small.numel() < out.numel():
            return x, gamma  # type: ignore[return-value]
    return None


def rewrite_by_rule(gm: fx.GraphModule, node: fx.Node, stream: set[fx.Node], constrained: set[fx.Node]) -> bool:
    """Rewrite ``node`` if it is a mean pool or a layer scale (see the module docstring); ``True`` if it was.

    A mean pool on the trunk is unconstrained (each direction scaled on its own), as the
    pass does for every twin there; off it, it keeps ``gmean``.
    """
    if _is_pool(node):
        dim, keepdim = _reduced_dims(node)  # type: ignore[misc]
        extra: dict[str, Any] = {} if node in constrained else {"constraint": None}
        node.op, node.target, node.args, node.kwargs = "call_function", U.mean, (node.args[0], dim, keepdim), extra
        return True
    operands = _layer_scale_operands(gm, node, stream)
    if operands is not None:
        node.op, node.target, node.args, node.kwargs = "call_function", U.layer_scale, operands, {}
        return True
    return False
