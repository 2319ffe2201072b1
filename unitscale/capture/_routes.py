"""The graph routes, one function each: ``(module, args, kwargs) -> (GraphModule, ExportedProgram | None)``.

Each raises whatever its tool raises; :func:`unitscale.capture.capture` turns that into
the route's reason. The graph each returns keeps the model's call signature:
``gm(*args, **kwargs)`` computes what ``module(*args, **kwargs)`` does.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.fx._lazy_graph_module import _make_graph_module, _use_lazy_graph_module

from unitscale.capture._dynamo import dynamo_graph, with_call_signature
from unitscale.capture._where import user_code_frame
from unitscale.fx.tracers import ModulePathTracer

__all__ = ["GRAPH_ROUTES", "RouteFn", "export_route", "flat_fx_route"]

RouteFn = Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], tuple[fx.GraphModule, Any]]

_PLAIN = (bool, int, float, str, type(None))


class _CaptureTracer(ModulePathTracer):
    """``torch.fx``'s standard leaf rule (``torch.nn`` modules stay ``call_module``), with paths and lines.

    Each node gets a one-frame ``stack_trace``: the innermost frame outside torch and
    unitscale. fx's own ``record_stack_traces`` formats the whole stack for every node,
    which made tracing four times slower on a 20,000-node graph.
    """

    def create_node(self, *args: Any, **kwargs: Any) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        frame = user_code_frame(sys._getframe(1))
        if frame is not None:
            code = frame.f_code
            node.meta["stack_trace"] = f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}'
        return node


class _FlatCaptureTracer(_CaptureTracer):
    """Traces through every module, ``torch.nn`` ones too: a graph of torch functions, no ``call_module``."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return False


def fx_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    return _fx(_CaptureTracer(), module, kwargs)


def flat_fx_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    """The ``fx`` route for ``capture(flat=True)``: ``nn.Linear`` is ``F.linear`` on its ``get_attr`` weight."""
    return _fx(_FlatCaptureTracer(), module, kwargs)


def _fx(tracer: _CaptureTracer, module: nn.Module, kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    # Plain keyword values (return_dict=False) are fixed, as fx cannot branch on a placeholder.
    concrete = {k: v for k, v in kwargs.items() if isinstance(v, _PLAIN)}
    graph = tracer.trace(module, concrete_args=concrete or None)
    # Python code for the graph is generated on first call, not here: capture checks the graph
    # with an interpreter and partition splits it, so a 20,000-node graph never pays ~0.4 s for it.
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
                ep = torch.export.export(module, args, kwargs or None, dynamic_shapes=dynamic_shapes, strict=strict)
            except Exception as exc:
                failure = exc
                continue
            # The guard check would be a call_module node (_guards_fn) in an otherwise flat graph,
            # and it pins the example's batch size.
            return ep.module(check_guards=False), ep
        raise failure

    return route


def dynamo_route(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[fx.GraphModule, None]:
    # The graph the transforms capture per signature, given the model's call signature.
    return with_call_signature(dynamo_graph(module, args, kwargs), module, args, kwargs), None


#: route name -> function, in the order ``route="auto"`` tries them.
GRAPH_ROUTES: dict[str, RouteFn] = {
    "fx": fx_route,
    "export": export_route(strict=False),
    "export-strict": export_route(strict=True),
    "dynamo": dynamo_route,
}
