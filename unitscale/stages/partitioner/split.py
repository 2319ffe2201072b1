"""Turning a node -> stage assignment into modules: one split module, or a chain of stages.

Two kinds of non-tensor value never cross a stage boundary: a model input whose example value is a
constant (later stages have it baked in), and a symbolic size of an exported graph (each stage
recomputes it from a tensor it receives). A stage that calls a custom op carries the names of the
modules that define it (:func:`op_libraries`): unpickling the stage imports them first.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn
from torch._library.custom_ops import OPDEFS
from torch.fx.graph import _PyTreeCodeGen
from torch.fx.passes.split_module import split_module
from torch.utils._pytree import tree_leaves

from unitscale.fx.nodes import COMPUTE_OPS

__all__ = [
    "INPUT_CONSTANT_KEY",
    "bake_constant_inputs",
    "constant_inputs",
    "op_libraries",
    "is_constant",
    "is_symbolic",
    "symbol_of",
    "tensor_carries",
    "live_values",
    "split_graph",
    "chain_stages",
]

#: ``node.meta`` key of a placeholder whose example value is a constant (the value itself).
INPUT_CONSTANT_KEY = "stage_input_constant"

_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout)
_SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_constant(value: Any) -> bool:
    """Whether a model input is a constant that every stage may hold as it is (``None``, a bool, ...).

    >>> is_constant(None), is_constant((1, "a")), is_constant(torch.zeros(1))
    (True, True, False)
    """
    if isinstance(value, (tuple, list)):
        return all(is_constant(v) for v in value)
    return isinstance(value, _CONSTANT_TYPES)


def is_symbolic(node: fx.Node) -> bool:
    """Whether ``node`` is a size of a dynamic dimension (or arithmetic on sizes) that a stage can
    recompute: ``aten.sym_size.int`` of a tensor, or an op whose inputs are all such sizes."""
    if not isinstance(node.meta.get("val"), _SYMBOLIC_TYPES):
        return False
    if node.target is torch.ops.aten.sym_size.int:
        return True
    return node.op == "call_function" and all(is_symbolic(a) for a in node.all_input_nodes)


def symbol_of(node: fx.Node) -> Any:
    """The sympy expression of a ``sym_size`` node's value."""
    return node.meta["val"].node.expr


def tensor_carries(tensor: fx.Node, expr: Any) -> int | None:
    """The dimension of ``tensor`` whose size is the symbol ``expr``, if any."""
    value = tensor.meta.get("val")
    for d, size in enumerate(getattr(value, "shape", ()) if isinstance(value, torch.Tensor) else ()):
        if isinstance(size, torch.SymInt) and size.node.expr == expr:
            return d
    return None


def _stays(node: fx.Node) -> bool:
    """Values that never cross a boundary: each stage has them (constant inputs) or remakes them."""
    return INPUT_CONSTANT_KEY in node.meta or is_symbolic(node)


class StageTracer(fx.Tracer):
    """Tracer that unpickling a stage uses to rebuild it: buffers stay ``get_attr`` nodes."""

    proxy_buffer_attributes = True


def _stage_of(node: fx.Node, assignment: Mapping[str, int], num_stages: int) -> int:
    if node.op == "placeholder":
        return -1
    if node.op == "output":
        return num_stages
    return assignment[node.name]


def live_values(graph: fx.Graph, assignment: Mapping[str, int], num_stages: int) -> list[list[fx.Node]]:
    """``live[s]``: values (placeholders or computed nodes) made at or before stage ``s`` and used after it.

    ``live[num_stages - 1]`` holds the values the output needs; ``get_attr`` nodes never cross.
    """
    live: list[list[fx.Node]] = [[] for _ in range(num_stages)]
    for node in graph.nodes:
        if node.op not in ("placeholder", *COMPUTE_OPS) or not node.users or _stays(node):
            continue
        made = _stage_of(node, assignment, num_stages)
        last = max(_stage_of(u, assignment, num_stages) for u in node.users)
        for s in range(max(made, 0), min(last, num_stages)):
            live[s].append(node)
    return live


def _place(sub: nn.Module, target: str, value: Any) -> str:
    """Put ``value`` into ``sub`` under its original qualified name where that is free (so a
    stage's ``named_parameters()`` name them as the model does), else under a flat new name."""
    *path, name = target.split(".")
    owner = sub
    for part in path:
        child = owner._modules.get(part)
        if child is None and not hasattr(owner, part):
            child = nn.Module()
            owner.add_module(part, child)
        # only walk through the empty holders split_module makes, never into a real module
        if child is None or type(child) is not nn.Module:
            return _place_flat(sub, target.replace(".", "_"), value)
        owner = child
    if hasattr(owner, name):
        return target if getattr(owner, name) is value else _place_flat(sub, target.replace(".", "_"), value)
    _register(owner, name, value)
    return target


def _place_flat(sub: nn.Module, local: str, value: Any) -> str:
    while hasattr(sub, local):
        local += "_"
    _register(sub, local, value)
    return local


def _register(owner: nn.Module, name: str, value: Any) -> None:
    if isinstance(value, nn.Parameter):
        owner.register_parameter(name, value)
    elif isinstance(value, torch.Tensor):
        owner.register_buffer(name, value)
    else:
        setattr(owner, name, value)


def _move_get_attrs(split: fx.GraphModule) -> None:
    """Move each root ``get_attr`` into every submodule that uses it (shared ones into each)."""
    for attr_node in [n for n in split.graph.nodes if n.op == "get_attr"]:
        path, _, name = str(attr_node.target).rpartition(".")
        owner = split.get_submodule(path)
        value = getattr(owner, name)
        for user in list(attr_node.users):
            sub = split.get_submodule(user.target)
            assert isinstance(sub, fx.GraphModule)
            position = user.args.index(attr_node)
            placeholder = [n for n in sub.graph.nodes if n.op == "placeholder"][position]
            local = _place(sub, str(attr_node.target), value)
            first_compute = next(n for n in sub.graph.nodes if n.op != "placeholder")
            with sub.graph.inserting_before(first_compute):
                got = sub.graph.get_attr(local)
            got.meta = dict(placeholder.meta)
            placeholder.replace_all_uses_with(got)
            sub.graph.erase_node(placeholder)
            sub.recompile()
            user.args = tuple(a for a in user.args if a is not attr_node)
        split.graph.erase_node(attr_node)
        if hasattr(owner, name):
            delattr(owner, name)
    split.delete_all_unused_submodules()
    split.recompile()


def split_graph(module: fx.GraphModule, assignment: Mapping[str, int]) -> fx.GraphModule:
    """``split_module`` with a pure-lookup callback, then weights moved into their stages."""
    split = split_module(module, module, lambda node: assignment[node.name])
    _move_get_attrs(split)
    if isinstance(module.graph._codegen, _PyTreeCodeGen):
        # an exported graph takes and returns pytrees (a ModelOutput, ...): so does its split
        split.graph._codegen = module.graph._codegen
        split.recompile()
    return split


def _recompute(g: fx.Graph, node: fx.Node, env: dict[fx.Node, Any], tensors: list[fx.Node], stage: int) -> fx.Node:
    """Remake the symbolic size ``node`` in stage graph ``g`` from a tensor the stage has."""
    if node in env:
        return env[node]
    if node.target is torch.ops.aten.sym_size.int:
        expr = symbol_of(node)
        for t in tensors:
            d = tensor_carries(t, expr)
            if d is not None and t in env:
                made = g.call_function(torch.ops.aten.sym_size.int, (env[t], d))
                break
        else:
            raise ValueError(f"stage {stage} has no tensor with the size {expr} that node {node.name!r} reads")
    else:
        made = g.node_copy(node, lambda a: _recompute(g, a, env, tensors, stage))
    made.meta = dict(node.meta)
    env[node] = made
    return made


def _lookup(g: fx.Graph, env: dict[fx.Node, Any], tensors: list[fx.Node], stage: int, arg: fx.Node) -> Any:
    """``arg`` inside stage graph ``g``: its own weights are fetched, symbolic sizes remade."""
    if arg not in env and arg.op == "get_attr":
        env[arg] = g.node_copy(arg)
    if arg not in env and is_symbolic(arg):
        return _recompute(g, arg, env, tensors, stage)
    return env[arg]


def chain_stages(module: fx.GraphModule, assignment: Mapping[str, int], num_stages: int) -> list[fx.GraphModule]:
    """One module per stage; stage ``s + 1`` takes stage ``s``'s outputs as its positional inputs.

    Stage 0 takes the graph's own (flattened) inputs. A stage returns one value as is, several as a
    tuple; the last stage returns the leaves of the model's output.
    """
    graph = module.graph
    live = live_values(graph, assignment, num_stages)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next(n for n in graph.nodes if n.op == "output")
    stages = []
    for s in range(num_stages):
        g = fx.Graph(tracer_cls=StageTracer)
        env: dict[fx.Node, Any] = {}
        if s == 0:
            env.update({p: g.node_copy(p) for p in placeholders})
        else:
            env.update({p: p.meta[INPUT_CONSTANT_KEY] for p in placeholders if INPUT_CONSTANT_KEY in p.meta})
            for v in live[s - 1]:
                received = g.placeholder(v.name)
                order = _dense_order(v)
                if order:  # sent as a contiguous permutation of itself: the same strides again, no copy
                    received.meta = {k: x for k, x in v.meta.items() if k not in ("val", "tensor_meta")}
                    received = g.call_method("permute", (received, tuple(order.index(d) for d in range(len(order)))))
                env[v] = received
                env[v].meta = dict(v.meta)
        tensors = list(placeholders if s == 0 else live[s - 1])
        lookup = functools.partial(_lookup, g, env, tensors, s)

        for node in graph.nodes:
            if node.op not in COMPUTE_OPS or assignment[node.name] != s:
                continue
            env[node] = g.node_copy(node, lookup)
            tensors.append(node)
        if s == num_stages - 1:
            outs = [fx.graph.map_arg(leaf, lookup) for leaf in tree_leaves(output.args[0])]
        else:
            outs = [_sendable(g, env[v], v) for v in live[s]]
        g.output(outs[0] if len(outs) == 1 else tuple(outs))
        stage = fx.GraphModule(module, g, f"{type(module).__name__}Stage{s}")
        libraries = op_libraries(stage)
        if libraries:
            stage.__dict__["_unitscale_op_libraries"] = _OpLibraries(libraries)  # pickled before the code (module doc)
        stages.append(stage)
    return stages


def constant_inputs(graph: fx.Graph) -> dict[int, Any]:
    """Position -> value of the graph's inputs whose example value was a constant (``attn_mask=None``)."""
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    return {i: p.meta[INPUT_CONSTANT_KEY] for i, p in enumerate(placeholders) if INPUT_CONSTANT_KEY in p.meta}


def bake_constant_inputs(stage: fx.GraphModule) -> fx.GraphModule:
    """``stage`` (a first stage) without the inputs whose example value was a constant: it uses the
    constant instead, as later stages do. A pipeline stage sends and receives tensors only.

    >>> import torch
    >>> from unitscale import partition
    >>> from unitscale.stages.partitioner.split import bake_constant_inputs
    >>> class Scaled(torch.nn.Module):
    ...     def forward(self, x, scale=None):
    ...         return x * 2 if scale is None else x * scale
    >>> first = partition(Scaled(), 1, (torch.ones(2), None)).stage_modules()[0]
    >>> bake_constant_inputs(first)(torch.ones(2))
    tensor([2., 2.])
    """
    g = fx.Graph(tracer_cls=StageTracer)
    env: dict[fx.Node, Any] = {}
    for node in stage.graph.nodes:
        if node.op == "placeholder" and INPUT_CONSTANT_KEY in node.meta:
            env[node] = node.meta[INPUT_CONSTANT_KEY]
        else:
            env[node] = g.node_copy(node, lambda n: env[n])
    baked = fx.GraphModule(stage, g, type(stage).__name__)
    if "_unitscale_op_libraries" in stage.__dict__:
        baked.__dict__["_unitscale_op_libraries"] = stage.__dict__["_unitscale_op_libraries"]
    return baked


def _dense_order(v: fx.Node) -> list[int] | None:
    """How a value crossing a cut is sent: ``[]`` as it is, the dimension order that lays it out
    contiguously without a copy, or ``None`` (only a copy makes it contiguous: a slice with gaps)."""
    example = v.meta.get("val", v.meta.get("tensor_meta"))
    shape, stride = getattr(example, "shape", None), getattr(example, "stride", None)
    if shape is None or stride is None:
        return []
    try:
        sizes = [_hint(x) for x in shape]
        steps = [_hint(x) for x in (stride() if callable(stride) else stride)]
    except (TypeError, ValueError):
        return []  # a size with no example value: sent as the stage makes it
    layout = torch.empty_strided(sizes, steps, device="meta")
    if layout.is_contiguous():
        return []
    order = sorted(range(len(sizes)), key=lambda d: -steps[d])
    return order if layout.permute(order).is_contiguous() else None


def _hint(size: Any) -> int:
    """An int size or stride, or a symbolic one's example value (``TypeError`` if it has none)."""
    if isinstance(size, torch.SymInt):
        hint = size.node.hint
        if hint is None:
            raise TypeError("a symbolic size without an example value")
        return int(hint)
    return int(size)


def _sendable(g: fx.Graph, value: Any, v: fx.Node) -> Any:
    """``value`` made contiguous for Gloo: a dense view is sent permuted (no copy) and permuted back by
    the next stage, so it computes on the model's very strides (bit-exact); anything else is copied."""
    if not isinstance(value, fx.Node):
        return value
    order = _dense_order(v)
    if order == []:
        return value
    node = g.call_method("permute", (value, tuple(order))) if order else g.call_method("contiguous", (value,))
    node.meta = {k: x for k, x in value.meta.items() if k not in ("val", "tensor_meta")}
    return node


def op_libraries(module: nn.Module) -> list[str]:
    """The Python modules that define the custom ops ``module``'s graphs call (``torch.library.custom_op``).

    A fresh interpreter knows an op such as ``torch.ops.transformers.grouped_mm_fallback``
    only once its defining module is imported; torch's own ops need nothing.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.stages.partitioner.split import op_libraries
    >>> @torch.library.custom_op("unitscale_doc::twice", mutates_args=())
    ... def twice(x: torch.Tensor) -> torch.Tensor:
    ...     return 2 * x
    >>> g = fx.Graph()
    >>> x = g.placeholder("x")
    >>> relu = g.call_function(torch.relu, (x,))
    >>> _ = g.output(g.call_function(torch.ops.unitscale_doc.twice.default, (relu,)))
    >>> op_libraries(fx.GraphModule(torch.nn.Module(), g)) == [__name__]
    True
    """
    found: list[str] = []
    for sub in module.modules():
        graph = getattr(sub, "graph", None)
        if not isinstance(graph, fx.Graph):
            continue
        for node in graph.nodes:
            schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
            definition = OPDEFS.get(schema.name) if schema is not None else None
            where = getattr(getattr(definition, "_init_fn", None), "__module__", None)
            if where and where not in found:
                found.append(where)
    return found


def _import_all(names: list[str]) -> _OpLibraries:
    for name in names:
        if name not in ("__main__", "__mp_main__"):
            importlib.import_module(name)
    return _OpLibraries(names)


class _OpLibraries:
    """Module names that unpickle by importing those modules (a stage's custom ops, defined on import)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names

    def __reduce__(self) -> tuple[Any, ...]:
        return _import_all, (self.names,)
