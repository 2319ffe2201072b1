"""Side by side with the reference, Graphcore's ``unit-scaling`` 0.3.5: same inputs and weights, same numbers.

Every op, module and optimiser both libraries have is run on identical inputs and weights.
Each test asserts equal outputs and gradients, or a deliberate difference, named in the
test with its reason, or a place where the reference is wrong (also measured on the
"Against the reference" page).
"""

from __future__ import annotations

import copy
import math
import pickle

import pytest
import torch
import torch.nn.functional as F
import unit_scaling as uu
import unit_scaling.functional as R
import unit_scaling.optim as ropt
from hypothesis import given, settings
from hypothesis import strategies as st

import unitscale.functional as U
from unitscale import nn as unn
from unitscale import optim
from unitscale.scaling import constraints as C
from unitscale.scaling import residual_taus, role_of, set_depth, tag

# The constraints both libraries know by the same name (the reference's to_grad_input_scale takes
# exactly two scales, so it is compared only on two-scale ops).
SHARED = ["gmean", "hmean", "amean", "to_output_scale", None]


pytestmark = pytest.mark.usefixtures("float64")  # tests/scaling/conftest.py


def run(op, *tensors: torch.Tensor, grad: torch.Tensor | None = None, **kwargs):
    """``op``'s output and each input's gradient, for leaf copies of ``tensors`` and a fixed output gradient."""
    leaves = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in tensors]
    out = op(*leaves, **kwargs)
    out.backward(torch.ones_like(out) if grad is None else grad)
    return out.detach(), [leaf.grad for leaf in leaves if leaf.is_floating_point()]


def assert_same(ours, theirs, rtol=1e-10, atol=1e-12):
    (out, grads), (ref_out, ref_grads) = ours, theirs
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    assert len(grads) == len(ref_grads)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=rtol, atol=atol)


def constant_ratio(a: torch.Tensor, b: torch.Tensor) -> float:
    """``a / b`` where that is one number for every element (asserted), else fail."""
    a, b = a.detach(), b.detach()
    ratio = (a * b).sum() / (b * b).sum()
    torch.testing.assert_close(a, ratio * b, rtol=1e-9, atol=1e-12)
    return float(ratio)


def std(t: torch.Tensor) -> float:
    return float(t.detach().std())


# -- constraints (the reference's tests/test_constraints.py, translated) -------------------------------------


def test_constraints_agree_with_the_reference_on_its_own_cases():
    for ours, theirs in [
        (C.gmean, uu.constraints.gmean),
        (C.hmean, uu.constraints.hmean),
        (C.amean, uu.constraints.amean),
    ]:
        for scales in [(8.0, 2.0), (12.75, 55.0, 0.001), (1.0, 4.0, 2.0)]:
            assert ours(*scales) == pytest.approx(theirs(*scales), rel=1e-12)
    assert C.gmean(8.0, 2.0) == 4.0 and C.gmean(12.75, 55.0, 0.001) == pytest.approx(0.8884322)
    assert C.hmean(8.0, 2.0) == pytest.approx(3.2) and C.hmean(12.75, 55.0, 0.001) == pytest.approx(0.00299971)
    assert C.amean(8.0, 2.0) == 5.0 and C.amean(12.75, 55.0, 0.001) == pytest.approx(22.583667)
    assert C.to_output_scale(2, 3) == 2 and C.to_output_scale(2, 3, 4) == 2
    assert C.to_grad_input_scale(2, 3) == 3


def test_means_of_one_scale_are_that_scale():
    assert C.gmean(1.0) == C.hmean(1.0) == C.amean(1.0) == 1.0


def test_to_grad_input_scale_of_several_gradients_is_their_geometric_mean_where_the_reference_refuses():
    """Deliberate: ``matmul`` has two gradient scales; the reference's constraint takes exactly one."""
    assert C.to_grad_input_scale(1.0, 4.0, 1.0) == pytest.approx(2.0)
    with pytest.raises(TypeError):
        uu.constraints.to_grad_input_scale(1.0, 4.0, 1.0)


def test_left_and_right_grad_scale_constraints_match_the_reference():
    a, b = torch.randn(16, 32), torch.randn(32, 8)
    for name in ("to_left_grad_scale", "to_right_grad_scale"):
        assert_same(run(U.matmul, a, b, constraint=name), run(R.matmul, a, b, constraint=name))


# -- the scale op (tests/test_scale.py and core/test_functional.py) -----------------------------------------


def test_scale_is_the_references_scale_fwd_and_scale_bwd():
    x = torch.randn(64)
    assert_same(run(U.scale, x, fwd_scale=3.5, bwd_scale=1.0), run(uu.scale.scale_fwd, x, scale=3.5))
    assert_same(run(U.scale, x, fwd_scale=1.0, bwd_scale=3.5), run(uu.scale.scale_bwd, x, scale=3.5))


# -- matmul and linear ---------------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    batch=st.sampled_from([(), (3,), (2, 2)]),
    m=st.integers(1, 9),
    k=st.integers(1, 9),
    n=st.integers(1, 9),
    constraint=st.sampled_from(SHARED),
    seed=st.integers(0, 2**31 - 1),
)
def test_matmul_equals_the_reference_without_broadcasting(batch, m, k, n, constraint, seed):
    torch.manual_seed(seed)  # a failure replays with the same numbers
    a, b = torch.randn(*batch, m, k), torch.randn(*batch, k, n)
    grad = torch.randn(*batch, m, n)
    assert_same(
        run(U.matmul, a, b, grad=grad, constraint=constraint), run(R.matmul, a, b, grad=grad, constraint=constraint)
    )


def test_broadcast_matmul_right_gradient_is_unit_where_the_references_is_sqrt_batch():
    """Reference bug: the right operand's gradient sums over the broadcast batch too, which its scale ignores."""
    a, b = torch.randn(8, 256, 256), torch.randn(256, 256)
    grad = torch.randn(8, 256, 256)
    (_, (_, ours)), (_, (_, theirs)) = (
        run(U.matmul, a, b, grad=grad, constraint=None),
        run(R.matmul, a, b, grad=grad, constraint=None),
    )
    assert std(ours) == pytest.approx(1, abs=0.05)
    assert std(theirs) == pytest.approx(8**0.5, rel=0.05)


@settings(max_examples=15, deadline=None)
@given(
    batch=st.sampled_from([(5,), (2, 3)]),
    fan_in=st.integers(1, 9),
    fan_out=st.integers(1, 9),
    constraint=st.sampled_from([*SHARED, "to_grad_input_scale"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_linear_without_bias_equals_the_reference(batch, fan_in, fan_out, constraint, seed):
    torch.manual_seed(seed)  # a failure replays with the same numbers
    x, w, grad = torch.randn(*batch, fan_in), torch.randn(fan_out, fan_in), torch.randn(*batch, fan_out)
    assert_same(
        run(U.linear, x, w, grad=grad, constraint=constraint),
        run(lambda x, w, **kw: R.linear(x, w, None, **kw), x, w, grad=grad, constraint=constraint),
    )


def test_linear_bias_is_added_unscaled_where_the_reference_scales_it_by_fan_in():
    """Deliberate (and a reference bug): the reference adds the bias before the output scale, so a bias
    moves the output by ``fan_in**-0.5`` of itself and its effect shrinks with width; here it moves it by 1,
    as the u-μP bias rule (learning rate constant in width) assumes. Gradients are equal."""
    x, w, b, grad = torch.randn(6, 64), torch.randn(5, 64), torch.randn(5), torch.randn(6, 5)
    (out, grads), (ref_out, ref_grads) = (
        run(U.linear, x, w, b, grad=grad, constraint="to_output_scale"),
        run(R.linear, x, w, b, grad=grad, constraint="to_output_scale"),
    )
    torch.testing.assert_close(out - ref_out, (1 - 64**-0.5) * b.expand(6, 5))
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)


def test_default_constraint_is_gmean_where_the_references_is_to_output_scale():
    """Deliberate: unit scaling's default (Blake et al.) is gmean; the reference's u-μP default ties to the output.
    Each library with the other's default gives the other's numbers."""
    x, w, grad = torch.randn(6, 64), torch.randn(16, 64), torch.randn(6, 16)
    assert_same(run(U.linear, x, w, grad=grad), run(lambda x, w: R.linear(x, w, None, "gmean"), x, w, grad=grad))
    assert_same(
        run(U.linear, x, w, grad=grad, constraint="to_output_scale"),
        run(lambda x, w: R.linear(x, w, None), x, w, grad=grad),
    )


def test_readout_equals_the_references_linear_readout():
    x, w, grad = torch.randn(6, 64), torch.randn(10, 64), torch.randn(6, 10)
    assert_same(run(U.linear_readout, x, w, grad=grad), run(lambda x, w: R.linear_readout(x, w, None), x, w, grad=grad))


def test_functional_readout_adds_its_bias_as_the_readout_module_does():
    """Found by these tests: ``linear_readout`` multiplied its bias by ``mult / sqrt(fan_in)``, the module by 1."""
    layer = unn.LinearReadout(64, 10, bias=True, mult=2.0).double()
    with torch.no_grad():
        layer.bias.normal_()
    x, grad = torch.randn(6, 64), torch.randn(6, 10)
    out, (weight_grad, bias_grad, input_grad) = module_run(layer, x, grad)
    functional = run(lambda x, w, b: U.linear_readout(x, w, b, mult=2.0), x, layer.weight, layer.bias, grad=grad)
    assert_same(functional, (out, [input_grad, weight_grad, bias_grad]))


# -- pointwise ops and softmax -------------------------------------------------------------------------------


@pytest.mark.parametrize("ours,theirs", [(U.gelu, R.gelu), (U.silu, R.silu)], ids=["gelu", "silu"])
def test_gelu_and_silu_differ_from_the_reference_by_one_factor_ours_exact(ours, theirs):
    """Deliberate: the output and gradient scales are the exact Gaussian moments (quadrature, checked in
    test_functional), where the reference interpolates an empirical model: one constant factor apart."""
    x = torch.randn(400_000)
    ratio = constant_ratio(ours(x, constraint=None), theirs(x, constraint=None))
    assert ratio != pytest.approx(1, abs=1e-3)
    assert abs(std(ours(x, constraint=None)) - 1) < 0.005 < abs(std(theirs(x, constraint=None)) - 1)


@pytest.mark.parametrize("op", ["gelu", "silu", "softmax"])
def test_activation_multipliers_shape_the_function_as_the_references_do(op):
    x = torch.randn(4096)
    kwargs = {"dim": 0} if op == "softmax" else {}
    ours, theirs = (
        getattr(U, op)(x, mult=4.0, constraint=None, **kwargs),
        getattr(R, op)(x, mult=4.0, constraint=None, **kwargs),
    )
    constant_ratio(ours, theirs)


@pytest.mark.parametrize("n", [64, 4096])
def test_softmax_is_scaled_to_unit_std_where_the_reference_misses_it_at_mult_1(n):
    """Deliberate: the scale comes from the softmax's std over ``n`` elements; the reference's model
    interpolates between a flat and a one-hot limit and says itself that it is rough at ``mult=1``."""
    x = torch.randn(64, n)
    ratio = constant_ratio(U.softmax(x, dim=-1, constraint=None), R.softmax(x, dim=-1, constraint=None))
    assert ratio != pytest.approx(1, abs=0.01)
    assert std(U.softmax(x, dim=-1, constraint=None)) == pytest.approx(1, abs=0.1)
    assert std(R.softmax(x, dim=-1, constraint=None)) < 0.9


def test_dropout_in_training_equals_the_reference():
    x, grad = torch.randn(1000), torch.randn(1000)
    torch.manual_seed(3)
    ours = run(U.dropout, x, grad=grad, p=0.3)
    torch.manual_seed(3)
    assert_same(ours, run(R.dropout, x, grad=grad, p=0.3))


def test_dropout_in_eval_has_the_expectation_of_dropout_in_training():
    x = torch.randn(1000)
    torch.testing.assert_close(U.dropout(x, 0.3, training=False), R.dropout(x, 0.3, training=False))


# -- adds and residuals --------------------------------------------------------------------------------------


ADD_SHAPES = {"same": ((6, 4), (6, 4)), "bias": ((4,), (6, 4)), "outer": ((6, 1, 4), (3, 4))}
MEANS = ["gmean", "hmean", "amean"]


@pytest.mark.parametrize(
    "constraint,shapes",
    [
        pytest.param(constraint, shapes, id=f"{name}-{constraint}")
        for name, shapes in ADD_SHAPES.items()
        for constraint in SHARED
        if name == "same" or constraint not in MEANS
    ],
)
def test_add_equals_the_reference(constraint, shapes):
    """Everywhere but a broadcast operand under a mean constraint (the next test)."""
    a, b = torch.randn(shapes[0]), torch.randn(shapes[1])
    grad = torch.randn(torch.broadcast_shapes(*shapes))
    assert_same(run(U.add, a, b, grad=grad, constraint=constraint), run(R.add, a, b, grad=grad, constraint=constraint))


@pytest.mark.parametrize("constraint", MEANS)
def test_constrained_add_of_a_bias_keeps_each_row_whatever_the_batch_where_the_references_does_not(constraint):
    """Deliberate: a mean constraint here reconciles the output scale with the two unit gradient scales; the
    reference's also takes each operand's broadcast count (``copies**-0.5``), which for a bias is the batch
    size, so its output rows change with the batch. Both give one scale to the output and both gradients, so
    both keep true gradients: a multiple of torch's sum and of its gradients (the bias's summed over rows)."""
    x, bias, grad = torch.randn(12, 4), torch.randn(4), torch.randn(12, 4)

    def first_rows(add, batch):
        return add(x[:batch], bias, constraint=constraint)[:3]

    torch.testing.assert_close(first_rows(U.add, 3), first_rows(U.add, 12))
    assert not torch.allclose(first_rows(R.add, 3), first_rows(R.add, 12))
    for add in (U.add, R.add):
        out, (x_grad, bias_grad) = run(add, x, bias, grad=grad, constraint=constraint)
        ratio = constant_ratio(out, x + bias)
        assert constant_ratio(x_grad, grad) == pytest.approx(ratio)
        assert constant_ratio(bias_grad, grad.sum(0)) == pytest.approx(ratio)


@pytest.mark.parametrize("constraint", ["to_output_scale", None])
def test_adding_one_element_leaves_the_scale_as_the_reference_does(constraint):
    x, offset = torch.randn(256, 64), torch.randn(())
    torch.testing.assert_close(U.add(x, offset, constraint=constraint), R.add(x, offset, constraint=constraint))


def test_adding_a_number_is_unscaled_in_both():
    x = torch.randn(64)
    torch.testing.assert_close(U.add(x, 2.0), R.add(x, 2.0))
    torch.testing.assert_close(U.add(-1.0, x), R.add(-1.0, x))


@pytest.mark.parametrize("ratio", [0.2, 1.0, 3.0])
def test_residual_split_and_add_equal_the_references_with_tau_as_a_variance_share(ratio):
    """Deliberate: ``tau`` is the branch's share of the variance, in (0, 1); the reference's is the ratio of the
    branch's scale to the skip's. ``share = ratio**2 / (1 + ratio**2)`` gives equal numbers."""
    share = ratio**2 / (1 + ratio**2)
    x, w, grad = torch.randn(8, 16), torch.randn(16, 16), torch.randn(8, 16)

    def block(split, add, tau):
        def f(x, w):
            branch, skip = split(x, tau)
            return add(U.linear(branch, w, constraint=None), skip, tau)

        return f

    assert_same(
        run(block(U.residual_split, U.residual_add, share), x, w, grad=grad),
        run(block(R.residual_split, R.residual_add, ratio), x, w, grad=grad),
    )


def test_residual_apply_is_split_then_add():
    x, w = torch.randn(8, 16), torch.randn(16, 16)
    expected = U.residual_add(U.linear(U.residual_split(x, 0.5)[0], w), x, 0.5)
    torch.testing.assert_close(U.residual_apply(lambda r: U.linear(r, w), x, 0.5), expected)


# -- norms, embedding, attention, losses ---------------------------------------------------------------------


@pytest.mark.parametrize("shape,normalized", [((6, 8), (8,)), ((2, 3, 4, 8), (4, 8))])
def test_layer_norm_equals_the_reference(shape, normalized):
    x, w, b = torch.randn(shape), torch.randn(normalized), torch.randn(normalized)
    grad = torch.randn(shape)
    assert_same(
        run(lambda x, w, b: U.layer_norm(x, normalized, w, b), x, w, b, grad=grad),
        run(lambda x, w, b: R.layer_norm(x, normalized, w, b), x, w, b, grad=grad),
    )


def test_rms_norm_equals_the_reference_at_the_same_eps():
    """With one ``eps`` both are ``x / sqrt(mean(x**2) + eps)``, equal to float32 rounding (the reference takes
    the root mean square in float32 whatever the dtype). Deliberate: this library's default ``eps`` is torch's
    (the dtype's machine epsilon), the reference's 1e-5."""
    x, w, grad = torch.randn(6, 8), torch.randn(8), torch.randn(6, 8)
    assert_same(
        run(lambda x, w: U.rms_norm(x, (8,), w, 1e-5), x, w, grad=grad),
        run(lambda x, w: R.rms_norm(x, (8,), w, 1e-5), x, w, grad=grad),
        rtol=1e-6,
        atol=1e-6,
    )


def test_embedding_equals_the_reference():
    table, idx = torch.randn(50, 8), torch.randint(0, 50, (4, 7))
    grad = torch.randn(4, 7, 8)
    assert_same(
        run(lambda t: U.embedding(idx, t), table, grad=grad), run(lambda t: R.embedding(idx, t), table, grad=grad)
    )


@pytest.mark.parametrize("mult", [1.0, 0.5, 4.0])
@pytest.mark.parametrize("is_causal", [True, False])
def test_umup_attention_weights_equal_the_references_output_differs_by_one_factor(mult, is_causal):
    """Deliberate: both use scores × ``mult / d_head``; the output scale comes from the weights' statistics here
    and from an interpolated model there, so the outputs differ by one factor."""
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    ours = U.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=mult / q.shape[-1])
    theirs = R.scaled_dot_product_attention(q, k, v, is_causal=is_causal, mult=mult)
    constant_ratio(ours, theirs)


def test_attention_query_and_key_gradients_are_unit_where_the_references_are_head_dim_to_minus_half():
    """Deliberate: the backward scale comes from the expected std of the q, k and v gradients; the reference
    uses its output scale for all of them, so its q and k gradients have std ``seq**-0.5`` (its own test)."""
    q, k, v = (torch.randn(256, 64, 64) for _ in range(3))
    grad = torch.randn(256, 64, 64)
    _, ours = run(U.scaled_dot_product_attention, q, k, v, grad=grad, constraint=None)
    _, theirs = run(R.scaled_dot_product_attention, q, k, v, grad=grad)
    assert [round(std(g), 1) for g in ours] == [1.0, 1.0, 1.0]
    assert [std(g) for g in theirs[:2]] == pytest.approx([64**-0.5] * 2, abs=0.03)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape", [(64,), (128, 64)])
def test_cross_entropy_loss_equals_torchs_in_both_and_gradients_differ_by_one_factor(reduction, shape):
    """Both keep torch's loss. Deliberate: the logits' gradient is divided by its expected std over ``n``
    classes (``≈ n**-0.5``); the reference multiplies by ``n / sqrt(n - 1)``: one constant apart."""
    logits = torch.randn(shape)
    target = torch.randint(0, 64, shape[:-1])
    (loss, (grad,)), (ref_loss, (ref_grad,)) = (
        run(U.cross_entropy, logits, target, reduction=reduction),
        run(R.cross_entropy, logits, target, reduction=reduction),
    )
    torch.testing.assert_close(loss, F.cross_entropy(logits, target, reduction=reduction))
    torch.testing.assert_close(ref_loss, loss)
    constant_ratio(grad, ref_grad)


def test_cross_entropy_with_ignored_targets_keeps_torchs_loss_where_the_reference_does_not():
    """Reference bug: its mean divides the summed loss by every target, ignored ones included."""
    logits, target = torch.randn(8, 5), torch.randint(0, 5, (8,))
    target[:4] = -100
    torch_loss = F.cross_entropy(logits, target)
    torch.testing.assert_close(U.cross_entropy(logits, target), torch_loss)
    torch.testing.assert_close(R.cross_entropy(logits, target), torch_loss / 2)


def test_umup_cross_entropy_multiplier_equals_the_references():
    logits, target = torch.randn(16, 10), torch.randint(0, 10, (16,))
    torch.testing.assert_close(U.cross_entropy(logits, target, mult=3.0), R.cross_entropy(logits, target, mult=3.0))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_mse_loss_equals_torchs_with_unit_gradients(reduction):
    a, b = torch.randn(2, 1024), torch.randn(2, 1024)
    (loss, grads), (ref_loss, _) = (
        run(U.mse_loss, a, b, reduction=reduction),
        run(R.mse_loss, a, b, reduction=reduction),
    )
    torch.testing.assert_close(loss, F.mse_loss(a, b, reduction=reduction))
    torch.testing.assert_close(loss, ref_loss)
    assert [round(std(g), 1) for g in grads] == [1.0, 1.0]


@pytest.mark.parametrize("kwargs", [{}, {"stride": 3}, {"padding": 5}, {"dilation": 2}, {"groups": 4}])
def test_conv1d_equals_the_reference(kwargs):
    groups = kwargs.get("groups", 1)
    x, w, b = torch.randn(4, 8, 40), torch.randn(12, 8 // groups, 5), torch.randn(12)
    ours, theirs = run(U.conv1d, x, w, b, constraint=None, **kwargs), run(R.conv1d, x, w, b, constraint=None, **kwargs)
    torch.testing.assert_close(ours[1][1], theirs[1][1])


@pytest.mark.parametrize("mult", [0.25, 1.0, 4.0])
def test_silu_glu_differs_from_the_references_by_one_factor_in_value_and_gradients(mult):
    """Deliberate: the scale is the exact RMS of ``x · silu(mult · g)`` (quadrature), where the reference
    interpolates a model. Both scale the two inputs' gradients like the output, so the gradients are true
    gradients of the scaled product in both, and the same factor apart as the values."""
    x, gate, grad = torch.randn(4096), torch.randn(4096), torch.randn(4096)
    (out, (gx, gg)), (ref_out, (ref_gx, ref_gg)) = (
        run(U.silu_glu, x, gate, grad=grad, mult=mult),
        run(R.silu_glu, x, gate, grad=grad, mult=mult),
    )
    ratio = constant_ratio(out, ref_out)
    assert constant_ratio(gx, ref_gx) == pytest.approx(ratio) and constant_ratio(gg, ref_gg) == pytest.approx(ratio)
    assert std(out) == pytest.approx(1, abs=0.05)


@pytest.mark.parametrize(
    "residual_mult,attn_ratio,blocks", [(1.0, 1.0, 2), (0.5, 1.0, 2), (1.0, 2.0, 2), (0.5, 1 / 3, 3)]
)
def test_residual_taus_are_the_references_depth_rule_as_variance_shares(residual_mult, attn_ratio, blocks):
    """The reference's own cases (core/test_functional.py). Deliberate: a share of the variance, not a ratio."""
    rule = uu.transformer_residual_scaling_rule(residual_mult, attn_ratio)
    ratios = torch.tensor([rule(i, 2 * blocks) for i in range(2 * blocks)])
    shares = torch.tensor(residual_taus(blocks, residual_mult, attn_ratio))
    torch.testing.assert_close(shares, ratios**2 / (1 + ratios**2))
    # The reference's properties: the contributions sum to 1, attention and MLP weigh as asked.
    scales = torch.ones(2 * blocks + 1)
    for i, tau in enumerate(shares.tolist()):
        scales[i + 1] *= tau**0.5
        scales[: i + 1] *= (1 - tau) ** 0.5
    torch.testing.assert_close(scales.pow(2).sum(), torch.tensor(1.0))
    attn, mlp = scales[1::2].pow(2).sum().sqrt(), scales[2::2].pow(2).sum().sqrt()
    torch.testing.assert_close(((attn**2 + mlp**2) / 2).sqrt() / scales[0], torch.tensor(residual_mult))
    torch.testing.assert_close(attn / mlp, torch.tensor(attn_ratio))


# -- modules -------------------------------------------------------------------------------------------------


def copy_weights(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    with torch.no_grad():
        for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters(), strict=True):
            assert p.shape == q.shape, name
            p.copy_(q)


def module_run(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor):
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    out = module(x)
    out.backward(grad)
    grads = [p.grad for p in module.parameters()] + ([x.grad] if x.is_floating_point() else [])
    return out.detach(), grads


@pytest.mark.parametrize(
    "ours,theirs,shape",
    [
        (lambda: unn.Linear(16, 8, constraint="to_output_scale"), lambda: uu.Linear(16, 8), (4, 16)),
        (lambda: unn.Linear(16, 8, constraint=None), lambda: uu.Linear(16, 8, constraint=None), (4, 16)),
        (lambda: unn.Embedding(20, 8), lambda: uu.Embedding(20, 8), None),
        (lambda: unn.RMSNorm(8, eps=1e-5), lambda: uu.RMSNorm(8, elementwise_affine=True), (4, 8)),
        (lambda: unn.LayerNorm(8), lambda: uu.LayerNorm(8, elementwise_affine=True), (4, 8)),
        (lambda: unn.LinearReadout(16, 8), lambda: uu.LinearReadout(16, 8), (4, 16)),
    ],
    ids=["nn.Linear", "nn.Linear_none", "Embedding", "RMSNorm", "LayerNorm", "LinearReadout"],
)
def test_modules_equal_the_references_on_the_same_weights(ours, theirs, shape):
    ours, theirs = ours().double(), theirs().double()
    copy_weights(ours, theirs)
    x = torch.randint(0, 20, (3, 5)) if shape is None else torch.randn(shape)
    grad = torch.randn(theirs(x).shape)
    # The reference's RMSNorm takes its root mean square in float32 (see test_rms_norm_...).
    tolerance = 1e-6 if isinstance(theirs, uu.RMSNorm) else 1e-10
    assert_same(module_run(ours, x, grad), module_run(theirs, x, grad), rtol=tolerance, atol=tolerance)


def test_conv1d_module_of_the_reference_ignores_its_constraint():
    """Reference bug: ``Conv1d.forward`` never passes ``self.constraint``, so every choice gives the default's
    (the input gradient shows it: the forward scale is the output's under both)."""
    x, grad = torch.randn(2, 8, 20), torch.randn(2, 12, 18)
    default, unconstrained = uu.Conv1d(8, 12, 3).double(), uu.Conv1d(8, 12, 3, constraint=None).double()
    copy_weights(unconstrained, default)
    (_, module_grads), (_, default_grads) = module_run(unconstrained, x, grad), module_run(default, x, grad)
    torch.testing.assert_close(module_grads[-1], default_grads[-1])
    _, (functional_grad, _) = run(R.conv1d, x, default.weight.detach(), grad=grad, constraint=None)
    assert not torch.allclose(functional_grad, default_grads[-1])


def test_reference_attention_drops_weights_in_eval_mode_ours_does_not():
    """Reference bug: ``MHSA.forward`` hands ``dropout_p`` to attention whatever ``self.training`` says."""
    theirs = uu.MHSA(16, 2, is_causal=True, dropout_p=0.5).double().eval()
    ours = unn.MHSA(16, 2, is_causal=True, dropout_p=0.5).double().eval()
    x = torch.randn(2, 6, 16)
    assert not torch.equal(theirs(x), theirs(x))
    torch.testing.assert_close(ours(x), ours(x))


@pytest.mark.parametrize("mult", [1.0, 2.0])
def test_umup_attention_module_differs_from_the_references_by_one_factor(mult):
    """Same layout of the fused projection, same scores; the output scale model differs (see above)."""
    ours, theirs = (
        unn.MHSA(16, 2, is_causal=True, constraint="to_output_scale", mult=mult).double(),
        uu.MHSA(16, 2, is_causal=True, mult=mult).double(),
    )
    copy_weights(ours, theirs)
    x = torch.randn(2, 6, 16)
    constant_ratio(ours(x), theirs(x))


@pytest.mark.parametrize(
    "name", ["Conv1d", "CrossEntropyLoss", "DepthSequential", "DepthModuleList", "TransformerDecoder"]
)
def test_modules_users_of_the_reference_look_for_exist(name):
    assert hasattr(unn, name)


def test_plain_unit_scaled_modules_train_with_the_umup_optimisers():
    optim.Adam(torch.nn.Sequential(unn.Linear(8, 8), unn.LayerNorm(8)).parameters(), lr=0.1)


def test_swiglu_module_differs_from_the_references_mlp_by_one_factor():
    """Same layout (up, gate, down); the gated product's scale differs (test_silu_glu_...)."""
    ours, theirs = unn.SwiGLU(16, constraint="to_output_scale").double(), uu.MLP(16).double()
    copy_weights(ours, theirs)
    x = torch.randn(4, 16)
    constant_ratio(ours(x), theirs(x))


def tagged(role: str, depth: int | None = None) -> torch.nn.Parameter:
    return tag(torch.nn.Parameter(torch.zeros(10)), role, depth=depth)


def test_roles_survive_deepcopy_and_pickle_as_the_references_do():
    """The reference's tests/test_parameter.py, translated: a role and a depth survive each copy."""
    param = tagged("weight", depth=8)
    for copied in (copy.deepcopy(param), pickle.loads(pickle.dumps(param))):
        assert role_of(copied) == role_of(param)


def test_roles_survive_pickle_then_deepcopy_as_the_references_do():
    param = tagged("weight", depth=8)
    assert role_of(copy.deepcopy(pickle.loads(pickle.dumps(param)))) == role_of(param)


# -- optimisers (the reference's tests/test_optim.py, translated) ---------------------------------------------


def twin_models(readout_constraint=None):
    """The reference's test model and ours, with the same weights."""
    theirs = torch.nn.Sequential(
        uu.Embedding(2**8, 2**4),
        uu.DepthSequential(*(uu.Linear(2**4, 2**4, bias=True) for _ in range(3))),
        uu.LinearReadout(2**4, 2**10, constraint=readout_constraint),
    ).double()
    ours = torch.nn.Sequential(
        unn.Embedding(2**8, 2**4),
        set_depth(
            torch.nn.Sequential(*(unn.Linear(2**4, 2**4, bias=True, constraint="to_output_scale") for _ in range(3))), 3
        ),
        unn.LinearReadout(2**4, 2**10),
    ).double()
    copy_weights(ours, theirs)
    return ours, theirs


@pytest.mark.parametrize(
    "ours_cls,theirs_cls,kwargs",
    [
        (optim.Adam, ropt.Adam, {"weight_decay": 1e-3}),
        (optim.AdamW, ropt.AdamW, {"weight_decay": 1e-3}),
        (optim.SGD, ropt.SGD, {"weight_decay": 1e-3, "momentum": 0.9}),
        (optim.SGD, ropt.SGD, {"readout_constraint": "to_output_scale"}),
    ],
    ids=["Adam", "AdamW", "SGD", "SGD_to_output_scale"],
)
def test_optimisers_take_the_references_steps_bit_for_bit(ours_cls, theirs_cls, kwargs):
    ours, theirs = twin_models(kwargs.get("readout_constraint"))
    opts = ours_cls(ours.parameters(), lr=0.1, **kwargs), theirs_cls(theirs.parameters(), lr=0.1, **kwargs)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=generator) for p in ours.parameters()]
        for model, opt in zip((ours, theirs), opts, strict=True):
            for p, g in zip(model.parameters(), grads, strict=True):
                p.grad = g.clone()
            opt.step()
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters(), strict=True):
        assert torch.equal(p, q), name


def test_learning_rates_equal_the_references_scaled_parameters():
    ours, theirs = twin_models()
    expected = [g["lr"] for g in ropt.scaled_parameters(theirs.parameters(), ropt.lr_scale_func_adam, lr=0.1)]
    assert [0.1 * s for s in optim.lr_scales(ours).values()] == pytest.approx(expected, rel=1e-12)


def test_a_tensor_learning_rate_is_scaled_per_parameter_and_stays_a_tensor():
    ours, _ = twin_models()
    opt = optim.Adam(ours.parameters(), lr=torch.tensor(0.1))
    assert all(isinstance(g["lr"], torch.Tensor) for g in opt.param_groups)


def test_optimisers_reduce_the_loss_as_the_references_test_asks():
    torch.manual_seed(100)
    inputs, outputs = torch.randn(10, 16), torch.randn(10, 25)
    for opt_cls in (optim.Adam, optim.AdamW, optim.SGD):
        model = unn.Linear(16, 25, constraint="to_output_scale").double()
        opt = opt_cls(model.parameters(), lr=0.01, weight_decay=1e-6)
        loss = F.mse_loss(model(inputs), outputs)
        loss.backward()
        opt.step()
        assert F.mse_loss(model(inputs), outputs) < loss


# -- number formats ------------------------------------------------------------------------------------------


def test_reference_formats_are_not_torchs_float8_ours_are():
    """Deliberate: FP8 here is torch's ``float8_e4m3fn`` / ``float8_e5m2`` bit for bit (what FP8 hardware
    computes). The reference's ``FPFormat`` uses the exponent bias ``2**(e - 1)`` with no inf or NaN
    codes (its E4M3 tops out at 240, not 448, and reaches a binade lower) and its round-to-nearest sends
    every tie towards zero, where torch's cast goes to the even neighbour."""
    from unit_scaling.formats import FPFormat as RF

    from unitscale.formats import FP8_E4M3, FP8_E5M2

    e4m3, e5m2 = RF(4, 3, rounding="nearest"), RF(5, 2, rounding="nearest")
    assert (e4m3.max_absolute_value, FP8_E4M3.max_value) == (240.0, 448.0)
    assert (e4m3.min_absolute_normal, FP8_E4M3.min_normal) == (2.0**-7, 2.0**-6)
    assert (e5m2.min_absolute_normal, FP8_E5M2.min_normal) == (2.0**-15, 2.0**-14)
    tie = torch.tensor([1.1875, 1.4375], dtype=torch.float32)  # midway: 1.125 and 1.25, 1.375 and 1.5
    assert e4m3.quantise(tie).tolist() == [1.125, 1.375]
    assert FP8_E4M3.round(tie).tolist() == tie.to(torch.float8_e4m3fn).float().tolist() == [1.25, 1.5]


def test_reference_format_quantises_float64_into_garbage_ours_rounds_it():
    """Reference bug: ``FPFormat.quantise`` converts to float32, then clips the original tensor instead and
    reads its float64 bits as int32: twice the elements, none of them rounded values."""
    from unit_scaling.formats import FPFormat as RF

    from unitscale.formats import FP8_E4M3

    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    assert RF(4, 3, rounding="nearest").quantise(x).shape == (6,)
    assert FP8_E4M3.round(x).tolist() == [1.0, 2.0, 3.0]


def test_reference_format_tests_hold_for_e2m1_under_its_bias():
    """The reference's tests/test_formats.py E2M1 case: its bias 2 and no reserved codes give the values
    ±{0, 0.25, ..., 3}; here E2M1 with infinities reserved (IEEE style, bias 1) has ±{0, 0.5, ..., 3}."""
    from unitscale.formats import FPFormat

    values = set(FPFormat(2, 1).round(torch.linspace(-4, 4, steps=1000, dtype=torch.float32)).abs().tolist())
    assert values == {0.0, 0.5, 1.0, 1.5, 2.0, 3.0}
    assert FPFormat(2, 1).max_value == uu.formats.FPFormat(2, 1).max_absolute_value == 3


# -- the reference's statistical tests (tests/test_functional.py, tests/test_modules.py), translated ---------


def unit(*tensors: torch.Tensor, abs: float = 0.1) -> bool:
    return all(std(t) == pytest.approx(1, abs=abs) for t in tensors)


def scaled_run(op, *shapes, **kwargs):
    """As the reference's tests: N(0, 1) inputs (a third tensor, a bias, starts at zero), N(0, 1) output grad."""
    torch.manual_seed(1)
    make = [torch.randn, torch.randn, torch.zeros]
    leaves = [make[min(i, 2)](s, dtype=torch.float32).requires_grad_() for i, s in enumerate(shapes)]
    out = op(*leaves, **kwargs)
    out.backward(torch.randn_like(out))
    return out.detach(), [leaf.grad for leaf in leaves]


@pytest.mark.parametrize("op", [U.gelu, U.silu])
def test_reference_activation_statistics_hold(op):
    out, (grad,) = scaled_run(op, (2**10,), constraint=None)
    assert unit(out, grad)
    out, (grad,) = scaled_run(op, (2**10,), constraint="to_output_scale")
    assert unit(out) and not unit(grad, abs=0.05)
    out, (grad,) = scaled_run(op, (2**10,), constraint="to_grad_input_scale")
    assert unit(grad) and not unit(out, abs=0.05)


def test_reference_matmul_and_linear_statistics_hold():
    out, grads = scaled_run(U.matmul, (2**8, 2**10), (2**10, 2**12), constraint=None)
    assert unit(out, *grads)
    out, grads = scaled_run(U.matmul, (2**8, 2**10), (2**10, 2**12), constraint="to_output_scale")
    assert unit(out) and not unit(*grads)
    for constraint, unit_ones in [(None, "oxwb"), ("to_output_scale", "owb"), ("to_grad_input_scale", "xwb")]:
        out, (gx, gw, gb) = scaled_run(U.linear, (2**8, 2**10), (2**12, 2**10), (2**12,), constraint=constraint)
        named = dict(zip("oxwb", (out, gx, gw, gb), strict=True))
        assert all(unit(named[key]) == (key in unit_ones) for key in "oxwb"), constraint
    out, (gx, gw, gb) = scaled_run(U.linear, (2**8, 2**10), (2**12, 2**10), (2**12,), constraint="gmean")
    assert unit(gw, gb) and not unit(out) and std(out) * std(gx) == pytest.approx(1, abs=0.1)


def test_reference_readout_statistics_hold():
    out, (_, gw) = scaled_run(U.linear_readout, (2**8, 2**10), (2**12, 2**10))
    assert unit(gw) and std(out) == pytest.approx(2**-5, abs=0.1)


def test_reference_norm_embedding_and_add_statistics_hold():
    out, grads = scaled_run(lambda x, w, b: U.layer_norm(x, (2**10,), w, b), (2**8, 2**10), (2**10,), (2**10,))
    assert unit(out, *grads)
    out, grads = scaled_run(lambda x, w: U.rms_norm(x, (2**10,), w), (2**8, 2**10), (2**10,))
    assert unit(out, *grads)
    out, grads = scaled_run(U.add, (2**8, 2**10), (2**8, 2**10), constraint=None)
    assert unit(out, *grads)
    out, grads = scaled_run(U.add, (2**8, 2**10), (2**8, 2**10), constraint="gmean")
    assert not unit(out, *grads) and std(out) * std(grads[0]) * std(grads[1]) == pytest.approx(1, abs=0.1)
    for shapes in [((2**10,), (2**8, 2**10)), ((2**4, 1, 2**10), (2**6, 2**10))]:
        out, grads = scaled_run(U.add, *shapes, constraint=None)
        assert unit(out, *grads)
    table = torch.randn(2**12, 2**6, requires_grad=True)
    out = U.embedding(torch.randint(0, 2**12, (2**4, 2**5)), table)
    out.backward(torch.randn_like(out))
    assert unit(out, table.grad)


def test_reference_add_of_a_zero_dim_tensor_keeps_unit_scale():
    out, (_, right) = scaled_run(U.add, (), (2**8, 2**10), constraint=None)
    assert unit(out, right)


@pytest.mark.parametrize("p", [0.01, 0.1, 0.5, 0.9, 0.99])
def test_reference_dropout_statistics_hold(p):
    out, (grad,) = scaled_run(U.dropout, (2**18,), p=p)
    assert unit(out, grad)


@pytest.mark.parametrize("ratio", [0.2, 1.0, 3.0])
def test_reference_residual_statistics_hold(ratio):
    x, w = torch.randn(2**10, requires_grad=True), torch.randn(2**10, 2**10)
    share = ratio**2 / (1 + ratio**2)
    branch, skip = U.residual_split(x, share)
    out = U.residual_add(U.linear(branch, w, constraint=None), skip, share)
    out.backward(torch.randn_like(out))
    assert unit(out, x.grad)


def test_reference_cross_entropy_statistics_hold():
    for reduction in ("mean", "sum"):
        for shape in [(2**8,), (2**12, 2**8)]:
            logits = torch.randn(shape, requires_grad=True)
            labels = torch.randint(0, 2**8, shape[:-1])
            loss = U.cross_entropy(logits, labels, reduction=reduction)
            torch.testing.assert_close(loss, F.cross_entropy(logits, labels, reduction=reduction))
            loss.backward()
            assert unit(logits.grad), (reduction, shape)


def test_reference_module_statistics_hold():
    torch.manual_seed(2)
    # With the reference's default constraint (test_default_constraint_is_gmean_...).
    gelu, silu = unn.GELU(constraint="to_output_scale"), unn.SiLU(constraint="to_output_scale")
    assert unit(gelu(torch.randn(2**10)), silu(torch.randn(2**10)), unn.Dropout()(torch.randn(2**12)))
    assert 0.1 < std(unn.Softmax(dim=0)(torch.randn(2**14))) < 10
    layer = unn.Linear(2**10, 2**12, bias=True, constraint="to_output_scale")
    assert unit(layer.weight) and torch.equal(layer.bias, torch.zeros(2**12))
    readout = unn.LinearReadout(2**10, 2**12)
    assert role_of(readout.weight).role == "readout"
    assert std(readout(torch.randn(2**8, 2**10))) == pytest.approx(2**-5, rel=0.1)
    x = torch.randn(2**8, 2**10, requires_grad=True)
    norm = unn.LayerNorm(2**10)
    out = norm(x)
    out.backward(torch.randn_like(out))
    assert unit(out, x.grad, norm.weight.grad, norm.bias.grad)


def test_reference_linear_and_readout_module_tests_hold():
    """tests/test_modules.py ``test_linear`` and ``test_linear_readout``: N(0, 1) weights, zero bias, an SGD
    step (the readout's constraint tied to its output) moves both."""
    layer = unn.Linear(2**10, 2**12, bias=True, constraint="to_output_scale")
    x = torch.randn(2**8, 2**10)
    out = layer(x)
    assert unit(layer.weight, out) and torch.equal(layer.bias, torch.zeros(2**12))
    before = [p.detach().clone() for p in layer.parameters()]
    out.backward(torch.randn_like(out))
    optim.SGD(layer.parameters(), lr=1.0, readout_constraint="to_output_scale").step()
    assert not unit(layer.weight) and all(
        not torch.equal(p, b) for p, b in zip(layer.parameters(), before, strict=True)
    )


def test_reference_conv1d_module_test_holds():
    """tests/test_modules.py ``test_conv1d``, under the reference's default constraint."""
    layer = unn.Conv1d(2**5 * 3, 2**5 * 5, 11, bias=True, constraint="to_output_scale")
    x = torch.randn(2**2, 2**5 * 3, 2**5 * 7)
    out = layer(x)
    assert unit(layer.weight, out) and torch.equal(layer.bias, torch.zeros(2**5 * 5))


def test_reference_cross_entropy_loss_module_test_holds():
    logits = torch.randn(2**12, 2**8, requires_grad=True)
    labels = torch.randint(0, 2**8, (2**12,))
    loss = unn.CrossEntropyLoss()(logits, labels)
    torch.testing.assert_close(loss, F.cross_entropy(logits, labels))
    loss.backward()
    assert unit(logits.grad)


def test_reference_depth_container_tests_hold():
    """tests/test_modules.py ``test_depth_module_list`` and ``test_depth_sequential``."""
    layers = unn.DepthModuleList([unn.Linear(10, 10, constraint="to_output_scale") for _ in range(5)])
    assert len(layers) == 5 and all(role_of(layer.weight).depth == 5 for layer in layers)
    model = unn.DepthSequential(*(unn.Linear(2**6, 2**6, constraint="to_output_scale") for _ in range(7)))
    assert all(role_of(p).depth == 7 for p in model.parameters())
    x = torch.randn(2**4, 2**6, requires_grad=True)
    out = model(x)
    out.backward(torch.randn_like(out))
    assert unit(out, x.grad)
    # The reference raises ValueError for plain torch modules; here a typed error that is one.
    for container in (
        lambda: unn.DepthModuleList([torch.nn.Linear(4, 4)]),
        lambda: unn.DepthSequential(torch.nn.Linear(4, 4)),
    ):
        with pytest.raises((ValueError, TypeError), match="role"):
            container()


def test_reference_transformer_decoder_test_holds():
    """tests/test_modules.py ``test_transformer_decoder`` (smaller). Its arguments by name: the reference takes
    ``(hidden_size, vocab_size, ...)``, this library ``(vocab_size, hidden_size, ...)``."""
    vocab = 2**10
    model = unn.TransformerDecoder(vocab_size=vocab, hidden_size=2**6, layers=2, heads=4, dropout_p=0.1)
    ids = torch.randint(0, vocab, (2**4, 2**5))
    loss = model.loss(ids)
    assert math.log(vocab) / 2 < loss.item() < math.log(vocab) * 2
    loss.backward()
    for name, p in model.named_parameters():
        assert 1 / 5 <= std(p.grad) <= 5, name
