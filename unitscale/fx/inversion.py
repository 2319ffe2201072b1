"""Inversion: build g with f(g(y)) == y by walking f's graph backwards."""

from __future__ import annotations

import math
import operator
import types
from collections.abc import Callable
from typing import Any

import torch
from torch import fx, nn
from torch.fx.proxy import GraphAppendingTracer

from unitscale.errors import NotAModuleError, NotCallableError, NotInvertibleError, TraceError
from unitscale.fx.inlining import inline
from unitscale.fx.nodes import changes_in_place, op_name
from unitscale.fx.tracers import LeafTracer

__all__ = ["invert", "register_inverse"]

# torch spells several functions two ways; the registry is keyed by one spelling.
_ALIASES = {
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "arcsinh": "asinh",
    "arccosh": "acosh",
    "arctanh": "atanh",
    "negative": "neg",
    "expit": "sigmoid",
    "multiply": "mul",
    "divide": "div",
    "true_divide": "div",
    "subtract": "sub",
}
_OPERATORS: dict[Any, Any] = {
    operator.add: torch.add,
    operator.sub: torch.sub,
    operator.mul: torch.mul,
    operator.truediv: torch.div,
    operator.pow: torch.pow,
    operator.neg: torch.neg,
    operator.pos: torch.positive,
}


def _torch_function(name: str) -> Any:
    name = name.removeprefix("special_")
    return getattr(torch, _ALIASES.get(name, name), None)


def _key(fn: Any) -> Any:
    """The registry key of a function: torch's canonical spelling, else the function."""
    if fn in _OPERATORS:
        return _OPERATORS[fn]
    name = getattr(fn, "__name__", None)
    if isinstance(name, str):
        short = name.removeprefix("special_")
        if any(getattr(ns, n, None) is fn for ns in (torch, torch.special, torch.Tensor) for n in (name, short)):
            return _torch_function(name) or fn
    return fn


_INVERSES: dict[Any, Callable[[Any], Any]] = {}


def register_inverse(f: Callable[..., Any], g: Callable[..., Any]) -> None:
    """Register ``f`` and ``g``, functions of one tensor, as inverses of each other for :func:`invert`.

    Every spelling counts (``torch.f(x)``, ``x.f()``, an alias such as ``torch.arcsin``). A
    function of your own is found only if tracing keeps it as one node (``torch.fx.wrap``).

    Args:
        f: one-to-one on the inputs you care about.
        g: ``f(g(y)) == y`` for ``y`` in ``f``'s range.

    Raises:
        NotCallableError: ``f`` or ``g`` is not callable.

    >>> import torch
    >>> from unitscale import invert
    >>> from unitscale.fx import register_inverse
    >>> register_inverse(torch.erf, torch.erfinv)
    >>> g = invert(lambda x: torch.erf(x) * 2)
    >>> g(torch.tensor([0.5, 1.0]))
    tensor([0.2253, 0.4769])
    """
    for name, fn in (("f", f), ("g", g)):
        if not callable(fn):
            raise NotCallableError(
                f"register_inverse({name}=...) got {type(fn).__name__} {fn!r:.60}; pass a function of one tensor"
            )
    _INVERSES[_key(f)] = g
    _INVERSES[_key(g)] = f


_PAIRS: list[tuple[Callable[..., Any], Callable[..., Any]]] = [
    (torch.sin, torch.asin),
    (torch.cos, torch.acos),
    (torch.tan, torch.atan),
    (torch.exp, torch.log),
    (torch.exp2, torch.log2),
    (torch.expm1, torch.log1p),
    (torch.sigmoid, torch.logit),
    (torch.tanh, torch.atanh),
    (torch.sinh, torch.asinh),
    (torch.sqrt, torch.square),
]
for _f, _g in _PAIRS:
    register_inverse(_f, _g)
for _f in (torch.neg, torch.reciprocal, torch.positive, torch.clone):
    register_inverse(_f, _f)


def _name(node: fx.Node) -> str:
    if node.op in ("call_function", "call_method"):
        return op_name(node.target, qualified=True)
    return str(node.target)


#: what a function may compute from its input and not use: a shape, not a value
_QUERIES = (getattr, "size", "dim", "numel")


def _where(node: fx.Node) -> str:
    return f"node '{node.name}' ({_name(node)})"


def _nonzero(value: Any, node: fx.Node, what: str) -> None:
    """Refuse a constant that is 0 (or holds a 0): multiplying or raising by it loses the input."""
    tensor = isinstance(value, torch.Tensor)
    if zeros := int((value == 0).sum()) if tensor else int(isinstance(value, (int, float)) and value == 0):
        held = f"a tensor holding 0 ({zeros} of {value.numel()} elements)" if tensor else "0"
        raise NotInvertibleError(
            f"cannot invert {_where(node)}: it {what} {held}, which loses the input{' there' if tensor else ''}"
        )


def _finite(value: Any, node: fx.Node) -> None:
    """Refuse a NaN or infinite constant: the inverse would compute NaN (``inf / inf``) without a word."""
    tensor = isinstance(value, torch.Tensor) and value.is_floating_point()
    if bad := int((~torch.as_tensor(value).isfinite()).sum()) if tensor or isinstance(value, float) else 0:
        held = f"holds {bad} NaN or infinite value(s) of {value.numel()}" if tensor else f"is {value}"
        raise NotInvertibleError(
            f"cannot invert {_where(node)}: its constant operand {held}; the inverse would return NaN. "
            "Make the constant finite"
        )


def _check_constant(key: Any, node: fx.Node, value: Any, alpha: Any, pos: int) -> None:
    """Refuse, while building, the constants that make ``key`` lose its input: the inverse would
    otherwise return NaN or infinity for every ``y``, silently."""
    _finite(value, node)
    _finite(alpha, node)
    if key is torch.add or key is torch.sub:
        _nonzero(alpha, node, "scales its input by alpha =")
    elif key is torch.mul:
        _nonzero(value, node, "multiplies by")
    elif key is torch.div:
        _nonzero(value, node, "divides by" if pos == 0 else "divides")
    elif pos == 0:  # torch.pow, x ** c
        _nonzero(value, node, "raises to the power")
    else:  # c ** x
        bad = bool(((value <= 0) | (value == 1)).any()) if isinstance(value, torch.Tensor) else value <= 0 or value == 1
        if bad:
            raise NotInvertibleError(f"cannot invert {_where(node)}: {value} ** x is not one-to-one for base {value}")


def _invert_binary(key: Any, node: fx.Node, y: Any, c: Any, value: Any, pos: int) -> Any:
    """The inverse of ``key`` with its varying operand at ``pos`` and constant ``c`` (in the new
    graph; ``value`` is what it computes, checked first)."""
    extra = {k: v for k, v in node.kwargs.items() if k not in ("alpha", "other", "exponent", "input", "self")}
    alpha = node.kwargs.get("alpha", 1)
    if extra or (key is not torch.add and key is not torch.sub and "alpha" in node.kwargs):
        raise NotInvertibleError(
            f"cannot invert {_where(node)}: keyword arguments {sorted(node.kwargs)} are not supported"
        )
    _check_constant(key, node, value, alpha, pos)
    if key is torch.add or key is torch.sub:
        if pos == 1:  # c + alpha * x, c - alpha * x
            x = y - c if key is torch.add else c - y
            return x if alpha == 1 else x / alpha
        c = c if alpha == 1 else alpha * c
        return y - c if key is torch.add else y + c
    if key is torch.mul:
        return y / c
    if key is torch.div:
        return y * c if pos == 0 else c / y
    if pos == 0:  # torch.pow, x ** c
        return y ** (1 / c)
    return torch.log(y) / (math.log(c) if isinstance(c, (int, float)) else torch.log(c))


_BINARY = (torch.add, torch.sub, torch.mul, torch.div, torch.pow)


class _Inverter:
    """Walks a one-input, one-output graph from its output back to its input."""

    def __init__(self, gm: fx.GraphModule, label: str) -> None:
        self.gm = gm
        self.label = label
        self.graph = fx.Graph()
        self.tracer = GraphAppendingTracer(self.graph)
        self.copied: dict[fx.Node, fx.Node] = {}
        self.values: dict[fx.Node, Any] = {}
        self.interpreter = fx.Interpreter(gm)

    def chain(self) -> list[fx.Node]:
        nodes = list(self.gm.graph.nodes)
        inputs = [n for n in nodes if n.op == "placeholder"]
        if len(inputs) != 1:
            raise NotInvertibleError(
                f"cannot invert {self.label}: it takes {len(inputs)} inputs ({', '.join(n.name for n in inputs)}); "
                "invert needs a function of exactly one tensor"
            )
        output = nodes[-1]
        if not isinstance(output.args[0], fx.Node):
            out = output.args[0]
            count = len(out) if isinstance(out, (tuple, list, dict)) else 0
            raise NotInvertibleError(
                f"cannot invert {self.label}: it returns {count} values ({type(out).__name__}); "
                "invert needs a function with exactly one tensor output"
            )
        varying = {inputs[0]}
        # An in-place op reads as its out-of-place op once the nodes after it read its result; a
        # value from before it may alias the tensor it changed, so none may be read after it.
        stale: dict[fx.Node, fx.Node] = {}
        for i, n in enumerate(nodes):
            if not any(a in varying for a in n.all_input_nodes):
                continue
            in_place = changes_in_place(n)
            changed = next((stale[a] for a in n.all_input_nodes if a in stale), None)
            if changed or in_place and n.args[0] not in varying:
                raise NotInvertibleError(
                    f"cannot invert {self.label}: {_where(changed or n)} changes its input in place; "
                    "use the out-of-place op"
                )
            if in_place:
                for later in nodes[i + 1 :]:
                    later.replace_input_with(n.args[0], n)
                stale.update(dict.fromkeys(varying, n))
            varying.add(n)
        # torch.fx traces ``y += 1`` as ``y + 1``: where another name holds y (``z = y``), the
        # trace drops the change z sees, leaving the add unused. Refuse rather than invert f without it.
        if unused := [
            n for n in nodes[:-1] if n in varying and not n.users and n.op != "placeholder" and n.target not in _QUERIES
        ]:
            raise NotInvertibleError(
                f"cannot invert {self.label}: {_where(unused[0])} is computed from the input and never used. "
                "torch.fx traces `y += 1` as `y + 1`, so another name for y (`z = y`) misses the change; "
                "remove the unused value, or write the change as `y.add_(1)`"
            )
        self.varying = varying
        out = output.args[0]
        if out not in varying:
            raise NotInvertibleError(f"cannot invert {self.label}: its output does not depend on its input")
        steps = []
        node = out
        while node.op != "placeholder":
            steps.append(node)
            node = self.operand(node)
        return steps

    def operand(self, node: fx.Node) -> fx.Node:
        if node.op not in ("call_function", "call_method"):
            raise NotInvertibleError(f"cannot invert {self.label}: {_where(node)} is a {node.op} node")
        direct = [a for a in node.args if isinstance(a, fx.Node) and a in self.varying]
        every = [a for a in node.all_input_nodes if a in self.varying]
        if len(every) > 1 or len(direct) != len(every):
            names = ", ".join(a.name for a in every)
            raise NotInvertibleError(
                f"cannot invert {self.label}: {_where(node)} combines {len(every)} values computed from the input "
                f"({names}); only ops of one tensor and constants can be inverted"
            )
        return direct[0]

    def constant(self, value: Any) -> Any:
        """A value for the new graph: numbers as they are, input-free nodes copied with their ancestors."""

        def copy_node(n: fx.Node) -> fx.Node:
            if n not in self.copied:
                self.copied[n] = self.graph.node_copy(n, copy_node)
            return self.copied[n]

        def wrap(n: fx.Node) -> Any:
            return fx.Proxy(copy_node(n), self.tracer)

        return fx.node.map_arg(value, wrap)

    def value(self, arg: Any) -> Any:
        """The value of an operand that does not depend on the input (a number, or a node computed
        from constants and attributes), evaluated once to check it."""

        def evaluate(n: fx.Node) -> Any:
            if n not in self.values:
                args, kwargs = fx.node.map_arg((n.args, n.kwargs), evaluate)
                self.values[n] = getattr(self.interpreter, n.op)(n.target, args, kwargs)  # fx's own get_attr, ...
            return self.values[n]

        with torch.no_grad():
            return fx.node.map_arg(arg, evaluate)

    def emit(self, node: fx.Node, y: fx.Proxy) -> fx.Proxy:
        operand = self.operand(node)
        pos = node.args.index(operand)
        target = node.target
        if changes_in_place(node):  # chain() made the nodes after it read its result
            target = (target if isinstance(target, str) else getattr(target, "__name__", "")).removesuffix("_")
        key = _torch_function(target) if isinstance(target, str) else _key(target)
        key = key if key is not None else target
        if key in _BINARY and len(node.args) == 2:
            other = node.args[1 - pos]
            return _invert_binary(key, node, y, self.constant(other), self.value(other), pos)
        if len(node.args) == 1 and not node.kwargs and key in _INVERSES:
            return _INVERSES[key](y)
        if key in _INVERSES or key in _BINARY:
            raise NotInvertibleError(
                f"cannot invert {_where(node)} in {self.label}: it is called with extra arguments "
                f"{node.args[1:]} {node.kwargs}; its registered inverse takes one tensor"
            )
        raise NotInvertibleError(
            f"cannot invert {_where(node)} in {self.label}: no inverse is registered for {_name(node)}. "
            "If it is one-to-one on your inputs, register one with unitscale.fx.register_inverse(f, g); "
            "an op that is not (relu, abs) cannot be inverted"
        )

    def build(self) -> fx.GraphModule:
        steps = self.chain()
        y: fx.Proxy = fx.Proxy(self.graph.placeholder("y"), self.tracer)
        for node in steps:
            y = self.emit(node, y)
        self.graph.output(y.node if isinstance(y, fx.Proxy) else y)
        return fx.GraphModule(self.gm, self.graph, "Inverse")


def invert(fn_or_module: Callable[..., Any] | nn.Module) -> fx.GraphModule:
    """Build ``g`` (a ``GraphModule``; ``g.code`` shows it) with ``f(g(y)) == y`` for a function ``f`` of one tensor.

    ``f``'s traced graph (modules inlined) is walked from output to input, emitting each op's
    registered inverse (:func:`register_inverse`; ``+ - * / **`` with one constant operand are
    built in). Each inverse picks its principal branch, so ``g`` is correct on ``f``'s range only
    where every intermediate value lies where its op is one-to-one (``cos`` on ``[0, pi]``).

    Raises:
        NotAModuleError: ``fn_or_module`` is neither a function nor a module.
        NotInvertibleError: an op has no registered inverse (``relu``), combines two values
            computed from the input (``sin(x) * x``), ``f`` has several inputs or outputs,
            changes a tensor in place where the chain could miss it (through a view, or a
            constant), computes a value from the input that it never uses (as ``z = y; y += 1;
            return z`` traces), has control flow that depends on the input, or has a constant operand
            that loses the input or would make ``g`` return NaN (``x * 0``, ``x + nan``).

    >>> import torch
    >>> from unitscale import invert
    >>> f = lambda x: torch.exp(torch.tan(x))
    >>> g = invert(f)
    >>> f(g(torch.arange(5) + 1))
    tensor([1., 2., 3., 4., 5.])
    """
    if isinstance(fn_or_module, nn.Module):
        label = f"module {type(fn_or_module).__name__}"
    elif isinstance(fn_or_module, types.FunctionType):
        label = f"function {fn_or_module.__name__}"
    else:
        raise NotAModuleError(
            f"invert() got {type(fn_or_module).__name__} {fn_or_module!r:.60}; pass a Python function or nn.Module"
        )
    try:
        if isinstance(fn_or_module, nn.Module):
            gm = inline(fn_or_module)
        else:
            tracer = LeafTracer()
            graph = tracer.trace(fn_or_module)
            gm = inline(fx.GraphModule(tracer.root, graph))
    except TraceError as e:
        raise NotInvertibleError(
            f"cannot invert {label}: it cannot be traced ({e.__cause__ or e}); control flow that depends "
            "on the input (a Python if on a tensor) is not invertible as one chain"
        ) from e
    return _Inverter(gm, label).build()
