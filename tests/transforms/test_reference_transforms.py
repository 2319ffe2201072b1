"""The reference's transform tests (unit-scaling 0.3.5, ``tests/transforms/``), translated to this API.

Numbers, not logs: the reference checks its log lines; here the same facts are read from
the transformed graph and measured on its outputs and gradients.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.reference_models import InPlaceResiduals
from unitscale.transforms import simulate_fp8, unit_scale


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def custom_gelu(x: torch.Tensor) -> torch.Tensor:
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


class MLPLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(hidden)
        self.l1 = nn.Linear(hidden, 4 * hidden)
        self.l2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.l2(custom_gelu(self.l1(self.layer_norm(x))))
        x = F.dropout(x, 0.2)
        return x, x.sum()


class OutOfPlace(InPlaceResiduals):
    """What ``InPlaceResiduals`` computes: ``x += 1`` changes the tensor ``skip`` also names."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.l1(x + 1) + x
        x = x + 1
        return self.l2(x) + x


class Linear(nn.Module):
    def __init__(self, d_in: int, d_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(d_in, d_out)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.linear(t)


def calls(model, fn) -> list[torch.fx.Node]:
    return [n for n in model.graph_module.graph.nodes if n.op == "call_function" and n.target is fn]


@pytest.mark.parametrize("replace", [{custom_gelu: F.gelu}, None], ids=["replace", "folded"])
def test_unit_scaled_mlp_has_unit_outputs_and_gradients(replace):
    """The reference's ``test_unit_scale``: a written-out tanh GELU replaced (or, here, also folded)."""
    x = torch.randn(2**6, 2**10, requires_grad=True)
    model = unit_scale(nn.Sequential(MLPLayer(2**10)), replace=replace)
    out, loss = model(x)
    loss.backward()
    params = dict(model.named_parameters())
    grads = [params[f"module.0.{name}.weight"].grad for name in ("layer_norm", "l1", "l2")]
    for t in (out, x.grad, *grads):
        assert t.std().item() == pytest.approx(1, abs=0.2)
    assert len(calls(model, U.gelu)) == 1
    # No residual add: every op is after the last one, so none is constrained ("unconstraining node").
    assert all(n.kwargs.get("constraint", "missing") is None for n in calls(model, U.linear) + calls(model, U.gelu))


def test_residual_adds_are_found_with_tau_one_half():
    """The reference's ``test_unit_scale_residual_add``: two residual adds, tau 0.5 (its ratio 1)."""
    model = unit_scale(InPlaceResiduals(2**6))
    model(torch.randn(8, 2**6))
    adds = calls(model, U.residual_add)
    assert len(adds) == 2
    assert all(n.args[2] == 0.5 for n in adds)


class _Chain(nn.Module):
    """Three pre-norm residual adds, each one's skip the previous add: ``x + f_1 + f_2 + f_3``.

    Each branch normalises its input, as a batch-normalised block's output does not depend on its input's
    scale: the unit-scaled stream (the sum divided by ``(k + 1)**0.5``) gives the branch the same output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fs = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for f in self.fs:
            x = x + f(F.layer_norm(x, x.shape[-1:]))
        return x


def test_chained_residual_adds_keep_the_plain_sums_weights():
    """Deliberate difference (issue 39): the ``k``-th add of a chain gets tau ``1 / (k + 1)`` (the paper's running
    mean), where the reference's transform gives each add tau 0.5 and the latest branch the weight of the whole
    stream. So the output is the model's own sum, with its (re-initialised) weights, times ``4**-0.5``."""
    model = unit_scale(_Chain(16))
    x = torch.randn(8, 16)
    out = model(x)
    assert [n.args[2] for n in calls(model, U.residual_add)] == pytest.approx([1 / 2, 1 / 3, 1 / 4])
    expected = x
    for f in model.module.fs:
        normed = F.layer_norm(expected, (16,))
        expected = expected + F.linear(normed, f.weight / 16**0.5)  # unit-scaled linear: fan_in**-0.5
    torch.testing.assert_close(out, expected / 2, rtol=1e-4, atol=1e-4)


def test_unit_scaling_keeps_what_an_in_place_add_after_a_skip_computes():
    """``skip = x; x += 1`` changes the skip too: the residual split goes after the change (the translation found
    the split placed before it, so ``+ 1`` reached the branch alone; the outputs differed by 0.71)."""
    x = torch.randn(4, 8)
    in_place, out_of_place = InPlaceResiduals(8), OutOfPlace(8)
    out_of_place.load_state_dict(in_place.state_dict())
    torch.testing.assert_close(in_place(x.clone()), out_of_place(x))
    outputs = []
    for model in (in_place, out_of_place):
        torch.manual_seed(1)
        outputs.append(unit_scale(model)(x.clone()))
    torch.testing.assert_close(*outputs)


def test_unit_scale_over_simulate_fp8_unit_scales_first():
    """The reference's ``test_fp8_unit_scaling``: either order, unit scaling comes before quantisation (the
    translation found ``unit_scale`` over ``simulate_fp8`` keeping torch's initialisation, output std 0.026)."""
    x = torch.randn(2**8, 2**9)
    base = Linear(2**9, 2**10)
    outputs = []
    for model in (unit_scale(simulate_fp8(base)), simulate_fp8(unit_scale(base))):
        torch.manual_seed(1)
        outputs.append(model(x))
    assert outputs[0].std().item() == pytest.approx(1, abs=0.1)
    torch.testing.assert_close(*outputs)


@pytest.mark.parametrize("unit_scaled", [False, True])
def test_simulated_fp8_linear_changes_outputs_and_every_gradient(unit_scaled):
    """The reference's ``test_simulate_fp8_linear`` and ``_unit_scaled_linear``."""
    x = torch.randn(2**8, 2**9, requires_grad=True)
    model = Linear(2**9, 2**10)
    if unit_scaled:
        model.linear = nn.Linear(2**9, 2**10)
        model = unit_scale(model)
    out = model(x).sum()
    out.backward()
    x8 = x.detach().clone().requires_grad_()
    fp8 = simulate_fp8(model)
    out8 = fp8(x8).sum()
    out8.backward()
    assert out8.item() != out.item()
    assert not torch.equal(x8.grad, x.grad)
    weights = [p for name, p in fp8.named_parameters() if name.endswith("linear.weight")]
    assert len(weights) == 1 and weights[0].grad is not None


@pytest.mark.parametrize("attention", [F.scaled_dot_product_attention, U.scaled_dot_product_attention])
def test_simulated_fp8_attention_changes_outputs_and_gradients(attention):
    """The reference's ``test_simulate_fp8_attention`` and ``_unit_scaled_attention``."""

    class Attention(nn.Module):
        def forward(self, q, k, v):
            return attention(q, k, v).sum()

    inputs = [torch.randn(2**8, 2**8, requires_grad=True) for _ in range(3)]
    out = Attention()(*inputs)
    out.backward()
    inputs8 = [t.detach().clone().requires_grad_() for t in inputs]
    out8 = simulate_fp8(Attention())(*inputs8)
    out8.backward()
    assert out8.item() != out.item()
    assert all(not torch.equal(a.grad, b.grad) for a, b in zip(inputs, inputs8, strict=True))
