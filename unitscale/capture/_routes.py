"""The graph routes, one function each: ``(module, args, kwargs) -> (GraphModule, ExportedProgram | None)``.

Each raises whatever its tool raises; :func:`unitscale.capture.capture` turns that into
the route's reason. The graph each returns keeps the model's call signature:
``gm(*args, **kwargs)`` computes what ``module(*args, **kwargs)`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn

from unitscale.fx.tracers import ModulePathTracer

__all__ = ["GRAPH_ROUTES", "RouteFn"]

RouteFn = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], tuple[fx.GraphModule, Any]]

_PLAIN = (bool, int, float, str, type(None))


class _CaptureTracer(ModulePathTracer):
    """``torch.fx``'s standard leaf rule (``torch.nn`` modules stay ``call_module``), with paths and lines."""

    def __init__(self) -> None:
        super().__init__()
        self.record_stack_traces = True


def fx_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    # Plain keyword values (return_dict=False) are fixed, as fx cannot branch on a placeholder.
    concrete = {k: v for k, v in kwargs.items() if isinstance(v, _PLAIN)}
    tracer = _CaptureTracer()
    graph = tracer.trace(module, concrete_args=concrete or None)
    return fx.GraphModule(tracer.root, graph, type(module).__name__), None


def _export(strict: bool) -> RouteFn:
    def route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, Any]:
        ep = torch.export.export(module, args, kwargs or None, strict=strict)
        # The guard check would be a call_module node (_guards_fn) in an otherwise flat graph;
        # the graph is specialised to the example inputs' shapes either way.
        return ep.module(check_guards=False), ep

    return route


def dynamo_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    result = torch._dynamo.export(module)(*args, **kwargs)
    return result.graph_module, None


#: route name -> function, in the order ``route="auto"`` tries them.
GRAPH_ROUTES: dict[str, RouteFn] = {
    "fx": fx_route,
    "export": _export(strict=False),
    "export-strict": _export(strict=True),
    "dynamo": dynamo_route,
}
