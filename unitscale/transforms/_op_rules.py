"""The unit-scaling pass's rules that swap ops for their twins, unconstrained on the trunk (cut edges) alone."""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx

import unitscale.functional as U
from unitscale.transforms._graph import (
    _ADD,
    _DIV,
    _MUL,
    _constant_factor,
    _consumers,
    _function_of,
    _is,
    _is_float_node,
    _is_parameter,
    _lookup,
    _member,
    _producer,
    _scale_after,
    _takes_constraint,
    check_replacement,
)
from unitscale.transforms.pass_state import PassState
from unitscale.transforms.patterns import fold_patterns


def apply_replacements(state: PassState) -> None:
    """Make each node whose function is a key of ``unit_scale(replace=...)`` call its value (checked first)."""
    for node in list(state.graph.nodes):
        fn = _function_of(node)
        user_fn = _lookup(state.replace, fn) if fn is not None and node not in state.frozen else None
        if user_fn is not None:
            check_replacement(node, user_fn)
            state.retarget(node, user_fn)


def fold_written_out_ops(state: PassState) -> None:
    """Fold written-out composites (RMS norm, tanh GELU) into their twins (:func:`fold_patterns`)."""
    state.folded = fold_patterns(state.graph)
    state.done.update(state.folded)


def unconstrain_folded_on_trunk(state: PassState) -> None:
    """Give a folded twin on the trunk ``constraint=None``, as ``swap_ops`` does every twin there."""
    for node in state.folded:
        if node not in state.constrained and _takes_constraint(node.target):
            node.kwargs = {**node.kwargs, "constraint": None}


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
    """A mean over some dims (timm's ``x.mean((2, 3))``), not a statistic: no square's, nothing centres or roots it."""
    if not _member(_function_of(node), _MEANS) or not node.args or not _is_float_node(node.args[0]):
        return False
    if _reduced_dims(node) is None:
        return False
    made_by = _producer(node.args[0])
    square = _is(made_by, _MUL) and len(made_by.args) >= 2 and made_by.args[0] is made_by.args[1]
    if isinstance(made_by, fx.Node) and (_member(_function_of(made_by), _SQUARES) or square):
        return False
    return not any(_member(_function_of(user), _STATISTIC_READERS) for user in node.users)


def _layer_scale_operands(gm: fx.GraphModule, node: fx.Node, stream: set[fx.Node]) -> tuple[fx.Node, fx.Node] | None:
    """``(x, gamma)`` if ``node`` is ``x * gamma``: an activation times a parameter broadcast over it."""
    if not _is(node, _MUL) or len(node.args) != 2 or node.kwargs:
        return None
    a, b = node.args
    for x, gamma in ((a, b), (b, a)):
        if not (isinstance(x, fx.Node) and x in stream and _is_float_node(x) and _is_float_node(gamma)):
            continue
        if gamma in stream or not _is_parameter(gm, _producer(gamma)):
            continue
        out, small = node.meta.get("example_value"), gamma.meta.get("example_value")  # type: ignore[union-attr]
        if isinstance(out, torch.Tensor) and isinstance(small, torch.Tensor) and small.numel() < out.numel():
            return x, gamma  # type: ignore[return-value]
    return None


def _scale_add(state: PassState, node: fx.Node) -> bool:
    """An add of two float tensors, or of a tensor and a number, becomes :func:`~unitscale.functional.add`.

    A broadcast one keeps ``gmean`` where its operands meet upstream (a GRU's ``out + h[-1]``).
    """
    if not _is(node, _ADD):
        return False
    a, b = (node.args[0], node.args[1]) if len(node.args) >= 2 else (None, None)
    if _is_float_node(a) and _is_float_node(b):
        meet = _is_broadcast_product(node) and _meet_upstream(a, b, state)
        state.retarget(node, U.add, **({} if meet else {"constraint": None}))
    elif any(
        _is_float_node(t) and type(n) in (int, float) and not _is_parameter(state.gm, _producer(t))
        for t, n in ((a, b), (b, a))
    ):
        state.retarget(node, U.add, constraint=None)
    return True


def _scale_product(state: PassState, node: fx.Node) -> bool:
    """A broadcast product of activations becomes :func:`~unitscale.functional.mul`; one of one shape is kept."""
    if not _is_product_of_activations(node, state.stream):
        return False
    if _is_broadcast_product(node):
        state.retarget(node, U.mul, constraint="to_output_scale")
        node.args = tuple(node.args[:2])
    else:
        state.kept[node] = "product of two activations (unit std times unit std stays unit std)"
    return True


_BERNOULLI: set[Any] = {torch.bernoulli, torch.Tensor.bernoulli, torch.Tensor.bernoulli_}
_DIVIDE: set[Any] = _DIV[0] | {torch.Tensor.div_}  # torchvision's ``noise.div_(q)``


def _keep_mask(mask: Any) -> tuple[float, list[fx.Node]] | None:
    """``(c / q**0.5, its nodes)`` for a random keep mask ``bernoulli(q) / c`` (``c`` a number or 1), else ``None``."""
    divisor, nodes = 1.0, []
    if isinstance(mask, fx.Node) and _member(_function_of(mask), _DIVIDE) and len(mask.args) == 2:
        if not (isinstance(mask.args[1], (int, float)) and mask.args[1] > 0):
            return None
        nodes.append(mask)
        mask, divisor = mask.args[0], float(mask.args[1])
    if not (isinstance(mask, fx.Node) and _member(_function_of(mask), _BERNOULLI)):
        return None
    q = mask.args[1] if len(mask.args) > 1 else mask.kwargs.get("p")
    if not (isinstance(q, (int, float)) and 0 < q <= 1):
        return None
    # the tensor the draws fill (``x.new_empty(shape)``), read by nothing else
    return divisor / q**0.5, [*nodes, mask, *(n for n in mask.all_input_nodes if set(n.users) == {mask})]


def _scale_random_mask(state: PassState, node: fx.Node) -> bool:
    """``x * bernoulli(q) / c`` is scaled by ``c / q**0.5`` both ways, else eval-mode batch norms shrink the stream."""
    found = [m for m in map(_keep_mask, node.args) if m is not None] if _is(node, _MUL) else []
    leaf = _stochastic_depth_leaf(node)
    if leaf is not None:
        found = [(leaf, [])]
    elif len(node.args) != 2 or len(found) != 1:
        return False
    factor, nodes = found[0]
    state.done.update({node, *nodes, _scale_after(node, factor, factor, "of_mask")})
    return True


def _stochastic_depth_leaf(node: fx.Node) -> float | None:
    """``(1 - p)**0.5`` for torchvision's ``stochastic_depth(x, p, mode, True)``, known by name, else ``None``."""
    fn = node.target if node.op == "call_function" else None
    name = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    if name != "torchvision.ops.stochastic_depth.stochastic_depth" or len(node.args) != 4:
        return None
    p, training = node.args[1], node.args[3]
    return (1 - p) ** 0.5 if training is True and isinstance(p, (int, float)) and 0 <= p < 1 else None


def _scale_pool(state: PassState, node: fx.Node) -> bool:
    """A mean pool becomes :func:`~unitscale.functional.mean`: unconstrained on the trunk, ``gmean`` off it."""
    if not _is_pool(node):
        return False
    dim, keepdim = _reduced_dims(node)  # type: ignore[misc]
    extra: dict[str, Any] = {} if node in state.constrained else {"constraint": None}
    node.op, node.target, node.args, node.kwargs = "call_function", U.mean, (node.args[0], dim, keepdim), extra
    state.done.add(node)
    return True


def _scale_layer_scale(state: PassState, node: fx.Node) -> bool:
    """``x * gamma``, ``gamma`` a parameter broadcast over ``x``, becomes :func:`~unitscale.functional.layer_scale`."""
    operands = _layer_scale_operands(state.gm, node, state.stream)
    if operands is None:
        return False
    node.op, node.target, node.args, node.kwargs = "call_function", U.layer_scale, operands, {}
    state.done.add(node)
    return True


def _swap_twin(state: PassState, node: fx.Node) -> bool:
    """An op of ``torch_map`` becomes its twin, with ``constraint=None`` on the trunk."""
    twin = _lookup(state.torch_map, _function_of(node))
    if twin is None:
        return False
    unconstrained = node not in state.constrained and _takes_constraint(twin)
    extra: dict[str, Any] = {"constraint": None} if unconstrained else {}
    if twin is U.batch_norm:
        extra.update(_batch_count(node))
    state.retarget(node, twin, **extra)
    return True


def _batch_count(node: fx.Node) -> dict[str, fx.Node]:
    """``num_batches_tracked=`` the buffer beside a batch norm's running mean, read last before ``node``."""
    mean = node.args[1] if len(node.args) > 1 else node.kwargs.get("running_mean")
    if not isinstance(mean, fx.Node) or mean.op != "get_attr" or not str(mean.target).endswith("running_mean"):
        return {}
    target = str(mean.target)[: -len("running_mean")] + "num_batches_tracked"
    count = None
    for other in node.graph.nodes:
        if other is node:
            break
        if other.op == "get_attr" and other.target == target:
            count = other
    return {} if count is None else {"num_batches_tracked": count}


def swap_ops(state: PassState) -> None:
    """Swap each open op for its twin: adds, random masks, products, pools, layer scales, then ``torch_map``."""
    claims = (_scale_add, _scale_random_mask, _scale_product, _scale_pool, _scale_layer_scale, _swap_twin)
    for node in list(state.graph.nodes):
        if state.is_open(node):
            any(claim(state, node) for claim in claims)


# Unit-scaled ops whose output only changes by a factor, or not at all, when an input does.
_HOMOGENEOUS: set[Any] = {U.linear, U.matmul, U.addmm, U.conv2d, U.layer_norm, U.rms_norm}


def drop_constant_factors(state: PassState) -> None:
    """Turn ``x * c`` into ``sign(c) * x`` where unit scaling already sets the scale the constant sets.

    That is where only linear layers and norms read it (T5's ``d_model ** -0.5``), at the output
    (Cohere's ``logits * 0.0625``), or after a unit-scaled matmul over ``d`` with ``c = d**-0.5``.
    """
    for node in list(state.graph.nodes):
        found = _constant_factor(node) if node in state.live else None
        if found is None or node in state.done or node in state.kept:
            continue
        x, factor = found
        readers = [user for user, _ in _consumers(node)]
        homogeneous = all(user.op == "call_function" and _member(user.target, _HOMOGENEOUS) for user in readers)
        output = all(user.op == "output" for user in readers)
        if readers and (homogeneous or output or _repeats_matmul_scale(x, factor)):
            sign = 1.0 if factor > 0 else -1.0
            node.op, node.target, node.args, node.kwargs = "call_function", U.scale, (x, sign, sign), {}
            state.done.add(node)


def _repeats_matmul_scale(x: fx.Node, factor: float) -> bool:
    """Whether ``x`` is a unit-scaled matmul over ``d`` elements and ``factor`` is ``d**-0.5``."""
    if not (x.op == "call_function" and x.target is U.matmul and len(x.args) >= 2):
        return False
    left = x.args[0].meta.get("example_value") if isinstance(x.args[0], fx.Node) else None
    if not isinstance(left, torch.Tensor) or left.dim() == 0:
        return False
    return abs(factor * left.shape[-1] ** 0.5 - 1) < 1e-3


def _is_product_of_activations(node: fx.Node, stream: set[fx.Node]) -> bool:
    """``a * b`` for two activations computed from the inputs (not a gain computed from a parameter)."""
    if not _is(node, _MUL) or len(node.args) < 2:
        return False
    a, b = node.args[0], node.args[1]
    if a is b:  # a square is not a product of independent factors
        return False
    return all(isinstance(x, fx.Node) and x in stream and _is_float_node(x) for x in (a, b))


def _meet_upstream(a: Any, b: Any, state: PassState) -> bool:
    """Whether two activations' gradients meet again upstream (they share an op of the stream)."""
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)):
        return False
    shared = ({a} | state.ancestors.get(a, set())) & ({b} | state.ancestors.get(b, set())) & state.stream
    return any(_is_float_node(n) for n in shared)  # token ids carry no gradient


def _is_broadcast_product(node: fx.Node) -> bool:
    """A product of activations where one is broadcast over the other (a squeeze-excitation gate)."""
    out = node.meta.get("example_value")
    values = [a.meta.get("example_value") for a in node.args[:2] if isinstance(a, fx.Node)]
    if not isinstance(out, torch.Tensor) or len(values) != 2 or node.kwargs:
        return False
    return any(isinstance(v, torch.Tensor) and v.numel() < out.numel() for v in values)
