"""Scale tracking never hides a NaN or an infinity, and never changes the model it observes."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import matplotlib
import pytest
import torch
from torch import fx, nn

from unitscale import analyse_module, inline, track_scales
from unitscale.capture import trace_exec_order
from unitscale.fx import DeepTracer
from unitscale.tracking.report import ScaleReport, ScaleRow

matplotlib.use("Agg")


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Overflow(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = self.fc(x) * 1e30
        return (big * big).tanh()  # inf, then NaN gradients


def test_a_nan_input_is_marked_and_named_in_table_plot_and_code() -> None:
    torch.manual_seed(0)
    x = torch.randn(8, 4)
    x[0, 0] = float("nan")
    report = track_scales(Net(), x)
    first = report.first_nonfinite
    assert first is not None and first.node == "x" and first.nonfinite == "fwd"
    lines = report.table().splitlines()
    assert lines[0].split()[-1] == "finite"
    assert lines[1].split()[-2:] == ["NO", "(fwd)"]
    assert any(line.split()[-1] == "yes" for line in lines[1:-1])  # the weights' forward values are fine
    assert lines[-1].startswith("NON-FINITE: NaN/inf first in the forward value of node 'x' (input)")
    assert "NON-FINITE from node 'x' (forward)" in report.plot().axes[0].get_title()
    assert repr(report).endswith("fx capture, NON-FINITE from 'x'>")
    code = analyse_module(Net(), x)
    assert code.splitlines()[0].startswith("def forward(self, x):  # x (-> nan, <- ") and code.splitlines()[0].endswith(
        ") NON-FINITE"
    )
    assert all("NON-FINITE" in line for line in code.splitlines() if "linear" in line and "#" in line)


def test_a_nan_in_the_given_gradient_is_marked_where_backward_starts() -> None:
    torch.manual_seed(0)
    grad = torch.randn(8, 4)
    grad[1, 1] = float("inf")
    report = track_scales(Net(), torch.randn(8, 4), grad)
    first = report.first_nonfinite
    assert first is not None and first.node == "linear_1" and first.nonfinite == "bwd"
    assert all("fwd" not in r.nonfinite for r in report)
    assert "gradient of node 'linear_1'" in report.table().splitlines()[-1]
    assert "NON-FINITE from node 'linear_1' (backward)" in report.plot().axes[0].get_title()


def test_overflow_inside_the_model_is_marked_at_the_op_that_overflowed() -> None:
    torch.manual_seed(0)
    report = track_scales(Overflow(), torch.randn(8, 4))
    first = report.first_nonfinite
    assert first is not None and first.node == "mul_1" and "fwd" in first.nonfinite  # 1e60 overflows float32
    assert report["mul"].finite  # 1e30 does not
    assert "NON-FINITE" in analyse_module(Overflow(), torch.randn(8, 4))


def test_a_finite_report_has_no_marker_column() -> None:
    report = track_scales(Net(), torch.randn(8, 4))
    assert report.first_nonfinite is None
    assert "finite" not in report.table().splitlines()[0]
    assert "NON-FINITE" not in report.table() and "NON-FINITE" not in report.code


def test_a_report_row_names_which_direction_is_not_finite() -> None:
    nan, inf = float("nan"), float("inf")
    rows = [
        ScaleRow("a", "", "input", (2,), "float32", 1.0, 1.0, 1.0),
        ScaleRow("b", "", "mul", (2,), "float32", 1.0, nan, 1.0),
        ScaleRow("c", "", "mul", (2,), "float32", 1.0, 1.0, inf),
        ScaleRow("d", "", "mul", (2,), "float32", None, None, None),
    ]
    assert [r.nonfinite for r in rows] == ["", "bwd", "fwd", ""]
    assert ScaleReport(rows, "Net").first_nonfinite == rows[2]  # forward values come first


class SelfModifying(nn.Module):
    """Updates a registered buffer and stores an activation on itself in forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        y = self.norm(self.fc(x))
        self.last = y
        return y


ENTRY_POINTS: dict[str, Callable[[nn.Module, torch.Tensor], Any]] = {
    "track_scales": lambda m, x: track_scales(m, x),
    "track_scales-eager": lambda m, x: track_scales(m, x, route="eager"),
    "analyse_module": lambda m, x: analyse_module(m, x),
    "trace_exec_order": lambda m, x: trace_exec_order(m),
    "inline": lambda m, x: inline(m),
    "DeepTracer.trace": lambda m, x: DeepTracer().trace(m),
}


@pytest.mark.parametrize("call", list(ENTRY_POINTS.values()), ids=list(ENTRY_POINTS))
def test_entry_points_leave_a_self_modifying_model_as_it_was(call: Callable[[nn.Module, torch.Tensor], Any]) -> None:
    torch.manual_seed(0)
    model = SelfModifying().train()
    model.steps.fill_(5)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    buffer_ids = {k: id(v) for k, v in model.named_buffers()}
    call(model, torch.randn(8, 4))
    after = model.state_dict()
    assert after.keys() == before.keys()
    for k, v in before.items():
        assert type(after[k]) is torch.Tensor and torch.equal(after[k], v), k  # bitwise, not a proxy
    assert {k: id(v) for k, v in model.named_buffers()} == buffer_ids
    assert all(not isinstance(v, fx.Proxy) for m in model.modules() for v in vars(m).values())
    assert not hasattr(model, "last") and model.training
    torch.save(model.state_dict(), io.BytesIO())
