"""Training-step time of a unit-scaled TinyGPT against the plain one, eager and compiled.

Unit scaling adds a scale multiply per op (in forward and backward); the question is what
that costs per training step. Both models take the same step (forward, cross-entropy,
backward, Adam) on the same batch; the ratio is unit-scaled time / plain time, measured in
the same run: each unit-scaled step over the plain step timed beside it, the median of those
ratios with their min and max. Targets: eager <= 1.25x, under ``torch.compile`` <= 1.10x (the compiler
fuses the scale multiplies into neighbouring kernels).

Quick mode (``--quick``) times eager steps only: an inductor compile of each model takes
longer than the quick budget on two cores.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from spread import spread  # noqa: E402  (beside this script)

import unitscale.functional as U  # noqa: E402
from unitscale import unit_scale  # noqa: E402
from unitscale.examples import TinyGPT  # noqa: E402

VOCAB, SEQ, BATCH = 64, 64, 16
#: timed steps of each model per mode in the full run, the two models alternating step by step
STEPS = 20
#: the page checks each mode's ratio against its own limit (``benchmarks/record.py`` records these)
TARGETS = [
    {
        "what": "a unit-scaled training step over a plain one, eager",
        "column": "ratio",
        "where": {"mode": "eager"},
        "at most": 1.25,
    },
    {"what": "the same under torch.compile", "column": "ratio", "where": {"mode": "compiled"}, "at most": 1.10},
]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return TinyGPT(vocab_size=VOCAB, d_model=128, n_layers=2, n_heads=4, seq_len=SEQ)


def _step_fn(model: nn.Module, loss_fn: Callable[..., torch.Tensor]) -> Callable[[torch.Tensor], float]:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(idx: torch.Tensor) -> float:
        logits = model(idx[:, :-1])
        loss = loss_fn(logits.reshape(-1, VOCAB), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss.item()

    return step


def _time_pair(
    first: Callable[[torch.Tensor], float],
    second: Callable[[torch.Tensor], float],
    idx: torch.Tensor,
    warmup: int,
    repeats: int,
) -> tuple[list[float], list[float]]:
    """Each step's time, the two steps interleaved so that load from other processes hits both alike."""
    for _ in range(warmup):
        first(idx)
        second(idx)
    times: tuple[list[float], list[float]] = ([], [])
    for _ in range(repeats):
        for fn, out in ((first, times[0]), (second, times[1])):
            start = time.perf_counter()
            fn(idx)
            out.append(time.perf_counter() - start)
    return times


def main(quick: bool = False, threads: int = 1) -> list[dict]:
    """Time both models and print the ratios; returns one row per mode."""
    # one thread by default: on shared cores, threads waiting on each other time the load
    torch.set_num_threads(threads)
    # The plain model's Adam state holds subnormal floats (squares of tiny attention gradients),
    # which are slow on CPUs and would make the plain model look slow for the wrong reason.
    torch.set_flush_denormal(True)
    batch = BATCH // 2 if quick else BATCH  # quick mode: half the batch, fewer repeats
    idx = torch.randint(0, VOCAB, (batch, SEQ + 1), generator=torch.Generator().manual_seed(0))
    modes = [("eager", False)] if quick else [("eager", False), ("compiled", True)]
    warmup, repeats = (2, 8) if quick else (5, STEPS)
    rows = []
    for mode, compiled in modes:
        plain, scaled = _model(), unit_scale(_model())
        scaled(idx[:, :-1])  # capture the graph eagerly before any compile
        if compiled:
            plain, scaled = torch.compile(plain), torch.compile(scaled)
        plain_s, scaled_s = _time_pair(
            _step_fn(plain, F.cross_entropy), _step_fn(scaled, U.cross_entropy), idx, warmup, repeats
        )
        rows.append(
            {
                "mode": mode,
                "n": repeats,
                "plain_ms": round(1e3 * statistics.median(plain_s), 2),
                "unit_scaled_ms": round(1e3 * statistics.median(scaled_s), 2),
                # each step over the plain step beside it
                **spread("ratio", [s / p for p, s in zip(plain_s, scaled_s, strict=True)]),
                "target": 1.10 if compiled else 1.25,
            }
        )
    shape = f"batch {batch}x{SEQ}, {threads} threads, median of {repeats}"
    print(f"TinyGPT(d_model=128, n_layers=2) training step, {shape}")
    print(f"{'mode':<10}{'plain ms':>10}{'unit-scaled ms':>16}{'ratio':>8}{'target':>8}")
    for row in rows:
        print(
            f"{row['mode']:<10}{row['plain_ms']:>10.2f}{row['unit_scaled_ms']:>16.2f}"
            f"{row['ratio']:>7.3f}x{row['target']:>7.2f}x"
        )
    if quick:
        print("quick mode: torch.compile skipped (compiling takes longer than the quick budget); run without --quick")
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
