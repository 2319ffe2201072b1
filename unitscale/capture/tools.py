"""Tools that read a :class:`~unitscale.capture.Capture` of any route: module paths, execution order."""

from __future__ import annotations

from typing import Any

from torch import fx, nn

from unitscale.capture._capture import Capture, capture
from unitscale.capture._meta import stack_entries
from unitscale.errors import NotAModuleError, TraceError
from unitscale.fx import ExecOrder, fx_exec_order
from unitscale.fx.exec_order import ExecOrderBuilder
from unitscale.fx.nodes import COMPUTE_OPS, MODULE_PATH_KEY

__all__ = ["capture_exec_order", "module_paths", "trace_exec_order"]


def module_paths(cap: Capture) -> dict[str, str]:
    """``node name -> module path`` (``""``: the root) of every node but the output, or of every eager op.

    >>> import torch
    >>> from unitscale.capture import capture, module_paths
    >>> from unitscale.examples import MLP
    >>> module_paths(capture(MLP(4), torch.randn(2, 4)))
    {'x': '', 'fc1': 'fc1', 'act': 'act', 'fc2': 'fc2'}
    """
    if cap.graph_module is None:
        return {op.name: op.module_path for op in cap.ops}
    return {n.name: n.meta[MODULE_PATH_KEY] for n in cap.graph_module.graph.nodes if n.op != "output"}


def _graph_params(gm: fx.GraphModule, root: nn.Module) -> dict[str, tuple[str, nn.Parameter]]:
    """``get_attr target -> (name in root, parameter of root)`` for the graph's parameter reads."""
    by_name = dict(root.named_parameters(remove_duplicate=False))
    by_id = {id(p): (name, p) for name, p in by_name.items()}
    in_graph = dict(gm.named_parameters(remove_duplicate=False))
    found = {}
    for target in (str(n.target) for n in gm.graph.nodes if n.op == "get_attr"):
        if target in by_name:
            found[target] = (target, by_name[target])
        elif id(in_graph.get(target)) in by_id:  # TorchDynamo names its reads L__self___fc1_weight
            found[target] = by_id[id(in_graph[target])]
    return found


def _graph_exec_order(cap: Capture, gm: fx.GraphModule) -> ExecOrder:
    builder, modules = ExecOrderBuilder(cap.module), dict(cap.module.named_modules(remove_duplicate=False))
    params = _graph_params(gm, cap.module)
    open_calls: list[tuple[str, str]] = []  # (stack key, path) of the modules the last node ran in
    for node in gm.graph.nodes:
        if node.op not in COMPUTE_OPS:
            continue
        entries = [(key, path) for key, path, _ in stack_entries(node) or []]
        common = 0
        while common < min(len(entries), len(open_calls)) and entries[common] == open_calls[common]:
            common += 1
        for i in range(common, len(entries)):
            if entries[i][1] in modules:
                builder.enter(modules[entries[i][1]], modules.get(entries[i - 1][1] if i else "", cap.module))
        open_calls = entries
        used = [params[str(a.target)] for a in node.all_input_nodes if a.op == "get_attr" and str(a.target) in params]
        builder.use(modules.get(str(node.meta.get(MODULE_PATH_KEY, "")), cap.module), used)
    return builder.order


def _eager_exec_order(cap: Capture) -> ExecOrder:
    builder, modules = ExecOrderBuilder(cap.module), dict(cap.module.named_modules(remove_duplicate=False))
    params = dict(cap.module.named_parameters(remove_duplicate=False))
    calls = iter(cap.module_calls[1:])  # the first call is the root's
    stack: list[str] = []
    for path in calls:
        # A path's parent is the nearest open call that is its prefix.
        while stack and not path.startswith(stack[-1] + "."):
            stack.pop()
        if path in modules:
            builder.enter(modules[path], modules.get(stack[-1] if stack else "", cap.module))
        stack.append(path)
    for op in cap.ops:
        used = [(name, params[name]) for name in op.params if name in params]
        builder.use(modules.get(op.module_path, cap.module), used)
    return builder.order


def capture_exec_order(cap: Capture) -> ExecOrder:
    """Module forward order and parameter first-use order (root ``cap.module``), from a capture of any route.

    On a flat graph (export, TorchDynamo) a module that runs no op (dropout in eval mode)
    leaves no node, so it is missing from the order; the eager route lists every module.

    >>> import torch
    >>> from unitscale.capture import capture, capture_exec_order
    >>> from unitscale.examples import MLP
    >>> order = capture_exec_order(capture(MLP(4), torch.randn(2, 4), route="export"))
    >>> order.module_names(), order.param_names()
    (['', 'fc1', 'act', 'fc2'], ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias'])
    """
    if cap.route == "fx":
        return fx_exec_order(cap.module)
    if cap.graph_module is None:
        return _eager_exec_order(cap)
    return _graph_exec_order(cap, cap.graph_module)


def trace_exec_order(
    module: nn.Module,
    concrete_args: dict[str, Any] | None = None,
    *,
    example_inputs: Any = None,
) -> ExecOrder:
    """Find the order in which ``module``'s submodules run and its parameters are first used.

    Traces symbolically with :class:`~unitscale.fx.ExecOrderTracer` (``torch.nn`` modules are
    leaves); where ``torch.fx`` cannot, runs the module once on ``example_inputs`` and reads
    the order from the eager route's record of every module call (:func:`capture_exec_order`).

    Args:
        concrete_args: passed to :meth:`torch.fx.Tracer.trace` to fix some inputs.
        example_inputs: a tensor or tuple of positional inputs, used only when fx fails.

    Raises:
        NotAModuleError: ``module`` is not an ``nn.Module``.
        TraceError: ``torch.fx`` cannot trace ``module`` and no ``example_inputs`` were given.
        InputError: the capture found the example inputs do not fit the module.

    >>> from unitscale.capture import trace_exec_order
    >>> from unitscale.examples import MLP
    >>> order = trace_exec_order(MLP(4))
    >>> order.module_names(), order.param_names()
    (['', 'fc1', 'act', 'fc2'], ['fc1.weight', 'fc1.bias', 'fc2.weight', 'fc2.bias'])
    """
    if not isinstance(module, nn.Module):
        raise NotAModuleError(
            f"trace_exec_order got {type(module).__name__} {module!r:.60}; pass the nn.Module whose order you want"
        )
    try:
        return fx_exec_order(module, concrete_args)
    except Exception as e:
        if example_inputs is None:
            if isinstance(e, TraceError):
                raise TraceError(
                    f"{e} Or pass example_inputs=... and trace_exec_order() records the model's ops as "
                    "they run instead (unitscale.capture, route='eager')."
                ) from e
            raise
        return capture_exec_order(capture(module, example_inputs, route="eager"))
