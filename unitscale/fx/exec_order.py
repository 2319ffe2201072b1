"""Execution order by symbolic tracing: which modules run, in what order, and which parameters they use.

:class:`ExecOrderTracer` records it as it traces (a tracer among the others of
:mod:`unitscale.fx.tracers`, so it composes with them); :func:`fx_exec_order` traces a module
with it; :class:`ExecOrder` is the result. :func:`unitscale.capture.trace_exec_order` falls
back to a capture of the model when ``torch.fx`` cannot trace it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import fx, nn
from torch.fx.node import Target

from unitscale.errors import NotAModuleError
from unitscale.fx.tracers import _Tracer

__all__ = ["ExecOrderTracer", "ExecOrder", "ParamUsageInfo", "fx_exec_order"]


class ParamUsageInfo(NamedTuple):
    """A group of parameters used together while tracing.

    Either ``module`` called an op on some of its own parameters (the names are then
    qualified from the traced root), or ``module`` is a leaf (or a called submodule) and
    ``named_params`` is all of ``module.named_parameters()``.

    Attributes:
        module: the module that used the parameters.
        named_params: ``(name, parameter)`` pairs, in the order they were used.
    """

    module: nn.Module
    named_params: list[tuple[str, nn.Parameter]]


@dataclass(repr=False)
class ExecOrder:
    """The forward execution order of a module, found by symbolic tracing.

    Attributes:
        module_forward_order: modules in the order their ``forward`` is called, the
            root first; a module called twice appears twice.
        param_forward_order: parameters in the order of their first use.
        module_to_param_usage_infos: for each called module, the parameter groups it
            used, in execution order (a module called again keeps its last call's).
        root: the traced module, used to name things.

    >>> from torch import nn
    >>> from unitscale.fx import fx_exec_order
    >>> model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    >>> order = fx_exec_order(model)
    >>> order.module_forward_order == [model, model[0], model[1]]
    True
    >>> order
    ExecOrder(3 module calls, 2 parameters: 0.weight, 0.bias)
    """

    module_forward_order: list[nn.Module]
    param_forward_order: list[nn.Parameter]
    module_to_param_usage_infos: dict[nn.Module, list[ParamUsageInfo]]
    root: nn.Module | None = field(default=None)

    def module_names(self) -> list[str]:
        """Qualified names of ``module_forward_order`` (``""`` is the root)."""
        names = {} if self.root is None else {id(m): n for n, m in self.root.named_modules(remove_duplicate=False)}
        return [names.get(id(m), f"<{type(m).__name__}>") for m in self.module_forward_order]

    def param_names(self) -> list[str]:
        """Qualified names of ``param_forward_order``."""
        names = {} if self.root is None else {id(p): n for n, p in self.root.named_parameters(remove_duplicate=False)}
        return [names.get(id(p), "<parameter>") for p in self.param_forward_order]

    def __repr__(self) -> str:
        return (
            f"ExecOrder({len(self.module_forward_order)} module calls, "
            f"{len(self.param_forward_order)} parameters: {', '.join(self.param_names()[:4])}"
            f"{', ...' if len(self.param_forward_order) > 4 else ''})"
        )


class ExecOrderTracer(_Tracer):
    """Records module forward order, parameter first-use order and parameter-usage groups.

    A public, documented version of the idea behind FSDP's private
    ``torch.distributed.fsdp._trace_utils._ExecOrderTracer``, written as a tracer
    (so it composes with the others) instead of a patch on one. Its results agree
    with FSDP's, except that parameters passed to ops as keyword arguments are
    counted here (FSDP looks at positional arguments only). After
    ``tracer.trace(module)`` the result is ``tracer.exec_order``.

    Hook map (``*`` overridden here):

    .. code-block:: text

        trace() *                    resets the state; builds exec_order at the end
        +-- call_module() *          records the module's first forward
        +-- create_proxy() *         records first uses of parameters among the args

    Raises:
        NotAModuleError: ``trace`` was given something that is not an ``nn.Module``.

    >>> from torch import nn
    >>> from unitscale.fx import ExecOrderTracer
    >>> tracer = ExecOrderTracer()
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> graph = tracer.trace(model)
    >>> tracer.exec_order.module_names()
    ['', '0', '1', '2']
    >>> tracer.exec_order.param_names()
    ['0.weight', '0.bias', '2.weight', '2.bias']
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.exec_order = ExecOrder([], [], {})
        self._current_module: nn.Module | None = None
        self._visited: set[int] = set()
        self._fqn_to_param: dict[str, nn.Parameter] = {}

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        if not isinstance(root, nn.Module):
            raise NotAModuleError(
                f"ExecOrderTracer.trace got {type(root).__name__} {root!r:.60}; execution order is defined "
                "for an nn.Module (wrap a function in a module)"
            )
        self.exec_order = ExecOrder([root], [], {root: []}, root)
        self._current_module = root
        self._visited = set()
        self._fqn_to_param = dict(root.named_parameters())
        return super().trace(root, concrete_args)

    def _first_use(self, param: nn.Parameter) -> None:
        if id(param) not in self._visited:
            self._visited.add(id(param))
            self.exec_order.param_forward_order.append(param)

    def call_module(self, m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        order = self.exec_order
        order.module_forward_order.append(m)
        named_params = list(m.named_parameters())
        outer = self._current_module
        if named_params and outer is not None:
            order.module_to_param_usage_infos[outer].append(ParamUsageInfo(m, named_params))
        self._current_module = m
        order.module_to_param_usage_infos[m] = []
        try:
            return super().call_module(m, *args, **kwargs)
        finally:
            self._current_module = outer

    def create_proxy(
        self,
        kind: str,
        target: Target,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        name: str | None = None,
        type_expr: Any | None = None,
        proxy_factory_fn: Callable[[fx.Node], fx.Proxy] | None = None,
    ) -> fx.Proxy:
        proxy = super().create_proxy(kind, target, args, kwargs, name, type_expr, proxy_factory_fn)
        current = self._current_module
        if current is None:
            return proxy
        usages = self.exec_order.module_to_param_usage_infos[current]
        if kind in ("call_function", "call_method"):
            named_params = []
            for arg in (*(args or ()), *(kwargs or {}).values()):
                if isinstance(arg, fx.Proxy) and arg.node.op == "get_attr" and arg.node.target in self._fqn_to_param:
                    param = self._fqn_to_param[str(arg.node.target)]
                    named_params.append((str(arg.node.target), param))
                    self._first_use(param)
            if named_params:
                usages.append(ParamUsageInfo(current, named_params))
        elif kind == "call_module":
            named_params = list(current.named_parameters())
            if named_params:
                usages.append(ParamUsageInfo(current, named_params))
            for _, param in named_params:
                self._first_use(param)
        return proxy


def fx_exec_order(module: nn.Module, concrete_args: dict[str, Any] | None = None) -> ExecOrder:
    """:class:`ExecOrder` of ``module`` from a symbolic trace with :class:`ExecOrderTracer` (no data run).

    :func:`unitscale.capture.trace_exec_order` calls this first, and captures the model another way
    when ``torch.fx`` cannot trace it.

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        TraceError: ``torch.fx`` cannot trace it.

    >>> from unitscale.examples import MLP
    >>> from unitscale.fx import fx_exec_order
    >>> fx_exec_order(MLP(4)).module_names()
    ['', 'fc1', 'act', 'fc2']
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"fx_exec_order() got {type(module).__name__} {module!r:.60}; execution order is defined "
            "for an nn.Module (wrap a function in a module)"
        )
    tracer = ExecOrderTracer()
    tracer.trace(module, concrete_args)
    return tracer.exec_order
