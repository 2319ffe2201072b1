"""Unit-scaled ops: unit-std outputs and gradients for unit-normal inputs, in both directions, at several shapes."""

import math
import operator
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.overrides import TorchFunctionMode

import unitscale.functional as U
from unitscale.errors import InputError, PredicateError, UnknownConstraintError
from unitscale.functional import _activations as _act
from unitscale.fx import DeepTracer
from unitscale.scaling import softmax_stats as _softmax_stats
from unitscale.scaling.constraints import CONSTRAINTS

TOL = 0.15


def stds(op, *shapes, **kwargs):
    """Output std and each input's gradient std, for N(0, 1) inputs and an N(0, 1) output gradient."""
    inputs = [torch.randn(*shape, requires_grad=True) for shape in shapes]
    out = op(*inputs, **kwargs)
    out.backward(torch.randn_like(out))
    return out.std().item(), [x.grad.std().item() for x in inputs]


def assert_unit(value, expected=1.0, tol=TOL):
    assert abs(value / expected - 1) <= tol, f"std {value:.3f}, expected {expected:.3f} within {tol:.0%}"


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


# -- the scale op ----------------------------------------------------------------------------------


def test_scale_multiplies_forward_and_backward_separately():
    x = torch.full((3,), 2.0, requires_grad=True)
    y = U.scale(x, 3.0, 0.25)
    y.backward(torch.ones(3))
    assert y.tolist() == [6.0, 6.0, 6.0]
    assert x.grad.tolist() == [0.25, 0.25, 0.25]


def test_scale_by_one_both_ways_is_the_identity():
    x = torch.randn(3)
    assert U.scale(x, 1.0, 1.0) is x


# -- unconstrained ops: unit std both ways -----------------------------------------------------------


@pytest.mark.parametrize("batch,k,n", [(512, 64, 64), (128, 256, 32), (1024, 16, 512), (64, 1024, 128)])
def test_linear_is_unit_scaled_without_constraint(batch, k, n):
    out, (grad_x, grad_w) = stds(U.linear, (batch, k), (n, k), constraint=None)
    assert_unit(out)
    assert_unit(grad_x)
    assert_unit(grad_w)


def test_linear_bias_gradient_is_unit_scaled_and_bias_is_added():
    x, w, b = torch.randn(2048, 32), torch.randn(16, 32), torch.randn(16, requires_grad=True)
    out = U.linear(x, w, b, constraint=None)
    assert torch.allclose(out - U.linear(x, w, constraint=None), b.detach().expand(2048, 16), atol=1e-5)
    out.backward(torch.randn_like(out))
    assert_unit(b.grad.std().item())


@settings(max_examples=12, deadline=None)
@given(
    batch=st.sampled_from([(256,), (8, 64), (2, 4, 64)]),
    k=st.sampled_from([8, 32, 128, 512]),
    n=st.sampled_from([16, 64, 256]),
)
def test_linear_is_unit_scaled_for_any_shape(batch, k, n):
    torch.manual_seed(1)
    out, (grad_x, grad_w) = stds(U.linear, (*batch, k), (n, k), constraint=None)
    assert_unit(out)
    assert_unit(grad_x)
    assert_unit(grad_w)


@pytest.mark.parametrize(
    "left,right",
    [
        ((8, 32, 64), (8, 64, 16)),
        ((32, 128), (128, 64)),
        ((4, 32, 64), (64, 32)),
        ((64,), (4, 64, 256)),
        ((64, 32, 256), (256,)),
    ],
)
def test_matmul_is_unit_scaled_without_constraint(left, right):
    out, (grad_left, grad_right) = stds(U.matmul, left, right, constraint=None)
    assert_unit(out)
    assert_unit(grad_left)
    assert_unit(grad_right)


@settings(max_examples=12, deadline=None)
@given(
    batch=st.sampled_from([(), (4,), (2, 3)]),
    m=st.sampled_from([16, 64]),
    k=st.sampled_from([8, 64, 256]),
    n=st.sampled_from([16, 64]),
)
def test_matmul_is_unit_scaled_for_any_shape(batch, m, k, n):
    torch.manual_seed(2)
    out, (grad_left, grad_right) = stds(U.matmul, (*batch, m, k), (*batch, k, n), constraint=None)
    assert_unit(out)
    assert_unit(grad_left)
    assert_unit(grad_right)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(100_000,), (256, 512)])
def test_gelu_is_unit_scaled_without_constraint(shape, approximate):
    out, (grad,) = stds(U.gelu, shape, approximate=approximate, constraint=None)
    assert_unit(out, tol=0.03)
    assert_unit(grad, tol=0.03)


@pytest.mark.parametrize(
    ("fn", "out_std", "grad_std"),
    [(F.gelu, _act._GELU_OUT_STD, _act._GELU_GRAD_STD), (F.silu, _act._SILU_OUT_STD, _act._SILU_GRAD_STD)],
    ids=["gelu", "silu"],
)
def test_activation_scales_match_quadrature(fn, out_std, grad_std):
    x = torch.linspace(-12, 12, 200_001, dtype=torch.float64, requires_grad=True)
    density = torch.exp(-(x.detach() ** 2) / 2) / math.sqrt(2 * math.pi) * (x[1] - x[0]).detach()
    y = fn(x)
    (slope,) = torch.autograd.grad(y.sum(), x)
    y = y.detach()
    mean = (y * density).sum()
    assert math.sqrt((y * y * density).sum() - mean**2) == pytest.approx(out_std, rel=1e-4)
    assert math.sqrt((slope * slope * density).sum()) == pytest.approx(grad_std, rel=1e-4)


@pytest.mark.parametrize("n", [2, 3, 7, 16, 64, 100, 1000])
def test_softmax_is_unit_scaled_without_constraint_and_scale_grows_with_n(n):
    out, (grad,) = stds(U.softmax, (400_000 // n, n), dim=-1, constraint=None)
    assert_unit(out, tol=0.05)
    assert_unit(grad, tol=0.05)


def test_softmax_scales_grow_with_the_reduced_dimension():
    forward = [_softmax_stats.softmax_scales(n)[0] for n in (2, 8, 64, 512, 4096)]
    assert forward == sorted(forward)
    assert forward[-1] / 4096 == pytest.approx(1 / math.sqrt(math.e - 1), rel=0.01)


def test_softmax_over_a_middle_dim_uses_that_dims_size():
    out, (grad,) = stds(U.softmax, (64, 32, 16), dim=1, constraint=None)
    assert_unit(out, tol=0.05)
    assert_unit(grad, tol=0.05)


def test_softmax_table_matches_a_fresh_measurement():
    for n, index in ((4, 3), (64, 12)):
        x = torch.randn(2_000_000 // n, n, dtype=torch.float64, requires_grad=True)
        s = x.softmax(-1)
        s.backward(torch.randn_like(s))
        assert n * s.std().item() == pytest.approx(_softmax_stats.OUT[index], rel=0.01)
        assert n * x.grad.std().item() == pytest.approx(_softmax_stats.GRAD[index], rel=0.01)


@pytest.mark.parametrize("spread", [1.0, 0.5])
def test_causal_row_stats_past_the_table_match_torchs_softmax(spread):
    # Rows longer than the table's last n: the causal sums grow by the torch-measured per-row terms.
    limit = _softmax_stats.N[-1]
    n = 2 * limit
    torch.manual_seed(0)
    w = (spread * torch.randn(256, n, dtype=torch.float64)).softmax(-1)
    sq = (w * w).sum(-1, keepdim=True)
    measured = (n * sq.mean().item(), n * (w * w * (1 - 2 * w + sq)).sum(-1).mean().item())
    stats = [_softmax_stats.attention_row_stats(m, m, True, spread) for m in (limit, n)]
    # Per row n * term is flat past the table, so the sums over rows limit..n grow by it times log 2.
    tail = [(n * stats[1][i] - limit * stats[0][i]) / math.log(2) for i in range(2)]
    assert tail == pytest.approx(measured, rel=0.03)


@pytest.mark.parametrize("spread", [1.0, 0.5])
@pytest.mark.parametrize(("queries", "keys"), [(20_000, 20_000), (30_000, 12_000), (9_000, 20_000)])
def test_causal_row_stats_past_the_table_equal_a_float64_sum_over_every_row(spread, queries, keys):
    # Oracle: each causal row's terms from the measured tables (linear in log n, flat past the last n),
    # summed row by row in float64. Spread 1 once had a second path (e per row past the table): 3e-5 to 5e-4 off.
    out, grad = (np.array(t, dtype=np.float64) for t in _softmax_stats.table(spread))
    n = np.minimum(np.arange(1, queries + 1), keys).astype(np.float64)
    log_n = np.log(np.array(_softmax_stats.N, dtype=np.float64))
    weight = ((np.interp(np.log(n), log_n, out) ** 2 + 1) / n).sum() / queries
    grad_sq = (np.interp(np.log(n), log_n, grad) ** 2 / n).sum() / queries
    ours = _softmax_stats.attention_row_stats(queries, keys, True, spread)
    assert ours == pytest.approx((weight, grad_sq), rel=2e-5)  # the log tail is off by ~1e-5 of the sum


@pytest.mark.parametrize("alpha", [1, 0.5])
@pytest.mark.parametrize("shape", [(100_000,), (64, 512)])
def test_add_is_unit_scaled_without_constraint(shape, alpha):
    out, (grad_a, grad_b) = stds(U.add, shape, shape, alpha=alpha, constraint=None)
    assert_unit(out, tol=0.03)
    assert_unit(grad_a, tol=0.03)
    assert_unit(grad_b, expected=alpha, tol=0.03)


def test_add_scales_a_broadcast_operands_gradient():
    out, (grad_a, grad_b) = stds(U.add, (512, 64), (64,), constraint=None)
    assert_unit(out)
    assert_unit(grad_a)
    assert_unit(grad_b)


def test_add_of_numbers_or_integer_tensors_is_plain_addition():
    assert U.add(2, 3) == 5
    assert U.add((1,), (2,)) == (1, 2)
    assert U.add(torch.arange(3), torch.arange(3)).tolist() == [0, 2, 4]
    x = torch.randn(5)
    assert torch.equal(U.add(x, 1.5), x + 1.5)
    assert torch.equal(U.add(x, 2, alpha=3), x + 6)


@pytest.mark.parametrize("tau", [0.01, 0.2, 0.5, 0.9])
def test_residual_pair_keeps_unit_std_both_ways(tau):
    x = torch.randn(4096, 64, requires_grad=True)
    residual, skip = U.residual_split(x, tau)
    branch = U.linear(residual, torch.randn(64, 64), constraint=None)
    out = U.residual_add(branch, skip, tau)
    out.backward(torch.randn_like(out))
    assert_unit(out.std().item(), tol=0.05)
    assert_unit(x.grad.std().item(), tol=0.05)


def test_residual_add_weights_forward_and_split_mirrors_them_backward():
    x = torch.ones(2, requires_grad=True)
    residual, skip = U.residual_split(x, 0.36)
    out = U.residual_add(residual * 2, skip, 0.36)
    assert out.tolist() == pytest.approx([0.6 * 2 + 0.8, 0.6 * 2 + 0.8])
    out.sum().backward()
    # true gradient of 0.6 * 2x + 0.8 x
    assert x.grad.tolist() == pytest.approx([2.0, 2.0])


@pytest.mark.parametrize("shape", [(1024, 64), (8, 16, 256)])
def test_layer_norm_is_unit_scaled_including_affine_gradients(shape):
    d = shape[-1]
    x = torch.randn(*shape, requires_grad=True)
    weight, bias = torch.ones(d, requires_grad=True), torch.zeros(d, requires_grad=True)
    out = U.layer_norm(x, (d,), weight, bias)
    out.backward(torch.randn_like(out))
    assert torch.allclose(out, F.layer_norm(x, (d,), weight, bias), atol=1e-6)
    for value in (out.std(), x.grad.std(), weight.grad.std(), bias.grad.std()):
        assert_unit(value.item())


@pytest.mark.parametrize("vocab,dim,lookups", [(64, 32, 16384), (1000, 16, 50_000), (8, 8, 512)])
def test_embedding_weight_gradient_is_unit_scaled(vocab, dim, lookups):
    weight = torch.randn(vocab, dim, requires_grad=True)
    idx = torch.randint(0, vocab, (lookups,))
    out = U.embedding(idx, weight)
    out.backward(torch.randn_like(out))
    assert torch.equal(out, weight[idx])
    assert_unit(out.std().item())
    assert_unit(weight.grad.std().item())


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_is_unit_scaled_both_ways(p):
    out, (grad,) = stds(U.dropout, (200_000,), p=p)
    assert_unit(out, tol=0.03)
    assert_unit(grad, tol=0.03)


def test_dropout_in_eval_mode_is_its_training_expectation_and_p_zero_the_identity():
    x = torch.randn(10)
    # training keeps x / (1 - p) * sqrt(1 - p) with probability 1 - p: expectation sqrt(1 - p) * x
    assert torch.allclose(U.dropout(x, 0.36, training=False), 0.8 * x)
    assert U.dropout(x, 0.0) is x
    kept = torch.stack([U.dropout(x, 0.36) for _ in range(20_000)]).mean(0)
    assert torch.allclose(kept, 0.8 * x, atol=0.05)


@pytest.mark.parametrize("drop", [U.dropout, F.dropout])
def test_a_batch_norm_after_dropout_sees_in_eval_what_it_sees_after_torchs_dropout(drop):
    # Eval mode gives the training expectation, sqrt(q) * x (q = 1 - p), as the reference does. No fixed
    # scale also keeps the training width: ours trains at |x| and evaluates at sqrt(q) |x|, torch's trains
    # at |x| / sqrt(q) and evaluates at |x|. The ratio is the same, so a batch norm fitted in training
    # gives std sqrt(q) = 0.8 in eval after either: the width shift is dropout's own, not unit scaling's.
    torch.manual_seed(0)
    x = torch.randn(4096, 8, dtype=torch.float64)
    bn = nn.BatchNorm1d(8, momentum=None, affine=False).double()  # momentum=None: the mean over batches
    for _ in range(20):
        bn(drop(x, 0.36, training=True))
    bn.eval()
    assert bn(drop(x, 0.36, training=False)).std().item() == pytest.approx(0.8, rel=0.02)


@pytest.mark.parametrize("training", [True, False])
def test_inplace_dropout_returns_the_callers_tensor_changed(training):
    x = torch.randn(1000)
    before = x.clone()
    out = U.dropout(x, 0.36, training=training, inplace=True)
    assert out is x
    kept = before != 0
    if training:
        kept = out != 0
    assert torch.allclose(out[kept], before[kept] * (0.8 if not training else 0.8 / 0.64))


@pytest.mark.parametrize("classes,batch", [(2, 8192), (10, 4096), (100, 1024), (1000, 128)])
def test_cross_entropy_keeps_the_loss_and_unit_scales_the_logit_gradient(classes, batch):
    logits = torch.randn(batch, classes, requires_grad=True)
    target = torch.randint(0, classes, (batch,))
    loss = U.cross_entropy(logits, target)
    assert torch.allclose(loss, F.cross_entropy(logits, target))
    loss.backward()
    assert_unit(logits.grad.std().item(), tol=0.05)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_cross_entropy_gradient_is_unit_scaled_for_other_reductions(reduction):
    logits = torch.randn(16, 10, 32, requires_grad=True)
    target = torch.randint(0, 10, (16, 32))
    loss = U.cross_entropy(logits, target, reduction=reduction)
    assert torch.allclose(loss, F.cross_entropy(logits, target, reduction=reduction))
    loss.backward(torch.ones_like(loss))
    assert_unit(logits.grad.std().item(), tol=0.05)


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("shape", [(4, 4, 16, 16), (2, 8, 64, 32), (1, 4, 256, 64), (2, 2, 512, 16)])
def test_attention_is_unit_scaled_without_constraint(shape, is_causal):
    out, grads = stds(U.scaled_dot_product_attention, shape, shape, shape, is_causal=is_causal, constraint=None)
    assert_unit(out)
    # one backward scale for query, key and value: together unit-std (the mean of their variances 1)
    assert_unit((sum(g**2 for g in grads) / 3) ** 0.5)


@pytest.mark.parametrize("is_causal", [False, True])
def test_attention_with_more_keys_than_queries_is_unit_scaled(is_causal):
    out, grads = stds(
        U.scaled_dot_product_attention,
        (4, 4, 32, 32),
        (4, 4, 128, 32),
        (4, 4, 128, 32),
        is_causal=is_causal,
        constraint=None,
    )
    assert_unit(out)
    # one backward scale for query, key and value: together unit-std (the mean of their variances 1)
    assert_unit((sum(g**2 for g in grads) / 3) ** 0.5)


def test_attention_with_grouped_queries_and_dropout_is_unit_scaled():
    out, grads = stds(
        U.scaled_dot_product_attention,
        (2, 8, 64, 32),
        (2, 2, 64, 32),
        (2, 2, 64, 32),
        enable_gqa=True,
        dropout_p=0.2,
        constraint=None,
    )
    assert_unit(out)
    # one backward scale for query, key and value: together unit-std (the mean of their variances 1)
    assert_unit((sum(g**2 for g in grads) / 3) ** 0.5)


# -- constrained ops: the std the constraint implies ---------------------------------------------------


def implied(constraint, *scales):
    """The std each direction gets when ``scales`` (each making one direction unit) are constrained."""
    chosen = CONSTRAINTS[constraint](*scales)
    return [chosen / s for s in scales]


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
@pytest.mark.parametrize("k,n", [(256, 64), (32, 512)])
def test_constrained_linear_gives_the_implied_std(constraint, k, n):
    out, (grad_x, grad_w) = stds(U.linear, (512, k), (n, k), constraint=constraint)
    expected_out, expected_grad = implied(constraint, k**-0.5, n**-0.5)
    assert_unit(out, expected_out)
    assert_unit(grad_x, expected_grad)
    assert_unit(grad_w)  # weight gradients are never constrained


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_constrained_matmul_gives_the_implied_std(constraint):
    out, (grad_left, grad_right) = stds(U.matmul, (4, 32, 128), (4, 128, 64), constraint=constraint)
    expected = implied(constraint, 128**-0.5, 64**-0.5, 32**-0.5)
    for value, want in zip((out, grad_left, grad_right), expected, strict=True):
        assert_unit(value, want)


@pytest.mark.parametrize("constraint", list(CONSTRAINTS))
def test_constrained_gelu_softmax_and_add_give_the_implied_std(constraint):
    out, (grad,) = stds(U.gelu, (100_000,), constraint=constraint)
    for value, want in zip(
        (out, grad), implied(constraint, 1 / _act._GELU_OUT_STD, 1 / _act._GELU_GRAD_STD), strict=True
    ):
        assert_unit(value, want, tol=0.03)
    out, (grad,) = stds(U.softmax, (4096, 64), dim=-1, constraint=constraint)
    for value, want in zip((out, grad), implied(constraint, *_softmax_stats.softmax_scales(64)), strict=True):
        assert_unit(value, want, tol=0.05)
    out, (grad_a, grad_b) = stds(U.add, (100_000,), (100_000,), constraint=constraint)
    for value, want in zip((out, grad_a, grad_b), implied(constraint, 2**-0.5, 1.0, 1.0), strict=True):
        assert_unit(value, want, tol=0.03)


@settings(max_examples=10, deadline=None)
@given(
    k=st.sampled_from([16, 64, 256, 1024]),
    n=st.sampled_from([16, 64, 256, 1024]),
    constraint=st.sampled_from(["gmean", "hmean", "amean"]),
)
def test_mean_constraints_keep_linear_between_the_two_unit_choices(k, n, constraint):
    torch.manual_seed(3)
    out, (grad_x, _) = stds(U.linear, (256, k), (n, k), constraint=constraint)
    # The chosen scale lies between k**-0.5 and n**-0.5, so each std lies between 1 and the ratio.
    ratio = math.sqrt(max(k, n) / min(k, n))
    for value in (out, grad_x):
        assert 1 / ratio * (1 - TOL) <= value <= ratio * (1 + TOL)


def test_a_callable_constraint_is_used():
    out, (grad_x, _) = stds(U.linear, (512, 256), (64, 256), constraint=lambda output, grad: 1 / 256**0.5)
    assert_unit(out)
    assert_unit(grad_x, 256**-0.5 / 64**-0.5)


# -- torch_map -------------------------------------------------------------------------------------


def test_torch_map_covers_the_targets_a_graph_contains():
    expected = {
        F.linear: U.linear,
        torch.matmul: U.matmul,
        operator.matmul: U.matmul,
        torch.bmm: U.matmul,
        F.gelu: U.gelu,
        F.softmax: U.softmax,
        torch.softmax: U.softmax,
        torch.add: U.add,
        operator.add: U.add,
        F.layer_norm: U.layer_norm,
        F.embedding: U.embedding,
        F.dropout: U.dropout,
        F.cross_entropy: U.cross_entropy,
        F.scaled_dot_product_attention: U.scaled_dot_product_attention,
    }
    for fn, twin in expected.items():
        assert U.torch_map[fn] is twin


def test_every_twin_accepts_its_torch_functions_arguments():
    x, w, idx = torch.randn(2, 4, 8), torch.randn(8, 8), torch.randint(0, 8, (2, 4))
    calls = [
        (F.linear, (x, w), {}),
        (torch.matmul, (x, w), {}),
        (operator.matmul, (x, w), {}),
        (torch.bmm, (x, torch.randn(2, 8, 3)), {}),
        (F.gelu, (x,), {"approximate": "tanh"}),
        (F.softmax, (x, -1), {}),
        (torch.softmax, (x,), {"dim": 1}),
        (torch.softmax, (x, 1, torch.float64), {}),
        (F.softmax, (x, -1), {"_stacklevel": 5}),
        (torch.add, (x, x), {"alpha": 2}),
        (operator.add, (x, x), {}),
        (F.layer_norm, (x, (8,)), {"eps": 1e-6}),
        (F.embedding, (idx, w), {}),
        (F.dropout, (x,), {"p": 0.1, "training": False}),
        (F.cross_entropy, (x, torch.randint(0, 4, (2, 8))), {"label_smoothing": 0.1}),
        (F.scaled_dot_product_attention, (x, x, x), {"is_causal": True}),
    ]
    for fn, args, kwargs in calls:
        expected, out = fn(*args, **kwargs), U.torch_map[fn](*args, **kwargs)
        assert (out.shape, out.dtype) == (expected.shape, expected.dtype), fn


class SwapToTwins(TorchFunctionMode):
    """Runs every torch function that has a twin as its twin, with the arguments torch passed."""

    def __init__(self):
        super().__init__()
        self.swapped = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        twin = U.torch_map.get(func)
        if twin is None:
            return func(*args, **(kwargs or {}))
        self.swapped.append(func)
        return twin(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "module,inputs",
    [
        (nn.Linear(8, 3), lambda: (torch.randn(2, 4, 8),)),
        (nn.Softmax(dim=-1), lambda: (torch.randn(2, 4, 8),)),
        (nn.GELU(approximate="tanh"), lambda: (torch.randn(2, 4, 8),)),
        (nn.Dropout(0.1), lambda: (torch.randn(2, 4, 8),)),
        (nn.LayerNorm(8), lambda: (torch.randn(2, 4, 8),)),
        (nn.Embedding(10, 8, padding_idx=0), lambda: (torch.randint(0, 10, (2, 4)),)),
        (nn.CrossEntropyLoss(label_smoothing=0.1), lambda: (torch.randn(4, 10), torch.randint(0, 10, (4,)))),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, nn.Module) else "",
)
def test_twins_accept_the_arguments_torch_modules_pass(module, inputs):
    args = inputs()
    with SwapToTwins() as mode:
        out = module(*args)
    assert mode.swapped, f"{module} called no function that has a twin"
    assert out.shape == module(*args).shape


def test_deep_tracer_keeps_unit_scaled_ops_as_single_nodes():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8, 8))

        def forward(self, x):
            return U.gelu(U.linear(x, self.w))

    graph = DeepTracer().trace(Model())
    assert [n.target for n in graph.nodes if n.op == "call_function"] == [U.linear, U.gelu]


def test_ops_compile_in_one_graph_and_match_eager():
    def step(x, w):
        y = U.gelu(U.linear(x, w))
        return U.residual_add(*U.residual_split(y, 0.5), 0.5)

    x, w = torch.randn(4, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    out = compiled(x, w)
    out.sum().backward()
    grads = x.grad.clone(), w.grad.clone()
    x.grad = w.grad = None
    expected = step(x, w)
    expected.sum().backward()
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(grads[0], x.grad, atol=1e-6) and torch.allclose(grads[1], w.grad, atol=1e-6)


# -- bad input -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: U.linear(torch.randn(2, 4), torch.randn(3, 4), constraint="geo"),
        lambda: U.matmul(torch.randn(2, 4), torch.randn(4, 3), constraint="geo"),
        lambda: U.gelu(torch.randn(2), constraint="geo"),
        lambda: U.softmax(torch.randn(2), 0, constraint="geo"),
        lambda: U.add(torch.randn(2), torch.randn(2), constraint="geo"),
        lambda: U.scaled_dot_product_attention(*torch.randn(3, 1, 2, 4), constraint="geo"),
    ],
)
def test_unknown_constraint_names_are_rejected_by_every_op(call):
    with pytest.raises(
        UnknownConstraintError, match=r"^unknown constraint 'geo'; use one of 'gmean', 'hmean', 'amean'"
    ):
        call()


@pytest.mark.parametrize("tau", [0, 1, -0.5, 1.5, True, "0.5", None])
def test_residual_ops_reject_tau_outside_the_open_unit_interval(tau):
    x = torch.randn(3)
    for op, call in (
        ("residual_split", lambda: U.residual_split(x, tau)),
        ("residual_add", lambda: U.residual_add(x, x, tau)),
    ):
        message = (
            f"{op}: tau={tau!r} is not a number strictly between 0 and 1; it is the share of the output variance "
            "the residual branch carries (e.g. 0.01 for attention, 0.5 for an MLP)"
        )
        with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
            call()


@pytest.mark.parametrize("p", [-0.1, 1.5, "x"])
def test_dropout_rejects_a_p_that_is_not_a_probability(p):
    with pytest.raises(
        InputError, match=f"^{re.escape(f'dropout: p={p!r} is not a probability; pass a number in [0, 1]')}$"
    ):
        U.dropout(torch.randn(3), p)


def test_attention_rejects_dropping_every_weight():
    q = torch.randn(1, 2, 4)
    message = "scaled_dot_product_attention: dropout_p=1 drops every weight; pass a value below 1"
    with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
        U.scaled_dot_product_attention(q, q, q, dropout_p=1.0)


@pytest.mark.parametrize("value", [0.0, -1.0, float("nan"), float("inf"), "1", None])
def test_a_constraint_returning_no_positive_number_is_reported(value):
    def broken(output_scale, *grad_scales):
        return value

    message = (
        f"constraint 'broken' returned {value!r} for the scales (0.125, 0.25); "
        "a constraint must return one positive, finite number"
    )
    with pytest.raises(PredicateError, match=f"^{re.escape(message)}$"):
        U.linear(torch.randn(2, 64), torch.randn(16, 64), constraint=broken)


def test_softmax_requires_an_explicit_dim():
    message = "softmax: dim=None; pass the dimension to normalise over, e.g. dim=-1"
    with pytest.raises(InputError, match=f"^{re.escape(message)}$"):
        U.softmax(torch.randn(3))


@pytest.mark.parametrize("spread", [0.03, 0.3, 1.7, 5.0])
def test_softmax_statistics_between_and_beyond_the_measured_spreads_match_a_fresh_measurement(spread):
    out, grad = _softmax_stats.table(spread)
    generator = torch.Generator().manual_seed(7)
    for n in (8, 256):
        logits = spread * torch.randn(2**20 // n, n, dtype=torch.float64, generator=generator)
        w = torch.softmax(logits, -1)
        g = torch.randn(w.shape, dtype=torch.float64, generator=generator)
        logit_grad = w * (g - (w * g).sum(-1, keepdim=True))
        index = _softmax_stats.N.index(n)
        assert n * w.std().item() == pytest.approx(out[index], rel=0.03 if spread < 5 else 0.08)
        assert n * logit_grad.std().item() == pytest.approx(grad[index], rel=0.03 if spread < 5 else 0.08)


def test_attention_with_a_new_score_spread_exports_and_compiles_in_one_graph():
    class Attention(torch.nn.Module):
        def forward(self, q):
            return U.scaled_dot_product_attention(q, q, q, scale=0.2345, is_causal=True)

    q = torch.randn(1, 2, 96, 8)
    exported = torch.export.export(Attention(), (q,), strict=False)
    assert torch.allclose(exported.module()(q), Attention()(q))
    compiled = torch.compile(Attention(), backend="eager", fullgraph=True)
    assert torch.allclose(compiled(q), Attention()(q))
