"""What a pipeline costs where it runs: each action's start and end, the message waits, the link.

Per-node timings taken while planning miss what the pipeline's own processes pay (autograd, the
schedule's bookkeeping, a gloo thread, other work on the same cores), so each worker times its
actions and message waits (:class:`ActionClock`) and the link (:func:`measure_link`);
:func:`measured_costs` turns the records into costs the simulator replays.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from unitscale.stages.planner.simulation import Timeline, TimelineBlock
from unitscale.stages.schedules import ChainCosts

__all__ = ["ActionClock", "RankRecord", "measure_link", "measured_costs", "measured_timeline"]

#: an action: (kind "F"/"B"/"I"/"W", stage, microbatch, start, end), perf_counter seconds
Action = tuple[str, int, int, float, float]


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_nbytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_nbytes(v) for v in value.values())
    return 0


@dataclass
class ActionClock:
    """Times one worker's pipeline actions and message waits (``time.perf_counter`` seconds).

    Attributes:
        actions: ``(kind, stage, microbatch, start, end)`` of every forward (``"F"``),
            backward (``"B"``), input gradient (``"I"``) and weight gradient (``"W"``).
        waits: ``(start, end)`` of every wait on sends or receives.
        output_bytes: stage index -> bytes of one microbatch's output (what it sends on).
    """

    actions: list[Action] = field(default_factory=list)
    waits: list[tuple[float, float]] = field(default_factory=list)
    output_bytes: dict[int, int] = field(default_factory=dict)

    def watch(self, stage: Any) -> None:
        """Wrap ``stage``'s forward and backward methods (a ``PipelineStage``) so each call is timed."""
        index = int(stage.stage_index)

        def timed(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
            def run(chunk: int, *args: Any, **kwargs: Any) -> Any:
                start = time.perf_counter()
                out = method(chunk, *args, **kwargs)
                end = time.perf_counter()
                # a backward that is not full is the zero-bubble schedules' input gradient
                done = "I" if kind == "B" and not kwargs.get("full_backward", True) else kind
                self.actions.append((done, index, chunk, start, end))
                if kind == "F":
                    self.output_bytes.setdefault(index, _nbytes(out))
                return out

            return run

        stage.forward_one_chunk = timed("F", stage.forward_one_chunk)
        stage.backward_one_chunk = timed("B", stage.backward_one_chunk)
        if getattr(stage, "backward_weight_one_chunk", None) is not None:
            stage.backward_weight_one_chunk = timed("W", stage.backward_weight_one_chunk)

    @contextlib.contextmanager
    def timing_waits(self) -> Iterator[None]:
        """While inside, every wait of torch's schedules on a message is recorded."""
        # lazy: torch.distributed.pipelining adds 4.6 s to `import unitscale` (python -X importtime)
        from torch.distributed.pipelining import schedules

        original = getattr(schedules, "_wait_batch_p2p", None)
        if original is None:  # another torch: no wait records, bookkeeping then includes the waits
            yield
            return

        def _wait_batch_p2p(work: Any) -> Any:
            start = time.perf_counter()
            try:
                return original(work)
            finally:
                self.waits.append((start, time.perf_counter()))

        schedules._wait_batch_p2p = _wait_batch_p2p
        try:
            yield
        finally:
            schedules._wait_batch_p2p = original


def measure_link(rank: int, world: int, nbytes: int = 1 << 20, repeats: int = 7) -> tuple[float, float]:
    """Latency (s) and bandwidth (B/s) between ranks 0 and 1 by ping-pong, in a joined gloo group.

    Every rank calls it; ranks other than 0 and 1 only wait. Half the shortest round trip, not
    the median: on busy cores a round trip also waits for the scheduler, which the pipeline's
    measured bookkeeping and durations already hold.
    """
    if world < 2:
        return 0.0, math.inf
    half_trips = []
    for size in (4, nbytes):
        buffer = torch.zeros(max(1, size // 4), dtype=torch.float32)
        trips = []
        for _ in range(repeats + 1):  # the first round trip sets up the pair
            if rank == 0:
                start = time.perf_counter()
                dist.send(buffer, 1)
                dist.recv(buffer, 1)
                trips.append(time.perf_counter() - start)
            elif rank == 1:
                dist.recv(buffer, 0)
                dist.send(buffer, 0)
        half_trips.append(min(trips[1:]) / 2 if trips else 0.0)
    pair = torch.tensor(half_trips if rank == 0 else [0.0, 0.0], dtype=torch.float64)
    dist.broadcast(pair, 0)
    latency, big = float(pair[0]), float(pair[1])
    return latency, (nbytes / (big - latency) if big > latency else math.inf)


@dataclass
class RankRecord:
    """One worker's measurements, as it sends them back (plain data: it is pickled).

    Attributes:
        actions: ``(kind, stage, microbatch, start, end)`` of the timed steps' actions.
        waits: ``(start, end)`` of the timed steps' message waits.
        steps: ``(start, end)`` of each timed step (start: leaving the barrier).
        output_bytes: stage -> bytes of one microbatch's output.
        latency: seconds per message (ping-pong), the same on every rank.
    """

    actions: list[Action]
    waits: list[tuple[float, float]]
    steps: list[tuple[float, float]]
    output_bytes: dict[int, int]
    latency: float = 0.0
    bandwidth: float = math.inf

    def units(self) -> int:
        """Forwards and backwards this rank ran (an ``"I"`` and its ``"W"`` count once, as a backward)."""
        return sum(1 for kind, *_ in self.actions if kind != "W")

    def bookkeeping(self) -> float:
        """Seconds per forward or backward this rank spent neither computing nor waiting on a message."""
        spent = sum(end - start for start, end in self.steps)
        computing = sum(end - start for *_, start, end in self.actions)
        waiting = sum(end - start for start, end in self.waits)
        return max(0.0, spent - computing - waiting) / max(1, self.units())


def _mean_by(actions: Sequence[Action], kind: str, stage: int) -> float:
    times = [end - start for k, s, _, start, end in actions if k == kind and s == stage]
    return math.fsum(times) / len(times) if times else 0.0


def measured_costs(records: Sequence[RankRecord], num_stages: int) -> ChainCosts:
    """Per-stage costs (one item per stage) from every rank's records: mean durations per stage and kind.

    A stage's backward is its mean ``"B"``, or ``"I"`` plus ``"W"`` (their ratio sets
    ``weight_grad_share``); ``action_overhead`` is the ranks' mean bookkeeping per action.

    >>> from unitscale.stages.runtime.measured import RankRecord, measured_costs
    >>> actions0 = [("F", 0, 0, 0.0, 1.0), ("B", 0, 0, 3.0, 5.0)]
    >>> actions1 = [("F", 1, 0, 1.0, 2.0), ("B", 1, 0, 2.0, 3.0)]
    >>> r0 = RankRecord(actions0, [(1.0, 3.0)], [(0.0, 5.0)], {0: 8})
    >>> r1 = RankRecord(actions1, [], [(0.0, 5.0)], {1: 8})
    >>> c = measured_costs([r0, r1], 2)
    >>> c.forward, c.backward, c.boundary_bytes, c.action_overhead
    ((1.0, 1.0), (2.0, 1.0), (0.0, 8.0, 0.0), 0.75)
    """
    actions = [a for r in records for a in r.actions]
    forward, full, inputs, weights = ([_mean_by(actions, kind, s) for s in range(num_stages)] for kind in "FBIW")
    backward = [b if b > 0 else i + w for b, i, w in zip(full, inputs, weights, strict=True)]
    split = sum(inputs) + sum(weights)
    share = sum(weights) / split if split > 0 else 0.5
    sent: dict[int, int] = {}
    for r in records:
        sent.update(r.output_bytes)
    counted = sum(r.units() for r in records)
    overhead = sum(r.bookkeeping() * r.units() for r in records) / max(1, counted)
    first = records[0] if records else RankRecord([], [], [], {})
    return ChainCosts(
        forward=tuple(forward),
        backward=tuple(backward),
        param_bytes=(0.0,) * num_stages,
        activation_bytes=(0.0,) * num_stages,
        boundary_bytes=(0.0, *(float(sent.get(s, 0)) for s in range(num_stages - 1)), 0.0),
        bandwidth=first.bandwidth,
        latency=first.latency,
        weight_grad_share=share,
        action_overhead=overhead,
    )


def measured_timeline(
    records: Sequence[RankRecord], step: int, schedule: str, num_microbatches: int, stage_ranks: Sequence[int]
) -> Timeline:
    """Timed step ``step`` as a :class:`~unitscale.stages.planner.Timeline`: times from the earliest rank's start.

    Workers on one machine share ``perf_counter``'s clock (``CLOCK_MONOTONIC``), so their
    times line up. Memory is not measured (``nan``).
    """
    origin = min(r.steps[step][0] for r in records)
    blocks = []
    for rank, r in enumerate(records):
        begin, end = r.steps[step]
        for kind, stage, microbatch, start, stop in r.actions:
            if begin <= start and stop <= end:
                blocks.append(TimelineBlock(rank, stage, kind, microbatch, start - origin, stop - origin))
    blocks.sort(key=lambda b: (b.rank, b.start))
    return Timeline(
        schedule=schedule,
        ranks=len(records),
        num_microbatches=num_microbatches,
        blocks=blocks,
        step_time=max(r.steps[step][1] for r in records) - origin,
        stage_memory=[math.nan] * len(stage_ranks),
        rank_memory=[math.nan] * len(records),
        stage_ranks=list(stage_ranks),
    )
