"""analyse_module time / plain forward+backward time, on TinyGPT (4 layers, d=256, seq 128, batch 8).

The ratio is the cost of scale tracking: interpreting the graph and one std per tensor in
forward and backward (a sum and a dot product on the CPU). The trace is cached per module;
the "first call" row adds tracing and generating the code. Target: <= 1.15x. If
Graphcore's ``unit-scaling`` package is importable (``unit_scaling.utils``), its
``analyse_module`` ratio on the same model is printed beside ours; it traces on every call,
so compare it with our first call.
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable

import torch

from unitscale import analyse_module
from unitscale.examples.models import TinyGPT
from unitscale.tracking import analysis, clear_trace_cache


def _best_times(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Best wall time and best process CPU time of each function over ``repeats`` rounds.

    The functions take turns within each round, so a busy machine slows them alike; the
    best time is the least disturbed one. CPU time is reported too: on a machine shared
    with other jobs it is the steadier of the two. As in :mod:`timeit`, Python's cyclic
    garbage collector is off while a function is timed (and run before it), so no call
    pays for collecting the garbage of another.
    """
    for fn in fns.values():
        fn()
    best = {name: (float("inf"), float("inf")) for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            gc.collect()
            gc.disable()
            try:
                wall, cpu = time.perf_counter(), time.process_time()
                fn()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            finally:
                gc.enable()
            best[name] = (min(best[name][0], wall), min(best[name][1], cpu))
    return best


def main(quick: bool = False) -> list[dict]:
    """Time plain forward+backward and ``analyse_module`` on TinyGPT; print and return the rows."""
    torch.set_num_threads(2)
    torch.manual_seed(0)
    # the same model in quick mode: a smaller one would overstate the fixed per-node costs
    layers, d, seq, batch = 4, 256, 128, 8
    repeats = 3 if quick else 21
    model = TinyGPT(vocab_size=64, d_model=d, n_layers=layers, n_heads=4, seq_len=seq)
    idx = torch.randint(0, 64, (batch, seq))
    grad = torch.randn(batch, seq, 64)

    def plain() -> None:
        model(idx).backward(grad)
        model.zero_grad(set_to_none=True)

    def ours() -> None:
        analyse_module(model, idx, grad, syntax_highlight=False)

    def ours_fresh() -> None:
        clear_trace_cache()  # as on the first call: trace, then track
        analysis._code_lines.cache_clear()  # and parse the code for annotating
        ours()

    fns: dict[str, Callable[[], object]] = {
        "plain forward+backward": plain,
        "analyse_module (trace cached)": ours,
        "analyse_module, first call": ours_fresh,
    }
    try:
        from unit_scaling.utils import analyse_module as theirs  # type: ignore[import-not-found]
    except ImportError:
        theirs = None
    if theirs is not None:
        fns["unit_scaling.analyse_module"] = lambda: theirs(model, idx, grad, syntax_highlight=False)
    best = _best_times(fns, repeats)
    wall0, cpu0 = best["plain forward+backward"]
    rows = [
        {"what": name, "seconds": wall, "ratio": wall / wall0, "cpu_seconds": cpu, "cpu_ratio": cpu / cpu0}
        for name, (wall, cpu) in best.items()
    ]
    print(f"TinyGPT(n_layers={layers}, d_model={d}), batch {batch} x seq {seq}, 2 threads, best of {repeats}")
    print(f"{'what':<36} {'wall ms':>9} {'ratio':>7} {'cpu ms':>9} {'ratio':>7}")
    for row in rows:
        print(
            f"{row['what']:<36} {row['seconds'] * 1e3:>9.1f} {row['ratio']:>6.2f}x"
            f" {row['cpu_seconds'] * 1e3:>9.1f} {row['cpu_ratio']:>6.2f}x"
        )
    if theirs is None:
        print("(unit-scaling is not installed: no side-by-side row)")
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
