"""Capture a module's forward with TorchDynamo and run graph transforms over it.

A transform here is a function from a captured :class:`torch.fx.GraphModule` to a
new one. :func:`apply_transform` wraps a module in a :class:`TransformedModule` that,
on the first call with a new input signature, captures the module's forward with
TorchDynamo (``torch.compile`` with a custom backend, ``fullgraph=True``) and runs
every transform over the captured graph, in order. Transforms nest because a
transformed module only collects transforms: ``simulate_fp8(unit_scale(model))``
captures once and runs the unit-scaling transform, then the FP8 one.

The result is a plain ``nn.Module`` whose forward runs the transformed graph: it
trains eagerly, compiles with ``torch.compile`` and traces with a
:class:`~unitscale.DeepTracer` (after one real call, which does the capture).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from unitscale.errors import CaptureError, TraceError, TransformError, UnitscaleError

__all__ = ["GraphTransform", "TransformedModule"]

GraphTransform = Callable[[fx.GraphModule], fx.GraphModule]


@dataclass
class _CompiledGraph:
    """One captured and transformed graph, with how to feed it and rebuild the output."""

    graph_module: fx.GraphModule
    input_positions: list[int]
    output_plan: list[tuple[str, Any]]
    output_spec: pytree.TreeSpec

    def run(self, leaves: list[Any]) -> Any:
        inputs = [leaves[i] for i in self.input_positions]
        if any(isinstance(x, fx.Proxy) for x in inputs):
            outs = _ProxyInliner(self.graph_module).run(*inputs)
        else:
            outs = self.graph_module.forward(*inputs)
        rebuilt = [outs[v] if kind == "graph" else leaves[v] if kind == "input" else v for kind, v in self.output_plan]
        return pytree.tree_unflatten(rebuilt, self.output_spec)


class _ProxyInliner(fx.Interpreter):
    """Replays a graph into the tracer that is tracing the caller, one node per node.

    Calling the graph's forward under ``torch.fx`` would trace into the unit-scaled
    functions (their names live in the generated code's globals, which a tracer's
    autowrapping does not patch); replaying keeps each as one node. Parameters are
    read through ``getattr``, which the tracer turns into ``get_attr`` nodes of its root.
    """

    def __init__(self, gm: fx.GraphModule) -> None:
        super().__init__(gm, garbage_collect_values=False)
        self._node: fx.Node | None = None

    def run_node(self, n: fx.Node) -> Any:
        self._node = n
        return super().run_node(n)

    def _emit(self, kind: str, target: Any, args: Any, kwargs: Any) -> Any:
        proxies = [a for a in pytree.tree_leaves((args, kwargs)) if isinstance(a, fx.Proxy)]
        if not proxies:
            return getattr(super(), kind)(target, args, kwargs)
        tracer = proxies[0].tracer
        node = self._node
        name = None if node is None else node.name
        path = None if node is None else _module_path(node)
        if path is None or not hasattr(tracer, "current_module_path"):
            return tracer.create_proxy(kind, target, args, kwargs, name=name)
        outer = tracer.current_module_path
        tracer.current_module_path = path
        try:
            return tracer.create_proxy(kind, target, args, kwargs, name=name)
        finally:
            tracer.current_module_path = outer

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self._emit("call_function", target, args, kwargs)

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self._emit("call_method", target, args, kwargs)


def _module_path(node: fx.Node) -> str | None:
    """``module.<path>`` of the module a TorchDynamo node came from (``None`` if not recorded)."""
    stack = node.meta.get("nn_module_stack")
    if stack is None:
        return None
    if not stack:
        return "module"
    source = re.sub(r"^L\['[^']*'\]", "", str(list(stack.values())[-1][0]))
    return ".".join(["module", *(name for name in re.findall(r"\w+", source) if name != "_modules")])


class TransformedModule(nn.Module):
    """A module whose forward runs ``module``'s TorchDynamo graph after ``transforms``.

    Built by :func:`apply_transform`, :func:`unit_scale` and :func:`simulate_format`;
    ``module`` is a registered submodule, so parameters, ``train()``/``eval()`` and
    ``.to()`` work as usual. The graph is captured once per input signature (shapes,
    dtypes, non-tensor values, training mode). A capture runs eagerly: under
    ``torch.compile`` a call with a new signature breaks the graph once, so for
    ``fullgraph=True`` call the module once eagerly first.

    Hook map: a new behaviour is a transform (a ``GraphModule -> GraphModule`` callable,
    ``GraphTransform``) given to :func:`apply_transform`, not a subclass; the
    methods below are what runs a call.

    .. code-block:: text

        forward(*args, **kwargs)
        +-- (inputs are fx proxies) the latest capture is replayed into the tracer
        +-- key: training mode, argument count, keyword names, each leaf's signature
        +-- _capture(args, kwargs, leaves, key)     once per key
        |   +-- TorchDynamo graph of module
        |   +-- transform(graph_module) for each of transforms, in order
        +-- captured.run(leaves)

    Attributes:
        module: the module whose forward is captured.
        transforms: the graph transforms, applied in order.
        unscaled_ops: ops :func:`unit_scale` left as they were, one line each.
        kept_ops: ops :func:`unit_scale` left as they were because they keep the scale
            of unit-scaled operands (rotary embeddings, products of activations), one
            ``"<op>: <reason>"`` line each.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import unit_scale
    >>> scaled = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.GELU()))
    >>> scaled.graph_module is None  # nothing captured before the first call
    True
    >>> scaled(torch.randn(4, 8)).shape, scaled.unscaled_ops
    (torch.Size([4, 8]), [])
    """

    def __init__(self, module: nn.Module, transforms: tuple[Callable[[fx.GraphModule], fx.GraphModule], ...]) -> None:
        super().__init__()
        self.module = module
        self.transforms = tuple(transforms)
        self._captured: dict[Any, _CompiledGraph] = {}
        self._latest: _CompiledGraph | None = None
        self.unscaled_ops: list[str] = []
        self.kept_ops: list[str] = []

    @property
    def graph_module(self) -> fx.GraphModule | None:
        """The transformed graph of the latest capture (``None`` before the first call)."""
        return None if self._latest is None else self._latest.graph_module

    @classmethod
    def wrap(
        cls, module: nn.Module, transforms: tuple[Callable[[fx.GraphModule], fx.GraphModule], ...]
    ) -> TransformedModule:
        """A ``TransformedModule`` whose ``forward`` has the parameter names of ``module.forward``.

        ``torch.fx`` reads the names from the class's ``forward``; with them the traced
        placeholders are called ``x`` or ``idx`` rather than one ``*args``.

        >>> import torch
        >>> from unitscale.transforms import TransformedModule
        >>> wrapped = TransformedModule.wrap(torch.nn.Linear(2, 2), ())
        >>> type(wrapped).forward.__code__.co_varnames[:2], wrapped(torch.ones(1, 2)).shape
        (('self', 'input'), torch.Size([1, 2]))
        """
        return _class_for(module)(module, transforms)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        leaves, _ = pytree.tree_flatten((args, kwargs))
        if any(isinstance(leaf, fx.Proxy) for leaf in leaves):
            if self._latest is None:
                raise TraceError(
                    f"{type(self.module).__name__} was transformed but never called: call it once on real "
                    f"inputs (which captures its graph) before tracing it with torch.fx"
                )
            return self._latest.run(leaves)
        key = (self.training, len(args), tuple(kwargs), tuple(_signature(leaf) for leaf in leaves))
        captured = self._captured.get(key)
        if captured is None:
            captured = self._capture(args, kwargs, leaves, key)
        return captured.run(leaves)

    @torch._dynamo.disable
    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], key: Any) -> _CompiledGraph:
        captured = _capture(self.module, args, kwargs, leaves, self.transforms)
        self._captured[key] = captured
        self._latest = captured
        self.unscaled_ops = list(captured.graph_module.meta.get("unscaled_ops", []))
        self.kept_ops = list(captured.graph_module.meta.get("kept_ops", []))
        return captured

    def extra_repr(self) -> str:
        return "transforms=[" + ", ".join(getattr(t, "__name__", type(t).__name__) for t in self.transforms) + "]"


_CLASSES: dict[tuple[str, ...], type[TransformedModule]] = {}


def _class_for(module: nn.Module) -> type[TransformedModule]:
    try:
        params = list(inspect.signature(module.forward).parameters.values())
    except (TypeError, ValueError):
        return TransformedModule
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = tuple(p.name for p in params)
    if any(p.kind not in plain or p.default is not inspect.Parameter.empty for p in params) or "self" in names:
        return TransformedModule
    if names not in _CLASSES:
        namespace: dict[str, Any] = {}
        arglist = ", ".join(names)
        exec(
            f"def forward(self, {arglist}):\n    return TransformedModule.forward(self, {arglist})\n",
            {"TransformedModule": TransformedModule},
            namespace,
        )
        _CLASSES[names] = type(
            "TransformedModule", (TransformedModule,), {"forward": namespace["forward"], "__module__": __name__}
        )
    return _CLASSES[names]


def _signature(leaf: Any) -> Any:
    """What a captured graph is specialised on: a tensor's shape, dtype and device, a plain value."""
    if isinstance(leaf, torch.Tensor):
        return (tuple(leaf.shape), leaf.dtype, leaf.device)
    if leaf is None or isinstance(leaf, (bool, int, float, str)):
        return (type(leaf), leaf)
    return (type(leaf), id(leaf))


def _capture_error(module: nn.Module, exc: Exception) -> CaptureError:
    where = ""
    stack = getattr(exc, "real_stack", None)
    if stack:
        # the user's line, not the torch.nn line it called into
        frame = next((f for f in reversed(stack) if "/torch/" not in f.filename.replace("\\", "/")), stack[-1])
        where = f" at {frame.filename}:{frame.lineno} ({(frame.line or '').strip()})"
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    failed = re.search(r"got (\w+)\((['\"])(.*?)\2\)", str(exc), re.S)
    if isinstance(exc, torch._dynamo.exc.TorchRuntimeError) and failed:
        # The op itself failed on the example tensors: the model would fail eagerly too.
        inner = failed.group(3).rstrip(".")
        advice = (
            "update the parameter under torch.no_grad() or outside forward"
            if "in-place operation" in inner
            else "check the input shapes and dtypes and the layers' widths (the model fails the same way eagerly)"
        )
        return CaptureError(f"{type(module).__name__}.forward fails{where}: {failed.group(1)}: {inner}; {advice}")
    return CaptureError(
        f"TorchDynamo could not capture {type(module).__name__}.forward in one graph{where}: {reason}. "
        f"Rewrite that line without data-dependent Python control flow or calls TorchDynamo cannot trace "
        f"(print, .item(), .tolist(), numpy)"
    )


def _run_transform(module: nn.Module, transform: Callable[..., Any], gm: fx.GraphModule) -> fx.GraphModule:
    name = getattr(transform, "__name__", type(transform).__name__)
    try:
        result = transform(gm)
    except UnitscaleError:
        raise
    except Exception as exc:
        raise TransformError(
            f"the graph transform {name!r} raised {type(exc).__name__}: {exc} on the graph of "
            f"{type(module).__name__}; fix the transform (it gets and returns an fx.GraphModule)"
        ) from exc
    if not isinstance(result, fx.GraphModule):
        raise TransformError(
            f"the graph transform {name!r} returned {type(result).__name__} {result!r:.40}, not an fx.GraphModule; "
            "return the (changed) GraphModule, e.g. end it with `gm.recompile(); return gm`"
        )
    return result


@contextmanager
def _no_torch_function_modes() -> Iterator[None]:
    """Set aside active ``TorchFunctionMode``s (an op recorder, say) while TorchDynamo captures."""
    modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)


def _capture(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    leaves: list[Any],
    transforms: tuple[GraphTransform, ...],
) -> _CompiledGraph:
    record: dict[str, Any] = {}

    def backend(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        record["gm"], record["inputs"] = gm, list(example_inputs)

        def run(*inputs: Any) -> Any:
            record["outputs"] = gm(*inputs)
            return record["outputs"]

        return run

    def call(*a: Any, **k: Any) -> Any:
        return module(*a, **k)

    try:
        with _no_torch_function_modes():
            result = torch.compile(call, backend=backend, fullgraph=True, dynamic=False)(*args, **kwargs)
    except torch._dynamo.exc.TorchDynamoException as exc:
        raise _capture_error(module, exc) from None
    finally:
        # Each capture compiles a fresh frame; drop its cache entry so repeated captures
        # never reach TorchDynamo's recompile limit.
        torch._dynamo.reset_code(call.__code__)
    if "gm" not in record:
        raise CaptureError(
            f"TorchDynamo found no tensor ops in {type(module).__name__}.forward, so there is no graph to "
            f"transform; apply the transform to a module that computes something"
        )
    _check_outputs(module, result)
    gm = _to_standalone(module, record["gm"], record["inputs"], leaves)
    for transform in transforms:
        gm = _run_transform(module, transform, gm)
    out_leaves, out_spec = pytree.tree_flatten(result)
    graph_outputs = {id(t): i for i, t in enumerate(record.get("outputs", ()))}
    input_ids = {id(leaf): i for i, leaf in enumerate(leaves)}
    plan: list[tuple[str, Any]] = []
    for leaf in out_leaves:
        if id(leaf) in graph_outputs:
            plan.append(("graph", graph_outputs[id(leaf)]))
        elif id(leaf) in input_ids:
            plan.append(("input", input_ids[id(leaf)]))
        elif isinstance(leaf, torch.Tensor):
            raise CaptureError(
                f"{type(module).__name__}.forward returns a tensor that is neither computed by its graph nor an "
                f"input (a parameter or a global?); return a computed tensor instead"
            )
        else:
            plan.append(("const", leaf))
    positions = gm.meta["input_positions"]
    return _CompiledGraph(gm, positions, plan, out_spec)


# Output leaves a captured graph may hand back as they were at capture: they hold no tensors.
_PLAIN_OUTPUTS = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.Size)


def _check_outputs(module: nn.Module, result: Any) -> None:
    """Refuse an output object the graph cannot recompute (a KV cache, say): it would be the capture's, stale."""
    for path, leaf in pytree.tree_flatten_with_path(result)[0]:
        if isinstance(leaf, (torch.Tensor, *_PLAIN_OUTPUTS)):
            continue
        where = pytree.keystr(path) or "its output"
        hint = (
            " (a transformers KV cache: build the model with use_cache=False, or pass use_cache=False)"
            if "cache" in type(leaf).__name__.lower()
            else ""
        )
        raise CaptureError(
            f"{type(module).__name__}.forward returns a {type(leaf).__name__} at {where}{hint}: an object that is "
            f"not a tensor or a plain value, so a transformed graph cannot rebuild it on each call (every call "
            f"would return the one made while capturing); return tensors only"
        )


def _to_standalone(
    module: nn.Module, gm: fx.GraphModule, example_inputs: list[Any], leaves: list[Any]
) -> fx.GraphModule:
    """Turn TorchDynamo's graph (parameters lifted to inputs) into one that reads them as attributes."""
    names: dict[int, str] = {}
    for name, tensor in [*module.named_buffers(), *module.named_parameters()]:
        names.setdefault(id(tensor), name)
    leaf_position = {id(leaf): i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)}
    graph = gm.graph
    graph.owning_module = None  # rebuilt below, on a root that holds the attributes
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    first_op = next(n for n in graph.nodes if n.op != "placeholder")
    positions: list[int] = []
    attrs: dict[str, torch.Tensor] = {}
    for node, value in zip(placeholders, example_inputs, strict=True):
        if id(value) in leaf_position:
            positions.append(leaf_position[id(value)])
            continue
        # A tensor that is neither an input nor module state (a global) becomes a constant.
        target = names.get(id(value), f"_captured_constant_{len(attrs)}")
        attrs[target] = value
        with graph.inserting_before(first_op):
            attr = graph.get_attr(target)
        attr.meta = dict(node.meta)
        node.replace_all_uses_with(attr)
        graph.erase_node(node)
    for node in graph.nodes:
        node.meta.pop("grapharg", None)
    out = fx.GraphModule(attrs, graph, class_name=f"{type(module).__name__}Graph")
    out.meta["input_positions"] = positions
    return out
