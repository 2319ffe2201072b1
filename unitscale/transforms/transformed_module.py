"""The module that runs graph transforms over a captured forward, one graph per input signature.

A graph captured with example inputs serves every call that differs from them only in the batch
size (where the route left dimension 0 free); any other call is captured lazily with TorchDynamo.
"""

from __future__ import annotations

import copy
import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn
from torch.utils import _pytree as pytree

from unitscale.capture import capture
from unitscale.capture.toolkit import (
    GRAPH_ROUTE_NAMES,
    DynamoGraph,
    call_state,
    dynamo_graph,
    flat_graph_inputs,
    hook_key,
    no_torch_function_modes,
)
from unitscale.errors import InputError, NoRouteError, TraceError, TransformError, UnitscaleError
from unitscale.fx.module_state import pytree_specs_quiet
from unitscale.fx.nodes import MODULE_PATH_KEY
from unitscale.transforms.aten import to_torch_functions
from unitscale.transforms.scale_check import ScaleCheck, check_scale

__all__ = ["GraphTransform", "TransformedModule"]

logger = logging.getLogger(__name__)

GraphTransform = Callable[[fx.GraphModule], fx.GraphModule]
"""A graph pass, as :func:`~unitscale.transforms.apply_transform` takes it: a ``GraphModule`` in, one out."""


def _outside_dynamo(method: Callable[..., Any]) -> Callable[..., Any]:
    """``torch._dynamo.disable(method)``, made on the first call: importing TorchDynamo takes 1.5 s."""
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            disabled.append(torch._dynamo.disable(method))
        return disabled[0](*args, **kwargs)

    return call


@dataclass
class _CompiledGraph:
    """One lazily captured and transformed graph, with how to feed it and rebuild the output."""

    captured: DynamoGraph

    @property
    def graph_module(self) -> fx.GraphModule:
        return self.captured.graph_module

    def run(self, leaves: list[Any]) -> Any:
        inputs = [leaves[i] for i in self.captured.input_positions]
        if any(isinstance(x, fx.Proxy) for x in inputs):
            outs = _ProxyInliner(self.graph_module).run(*inputs)
        else:
            outs = self.graph_module.forward(*inputs)
        return self.captured.rebuild(outs, leaves)


@dataclass
class _EagerGraph:
    """The graph captured with example inputs: it has the model's call signature."""

    graph_module: fx.GraphModule
    module: nn.Module
    key: Any
    batch_free: bool

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        inputs = flat_graph_inputs(self.graph_module, self.module, args, kwargs)
        if any(isinstance(x, fx.Proxy) for x in pytree.tree_leaves(inputs)):
            flat = _ProxyInliner(self.graph_module).run(*inputs, enable_io_processing=False)
            return self.graph_module.graph._codegen.process_outputs(flat)
        if isinstance(self.graph_module.graph._codegen, fx.graph._PyTreeCodeGen):
            return self.graph_module(*args, **kwargs)
        return self.graph_module(*inputs)


class _ProxyInliner(fx.Interpreter):
    """Replays a graph into the tracer tracing the caller: its forward's globals would be traced into."""

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
        if node is None or MODULE_PATH_KEY not in node.meta or not hasattr(tracer, "current_module_path"):
            return tracer.create_proxy(kind, target, args, kwargs, name=name)
        outer = tracer.current_module_path
        # the wrapped model is the transformed module's submodule ``module``
        tracer.current_module_path = ".".join(p for p in ("module", node.meta[MODULE_PATH_KEY]) if p)
        try:
            return tracer.create_proxy(kind, target, args, kwargs, name=name)
        finally:
            tracer.current_module_path = outer

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self._emit("call_function", target, args, kwargs)

    def call_method(self, target: Any, args: Any, kwargs: Any) -> Any:
        return self._emit("call_method", target, args, kwargs)


class TransformedModule(nn.Module):
    """A module whose forward runs ``module``'s captured graph after ``transforms``.

    ``module`` is a registered submodule, so parameters, ``train()``/``eval()`` and ``.to()``
    work as usual. Without example inputs, the graph is captured with TorchDynamo once per
    input signature (shapes, dtypes, non-tensor values, each submodule's training flag),
    eagerly: under ``torch.compile`` a new signature breaks the graph once, so for
    ``fullgraph=True`` call the module once eagerly first. With example inputs the graph is
    captured at once and serves calls of any batch size. Extend it with :func:`apply_transform`, not a subclass.

    Attributes:
        route: the capture route of the latest graph (``"fx"``, ``"export"``,
            ``"export-strict"``, ``"dynamo"``; ``None`` before any capture).
        reasons: why each route tried before ``route`` failed (eager capture).
        unscaled_ops: ops :func:`unit_scale` left as they were, one line each (op, node, module, source line).
        kept_ops: ops :func:`unit_scale` kept because they keep unit scale (rotary embeddings,
            products of activations), one ``"<op>: <reason>"`` line each.
        unscaled_regions: higher-order ops (``cond``, ``while_loop``, ``map``, scans, an inlined
            ``vmap``) :func:`unit_scale` left whole, one ``"<first op>: <n> op(s) left whole"`` line each.
        loss_scales: the gradient factor of each unit-scaled loss (shared by a graph's losses), one line each.
        scale_check: what :func:`unit_scale` measured along the latest graph, on the call
            that captured it (``None`` before the first capture and for other transforms).

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import unit_scale
    >>> scaled = unit_scale(nn.Sequential(nn.Linear(8, 8), nn.GELU()))
    >>> scaled.graph_module is None, scaled.route  # nothing captured before the first call
    (True, None)
    >>> scaled(torch.randn(4, 8)).shape, scaled.unscaled_ops, scaled.route
    (torch.Size([4, 8]), [], 'dynamo')
    """

    def __init__(self, module: nn.Module, transforms: tuple[GraphTransform, ...]) -> None:
        super().__init__()
        self.module = module
        self.training = module.training  # a model wrapped in eval mode is captured in eval mode
        self.transforms = tuple(transforms)
        # unit_scale's frozen gradient factors are the wrapper's: out of reach of the capture's buffer restore
        for transform in self.transforms:
            state = getattr(transform, "grad_scales", None)
            if isinstance(state, nn.Module):
                self.grad_scales = state
        self._captured: dict[Any, _CompiledGraph] = {}
        self._latest: _CompiledGraph | _EagerGraph | None = None
        self._eager: _EagerGraph | None = None
        self._eager_spec: tuple[tuple[Any, ...], dict[str, Any], str | Sequence[str]] | None = None
        self._eager_modes: dict[Any, _EagerGraph | None] = {}
        self.route: str | None = None
        self.reasons: dict[str, str] = {}
        self.unscaled_ops: list[str] = []
        self.kept_ops: list[str] = []
        self.unscaled_regions: list[str] = []
        self.loss_scales: list[str] = []
        self.scale_check: ScaleCheck | None = None

    @property
    def graph_module(self) -> fx.GraphModule | None:
        """The transformed graph of the latest capture (``None`` before the first)."""
        return None if self._latest is None else self._latest.graph_module

    @classmethod
    def wrap(cls, module: nn.Module, transforms: tuple[GraphTransform, ...]) -> TransformedModule:
        """A ``TransformedModule`` whose ``forward`` has the parameter names of ``module.forward``.

        ``torch.fx`` then names the traced placeholders ``x`` or ``idx`` rather than one ``*args``.

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
                    f"inputs (which captures its graph) before tracing it with torch.fx, or pass example_inputs"
                )
            # A tracer's proxies have no shapes: the eager graph, when there is one, takes any batch.
            if self._eager is not None:
                return self._eager.run(args, kwargs)
            assert isinstance(self._latest, _CompiledGraph)  # only captures set _latest
            return self._latest.run(leaves)
        mode = _modes(self.module)
        eager = self._eager
        if eager is not None and eager.key[0] != mode and self._eager_spec is not None:
            # Another mode (train()/eval(), no_grad, a hook): captured again by the same routes, as the model may need
            eager = self._eager_for_mode(mode)
        if eager is not None and eager.key == _eager_key(mode, args, kwargs, leaves, eager.batch_free):
            return eager.run(args, kwargs)
        key = (mode, len(args), tuple(kwargs), tuple(_signature(leaf) for leaf in leaves))
        captured = self._captured.get(key) or self._capture(args, kwargs, leaves, key)
        return captured.run(leaves)

    @_outside_dynamo
    def _capture(self, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], key: Any) -> _CompiledGraph:
        with _state_kept(self.module):
            found = dynamo_graph(self.module, args, kwargs)
        found.graph_module = _run_transforms(self.module, self.transforms, found.graph_module)
        self._captured[key] = captured = _CompiledGraph(found)
        self._adopt(captured, "dynamo")
        model_outputs = [v for kind, v in found.output_plan if kind == "graph"]
        self._check(found.graph_module, [leaves[i] for i in found.input_positions], model_outputs)
        return captured

    def _adopt(self, graph: _CompiledGraph | _EagerGraph, route: str) -> None:
        self._latest = graph
        self.route = route
        for report in ("unscaled_ops", "kept_ops", "unscaled_regions", "loss_scales"):  # what the passes wrote
            setattr(self, report, list(graph.graph_module.meta.get(report, [])))

    @_outside_dynamo
    def capture_now(
        self,
        example_inputs: Any,
        example_kwargs: dict[str, Any] | None = None,
        route: str | Sequence[str] = "auto",
    ) -> TransformedModule:
        """Capture the graph now, on example inputs, by the capture layer's routes; returns ``self``.

        ``route="auto"`` tries every graph route of :func:`unitscale.capture.capture` in order;
        one name or a tuple forces them. The transforms run at once: their errors are raised here.

        Raises:
            InputError: example inputs the model cannot take.
            UnknownRouteError: an unknown route name.
            NoRouteError: no route captured the model (``NoGraphError`` for ``route="eager"``,
                which records ops and makes no graph); the message lists each route's reason.

        >>> import torch
        >>> from unitscale import unit_scale
        >>> scaled = unit_scale(torch.nn.Sequential(torch.nn.Linear(4, 4)), example_inputs=torch.randn(2, 4))
        >>> scaled.route, scaled(torch.randn(5, 4)).shape
        ('fx', torch.Size([5, 4]))
        """
        self._eager_modes = {}
        self._capture_eager(example_inputs, example_kwargs, route)
        return self

    @_outside_dynamo
    def _eager_for_mode(self, mode: Any) -> _EagerGraph | None:
        """The graph of the example inputs captured in ``mode`` (captured now if new); ``None`` if no route takes it."""
        if mode not in self._eager_modes:
            assert self._eager_spec is not None  # only called with example inputs
            args, kwargs, route = self._eager_spec
            try:
                self._capture_eager(args, kwargs, route)
            except NoRouteError:
                self._eager_modes[mode] = None  # the call is captured lazily, by TorchDynamo
        return self._eager_modes[mode]

    def _capture_eager(self, example_inputs: Any, example_kwargs: dict[str, Any] | None, route: Any) -> None:
        routes = GRAPH_ROUTE_NAMES if route == "auto" else route
        with no_torch_function_modes(), _state_kept(self.module):
            cap = capture(self.module, example_inputs, example_kwargs, route=routes, dynamic_batch=True, flat=True)
        gm = cap.require_graph(f"{type(self).__name__} (apply_transform, unit_scale, simulate_format)")
        if cap.route.startswith("export"):
            to_torch_functions(gm)
        for node in gm.graph.nodes:
            if "example_value" not in node.meta and "val" in node.meta:
                node.meta["example_value"] = node.meta["val"]
        batch_free = _batch_free(gm, cap.route)
        gm = _run_transforms(self.module, self.transforms, gm)
        args, kwargs = cap.example_inputs, cap.example_kwargs
        leaves = pytree.tree_leaves((args, kwargs))
        key = _eager_key(_modes(self.module), args, kwargs, leaves, batch_free)
        eager = _EagerGraph(gm, self.module, key, batch_free)
        self._eager, self._eager_spec, self.reasons = eager, (args, kwargs, route), dict(cap.reasons)
        self._eager_modes[key[0]] = eager
        self._adopt(eager, cap.route)
        self._check(gm, flat_graph_inputs(gm, self.module, args, kwargs))

    def _check(self, gm: fx.GraphModule, inputs: list[Any], outputs: list[int] | None = None) -> None:
        """Measure the std along a new graph (:func:`~unitscale.transforms.scale_check.check_scale`), for unit_scale."""
        if not any(getattr(t, "checks_scale", False) for t in self.transforms):
            return
        with _state_kept(self.module):
            # a graph captured without grad serves calls without grad: its backward is not the call's
            self.scale_check = check_scale(gm, inputs, outputs=outputs, backward=torch.is_grad_enabled())
        if not self.scale_check.ok:
            logger.warning(
                "unit_scale: %s is off unit scale: %s", type(self.module).__name__, self.scale_check.summary()
            )

    def __deepcopy__(self, memo: dict[int, Any]) -> TransformedModule:
        # Copying a captured graph module copies its pytree specs, which trips torch's LeafSpec FutureWarning.
        new = type(self).__new__(type(self))
        memo[id(self)] = new
        with pytree_specs_quiet():
            new.__setstate__(copy.deepcopy(self.__dict__, memo))
        return new

    def extra_repr(self) -> str:
        names = ", ".join(getattr(t, "__name__", type(t).__name__) for t in self.transforms)
        return f"route={self.route!r}, transforms=[{names}]"


@contextmanager
def _state_kept(module: nn.Module) -> Iterator[None]:
    """Run a capture (which runs the model) leaving buffers and the random number generator as they were."""
    kept = [(b, b.detach().clone()) for b in module.buffers()]
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            with torch.no_grad():
                for buffer, value in kept:
                    buffer.copy_(value)


def _batch_free(gm: fx.GraphModule, route: str) -> bool:
    """Whether the graph takes any batch size: fx graphs do; an exported one where dim 0 stayed symbolic."""
    if route == "fx":
        return True
    if not route.startswith("export"):
        return False
    values = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    tensors = [v for v in values if isinstance(v, torch.Tensor) and v.dim() > 0]
    return bool(tensors) and all(isinstance(v.shape[0], torch.SymInt) for v in tensors)


def _modes(module: nn.Module) -> tuple[Any, ...]:
    """Every submodule's training flag and hooks, and grad mode, inference mode and autocast: one graph per mode."""
    return (tuple((m.training, hook_key(m)) for m in module.modules()), call_state())


def _eager_key(
    modes: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], batch_free: bool
) -> Any:
    def leaf_key(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and batch_free and leaf.dim() > 0:
            return (tuple(leaf.shape[1:]), leaf.dim(), leaf.dtype, leaf.device)
        return _signature(leaf)

    return (modes, len(args), tuple(kwargs), tuple(leaf_key(leaf) for leaf in leaves))


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


def _run_transforms(module: nn.Module, transforms: tuple[GraphTransform, ...], gm: fx.GraphModule) -> fx.GraphModule:
    for transform in transforms:
        name = getattr(transform, "__name__", type(transform).__name__)
        try:
            result = transform(gm)
        except (UnitscaleError, Warning):  # a warning raised as an error (``-W error``) is the transform's own
            raise
        except Exception as exc:
            raise TransformError(
                f"the graph transform {name!r} raised {type(exc).__name__}: {exc} on the graph of "
                f"{type(module).__name__}; fix the transform (it gets and returns an fx.GraphModule)"
            ) from exc
        if not isinstance(result, fx.GraphModule):
            raise TransformError(
                f"the graph transform {name!r} returned {type(result).__name__} {result!r:.40}, not an "
                "fx.GraphModule; return the (changed) GraphModule, e.g. end it with `gm.recompile(); return gm`"
            )
        gm = result
    return gm


def _check_route_inputs(example_inputs: Any, route: Any) -> None:
    if example_inputs is None and route != "auto":
        raise InputError(
            f"route={route!r} chooses how example inputs are captured, but no example_inputs were given; "
            "pass example_inputs=(...) as well, or leave route='auto' for a lazy TorchDynamo capture"
        )
