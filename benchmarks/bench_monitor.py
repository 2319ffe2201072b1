"""Training with a ``ScaleMonitor`` recording every 10th step, as a ratio to the same training without it.

Each model takes the same training steps (forward, loss, backward, Adam) on the same batch,
with and without a :class:`unitscale.tracking.ScaleMonitor` (``every=10``: one step in ten records every
module output, gradient, parameter and parameter gradient against FP8 E4M3 / E5M2). The
ratio is the time of ten monitored steps over ten plain ones, measured in the same run, the
two interleaved step by step so that load from other processes hits both alike; a ``record
step`` column gives one recording step over the round's mean plain step. Each is the median
over rounds, recorded with its min and max. Target: <= 1.10x for every 10th step. On one
thread the clock is the thread's own CPU time (``time.thread_time``), which time slices
taken by other processes on a shared machine do not inflate (wall time there swung by 30%
between rounds); with more threads it is
wall time. Models: TinyGPT, a tiny Llama from ``transformers`` (random weights, no download), and
``unitscale.examples.resnet18``.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the unitscale beside this file, not an installed one
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spread import spread  # noqa: E402  (beside this script)

from unitscale.examples import TinyGPT, resnet18  # noqa: E402
from unitscale.tracking import ScaleMonitor  # noqa: E402

EVERY = 10
#: rounds of the full run (each ten plain and ten monitored steps, interleaved)
ROUNDS = 5
#: what the page checks each row against (``benchmarks/record.py`` records it)
TARGETS = [
    {
        "what": "training with a monitor recording every 10th step, over plain training",
        "column": "every 10th",
        "at most": 1.10,
    }
]
VOCAB, SEQ = 256, 64


def _llama(width: int) -> nn.Module | None:
    try:
        import transformers
    except ImportError:
        return None
    cfg = transformers.AutoConfig.for_model(
        "llama",
        vocab_size=VOCAB,
        hidden_size=width,
        intermediate_size=4 * width,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        use_cache=False,
    )
    return transformers.AutoModelForCausalLM.from_config(cfg)


def _zoo(quick: bool) -> dict[str, tuple[Callable[[], nn.Module | None], Any, Any]]:
    batch = 8 if quick else 16
    ids = torch.randint(0, VOCAB, (batch, SEQ + 1))
    lm_inputs, lm_targets = ids[:, :-1], ids[:, 1:]
    return {
        "TinyGPT": (lambda: TinyGPT(VOCAB, 128, 2, 4, SEQ), lm_inputs, lm_targets),
        "Llama": (lambda: _llama(128), lm_inputs, lm_targets),
        "resnet18": (
            lambda: resnet18(num_classes=10, width=16),
            torch.randn(batch, 3, 32, 32),
            torch.randint(0, 10, (batch,)),
        ),
    }


def _logits(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


def _step(model: nn.Module, x: Any, y: Any, monitor: ScaleMonitor | None) -> Callable[[int], None]:
    """One training step numbered ``step``: forward, loss, backward, Adam (its own optimiser)."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)

    def run(step: int) -> None:
        if monitor is None:
            logits = _logits(model(x))
            F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        else:
            with monitor.step(step):
                logits = _logits(model(x))
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return run


def _timed(fn: Callable[[int], None], step: int, clock: Callable[[], float]) -> float:
    start = clock()
    fn(step)
    return clock() - start


def main(quick: bool = False, threads: int = 1) -> list[dict]:
    """Time plain and monitored training steps per model; print and return rows."""
    torch.set_num_threads(threads)
    rounds = 1 if quick else ROUNDS  # quick: does it run (tests/test_benchmarks.py); the page shows full runs
    rows = []
    clock, clock_name = (time.thread_time, "thread CPU time") if threads == 1 else (time.perf_counter, "wall time")
    print(f"{threads} threads ({clock_name}); median of {rounds} rounds of {EVERY} steps; monitor every {EVERY} steps")
    print(f"{'model':<10} {'every 10th':>11} {'record step':>12} {'plain ms/step':>14} {'tensors':>8}")
    for name, (build, x, y) in _zoo(quick).items():
        torch.manual_seed(0)
        model = build()
        if model is None:
            print(f"{name:<10} (transformers is not installed)")
            continue
        model.train()
        monitor, always = ScaleMonitor(model, every=EVERY), ScaleMonitor(model, every=1)
        plain, monitored, recording = (_step(model, x, y, m) for m in (None, monitor, always))
        plain(0), monitored(0), recording(0)  # warm-up: allocator, lazy imports
        every, record, plain_ms = [], [], []
        gc.collect()
        gc.disable()
        try:
            for _ in range(rounds):
                # Step by step, a plain step beside each monitored one, so that load from other
                # processes (which moves within a second) hits both alike.
                pairs = [(_timed(plain, i, clock), _timed(monitored, i, clock)) for i in range(EVERY)]
                base = sum(p for p, _ in pairs)
                every.append(sum(m for _, m in pairs) / base)
                record.append(_timed(recording, 0, clock) / (base / EVERY))
                plain_ms.append(base / EVERY * 1e3)
                gc.collect()
        finally:
            gc.enable()
        tensors = len(always.history) // (rounds + 1)  # warm-up and each round record once
        monitor.close()
        always.close()
        row = {
            "model": name,
            "n": rounds,
            **spread("every 10th", every),
            **spread("record step", record),
            "plain ms/step": statistics.median(plain_ms),
            "tensors": tensors,
        }
        rows.append(row)
        print(
            f"{name:<10} {row['every 10th']:>10.3f}x {row['record step']:>11.2f}x "
            f"{row['plain ms/step']:>14.1f} {tensors:>8}"
        )
    return rows


if __name__ == "__main__":
    threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 1
    main(quick="--quick" in sys.argv, threads=threads)
