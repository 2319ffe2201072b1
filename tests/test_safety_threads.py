"""The library's own calls from several threads at once: same results as one thread, torch left as it was.

A ``torch.fx`` trace patches ``nn.Module.__call__`` and ``__getattr__`` for the whole
process; two traces at once used to undo each other's patches in the wrong order and
leave the class patched (every later ``nn.Linear(2, 2)(x)`` raised ``NameError``).
The oracle for every tool is the same call made on one thread, before the threads start.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import unitscale as us
from unitscale.capture import clear_capture_cache

_CALL, _GETATTR = nn.Module.__call__, nn.Module.__getattr__


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(x)))


def model(seed: int) -> nn.Module:
    made = nn.Sequential(nn.Linear(8, 16), Block(), nn.ReLU(), Block(), nn.Linear(16, 4))
    # the threads share torch's one RNG: each model's weights come from a generator of its own
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in made.parameters():
            p.copy_(torch.randn(p.shape, generator=g) / 4)
    return made


def inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def rows(report: Any) -> list[tuple[Any, ...]]:
    return [(r.node, r.module_path, r.op, r.shape, r.forward, r.backward, r.abs_max) for r in report]


def track(route: str) -> Callable[[int], Any]:
    def job(seed: int) -> Any:
        x, g = inputs(seed)
        return rows(us.track_scales(model(seed), x, g, route=route))

    return job


def partition(seed: int) -> Any:
    plan = us.partition(model(seed), 3, inputs(seed)[0])
    return plan.assignment, plan.stage_costs


def unit_scale(seed: int) -> Any:
    x = inputs(seed)[0]
    scaled = us.unit_scale(model(seed), example_inputs=(x,))
    # unit_scale draws new weights from the process's one RNG, which the threads share:
    # the graph's code and its output under weights fixed here are what must agree
    with torch.no_grad():
        for i, p in enumerate(scaled.parameters()):
            p.copy_(torch.linspace(-1, 1, p.numel()).reshape(p.shape) * (i + 1) / 7)
    return scaled.graph_module.code, scaled(x)


def inline(seed: int) -> Any:
    x = inputs(seed)[0]
    flat = us.inline(model(seed), example_inputs=(x,))
    return flat.code, flat(x)


JOBS: dict[str, Callable[[int], Any]] = {
    "track_scales": track("auto"),
    "track_scales eager": track("eager"),
    "partition": partition,
    "unit_scale": unit_scale,
    "inline": inline,
}


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def test_four_threads_get_what_one_thread_gets() -> None:
    expected = {(name, seed): job(seed) for name, job in JOBS.items() for seed in range(4)}
    clear_capture_cache()
    got: dict[tuple[str, int], list[Any]] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def worker(seed: int) -> None:
        names = list(JOBS)
        names = names[seed:] + names[:seed]  # each thread starts with another tool
        try:
            start.wait()
            for name in names:
                got.setdefault((name, seed), []).append(JOBS[name](seed))
        except BaseException as e:  # reported below, with the others
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(got) == len(expected)
    assert nn.Module.__call__ is _CALL and nn.Module.__getattr__ is _GETATTR
    for key, results in got.items():
        assert len(results) == 1
        for result in results:
            assert same(result, expected[key]), key
    # the process is left working: a plain module call is a plain module call
    torch.manual_seed(0)
    linear, x = nn.Linear(2, 2), torch.randn(3, 2)
    assert torch.equal(linear(x), x @ linear.weight.T + linear.bias)


def _plain_runs_during(tool: Callable[[], Any], seconds: float = 0.5) -> tuple[int, list[str]]:
    """Run ``tool`` repeatedly for ``seconds`` while another thread runs a plain model; that thread's errors."""
    plain, x = model(99), inputs(99)[0]
    want = plain(x)
    stop, errors, runs = threading.Event(), [], [0]

    def runner() -> None:
        while not stop.is_set():
            try:
                if not torch.allclose(plain(x), want, rtol=1e-5, atol=1e-6):
                    errors.append("wrong output")
            except Exception as e:
                errors.append(type(e).__name__)
            runs[0] += 1

    thread = threading.Thread(target=runner)
    thread.start()
    end = time.perf_counter() + seconds
    try:
        while time.perf_counter() < end:
            clear_capture_cache()
            tool()
    finally:
        stop.set()
        thread.join()
    return runs[0], errors


def test_a_plain_model_in_another_thread_runs_untraced_during_our_traces() -> None:
    x, g = inputs(1)
    traced = model(1)
    runs, errors = _plain_runs_during(lambda: us.track_scales(traced, x, g, route="fx"))
    assert runs > 0 and errors == []
    runs, errors = _plain_runs_during(lambda: us.partition(traced, 2, x))
    assert runs > 0 and errors == []


def test_eager_paths_are_this_threads_while_another_thread_runs_the_same_model() -> None:
    shared = model(3)
    x, g = inputs(3)
    expected = [(r.node, r.module_path) for r in us.track_scales(shared, x, g, route="eager")]
    stop = threading.Event()

    def runner() -> None:
        with torch.no_grad():
            while not stop.is_set():
                shared(x)

    thread = threading.Thread(target=runner)
    thread.start()
    try:
        reports = [us.track_scales(shared, x, g, route="eager") for _ in range(10)]
    finally:
        stop.set()
        thread.join()
    for report in reports:
        assert [(r.node, r.module_path) for r in report] == expected


def test_a_function_another_thread_applies_is_not_blamed_on_this_threads_capture() -> None:
    """The Function watcher records only the capturing thread's calls, as the model's own."""
    import threading

    from unitscale.fx.autograd_functions import functions_applied

    class Twice(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            return g * 2

    elsewhere: list[torch.Tensor] = []
    with functions_applied(torch.nn.Identity()) as calls:
        worker = threading.Thread(target=lambda: elsewhere.append(Twice.apply(torch.ones(1))))
        worker.start()
        worker.join()
        assert calls == []
        Twice.apply(torch.ones(1))
    assert [c.function for c in calls] == [Twice]
    assert torch.equal(elsewhere[0], torch.full((1,), 2.0))
