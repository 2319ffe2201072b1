"""Custom ``torch.fx`` tracers that extend :class:`torch.fx.Tracer` through its hooks.

Each tracer overrides one documented hook (``is_leaf_module``, ``call_module``,
``create_proxy``, ``create_arg``) and calls ``super()``, so tracers compose by
multiple inheritance::

    class MyTracer(ModulePathTracer, DeepTracer): ...
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

import einops
import torch
from torch import fx, nn
from torch.fx.node import Argument

__all__ = ["DeepTracer", "ModulePathTracer"]

MODULE_PATH_KEY = "module_path"


def _default_autowrap_modules() -> tuple[types.ModuleType, ...]:
    import unitscale.functional

    return (math, einops, unitscale.functional)


class ModulePathTracer(fx.Tracer):
    """Records, for every node, the qualified name of the module it came from.

    The name is kept in ``tracer.node_to_originating_module[node]`` and in
    ``node.meta["module_path"]``; the root module is ``""``. The ``output`` node
    is not recorded. State lives on the instance.

    >>> from torch import nn
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> tracer = ModulePathTracer()
    >>> graph = tracer.trace(model)
    >>> {n.name: tracer.node_to_originating_module.get(n) for n in graph.nodes}
    {'input_1': '', '_0': '0', '_1': '1', 'output': None}
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.current_module_path = ""
        self.node_to_originating_module: dict[fx.Node, str] = {}

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        outer = self.current_module_path
        self.current_module_path = self.path_of_module(m)
        try:
            return super().call_module(m, forward, args, kwargs)
        finally:
            self.current_module_path = outer

    def create_proxy(self, kind: str, target: Any, args: Any, kwargs: Any, *rest: Any, **kw: Any) -> fx.Proxy:
        proxy = super().create_proxy(kind, target, args, kwargs, *rest, **kw)
        self.node_to_originating_module[proxy.node] = self.current_module_path
        proxy.node.meta[MODULE_PATH_KEY] = self.current_module_path
        return proxy


class DeepTracer(fx.Tracer):
    """A tracer that recurses into every submodule, down to torch functions.

    Functions from ``autowrap_modules`` (by default ``math``, ``einops`` and
    ``unitscale.functional``) and ``autowrap_functions`` stay single nodes.
    Callable arguments (a function passed to ``forward``, or to an op) become
    placeholders; their values are kept in ``tracer.callable_args`` (placeholder
    name -> callable), to be passed after the ordinary inputs when running.

    Args:
        recurse_modules: trace into submodules (``False``: every submodule is a leaf).
        autowrap_modules: modules whose functions are kept as single nodes.
        autowrap_functions: extra functions kept as single nodes.

    >>> from torch import nn
    >>> graph = DeepTracer().trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    >>> [n.op for n in graph.nodes]
    ['placeholder', 'get_attr', 'get_attr', 'call_function', 'call_function', 'output']
    """

    def __init__(
        self,
        recurse_modules: bool = True,
        autowrap_modules: tuple[types.ModuleType, ...] | None = None,
        autowrap_functions: tuple[Callable[..., Any], ...] = (),
    ) -> None:
        if autowrap_modules is None:
            autowrap_modules = _default_autowrap_modules()
        super().__init__(
            autowrap_modules=tuple(autowrap_modules),
            autowrap_functions=tuple(autowrap_functions),
        )
        self.recurse_modules = recurse_modules
        self.callable_args: dict[str, Callable[..., Any]] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return not self.recurse_modules and super().is_leaf_module(m, module_qualified_name)

    def create_arg(self, a: Any) -> Argument:
        # fx cannot put a Python function into generated code; a placeholder keeps
        # the graph runnable and visible.
        if isinstance(a, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) and not isinstance(
            a, nn.Module
        ):
            for name, fn in self.callable_args.items():
                if fn is a:
                    return self._callable_nodes[name]
            placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
            where = self.graph.inserting_after(placeholders[-1]) if placeholders else self.graph.inserting_before()
            with where:
                node = self.graph.placeholder(getattr(a, "__name__", "fn"))
            self.callable_args[node.name] = a
            self._callable_nodes[node.name] = node
            return node
        return super().create_arg(a)

    def trace(self, root: Any, concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        self.callable_args = {}
        self._callable_nodes: dict[str, fx.Node] = {}
        return super().trace(root, concrete_args)

