"""Random nested module trees for property tests (a helper module, not a test file).

A tree is described by plain data (drawn by hypothesis) and built into modules by
:func:`build`, so hypothesis can shrink descriptions and the modules stay fresh.
"""

from __future__ import annotations

from typing import Any

import torch
from hypothesis import strategies as st
from torch import nn

WIDTH = 4
LEAVES = ("linear", "relu", "tanh", "layer_norm", "batch_norm")
KINDS = ("sequential", "residual", "branches", "twice")


class Residual(nn.Module):
    """``x + body(x)``."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x)


class Branches(nn.Module):
    """The sum of every branch applied to ``x``."""

    def __init__(self, branches: list[nn.Module]) -> None:
        super().__init__()
        self.branches = nn.ModuleList(branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branches[0](x)
        for branch in self.branches[1:]:
            out = out + branch(x)
        return out


class Twice(nn.Module):
    """Calls one (shared) submodule twice."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.body(x))


def _leaf(kind: str) -> nn.Module:
    return {
        "linear": lambda: nn.Linear(WIDTH, WIDTH),
        "relu": nn.ReLU,
        "tanh": nn.Tanh,
        "layer_norm": lambda: nn.LayerNorm(WIDTH),
        "batch_norm": lambda: nn.BatchNorm1d(WIDTH),
    }[kind]()


def build(desc: Any) -> nn.Module:
    """Build the module a description stands for."""
    if isinstance(desc, str):
        return _leaf(desc)
    kind, children = desc
    modules = [build(c) for c in children]
    if kind == "sequential":
        return nn.Sequential(*modules)
    if kind == "residual":
        return Residual(nn.Sequential(*modules))
    if kind == "branches":
        return Branches(modules)
    return Twice(nn.Sequential(*modules))


descriptions = st.recursive(
    st.sampled_from(LEAVES),
    lambda children: st.tuples(st.sampled_from(KINDS), st.lists(children, min_size=1, max_size=3)),
    max_leaves=8,
)
