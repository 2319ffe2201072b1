"""The walk of ``track_scales``: which library files a call enters, and how often it comes back to one.

A newcomer following ``track_scales(model, x)`` reads the files it enters in order. Each
return to a file already left is one more jump back. The walk here is the sequence of
library files in which each library function is first called (so a loop over nodes counts
once), with consecutive calls in the same file collapsed into one stay.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import unitscale
from unitscale.tracking import track_scales

ROOT = Path(unitscale.__file__).parent

# A ratchet: lower it when a change removes a return; never raise it (it was 25 while
# ScalePair lived in stats.py and a Sequential ran under the interpreter; 4 while stats.py was
# entered for the scratch space before the capture, for the gradient hooks after backward.py
# and again for the read, and recording.py again to remove the hooks and make the rows). Now
# each file is entered once, in the pass's order: the capture's files, then compiled.py runs
# the graph, recording.py records each tensor with one function, forward and backward (its
# gradient hook), stats.py measures, backward.py runs the backward pass (whose hooks call only
# what forward called), the caller removes the hooks, and report.py reads the rows and writes
# the report.
REVISITS = 0


def walk(fn: Any, *args: Any) -> list[str]:
    """The library files ``fn(*args)`` enters, one entry per stay (see the module's docstring)."""
    first_calls: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(str(ROOT)):
            key = (frame.f_code.co_filename, frame.f_code.co_name)
            if key not in seen:
                seen.add(key)
                first_calls.append(key)

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        fn(*args)
    finally:
        sys.settrace(previous)
    stays: list[str] = []
    for filename, _ in first_calls:
        name = Path(filename).relative_to(ROOT).as_posix()
        if not stays or stays[-1] != name:
            stays.append(name)
    return stays


def _revisits(stays: list[str]) -> int:
    return len(stays) - len(set(stays))


def test_walk_counts_a_return_to_a_file_already_left() -> None:
    assert _revisits(["a.py", "b.py", "a.py", "c.py", "b.py"]) == 2  # the hand-counted case


def test_the_walk_of_track_scales_comes_back_to_files_as_often_as_the_ratchet_says() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    track_scales(model, x)  # the capture is cached: the walk is that of every later call
    stays = walk(track_scales, model, x)
    assert stays[0] == "tracking/analysis.py" and "tracking/recording.py" in stays
    # fewer: lower REVISITS to the new count, so that the walk never grows back
    assert _revisits(stays) == REVISITS, " -> ".join(stays)


def test_one_function_records_every_forward_and_gradient_std_and_the_hooks_go() -> None:
    from unitscale.tracking.recording import ScaleRecording

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4).requires_grad_()
    calls: list[tuple[str, float | None]] = []
    measure = ScaleRecording.measure

    def spy(self: ScaleRecording, record: Any, slot: str, t: torch.Tensor) -> None:
        measure(self, record, slot, t)
        calls.append((slot, getattr(record, slot)))

    ScaleRecording.measure = spy  # type: ignore[method-assign]
    try:
        report = track_scales(model, x, torch.ones(3, 2))
    finally:
        ScaleRecording.measure = measure  # type: ignore[method-assign]
    for p in model.parameters():
        assert not p._backward_hooks and p.grad is None  # the caller removed every hook; no .grad touched
    # the oracle: torch's own stds of each tensor's gradient, from the model's own backward
    x1 = x.detach().clone().requires_grad_()
    h = model[0](x1)
    r = model[1](h)
    h.retain_grad()
    r.retain_grad()
    model[2](r).backward(torch.ones(3, 2))
    activations = [row for row in report if row.op != "parameter"]
    expected = [x1.grad, h.grad, r.grad, torch.ones(3, 2)]
    for row, grad in zip(activations, expected, strict=True):
        assert row.backward == pytest.approx(grad.std(correction=0).item(), rel=1e-5, abs=1e-7)  # type: ignore[union-attr]
    backward_rows = [row.backward for row in report if row.backward is not None]
    assert sorted(v for s, v in calls if s == "backward") == pytest.approx(sorted(backward_rows))  # type: ignore[type-var]
    assert [v for s, v in calls if s == "forward"] == pytest.approx([row.forward for row in report])
