"""Static scales: factors measured once and frozen with the model, one scaling whatever the call signature, losses.

Oracles: torch's own losses and their gradients, finite differences in float64
(``tests/gradient_oracle.py``), and the same model captured another way (target as a buffer).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.gradient_oracle import true_gradient_cosines
from unitscale.errors import InputError
from unitscale.examples import MLP, ResNet
from unitscale.transforms import unit_scale


def _resnet() -> nn.Module:
    torch.manual_seed(0)
    return ResNet((1, 1, 1, 1), num_classes=10, width=4).double()


class TargetAsArgument(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = _resnet()

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.body(x), target)


class TargetAsBuffer(nn.Module):
    def __init__(self, target: torch.Tensor) -> None:
        super().__init__()
        self.body = _resnet()
        self.register_buffer("target", target)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.body(x), self.target)


def _scaling(graph: torch.fx.Graph) -> list[tuple[str, object]]:
    """Each op's function and constraint up to the loss: what the pass decided."""
    ops = []
    for node in graph.nodes:
        if node.target is U.mse_loss:
            break
        if node.op == "call_function":
            ops.append((getattr(node.target, "__name__", str(node.target)), node.kwargs.get("constraint", "-")))
    return ops


def test_a_target_passed_to_forward_held_as_a_buffer_or_outside_the_model_gets_one_scaling() -> None:
    """A target read only by the loss jumps over every op but shares no input with them: the trunk stays.

    Before: the target as an argument kept every trunk op constrained (input-gradient std 0.55
    against 1.01 with the target as a buffer).
    """
    x = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    target = torch.randn(8, 10, dtype=torch.float64)
    grads, graphs = [], []
    for model, args in ((TargetAsBuffer(target), (x,)), (TargetAsArgument(), (x, target))):
        torch.manual_seed(0)  # the re-initialisation draws the same weights
        scaled = unit_scale(model)
        xi = x.clone().requires_grad_()
        scaled(xi, *args[1:]).backward()
        grads.append(xi.grad)
        graphs.append(scaled.graph_module.graph)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-9, atol=0)
    assert 0.5 < grads[0].std().item() < 2
    outside = unit_scale(_resnet())
    outside(x)
    assert _scaling(graphs[1]) == _scaling(graphs[0]) == _scaling(outside.graph_module.graph)


def test_frozen_factors_are_saved_with_the_model_and_stay_constant_while_training() -> None:
    x = torch.randn(8, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (8,))
    torch.manual_seed(0)
    scaled = unit_scale(_resnet())
    scaled(x)
    saved = {k: v.clone() for k, v in scaled.state_dict().items() if k.startswith("grad_scales.")}
    assert saved and all(v.item() > 0 for v in saved.values())
    optimiser = torch.optim.SGD(scaled.parameters(), lr=0.01)
    for _ in range(3):
        optimiser.zero_grad()
        F.cross_entropy(scaled(x), y).backward()
        optimiser.step()
    assert all(torch.equal(scaled.state_dict()[k], v) for k, v in saved.items())
    # a fresh unit_scale of the model loads them before its first call, and measures nothing
    fresh = unit_scale(_resnet())
    fresh.load_state_dict(scaled.state_dict())
    fresh(x)
    for key, value in saved.items():
        assert fresh.state_dict()[key].item() == value.item()
    copied = copy.deepcopy(scaled)
    for model in (scaled, fresh, copied):
        model.zero_grad()
        F.cross_entropy(model(x), y).backward()
    for (name, a), b, c in zip(scaled.named_parameters(), fresh.parameters(), copied.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-9, atol=0, msg=name)
        torch.testing.assert_close(a.grad, c.grad, rtol=1e-9, atol=0, msg=name)


def test_no_batch_dependent_scale_is_left_in_a_unit_scaled_resnet() -> None:
    scaled = unit_scale(_resnet())
    scaled(torch.randn(8, 3, 32, 32, dtype=torch.float64))
    graph = scaled.graph_module.graph
    assert not any(n.kwargs.get("constraint", "-") is None for n in graph.nodes if n.target is U.batch_norm)
    assert sum(n.target is U.frozen_grad_scale for n in graph.nodes) == len(scaled.grad_scales.state_dict())


def test_each_unit_scaled_loss_states_its_gradient_factor() -> None:
    """``loss.grad_scale`` is the factor between the loss's gradient and torch's (a hand formula for MSE)."""
    torch.manual_seed(0)
    logits = torch.randn(64, 10, dtype=torch.float64, requires_grad=True)
    y, t = torch.randint(0, 10, (64,)), torch.randn(64, 10, dtype=torch.float64)
    for ours, theirs in ((U.cross_entropy(logits, y), F.cross_entropy(logits, y)), (U.mse_loss(logits, t), None)):
        (got,) = torch.autograd.grad(ours, logits)
        (true,) = torch.autograd.grad(theirs if theirs is not None else F.mse_loss(logits, t), logits)
        torch.testing.assert_close(got, ours.grad_scale * true)
    assert U.mse_loss(logits, t).grad_scale == pytest.approx(640 / 8**0.5)


def test_two_unit_scaled_losses_given_one_factor_add_up_to_the_true_gradient() -> None:
    """Before: each loss's own factor (25.4 and 28.3 here) made the sum's gradient cosine 0.9990 with torch's."""
    torch.manual_seed(0)
    logits = torch.randn(64, 10, dtype=torch.float64, requires_grad=True)
    y, t = torch.randint(0, 10, (64,)), torch.randn(64, 10, dtype=torch.float64)
    ce = U.cross_entropy(logits, y)
    mse = U.mse_loss(logits, t, grad_scale=ce.grad_scale)
    (got,) = torch.autograd.grad(ce + mse, logits)
    (true,) = torch.autograd.grad(F.cross_entropy(logits, y) + F.mse_loss(logits, t), logits)
    torch.testing.assert_close(got, ce.grad_scale * true)


class TwoLosses(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(16, hidden=32)
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = self.head(self.mlp(x))
        return F.cross_entropy(out, y) + F.mse_loss(out, t)


def test_unit_scale_gives_a_models_losses_one_factor_and_true_gradients() -> None:
    torch.manual_seed(0)
    model = TwoLosses().double()
    x, y, t = torch.randn(64, 16, dtype=torch.float64), torch.randint(0, 10, (64,)), torch.randn(64, 10).double()
    scaled = unit_scale(model)
    scaled(x, y, t)
    assert len(scaled.loss_scales) == 2
    factors = {line.split("gradient factor ")[1].split(" ")[0] for line in scaled.loss_scales}
    assert len(factors) == 1 and all("its own" in line for line in scaled.loss_scales)
    cosines = true_gradient_cosines(lambda: scaled(x, y, t), dict(scaled.named_parameters()))
    assert min(cosines.values()) > 0.99999, cosines


def test_a_grad_scale_that_is_not_a_positive_number_is_refused() -> None:
    with pytest.raises(InputError, match=r"mse_loss: grad_scale=-1\.0"):
        U.mse_loss(torch.ones(2), torch.ones(2), grad_scale=-1.0)
    with pytest.raises(InputError, match=r"cross_entropy: grad_scale=True"):
        U.cross_entropy(torch.ones(2, 3), torch.zeros(2, dtype=torch.long), grad_scale=True)


def test_a_nested_wrapper_saves_the_frozen_factors_too() -> None:
    from unitscale.transforms import simulate_fp8

    scaled = unit_scale(_resnet())
    scaled(torch.randn(8, 3, 32, 32, dtype=torch.float64))
    keys = {k for k in scaled.state_dict() if k.startswith("grad_scales.")}
    assert keys and keys <= set(simulate_fp8(scaled).state_dict())


@pytest.mark.parametrize("route", ["auto", "export"])
def test_a_cumulative_average_batch_norm_is_refused_by_name(route: str) -> None:
    """``momentum=None`` (torch divides by the count of batches seen): before, TorchDynamo's capture failed and
    blamed data-dependent control flow; now a typed refusal names the module and the fix, and eval mode works."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8, momentum=None), nn.ReLU())
    x = torch.randn(4, 3, 8, 8)
    with pytest.raises(InputError, match=r"unit_scale: 1 \(BatchNorm2d\) has momentum=None.*set its momentum"):
        unit_scale(model, example_inputs=(x,), route=route) if route != "auto" else unit_scale(model)
    model(x)  # torch's own cumulative average, in training mode
    scaled = unit_scale(model.eval())
    assert scaled(x).shape == model(x).shape
