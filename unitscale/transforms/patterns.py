"""Fold RMS norms (``LlamaRMSNorm``, casts and all) and tanh GELUs (GPT-2's) written out by hand into twins.

Run before residual adds are looked for: ``x + 0.044715 * x**3`` inside GELU would look like one.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import torch
from torch import fx

import unitscale.functional as U
from unitscale.transforms._graph import _MUL, _is

__all__ = ["fold_patterns"]

_ADD = ({operator.add, torch.add, torch.Tensor.add}, {"add", "__add__", "__radd__"})  # not in place
_POW = ({operator.pow, torch.pow, torch.Tensor.pow}, {"pow", "__pow__"})
_MEAN = ({torch.mean, torch.Tensor.mean}, {"mean"})
_RSQRT = ({torch.rsqrt, torch.Tensor.rsqrt}, {"rsqrt"})
_TANH = ({torch.tanh, torch.Tensor.tanh, torch.nn.functional.tanh}, {"tanh"})
_CASTS = {"to", "float", "type", "type_as"}


def _operands(node: Any) -> list[Any]:
    """The two operands of a binary op, in both orders."""
    a, b = node.args[0], node.args[1] if len(node.args) > 1 else node.kwargs.get("other")
    return [(a, b), (b, a)]


def _uncast(node: Any) -> Any:
    """``x`` for ``x.to(dtype)``, ``x.float()``: casts do not change which tensor it is."""
    while isinstance(node, fx.Node) and node.op == "call_method" and node.target in _CASTS:
        node = node.args[0]
    return node


def _number(value: Any, expected: float) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isclose(value, expected, rel_tol=1e-4)


def _only_user(node: fx.Node) -> fx.Node | None:
    return next(iter(node.users)) if len(node.users) == 1 else None


def _replace(final: fx.Node, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], pattern: list[fx.Node]) -> fx.Node:
    graph = final.graph
    with graph.inserting_before(final):
        new = graph.call_function(fn, args, kwargs)
    new.meta = dict(final.meta)
    final.replace_all_uses_with(new)
    position = {node: i for i, node in enumerate(graph.nodes)}
    for node in sorted(set(pattern), key=position.__getitem__, reverse=True):
        if not node.users:
            graph.erase_node(node)
    return new


def _rms_norm_at(mul: fx.Node) -> tuple[fx.Node, list[fx.Node], Any, float] | None:
    """``(x, pattern nodes, d, eps)`` if ``mul`` is ``x * rsqrt(mean(x**2, -1, keepdim=True) + eps)``."""
    for x, r in _operands(mul):
        if not (_is(r, _RSQRT) and isinstance(x, fx.Node)):
            continue
        a = r.args[0]
        if not _is(a, _ADD):
            continue
        for m, eps in _operands(a):
            if not (_is(m, _MEAN) and isinstance(eps, (int, float))):
                continue
            dim = m.args[1] if len(m.args) > 1 else m.kwargs.get("dim")
            value = x.meta.get("example_value")
            if not isinstance(value, torch.Tensor) or not m.kwargs.get("keepdim", False):
                continue
            if dim not in (-1, [-1], (-1,), value.dim() - 1, [value.dim() - 1], (value.dim() - 1,)):
                continue
            p = m.args[0]
            if not (_is(p, _POW) and _number(p.args[1], 2.0) and _uncast(p.args[0]) is _uncast(x)):
                continue
            return x, [mul, r, a, m, p], value.shape[-1], float(eps)
    return None


def _fold_rms_norm(graph: fx.Graph) -> list[fx.Node]:
    folded = []
    for node in list(graph.nodes):
        if node.graph is not graph or not _is(node, _MUL):
            continue
        found = _rms_norm_at(node)
        if found is None:
            continue
        x, pattern, d, eps = found
        final, weight = node, None
        # The gain: ``weight * normed`` (possibly after a cast), a parameter of shape (d,).
        user = _only_user(node)
        while user is not None and user.op == "call_method" and user.target in _CASTS:
            pattern.append(user)
            user = _only_user(user)
        if user is not None and _is(user, _MUL):
            for w, normed in _operands(user):
                value = w.meta.get("example_value") if isinstance(w, fx.Node) else None
                if isinstance(w, fx.Node) and w.op == "get_attr" and _uncast(normed) in pattern:
                    if isinstance(value, torch.Tensor) and tuple(value.shape) == (d,):
                        final, weight = user, w
                        pattern.append(user)
                        break
        # Llama's norm (bf16) applies its gain after casting back: the fold casts back once, at the end
        upcast, result = _dtype_of(x), _dtype_of(final)
        cast_back = upcast is not None and result is not None and upcast != result
        if cast_back and isinstance(weight, fx.Node) and _dtype_of(weight) not in (None, upcast):
            with graph.inserting_before(final):
                weight = graph.call_method("to", (weight, upcast))
        new = _replace(final, U.rms_norm, (x, (d,), weight, eps), {}, pattern)
        if cast_back:
            with graph.inserting_after(new):
                back = graph.call_method("to", (new, result))
            new.replace_all_uses_with(back, delete_user_cb=functools.partial(operator.is_not, back))
            back.meta = dict(new.meta)
        folded.append(new)
    return folded


def _dtype_of(node: fx.Node) -> torch.dtype | None:
    value = node.meta.get("example_value")
    return value.dtype if isinstance(value, torch.Tensor) else None


def _gelu_tanh_at(tanh: fx.Node) -> tuple[fx.Node, fx.Node, list[fx.Node]] | None:
    """``(x, final node, pattern nodes)`` if ``tanh`` is the core of a written-out tanh GELU."""
    inner = tanh.args[0]
    if not _is(inner, _MUL):
        return None
    for c, s in _operands(inner):
        if not (_number(c, math.sqrt(2 / math.pi)) and _is(s, _ADD)):
            continue
        for x, q in _operands(s):
            if not (isinstance(x, fx.Node) and _is(q, _MUL)):
                continue
            for k, p in _operands(q):
                if not (_number(k, 0.044715) and _is(p, _POW) and p.args[0] is x and _number(p.args[1], 3.0)):
                    continue
                one_plus = _only_user(tanh)
                if one_plus is None or not _is(one_plus, _ADD) or not any(_number(v, 1.0) for v in one_plus.args):
                    return None
                final = _only_user(one_plus)
                if final is None or not _is(final, _MUL):
                    return None
                for half, other in _operands(final):
                    if other is one_plus and _is(half, _MUL) and any(a is x for a in half.args):
                        if any(_number(v, 0.5) for v in half.args):
                            return x, final, [final, one_plus, tanh, inner, s, q, p, half]
    return None


def _fold_gelu_tanh(graph: fx.Graph) -> list[fx.Node]:
    folded = []
    for node in list(graph.nodes):
        if node.graph is not graph or not _is(node, _TANH):
            continue
        found = _gelu_tanh_at(node)
        if found is not None:
            x, final, pattern = found
            folded.append(_replace(final, U.gelu, (x,), {"approximate": "tanh"}, pattern))
    return folded


def fold_patterns(graph: fx.Graph) -> list[fx.Node]:
    """Fold every known written-out pattern in ``graph``; returns the new unit-scaled nodes.

    >>> import torch
    >>> from torch import fx
    >>> def rms(x, w):
    ...     return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    >>> gm = fx.symbolic_trace(rms)
    >>> for node in gm.graph.nodes:
    ...     node.meta["example_value"] = torch.empty(2, 8) if node.name == "x" else torch.empty(8)
    >>> [n.target.__name__ for n in fold_patterns(gm.graph)]
    ['rms_norm']
    """
    return [*_fold_rms_norm(graph), *_fold_gelu_tanh(graph)]
