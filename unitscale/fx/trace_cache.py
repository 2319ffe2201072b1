"""Trace once, track many times: a cache of scale-tracking traces per module.

Tracing a transformer costs about as much as a tenth of its forward and backward pass,
so re-tracing on every call of :func:`unitscale.track_scales` would dominate its
overhead. A trace is reused while the module's *fingerprint* is unchanged: the identity
and type of every submodule, its ``forward``, its ``training`` flag and other plain
attributes (``int``, ``float``, ``bool``, ``str``, ``None``, dtypes, and tuples, lists, dicts and
frozensets of them) by value, any other attribute by type and identity, and its parameter
and buffer names. Those are what a trace can depend on without reading tensor values.
What the fingerprint cannot see (a global, an object changed in place) needs
:func:`clear_trace_cache`. The cache holds modules weakly.
"""

from __future__ import annotations

import types
import typing
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from unitscale.fx.autowrap import default_autowrap_modules
from unitscale.fx.trace_errors import describe_failure, trace_error
from unitscale.fx.tracers import DeepTracer, ModulePathTracer

__all__ = ["DeepPathTracer", "Trace", "trace_for_scales", "trace_or_reason", "clear_trace_cache"]

_PLAIN = (bool, int, float, str, type(None), torch.dtype)
# What nn.Module.__init__ puts in every module's __dict__: parameters, buffers, submodules
# and hooks, fingerprinted on their own (``training`` is compared like any attribute).
_MODULE_INTERNALS = frozenset(vars(nn.Module())) - {"training"}


class DeepPathTracer(ModulePathTracer, DeepTracer):
    """A :class:`~unitscale.fx.DeepTracer` that also records module paths.

    Type annotations that are strings (a module written with ``from __future__ import
    annotations``) are resolved to types, or dropped when they cannot be: fx would put
    the string into the code's globals, and the ``GraphModule`` would not pickle.

    >>> from unitscale.examples.models import MLP
    >>> from unitscale.fx.trace_cache import DeepPathTracer
    >>> graph = DeepPathTracer().trace(MLP(4))
    >>> [(n.name, n.meta["module_path"]) for n in graph.nodes if n.op == "call_function"]
    [('linear', 'fc1'), ('relu', 'act'), ('linear_1', 'fc2')]
    >>> [n.type for n in graph.nodes if n.op == "placeholder"]
    [<class 'torch.Tensor'>]
    """

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        graph = super().trace(root, concrete_args)
        if any(isinstance(n.type, str) for n in graph.nodes):
            fn = root.forward if isinstance(root, nn.Module) else root
            try:
                hints = typing.get_type_hints(fn)
            except Exception:
                hints = {}
            for n in graph.nodes:
                if isinstance(n.type, str):
                    key = "return" if n.op == "output" else n.target
                    n.type = hints.get(key) if isinstance(hints.get(key), type) else None
        return graph


@dataclass(frozen=True)
class Trace:
    """A traced graph, the callables to pass after the inputs, and the graph's code.

    ``namespace``: the globals the code runs in (``None`` where not kept).
    """

    graph: fx.Graph
    extra_inputs: tuple[Any, ...]
    code: str
    namespace: dict[str, Any] | None = None


def _value_key(value: Any) -> Any:
    """What a trace may depend on in an attribute's value, as a comparable key.

    Plain values, and tuples, lists, dicts and frozensets of them, by value (a ``forward`` may
    branch on them; ``transformers`` models rebuild dicts of strings on every call); anything
    else by type and identity, so a new object always means a new trace.
    """
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_value_key(v) for v in value))
    if type(value) is dict and all(isinstance(k, _PLAIN) for k in value):
        return (dict, tuple((k, _value_key(v)) for k, v in value.items()))
    if isinstance(value, frozenset):
        try:
            return (frozenset, frozenset(_value_key(v) for v in value))
        except TypeError:  # an element whose key does not hash
            pass
    return (type(value), id(value))


def _fingerprint(module: nn.Module) -> tuple[Any, ...]:
    parts = []
    for name, m in module.named_modules(remove_duplicate=False):
        state = vars(m)
        # A tensor attribute is a constant that tracing copies into the graph (and stores on
        # the root as ``_tensor_constant0``, a new object each trace): not a reason to retrace.
        plain = tuple(
            (k, _value_key(v))
            for k, v in state.items()
            if k not in _MODULE_INTERNALS and not isinstance(v, torch.Tensor)
        )
        parts.append(
            (
                name,
                id(m),
                type(m),
                id(getattr(type(m), "forward", None)),
                id(state.get("forward")),
                plain,
                tuple((k, v is None) for k, v in m._parameters.items()),
                tuple((k, v is None) for k, v in m._buffers.items()),
            )
        )
    return tuple(parts)


def _graph_code(graph: fx.Graph) -> str:
    return _graph_code_and_globals(graph)[0]


def _graph_code_and_globals(graph: fx.Graph) -> tuple[str, dict[str, Any]]:
    # Type annotations (``x : _torch_Tensor_``) are noise here: hide them while
    # generating, then put them back, so the graph is left as it was.
    saved = [(n, n.type) for n in graph.nodes if n.type is not None]
    try:
        for n, _ in saved:
            n.type = None
        code = graph.python_code(root_module="self")
        return code.src, code.globals
    finally:
        for n, t in saved:
            n.type = t


_cache: weakref.WeakKeyDictionary[nn.Module, tuple[Any, Trace | str]] = weakref.WeakKeyDictionary()


def trace_or_reason(
    module: nn.Module,
    recurse_modules: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
) -> Trace | str:
    """The (cached) trace of ``module``, or why torch.fx cannot trace it (``"file:line (`code`): why"``)."""
    if isinstance(module, fx.GraphModule):
        return Trace(module.graph, (), _graph_code(module.graph))
    autowrap_modules = default_autowrap_modules() if autowrap_modules is None else tuple(autowrap_modules)
    key = (
        recurse_modules,
        autowrap_modules,
        tuple(autowrap_functions),
        _fingerprint(module),
    )
    cached = _cache.get(module)
    if cached is None or cached[0] != key:
        tracer = DeepPathTracer(
            recurse_modules=recurse_modules, autowrap_modules=autowrap_modules, autowrap_functions=autowrap_functions
        )
        try:
            graph = tracer.trace(module)
            src, namespace = _graph_code_and_globals(graph)
            result: Trace | str = Trace(graph, tuple(tracer.callable_args.values()), src, namespace)
        except Exception as e:
            result = describe_failure(e)
        cached = (key, result)
        _cache[module] = cached
    return cached[1]


def trace_for_scales(
    module: nn.Module,
    recurse_modules: bool = True,
    autowrap_modules: tuple[types.ModuleType, ...] | None = None,
    autowrap_functions: tuple[Callable[..., Any], ...] = (),
) -> Trace:
    """Trace ``module`` with a :class:`DeepPathTracer`, reusing a cached trace when valid.

    A ``GraphModule`` is not re-traced: its own graph is used.

    Args:
        module: the model.
        recurse_modules: trace into submodules.
        autowrap_modules: modules whose functions stay single nodes (``None``: the default).
        autowrap_functions: functions that stay single nodes.

    Returns:
        The :class:`Trace`.

    Raises:
        TraceError: torch.fx cannot trace the module; the message names the line.

    >>> from unitscale.examples.models import MLP
    >>> model = MLP(4)
    >>> trace_for_scales(model) is trace_for_scales(model)
    True
    """
    result = trace_or_reason(module, recurse_modules, autowrap_modules, autowrap_functions)
    if isinstance(result, str):
        raise trace_error(
            type(module).__name__,
            result,
            "Use capture='eager' (or 'auto') to record the ops as they run, or make that line "
            "independent of tensor values (e.g. pass the value as a Python constant).",
        )
    return result


def clear_trace_cache() -> None:
    """Forget every cached trace.

    The cache notices changes to a module's structure and attributes by itself (see the
    module's docstring); clear it when ``forward`` depends on something it cannot see,
    such as a global variable or an attribute of an object held by the module that was
    changed in place, or to time a first call.

    Importable as ``unitscale.tracking.clear_trace_cache``.

    >>> import torch
    >>> from unitscale.tracking import clear_trace_cache, track_scales
    >>> model = torch.nn.Linear(2, 2)
    >>> clear_trace_cache()  # the next track_scales(model) traces model afresh
    >>> track_scales(model, torch.randn(4, 2)).capture
    'fx'
    """
    _cache.clear()
