"""Ctrl-C anywhere in a tool leaves no hook, patch or mode behind.

A ``KeyboardInterrupt`` is raised at the Nth "tick" of a run, for N = 1, 2, ... until a
call gets through: a tick is a call of a module's forward, of a forward hook, of a
module's backward hook or of a gradient hook on a tensor the forward made. After each
call the model's hooks (modules' and parameters'), torch's global module hooks, the
class and functions torch.fx patches, and the mode stacks must be exactly as before it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch._dynamo  # imported up front: its import wraps torch.manual_seed, once and for good
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as torch_module

import unitscale as us
import unitscale.functional as U
from unitscale.capture import clear_capture_cache, trace_exec_order


class Ticks:
    """Counts ticks; the ``at``-th raises KeyboardInterrupt."""

    def __init__(self) -> None:
        self.count, self.at, self.fired = 0, 0, False

    def __deepcopy__(self, memo: dict[int, Any]) -> Ticks:  # a tool's copy of the model ticks here too
        return self

    def __call__(self, *_: Any) -> None:
        self.count += 1
        if self.count == self.at:
            self.fired = True
            raise KeyboardInterrupt


TICKS = Ticks()


class Ticking(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        TICKS()
        y = F.gelu(self.fc(x))
        if isinstance(y, torch.Tensor) and y.requires_grad:  # not while fx traces (a Proxy)
            y.register_hook(TICKS)
        return y


def model(module_hooks: bool = True) -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), Ticking(), nn.ReLU(), Ticking(), nn.Linear(8, 4))
    if module_hooks:
        net[0].register_forward_hook(TICKS)
        net[2].register_full_backward_hook(TICKS)
    return net


#: tools that refuse a model with module hooks, since they would drop them (tests/capture/test_faithful.py
#: pins the refusal): here their model ticks from its own forward and a tensor hook only
REFUSE_MODULE_HOOKS = {"track_scales export", "inline", "track_scales GraphModule"}


def _ids(d: Any) -> dict[Any, int]:
    return {k: id(v) for k, v in dict(d).items()}


def snapshot(net: nn.Module) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, m in net.named_modules():
        for attr in sorted(vars(m)):
            if attr.endswith("hooks") or attr.endswith("hooks_with_kwargs") or attr == "_is_full_backward_hook":
                value = vars(m)[attr]
                state[f"{name}.{attr}"] = _ids(value) if isinstance(value, dict) else value
        # attributes other than the capture cache's entries (which a finished capture may leave)
        state[f"{name}.__dict__"] = sorted(k for k in vars(m) if k != "_unitscale_captures")
    for name, p in net.named_parameters():
        state[f"{name}._backward_hooks"] = _ids(p._backward_hooks or {})
        state[f"{name}._post_accumulate_grad_hooks"] = _ids(getattr(p, "_post_accumulate_grad_hooks", None) or {})
        state[f"{name}.grad"] = p.grad
    for attr in sorted(vars(torch_module)):
        if attr.startswith("_global_") and isinstance(getattr(torch_module, attr), dict):
            state[f"torch.nn.modules.module.{attr}"] = _ids(getattr(torch_module, attr))
    for cls in (nn.Module, torch.Tensor, nn.Linear, nn.Sequential):
        state[f"{cls.__name__}.__dict__"] = _ids(vars(cls))
    for space in (math, F, torch, U, torch._C._nn):
        # (a first export imports more of torch: names added are not patches)
        state[f"{space.__name__} functions"] = {k: id(v) for k, v in vars(space).items() if callable(v)}
    state["torch function modes"] = torch._C._len_torch_function_stack()
    state["dispatch modes"] = torch._C._len_torch_dispatch_stack()
    state["grad enabled"] = torch.is_grad_enabled()
    state["fx patcher"] = torch.fx._symbolic_trace.CURRENT_PATCHER
    return state


def _diff(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: (a.get(k), b.get(k)) for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    return a, b


X = torch.randn(5, 8)

TOOLS: dict[str, Callable[[nn.Module], Any]] = {
    "track_scales fx": lambda m: us.track_scales(m, X, route="fx"),
    "track_scales eager": lambda m: us.track_scales(m, X, route="eager"),
    "track_scales export": lambda m: us.track_scales(m, X, route="export"),
    "track_scales auto": lambda m: us.track_scales(m, X.clone().requires_grad_()),
    "analyse_module": lambda m: us.tracking.analyse_module(m, X),
    "partition": lambda m: us.partition(m, 2, X, cost="flops"),
    "unit_scale": lambda m: us.unit_scale(m, example_inputs=(X,))(X),
    "inline": lambda m: us.inline(m, example_inputs=(X,)),
    "trace_exec_order": lambda m: trace_exec_order(m, example_inputs=X),
}


@pytest.mark.parametrize("tool", list(TOOLS))
def test_an_interrupt_anywhere_leaves_everything_as_it_was(tool: str) -> None:
    run = TOOLS[tool]
    interrupted = 0
    for at in range(1, 60):
        net = model(module_hooks=tool not in REFUSE_MODULE_HOOKS)
        clear_capture_cache()
        before = snapshot(net)
        TICKS.count, TICKS.at, TICKS.fired = 0, at, False
        try:
            run(net)
        except KeyboardInterrupt:
            interrupted += 1
        except Exception as e:  # an interrupt must not turn into another error
            raise AssertionError(f"{tool}: tick {at} raised {type(e).__name__}: {e}") from e
        finally:
            TICKS.at = 0
        after = snapshot(net)
        for key, functions in after.items():
            if key.endswith(" functions"):
                after[key] = {k: v for k, v in functions.items() if k in before[key]}
        changed = {
            k: _diff(before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)
        }
        assert not changed, f"{tool}: interrupted at tick {at}, changed: {changed}"
        if not TICKS.fired:  # the call got through: every tick before it was tried
            break
    else:
        pytest.fail(f"{tool} still ticking after 60 ticks")
    assert interrupted >= 2, f"{tool}: only {interrupted} interruptions"
    # the process still runs plain modules
    linear = nn.Linear(2, 2)
    assert torch.equal(linear(torch.ones(1, 2)), torch.ones(1, 2) @ linear.weight.T + linear.bias)


SHIMS = {"_recording_set_grad", "_recording_apply"}


class AtCall:
    """A trace function raising KeyboardInterrupt as the Nth call of a unitscale function starts (Ctrl-C there)."""

    def __init__(self, at: int) -> None:
        self.count, self.at = 0, at

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        # not in a generator: its "call" may be its close, where an exception is only printed; not
        # the Function watcher's shims of torch's own calls (Function.apply, the grad-mode switch):
        # a Ctrl-C there lands inside torch's no_grad() exit, which torch itself does not guard
        if (
            event == "call"
            and "/unitscale/" in frame.f_code.co_filename
            and not frame.f_code.co_flags & 0x2A0
            and frame.f_code.co_name not in SHIMS
        ):
            self.count += 1
            if self.count == self.at:
                raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("tool", "points"),
    [
        ("track_scales fx", 15),
        ("track_scales eager", 15),
        ("track_scales GraphModule", 15),
        ("partition", 12),
        ("unit_scale", 12),
        ("inline", 12),
        ("trace_exec_order", 8),
    ],
)
def test_ctrl_c_inside_the_library_leaves_everything_as_it_was(tool: str, points: int) -> None:
    run = TOOLS.get(tool) or (lambda m: us.track_scales(us.inline(m), X))
    TICKS.at = 0
    counter = AtCall(0)
    clear_capture_cache()
    sys.settrace(counter)
    try:
        run(model(module_hooks=tool not in REFUSE_MODULE_HOOKS))
    finally:
        sys.settrace(None)
    calls = counter.count
    for at in range(1, calls, max(1, calls // points)):  # points spread over the whole call
        net = model(module_hooks=tool not in REFUSE_MODULE_HOOKS)
        clear_capture_cache()
        before = snapshot(net)
        sys.settrace(AtCall(at))
        try:
            run(net)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        after = snapshot(net)
        torch.set_grad_enabled(True)  # whatever the check below finds, the next test starts clean
        for key, functions in after.items():
            if key.endswith(" functions"):
                after[key] = {k: v for k, v in functions.items() if k in before[key]}
        changed = {
            k: _diff(before.get(k), after.get(k)) for k in before.keys() | after.keys() if before.get(k) != after.get(k)
        }
        assert not changed, f"{tool}: Ctrl-C at unitscale call {at} of {calls}, changed: {changed}"
