"""Tracing a model for partitioning and measuring a cost for each of its nodes.

:func:`trace_for_stages` traces a *copy* of the model with
:class:`~unitscale.fx.tracers.ModulePathTracer` (so nodes know their module path and
the user's module is never touched). :func:`_graph_for_stages` is the one place that
picks a graph for partitioning: a given :class:`~torch.fx.GraphModule` as it is, else
that fx trace, else ``torch.export`` (non-strict, dynamic batch dimension). Every node
then carries ``meta["module_path"]``. :class:`NodeProfiler` is an
interpreter that records each node's output shapes (as ``ShapeProp`` does) and
also counts FLOPs or times each node. :func:`node_costs` turns either into one
number per node.
"""

from __future__ import annotations

import copy
import math
import re
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.fx.node import map_aggregate
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils.flop_counter import FlopCounterMode

from unitscale.errors import CostError, InputError, NotAModuleError, TraceError
from unitscale.fx.nodes import COMPUTE_OPS, MODULE_PATH_KEY
from unitscale.fx.trace_errors import trace_error
from unitscale.fx.tracers import ModulePathTracer
from unitscale.stages.split import INPUT_CONSTANT_KEY, is_constant

__all__ = ["COST_MODELS", "NodeProfiler", "trace_for_stages", "run_profiler", "node_costs", "output_bytes"]

COST_MODELS = ("params", "flops", "time", "memory")


def trace_for_stages(module: nn.Module) -> tuple[nn.Module, fx.Graph]:
    """Trace a deep copy of ``module`` with :class:`ModulePathTracer`; return the copy and its graph.

    No :class:`torch.fx.GraphModule` is made here: generating its code costs as much as the
    trace on a large graph, and costing and partitioning only need the graph.
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"partition() needs a torch.nn.Module, got {type(module).__name__}; pass the model itself"
        )
    name = type(module).__name__
    root = copy.deepcopy(module)
    tracer = ModulePathTracer()
    try:
        graph = tracer.trace(root)
    except TraceError:
        raise  # it names the model and the fix already
    except Exception as exc:
        raise trace_error(
            name,
            exc,
            "Remove data-dependent control flow from its forward (or wrap that part in a leaf module) "
            "so that symbolic tracing works.",
        ) from exc
    for node in graph.nodes:
        # ``from __future__ import annotations`` leaves string types, which fx cannot pickle
        if isinstance(node.type, str):
            node.type = None
    return tracer.root, graph


def _graph_for_stages(module: nn.Module, example_inputs: tuple[Any, ...]) -> tuple[nn.Module, fx.Graph, str]:
    """The graph to partition: ``(root module, graph, route)``, the user's module untouched.

    Routes, in order: ``"graph"`` (``module`` is already a :class:`~torch.fx.GraphModule`, from
    any tracer: a copy of it is used as it is), ``"fx"`` (:func:`trace_for_stages`), ``"export"``
    (``torch.export.export(..., strict=False)`` with a dynamic batch dimension, so that stages
    also run on microbatches). Every node gets ``meta["module_path"]``. The capture layer will
    take this function's place; nothing else in ``unitscale.stages`` chooses a route.
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"partition() needs a torch.nn.Module, got {type(module).__name__}; pass the model itself"
        )
    if isinstance(module, fx.GraphModule):
        with warnings.catch_warnings():
            # copying an exported module's pytree specs trips torch's own LeafSpec deprecation
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            copied: fx.GraphModule = copy.deepcopy(module)
        root: nn.Module = copied
        graph: fx.Graph = copied.graph
        route = "graph"
    else:
        try:
            root, graph = trace_for_stages(module)
            route = "fx"
        except TraceError as fx_error:
            exported = _export(module, example_inputs, fx_error)
            root, graph, route = exported, exported.graph, "export"
    _drop_guards(root, graph)
    _rename_submod_attrs(root, graph)
    _write_module_paths(graph)
    return root, graph, route


def _export(module: nn.Module, inputs: tuple[Any, ...], fx_error: TraceError) -> fx.GraphModule:
    """``torch.export`` non-strict, batch dimension dynamic where it can be (static otherwise)."""
    copied = copy.deepcopy(module)
    attempts: list[Any] = [None]
    if all(x is None or (isinstance(x, torch.Tensor) and x.dim() > 0) for x in inputs):
        dim = torch.export.Dim.AUTO
        attempts.insert(0, tuple(None if x is None else {0: dim} for x in inputs))
    failure: Exception | None = None
    for dynamic_shapes in attempts:
        try:
            return torch.export.export(copied, inputs, dynamic_shapes=dynamic_shapes, strict=False).module()
        except Exception as exc:
            failure = exc
    raise TraceError(
        f"{fx_error} -- and torch.export (non-strict) failed too: {type(failure).__name__}: "
        f"{str(failure).strip().splitlines()[0] if str(failure) else ''}. Or make the model exportable "
        "(torch.export.export(model, example_inputs, strict=False)), or pass a traced torch.fx.GraphModule"
    ) from failure


def _drop_guards(root: nn.Module, graph: fx.Graph) -> None:
    """Remove an exported module's input-guard call: it pins the example's batch size, and
    stages run on microbatches."""
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            graph.erase_node(node)
            if hasattr(root, "_guards_fn"):
                delattr(root, "_guards_fn")


def _rename_submod_attrs(root: nn.Module, graph: fx.Graph) -> None:
    """Rename root attributes called ``submod_N`` (an exported graph's bodies of higher-order ops,
    e.g. an autocast region): ``split_module`` names its stages so, and the two would clash."""
    for node in graph.nodes:
        target = str(node.target)
        if node.op in ("get_attr", "call_module") and re.fullmatch(r"submod_\d+", target):
            new = f"body_{target}"
            while hasattr(root, new):
                new += "_"
            setattr(root, new, getattr(root, target))
            delattr(root, target)
            node.target = new


def _normalised_path(path: str) -> str:
    """``"transformer.h.0"`` from any spelling torch uses: ``L['self'].transformer.h[0]``,
    ``L__self___transformer``, ``._modules['h']``."""
    path = re.sub(r"^L\['self'\]|^L__self__", "", path)
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", path)
    path = re.sub(r"\[['\"]?([^\]'\"]+)['\"]?\]", r".\1", path)
    return path.strip("._")


def _write_module_paths(graph: fx.Graph) -> None:
    """``meta["module_path"]`` on every node that lacks it: the innermost ``nn_module_stack``
    entry, a ``call_module`` target, or a ``get_attr`` target's owner."""
    for node in graph.nodes:
        if MODULE_PATH_KEY in node.meta:
            continue
        stack = node.meta.get("nn_module_stack")
        if stack:
            path = _normalised_path(str(list(stack.values())[-1][0]))
        elif node.op == "call_module":
            path = str(node.target)
        elif node.op == "get_attr":
            path = str(node.target).rpartition(".")[0]
        else:
            path = ""
        node.meta[MODULE_PATH_KEY] = path


def output_bytes(meta: Any) -> int:
    """Bytes of every tensor in a node's ``tensor_meta`` (tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(meta, TensorMetadata):
        itemsize = torch.empty((), dtype=meta.dtype).element_size()
        return math.prod(meta.shape) * itemsize
    if isinstance(meta, (tuple, list)):
        return sum(output_bytes(m) for m in meta)
    if isinstance(meta, dict):
        return sum(output_bytes(m) for m in meta.values())
    return 0


def _tensor_meta(result: Any) -> Any:
    """``result`` with every tensor replaced by its metadata, or None if it holds no tensor."""
    found = False

    # ShapeProp's extraction also probes memory formats and quantisation, which costs more
    # than running a small node; shapes, dtypes and strides are all the plan needs.
    def meta(value: Any) -> Any:
        nonlocal found
        if not isinstance(value, torch.Tensor):
            return value
        found = True
        return TensorMetadata(value.shape, value.dtype, value.requires_grad, value.stride(), None, False, {})

    extracted = map_aggregate(result, meta)
    return extracted if found else None


class NodeProfiler(fx.Interpreter):
    """Shape propagation that also counts FLOPs and/or times every node.

    After :meth:`propagate`, each node has ``meta["tensor_meta"]`` (as from
    ``torch.fx.passes.shape_prop.ShapeProp``, without memory formats) and this
    profiler holds ``flops[node]`` and ``seconds[node]`` (median of ``repeats``
    runs) when asked for.

    Hook map, as in :class:`torch.fx.Interpreter` (``*`` overridden here). To measure
    something else per node (memory, say), override ``run_node``, call
    ``super().run_node(n)`` and keep what you measured keyed by node, as ``flops`` is.

    .. code-block:: text

        propagate(*args)            = run(*args)
        +-- run_node(n) *           times and counts FLOPs of compute nodes, then
            |                       writes meta["tensor_meta"] and meta["type"]
            +-- placeholder(), get_attr(), call_function(), call_method(),
                call_module(), output()

    Args:
        module: the traced model.
        count_flops: count FLOPs per node with :class:`FlopCounterMode`.
        repeats: time each node this many times (0: do not time).
    """

    def __init__(
        self, module: nn.Module, graph: fx.Graph | None = None, count_flops: bool = False, repeats: int = 0
    ) -> None:
        super().__init__(module, graph=graph)
        self.count_flops = count_flops
        self.repeats = repeats
        self.flops: dict[fx.Node, float] = {}
        self.seconds: dict[fx.Node, float] = {}
        self.current: fx.Node | None = None
        self.result: Any = None

    def run_node(self, n: fx.Node) -> Any:
        self.current = n
        if n.op in COMPUTE_OPS and self.repeats:
            times = []
            for _ in range(self.repeats):
                start = time.perf_counter()
                fx.Interpreter.run_node(self, n)
                times.append(time.perf_counter() - start)
            self.seconds[n] = statistics.median(times)
        if n.op in COMPUTE_OPS and self.count_flops:
            with FlopCounterMode(display=False) as counter:
                result = super().run_node(n)
            self.flops[n] = float(counter.get_total_flops())
        else:
            result = super().run_node(n)
        if n.op == "placeholder" and is_constant(result):
            n.meta[INPUT_CONSTANT_KEY] = result
        meta = _tensor_meta(result)
        if meta is not None:
            n.meta["tensor_meta"] = meta
        n.meta["type"] = type(result)
        return result

    def propagate(self, *args: Any) -> Any:
        """Run the module on ``args``, recording every node's output metadata (and the output in ``result``)."""
        self.result = self.run(*args)
        return self.result


def flat_inputs(graph: fx.Graph, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The graph's own inputs: ``inputs`` flattened where its code flattens them (an exported graph)."""
    return tuple(graph._codegen.process_inputs(*inputs))


def _check_inputs(module: nn.Module, graph: fx.Graph, inputs: Sequence[Any]) -> None:
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    required = [n for n in placeholders if not n.args]
    if not len(required) <= len(inputs) <= len(placeholders):
        names = ", ".join(str(n.target) for n in placeholders)
        raise InputError(
            f"{type(module).__name__}.forward takes {len(required)} input(s) ({names}) but {len(inputs)} example "
            "input(s) were given; pass example_inputs as a tuple matching forward's arguments"
        )


def run_profiler(
    module: nn.Module, graph: fx.Graph, inputs: Sequence[Any], count_flops: bool = False, repeats: int = 0
) -> NodeProfiler:
    """Run :class:`NodeProfiler` over ``graph`` (traced from ``module``) on cloned ``inputs``,
    turning failures into :class:`InputError`."""
    inputs = flat_inputs(graph, inputs)
    _check_inputs(module, graph, inputs)
    cloned = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    profiler = NodeProfiler(module, graph, count_flops=count_flops, repeats=repeats)
    try:
        with torch.no_grad():
            profiler.propagate(*cloned)
    except Exception as exc:
        node = profiler.current
        where = f"node {node.name!r} ({node.format_node()})" if node is not None else "the first node"
        raise InputError(
            f"the example inputs do not fit {type(module).__name__}: running it failed at {where} with "
            f"{type(exc).__name__}: {exc}. Pass inputs with the shapes and dtypes the model expects"
        ) from exc
    return profiler


def _params_per_node(module: nn.Module, nodes: Sequence[fx.Node]) -> dict[fx.Node, float]:
    seen: set[int] = set()
    costs: dict[fx.Node, float] = {}
    for n in nodes:
        tensors: list[torch.Tensor] = []
        if n.op == "call_module":
            tensors += list(module.get_submodule(n.target).parameters())  # type: ignore[arg-type]
        for arg in n.all_input_nodes:
            if arg.op == "get_attr":
                value = _parameter_or_none(module, arg.target)  # type: ignore[arg-type]
                if value is not None:
                    tensors.append(value)
        total = 0
        for p in tensors:
            if id(p) not in seen:
                seen.add(id(p))
                total += p.numel()
        costs[n] = float(total)
    return costs


def _parameter_or_none(module: nn.Module, target: str) -> nn.Parameter | None:
    try:
        return module.get_parameter(target)
    except AttributeError:
        return None


def _call_cost(cost: Callable[[fx.Node], float], n: fx.Node) -> Any:
    try:
        return cost(n)
    except Exception as exc:
        raise CostError(
            f"the cost callable raised {type(exc).__name__}: {exc} on node {n.name!r} ({n.format_node()}); "
            "make it return a float >= 0 for every node"
        ) from exc


def _checked(n: fx.Node, value: Any) -> float:
    try:
        if isinstance(value, (str, bytes, bool)):  # float("3") would pass a string as a number
            raise TypeError(type(value).__name__)
        cost = float(value)
    except (TypeError, ValueError) as exc:
        raise CostError(
            f"the cost callable returned {value!r} for node {n.name!r}, which is not a number; return a float >= 0"
        ) from exc
    if math.isnan(cost) or cost < 0 or math.isinf(cost):
        raise CostError(
            f"the cost callable returned {cost} for node {n.name!r} ({n.format_node()}); costs must be finite and >= 0"
        )
    return cost


def node_costs(
    module: nn.Module,
    nodes: Sequence[fx.Node],
    profiler: NodeProfiler,
    cost: str | Callable[[fx.Node], float],
) -> list[float]:
    """One cost per node in ``nodes`` for the cost model ``cost``."""
    if callable(cost):
        costs = [_checked(n, _call_cost(cost, n)) for n in nodes]
        if not math.isfinite(sum(costs)):
            raise CostError(
                f"the cost callable's values sum to more than a float holds (largest {max(costs):.3g}); "
                "return costs in a smaller unit"
            )
        return costs
    if cost == "params":
        per_node = _params_per_node(module, nodes)
        return [per_node[n] for n in nodes]
    if cost == "flops":
        return [profiler.flops.get(n, 0.0) for n in nodes]
    if cost == "time":
        return [profiler.seconds.get(n, 0.0) for n in nodes]
    if cost == "memory":
        return [float(output_bytes(n.meta.get("tensor_meta"))) for n in nodes]
    raise CostError(
        f"unknown cost model {cost!r}; use one of {', '.join(map(repr, COST_MODELS))} or a callable node -> float"
    )
