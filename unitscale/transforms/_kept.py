"""The unit-scaling pass's rules for what it keeps as it is: regions left whole, ops that keep unit scale."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

from unitscale.transforms._graph import (
    _ADD,
    _MUL,
    _constant_factor,
    _function_of,
    _is,
    _is_float_node,
    _member,
    describe,
)
from unitscale.transforms.pass_state import PassState

_VMAP_ENTER, _VMAP_EXIT = "_vmap_increment_nesting", "_vmap_decrement_nesting"
# Higher-order ops whose bodies the pass reads (export's grad-mode wrapper around position tables).
_KNOWN: set[Any] = {torch.ops.higher_order.wrap_with_set_grad_enabled}


def leave_regions_whole(state: PassState) -> None:
    """Leave higher-order ops and inlined ``vmap`` bodies whole: no later rule touches their nodes."""
    state.regions = _whole_regions(state.graph)
    state.frozen = {n for nodes in state.regions.values() for n in nodes}
    state.done |= state.frozen


def _whole_regions(graph: fx.Graph) -> dict[fx.Node, set[fx.Node]]:
    """Each region the pass leaves whole (a higher-order op, an inlined ``vmap``): its first node -> its nodes.

    Its body defines what it computes, under transforms that autograd Functions cannot run under.
    """
    regions: dict[fx.Node, set[fx.Node]] = {}
    depth, head = 0, None
    for node in graph.nodes:
        name = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if name == _VMAP_ENTER:
            head = node if depth == 0 else head
            depth += 1
        if head is not None:
            regions.setdefault(head, set()).add(node)
        if name == _VMAP_EXIT:
            depth -= 1
            if depth == 0:
                head = None
        if head is None and isinstance(node.target, torch._ops.HigherOrderOperator) and node.target not in _KNOWN:
            regions[node] = {node}
    return regions


def region_lines(state: PassState) -> list[str]:
    """``"<first op>: <n> op(s) left whole"`` for each region on the activation path."""
    lines = []
    for head, nodes in state.regions.items():
        if not nodes & state.live:
            continue
        text = describe(head)
        if getattr(head.target, "__name__", "") == _VMAP_ENTER:
            text = "vmap" + text[text.index(" (node") :]
        attrs = [a for a in head.args if isinstance(a, fx.Node) and a.op == "get_attr"]
        bodies = [getattr(state.gm, str(a.target), None) for a in attrs]
        inner = [n for b in bodies if isinstance(b, fx.GraphModule) for n in b.graph.nodes if n.op.startswith("call")]
        size = len(inner) if inner else len([n for n in nodes if n.op.startswith("call")])
        lines.append(f"{text}: {size} op(s) left whole")
    return lines


_TRIG: dict[Any, str] = {torch.cos: "cos", torch.Tensor.cos: "cos", torch.sin: "sin", torch.Tensor.sin: "sin"}


def keep_rotary_embeddings(state: PassState) -> None:
    """Keep ``x * cos + rotate_half(x) * sin`` (tables off the activation path): a rotation keeps the std of ``x``."""
    for node in state.graph.nodes:
        if node in state.done or not _is(node, _ADD) or len(node.args) < 2:
            continue
        products = node.args[0], node.args[1]
        tables = []
        for product in products:
            if not (_is(product, _MUL) and len(product.args) >= 2):
                break
            args = [a for a in product.args[:2] if isinstance(a, fx.Node)]
            factors = [a for a in args if a not in state.live and _is_float_node(a)]
            if len(args) != 2 or len(factors) != 1:
                break
            table = factors[0]
            functions = [fn for n in state.ancestors[table] | {table} for fn in _functions_run_by(n)]
            tables.append({_TRIG[fn] for fn in functions if _member(fn, set(_TRIG))})
        if len(tables) == 2 and tables[0] and tables[1] and tables[0] | tables[1] == {"cos", "sin"}:
            for n in (node, *products):
                state.kept[n] = "rotary embedding (x * cos + rotate_half(x) * sin keeps the std of x)"


_TANH: set[Any] = {torch.tanh, torch.Tensor.tanh, F.tanh}


def keep_soft_caps(state: PassState) -> None:
    """Keep ``c * tanh(x / c)`` (Gemma 2's soft-capping) as it is: below ``c`` it is ``x``, at unit std."""
    for node in state.graph.nodes:
        if node in state.done:
            continue
        found = _constant_factor(node) if _is(node, _MUL) else None
        if found is None or not _member(_function_of(found[0]), _TANH) or not found[0].args:
            continue
        tanh, cap = found
        inner = tanh.args[0]
        if not isinstance(inner, fx.Node):
            continue
        divided = _constant_factor(inner)
        if divided is not None and cap > 0 and abs(divided[1] * cap - 1) < 1e-6:
            for n in (node, tanh, inner):
                state.kept[n] = f"soft-capping ({cap:g} * tanh(x / {cap:g}) keeps the std of x below {cap:g})"


def _functions_run_by(node: fx.Node) -> list[Any]:
    """The node's function, and those of a higher-order op's body (export's ``wrap_with_set_grad_enabled``)."""
    functions = [_function_of(node)]
    owner = node.graph.owning_module
    for arg in node.args:
        if owner is not None and isinstance(arg, fx.Node) and arg.op == "get_attr":
            body = getattr(owner, str(arg.target), None)
            if isinstance(body, fx.GraphModule):
                functions += [_function_of(n) for n in body.graph.nodes]
    return functions
