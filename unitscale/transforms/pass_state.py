"""The state the unit-scaling pass's rules share (its own module: rules and rule modules both import it)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import fx

from unitscale.transforms._frozen import GradScales

__all__ = ["PassState"]


@dataclass
class PassState:
    """What the rules of the unit-scaling pass share: the graph, and what the rules before found.

    Attributes:
        gm: the graph module being rewritten (``state.graph`` is its graph).
        replace: the user's replacements (``unit_scale(replace=...)``).
        torch_map: torch function -> unit-scaled twin (:data:`unitscale.functional.torch_map`).
        grad_scales: the model's frozen gradient factors (buffers, saved with the model).
        regions: each region left whole (a higher-order op, an inlined ``vmap``): first node -> nodes.
        frozen: the nodes of those regions; no rule touches them.
        done: the nodes rules rewrote or added: later rules leave them, unreported.
        kept: nodes kept as they are because they keep unit scale, with the reason.
        folded: the twins ``fold_written_out_ops`` made.
        ancestors: each node's ancestors (the ``analyse`` rule: the graph as it was then).
        live: the activation path (nodes that read a float input or a parameter).
        stream: the graph inputs and the live nodes that compute from them.
        trunk: the ops every path from the inputs to the output passes through.
        blocks: how many residual blocks got a frozen gradient factor.
    """

    gm: fx.GraphModule
    replace: dict[Any, Callable[..., Any]] = field(default_factory=dict)
    torch_map: dict[Any, Callable[..., Any]] = field(default_factory=dict)
    grad_scales: GradScales = field(default_factory=GradScales)
    regions: dict[fx.Node, set[fx.Node]] = field(default_factory=dict)
    frozen: set[fx.Node] = field(default_factory=set)
    done: set[fx.Node] = field(default_factory=set)
    kept: dict[fx.Node, str] = field(default_factory=dict)
    folded: list[fx.Node] = field(default_factory=list)
    ancestors: dict[fx.Node, set[fx.Node]] = field(default_factory=dict)
    live: set[fx.Node] = field(default_factory=set)
    stream: set[fx.Node] = field(default_factory=set)
    trunk: set[fx.Node] = field(default_factory=set)
    blocks: int = 0

    @property
    def graph(self) -> fx.Graph:
        """``gm.graph``."""
        return self.gm.graph

    @property
    def constrained(self) -> set[fx.Node]:
        """The live ops off the trunk (their input gradient meets another path's, so their two scales must be one)."""
        return self.live - self.trunk

    def retarget(self, node: fx.Node, fn: Callable[..., Any], **kwargs: Any) -> None:
        """Make ``node`` call ``fn`` (its arguments kept, ``kwargs`` added) and count it as done."""
        node.op, node.target, node.kwargs = "call_function", fn, {**node.kwargs, **kwargs}
        self.done.add(node)

    def is_open(self, node: fx.Node) -> bool:
        """Whether a rule may still rewrite ``node``: a call on the activation path, not done or kept."""
        called = node.op in ("call_function", "call_method")
        return called and node in self.live and node not in self.done and node not in self.kept
