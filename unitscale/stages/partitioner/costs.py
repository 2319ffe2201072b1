"""Tracing a model for partitioning and measuring a cost for each of its nodes."""

from __future__ import annotations

import copy
import functools
import math
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.node import map_aggregate
from torch.fx.passes.shape_prop import TensorMetadata
from torch.utils.flop_counter import FlopCounterMode

from unitscale.capture import capture
from unitscale.capture.toolkit import normalise_graph
from unitscale.errors import CostError, InputError, NoRouteError, NotAModuleError, OutOfMemoryError
from unitscale.fx.module_state import module_state_kept, pytree_specs_quiet
from unitscale.fx.nodes import COMPUTE_OPS, tensor_metadata
from unitscale.fx.plain_run import run_plainly
from unitscale.stages.partitioner.split import INPUT_CONSTANT_KEY, is_constant

__all__ = [
    "COST_MODELS",
    "as_tuple",
    "NodeProfiler",
    "backward_times",
    "call_cost",
    "check_input_shapes",
    "flat_inputs",
    "node_costs",
    "output_bytes",
    "node_parameters",
    "params_per_node",
    "run_profiler",
]

COST_MODELS = ("params", "flops", "time", "memory")


def _graph_for_stages(module: nn.Module, example_inputs: tuple[Any, ...]) -> tuple[nn.Module, fx.Graph, str]:
    """The graph to partition: ``(root module, graph, route)``, the user's module untouched.

    ``torch.fx`` is tried first: it keeps ``call_module`` nodes, so cuts can fall on module boundaries.
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"partition() needs a torch.nn.Module, got {type(module).__name__}; pass the model itself"
        )
    if isinstance(module, fx.GraphModule):
        with pytree_specs_quiet():
            root: fx.GraphModule = copy.deepcopy(module)
        _drop_guards(root)
        normalise_graph(root, root)
        route = "graph"
    else:
        try:
            cap = capture(copy.deepcopy(module), example_inputs, route=("fx", "export"), dynamic_batch=True)
        except NoRouteError as exc:
            raise NoRouteError(
                f"partition() {exc} -- make the model traceable by torch.fx (no data-dependent control flow in "
                "forward, or that part in a leaf module) or exportable (torch.export.export(model, example_inputs, "
                "strict=False)), or pass a traced torch.fx.GraphModule",
                exc.reasons,
            ) from exc
        root = cap.require_graph("partition")
        route = cap.route
    for node in root.graph.nodes:
        # ``from __future__ import annotations`` leaves string types, which fx cannot pickle
        if isinstance(node.type, str):
            node.type = None
    _rename_submod_attrs(root, root.graph)
    return root, root.graph, route


def _drop_guards(root: fx.GraphModule) -> None:
    """Remove an exported module's input-guard call (``ep.module()``): it pins the example's
    batch size, and stages run on microbatches."""
    for node in list(root.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            root.graph.erase_node(node)
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


def output_bytes(meta: Any) -> int:
    """Bytes of every tensor in a node's ``tensor_meta`` (tensor, or nested tuples/lists/dicts of them)."""
    if isinstance(meta, TensorMetadata):
        return math.prod(meta.shape) * torch.empty((), dtype=meta.dtype).element_size()
    if isinstance(meta, (tuple, list, dict)):
        return sum(output_bytes(m) for m in (meta.values() if isinstance(meta, dict) else meta))
    return 0


class NodeProfiler(fx.Interpreter):
    """Shape propagation that also counts FLOPs and/or times every node.

    After :meth:`propagate`, each node has ``meta["tensor_meta"]`` and this profiler holds
    ``flops[node]`` and ``seconds[node]`` (median of ``repeats`` runs) when asked for.

    Args:
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
            self.seconds[n] = _median_seconds(lambda: run_plainly(self, n), self.repeats)
        if n.op in COMPUTE_OPS and self.count_flops:
            result = self._counted(n)
        else:
            result = run_plainly(self, n)
        if n.op == "placeholder" and is_constant(result):
            n.meta[INPUT_CONSTANT_KEY] = result
        if _leaf_tensors(result):
            n.meta["tensor_meta"] = map_aggregate(
                result, lambda v: tensor_metadata(v) if isinstance(v, torch.Tensor) else v
            )
        n.meta["type"] = type(result)
        return result

    def _counted(self, n: fx.Node) -> Any:
        """Run ``n`` under :class:`FlopCounterMode` with grad enabled, as training does: under ``no_grad``
        modules take fast paths the counter has no formula for or fails on."""
        failures = []
        for grad in (True, False):
            try:
                with torch.set_grad_enabled(grad), FlopCounterMode(display=False) as counter:
                    result = run_plainly(self, n)
            except Exception as exc:
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            self.flops[n] = float(counter.get_total_flops())
            return result
        result = run_plainly(self, n)  # fails here: the inputs do not fit (run_profiler says so)
        raise CostError(
            f"partition(cost='flops'): torch's FlopCounterMode (torch.utils.flop_counter) failed on node {n.name!r} "
            f"({n.format_node()}) with grad enabled ({failures[0]}) and under no_grad ({failures[1]}), though the "
            "node runs on these inputs without it; the example inputs are fine. Use cost='params', cost='time' "
            "or a callable node -> float"
        )

    def propagate(self, *args: Any) -> Any:
        """Run the module on ``args``, recording every node's output metadata (and the output in ``result``)."""
        self.result = self.run(*args)
        return self.result


def as_tuple(example_inputs: Any) -> tuple[Any, ...]:
    """Example inputs as a tuple: a tuple as it is, a list as a tuple, anything else as a 1-tuple.

    >>> from unitscale.stages.partitioner.costs import as_tuple
    >>> as_tuple([1, 2]), as_tuple(3)
    ((1, 2), (3,))
    """
    return tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)


def flat_inputs(graph: fx.Graph, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The graph's own inputs: ``inputs`` flattened where its code flattens them (an exported graph)."""
    return tuple(graph._codegen.process_inputs(*inputs))


def check_input_shapes(graph: fx.Graph, inputs: Sequence[Any], who: str) -> None:
    """Refuse a tensor input whose fixed sizes differ from those an exported graph was captured with.

    Such a graph can run on other sizes and be wrong (OPT's ``view(ids, [-1, 16])`` runs ids of
    shape ``(2, 8)`` as ``(1, 16)``). A ``torch.fx`` graph holds no sizes and is not checked.
    ``inputs`` are the graph's own (flattened) inputs; ``who`` is named in the error.

    Raises:
        InputError: an input's rank or a fixed size differs; the message names the input.

    >>> import torch
    >>> from unitscale.errors import InputError
    >>> from unitscale.stages.partitioner.costs import check_input_shapes
    >>> exported = torch.export.export(torch.nn.Linear(4, 2), (torch.randn(3, 4),))
    >>> graph = exported.module().graph
    >>> check_input_shapes(graph, (torch.randn(3, 4),), "verify()")
    >>> try:
    ...     check_input_shapes(graph, (torch.randn(3, 5),), "verify()")
    ... except InputError as e:
    ...     print(str(e).split(" by torch.export")[0])
    verify(): input 'input' has shape (3, 5), but the graph was captured
    """
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for node, value in zip(placeholders, inputs, strict=False):
        val = node.meta.get("val")
        if not isinstance(val, FakeTensor) or not isinstance(value, torch.Tensor):
            continue
        # a size export specialised (a Python loop over ``range(x.shape[0])``) is a SymInt that is a number
        fixed = [d if isinstance(d, int) else d.node.maybe_as_int() for d in val.shape]
        if value.dim() == len(fixed) and all(f is None or f == g for f, g in zip(fixed, value.shape, strict=True)):
            continue
        shown = "(" + ", ".join("any" if f is None else str(f) for f in fixed) + ("," if len(fixed) == 1 else "") + ")"
        batch_only = value.dim() == len(fixed) > 0 and fixed[0] is not None and list(value.shape[1:]) == fixed[1:]
        advice = (
            "the model fixed its batch size while it was exported (a Python loop over range(x.shape[0]), for one), "
            "so the stages run only on that many rows; partition with example inputs of the batch size they will "
            "run on (for run_pipeline, the batch divided by num_microbatches)"
            if batch_only and fixed[0] != 1
            else "partition again with example inputs of this shape (the batch size may differ when the captured "
            "batch was above 1)"
        )
        raise InputError(
            f"{who}: input {str(node.target)!r} has shape {tuple(value.shape)}, but the graph was captured by "
            f"torch.export for shape {shown}, whose fixed sizes are baked into the graph; {advice}"
        )


def _median_seconds(run: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _checked_inputs(module: nn.Module, graph: fx.Graph, inputs: Sequence[Any]) -> list[Any]:
    """The graph's own inputs, cloned (a run may write to them), refused when too few or too many."""
    inputs = flat_inputs(graph, inputs)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    required = [n for n in placeholders if not n.args]
    if not len(required) <= len(inputs) <= len(placeholders):
        names = ", ".join(str(n.target) for n in placeholders)
        raise InputError(
            f"{type(module).__name__}.forward takes {len(required)} input(s) ({names}) but {len(inputs)} example "
            "input(s) were given; pass example_inputs as a tuple matching forward's arguments"
        )
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def run_profiler(
    module: nn.Module, graph: fx.Graph, inputs: Sequence[Any], count_flops: bool = False, repeats: int = 0
) -> NodeProfiler:
    """Run :class:`NodeProfiler` over ``graph`` (traced from ``module``) on cloned ``inputs``."""
    cloned = _checked_inputs(module, graph, inputs)
    profiler = NodeProfiler(module, graph, count_flops=count_flops, repeats=repeats)
    try:
        # running (and timing) the nodes must leave the plan's copy as the model was: a batch
        # norm's running statistics, updated on every run, would otherwise differ in eval mode
        with torch.no_grad(), module_state_kept(module, values=True):
            profiler.propagate(*cloned)
    except CostError:
        raise
    except Exception as exc:
        node = profiler.current
        where = f"node {node.name!r} ({node.format_node()})" if node is not None else "the first node"
        _raise_if_out_of_memory(exc, module, where)
        raise InputError(
            f"the example inputs do not fit {type(module).__name__}: running it failed at {where} with "
            f"{type(exc).__name__}: {exc}. Pass inputs with the shapes and dtypes the model expects"
        ) from exc
    return profiler


def _raise_if_out_of_memory(exc: Exception, module: nn.Module, where: str) -> None:
    """Running out of memory is not an input that does not fit: say what it is."""
    if OutOfMemoryError.caused(exc):
        raise OutOfMemoryError(
            f"costing {type(module).__name__} ran out of memory at {where} ({type(exc).__name__}); use smaller "
            "example inputs (a smaller batch: costs scale with it), free memory, or cost on a device with more"
        ) from exc


class _BackwardTimer(fx.Interpreter):
    """Runs the graph with autograd and times each compute node's backward alone (:func:`backward_times`)."""

    def __init__(self, module: nn.Module, graph: fx.Graph, repeats: int) -> None:
        super().__init__(module, graph=graph)
        self.repeats = repeats
        self.seconds: dict[fx.Node, float] = {}

    def run_node(self, n: fx.Node) -> Any:
        if n.op not in COMPUTE_OPS:
            return run_plainly(self, n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        leaves: list[torch.Tensor] = []

        def cut(value: Any) -> Any:
            # each node's backward alone: its inputs become leaves; a copy takes in-place writes
            if isinstance(value, torch.Tensor) and value.requires_grad:
                leaf = value.detach().requires_grad_()
                leaves.append(leaf)
                return leaf.clone()
            return value

        with torch.enable_grad():
            out = getattr(self, n.op)(n.target, map_aggregate(args, cut), map_aggregate(kwargs, cut))
        weights = list(self.module.get_submodule(n.target).parameters()) if n.op == "call_module" else []  # type: ignore[arg-type]
        inputs = leaves + [p for p in weights if p.requires_grad]
        outs = [t for t in _leaf_tensors(out) if t.requires_grad and t.is_floating_point()]
        if outs and inputs:
            grads = [torch.ones_like(t) for t in outs]
            backward = functools.partial(torch.autograd.grad, outs, inputs, grads, retain_graph=True, allow_unused=True)
            self.seconds[n] = _median_seconds(backward, self.repeats)
        return out


def _leaf_tensors(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    map_aggregate(value, lambda v: found.append(v) if isinstance(v, torch.Tensor) else None)
    return found


def backward_times(plan: Any, example_inputs: Any, repeats: int = 5) -> list[float]:
    """Seconds of each compute node's backward, timed alone: one per ``plan.node_costs`` entry.

    Each node's gradients are taken ``repeats`` times and the median kept. The model's inputs need
    no gradient, so the first layer's backward is its weight gradient alone; a node whose output
    needs no gradient costs 0.

    Raises:
        InputError: ``repeats`` is not an int >= 1, or ``example_inputs`` do not fit the model.
        OutOfMemoryError: running the backward ran out of memory.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages.partitioner.costs import backward_times
    >>> model = nn.Sequential(nn.Linear(64, 64), nn.ReLU())
    >>> plan = partition(model, 1, torch.randn(32, 64))
    >>> [t > 0 for t in backward_times(plan, torch.randn(32, 64))]
    [True, True]
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"repeats={repeats!r} must be an int >= 1 (timings per node)")
    module, graph = plan.root, plan.graph
    inputs = _checked_inputs(module, graph, as_tuple(example_inputs))
    timer = _BackwardTimer(module, graph, repeats)
    try:
        with module_state_kept(module, values=True):  # as run_profiler: running stats stay as they were
            timer.run(*inputs)
    except Exception as exc:
        _raise_if_out_of_memory(exc, module, "its backward")
        raise InputError(
            f"the example inputs do not fit {type(module).__name__}: timing its backward failed with "
            f"{type(exc).__name__}: {exc}. Pass the inputs the plan was made with"
        ) from exc
    by_name = {n.name: n for n in graph.nodes}
    return [timer.seconds.get(by_name[name], 0.0) for name, _ in plan.node_costs]


def params_per_node(module: nn.Module, nodes: Sequence[fx.Node]) -> dict[fx.Node, float]:
    """Parameter elements each node uses, a parameter counted at its first use only.

    >>> import torch
    >>> from torch import fx, nn
    >>> from unitscale.stages.partitioner.costs import params_per_node
    >>> gm = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 3), nn.ReLU()))
    >>> list(params_per_node(gm, list(gm.graph.nodes)[1:3]).values())
    [9.0, 0.0]
    """
    seen: set[int] = set()
    costs: dict[fx.Node, float] = {}
    for n in nodes:
        fresh = {id(p): p for _, p in node_parameters(module, n) if id(p) not in seen}
        seen.update(fresh)
        costs[n] = float(sum(p.numel() for p in fresh.values()))
    return costs


def node_parameters(module: nn.Module, n: fx.Node) -> list[tuple[str, nn.Parameter]]:
    """``(qualified name, parameter)`` of each parameter ``n`` uses: its module's, or those read by ``get_attr``."""
    found = []
    if n.op == "call_module":
        found += [(f"{n.target}.{name}", p) for name, p in module.get_submodule(str(n.target)).named_parameters()]
    for arg in n.all_input_nodes:
        if arg.op == "get_attr":
            try:
                found.append((str(arg.target), module.get_parameter(str(arg.target))))
            except AttributeError:  # a buffer or a constant
                pass
    return found


def call_cost(cost: Callable[[fx.Node], float], n: fx.Node, argument: str = "cost") -> float:
    """``cost(n)`` checked: a finite float >= 0, or a :class:`~unitscale.errors.CostError` naming ``argument``.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.stages.partitioner.costs import call_cost
    >>> graph = fx.symbolic_trace(torch.nn.ReLU()).graph
    >>> node = next(n for n in graph.nodes if n.op == "call_function")
    >>> call_cost(lambda n: 3, node)
    3.0
    """
    try:
        value = cost(n)
    except Exception as exc:
        raise CostError(
            f"the {argument} callable raised {type(exc).__name__}: {exc} on node {n.name!r} ({n.format_node()}); "
            "make it return a float >= 0 for every node"
        ) from exc
    try:
        if isinstance(value, (str, bytes, bool)):  # float("3") would pass a string as a number
            raise TypeError(type(value).__name__)
        result = float(value)
    except OverflowError as exc:
        raise CostError(
            f"the {argument} callable returned an int too large for a float ({len(str(value))} digits) for node "
            f"{n.name!r} ({n.format_node()}); return a finite float >= 0 (rescale the costs: only their ratios matter)"
        ) from exc
    except (TypeError, ValueError) as exc:
        raise CostError(
            f"the {argument} callable returned {value!r:.60} for node {n.name!r}, which is not a number; "
            "return a float >= 0"
        ) from exc
    if math.isnan(result) or result < 0 or math.isinf(result):
        raise CostError(
            f"the {argument} callable returned {result} for node {n.name!r} ({n.format_node()}); costs must be "
            "finite and >= 0"
        )
    return result


def node_costs(
    module: nn.Module,
    nodes: Sequence[fx.Node],
    profiler: NodeProfiler,
    cost: str | Callable[[fx.Node], float],
) -> list[float]:
    """One cost per node in ``nodes`` for the cost model ``cost``."""
    if callable(cost):
        costs = [call_cost(cost, n) for n in nodes]
        if not math.isfinite(sum(costs)):
            raise CostError(
                f"the cost callable's values sum to more than a float holds (largest {max(costs):.3g}); "
                "return costs in a smaller unit"
            )
        return costs
    if cost == "params":
        return list(params_per_node(module, nodes).values())
    if cost == "flops":
        return [profiler.flops.get(n, 0.0) for n in nodes]
    if cost == "time":
        return [profiler.seconds.get(n, 0.0) for n in nodes]
    return [float(output_bytes(n.meta.get("tensor_meta"))) for n in nodes]  # "memory": partition refuses others
