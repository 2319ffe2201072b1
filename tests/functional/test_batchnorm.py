"""Unit-scaled batch norm: torch's batch norm forward; on a cut edge, a backward scaled by the std it divides by.

Oracles: ``torch.nn.functional.batch_norm`` itself (values, true gradients) and hand-computed
statistics of the batch (the running statistics' first-batch replacement and later updates).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import unitscale.functional as U


def _channels_with_spread(n: int = 16, c: int = 32) -> torch.Tensor:
    """``(n, c, 8, 8)`` values whose channels have stds from 0.2 to 5 (a conv after a ReLU, exaggerated)."""
    torch.manual_seed(0)
    return torch.randn(n, c, 8, 8) * torch.logspace(-0.7, 0.7, c).reshape(1, c, 1, 1) + 3


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_gradient_is_the_true_one_times_the_harmonic_mean_std(training: bool) -> None:
    x = _channels_with_spread().requires_grad_()
    mean, var = x.detach().mean((0, 2, 3)), x.detach().var((0, 2, 3), unbiased=False)
    running_mean, running_var = (None, None) if training else (mean.clone(), var.clone())
    y = U.batch_norm(x, running_mean, running_var, training=training, constraint=None)
    expected = F.batch_norm(x, running_mean, running_var, training=training)
    assert torch.allclose(y, expected, atol=1e-5)
    g = torch.randn_like(y)
    (got,) = torch.autograd.grad(y, x, g)
    (true,) = torch.autograd.grad(expected, x, g)
    factor = (1 / (var + 1e-5)).mean().rsqrt()
    assert torch.allclose(got, true * factor, atol=1e-6)
    # the true gradient's std is about 1 / (harmonic-mean std): the scaled one is unit
    assert got.std().item() == pytest.approx(1.0, abs=0.1)
    assert true.std().item() > 2


@pytest.mark.parametrize("constraint", ["to_output_scale", "gmean", lambda out, grad: grad])
@pytest.mark.parametrize("training", [True, False])
def test_constrained_batch_norm_gives_torchs_own_gradient(training: bool, constraint) -> None:
    """Inside a residual block the input gradient meets the skip's: any constraint keeps torch's gradient."""
    x = _channels_with_spread().requires_grad_()
    stats = (x.detach().mean((0, 2, 3)), x.detach().var((0, 2, 3), unbiased=False))
    running_mean, running_var = (None, None) if training else stats
    g = torch.randn(x.shape)
    (got,) = torch.autograd.grad(
        U.batch_norm(x, running_mean, running_var, training=training, constraint=constraint), x, g
    )
    (true,) = torch.autograd.grad(F.batch_norm(x, running_mean, running_var, training=training), x, g)
    assert torch.allclose(got, true, atol=1e-6)


def test_eval_with_the_batchs_statistics_differentiates_through_them() -> None:
    """Eval before any training batch normalises with the batch's statistics: the gradient is training mode's."""
    x = _channels_with_spread().requires_grad_()
    g = torch.randn(x.shape)
    y = U.batch_norm(x, torch.zeros(32), torch.ones(32), training=False)
    (got,) = torch.autograd.grad(y, x, g)
    (true,) = torch.autograd.grad(F.batch_norm(x, None, None, training=True), x, g)
    assert torch.allclose(got, true, atol=1e-6)


def test_frozen_grad_scale_measures_its_factor_once_then_keeps_it() -> None:
    """The first backward sets the factor to 1 / RMS; later ones reuse it: linear in the gradient from then on."""
    x = torch.randn(3, 5, requires_grad=True)
    factor = torch.zeros(())
    g = 7 * torch.randn(3, 5)
    y = U.frozen_grad_scale(x, factor)
    assert torch.equal(y, x)
    (got,) = torch.autograd.grad(y, x, g)
    rms = g.pow(2).mean().sqrt()
    assert torch.allclose(got, g / rms) and torch.allclose(factor, 1 / rms)
    # frozen: a second gradient, 3 times as large, comes back 3 times as large
    (again,) = torch.autograd.grad(U.frozen_grad_scale(x, factor), x, 3 * g)
    assert torch.allclose(again, 3 * g / rms)
    a, b = torch.randn(3, 5), torch.randn(3, 5)
    grads = [torch.autograd.grad(U.frozen_grad_scale(x, factor), x, v)[0] for v in (a, b, a + b)]
    assert torch.allclose(grads[0] + grads[1], grads[2])


def test_frozen_grad_scale_refuses_a_factor_that_is_not_a_one_element_tensor() -> None:
    from unitscale.errors import InputError

    with pytest.raises(InputError, match="frozen_grad_scale: factor=2.0"):
        U.frozen_grad_scale(torch.ones(2), 2.0)  # type: ignore[arg-type]


def test_reset_running_statistics_are_replaced_by_the_first_training_batch_then_updated_with_momentum() -> None:
    x = _channels_with_spread()
    running_mean, running_var = torch.zeros(32), torch.ones(32)
    U.batch_norm(x, running_mean, running_var, training=True, momentum=0.1)
    assert torch.allclose(running_mean, x.mean((0, 2, 3)), atol=1e-5)
    assert torch.allclose(running_var, x.var((0, 2, 3), unbiased=True), rtol=1e-5)
    second = _channels_with_spread() * 2
    before_mean, before_var = running_mean.clone(), running_var.clone()
    U.batch_norm(second, running_mean, running_var, training=True, momentum=0.1)
    # torch's update from then on
    torch_mean, torch_var = before_mean.clone(), before_var.clone()
    F.batch_norm(second, torch_mean, torch_var, training=True, momentum=0.1)
    assert torch.allclose(running_mean, torch_mean, atol=1e-5) and torch.allclose(running_var, torch_var, rtol=1e-5)


def test_eval_before_any_training_batch_normalises_with_the_batch_then_with_running_statistics() -> None:
    x = _channels_with_spread()
    running_mean, running_var = torch.zeros(32), torch.ones(32)
    y = U.batch_norm(x, running_mean, running_var, training=False)
    assert torch.allclose(y, F.batch_norm(x, None, None, training=True), atol=1e-4)
    assert torch.equal(running_mean, torch.zeros(32)) and torch.equal(running_var, torch.ones(32))
    learnt_mean, learnt_var = torch.full((32,), 3.0), torch.full((32,), 4.0)
    y = U.batch_norm(x, learnt_mean, learnt_var, training=False)
    assert torch.allclose(y, (x - 3) / (4 + 1e-5) ** 0.5, atol=1e-5)


def test_batch_norm_affine_gradients_are_unit() -> None:
    torch.manual_seed(0)
    w, b = torch.ones(64, requires_grad=True), torch.zeros(64, requires_grad=True)
    y = U.batch_norm(torch.randn(32, 64, 6, 6), None, None, w, b, training=True)
    y.backward(torch.randn_like(y))
    assert w.grad.std().item() == pytest.approx(1.0, abs=0.2) and b.grad.std().item() == pytest.approx(1.0, abs=0.2)


def test_batch_norm_of_one_value_per_channel_fails_as_torchs_does() -> None:
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        U.batch_norm(torch.randn(1, 4), torch.zeros(4), torch.ones(4), training=True)


@pytest.mark.parametrize("momentum", [0.1, 0.25])
def test_with_the_batch_count_running_statistics_average_cumulatively_then_with_momentum(momentum: float) -> None:
    """Batch ``n`` updates at rate ``max(1 / n, momentum)``: torch's ``momentum=None`` first, then the hand formula."""
    warm_up, batches = round(1 / momentum), round(1 / momentum) + 4
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn(8, 6, 5, 5, generator=gen) * (1 + k) + k for k in range(batches)]
    running_mean, running_var, count = torch.zeros(6), torch.ones(6), torch.zeros((), dtype=torch.long)
    oracle = torch.nn.BatchNorm2d(6, momentum=None)
    for k, x in enumerate(xs, start=1):
        count.add_(1)  # as torch's module does before calling the function
        U.batch_norm(x, running_mean, running_var, training=True, momentum=momentum, num_batches_tracked=count)
        if k <= warm_up:
            oracle(x)  # torch's cumulative average of the batch statistics
            expected_mean, expected_var = oracle.running_mean, oracle.running_var
        else:
            expected_mean = (1 - momentum) * expected_mean + momentum * x.mean((0, 2, 3))
            expected_var = (1 - momentum) * expected_var + momentum * x.var((0, 2, 3), unbiased=True)
        assert torch.allclose(running_mean, expected_mean, rtol=1e-5, atol=1e-5), k
        assert torch.allclose(running_var, expected_var, rtol=1e-5, atol=1e-5), k
    assert count.item() == batches  # read, not changed


def test_a_batch_count_of_zero_reads_as_one() -> None:
    """A count nobody incremented: the batch replaces the statistics (rate 1), never a division by zero."""
    x = _channels_with_spread()
    running_mean, running_var = torch.full((32,), 7.0), torch.full((32,), 7.0)
    U.batch_norm(x, running_mean, running_var, training=True, num_batches_tracked=torch.tensor(0))
    assert torch.allclose(running_mean, x.mean((0, 2, 3)), atol=1e-5)
    assert torch.allclose(running_var, x.var((0, 2, 3), unbiased=True), rtol=1e-5)
