"""A model's nodes as a chain the planner splits: per-node forward and backward time, memory and
traffic (:func:`chain_costs_for`), summed over the pieces no cut may split (:func:`piece_costs`),
and scaled to what a pipeline run measured (:func:`calibrated`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from torch import fx

from unitscale.errors import CostError, InputError
from unitscale.stages.partitioner.costs import call_cost, output_bytes, params_per_node
from unitscale.stages.schedules import ADAM_BYTES_PER_PARAM, ChainCosts, check_link

__all__ = ["calibrated", "chain_costs_for", "piece_costs"]


def piece_costs(costs: ChainCosts, pieces: Sequence[int]) -> ChainCosts:
    """``costs`` summed over each piece (the runs of nodes no cut may split; ``pieces`` are their bounds).

    >>> from unitscale.stages.planner.model_costs import piece_costs
    >>> from unitscale.stages.schedules import ChainCosts
    >>> piece_costs(ChainCosts.uniform([1.0, 2.0, 3.0]), [0, 2, 3]).forward
    (3.0, 3.0)
    """

    def summed(values: Sequence[float]) -> tuple[float, ...]:
        return tuple(math.fsum(values[a:b]) for a, b in zip(pieces, pieces[1:], strict=False))

    return replace(
        costs,
        forward=summed(costs.forward),
        backward=summed(costs.backward),
        param_bytes=summed(costs.param_bytes),
        activation_bytes=summed(costs.activation_bytes),
        boundary_bytes=tuple(costs.boundary_bytes[b] for b in pieces),
    )


def chain_costs_for(
    plan: Any,
    num_microbatches: int,
    *,
    seconds_per_cost: float = 1.0,
    backward: float | Callable[[fx.Node], float] = 2.0,
    bytes_per_param: float = ADAM_BYTES_PER_PARAM,
    bandwidth: float = math.inf,
    latency: float = 0.0,
    action_overhead: float = 0.0,
) -> ChainCosts:
    """Per-node :class:`~unitscale.stages.planner.ChainCosts` of a :class:`~unitscale.StagePlan`.

    The node costs are taken as measured on the whole batch of one step: a microbatch's forward
    is the node cost times ``seconds_per_cost`` over ``num_microbatches``, and its activations
    and traffic are the example batch's split ``num_microbatches`` ways. Each node keeps its
    output for the backward; a cut sends the tensors that cross it.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages.planner.model_costs import chain_costs_for
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    >>> plan = partition(model, 1, torch.randn(4, 4))
    >>> c = chain_costs_for(plan, num_microbatches=2)
    >>> c.param_bytes, c.activation_bytes, c.boundary_bytes
    ((640.0, 288.0), (64.0, 16.0), (0.0, 64.0, 0.0))
    """
    if isinstance(num_microbatches, bool) or not isinstance(num_microbatches, int) or num_microbatches < 1:
        raise InputError(f"num_microbatches={num_microbatches!r} must be an int >= 1")
    check_link(bandwidth, latency)
    if not (isinstance(bytes_per_param, (int, float)) and bytes_per_param >= 0 and math.isfinite(bytes_per_param)):
        raise CostError(f"bytes_per_param={bytes_per_param!r} must be a finite number >= 0 (Adam in fp32: 16)")
    nodes = plan.compute_nodes()
    position = {node: i for i, node in enumerate(nodes)}
    n = len(nodes)
    # node costs were measured on the whole example batch; a microbatch is 1/m of it
    forward = [c * seconds_per_cost / num_microbatches for _, c in plan.node_costs]
    if callable(backward):
        bwd = [call_cost(backward, node, "backward") for node in nodes]
    else:
        if not (isinstance(backward, (int, float)) and backward >= 0 and math.isfinite(backward)):
            raise CostError(f"backward={backward!r} must be a ratio >= 0 to the forward, or a callable node -> seconds")
        bwd = [f * backward for f in forward]
    params = params_per_node(plan.root, nodes)
    acts = [output_bytes(node.meta.get("tensor_meta")) / num_microbatches for node in nodes]
    crossing = [0.0] * (n + 2)
    for node in plan.graph.nodes:
        if node.op not in ("placeholder", "call_function", "call_method", "call_module") or not node.users:
            continue
        size = output_bytes(node.meta.get("tensor_meta")) / num_microbatches
        made = position.get(node, -1)
        last = max(position.get(u, n) for u in node.users)
        # crosses the cut before item i for made < i <= last
        crossing[made + 1] += size
        crossing[min(last, n) + 1] -= size
    boundary = [b if 0 < i < n else 0.0 for i, b in enumerate(itertools.accumulate(crossing[: n + 1]))]
    return ChainCosts(
        forward=tuple(forward),
        backward=tuple(bwd),
        param_bytes=tuple(params[node] * bytes_per_param for node in nodes),
        activation_bytes=tuple(acts),
        boundary_bytes=tuple(max(b, 0.0) for b in boundary),
        bandwidth=bandwidth,
        latency=latency,
        action_overhead=action_overhead,
    )


def calibrated(costs: ChainCosts, result: Any, costs_at: Callable[[int], ChainCosts]) -> ChainCosts:
    """Per-node ``costs`` scaled, stage by stage, to the durations a pipeline run measured.

    ``result`` is a :class:`~unitscale.stages.PipelineResult` of a plan of the same graph;
    ``costs_at(m)`` gives the uncalibrated costs at its microbatch count. Each node's forward and
    backward are scaled by its stage's measured over predicted time (a stage predicted free: the
    ratio of the totals); the link, bookkeeping and weight-gradient share become the measured ones.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale import partition
    >>> from unitscale.stages import PipelineResult
    >>> from unitscale.stages.planner import ChainCosts
    >>> from unitscale.stages.planner.model_costs import calibrated, chain_costs_for
    >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    >>> plan = partition(model, 2, torch.randn(8, 4), cost="params")
    >>> at = lambda m: chain_costs_for(plan, m, backward=1.0)
    >>> zero = (0.0, 0.0)
    >>> ran = ChainCosts((2.0, 1.0), (6.0, 3.0), zero, zero, (0.0, *zero),
    ...                  latency=0.5, action_overhead=0.25)
    >>> run = PipelineResult(None, torch.tensor(0.0), {}, 1.0, ran,
    ...                      num_microbatches=2, bounds=[0, 1, 2])
    >>> # each node ran at 2 s and 1 s a microbatch of 2; now 4 microbatches
    >>> c = calibrated(at(4), run, at)
    >>> c.forward, c.backward, c.latency, c.action_overhead
    ((1.0, 0.5), (3.0, 1.5), 0.5, 0.25)
    """
    measured, bounds = getattr(result, "stage_costs", None), getattr(result, "bounds", None)
    if measured is None or bounds is None:
        raise InputError(
            f"calibration={type(result).__name__} is not a measured pipeline run; pass the PipelineResult that "
            "run_pipeline(plan, ..., loss_fn=..., target=...) returns"
        )
    if bounds[-1] != len(costs) or len(bounds) != len(measured) + 1:
        raise InputError(
            f"calibration ran a plan of {bounds[-1]} nodes in {len(bounds) - 1} stages, but this graph has "
            f"{len(costs)} nodes; calibrate with a run of a plan of the same model and example inputs"
        )
    ran = costs_at(result.num_microbatches)

    def ratios(predicted: Sequence[float], seen: Sequence[float]) -> list[float]:
        sums = [math.fsum(predicted[a:b]) for a, b in itertools.pairwise(bounds)]
        total = math.fsum(sums)
        overall = math.fsum(seen) / total if total > 0 else 1.0
        return [t / p if p > 0 else overall for p, t in zip(sums, seen, strict=True)]

    forward, backward = list(costs.forward), list(costs.backward)
    scales = zip(ratios(ran.forward, measured.forward), ratios(ran.backward, measured.backward), strict=True)
    for s, (rf, rb) in enumerate(scales):
        for i in range(bounds[s], bounds[s + 1]):
            forward[i] *= rf
            backward[i] *= rb
    return replace(
        costs,
        forward=tuple(forward),
        backward=tuple(backward),
        bandwidth=measured.bandwidth,
        latency=measured.latency,
        weight_grad_share=measured.weight_grad_share,
        action_overhead=measured.action_overhead,
    )
