"""Inlining: replace ``call_module`` nodes by the traced bodies of their modules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.fx.proxy import GraphAppendingTracer
from torch.utils import _pytree

from unitscale.errors import InputError, NotAModuleError, PredicateError, TraceError
from unitscale.fx.autograd_functions import functions_applied
from unitscale.fx.module_state import registered_hooks
from unitscale.fx.nodes import INLINED_FROM_KEY
from unitscale.fx.tracers import LeafTracer, ask_module_predicate

__all__ = ["inline"]


class _Inliner:
    """Copies a graph into a new one, splicing module bodies in through ``Proxy`` objects."""

    def __init__(self, root: fx.GraphModule, predicate: Callable[[nn.Module, str], bool] | None) -> None:
        self.root = root
        self.predicate = predicate
        self.graph = fx.Graph()
        self.tracer = GraphAppendingTracer(self.graph)

    def wants(self, qualname: str) -> bool:
        if self.predicate is None:
            return True
        module = self.root.get_submodule(qualname)
        return bool(
            ask_module_predicate(
                self.predicate,
                "inline",
                module,
                qualname,
                allow_none=False,
                make_it="True (inline) or False (keep)",
                must="True or False",
            )
        )

    def proxy(self, value: Any) -> Any:
        def wrap(n: fx.Node) -> Any:
            return fx.Proxy(n, self.tracer)

        return fx.node.map_arg(value, wrap)

    def copy_graph(self, graph: fx.Graph) -> None:
        env: dict[fx.Node, Any] = {}
        for node in graph.nodes:
            if node.op == "call_module" and self.wants(str(node.target)):
                args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
                env[node] = self.call(str(node.target), args, kwargs, node.name)
            else:
                env[node] = self.graph.node_copy(node, env.__getitem__)

    def call(self, qualname: str, args: tuple[Any, ...], kwargs: dict[str, Any], prefix: str) -> Any:
        """Append the body of module ``qualname`` applied to ``args``; return its output."""
        module = self.root.get_submodule(qualname)
        _refuse_hooks(module, f"module '{qualname}'")
        try:
            body = _trace_keeping_functions(module, f"module '{qualname}'")
        except TraceError as e:
            raise TraceError(
                f"cannot inline module '{qualname}' ({type(module).__name__}): {e}; "
                "pass a predicate to inline() that returns False for it"
            ) from e
        env: dict[fx.Node, Any] = {}
        placeholders = [n for n in body.nodes if n.op == "placeholder"]
        for i, ph in enumerate(placeholders):
            env[ph] = self.bind(ph, i, args, kwargs, qualname)
        for node in body.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                return fx.node.map_arg(node.args[0], env.__getitem__)
            args_, kwargs_ = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            name = f"{prefix}_{node.name.lstrip('_')}"
            if node.op == "get_attr":
                env[node] = self.graph.get_attr(f"{qualname}.{node.target}")
            elif node.op == "call_module":
                child = f"{qualname}.{node.target}"
                if self.wants(child):
                    env[node] = self.call(child, args_, kwargs_, name)
                    continue
                env[node] = self.graph.call_module(child, args_, kwargs_)
            else:
                # call_function / call_method: append through the tracer, as torch.fx's
                # own tracing does, with a name that says where the op came from.
                args_, kwargs_ = self.proxy(args_), self.proxy(kwargs_)
                proxy = self.tracer.create_proxy(node.op, node.target, args_, kwargs_, name=name)
                env[node] = proxy.node
            env[node].meta = {**node.meta, INLINED_FROM_KEY: qualname}
        raise TraceError(f"the traced body of module '{qualname}' has no output node")

    @staticmethod
    def bind(ph: fx.Node, i: int, args: tuple[Any, ...], kwargs: dict[str, Any], qualname: str) -> Any:
        target = str(ph.target)
        if target.startswith("*"):
            raise TraceError(
                f"cannot inline module '{qualname}': its forward takes {target}; "
                "keep it as a call (return False for it from the predicate)"
            )
        if i < len(args):
            return args[i]
        if target in kwargs:
            return kwargs[target]
        if ph.args:
            return ph.args[0]
        raise TraceError(f"cannot inline module '{qualname}': its call gives no value for argument '{target}'")


def _refuse_hooks(module: nn.Module, what: str) -> None:
    """Inlining traces ``forward`` itself, so hooks registered on ``module`` would be dropped: refuse by name."""
    if kinds := registered_hooks(module):
        raise TraceError(
            f"inline() cannot inline {what} ({type(module).__name__}): it has {' and '.join(kinds)}(s) registered, "
            "and its inlined body would not run them, so the result would not compute the model; pass a predicate "
            "that returns False for it (it stays a call, hooks and all), or remove the hook"
        )


def _trace_keeping_functions(module: nn.Module, what: str) -> fx.Graph:
    """``LeafTracer().trace(module)``, refused where the traced ops would not give the model's backward.

    A reentrant checkpoint on ``module``'s inputs alone is refused: whether its parameters get a
    gradient then depends on whether an input requires grad, which a traced body cannot tell.
    """
    with functions_applied(module, grad_switches=True) as applied:
        graph = LeafTracer().trace(module)
    checkpoints = [c for c in applied if c.function.__module__ == "torch.utils.checkpoint"]
    if any(c.inputs_only for c in checkpoints):
        where = next(c for c in checkpoints if c.inputs_only).describe().split(" in ", 1)[1]
        raise TraceError(
            f"inline() cannot inline {what} ({type(module).__name__}): it applies "
            f"torch.utils.checkpoint(use_reentrant=True) to its inputs alone in {where}; when none of them requires "
            "grad, torch runs it under no_grad and its parameters get no gradient, but the inlined body would give "
            "them one; use use_reentrant=False, or keep that module as a call (a predicate that returns False for it)"
        )
    lost = [c for c in applied if c not in checkpoints]
    if lost and lost[0].function is torch.no_grad:
        raise TraceError(
            f"inline() cannot inline {what} ({type(module).__name__}): it switches grad mode off (torch.no_grad()) "
            f"in {lost[0].describe().split(' in ', 1)[1]}, and a traced body records no grad mode, so the result "
            "would compute gradients the model does not; keep that module as a call (a predicate that returns "
            "False for it)"
        )
    if lost:
        name = lost[0].function.__qualname__
        raise TraceError(
            f"inline() cannot inline {what} ({type(module).__name__}): it applies the custom autograd.Function "
            f"{lost[0].describe()}, and its inlined body would hold the ops of {name}.forward, whose derivative is "
            f"not {name}.backward (the model's gradient would be lost); keep the module that applies it as a call "
            "(a predicate that returns False for it)"
        )
    return graph


def _dropout_in_training(module: nn.Module) -> list[str]:
    return [
        name or type(m).__name__
        for name, m in module.named_modules()
        if isinstance(m, nn.modules.dropout._DropoutNd) and m.training and m.p > 0
    ]


def _check_same_outputs(original: nn.Module, inlined: fx.GraphModule, example_inputs: tuple[Any, ...]) -> None:
    # Copies, so running BatchNorm in training mode does not move the user's statistics.
    with torch.no_grad():
        try:
            expected = copy.deepcopy(original)(*example_inputs)
        except Exception as exc:
            shapes = ", ".join(
                str(tuple(x.shape)) if isinstance(x, torch.Tensor) else type(x).__name__ for x in example_inputs
            )
            raise InputError(
                f"inline(example_inputs=...): {type(original).__name__} fails on inputs of shape ({shapes}): "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}; pass inputs the model accepts"
            ) from exc
        got = copy.deepcopy(inlined)(*example_inputs)
    flat_expected, _ = _pytree.tree_flatten(expected)
    flat_got, _ = _pytree.tree_flatten(got)
    for i, (e, g) in enumerate(zip(flat_expected, flat_got, strict=True)):
        if isinstance(e, torch.Tensor) and not torch.allclose(e, g, rtol=1e-5, atol=1e-6, equal_nan=True):
            diff = (e - g).abs().max().item()
            dropouts = _dropout_in_training(original)
            cause = (
                f"dropout in training mode ({', '.join(dropouts[:3])}) draws different masks on each run: "
                "call .eval() first"
                if dropouts
                else "the traced body differs from what the model runs on these inputs (control flow on tensor "
                "values or Python state that the trace fixed, or random ops): inline only the modules that trace "
                "faithfully (a predicate), and check each with example_inputs"
            )
            raise TraceError(
                f"inline(example_inputs=...): the inlined module's output {i} differs from "
                f"{type(original).__name__}'s by up to {diff:.3g}; {cause}"
            )


def inline(
    gm: nn.Module,
    predicate: Callable[[nn.Module, str], bool] | None = None,
    *,
    example_inputs: tuple[Any, ...] | None = None,
) -> fx.GraphModule:
    """Replace ``call_module`` nodes by the traced bodies of their modules (``torch.nn`` ones too), recursively.

    Inlined nodes are named after the module they came from (``layer1_0_conv1_conv2d``) and
    carry ``node.meta["inlined_from"]``. ``gm`` is not changed; the result shares its
    parameters, and is ``gm`` itself when it has no ``call_module`` node (an exported graph).

    Args:
        gm: a ``GraphModule``, or any module (traced first with ``torch.nn`` leaves).
        predicate: ``(module, qualified_name) -> bool``; ``True`` inlines the module.
            ``None`` inlines every module.
        example_inputs: if given, both modules are run on them (on copies) and
            their outputs compared.

    Raises:
        NotAModuleError: ``gm`` is not an ``nn.Module``.
        InputError: ``example_inputs`` is not a tuple, or the module fails on it.
        PredicateError: ``predicate`` is not callable, raised, or returned a non-bool.
        TraceError: a module cannot be traced, has hooks that its inlined body would not run,
            applies a custom ``autograd.Function``, a ``torch.no_grad()`` block or a reentrant
            checkpoint on its inputs alone (the message names it; keep it as a call with a
            predicate), or the outputs differ on ``example_inputs``.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import inline
    >>> model = nn.Sequential(nn.Linear(3, 2), nn.ReLU())
    >>> traced = torch.fx.symbolic_trace(model)
    >>> flat = inline(traced, example_inputs=(torch.randn(4, 3),))
    >>> [(n.op, n.name) for n in flat.graph.nodes]  # doctest: +NORMALIZE_WHITESPACE
    [('placeholder', 'input_1'), ('get_attr', '_0_weight'),
     ('get_attr', '_0_bias'), ('call_function', '_0_linear'),
     ('call_function', '_1_relu'), ('output', 'output')]
    """
    if not isinstance(gm, nn.Module):
        raise NotAModuleError(f"inline() got {type(gm).__name__} {gm!r:.60}; pass an nn.Module or fx.GraphModule")
    if predicate is not None and not callable(predicate):
        raise PredicateError(
            f"inline(predicate=...) got {type(predicate).__name__} {predicate!r:.60}; "
            "pass a function (module, qualified_name) -> bool"
        )
    if example_inputs is not None and not isinstance(example_inputs, (tuple, list)):
        if isinstance(example_inputs, torch.Tensor):
            got = f"a tensor of shape {tuple(example_inputs.shape)}"
        else:
            got = f"{type(example_inputs).__name__} {example_inputs!r:.60}"
        raise InputError(
            f"inline(example_inputs=...) got {got}; pass a tuple of the positional inputs, e.g. example_inputs=(x,)"
        )
    if isinstance(gm, fx.GraphModule):
        if not any(n.op == "call_module" for n in gm.graph.nodes):
            # Copying node by node would drop an exported graph's pytree calling convention; and
            # an unchanged graph computes what it did, so example_inputs have nothing to check.
            return gm
        root = gm
    else:
        _refuse_hooks(gm, "the module given")  # traced from its forward, which skips its own hooks
        root = fx.GraphModule(gm, _trace_keeping_functions(gm, "the module given"), type(gm).__name__)
    inliner = _Inliner(root, predicate)
    inliner.copy_graph(root.graph)
    inliner.graph.lint()
    result = fx.GraphModule(root, inliner.graph, type(gm).__name__)
    if example_inputs is not None:
        _check_same_outputs(gm, result, tuple(example_inputs))
    return result
