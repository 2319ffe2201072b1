"""The unit-scaling pass's rules for convolutional networks, whose ops' inputs are often not ``N(0, 1)``."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import fx

import unitscale.functional as U
from unitscale.transforms._graph import (
    _activation_path,
    _ancestors,
    _consumers,
    _member,
    _producer,
    _scale_after,
    _stream,
)
from unitscale.transforms.pass_state import PassState

_MATMULS: set[Any] = {U.linear, U.matmul, U.addmm, U.conv2d}


def constrain_before_batch_norms(state: PassState) -> None:
    """A matmul or convolution off the trunk that only batch norm reads takes its input-gradient scale both ways.

    Batch norm undoes the forward scale; a mean of the two would grow the gradient at every downsampling.
    """
    for node in state.graph.nodes:
        if not (node.op == "call_function" and _member(node.target, _MATMULS)) or "constraint" in node.kwargs:
            continue
        readers = _consumers(node)
        if readers and all(user.target is U.batch_norm and user.args[:1] == (via,) for user, via in readers):
            node.kwargs = {**node.kwargs, "constraint": "to_grad_input_scale"}


_POOLS: set[Any] = {U.adaptive_avg_pool2d, U.avg_pool2d, U.mean}


def _global_window(node: fx.Node, value: torch.Tensor, before: torch.Tensor) -> int | None:
    """The elements a pool to one value per channel (a 1x1 map, or a mean pool) averages, else ``None``."""
    # int(): under a free batch (an exported graph) the sizes are symbolic, the window is not
    if node.target is U.mean:
        return int(before.numel() // max(value.numel(), 1))
    if value.dim() >= 2 and value.shape[-2:].numel() == 1:
        return int(before.shape[-2:].numel())
    return None


def scale_global_pools(state: PassState) -> None:
    """Scale an average pool to one value per channel for its input's mean: ``(r**2 + 1/k)**-0.5`` forward.

    ``r`` is the activation's mean over its std (0.68 for ReLU), ``k`` the window; off the trunk (a
    squeeze-excitation block) the forward scale goes both ways, else the gate after it saturates.
    """
    for node in list(state.graph.nodes):
        if not (node.op == "call_function" and _member(node.target, _POOLS)):
            continue
        value, source = node.meta.get("example_value"), node.args[0] if node.args else None
        before = source.meta.get("example_value") if isinstance(source, fx.Node) else None
        if not (isinstance(value, torch.Tensor) and isinstance(before, torch.Tensor)):
            continue
        window = _global_window(node, value, before)
        if window is None:
            continue
        trunk = "constraint" in node.kwargs and node.kwargs["constraint"] is None
        if not trunk:
            node.kwargs = {**node.kwargs, "constraint": "to_output_scale"}
        ratio = _mean_to_std(_producer(source))
        if ratio == 0.0 or window <= 1:
            continue
        factor = (ratio**2 + 1 / window) ** -0.5 / window**0.5
        state.done.add(_scale_after(node, factor, 1.0 if trunk else factor, "of_mean"))


# The torch function of each activation twin whose output has a mean (its ratio to the std is measured).
_ACTIVATIONS: dict[Any, Callable[..., Any]] = {U.relu: F.relu, U.relu6: F.relu6, U.silu: F.silu, U.gelu: F.gelu}
_ACTIVATIONS[U.hardswish] = F.hardswish
_MEAN_TO_STD_KEY = "unitscale_mean_to_std"


def _mean_to_std(node: Any) -> float:
    """Mean over std of the activation that made ``node``, for ``N(0, 1)`` input (0 for anything else)."""
    if isinstance(node, fx.Node) and _MEAN_TO_STD_KEY in node.meta:
        return float(node.meta[_MEAN_TO_STD_KEY])
    fn = _ACTIVATIONS.get(node.target) if isinstance(node, fx.Node) and node.op == "call_function" else None
    return 0.0 if fn is None else _ratio(fn)


@functools.cache
def _ratio(fn: Callable[..., Any]) -> float:
    """Mean over std of ``fn(x)`` for ``x ~ N(0, 1)``, by the trapezoid rule on [-12, 12] (0.683 for ReLU)."""
    x = torch.linspace(-12, 12, 24001, dtype=torch.float64)
    density = torch.exp(-(x**2) / 2) / (2 * torch.pi) ** 0.5
    y = fn(x)
    mean = torch.trapezoid(y * density, x)
    return float(mean / (torch.trapezoid(y * y * density, x) - mean**2).sqrt())


@functools.lru_cache(maxsize=16)
def _post_residual_relu(tau: float) -> tuple[float, float]:
    """Forward and backward scales of a ReLU after ``residual_add(branch, skip, tau)`` whose skip is such a ReLU.

    The skip's mean is not 0: a ReLU of the (Gaussian) sum, iterated to the fixed point, passes
    more than half its inputs (72% at ``tau = 0.5``); ``1 / RMS`` forward, ``Phi(a)**-0.5`` backward.
    """
    mean, forward, share = 0.564, 2**0.5, 0.5  # start from a ReLU of N(0, 1) at unit RMS
    for _ in range(60):
        mu = (1 - tau) ** 0.5 * mean
        sigma = (tau + (1 - tau) * (1 - mean * mean)) ** 0.5
        a = mu / sigma
        pdf, cdf = math.exp(-a * a / 2) / (2 * math.pi) ** 0.5, 0.5 * (1 + math.erf(a / 2**0.5))
        forward = ((mu * mu + sigma * sigma) * cdf + mu * sigma * pdf) ** -0.5
        mean, share = forward * (mu * cdf + sigma * pdf), cdf
    return forward, share**-0.5


def rescale_relus_after_residuals(state: PassState) -> None:
    """Make a ReLU after a residual add whose skip is a ReLU torch's, then scale it (:func:`_post_residual_relu`).

    Both scales on the trunk, else their geometric mean both ways.
    """
    rewritten: set[fx.Node] = set()
    for node in list(state.graph.nodes):
        if node.target is not U.relu or not node.args:
            continue
        join = _producer(node.args[0])
        if not (isinstance(join, fx.Node) and join.target is U.residual_add and len(join.args) >= 3):
            continue
        skip = _producer(join.args[1])
        while isinstance(skip, fx.Node) and (skip.target is operator.getitem or skip.target is U.residual_split):
            skip = skip.args[0]
        skip = _producer(skip)
        if not (isinstance(skip, fx.Node) and (skip.target is U.relu or skip in rewritten)):
            continue
        tau = join.args[2]
        if not isinstance(tau, (int, float)):
            continue
        forward, backward = _post_residual_relu(float(tau))
        if node in state.constrained:
            forward = backward = (forward * backward) ** 0.5
        node.target, node.kwargs = F.relu, {}
        rescaled = _scale_after(node, forward, backward, "after_residual")
        # a pool after it takes a plain ReLU's ratio (0.68), not the fixed point's (0.98): measured
        # on ResNet, RegNet and BotNet, the latter undershoots the pooled scale by a factor of 2
        rescaled.meta[_MEAN_TO_STD_KEY] = _ratio(F.relu)
        rewritten.update({node, rescaled})
        state.done.update({node, rescaled})


def balance_gates(state: PassState) -> None:
    """Unconstrain a gate's product where its ``k**-0.5`` gradient scale holds, else keep its constraint.

    It holds where the operands' gradients do not meet upstream, or where the gate's branch alone
    starts at a global average pool over the ``k`` positions, which then gets ``k**0.5`` backward.
    """
    graph = state.graph
    muls = [n for n in graph.nodes if n.target is U.mul and len(n.args) == 2]
    if not muls:
        return
    ancestors = _ancestors(graph)
    stream = _stream(graph, _activation_path(state.gm))
    for node in muls:
        out = node.meta.get("example_value")
        a, b = node.args
        values = [x.meta.get("example_value") if isinstance(x, fx.Node) else None for x in (a, b)]
        tensors = [v for v in values if isinstance(v, torch.Tensor)]
        if not isinstance(out, torch.Tensor) or len(tensors) != 2:
            continue
        small = [i for i, v in enumerate(tensors) if 0 < v.numel() < out.numel()]
        if len(small) != 1:
            continue
        gate, other = (a, b) if small == [0] else (b, a)
        copies = out.numel() // tensors[small[0]].numel()
        meet = (ancestors[gate] | {gate}) & (ancestors[other] | {other}) & stream
        pool = None if not meet else _gate_pool(gate, node, copies, ancestors, stream)
        if meet and pool is None:
            continue
        node.kwargs = {**node.kwargs, "constraint": None}
        if pool is not None:
            state.done.add(_scale_after(pool, 1.0, copies**0.5, "gate_balanced"))


def _gate_pool(
    gate: fx.Node, product: fx.Node, copies: int, ancestors: dict[fx.Node, set[fx.Node]], stream: set[fx.Node]
) -> fx.Node | None:
    """The global average pool over ``copies`` positions where the gate's branch alone starts, if there is one."""
    for pool in [n for n in ancestors[gate] if n.target in _POOLS and n in stream]:
        source = pool.args[0] if pool.args else None
        value, before = pool.meta.get("example_value"), getattr(source, "meta", {}).get("example_value")
        sizes = [v.numel() for v in (value, before) if isinstance(v, torch.Tensor)]
        if len(sizes) != 2 or not sizes[0] or sizes[1] != copies * sizes[0]:
            continue
        branch = {n for n in ancestors[gate] if pool in ancestors[n]} | {gate}
        inside = branch | {pool}
        entered_once = all(p in inside or p not in stream for n in branch for p in n.all_input_nodes)
        left_once = all(set(n.users) <= branch for n in inside - {gate}) and set(gate.users) == {product}
        if entered_once and left_once:
            return pool
    return None


def rescale_max_pools_of_relus(state: PassState) -> None:
    """Scale a max pool of a ReLU by ``2**-0.5`` both ways: a window's maximum keeps both halves the ReLU drops."""
    for node in list(state.graph.nodes):
        if node.target is not U.max_pool2d or node.kwargs.get("return_indices") or len(node.args) > 6:
            continue
        source = _producer(node.args[0])
        if not (isinstance(source, fx.Node) and source.target is U.relu):
            continue
        state.done.add(_scale_after(node, 2**-0.5, 2**-0.5, "of_relu"))
