"""Capture time per route per model: fx, export, strict export, TorchDynamo, eager.

Each time is one whole :func:`unitscale.capture.capture` call forced to one route: the
model's reference forward, the route itself, the meta normalisation and the run that
checks the graph's outputs, recorded as the median of 3 with its min and max. A route
that cannot capture a model prints ``fails`` and its exception type. Models: TinyGPT,
resnet18 and tiny GPT-2 and Llama built from ``transformers`` configs
(``tests/real_models.py``). ``--quick``: fx and export only, once.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.real_models
sys.path.insert(0, str(Path(__file__).resolve().parent))

from spread import spread  # noqa: E402  (beside this script)

from unitscale.capture import ROUTES, capture  # noqa: E402
from unitscale.errors import NoRouteError  # noqa: E402
from unitscale.examples.models import TinyGPT, resnet18  # noqa: E402

Model = tuple[nn.Module, tuple[torch.Tensor, ...]]


def _zoo() -> dict[str, Callable[[], Model]]:
    zoo: dict[str, Callable[[], Model]] = {
        "TinyGPT": lambda: (
            TinyGPT(vocab_size=64, d_model=64, n_layers=2, n_heads=4, seq_len=32).eval(),
            (torch.randint(0, 64, (2, 32)),),
        ),
        "resnet18": lambda: (resnet18(num_classes=10, width=8).eval(), (torch.randn(2, 3, 32, 32),)),
    }
    try:
        from tests.real_models import gpt2, llama
    except Exception:  # transformers missing: pytest.importorskip raises its Skipped
        print("(transformers is not installed: no GPT-2 or Llama rows)")
        return zoo
    zoo["GPT-2"] = gpt2
    zoo["Llama"] = llama
    return zoo


def main(quick: bool = False) -> list[dict]:
    """Time ``capture(model, inputs, route=r)`` per model and route; print and return the rows."""
    torch.set_num_threads(1)  # one thread, quick or full: see bench_analysis.py
    routes = ("fx", "export") if quick else ROUTES
    repeats = 1 if quick else 3
    rows = []
    print(f"capture time per route (seconds, median of {repeats}); 'fails' where the route cannot capture the model")
    print(f"{'model':<10}" + "".join(f"{r:>20}" for r in routes))
    for name, build in _zoo().items():
        model, inputs = build()
        cells = []
        for route in routes:
            times: list[float] = []
            failure = ""
            for _ in range(repeats):
                start = time.perf_counter()
                try:
                    capture(model, inputs, route=route)
                except NoRouteError as e:
                    failure = e.reasons[route].split(":")[0]
                    break
                times.append(time.perf_counter() - start)
                torch._dynamo.reset()  # so a repeat does not reuse TorchDynamo's cache
            row: dict = {"model": name, "route": route, "n": len(times)}
            row |= {"seconds": "fails", "why": failure} if failure else spread("seconds", times) | {"why": ""}
            rows.append(row)
            cells.append(f"fails ({failure})" if failure else f"{row['seconds']:.2f}")
        print(f"{name:<10}" + "".join(f"{c:>20}" for c in cells))
    return rows


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
