"""Pipeline-stage balance: the exact min-max split against the usual heuristics.

1. Model zoo (TinyGPT at several depths, ResNet-18, an MLP with uneven widths), N = 2, 4, 8
   stages, FLOPs per node, cuts at module boundaries: the bottleneck (largest stage) of equal
   layer counts and of a greedy size-threshold split, as ratios to the optimum that
   ``unitscale.partition`` finds (1.000 by definition).
2. Random instances (log-normal costs): mean and worst ratio to the optimum of equal counts,
   greedy threshold, block partition (local search, torchgpipe style) and max-min DP.
3. Time to partition a 20,000-node graph: the search alone, and ``partition()`` end to end
   (trace, shape propagation, costs, search).
4. Time for ``partition()`` on tiny ``transformers`` GPT-2 and Llama (they go through
   ``torch.export``, which dominates), when ``transformers`` is installed.
5. Schedule-aware planning (``unitscale.stages.planner.plan_chain``) of a 20,000-node chain for 8
   ranks with a memory limit and communication, against the min-max search on the same chain:
   seconds, the certified gap (0: proved optimal; else the search spent its budget and the gap
   bounds how far from optimal its plan can be; rounding leaves about 1e-15), and how much slower
   the plan that minimises the step-time formula simulates. Also the same chain grouped into 128
   pieces (as module boundaries group nodes), and a 512-node chain on 4 ranks. Then
   ``plan_pipeline()`` on a 20,000-node *graph* (an ``nn.Module``), end to end (capture, the
   graph checked against the model, shapes, costs, plan) and planning alone.
6. Against the anchors: torchgpipe's ``balance_cost`` (block partition), DeepSpeed's
   ``partition_balanced`` (a DP on max - min) and PiPPy's ``split_into_equal_size`` (a greedy
   threshold; torch's own pipelining ships no split policy), on the zoo and on random chains:
   bottleneck and simulated 1F1B step time (8 microbatches, backward = 2 x forward) as ratios to
   our plan (which minimises the simulated step, so an anchor's bottleneck can be smaller: a
   ratio below 1). The real torchgpipe code is used when it is installed (the ``test`` extra
   installs torchgpipe 0.0.7, pure Python, which imports beside torch 2.13); otherwise, and always
   for DeepSpeed and PiPPy (DeepSpeed's package imports far more than this function; PiPPy's
   policy reads parameter counts off a graph, not a list of costs), a re-implementation written
   here from their published code, checked against it on random chains (see the functions'
   docstrings). Where an anchor's rule gives no plan it can run (an empty stage, too few
   stages), its cells say so.
7. Predicted against measured: real gloo pipelines on 2 ranks (one thread each), planned from
   per-node timings as tutorial 11 does, run, re-planned with ``calibration=`` that run and run
   again: the first estimate, the replay of the workers' durations and the calibrated estimate,
   each over the step measured for its plan (quick mode: the wide MLP under 1F1B only).
"""

from __future__ import annotations

import gc
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from spread import spread  # beside this script (benchmarks/)
from stage_heuristics import block_partition_bounds, max_min_bounds
from torch import fx, nn

from unitscale import partition
from unitscale.examples.models import TinyGPT, resnet18
from unitscale.stages.partitioner import search as P
from unitscale.stages.planner import plan_chain
from unitscale.stages.planner.chain_arrays import ChainArrays
from unitscale.stages.planner.formula import Problem, formula_plan
from unitscale.stages.planner.model_costs import piece_costs
from unitscale.stages.planner.simulation import simulate_bounds
from unitscale.stages.schedules import ChainCosts

Heuristic = Callable[[Sequence[float], int], list[int]]

HEURISTICS: dict[str, Heuristic] = {
    "equal count": lambda c, k: P.equal_count_bounds(len(c), k),
    "greedy threshold": P.greedy_threshold_bounds,
    "block partition": block_partition_bounds,
    "max-min DP": max_min_bounds,
}


def _uneven_mlp() -> nn.Sequential:
    widths = [32, 512, 16, 256, 64, 1024, 8, 128, 32]
    layers: list[nn.Module] = []
    for a, b in zip(widths, widths[1:], strict=False):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def _zoo(quick: bool) -> list[tuple[str, nn.Module, torch.Tensor, int | None]]:
    torch.manual_seed(0)
    depths = (6,) if quick else (2, 6, 12, 24)
    zoo: list[tuple[str, nn.Module, torch.Tensor, int | None]] = [
        (
            f"TinyGPT-{n}",
            TinyGPT(vocab_size=64, d_model=64, n_layers=n, n_heads=4, seq_len=32),
            torch.randint(0, 64, (4, 32)),
            2,
        )
        for n in depths
    ]
    zoo.append(("ResNet-18 (w=16)", resnet18(num_classes=10, width=16), torch.randn(4, 3, 32, 32), 2))
    zoo.append(("MLP (uneven)", _uneven_mlp(), torch.randn(4, 32), 1))
    return zoo


def _ratios(costs: Sequence[float], k: int) -> dict[str, float]:
    best = P.bottleneck(costs, P.optimal_bounds(costs, k))
    row = {"ours": 1.0}
    for label, heuristic in HEURISTICS.items():
        row[label] = P.bottleneck(costs, heuristic(costs, k)) / best
    return row


def model_zoo(quick: bool) -> list[dict]:
    """Bottleneck ratios to the optimum on real models (FLOPs per node, module-boundary cuts)."""
    rows = []
    for name, model, x, depth in _zoo(quick):
        plan = partition(model, 1, x, cost="flops", boundary_depth=depth)
        pieces = P.stage_sums([c for _, c in plan.node_costs], plan.pieces)
        for k in (2, 4, 8):
            if k <= len(pieces):
                rows.append(
                    {"benchmark": "model zoo (FLOPs)", "case": f"{name}, {len(pieces)} pieces", "N": k}
                    | _ratios(pieces, k)
                )
    return rows


def random_instances(quick: bool) -> list[dict]:
    """Mean and worst ratio to the optimum of each heuristic on random log-normal chains."""
    rng = random.Random(0)
    count = 40 if quick else 1000  # quick: does it run (tests/test_benchmarks.py); the page shows full runs
    samples = []
    for _ in range(count):
        n, k = rng.randint(16, 48), rng.choice((2, 4, 8))
        samples.append(_ratios([rng.lognormvariate(0.0, 1.0) for _ in range(n)], k))
    case = f"{count} chains, n=16..48"
    return [
        {"benchmark": "random chains, mean", "case": case, "N": "2/4/8"}
        | {label: statistics.fmean(r[label] for r in samples) for label in samples[0]},
        {"benchmark": "random chains, worst", "case": case, "N": "2/4/8"}
        | {label: max(r[label] for r in samples) for label in samples[0]},
    ]


class _Chain(nn.Module):
    """``n`` alternating adds and multiplies: a graph of ``n`` compute nodes."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(self.n):
            x = x + 1.0 if i % 2 else x * 0.5
        return x


def _name_cost(node: fx.Node) -> float:
    return float(len(node.name) % 7 + 1)


def large_graph(quick: bool) -> list[dict]:
    """Seconds to partition a 20,000-node graph (search only, and end to end)."""
    n = 20_000
    rng = random.Random(0)
    costs = [rng.lognormvariate(0.0, 1.0) for _ in range(n)]
    rows = []
    for k in (2, 8, 64):
        times = _seconds(lambda k=k: P.optimal_bounds(costs, k), 3)
        rows.append(
            {"benchmark": "20,000-node graph", "case": "search only", "N": k, "n": 3} | spread("seconds", times)
        )
    times = _seconds(lambda: partition(_Chain(n), 8, torch.randn(2), cost=_name_cost), 1 if quick else 3)
    row = {"benchmark": "20,000-node graph", "case": "partition() end to end", "N": 8, "n": len(times)}
    rows.append(row | spread("seconds", times))
    return rows


def _seconds(fn: Callable[[], object], repeats: int) -> list[float]:
    """The seconds of each of ``repeats`` calls of ``fn``."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def _random_chain(n: int, seed: int = 0) -> ChainCosts:
    rng = random.Random(seed)
    forward = [rng.lognormvariate(0.0, 1.0) * 1e-4 for _ in range(n)]
    return ChainCosts.uniform(
        forward,
        2.0,
        param_bytes=[rng.uniform(0, 1e6) for _ in range(n)],
        activation_bytes=[rng.uniform(0, 1e5) for _ in range(n)],
        boundary_bytes=[0.0, *[rng.uniform(1e4, 1e6) for _ in range(n - 1)], 0.0],
        bandwidth=1e9,
        latency=1e-4,
    )


def _pieces(costs: ChainCosts, size: int) -> ChainCosts:
    """``costs`` grouped into runs of ``size`` items (as module boundaries group nodes)."""

    return piece_costs(costs, [*range(0, len(costs), size), len(costs)])


def planning_large(quick: bool) -> list[dict]:
    """Seconds to plan a 20,000-node chain for 8 ranks under 1F1B with memory limit and communication,
    the certified gap (step / lower bound - 1: 0 when the search proved its plan optimal), and the
    simulated step of the formula's optimum (the first incumbent) as a ratio to the plan returned."""

    n = 20_000
    costs = _random_chain(n)
    rows = []
    both = [(f + b) for f, b in zip(costs.forward, costs.backward, strict=True)]
    base = _seconds(lambda: P.optimal_bounds(both, 8), 3)
    rows.append(
        {"benchmark": "20,000-node chain, 8 ranks", "case": "min-max search (baseline)", "n": 3}
        | spread("seconds", base)
        | {"gap": 0.0, "formula plan / ours": math.nan}
    )
    cases = [
        ("1F1B, communication", costs, 8, "1f1b", None),
        ("1F1B, communication, memory limit", costs, 8, "1f1b", 1.8e9),
        ("GPipe, communication, memory limit", costs, 8, "gpipe", 3.6e9),
    ]
    if not quick:
        cases.append(("1F1B, same chain in 128 pieces", _pieces(costs, 157), 8, "1f1b", 2e9))
        cases.append(("1F1B, 512-node chain, 4 ranks", _random_chain(512), 4, "1f1b", None))
    for label, chain, ranks, schedule, limit in cases:
        start = time.perf_counter()
        found = plan_chain(chain, ranks, schedule, 16, memory_limit=limit)
        seconds = [time.perf_counter() - start]  # once: the search is deterministic, and takes seconds
        formula = formula_plan(Problem(ChainArrays(chain, ranks, schedule, 16, 1, limit, None)))[0]
        rows.append(
            {
                "benchmark": "20,000-node chain, 8 ranks",
                "case": f"{label} ({found.simulated} simulated, {'optimal' if found.optimal else 'budget spent'})",
                "n": 1,
                **spread("seconds", seconds),
                "gap": found.step_time / found.lower_bound - 1,
                "formula plan / ours": simulate_bounds(chain, formula, schedule, 16).step_time / found.step_time,
            }
        )
    return rows + planning_graph(quick)


def planning_graph(quick: bool) -> list[dict]:
    """Seconds (median of three, min and max) for ``plan_pipeline()`` on a 20,000-node graph end to
    end (capture, checking the graph, shapes, costs, plan), and for planning alone from the captured
    plan: 1F1B on 8 ranks, 16 microbatches, a memory limit the unconstrained optimum breaks,
    1 GB/s links with 0.1 ms latency."""
    from unitscale.stages import plan_pipeline, simulate

    n = 2_000 if quick else 20_000
    model, x = _Chain(n), torch.randn(2)
    # ~0.1 ms per node and microbatch, as in the chains above; every node keeps a 0.5-byte microbatch slice
    setting = {"schedule": "1f1b", "num_microbatches": 16, "seconds_per_cost": 4e-4, "bandwidth": 1e9, "latency": 1e-4}
    captured = partition(model, 1, x, cost=_name_cost)  # captured once: the limit, then planning alone
    free = plan_pipeline(captured, x, 8, **setting)  # type: ignore[arg-type]
    limit = 0.9 * max(simulate(free, "1f1b", 16).rank_memory)
    del free
    whole: list[float] = []
    alone: list[float] = []
    for _ in range(1 if quick else 3):
        # what the parts before left behind would otherwise be collected on this clock (GC stays on)
        gc.collect()
        start = time.perf_counter()
        plan = plan_pipeline(model, x, 8, cost=_name_cost, memory_limit=limit, **setting)  # type: ignore[arg-type]
        whole.append(time.perf_counter() - start)
        gc.collect()
        start = time.perf_counter()
        plan_pipeline(captured, x, 8, memory_limit=limit, **setting)  # type: ignore[arg-type]
        alone.append(time.perf_counter() - start)
    gap = plan.step_time / plan.lower_bound - 1
    state = "optimal" if plan.optimal else "budget spent"
    label = f"{n:,}-node graph, 1F1B, communication, memory limit ({state})"
    return [
        {"benchmark": "plan_pipeline() on a graph", "case": f"{label}: end to end", "n": len(whole)}
        | spread("seconds", whole)
        | {"gap": gap, "formula plan / ours": math.nan},
        {"benchmark": "plan_pipeline() on a graph", "case": f"{label}: planning alone", "n": len(alone)}
        | spread("seconds", alone)
        | {"gap": gap, "formula plan / ours": math.nan},
    ]


class NoPlan(Exception):
    """An anchor's rule gave no usable plan for this case; the message is the table's cell."""


def torchgpipe_balance(costs: Sequence[float], k: int) -> list[int]:
    """torchgpipe's ``balance_cost`` (``torchgpipe.balance``, v0.0.7) as stage bounds.

    Uses the installed torchgpipe when there is one. Otherwise a re-implementation of
    its ``blockpartition.solve`` (Bárány et al., arXiv 1308.2452): costs normalised to
    ``[0, 1]`` by ``(c - min) / (max - min)``, equal counts to start, then one item at a
    time moves toward the lightest block (ties broken as Python's ``min`` over
    ``(size, index)`` does, not toward the nearest block as the paper asks) until the
    heaviest exceeds the lightest by at most 1, a normalised unit. Checked equal to
    torchgpipe 0.0.7 (its wheel, imported beside torch 2.13) on 2,000 random chains (half of
    them with about a third of their items of cost 0) and on every zoo case here.

    Raises:
        NoPlan: the balance holds a stage of no layers (or does not add up to the layers).
            That happens where several items normalise to 0 (the cheapest ones, often free
            reshapes): a tie between empty blocks moves an item out of an empty block, and a
            bound can run below 0. ``torchgpipe.GPipe`` refuses such a balance ("all balance
            numbers must be positive integer", or "module and sum of balance have different
            length"); or its moves cycle and it never returns (1 random chain in 2,000 with
            zero-cost items; the re-implementation notices the repeated state).
    """
    lengths = _block_partition_lengths(costs, k)  # first: it says when torchgpipe would never stop
    try:
        from torchgpipe.balance import balance_cost  # type: ignore[import-not-found]
    except ImportError:
        pass
    else:
        lengths = balance_cost(list(costs), k)
    if any(length <= 0 for length in lengths) or sum(lengths) != len(costs):
        raise NoPlan(f"balance {lengths}")
    bounds = [0]
    for length in lengths:
        bounds.append(bounds[-1] + length)
    return bounds


def _block_partition_lengths(costs: Sequence[float], k: int) -> list[int]:
    n = len(costs)
    low, span = min(costs), max(costs) - min(costs)
    norm = [(c - low) / span if span else 0.0 for c in costs]
    ends = [n // k * (i + 1) for i in range(k - 1)] + [n]

    def size(i: int) -> float:
        return sum(norm[(ends[i - 1] if i else 0) : ends[i]])

    seen: set[tuple[int, ...]] = set()
    while True:
        heaviest, p = max((size(i), i) for i in range(k))
        while True:
            state = (p, *ends)
            if state in seen:  # the moves are deterministic: a state met again repeats forever
                raise NoPlan("never stops")
            seen.add(state)
            lightest, q = min((size(i), i) for i in range(k))
            if heaviest <= lightest + 1:
                # lengths of the slices torchgpipe takes (a bound gone negative wraps, as a slice does)
                return [len(range(n)[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]
            # move one item into the lightest block from its neighbour on the heaviest's side
            if p < q:
                h = q - 1
                ends[h] -= 1
            else:
                h = q + 1
                ends[q] += 1
            if p == h:
                break


def deepspeed_balanced(costs: Sequence[float], k: int) -> list[int]:
    """DeepSpeed's ``partition_balanced`` (``deepspeed.runtime.utils``, v0.19.8), re-implemented.

    Its dynamic programme minimises the spread ``max - min`` of stage sums (not the
    largest stage), keeping the last split reaching the best spread (its ``>=``); with
    ``n <= k`` it falls back to equal counts. Checked equal to DeepSpeed 0.19.8's function
    on 600 random chains (the package itself needs hjson, pydantic and more to import).
    """
    n = len(costs)
    if n <= k:
        return [min(i, n) for i in range(k + 1)]
    prefix = [0.0, *itertools.accumulate(float(c) for c in costs)]
    inf = math.inf
    hi = [[inf] * (k + 1) for _ in range(n + 1)]
    lo = [[inf] * (k + 1) for _ in range(n + 1)]
    spread = [[inf] * (k + 1) for _ in range(n + 1)]
    where = [[0] * (k + 1) for _ in range(n + 1)]
    hi[0][0] = spread[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, min(i, k) + 1):
            for cut in range(i):
                stage = prefix[i] - prefix[cut]
                top, bottom = max(hi[cut][j - 1], stage), min(lo[cut][j - 1], stage)
                if spread[i][j] >= top - bottom:
                    spread[i][j], hi[i][j], lo[i][j], where[i][j] = top - bottom, top, bottom, cut
    bounds = [n]
    for j in range(k, 0, -1):
        bounds.append(where[bounds[-1]][j])
    return bounds[::-1]


def pippy_equal_size(costs: Sequence[float], k: int) -> list[int]:
    """PiPPy's ``split_into_equal_size`` policy (``pippy.ModelSplit``, torchpippy 0.2.0), re-implemented.

    torch 2.13's ``torch.distributed.pipelining`` takes a ``split_policy`` callable in
    ``pipeline()`` but ships no policy (its ``_IR.py`` has the hook only), so PiPPy's own is
    the one to compare. Its rule, applied here to each item's cost where PiPPy reads the
    parameter elements of each node (items are distinct, so its de-duplication of shared
    parameters changes nothing): the threshold is ``total // k``; walking the items in
    order, skipping those of cost 0, an item that fits under the threshold joins the
    current stage; one that alone exceeds it, with the stage still empty, becomes a stage of
    its own (the cut goes after it); otherwise a new stage starts at it. Only the first
    ``k - 1`` cuts are kept. Checked equal to torchpippy 0.2.0's
    ``_split_on_size_threshold_with_max_stages`` (its wheel, imported beside torch 2.13, on
    graphs of modules holding that many parameters) on 2,000 random integer chains.

    Raises:
        NoPlan: the rule found fewer than ``k - 1`` cuts (PiPPy's ``assert rv_nstages ==
            nstages`` fails), or its last cut falls after the last item (an empty stage).
    """
    n = len(costs)
    threshold = math.fsum(costs) // k
    cuts: list[int] = []
    size = 0.0
    for i, c in enumerate(costs):
        if not c:
            continue
        if size + c <= threshold:
            size += c
        elif size == 0:
            cuts.append(i + 1)
        else:
            cuts.append(i)
            size = c
    cuts = cuts[: k - 1]
    if len(cuts) < k - 1:
        raise NoPlan(f"{len(cuts) + 1} of {k} stages")
    if cuts[-1] >= n:
        raise NoPlan("empty last stage")
    return [0, *cuts, n]


ANCHORS: dict[str, Heuristic] = {
    "torchgpipe balance": torchgpipe_balance,
    "DeepSpeed balanced": deepspeed_balanced,
    "PiPPy equal size": pippy_equal_size,
}


def _anchor_row(costs: Sequence[float], k: int, m: int = 8) -> dict[str, float | str]:
    chain = ChainCosts.uniform(costs, 2.0)
    ours = plan_chain(chain, k, "1f1b", m).bounds
    best_b, best_t = P.bottleneck(costs, ours), simulate_bounds(chain, ours, "1f1b", m).step_time
    row: dict[str, float | str] = {}
    for label, anchor in ANCHORS.items():
        try:
            bounds = anchor(costs, k)
        except NoPlan as reason:
            row[f"{label}: bottleneck"], row[f"{label}: step"] = "no plan", str(reason)
            continue
        row[f"{label}: bottleneck"] = P.bottleneck(costs, bounds) / best_b
        row[f"{label}: step"] = simulate_bounds(chain, bounds, "1f1b", m).step_time / best_t
    return row


def anchors(quick: bool) -> list[dict]:
    """Bottleneck and simulated 1F1B step of torchgpipe's, DeepSpeed's and PiPPy's plans, as ratios to ours."""
    rows = []
    for name, model, x, depth in _zoo(quick):
        plan = partition(model, 1, x, cost="flops", boundary_depth=depth)
        pieces = P.stage_sums([c for _, c in plan.node_costs], plan.pieces)
        for k in (2, 4, 8):
            if k <= len(pieces):
                case = {"benchmark": "anchors / ours", "case": f"{name}, {len(pieces)} pieces", "N": k}
                rows.append(case | _anchor_row(pieces, k))
    rng = random.Random(1)
    samples = []
    count = 10 if quick else 400
    for _ in range(count):
        n, k = rng.randint(16, 48), rng.choice((2, 4, 8))
        samples.append(_anchor_row([rng.lognormvariate(0.0, 1.0) for _ in range(n)], k))
    chains = "random chains n=16..48"
    for how, reduce in (("mean", statistics.fmean), ("worst", max)):
        summary = {}
        for key in samples[0]:
            values = [r[key] for r in samples if isinstance(r[key], float)]
            summary[key] = reduce(values) if values else "no plan"
        rows.append({"benchmark": "anchors / ours", "case": f"{chains}, {how} (of plans)", "N": "2/4/8"} | summary)
    refused = {key: f"{sum(isinstance(r[key], str) for r in samples)} of {count}" for key in samples[0]}
    rows.append({"benchmark": "anchors / ours", "case": f"{chains}, no plan", "N": "2/4/8"} | refused)
    return rows


def _tiny_transformers() -> list[tuple[str, nn.Module]]:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    common = {"vocab_size": 128, "bos_token_id": 0, "eos_token_id": 1, "use_cache": False}
    gpt2 = AutoConfig.for_model("gpt2", n_embd=64, n_layer=4, n_head=4, n_positions=64, **common)
    llama = AutoConfig.for_model(
        "llama",
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **common,
    )
    return [(name, AutoModelForCausalLM.from_config(cfg).eval()) for name, cfg in (("GPT-2", gpt2), ("Llama", llama))]


def real_models(quick: bool) -> list[dict]:
    """Seconds for ``partition()`` on tiny GPT-2 and Llama (4 layers, via torch.export), per cost model."""
    try:
        models = _tiny_transformers()
    except ImportError:
        return []
    ids = torch.randint(0, 128, (4, 32))
    rows = []
    for name, model in models:
        for cost in ("params",) if quick else ("params", "flops"):
            plans: list[Any] = []

            def once(model: nn.Module = model, cost: str = cost, plans: list[Any] = plans) -> None:
                plans.append(partition(model, 2, ids, cost=cost, boundary_depth=3))

            times = _seconds(once, 1 if quick else 3)
            case = f"{name} (4 layers), {len(plans[0].node_costs)} nodes, {cost}"
            row = {"benchmark": "partition() on transformers", "case": case, "N": 2, "n": len(times)}
            rows.append(row | spread("seconds", times))
    return rows


def _median_seconds(fn: Callable[[], object], repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _prediction_cases(quick: bool) -> list[tuple[str, nn.Module, torch.Tensor, torch.Tensor, str, int]]:
    """(name, model, batch, target, schedule, stages per rank)."""
    torch.manual_seed(0)
    d = 768
    mlp = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(d, d), nn.GELU())], nn.Linear(d, 8))
    x, y = torch.randn(512, d), torch.randn(512, 8)
    cases = [("wide MLP (tutorial 11)", mlp, x, y, "1f1b", 1)]
    if not quick:
        cases.append(("wide MLP (tutorial 11)", mlp, x, y, "interleaved_1f1b", 2))
        gpt = TinyGPT(vocab_size=256, d_model=256, n_layers=4, n_heads=4, seq_len=128)
        ids = torch.randint(0, 256, (32, 128))
        cases.append(("TinyGPT (4 x 256)", gpt, ids, torch.randn(32, 128, 256), "1f1b", 1))
    return cases


def prediction(quick: bool) -> list[dict]:
    """Predicted against measured step time of real gloo pipelines (2 ranks, one thread each).

    As tutorial 11 does it: every node timed once on one thread, scaled to the model's measured
    forward on a microbatch, backward as the measured ratio; the planner's plan is run (12 timed
    steps; 4 in quick mode), then re-planned with ``calibration=`` that run and run again. Columns: the
    first plan's estimate, the replay of the workers' durations and the calibrated plan's
    estimate, each over the step measured for its plan (1.0 is exact).
    """
    from unitscale import run_pipeline
    from unitscale.stages import plan_pipeline

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each worker computes
    rows, ranks, m = [], 2, 4
    steps = 4 if quick else 12  # quick: does it run; the page shows full runs
    try:
        for name, model, x, y, schedule, v in _prediction_cases(quick):
            base = partition(model, 1, x, cost="time")
            mb = x[: len(x) // m]
            forward = _median_seconds(lambda mb=mb, model=model: model(mb))
            both = _median_seconds(lambda mb=mb, model=model: model(mb).float().pow(2).mean().backward())
            options = {
                "schedule": schedule,
                "stages_per_rank": v,
                "num_microbatches": m,
                "seconds_per_cost": forward * m / sum(c for _, c in base.node_costs),
                "backward": max(both - forward, 0.0) / forward,
                "bandwidth": 1e9,
                "latency": 1e-4,
            }

            def run(plan: Any, x: torch.Tensor = x, y: torch.Tensor = y, schedule: str = schedule, v: int = v) -> Any:
                return run_pipeline(
                    plan, x, m, schedule, stages_per_rank=v, loss_fn=nn.MSELoss(), target=y, steps=steps, warmup=2
                )

            first = plan_pipeline(base, x, ranks, **options)
            measured = run(first)
            again = plan_pipeline(base, x, ranks, calibration=measured, **options)
            rerun = run(again)
            rows.append(
                {
                    "benchmark": "predicted / measured",
                    "case": f"{name}, {schedule}" + (f" (v={v})" if v > 1 else ""),
                    "N": ranks,
                    "n": steps,
                    **spread("measured ms", [t * 1e3 for t in _step_times(measured)]),
                    "planned / measured": first.step_time / measured.step_time,
                    "replay / measured": measured.predicted().step_time / measured.step_time,
                    "calibrated / measured": again.step_time / rerun.step_time,
                }
            )
    finally:
        torch.set_num_threads(threads)
    return rows


def _step_times(run: Any) -> list[float]:
    """Each timed step of a pipeline run: the slowest rank's, as ``run.step_time`` takes their median."""
    return [max(r.steps[i][1] - r.steps[i][0] for r in run.records) for i in range(len(run.records[0].steps))]


def _table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    keys = list(rows[0])
    widths = {
        k: max(len(k), *(len(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k])) for r in rows)) for k in keys
    }
    print("  ".join(f"{k:>{widths[k]}}" for k in keys))
    for row in rows:
        cells = [f"{row[k]:>{widths[k]}.3f}" if isinstance(row[k], float) else f"{row[k]!s:>{widths[k]}}" for k in keys]
        print("  ".join(cells))


def main(quick: bool = False) -> list[dict]:
    """Run the three parts, print a table for each, and return all rows."""
    torch.set_num_threads(1)  # one thread, quick or full: see bench_analysis.py
    zoo = model_zoo(quick)
    _table(zoo, "Bottleneck / optimal bottleneck on a model zoo (FLOPs per node, module-boundary cuts)")
    rand = random_instances(quick)
    _table(rand, "Bottleneck / optimal bottleneck on random log-normal chains (mean and worst)")
    big = large_graph(quick)
    _table(big, "Seconds to partition a 20,000-node graph")
    real = real_models(quick)
    if real:
        _table(real, "Seconds for partition() on tiny transformers models (torch.export route)")
    planning = planning_large(quick)
    _table(planning, "Seconds to plan a 20,000-node chain, and graph, for 8 ranks (schedule-aware, exact)")
    anchor = anchors(quick)
    _table(anchor, "torchgpipe, DeepSpeed and PiPPy plans / our plan: bottleneck and simulated 1F1B step (m=8)")
    predicted = prediction(quick)
    _table(predicted, "Predicted / measured step of gloo pipelines (2 ranks): first plan, replay, calibrated plan")
    return zoo + rand + big + real + planning + anchor + predicted


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
