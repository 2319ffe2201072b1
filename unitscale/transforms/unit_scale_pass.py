"""The graph pass behind :func:`unitscale.unit_scale`.

On a TorchDynamo graph (see :mod:`unitscale.transforms.dynamo`):

1. user replacements first: a node whose function is a key of ``replace`` calls the value;
2. residual adds, found by dependency analysis (an add where one operand is an ancestor
   of the other: the ancestor is the skip connection, the other the branch), become
   ``residual_split`` at the skip and ``residual_add`` at the join, with ``tau = 0.01``
   when the branch holds attention (softmax or scaled dot-product attention) and 0.5
   otherwise; every other add of two float tensors becomes an unconstrained ``U.add``;
3. every other op found in :data:`unitscale.scaling.functional.torch_map` becomes its twin, with
   ``constraint=None`` after the last residual add (no gradient flows back into a branch
   point from there, so the two directions may be scaled independently);
4. the ops left as they were, other than ones that move data without changing its scale
   (reshapes, indexing, concatenation, ...) or produce no float tensor, are listed in
   ``graph_module.meta["unscaled_ops"]``.
"""

from __future__ import annotations

import inspect
import operator
import os
import re
from collections.abc import Callable, Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import unitscale.scaling.functional as U
from unitscale.fx.nodes import SCALE_NEUTRAL_FUNCTIONS, SCALE_NEUTRAL_METHODS, op_name

__all__ = ["UnitScalePass"]

_ADDS: set[Any] = {operator.add, operator.iadd, torch.add, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.__iadd__}
_ADD_METHODS = {"add", "add_", "__add__", "__iadd__", "__radd__"}
_ATTENTION: set[Any] = {F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax, U.softmax}
_ATTENTION |= {U.scaled_dot_product_attention}

_SCALED = {getattr(U, name) for name in U.__all__ if callable(getattr(U, name))}


def _function_of(node: fx.Node) -> Any:
    """The callable a node runs (a method name becomes ``torch.Tensor.<name>``)."""
    if node.op == "call_function":
        return node.target
    if node.op == "call_method":
        return getattr(torch.Tensor, str(node.target), str(node.target))
    return None


def _lookup(table: Mapping[Any, Any], fn: Any) -> Any:
    try:
        return table.get(fn)
    except TypeError:  # an unhashable target
        return None


def _member(fn: Any, group: AbstractSet[Any]) -> bool:
    try:
        return fn in group
    except TypeError:  # an unhashable target
        return False


def _is_float_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return value.is_floating_point()
    if isinstance(value, (list, tuple)):
        return any(_is_float_tensor(v) for v in value)
    return False


def _is_float_node(arg: Any) -> bool:
    return isinstance(arg, fx.Node) and _is_float_tensor(arg.meta.get("example_value"))


def _is_add(node: fx.Node) -> bool:
    if node.op == "call_method":
        return node.target in _ADD_METHODS
    return node.op == "call_function" and _member(node.target, _ADDS)


def _location(node: fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    found = re.findall(r'File "([^"]+)", line (\d+)', trace)
    if not found:
        return ""
    path, line = found[-1]
    return f" at {os.path.basename(path)}:{line}"


def describe(node: fx.Node) -> str:
    """``"<op> (node <name>) at <file>:<line>"`` for reports and errors."""
    return f"{op_name(_function_of(node), qualified=True)} (node {node.name}){_location(node)}"


def _ancestors(graph: fx.Graph) -> dict[fx.Node, set[fx.Node]]:
    result: dict[fx.Node, set[fx.Node]] = {}
    for node in graph.nodes:
        mine: set[fx.Node] = set()
        for parent in node.all_input_nodes:
            mine.add(parent)
            mine |= result[parent]
        result[node] = mine
    return result


def _takes_constraint(fn: Callable[..., Any]) -> bool:
    try:
        return "constraint" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


_NORM_FUNCTIONS: set[Any] = {F.layer_norm, U.layer_norm, F.group_norm, F.batch_norm, F.instance_norm, F.rms_norm}


def _argument_name(user: fx.Node, node: fx.Node) -> str | None:
    """The name of the parameter of ``user``'s function that ``node`` is passed as."""
    if user.op != "call_function":
        return None
    try:
        bound = inspect.signature(user.target).bind_partial(*user.args, **user.kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return next((name for name, value in bound.arguments.items() if value is node), None)


@torch.no_grad()
def unit_init_(gm: fx.GraphModule) -> None:
    """Re-initialise the parameters a graph reads, by the role the graph gives them.

    A parameter passed as ``bias`` or added to a tensor is zeroed; one passed as the
    ``weight`` of a norm is set to 1; every other (weights, embeddings) is drawn
    from ``N(0, 1)``. Roles come from the graph, so ``self.b1`` in a functional model is
    a bias as much as ``nn.Linear.bias`` is.
    """
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        param = gm
        for atom in str(node.target).split("."):
            param = getattr(param, atom)
        if not isinstance(param, torch.nn.Parameter):
            continue
        roles = {
            _argument_name(user, node) if not _is_add(user) and user.target is not U.add else "bias"
            for user in node.users
        }
        if "bias" in roles:
            param.zero_()
        elif "weight" in roles and any(_member(user.target, _NORM_FUNCTIONS) for user in node.users):
            param.fill_(1.0)
        else:
            param.normal_()


def _insert_after(where: fx.Node, fn: Any, args: tuple[Any, ...], name: str, like: fx.Node, value: Any) -> fx.Node:
    """Insert ``fn(*args)`` after ``where``, attributed to the module ``like`` came from."""
    with where.graph.inserting_after(where):
        node = where.graph.create_node("call_function", fn, args, {}, name=name)
    for key in ("nn_module_stack", "stack_trace"):
        if key in like.meta:
            node.meta[key] = like.meta[key]
    node.meta["example_value"] = value
    return node


class UnitScalePass:
    """Rewrites a captured graph into its unit-scaled form (see the module docstring).

    Args:
        replace: user replacements, looked up before :data:`unitscale.scaling.functional.torch_map`.
        torch_map: the default map (torch function -> unit-scaled twin).
    """

    __name__ = "unit_scale"

    def __init__(self, replace: Mapping[Any, Callable[..., Any]], torch_map: Mapping[Any, Callable[..., Any]]) -> None:
        self.replace = dict(replace)
        self.torch_map = dict(torch_map)
        self.initialised = False

    def __call__(self, gm: fx.GraphModule) -> fx.GraphModule:
        graph = gm.graph
        ancestors = _ancestors(graph)
        done: set[fx.Node] = set()
        for node in list(graph.nodes):
            fn = _function_of(node)
            user_fn = _lookup(self.replace, fn) if fn is not None else None
            if user_fn is not None:
                self._retarget(node, user_fn, {})
                done.add(node)
        residuals = self._residual_adds(graph, ancestors, done)
        # Residual adds are found in graph order: the last one found is the last one run.
        before_last = ancestors[residuals[-1]] | {residuals[-1]} if residuals else set()
        for node in list(graph.nodes):
            if node in done or node.op not in ("call_function", "call_method"):
                continue
            if _is_add(node):
                if len(node.args) >= 2 and _is_float_node(node.args[0]) and _is_float_node(node.args[1]):
                    self._retarget(node, U.add, {"constraint": None})
                    done.add(node)
                continue
            twin = _lookup(self.torch_map, _function_of(node))
            if twin is None:
                continue
            extra = {"constraint": None} if node not in before_last and _takes_constraint(twin) else {}
            self._retarget(node, twin, extra)
            done.add(node)
        gm.meta["unscaled_ops"] = [describe(n) for n in graph.nodes if self._left_unscaled(n, done)]
        if not self.initialised:
            unit_init_(gm)
            self.initialised = True
        graph.lint()
        gm.recompile()
        return gm

    @staticmethod
    def _retarget(node: fx.Node, fn: Callable[..., Any], extra_kwargs: dict[str, Any]) -> None:
        node.op = "call_function"
        node.target = fn
        node.kwargs = {**node.kwargs, **extra_kwargs}

    @staticmethod
    def _residual_adds(graph: fx.Graph, ancestors: dict[fx.Node, set[fx.Node]], done: set[fx.Node]) -> list[fx.Node]:
        found = []
        for node in list(graph.nodes):
            if node in done or not _is_add(node) or len(node.args) < 2 or node.kwargs.get("alpha", 1) != 1:
                continue
            a, b = node.args[0], node.args[1]
            if not (isinstance(a, fx.Node) and isinstance(b, fx.Node) and _is_float_node(a) and _is_float_node(b)):
                continue
            if a in ancestors[b]:
                skip, branch = a, b
            elif b in ancestors[a]:
                skip, branch = b, a
            else:
                continue
            body = {n for n in ancestors[branch] | {branch} if skip in ancestors[n]}
            tau = 0.01 if any(_member(_function_of(n), _ATTENTION) for n in body) else 0.5
            value = skip.meta.get("example_value")
            split = _insert_after(skip, U.residual_split, (skip, tau), f"{skip.name}_split", node, (value, value))
            to_branch = _insert_after(split, operator.getitem, (split, 0), f"{skip.name}_residual", node, value)
            to_skip = _insert_after(to_branch, operator.getitem, (split, 1), f"{skip.name}_skip", node, value)
            for user in list(skip.users):
                if user in body:
                    user.replace_input_with(skip, to_branch)
            node.op, node.target, node.args, node.kwargs = "call_function", U.residual_add, (branch, to_skip, tau), {}
            done.update({node, split, to_branch, to_skip})
            found.append(node)
        return found

    def _left_unscaled(self, node: fx.Node, done: set[fx.Node]) -> bool:
        if node in done or node.op not in ("call_function", "call_method", "call_module"):
            return False
        if not _is_float_tensor(node.meta.get("example_value")):
            return False
        fn = _function_of(node)
        if node.op == "call_method" and node.target in SCALE_NEUTRAL_METHODS:
            return False
        if _member(fn, SCALE_NEUTRAL_FUNCTIONS) or _member(fn, _SCALED):
            return False
        return not (isinstance(fn, torch._ops.OpOverload) and fn.namespace == "unitscale")
