"""The unit-scaling pass's rule for losses: one gradient factor, so a sum of losses keeps the true direction."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

import unitscale.functional as U
from unitscale.transforms._graph import describe
from unitscale.transforms.pass_state import PassState

_LOSSES: set[Any] = {U.cross_entropy, U.mse_loss}


def _on_meta(value: Any) -> Any:
    if isinstance(value, fx.Node):
        found = value.meta.get("example_value")
        if isinstance(found, torch.Tensor):
            return torch.empty(tuple(found.shape), dtype=found.dtype, device="meta")
        return found
    return value


def _own_factor(node: fx.Node) -> float | None:
    """The factor the loss gives itself, from its shapes (run on meta tensors: no memory, no data)."""
    args, kwargs = pytree.tree_map(_on_meta, (node.args, node.kwargs))
    try:
        loss = node.target(*args, **kwargs)  # type: ignore[operator]
    except Exception:  # a shape the loss refuses: the graph's own call will say so
        return None
    factor = getattr(loss, "grad_scale", None)
    return float(factor) if isinstance(factor, (int, float)) else None


def share_loss_scales(state: PassState) -> None:
    """One gradient factor for a graph's losses, unless one has its own ``grad_scale``; each in ``gm.meta``."""
    losses = [n for n in state.graph.nodes if n.op == "call_function" and n.target in _LOSSES]
    own = [_own_factor(n) for n in losses]
    shared = None
    known = [f for f in own if f is not None and f > 0]
    if len(losses) > 1 and len(known) == len(own) and not any("grad_scale" in n.kwargs for n in losses):
        shared = math.exp(sum(math.log(f) for f in known) / len(known))
        for n in losses:
            n.kwargs = {**n.kwargs, "grad_scale": shared}
    lines = []
    for n, f in zip(losses, own, strict=True):
        if shared is not None:
            lines.append(
                f"{describe(n)}: gradient factor {shared:.6g} (its own {f:.6g}), the geometric mean shared by "
                f"the graph's {len(losses)} losses, so that a sum of them has the true gradient's direction"
            )
        elif f is not None:
            lines.append(f"{describe(n)}: gradient factor {f:.6g}")
    state.gm.meta["loss_scales"] = lines
