"""The unit-scaling pass's rules for skip connections: in-place changes followed, residual adds paired.

``tau`` is 0.01 when the branch holds attention, else ``1 / (k + 1)`` at the ``k``-th add of a chain
(Blake et al.'s running mean): a fixed 0.5 lets batch norm in eval mode amplify a fresh sample's
departure from its running statistics block by block.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import unitscale.functional as U
from unitscale.fx.nodes import changes_in_place
from unitscale.transforms._graph import _ADD, _function_of, _insert_after, _is, _is_float_node, _member, _producer
from unitscale.transforms.pass_state import PassState

_ATTENTION: set[Any] = {F.scaled_dot_product_attention, F.softmax, torch.softmax, torch.Tensor.softmax, U.softmax}
_ATTENTION |= {U.scaled_dot_product_attention}


def follow_in_place_changes(state: PassState) -> None:
    """Make every read after an in-place change (``skip = x; x += 1``) read the change, as a residual split must."""
    for node in list(state.graph.nodes):
        changed = node.args[0] if node.args else None
        if not (isinstance(changed, fx.Node) and _is_float_node(changed) and changes_in_place(node)):
            continue
        for user in list(changed.users):
            if user is not node and node < user:
                user.replace_input_with(changed, node)


def _split_at(fork: fx.Node, join: fx.Node, tau: float) -> tuple[fx.Node, fx.Node, fx.Node]:
    """Insert ``residual_split(fork, tau)`` and its two outputs (branch, skip) after ``fork``."""
    value = fork.meta.get("example_value")
    split = _insert_after(fork, U.residual_split, (fork, tau), f"{fork.name}_split", join, (value, value))
    to_branch = _insert_after(split, operator.getitem, (split, 0), f"{fork.name}_residual", join, value)
    to_skip = _insert_after(to_branch, operator.getitem, (split, 1), f"{fork.name}_skip", join, value)
    return split, to_branch, to_skip


def _holds_attention(body: set[fx.Node]) -> bool:
    return any(_member(_function_of(n), _ATTENTION) for n in body)


def residual_adds(state: PassState) -> None:
    """Turn each residual add into a ``residual_split`` at the skip and a ``residual_add`` at the join."""
    ancestors, stream = state.ancestors, state.stream - state.frozen
    chain: dict[fx.Node, int] = {}  # the position of each non-attention add in its chain
    for node in list(state.graph.nodes):
        if node in state.done or node in state.kept or not _is(node, _ADD) or len(node.args) < 2:
            continue
        a, b = node.args[0], node.args[1]
        if node.kwargs.get("alpha", 1) != 1 or not (_is_float_node(a) and _is_float_node(b)):
            continue
        assert isinstance(a, fx.Node) and isinstance(b, fx.Node)  # float nodes
        if a in state.frozen or b in state.frozen:
            continue  # an operand inside a region left whole
        if a in ancestors[b]:
            skip, branch = a, b
        elif b in ancestors[a]:
            skip, branch = b, a
        else:
            state.done.update(_fork_join(node, a, b, ancestors, stream))
            continue
        body = {n for n in ancestors[branch] | {branch} if skip in ancestors[n]}
        # the skip is the chain's previous add, seen through casts (exported Llama's), or none
        attention = _holds_attention(body)
        chain[node] = chain.get(_producer(skip), 0) + (not attention)
        tau = 0.01 if attention else 1 / (chain[node] + 1)
        split, to_branch, to_skip = _split_at(skip, node, tau)
        for user in list(skip.users):
            if user in body:
                user.replace_input_with(skip, to_branch)
        node.op, node.target, node.args, node.kwargs = "call_function", U.residual_add, (branch, to_skip, tau), {}
        state.done.update({node, split, to_branch, to_skip})


def _fork_join(
    node: fx.Node, a: fx.Node, b: fx.Node, ancestors: dict[fx.Node, set[fx.Node]], stream: set[fx.Node]
) -> list[fx.Node]:
    """``a + b`` where both paths start at one fork (ResNet's downsampling block): a residual pair there.

    Else the fork's gradient would be the sum of two unit-std gradients; returns the nodes changed and added.
    """
    if a not in stream or b not in stream:
        return []
    common = ancestors.get(a, set()) & ancestors.get(b, set()) & stream
    # A node returning a tuple (attention and its weights, a GRU's state) is no fork; the getitem both sides read is.
    forks = [n for n in node.graph.nodes if n in common and isinstance(n.meta.get("example_value"), torch.Tensor)]
    if not forks or not _is_float_node(forks[-1]):
        return []
    fork = forks[-1]
    sides = {}
    for user in fork.users:
        on_a = user is a or user in ancestors.get(a, set())
        on_b = user is b or user in ancestors.get(b, set())
        if on_a == on_b:
            if on_a:
                return []
            continue
        sides[user] = 0 if on_a else 1
    if set(sides.values()) != {0, 1}:
        return []
    body_a = {n for n in ancestors.get(a, set()) | {a} if fork in ancestors.get(n, set())}
    body_b = {n for n in ancestors.get(b, set()) | {b} if fork in ancestors.get(n, set())}
    inside = body_a | body_b | {fork}
    if any(p in common and p not in inside for n in inside - {fork} for p in n.all_input_nodes):
        # a path from upstream reaches a side around the fork: a split would weight only part of it
        return []
    attention_a, attention_b = _holds_attention(body_a), _holds_attention(body_b)
    # The branch is the side with attention, else the longer one; the other is the skip.
    branch_side = 0 if (attention_a, len(body_a)) >= (attention_b, len(body_b)) else 1
    tau = 0.01 if attention_a or attention_b else 0.5
    added = _split_at(fork, node, tau)
    for user, side in sides.items():
        user.replace_input_with(fork, added[1] if side == branch_side else added[2])
    branch, skip = (a, b) if branch_side == 0 else (b, a)
    node.op, node.target, node.args, node.kwargs = "call_function", U.residual_add, (branch, skip, tau), {}
    return [node, *added]
