"""Execution order by symbolic tracing: :class:`ExecOrderTracer`, its result :class:`ExecOrder`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from torch import fx, nn
from torch.fx.node import Target

from unitscale.errors import NotAModuleError
from unitscale.fx.tracers import _Tracer

__all__ = ["ExecOrderTracer", "ExecOrder", "ExecOrderBuilder", "ParamUsageInfo", "fx_exec_order"]


class ParamUsageInfo(NamedTuple):
    """A group of parameters used together while tracing.

    Attributes:
        module: the module that used the parameters: an op on some of them (named from the
            traced root), or a leaf or submodule called (all its ``named_parameters()``).
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
    >>> fx_exec_order(model)
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


class ExecOrderBuilder:
    """Builds an :class:`ExecOrder` from module calls and parameter uses, seen in execution order.

    >>> from torch import nn
    >>> from unitscale.fx.exec_order import ExecOrderBuilder
    >>> model = nn.Sequential(nn.Linear(2, 2))
    >>> builder = ExecOrderBuilder(model)
    >>> builder.enter(model[0], model)
    >>> builder.use(model[0], list(model[0].named_parameters()))
    >>> builder.order
    ExecOrder(2 module calls, 2 parameters: 0.weight, 0.bias)
    """

    def __init__(self, root: nn.Module | None) -> None:
        self.order = ExecOrder([], [], {}) if root is None else ExecOrder([root], [], {root: []}, root)
        self._seen: set[int] = set()

    def enter(self, module: nn.Module, parent: nn.Module) -> None:
        """``module``'s forward starts, called from ``parent``'s."""
        self.order.module_forward_order.append(module)
        named = list(module.named_parameters())
        if named:
            self.order.module_to_param_usage_infos.setdefault(parent, []).append(ParamUsageInfo(module, named))
        self.order.module_to_param_usage_infos[module] = []

    def use(self, module: nn.Module, named_params: list[tuple[str, nn.Parameter]]) -> None:
        """``module`` ran an op on these parameters (nothing when there are none)."""
        if not named_params:
            return
        self.order.module_to_param_usage_infos.setdefault(module, []).append(ParamUsageInfo(module, named_params))
        for _, p in named_params:
            if id(p) not in self._seen:
                self._seen.add(id(p))
                self.order.param_forward_order.append(p)


class ExecOrderTracer(_Tracer):
    """Records module forward order, parameter first-use order and parameter-usage groups in ``tracer.exec_order``.

    Agrees with FSDP's private ``_ExecOrderTracer``, except that parameters passed to ops as
    keyword arguments count here. Overrides ``trace``, ``call_module`` and ``create_proxy``.

    Raises:
        NotAModuleError: ``trace`` was given something that is not an ``nn.Module``.

    >>> from torch import nn
    >>> from unitscale.fx import ExecOrderTracer
    >>> tracer = ExecOrderTracer()
    >>> model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    >>> graph = tracer.trace(model)
    >>> tracer.exec_order.param_names()
    ['0.weight', '0.bias', '2.weight', '2.bias']
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._builder = ExecOrderBuilder(None)
        self.exec_order = self._builder.order
        self._current_module: nn.Module | None = None
        self._fqn_to_param: dict[str, nn.Parameter] = {}

    def trace(self, root: nn.Module | Callable[..., Any], concrete_args: dict[str, Any] | None = None) -> fx.Graph:
        if not isinstance(root, nn.Module):
            raise NotAModuleError(
                f"ExecOrderTracer.trace got {type(root).__name__} {root!r:.60}; execution order is defined "
                "for an nn.Module (wrap a function in a module)"
            )
        self._builder = ExecOrderBuilder(root)
        self.exec_order = self._builder.order
        self._current_module = root
        self._fqn_to_param = dict(root.named_parameters())
        return super().trace(root, concrete_args)

    def call_module(self, m: nn.Module, *args: Any, **kwargs: Any) -> Any:
        outer = self._current_module
        self._builder.enter(m, outer if outer is not None else m)
        self._current_module = m
        try:
            return super().call_module(m, *args, **kwargs)
        finally:
            self._current_module = outer

    def create_proxy(self, kind: str, target: Target, args: Any, kwargs: Any, *more: Any, **named: Any) -> fx.Proxy:
        proxy = super().create_proxy(kind, target, args, kwargs, *more, **named)
        current = self._current_module
        if current is None:
            return proxy
        if kind in ("call_function", "call_method"):
            params = self._fqn_to_param
            reads = [a.node for a in (*(args or ()), *(kwargs or {}).values()) if isinstance(a, fx.Proxy)]
            names = [str(n.target) for n in reads if n.op == "get_attr" and n.target in params]
            self._builder.use(current, [(name, params[name]) for name in names])
        elif kind == "call_module":
            self._builder.use(current, list(current.named_parameters()))
        return proxy


def fx_exec_order(module: nn.Module, concrete_args: dict[str, Any] | None = None) -> ExecOrder:
    """:class:`ExecOrder` of ``module`` from a symbolic trace with :class:`ExecOrderTracer` (no data run).

    :func:`unitscale.capture.trace_exec_order` falls back to running the model when this cannot trace it.

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
