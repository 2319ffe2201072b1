"""The graph routes, one function each: ``(module, args, kwargs) -> (GraphModule, ExportedProgram | None)``.

Each raises whatever its tool raises (the route's reason); each graph keeps the model's call signature.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import torch
from torch import fx, nn
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

from unitscale.capture._dynamo import dynamo_graph, with_call_signature
from unitscale.capture._faithful import refuse_lost_functions, refuse_root_hooks
from unitscale.capture._tracers import CaptureTracer, DeepCaptureTracer, FlatCaptureTracer
from unitscale.fx.autograd_functions import functions_applied
from unitscale.fx.autowrap import default_autowrap_modules
from unitscale.fx.tracers import check_autowrap

__all__ = ["GRAPH_ROUTES", "DeepTracing", "RouteFn", "deep_fx_route", "export_route", "flat_fx_route"]

RouteFn = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], tuple[fx.GraphModule, Any]]

_PLAIN = (bool, int, float, str, type(None))


@dataclass(frozen=True)
class DeepTracing:
    """How the ``fx`` route traces for a tool that wants every op: ``capture(deep=DeepTracing(...))``.

    The route then traces with a :class:`~unitscale.fx.DeepTracer`, its arguments these fields;
    function arguments become placeholders, valued in :attr:`Capture.extra_inputs
    <unitscale.capture.Capture.extra_inputs>`. A ``GraphModule`` is taken as its own graph.

    Raises:
        PredicateError: ``autowrap_modules`` or ``autowrap_functions`` are not tuples of
            Python modules and functions.

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    >>> cap = capture(model, torch.randn(1, 2), deep=DeepTracing())
    >>> [(n.op, n.meta["module_path"]) for n in cap.nodes()][1:4]
    [('get_attr', '0'), ('get_attr', '0'), ('call_function', '0')]
    """

    recurse_modules: bool = True
    autowrap_modules: tuple[ModuleType, ...] | None = None
    autowrap_functions: tuple[Callable[..., Any], ...] = ()

    def __post_init__(self) -> None:
        check_autowrap(self.autowrap_modules, self.autowrap_functions, caller="DeepTracing")
        # None and the default modules spelt out are one request (one cache entry)
        modules = default_autowrap_modules() if self.autowrap_modules is None else tuple(self.autowrap_modules)
        object.__setattr__(self, "autowrap_modules", modules)
        object.__setattr__(self, "autowrap_functions", tuple(self.autowrap_functions))


def fx_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    return _fx(CaptureTracer(), module, kwargs)


def flat_fx_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    """The ``fx`` route for ``capture(flat=True)``: ``nn.Linear`` is ``F.linear`` on its ``get_attr`` weight."""
    return _fx(FlatCaptureTracer(), module, kwargs)


def deep_fx_route(deep: DeepTracing) -> RouteFn:
    """The ``fx`` route for ``capture(deep=...)``; the callables made placeholders go to ``meta["extra_inputs"]``."""

    def route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
        if isinstance(module, fx.GraphModule):
            return module, None
        tracer = DeepCaptureTracer(
            recurse_modules=deep.recurse_modules,
            autowrap_modules=deep.autowrap_modules,
            autowrap_functions=deep.autowrap_functions,
        )
        gm, _ = _fx(tracer, module, kwargs)
        gm.meta["extra_inputs"] = tuple(tracer.callable_args.values())
        return gm, None

    return route


def _fx(tracer: CaptureTracer, module: nn.Module, kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    # Plain keyword values (return_dict=False) are fixed, as fx cannot branch on a placeholder.
    concrete = {k: v for k, v in kwargs.items() if isinstance(v, _PLAIN)}
    refuse_root_hooks(module)
    with functions_applied(module, grad_switches=True) as applied:
        graph = tracer.trace(module, concrete_args=concrete or None)
    refuse_lost_functions(applied, "fx", module)
    # Python code for the graph is generated on first call, not here: capture checks the graph
    # with an interpreter, partition splits it and scale tracking writes its own, so no graph pays for it unused.
    with _use_lazy_graph_module(True):
        return _make_graph_module(tracer.root, graph, type(module).__name__), None


def export_route(strict: bool, dynamic_batch: bool = False) -> RouteFn:
    """The ``torch.export`` route; with ``dynamic_batch``, dimension 0 of every tensor input is
    left symbolic (``Dim.AUTO``) so the graph also runs on microbatches, static if that fails."""

    def route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, Any]:
        attempts: list[Any] = [None]
        batched = all(x is None or (isinstance(x, torch.Tensor) and x.dim() > 0) for x in args)
        if dynamic_batch and args and not kwargs and batched:
            attempts.insert(0, tuple(None if x is None else {0: torch.export.Dim.AUTO} for x in args))
        failure = Exception("no export attempted")
        for dynamic_shapes in attempts:
            try:
                with functions_applied(module) as applied:
                    ep = torch.export.export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=strict)
            except Exception as exc:
                failure = exc
                continue
            refuse_lost_functions(applied, "export-strict" if strict else "export", module)
            # The guard check would be a call_module node (_guards_fn) in an otherwise flat graph,
            # and it pins the example's batch size.
            return ep.module(check_guards=False), ep
        raise failure

    return route


def dynamo_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    return with_call_signature(dynamo_graph(module, args, kwargs), module, args, kwargs), None


#: route name -> function, in the order ``route="auto"`` tries them.
GRAPH_ROUTES: dict[str, RouteFn] = {
    "fx": fx_route,
    "export": export_route(strict=False),
    "export-strict": export_route(strict=True),
    "dynamo": dynamo_route,
}
