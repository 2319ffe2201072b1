"""Views and copies reuse their input's forward statistics: the shortcut must not change a number."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from unitscale import track_scales
from unitscale.tracking import stats
from unitscale.tracking.recording import ScaleRecording


class ViewsAndCopies(nn.Module):
    """One tensor read through views, copies and an eval-mode dropout, then changed in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        a = h.view(-1, 2).transpose(0, 1)
        b = h.t().contiguous()
        c = self.drop(h)
        d = h.to(h.dtype)
        torch.relu_(h)
        e = h.reshape(-1)  # after the in-place relu: its own numbers, not the linear's
        return a.sum() + b.pow(2).sum() + c.sum() * e.sum() + d.mean()


def _without_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    def track_same_values(
        self: ScaleRecording, t: torch.Tensor, source: object, node: str, path: str, op: str, hook: bool = True
    ) -> stats.ScaleRecord:
        return self.track(t, node, path, op, hook=hook)

    monkeypatch.setattr(ScaleRecording, "track_same_values", track_same_values)


def _count_stds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    std_stat = stats.std_stat

    def counted(t: torch.Tensor) -> stats.Stat | None:
        calls[0] += 1
        return std_stat(t)

    monkeypatch.setattr(stats, "std_stat", counted)
    return calls


@pytest.mark.parametrize("route", ["fx", "eager"])
def test_views_and_copies_report_the_numbers_computed_afresh(monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    torch.manual_seed(0)
    model, x = ViewsAndCopies().eval(), torch.randn(4, 8)
    with monkeypatch.context() as m:
        calls = _count_stds(m)
        shared = list(track_scales(model, x, route=route))
        shared_calls = calls[0]
    with monkeypatch.context() as m:
        _without_shortcut(m)
        calls = _count_stds(m)
        fresh = list(track_scales(model, x, route=route))
        fresh_calls = calls[0]
    assert [r.node for r in shared] == [r.node for r in fresh]
    for got, want in zip(shared, fresh, strict=True):
        for a, b in ((got.forward, want.forward), (got.backward, want.backward), (got.abs_max, want.abs_max)):
            assert (a is None) == (b is None), (got, want)
            if a is not None and b is not None:
                assert math.isclose(a, b, rel_tol=1e-6), (got, want)
    assert shared_calls < fresh_calls  # the shortcut was taken
    with torch.no_grad():
        h = model.fc(x)
    by_op = {r.op.removeprefix("Tensor."): r for r in shared}
    assert math.isclose(by_op["reshape"].forward, torch.relu(h).std(correction=0).item(), rel_tol=1e-5)
    assert math.isclose(by_op["transpose"].forward, h.std(correction=0).item(), rel_tol=1e-5)
    assert math.isclose(by_op["contiguous"].forward, h.std(correction=0).item(), rel_tol=1e-5)


def test_a_change_through_another_view_is_seen() -> None:
    class Setitem(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2
            y.view(-1)[0] = 100.0  # not an op that returns a float tensor: no row, but a new version
            return y.reshape(-1) * 1.0

    x = torch.randn(3, 4)
    report = track_scales(Setitem(), x, route="eager")
    expected = (x * 2).flatten()
    expected[0] = 100.0
    assert math.isclose(report["reshape"].forward, expected.std(correction=0).item(), rel_tol=1e-5)
    assert not math.isclose(report["reshape"].forward, report["mul"].forward, rel_tol=1e-3)


def test_a_cast_that_changes_the_dtype_is_computed_afresh() -> None:
    class Cast(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x * 1.0).to(torch.bfloat16).float()

    x = torch.tensor([1.0, 1.00390625 / 2, 3.0]) + 1e-3
    report = track_scales(Cast(), x, route="eager")
    assert report["to"].forward == pytest.approx(x.to(torch.bfloat16).float().std(correction=0).item(), rel=1e-6)
    assert report["to"].forward != report["mul"].forward


class ViewChain(nn.Module):
    """A linear output read only through a chain of views: one gradient std serves the chain."""

    def __init__(self, also_return_source: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.also_return_source = also_return_source

    def forward(self, x: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        h = self.fc(x)
        y = h.view(4, 2, 4).transpose(1, 2).reshape(4, 8) * torch.arange(8.0)
        return (y, h) if self.also_return_source else y


@pytest.mark.parametrize("also_return_source", [False, True])
def test_a_source_read_only_by_its_view_takes_the_views_gradient_std(
    monkeypatch: pytest.MonkeyPatch, also_return_source: bool
) -> None:
    torch.manual_seed(0)
    model, x = ViewChain(also_return_source), torch.randn(4, 8)
    grads = (torch.randn(4, 8), torch.randn(4, 8)) if also_return_source else torch.randn(4, 8)
    with monkeypatch.context() as m:
        calls = _count_stds(m)
        shared = track_scales(model, x, grads, route="eager")
        shared_calls = calls[0]
    with monkeypatch.context() as m:
        _without_shortcut(m)
        calls = _count_stds(m)
        fresh = track_scales(model, x, grads, route="eager")
        fresh_calls = calls[0]
    for got, want in zip(shared, fresh, strict=True):
        assert (got.backward is None) == (want.backward is None) == (got.op in ("arange", "input")), (got, want)
        if got.backward is not None and want.backward is not None:
            assert math.isclose(got.backward, want.backward, rel_tol=1e-6), (got, want)
    h = x @ model.fc.weight.T + model.fc.bias
    y_grad = grads[0] if isinstance(grads, tuple) else grads
    h_grad = (y_grad * torch.arange(8.0)).reshape(4, 4, 2).transpose(1, 2).reshape(4, 8)
    if isinstance(grads, tuple):
        h_grad = h_grad + grads[1]  # h is also an output: two gradients meet in it
    assert math.isclose(shared["linear"].backward, h_grad.std(correction=0).item(), rel_tol=1e-5)
    assert h.shape == h_grad.shape
    # the view, the transpose and the reshape: three forward stds saved; two gradient stds on
    # top (h and the view, each read by one view only), one where h is also an output. The
    # transpose keeps its own: the reshape of a transposed tensor copies it in two autograd
    # steps (a clone, then a view), and only a single step is taken as the same gradient.
    assert fresh_calls - shared_calls == (4 if also_return_source else 5)


class Residual(nn.Module):
    """``x + fc(x)``: autograd hands the add's gradient itself to the linear's output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x + self.fc(x))


@pytest.mark.parametrize("route", ["fx", "eager"])
def test_one_gradient_tensor_reaching_two_rows_is_measured_once(monkeypatch: pytest.MonkeyPatch, route: str) -> None:
    torch.manual_seed(0)
    model, x, grad = Residual(), torch.randn(4, 8, requires_grad=True), torch.randn(4, 8)
    with monkeypatch.context() as m:
        calls = _count_stds(m)
        report = track_scales(model, x, grad, route=route)
    # the add's gradient, and the same tensor again as the linear output's
    leaf = x.detach().requires_grad_()
    h = model.fc(leaf)
    h.retain_grad()
    s = leaf + h
    s.retain_grad()
    torch.tanh(s).backward(grad)
    assert report["linear"].backward == pytest.approx(h.grad.std(correction=0).item(), rel=1e-6)
    want = s.grad.std(correction=0).item()
    assert report["add"].backward == report["linear"].backward == pytest.approx(want, rel=1e-6)
    assert report["x"].backward == pytest.approx(leaf.grad.std(correction=0).item(), rel=1e-6)
    measured = sum(row.backward is not None for row in report) + sum(row.forward is not None for row in report)
    assert calls[0] == measured - 1  # every std but one: the shared gradient's
