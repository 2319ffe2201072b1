"""The ``torch.fx`` vocabulary the unit-scaling pass is written in: op kinds, readers, paths, edits."""

from __future__ import annotations

import functools
import inspect
import operator
import os
import re
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

import torch
from torch import fx

import unitscale.functional as U
from unitscale.capture.toolkit import copy_origin
from unitscale.errors import ReplaceMapError
from unitscale.fx.nodes import (
    MODULE_PATH_KEY,
    SCALE_NEUTRAL_FUNCTIONS,
    SCALE_NEUTRAL_METHODS,
    SOURCE_KEY,
    VIEW_ATTRIBUTES,
    op_name,
)
from unitscale.transforms.aten import ATEN_NEUTRAL

# An op kind: its torch functions, and the method names a graph calls it by (``_is`` asks).
_Kind = tuple[set[Any], set[str]]
_ADD: _Kind = (
    {operator.add, operator.iadd, torch.add, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.__iadd__},
    {"add", "add_", "__add__", "__iadd__", "__radd__"},
)
_MUL: _Kind = ({operator.mul, torch.mul, torch.Tensor.mul}, {"mul", "__mul__", "__rmul__"})
_DIV: _Kind = (
    {operator.truediv, torch.div, torch.true_divide, torch.Tensor.div},
    {"div", "__truediv__", "true_divide"},
)

_SCALED = {getattr(U, name) for name in U.__all__ if callable(getattr(U, name))}


def _function_of(node: fx.Node) -> Any:
    """The callable a node runs (a method name becomes ``torch.Tensor.<name>``)."""
    if node.op == "call_function":
        return node.target
    if node.op == "call_method":
        return getattr(torch.Tensor, str(node.target), str(node.target))
    return None


def _location(node: fx.Node) -> str:
    source = str(node.meta.get(SOURCE_KEY) or "")
    if source:
        return f" at {os.path.basename(source)}"
    found = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    return f" at {os.path.basename(found[-1][0])}:{found[-1][1]}" if found else ""


def describe(node: fx.Node) -> str:
    """``"<op> (node <name>, module <path>) at <file>:<line>"`` for reports and errors (no module part at the root)."""
    path = node.meta.get(MODULE_PATH_KEY) or ""
    module = f", module {path}" if path else ""
    return f"{op_name(_function_of(node), qualified=True)} (node {node.name}{module}){_location(node)}"


def _takes_constraint(fn: Any) -> bool:
    try:
        return "constraint" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


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
    return isinstance(value, (list, tuple)) and any(_is_float_tensor(v) for v in value)


def _is_float_node(arg: Any) -> bool:
    return isinstance(arg, fx.Node) and _is_float_tensor(arg.meta.get("example_value"))


def _is(node: Any, kind: _Kind) -> bool:
    """Whether ``node`` calls an op of ``kind``: one of its functions, or a method of its names."""
    if not isinstance(node, fx.Node):
        return False
    if node.op == "call_method":
        return node.target in kind[1]
    return node.op == "call_function" and _member(node.target, kind[0])


def _ancestors(graph: fx.Graph) -> dict[fx.Node, set[fx.Node]]:
    result: dict[fx.Node, set[fx.Node]] = {}
    for node in graph.nodes:
        result[node] = set(node.all_input_nodes).union(*(result[parent] for parent in node.all_input_nodes))
    return result


def _argument_name(user: fx.Node, node: fx.Node) -> str | None:
    """The name of the parameter of ``user``'s function that ``node`` is passed as."""
    if user.op != "call_function":
        return None
    try:
        bound = inspect.signature(user.target).bind_partial(*user.args, **user.kwargs)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return next((name for name, value in bound.arguments.items() if value is node), None)


def _is_neutral(node: fx.Node) -> bool:
    """Whether ``node`` only reshapes, casts, views or moves data, keeping its input's scale."""
    fn = node.target
    if node.op == "call_method":
        return fn in SCALE_NEUTRAL_METHODS
    if node.op != "call_function":
        return False
    if fn is getattr:  # how fx and Dynamo write ``w.T``
        return len(node.args) == 2 and node.args[1] in VIEW_ATTRIBUTES
    if isinstance(fn, torch._ops.OpOverloadPacket):  # an aten op named by its packet (``aten.slice``)
        return any(_member(getattr(fn, name), ATEN_NEUTRAL) for name in fn.overloads())
    return _member(fn, SCALE_NEUTRAL_FUNCTIONS) or _member(fn, ATEN_NEUTRAL)


def _consumers(node: fx.Node) -> list[tuple[fx.Node, fx.Node]]:
    """``(op, argument)`` for every op that reads ``node``, looking through reshapes and casts."""
    found, todo, seen = [], [node], {node}
    while todo:
        current = todo.pop()
        for user in current.users:
            if _is_neutral(user) and not _member(user.target, _SCALED):
                if user not in seen:
                    seen.add(user)
                    todo.append(user)
            else:
                found.append((user, current))
    return found


def _is_scaled(node: fx.Node) -> bool:
    return node.op == "call_function" and (
        _member(node.target, _SCALED)
        or (isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "unitscale")
    )


def _attr(gm: fx.GraphModule, target: str) -> Any:
    return functools.reduce(getattr, target.split("."), gm)


def _is_parameter(gm: fx.GraphModule, node: Any) -> bool:
    """Whether ``node`` reads a parameter of ``gm``."""
    if not (isinstance(node, fx.Node) and node.op == "get_attr"):
        return False
    try:
        return isinstance(_attr(gm, str(node.target)), torch.nn.Parameter)
    except AttributeError:
        return False


def _activation_path(gm: fx.GraphModule) -> set[fx.Node]:
    """Nodes that read, directly or not, a float input or a parameter."""
    live: set[fx.Node] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            source = _is_float_tensor(node.meta.get("example_value"))
        elif node.op == "get_attr":
            source = _is_parameter(gm, node)
        else:
            source = any(parent in live for parent in node.all_input_nodes)
        if source:
            live.add(node)
    return live


def _stream(graph: fx.Graph, live: set[fx.Node]) -> set[fx.Node]:
    """The graph inputs and the live ops computing float tensors from them (``x.shape`` would empty the trunk)."""
    stream: set[fx.Node] = set()
    for node in graph.nodes:
        if node.op == "placeholder" or (
            node in live
            and any(p in stream for p in node.all_input_nodes)
            and ("example_value" not in node.meta or _is_float_tensor(node.meta["example_value"]))
        ):
            stream.add(node)
    return stream


def _trunk(graph: fx.Graph, live: set[fx.Node]) -> set[fx.Node]:
    """Ops every input-to-output path goes through: no edge of the stream sharing an input with them jumps over."""
    nodes = list(graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    from_input = _stream(graph, live)
    roots: dict[fx.Node, frozenset[fx.Node]] = {}
    reach: dict[fx.Node, int] = {}  # per graph input: how far the values computed from it are read
    trunk = set()
    for i, node in enumerate(nodes):
        if node not in from_input:
            continue
        if node.op == "placeholder":
            roots[node] = frozenset({node})
        else:
            roots[node] = frozenset().union(*(roots[p] for p in node.all_input_nodes if p in roots))
            if all(reach.get(root, -1) <= i for root in roots[node]):
                trunk.add(node)
        readers = [position[u] for u in node.users if u in from_input or u.op == "output"]
        for root in roots[node]:
            reach[root] = max([reach.get(root, -1), *readers])
    return trunk


def _constant_factor(node: fx.Node) -> tuple[fx.Node, float] | None:
    """``(x, c)`` if ``node`` is ``x * c``, ``c * x`` or ``x / c`` for a float tensor ``x`` and a number ``c``."""
    args = node.args[:2]
    numbers = [a for a in args if isinstance(a, (int, float)) and not isinstance(a, bool)]
    tensors = [a for a in args if _is_float_node(a)]
    if len(args) != 2 or len(numbers) != 1 or len(tensors) != 1 or numbers[0] == 0:
        return None
    if _is(node, _MUL):
        return tensors[0], float(numbers[0])  # type: ignore[return-value]
    if _is(node, _DIV) and args[0] is tensors[0] and not node.kwargs:
        return tensors[0], 1 / float(numbers[0])  # type: ignore[return-value]
    return None


def _producer(node: Any) -> Any:
    """The op that made ``node``, looking back through reshapes and casts."""
    while isinstance(node, fx.Node) and _is_neutral(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def _insert_after(where: fx.Node, fn: Any, args: tuple[Any, ...], name: str, like: fx.Node, value: Any) -> fx.Node:
    """Insert ``fn(*args)`` after ``where``, attributed to the module ``like`` came from."""
    with where.graph.inserting_after(where):
        node = where.graph.create_node("call_function", fn, args, {}, name=name)
    copy_origin(node, like)
    node.meta["example_value"] = value
    return node


def _scale_after(node: fx.Node, forward: float, backward: float, suffix: str) -> fx.Node:
    """Put ``U.scale(node, forward, backward)`` after ``node``, read by all that read ``node``."""
    value = node.meta.get("example_value")
    scaled = _insert_after(node, U.scale, (node, forward, backward), f"{node.name}_{suffix}", node, value)
    node.replace_all_uses_with(scaled, delete_user_cb=lambda user: user is not scaled)
    return scaled


def check_replacement(node: fx.Node, replacement: Any) -> None:
    """Raise ``ReplaceMapError`` when the graph is made, not when it runs, if ``replacement`` cannot take the call."""
    try:
        signature = inspect.signature(replacement)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    try:
        signature.bind(*node.args, **node.kwargs)
    except TypeError as e:
        op = getattr(_function_of(node), "__name__", str(node.target))
        call = ", ".join([*(str(a) for a in node.args), *(f"{k}={v!r}" for k, v in node.kwargs.items())])
        name = getattr(replacement, "__name__", repr(replacement))
        raise ReplaceMapError(
            f"unit_scale(replace=...): replace[{op!r}] = {name}{signature} cannot take the call "
            f"{op}({call}) of node {node.name!r} (module {node.meta.get('module_path', '')!r}): {e}; "
            f"give {name} the parameters of {op} (or *args, **kwargs)"
        ) from e
