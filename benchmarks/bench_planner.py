"""The planner against the splits people use today, end to end: real gloo pipelines, measured steps.

Models, built from ``transformers`` configs (random weights, ``use_cache=False``), each returning its
logits as ``(batch, vocab, seq)`` so that ``nn.CrossEntropyLoss`` is the training loss:

* ``gpt2-vocab``: GPT-2 style, width 256, 8 layers, vocabulary 8192 (the output projection weighs
  like a few layers, as in GPT-2 small);
* ``llama-vocab``: Llama style, width 256, 8 layers, vocabulary 16384, untied output projection;
* ``uniform``: the control: the GPT-2 layers with a vocabulary of 256, so every block weighs the same.

Every split cuts only between *blocks*: the embedding (everything before layer 0), each layer, the
tail (final norm and output projection). Split for 2 ranks under ``1f1b`` (2 stages) and
``interleaved_1f1b`` (4 stages, 2 per rank), by:

* **ours**: ``plan_pipeline`` over those cuts with its defaults (``cost="time"``: each node timed on
  the example batch in this process, one thread as in the workers; backward = 2 x forward; no link
  or bookkeeping cost), then **ours (calibrated)**: ``plan_pipeline(..., calibration=run)`` after
  one pipeline run of the first plan (each stage's measured forward and backward, the measured
  gloo link and the schedule's bookkeeping per action);
* **equal layers**: torchtitan's default (``generate_llm_fqn_per_model_part`` with
  ``input_weight = output_weight = 1``: the embedding and the tail each count as one layer, layers
  dealt out evenly, the remainder to the first stages);
* **ends weighted**: the same rule with the tail weighted as the layers its forward FLOPs make
  (rounded, at most a stage's share, as torchtitan requires), the embedding as 1;
* **FLOPs by hand**: what a careful user picks from per-block forward FLOPs
  (:class:`torch.utils.flop_counter.FlopCounterMode`): the split with the least largest stage.

No method is given a memory limit. Each plan is run for real with ``run_pipeline`` (training steps,
the same microbatches, ``steps`` timed after ``warmup``), and its step is the median of that run;
the plans of a model and schedule are run in alternation, ``rounds`` times (the order rotated each
round), and each plan's median and spread (min-max over rounds) are reported. Under ``1f1b`` every
cut between blocks is measured: that exhaustive measurement is the oracle. The predicted step is
the simulator's, with the calibrated costs (and, beside it, with the default ones). The speed-ups
at 4 and 8 ranks (and interleaved) are simulated with the same costs on a 32-layer model of the
same width (not run: this machine has 2 cores).

``--quick``: the uniform model with 2 layers, 2 rounds of 2 steps, no simulated ranks.
"""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from unitscale import StagePlan, partition, run_pipeline
from unitscale.stages import plan_pipeline
from unitscale.stages.model_costs import chain_costs_for, piece_costs
from unitscale.stages.planner import plan_chain
from unitscale.stages.search import optimal_bounds, stage_sums
from unitscale.stages.simulation import simulate_bounds

BATCH, SEQ, MICRO = 8, 64, 4
LAYER = re.compile(r"(?:^|\.)(?:h|layers)\.(\d+)(?:\.|$)")


class Logits(nn.Module):
    """A causal LM returning ``(batch, vocab, seq)`` logits, as ``nn.CrossEntropyLoss`` takes them."""

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids).logits.transpose(1, 2)


def build(kind: str, layers: int) -> nn.Module:
    import transformers

    torch.manual_seed(0)
    if kind == "llama-vocab":
        cfg = transformers.LlamaConfig(
            vocab_size=16384,
            hidden_size=256,
            intermediate_size=704,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=SEQ,
            tie_word_embeddings=False,
            use_cache=False,
        )
        lm = transformers.LlamaForCausalLM(cfg)
    else:
        vocab = 8192 if kind == "gpt2-vocab" else 256
        cfg = transformers.GPT2Config(
            vocab_size=vocab,
            n_embd=256,
            n_layer=layers,
            n_head=4,
            n_positions=SEQ,
            bos_token_id=0,
            eos_token_id=0,
            use_cache=False,
        )
        lm = transformers.GPT2LMHeadModel(cfg)
    return Logits(lm.eval())


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, 1 thread per process "
        f"(OMP_NUM_THREADS=1), 2 gloo ranks on one machine"
    )


# ---------------------------------------------------------------- blocks and the rules people use


def blocks_of(plan: StagePlan) -> tuple[list[int], list[str]]:
    """Node-index bounds of the blocks (embedding, each layer, tail) and their names."""
    layer = [LAYER.search(str(n.meta.get("module_path", ""))) for n in plan.compute_nodes()]
    index = [int(m.group(1)) if m else None for m in layer]
    first = min(i for i, x in enumerate(index) if x is not None)
    last = max(i for i, x in enumerate(index) if x is not None)
    cuts, names = [0], ["embedding"]
    for i in range(first, last + 1):
        if index[i] is not None and (i == first or index[i] != index[i - 1]) and i not in cuts:
            cuts.append(i)
            names.append(f"layer {index[i]}")
    cuts += [last + 1, len(index)]
    names.append("tail")
    allowed = set(plan.pieces)
    assert all(c in allowed for c in cuts), "a cut between blocks is not allowed by the graph"
    return cuts, names


def torchtitan_split(num_stages: int, num_layers: int, input_weight: int, output_weight: int) -> list[int]:
    """Block bounds of torchtitan's rule (``generate_llm_fqn_per_model_part``, written here from its
    documented behaviour): ``L + w_in + w_out`` effective layers dealt out evenly, the remainder to
    the first stages; stage 0 holds the embedding and its share less ``w_in`` layers, the last stage
    its share less ``w_out`` layers and the tail. Blocks: 0 embedding, 1..L layers, L + 1 tail."""
    effective = num_layers + input_weight + output_weight
    share, extra = divmod(effective, num_stages)
    bounds, layer = [0], 0
    for s in range(num_stages):
        mine = share + (1 if s < extra else 0)
        if s == 0:
            mine -= input_weight
        if s == num_stages - 1:
            mine -= output_weight
        layer = min(num_layers, layer + max(mine, 0))
        bounds.append(1 + layer if s < num_stages - 1 else num_layers + 2)
    return bounds


def block_flops(model: nn.Module, plan: StagePlan, x: torch.Tensor, cuts: list[int]) -> list[float]:
    """Forward FLOPs per block, counted per node on the example batch."""
    flops_plan = partition(model, 1, x, cost="flops")
    costs = [c for _, c in flops_plan.node_costs]
    assert [n for n, _ in flops_plan.node_costs] == [n for n, _ in plan.node_costs]
    return stage_sums(costs, cuts)


# ---------------------------------------------------------------- running and measuring


def run_plan(plan: StagePlan, x: torch.Tensor, y: torch.Tensor, schedule: str, v: int, steps: int, warmup: int) -> Any:
    return run_pipeline(
        plan,
        x,
        MICRO,
        schedule,
        stages_per_rank=v,
        loss_fn=nn.CrossEntropyLoss(),
        target=y,
        steps=steps,
        warmup=warmup,
        timeout=600,
    )


def measure(
    plans: dict[tuple[int, ...], StagePlan],
    x: torch.Tensor,
    y: torch.Tensor,
    schedule: str,
    v: int,
    rounds: int,
    steps: int,
    warmup: int,
) -> dict[tuple[int, ...], list[float]]:
    """Each plan's step (the median of a run's timed steps), run in alternation ``rounds`` times."""
    keys = list(plans)
    seen: dict[tuple[int, ...], list[float]] = {k: [] for k in keys}
    for r in range(rounds):
        order = keys[r % len(keys) :] + keys[: r % len(keys)]
        for k in order:
            seen[k].append(run_plan(plans[k], x, y, schedule, v, steps, warmup).step_time)
    return seen


def spread(times: Sequence[float]) -> str:
    return f"{min(times) * 1e3:.0f}-{max(times) * 1e3:.0f}"


def compare(
    kind: str,
    layers: int,
    quick: bool,
    settings: tuple[int, int, int] | None = None,
    schedules: Sequence[tuple[str, int]] = (("1f1b", 1), ("interleaved_1f1b", 2)),
) -> tuple[list[dict], Any]:
    """Every method's split of one model, measured (``settings``: rounds, timed steps, warm-up steps)."""
    rounds, steps, warmup = settings or ((2, 2, 1) if quick else (5, 8, 2))
    model = build(kind, layers)
    x = torch.randint(0, model.lm.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, model.lm.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    base = partition(model, 1, x, cost="time")
    cuts, names = blocks_of(base)
    n = len(base.node_costs)
    blocks = StagePlan(
        base.root, base.graph, base.node_costs, [0, n], base.cost, (x,), cuts, base.route, base.output_spec, kind
    )
    flops = block_flops(model, base, x, cuts)
    tail_weight = max(1, round(flops[-1] / statistics.mean(flops[1:-1])))
    rows: list[dict] = []
    calibration = None
    for schedule, v in schedules:
        k = 2 * v
        if k > len(cuts) - 1:
            continue
        per_stage = (layers + 2) // k
        methods: dict[str, list[int]] = {}
        ours = plan_pipeline(blocks, x, 2, schedule=schedule, num_microbatches=MICRO, stages_per_rank=v)
        methods["ours"] = list(ours.bounds)
        if calibration is None:
            calibration = run_plan(ours, x, y, schedule, v, steps, warmup)
        tuned = plan_pipeline(
            blocks, x, 2, schedule=schedule, num_microbatches=MICRO, stages_per_rank=v, calibration=calibration
        )
        methods["ours (calibrated)"] = list(tuned.bounds)
        methods["equal layers"] = [cuts[b] for b in torchtitan_split(k, layers, 1, 1)]
        weight = min(tail_weight, per_stage)
        methods[f"ends weighted (tail = {weight})"] = [cuts[b] for b in torchtitan_split(k, layers, 1, weight)]
        methods["FLOPs by hand"] = [cuts[b] for b in optimal_bounds(flops, k)]
        plans = {tuple(b): blocks.with_bounds(list(b)) for b in methods.values()}
        if v == 1:  # the oracle: every cut between blocks
            for c in cuts[1:-1]:
                plans.setdefault((0, c, n), blocks.with_bounds([0, c, n]))
        seen = measure(plans, x, y, schedule, v, rounds, steps, warmup)
        costs = tuned.chain_costs
        medians = {b: statistics.median(t) for b, t in seen.items()}
        best = min(medians, key=medians.__getitem__)
        ours_median = medians[tuple(methods["ours (calibrated)"])]

        def label(b: tuple[int, ...]) -> str:
            return ", ".join(names[cuts.index(c)] for c in b[1:-1])

        for b, t in sorted(seen.items(), key=lambda kv: medians[kv[0]]):
            by = [m for m, mb in methods.items() if tuple(mb) == b]
            predicted = simulate_bounds(costs, list(b), schedule, MICRO, v).step_time
            uncalibrated = simulate_bounds(ours.chain_costs, list(b), schedule, MICRO, v).step_time
            rows.append(
                {
                    "model": kind,
                    "schedule": schedule,
                    "stages start at": label(b),
                    "chosen by": ", ".join(by) or "(exhaustive)",
                    "measured ms (median)": round(medians[b] * 1e3, 1),
                    "spread ms": spread(t),
                    "predicted ms": round(predicted * 1e3, 1),
                    "predicted / measured": round(predicted / medians[b], 3),
                    "uncalibrated predicted / measured": round(uncalibrated / medians[b], 3),
                    "ours (calibrated) / this": round(ours_median / medians[b], 3),
                    "best measured": b == best,
                }
            )
    return rows, (blocks, calibration)


# ---------------------------------------------------------------- simulated at 4 and 8 ranks


def simulated(kind: str, layers: int, calibration: Any) -> list[dict]:
    """Speed-ups of our plan over each rule at 4 and 8 ranks, simulated with node timings of a deeper
    model (link and bookkeeping as measured on the 2-rank run)."""
    model = build(kind, layers)
    x = torch.randint(0, model.lm.config.vocab_size, (BATCH, SEQ), generator=torch.Generator().manual_seed(0))
    base = partition(model, 1, x, cost="time")
    cuts, _ = blocks_of(base)
    n = len(base.node_costs)
    blocks = StagePlan(
        base.root, base.graph, base.node_costs, [0, n], base.cost, (x,), cuts, base.route, base.output_spec, kind
    )
    flops = block_flops(model, base, x, cuts)
    tail_weight = max(1, round(flops[-1] / statistics.mean(flops[1:-1])))
    rows = []
    for ranks in (4, 8):
        for schedule, v in (("1f1b", 1), ("interleaved_1f1b", 2)):
            k, m = ranks * v, 2 * ranks
            link = calibration.stage_costs
            costs = chain_costs_for(
                blocks, m, latency=link.latency, bandwidth=link.bandwidth, action_overhead=link.action_overhead
            )
            found = plan_chain(piece_costs(costs, cuts), ranks, schedule, m, v)
            ours = simulate_bounds(costs, [cuts[b] for b in found.bounds], schedule, m, v).step_time
            rules = {
                "equal layers": torchtitan_split(k, layers, 1, 1),
                "ends weighted": torchtitan_split(k, layers, 1, min(tail_weight, (layers + 2) // k)),
                "FLOPs by hand": optimal_bounds(flops, k),
            }
            row: dict[str, Any] = {
                "model": f"{kind}, {layers} layers",
                "ranks": ranks,
                "schedule": schedule,
                "microbatches": m,
            }
            for name, b in rules.items():
                row[f"{name} / ours"] = round(
                    simulate_bounds(costs, [cuts[i] for i in b], schedule, m, v).step_time / ours, 3
                )
            row["ours proven optimal"] = found.optimal
            rows.append(row)
    return rows


def _table(rows: list[dict], title: str) -> None:
    if not rows:
        return
    print(f"\n{title}")
    columns = list(dict.fromkeys(k for r in rows for k in r))
    print(" | ".join(columns))
    for r in rows:
        print(" | ".join(str(r.get(c, "")) for c in columns))


def main(quick: bool = False) -> list[dict]:
    torch.set_num_threads(1)  # as each worker runs: node timings then match the stages' speed
    started = time.perf_counter()
    cases = [("uniform", 2)] if quick else [("gpt2-vocab", 8), ("llama-vocab", 8), ("uniform", 8)]
    rows: list[dict] = [{"machine": machine(), "quick": quick}]
    measured: list[dict] = []
    sims: list[dict] = []
    for kind, layers in cases:
        got, (_, calibration) = compare(kind, layers, quick)
        measured += got
        if not quick:
            sims += simulated(kind, 32, calibration)
    _table(measured, f"Measured steps on 2 gloo ranks ({machine()})")
    _table(sims, "Simulated steps at 4 and 8 ranks: each rule's step over ours")
    print(f"\n{time.perf_counter() - started:.0f} s")
    return rows + measured + sims


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
