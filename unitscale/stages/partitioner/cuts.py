"""Where a stage may start: only tensors cross a stage boundary, and ``boundary_depth`` keeps modules
whole; a plan whose only cuts leave a stage with nothing to do is refused.

>>> import torch
>>> from torch import nn
>>> from unitscale import partition
>>> from unitscale.stages.partitioner.cuts import allowed_cuts
>>> model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
>>> plan = partition(model, 1, torch.randn(1, 2))  # nodes with their types
>>> allowed_cuts(plan.compute_nodes(), None)
[False, True]
"""

from __future__ import annotations

import itertools

import torch
from torch import fx

from unitscale.errors import BlockedCutError
from unitscale.fx.nodes import COMPUTE_OPS, MODULE_PATH_KEY
from unitscale.stages.partitioner.split import INPUT_CONSTANT_KEY, is_symbolic, symbol_of, tensor_carries

__all__ = ["allowed_cuts", "check_no_idle_stage"]


def non_tensor_spans(nodes: list[fx.Node]) -> list[tuple[fx.Node, int, int]]:
    """Values that are not tensors and so cannot cross a stage boundary: ``(node, made, last use)``,
    node positions; no stage may start at positions ``made + 1 .. last``."""
    n = len(nodes)
    position = {node: i for i, node in enumerate(nodes)}
    spans = []
    for node in nodes[0].graph.nodes:
        if node.op not in ("placeholder", *COMPUTE_OPS) or not node.users:
            continue
        if INPUT_CONSTANT_KEY in node.meta or is_symbolic(node):
            continue  # every stage has it (constant input) or remakes it (symbolic size)
        value_type = node.meta.get("type")
        if isinstance(value_type, type) and issubclass(value_type, torch.Tensor):
            continue
        spans.append((node, position.get(node, -1), max(position.get(u, n) for u in node.users)))
    return spans


def allowed_cuts(nodes: list[fx.Node], boundary_depth: int | None) -> list[bool]:
    """``allowed[i]``: may a stage start at ``nodes[i]``? (``i`` in ``1..n-1``)"""
    n = len(nodes)
    position = {node: i for i, node in enumerate(nodes)}
    # only tensors can cross a stage boundary: no cut between a non-tensor value and its last use
    blocked = _open_spans([(made, last) for _, made, last in non_tensor_spans(nodes)], n)
    allowed = [i > 0 and blocked[i] == 0 for i in range(n)]
    _forbid_uncovered_symbols(nodes[0].graph, position, allowed)
    if boundary_depth is not None:
        paths = [".".join(node.meta.get(MODULE_PATH_KEY, "").split(".")[:boundary_depth]) for node in nodes]
        for i in range(1, n):
            allowed[i] = allowed[i] and paths[i] != paths[i - 1]
    return allowed


def check_no_idle_stage(
    name: str,
    num_stages: int,
    nodes: list[fx.Node],
    costs: list[float],
    stage_costs: list[float],
    allowed: list[bool],
    boundary_depth: int | None,
    cost: str,
) -> None:
    """Refuse a plan with a stage that costs nothing where blocked cuts forced it (not where the cost
    model gives fewer nodes a cost than there are stages)."""
    if all(c > 0 for c in stage_costs) or sum(c > 0 for c in costs) < num_stages:
        return
    spans = sorted(non_tensor_spans(nodes), key=lambda t: t[1] - t[2])
    blocked = [i for i in range(1, len(nodes)) if not allowed[i]]
    if not blocked:
        return
    shown = [
        f"{node.name!r} ({getattr(node.meta.get('type'), '__name__', 'not a tensor')}, made at node {max(made, 0)}, "
        f"last used by node {last} {nodes[min(last, len(nodes) - 1)].name!r})"
        for node, made, last in spans[:4]
    ]
    idle = [s for s, c in enumerate(stage_costs) if c == 0]
    why = []
    if shown:
        why.append(
            "values that are not tensors cannot cross a stage boundary, and these span the graph: "
            + "; ".join(shown)
            + (f" and {len(spans) - 4} more" if len(spans) > 4 else "")
        )
    if boundary_depth is not None:
        why.append(f"boundary_depth={boundary_depth} allows cuts only between modules at that depth")
    costs_shown = ", ".join(f"{c:.3g}" for c in stage_costs)
    because = "; and ".join(why) or "symbolic sizes have no tensor to carry them"
    raise BlockedCutError(
        f"partition({name}, num_stages={num_stages}) would leave stage(s) {idle} with nothing to do "
        f"(stage costs [{costs_shown}] by {cost}): only {len(nodes) - 1 - len(blocked)} of the {len(nodes) - 1} "
        f"places between nodes may be cut, because {because}. "
        "To free the cuts, compute such values in the stage that uses them (read x.shape or build the tuple "
        "where it is used), partition the graph torch.export makes "
        "(torch.export.export(model, example_inputs, strict=False).module(): sizes there are numbers or symbols "
        "each stage remakes)"
        + (", use a larger boundary_depth" if boundary_depth is not None else "")
        + ", or use fewer stages",
        blockers=[node.name for node, _, _ in spans],
    )


def _last_symbolic_use(node: fx.Node, position: dict[fx.Node, int], n: int) -> int:
    uses = (_last_symbolic_use(u, position, n) if is_symbolic(u) else position.get(u, n) for u in node.users)
    return max(uses, default=-1)


def _forbid_uncovered_symbols(graph: fx.Graph, position: dict[fx.Node, int], allowed: list[bool]) -> None:
    """A stage remakes a symbolic size from a tensor it receives: no cut where no such tensor crosses."""
    n = len(allowed)
    roots = [r for r in graph.nodes if r.target is torch.ops.aten.sym_size.int and is_symbolic(r)]
    for expr in {symbol_of(r) for r in roots}:
        need = [(position.get(r, -1), _last_symbolic_use(r, position, n)) for r in roots if symbol_of(r) == expr]
        cover = [
            (position.get(t, -1), max(position.get(u, n) for u in t.users))
            for t in graph.nodes
            if t.op in ("placeholder", *COMPUTE_OPS) and t.users and tensor_carries(t, expr) is not None
        ]
        for i, (needed, covered) in enumerate(zip(_open_spans(need, n), _open_spans(cover, n), strict=True)):
            if needed and not covered:
                allowed[i] = False


def _open_spans(spans: list[tuple[int, int]], n: int) -> list[int]:
    """At each position ``i < n``, how many spans ``(made, last)`` are open: ``made < i <= last``."""
    delta = [0] * (n + 2)
    for made, last in spans:
        delta[made + 1] += 1
        delta[last + 1] -= 1
    return list(itertools.accumulate(delta[:n]))
