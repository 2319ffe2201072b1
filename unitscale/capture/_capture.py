"""``capture(module, example_inputs)``: one graph of a model, whichever route can take it."""

from __future__ import annotations

import functools
import inspect
import typing
import warnings
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx, nn

from unitscale.capture._cache import cached, input_signature
from unitscale.capture._eager import RecordedOp, record_eager
from unitscale.capture._kv_cache import no_kv_cache, refuse_kv_cache
from unitscale.capture._meta import normalise_graph
from unitscale.capture._routes import GRAPH_ROUTES, DeepTracing, RouteFn, deep_fx_route, export_route, flat_fx_route
from unitscale.capture._verify import kept_state, record_and_compare
from unitscale.capture._where import exception_summary, failure_frame
from unitscale.errors import (
    InputError,
    MetaTensorError,
    NoGraphError,
    NoRouteError,
    NotAModuleError,
    OutOfMemoryError,
    UnknownRouteError,
)
from unitscale.fx.global_state import GLOBAL_STATE_LOCK
from unitscale.fx.nodes import COMPUTE_OPS

__all__ = ["ROUTES", "GRAPH_ROUTE_NAMES", "Capture", "capture"]

#: Every route, in the order ``route="auto"`` tries them: ``torch.fx``, ``torch.export``
#: (non-strict, then strict), TorchDynamo (``fullgraph=True``), and a record of the ops run eagerly.
ROUTES: tuple[str, ...] = ("fx", "export", "export-strict", "dynamo", "eager")
#: The routes that give a graph (``route="graph"`` tries these).
GRAPH_ROUTE_NAMES: tuple[str, ...] = ROUTES[:-1]


class _HeldModule:
    """``Capture.module``: held strongly, or weakly once cached (a strong reference to its key would leak both)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = f"_{name}_ref"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        held = obj.__dict__[self.slot]
        return held() if isinstance(held, weakref.ref) else held

    def __set__(self, obj: Any, value: Any) -> None:
        obj.__dict__[self.slot] = value


@dataclass(repr=False)
class Capture:
    """One captured forward pass of ``module`` on example inputs.

    Attributes:
        module: the captured model (held weakly when captured with ``cache=True``).
        route: the route that captured it (one of :data:`ROUTES`).
        graph_module: a runnable ``fx.GraphModule`` with the model's call signature, or ``None``
            (eager route); every node carries ``module_path``, ``module_type``, ``source``,
            ``val`` and (tensors) ``tensor_meta``.
        exported_program: the ``torch.export.ExportedProgram`` (export routes), else ``None``.
        reasons: ``route -> why it failed`` for each route tried before ``route``.
        ops: the eager route's recorded ops.
        module_calls: the eager route's module paths in call order.
        warnings: warnings the successful route raised, ``"Category: message"``.
        example_inputs: the positional inputs it was captured with.
        example_kwargs: the keyword inputs it was captured with.
        extra_inputs: values for the placeholders the ``fx`` route made of function arguments
            (``deep=``), passed after the inputs when the graph runs.
        checked: whether the graph was found to compute the model's outputs (``check=False``
            runs nothing; an eager capture made so has recorded no op yet).
        kv_cache_disabled: paths of the modules whose key/value cache was switched off for the
            capture (:func:`~unitscale.capture.no_kv_cache`): the graph returns no cache.
    """

    module: nn.Module
    route: str
    graph_module: fx.GraphModule | None
    exported_program: Any = None
    reasons: dict[str, str] = field(default_factory=dict)
    ops: list[RecordedOp] = field(default_factory=list)
    module_calls: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    example_inputs: tuple[Any, ...] = ()
    example_kwargs: dict[str, Any] = field(default_factory=dict)
    extra_inputs: tuple[Any, ...] = ()
    checked: bool = True
    kv_cache_disabled: tuple[str, ...] = ()
    _code: tuple[str, dict[str, Any]] | None = field(default=None, repr=False)

    def python_code(self) -> tuple[str, dict[str, Any]]:
        """The graph's Python code as fx writes it (``self`` the root, no type annotations), and its globals.

        Raises:
            NoGraphError: the capture is an eager op record.

        >>> import torch
        >>> from unitscale.capture import capture
        >>> from unitscale.examples import MLP
        >>> code, _ = capture(MLP(4), torch.randn(2, 4)).python_code()
        >>> print(code.strip())
        def forward(self, x):
            fc1 = self.fc1(x);  x = None
            act = self.act(fc1);  fc1 = None
            fc2 = self.fc2(act);  act = None
            return fc2
        """
        if self._code is None:
            graph = self.require_graph("Capture.python_code()").graph
            # Annotations are noise here: hidden while generating, then put back.
            saved = [(n, n.type) for n in graph.nodes if n.type is not None]
            try:
                for n, _ in saved:
                    n.type = None
                code = graph.python_code(root_module="self")
            finally:
                for n, t in saved:
                    n.type = t
            self._code = (code.src, code.globals)
        return self._code

    def require_graph(self, tool: str) -> fx.GraphModule:
        """The graph module, or :class:`~unitscale.errors.NoGraphError` naming ``tool`` and every reason."""
        if self.graph_module is None:
            raise NoGraphError(
                f"{tool} needs a graph of {type(self.module).__name__}, but no graph route captured it "
                f"(only the eager op record exists):\n{_list_reasons(self.reasons)}",
                self.reasons,
            )
        return self.graph_module

    def nodes(self, compute_only: bool = False) -> list[fx.Node]:
        """The graph's nodes in execution order (``compute_only``: calls only, no inputs/attributes/output).

        Raises:
            NoGraphError: the capture is an eager op record.
        """
        graph = self.require_graph("Capture.nodes()").graph
        return [n for n in graph.nodes if not compute_only or n.op in COMPUTE_OPS]

    def __repr__(self) -> str:
        if self.graph_module is not None:
            count = f"{len(self.nodes())} nodes"
        else:
            count = f"{len(self.ops)} ops recorded" if self.checked else "not run: the tool records the ops"
        failed = f"; failed: {', '.join(self.reasons)}" if self.reasons else ""
        return f"Capture({type(self.module).__name__} via {self.route!r}, {count}{failed})"


# set after the class is made, so that the dataclass sees a field without a default
_held = _HeldModule()
_held.__set_name__(Capture, "module")
Capture.module = _held  # type: ignore[assignment]


def _list_reasons(reasons: dict[str, str]) -> str:
    return "\n".join(f"  {route}: {why}" for route, why in reasons.items())


def _routes(route: str | Sequence[str]) -> tuple[str, ...]:
    if isinstance(route, str):
        if route == "auto":
            return ROUTES
        if route == "graph":
            return GRAPH_ROUTE_NAMES
        routes: tuple[str, ...] = (route,)
    else:
        routes = tuple(route)
    unknown = [r for r in routes if r not in ROUTES]
    if unknown or not routes:
        raise UnknownRouteError(
            f"capture(route=...) got {route!r}; pass 'auto', 'graph', one of {', '.join(map(repr, ROUTES))}, "
            "or a tuple of them"
        )
    return routes


def _mentions_tensor(annotation: Any) -> bool:
    if annotation is inspect.Parameter.empty:
        return False
    text = annotation if isinstance(annotation, str) else repr(annotation)
    return "Tensor" in text and "Callable" not in text


def _read_signature(forward: Any) -> tuple[inspect.Signature, dict[str, Any]] | None:
    try:
        signature = inspect.signature(forward)
    except (TypeError, ValueError):
        return None
    try:
        hints = typing.get_type_hints(forward)
    except Exception:
        hints = {}
    return signature, hints


@functools.lru_cache(maxsize=256)
def _method_signature(function: Any) -> tuple[inspect.Signature, dict[str, Any]] | None:
    found = _read_signature(function)
    if found is None:
        return None
    signature, hints = found
    return signature.replace(parameters=list(signature.parameters.values())[1:]), hints  # without self


def _forward_signature(forward: Any) -> tuple[inspect.Signature, dict[str, Any]] | None:
    """``forward``'s signature (without ``self``) and annotations, read once per class (they cost a cached capture)."""
    function = getattr(forward, "__func__", None)
    if function is None:  # a function set on the instance: read each time
        return _read_signature(forward)
    return _method_signature(function)


def _check_inputs(module: nn.Module, example_inputs: Any, kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    name = type(module).__name__
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    elif isinstance(example_inputs, list):
        example_inputs = tuple(example_inputs)
    elif isinstance(example_inputs, dict):
        raise InputError(
            f"example_inputs is a dict (keys {', '.join(map(repr, example_inputs))}); pass positional inputs "
            "as a tuple and keyword inputs as capture(model, args, kwargs={...})"
        )
    elif not isinstance(example_inputs, tuple):
        raise InputError(
            f"example_inputs must be a tensor or a tuple of {name}'s positional inputs, got "
            f"{type(example_inputs).__name__}; convert arrays with torch.as_tensor"
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise InputError(f"kwargs must be a dict of {name}'s keyword inputs by name, got {type(kwargs).__name__}")
    found = _forward_signature(module.forward)
    if found is None:
        return example_inputs, dict(kwargs)
    signature, hints = found
    params = signature.parameters
    missing_kw = [
        p.name for p in params.values() if p.kind is p.KEYWORD_ONLY and p.default is p.empty and p.name not in kwargs
    ]
    if missing_kw:
        wanted = ", ".join(f"{k!r}: ..." for k in missing_kw)
        raise InputError(
            f"{name}.forward takes keyword-only input(s) {', '.join(map(repr, missing_kw))}, which example_inputs "
            f"(positional) cannot fill; pass them as capture(model, example_inputs, kwargs={{{wanted}}})"
        )
    try:
        bound = signature.bind(*example_inputs, **kwargs)
    except TypeError as e:
        names = ", ".join(p.name for p in params.values())
        raise InputError(
            f"{name}.forward({names}) cannot take {len(example_inputs)} positional input(s)"
            f"{' and kwargs ' + ', '.join(map(repr, kwargs)) if kwargs else ''}: {e}"
        ) from None
    for arg, value in bound.arguments.items():
        annotation = hints.get(arg, params[arg].annotation)
        if params[arg].kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if _mentions_tensor(annotation) and value is not None and not isinstance(value, torch.Tensor):
            position = f"example_inputs[{list(params).index(arg)}]" if arg not in kwargs else f"kwargs[{arg!r}]"
            raise InputError(
                f"input {arg!r} ({position}) of {name}.forward is a {type(value).__name__}, where the forward "
                "expects a tensor; pass a torch.Tensor (torch.as_tensor converts lists and arrays)"
            )
    return example_inputs, dict(kwargs)


def _forward_line(module: nn.Module) -> str:
    """``Class.forward (file:line of its def)``: where a failure is, when no frame says more."""
    code = getattr(inspect.unwrap(type(module).forward), "__code__", None)
    if code is None:
        return f"{type(module).__name__}.forward"
    return f"{type(module).__name__}.forward ({code.co_filename}:{code.co_firstlineno})"


def _run_reference(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    try:
        # the model's warnings come again from the route that captures it (kept on cap.warnings)
        with kept_state(module), torch.no_grad(), warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            return module(*args, **kwargs)
    except Exception as e:
        shapes = ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else type(a).__name__ for a in args)
        if OutOfMemoryError.caused(e):
            raise OutOfMemoryError(
                f"{type(module).__name__} ran out of memory on the example inputs ({shapes}) at {failure_frame(e)}: "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; use smaller inputs (a smaller "
                "batch), free memory, or run on a device with more"
            ) from e
        raise InputError(
            f"{type(module).__name__} failed on the example inputs ({shapes}) at {failure_frame(e)}: "
            f"{type(e).__name__}: {e}. Check that they have the shapes and dtypes the model expects."
        ) from e


def capture(
    module: nn.Module,
    example_inputs: Any,
    kwargs: dict[str, Any] | None = None,
    route: str | Sequence[str] = "auto",
    *,
    dynamic_batch: bool = False,
    flat: bool = False,
    deep: DeepTracing | None = None,
    check: bool = True,
    cache: bool = False,
) -> Capture:
    """Capture ``module``'s forward on example inputs, trying the :data:`ROUTES` in order until one works.

    A graph must give the model's outputs on the example inputs, or its route counts as failed
    (unless ``check=False``). The model's buffers and the RNG are left as they were.

    Args:
        example_inputs: a tensor, or a tuple/list of positional inputs.
        kwargs: keyword inputs (needed for keyword-only parameters).
        route: ``"auto"`` (all routes), ``"graph"`` (all but eager), one route name, or a tuple of them.
        dynamic_batch: on the export routes, leave dimension 0 of every tensor input symbolic
            where the model does not pin it, so the graph runs on other batch sizes.
        flat: on the ``fx`` route, trace through ``torch.nn`` modules too (no ``call_module``
            node), as a graph transform such as :func:`unitscale.unit_scale` needs.
        deep: on the ``fx`` route, trace as :class:`DeepTracing` says. Not with ``flat``.
        check: ``False`` runs nothing: graphs are taken as traced (no ``val``/``tensor_meta``)
            and the eager route records no op, for a tool whose own run is the first.
        cache: reuse this module's capture for the same request while its fingerprint (and,
            for a graph specialised to them, the input shapes) is unchanged; see
            :func:`clear_capture_cache`. A cached capture is shared by every caller: copy its
            graph before editing it.

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        InputError: inputs of the wrong kind or number, a keyword-only input not in
            ``kwargs``, the model fails on them, or options that do not go together.
        KVCacheError: the model returns a key/value cache even with its configs' caches off.
        UnknownRouteError: an unknown route name.
        NoRouteError: no allowed route captured the model; ``reasons`` lists each route's
            failure, a :class:`~unitscale.errors.LostBehaviourError` for one that would lose
            part of the backward (a custom ``autograd.Function``, a reentrant checkpoint).

    >>> import torch
    >>> from unitscale.capture import capture
    >>> from unitscale.examples import MLP
    >>> capture(MLP(4), torch.randn(2, 4))
    Capture(MLP via 'fx', 5 nodes)
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"capture() got {type(module).__name__} {module!r:.60}; pass an nn.Module (wrap a function in one)"
        )
    routes = _routes(route)
    for flag, value in (("dynamic_batch", dynamic_batch), ("flat", flat), ("check", check), ("cache", cache)):
        if not isinstance(value, bool):
            raise InputError(f"capture({flag}=...) got {type(value).__name__} {value!r:.60}; pass True or False")
    if deep is not None and not isinstance(deep, DeepTracing):
        raise InputError(f"capture(deep=...) got {type(deep).__name__} {deep!r:.60}; pass a DeepTracing(...) or None")
    if deep is not None and flat:
        raise InputError("capture() got flat=True and deep=...; pick one way for the fx route to trace")
    args, kw = _check_inputs(module, example_inputs, kwargs)
    _refuse_meta(module, args, kw)

    def make() -> Capture:
        # A route may draw random numbers (tracing dropout); the caller's stream stays as it was.
        # No tool needs a decoder's KV cache, and no graph can return one: it is switched off.
        # Tracing and exporting patch torch.nn.Module for the whole process: one capture at a time.
        with GLOBAL_STATE_LOCK, torch.random.fork_rng(devices=[]), no_kv_cache(module) as switched:
            cap = _capture(module, routes, args, kw, _route_fns(dynamic_batch, flat, deep), check)
        cap.kv_cache_disabled = switched
        return cap

    if not cache:
        return make()

    def make_weak() -> Capture:
        cap = make()
        cap.__dict__["_module_ref"] = weakref.ref(module)  # the cache is keyed weakly by it
        return cap

    request = (routes, dynamic_batch, flat, deep, check)
    return cached(module, request, lambda: input_signature(module, args, kw), make_weak, _depends_on_inputs)


def _refuse_meta(module: nn.Module, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    """A model or input on the meta device holds no values: every route would fail on it (``.item()``, a check)."""
    named = [*module.named_parameters(), *module.named_buffers()]
    on_meta = [name for name, t in named if t.is_meta]
    on_meta += [f"input {i}" for i, a in enumerate([*args, *kw.values()]) if isinstance(a, torch.Tensor) and a.is_meta]
    if on_meta:
        shown = ", ".join(on_meta[:3]) + (f" and {len(on_meta) - 3} more" if len(on_meta) > 3 else "")
        raise MetaTensorError(
            f"{type(module).__name__} has tensors on the meta device ({shown}), which hold no values to run; "
            "materialise the model first (model.to_empty(device='cpu'), then initialise or load its weights) "
            "and pass real input tensors"
        )


def _depends_on_inputs(cap: Capture) -> bool:
    """Whether a capture holds anything made for the example inputs (a symbolic trace does not)."""
    return cap.checked or cap.route not in ("fx", "eager")


def _route_fns(dynamic_batch: bool, flat: bool, deep: DeepTracing | None) -> dict[str, RouteFn]:
    routes = dict(GRAPH_ROUTES)
    if dynamic_batch:
        routes["export"] = export_route(strict=False, dynamic_batch=True)
        routes["export-strict"] = export_route(strict=True, dynamic_batch=True)
    if flat:
        routes["fx"] = flat_fx_route
    if deep is not None:
        routes["fx"] = deep_fx_route(deep)
    return routes


def _capture(
    module: nn.Module,
    routes: tuple[str, ...],
    args: tuple[Any, ...],
    kw: dict[str, Any],
    route_fns: dict[str, RouteFn],
    check: bool,
) -> Capture:
    expected = _run_reference(module, args, kw) if check else None
    refuse_kv_cache(module, expected)  # a cache the config does not control (use_cache=True passed in)
    reasons: dict[str, str] = {}
    for name in routes:
        with warnings.catch_warnings(record=True) as caught:
            # A failed route's warnings are noise; a successful one's are kept on the result.
            warnings.simplefilter("always")
            try:
                result = _take_route(name, module, args, kw, route_fns, check, expected)
            except Exception as e:
                if OutOfMemoryError.caused(e):  # no other route will have more memory
                    raise OutOfMemoryError(
                        f"capturing {type(module).__name__} (route {name!r}) ran out of memory: "
                        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; use smaller example "
                        "inputs, free memory, or capture on a device with more"
                    ) from e
                reasons[name] = exception_summary(e, fallback=lambda: _forward_line(module))
                continue
        result.reasons = reasons
        result.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]
        result.example_inputs, result.example_kwargs = args, kw
        return result
    raise NoRouteError(
        f"no route could capture {type(module).__name__} (tried {', '.join(routes)}):\n{_list_reasons(reasons)}",
        reasons,
    )


def _take_route(
    name: str,
    module: nn.Module,
    args: tuple[Any, ...],
    kw: dict[str, Any],
    route_fns: dict[str, RouteFn],
    check: bool,
    expected: Any,
) -> Capture:
    if name == "eager":
        if not check:
            return Capture(module, name, None, checked=False)
        with kept_state(module), torch.no_grad():
            record = record_eager(module, args, kw)
        return Capture(module, name, None, ops=record.ops, module_calls=record.module_calls)
    gm, ep = route_fns[name](module, args, kw)
    if name != "fx" or gm is module:
        # the fx route's tracers write each node's origin as they make it; a GraphModule
        # taken as its own graph, and the other routes' graphs, are read here
        normalise_graph(gm, module)
    if check:
        record_and_compare(gm, module, args, kw, expected)
    extra = gm.meta.pop("extra_inputs", ()) if gm is not module else ()
    return Capture(module, name, gm, exported_program=ep, extra_inputs=extra, checked=check)
