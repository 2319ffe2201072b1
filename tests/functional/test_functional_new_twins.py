"""Unit-scaled twins of mean pooling, transposed convolution, interpolation, layer scale and MultiheadAttention.

Oracles: torch's own op (forward values up to one factor, gradient directions in float64),
hand-computed scales, and the std of unit-normal inputs' outputs and gradients.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import unitscale.functional as U

TRUE = 0.9999


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return F.cosine_similarity(a.flatten(), b.flatten(), dim=0).item()


def grads(fn, *tensors, grad=None):
    """Output and gradients of ``fn`` on fresh float64 leaf copies of ``tensors``."""
    leaves = [t.detach().double().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad if grad is not None else torch.randn(out.shape, dtype=out.dtype, generator=_gen()))
    return out.detach(), [leaf.grad for leaf in leaves]


def _gen():
    return torch.Generator().manual_seed(7)


def assert_proportional(a: torch.Tensor, b: torch.Tensor) -> None:
    """``a`` is ``b`` times one positive number."""
    factor = (a * b).sum() / (b * b).sum()
    assert factor > 0
    torch.testing.assert_close(a, factor * b)


def unit_stats(fn, *tensors):
    """Stds of the output and of each tensor's gradient for a unit-normal output gradient (float32)."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.randn_like(out))
    return out.std().item(), [leaf.grad.std().item() for leaf in leaves]


# -- mean pooling ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "dim", "keepdim"),
    [((64, 32, 8, 8), (2, 3), False), ((64, 32, 7, 7), (-2, -1), True), ((32, 50, 96), 1, False)],
)
def test_mean_pool_has_unit_output_and_gradient(shape, dim, keepdim):
    out, (gx,) = unit_stats(lambda x: U.mean(x, dim, keepdim, constraint=None), torch.randn(shape))
    assert out == pytest.approx(1, abs=0.08) and gx == pytest.approx(1, abs=0.08)
    # torch's own mean is n**-0.5 and its gradient 1/n: what the scales undo.
    n = math.prod(shape[d] for d in ((dim,) if isinstance(dim, int) else dim))
    assert torch.randn(shape).mean(dim).std().item() == pytest.approx(n**-0.5, rel=0.1)


@given(n=st.integers(2, 64), constraint=st.sampled_from(["gmean", "to_output_scale", "to_grad_input_scale"]))
@settings(max_examples=15, deadline=None)
def test_mean_pool_is_torchs_mean_times_hand_computed_scales(n, constraint):
    x = torch.randn(4, 3, n, dtype=torch.float64)
    out, (gx,) = grads(lambda t: U.mean(t, -1, constraint=constraint), x)
    ref, (ref_gx,) = grads(lambda t: t.mean(-1), x)
    expected = {"gmean": (n**0.5 * n) ** 0.5, "to_output_scale": n**0.5, "to_grad_input_scale": float(n)}[constraint]
    torch.testing.assert_close(out, ref * expected)
    torch.testing.assert_close(gx, ref_gx * expected)


def test_unconstrained_mean_scales_forward_by_root_n_and_backward_by_n():
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out, (gx,) = grads(lambda t: U.mean(t, (1, 2), constraint=None), x)
    ref, (ref_gx,) = grads(lambda t: t.mean((1, 2)), x)
    torch.testing.assert_close(out, ref * 30**0.5)
    torch.testing.assert_close(gx, ref_gx * 30)


# -- transposed convolution --------------------------------------------------------------------------

CONV_T = [
    {"stride": 2, "padding": 1},
    {"stride": 1, "padding": 0},
    {"stride": 3, "padding": 2, "output_padding": 1},
    {"stride": 2, "padding": 1, "groups": 4},
    {"stride": 2, "padding": 1, "dilation": 2},
]


@pytest.mark.parametrize("kwargs", CONV_T)
def test_conv_transpose2d_has_unit_output_and_gradients(kwargs):
    groups = kwargs.get("groups", 1)
    x, w = torch.randn(8, 32, 16, 16), torch.randn(32, 16 // groups, 4, 4)
    out, (gx, gw) = unit_stats(lambda a, b: U.conv_transpose2d(a, b, constraint=None, **kwargs), x, w)
    assert out == pytest.approx(1, abs=0.08) and gx == pytest.approx(1, abs=0.08) and gw == pytest.approx(1, abs=0.1)
    # torch's own transposed convolution is far off unit scale.
    assert F.conv_transpose2d(x, w, **kwargs).std().item() > 3


@pytest.mark.parametrize("kwargs", CONV_T)
@pytest.mark.parametrize("constraint", ["gmean", "to_output_scale"])
def test_conv_transpose2d_gradients_point_where_torchs_do(kwargs, constraint):
    groups = kwargs.get("groups", 1)
    x, w, b = torch.randn(2, 8, 5, 5), torch.randn(8, 8 // groups, 3, 3), torch.randn(8 // groups * groups)
    out, ours = grads(lambda *t: U.conv_transpose2d(*t, constraint=constraint, **kwargs), x, w, b)
    ref, theirs = grads(lambda *t: F.conv_transpose2d(*t, **kwargs), x, w, b)
    for name, a, r in zip("xwb", ours, theirs, strict=True):
        assert cosine(a, r) >= TRUE, name
    # The forward is torch's times one factor, the bias added unscaled.
    assert_proportional(out - b.view(-1, 1, 1), ref - b.view(-1, 1, 1))


# -- interpolation -----------------------------------------------------------------------------------

INTERPOLATIONS = [
    ((8, 16, 32, 32), {"scale_factor": 2}),
    ((8, 16, 32, 32), {"scale_factor": 2, "mode": "bilinear"}),
    ((8, 16, 32, 32), {"size": (45, 50), "mode": "bicubic", "align_corners": True}),
    ((8, 16, 32, 32), {"scale_factor": 0.5, "mode": "area"}),
    ((8, 16, 256), {"scale_factor": 3, "mode": "linear"}),
    ((2, 4, 8, 8, 8), {"scale_factor": 2, "mode": "trilinear"}),
]


@pytest.mark.parametrize(("shape", "kwargs"), INTERPOLATIONS)
def test_interpolate_has_unit_output_and_gradient(shape, kwargs):
    out, (gx,) = unit_stats(lambda x: U.interpolate(x, constraint=None, **kwargs), torch.randn(shape))
    assert out == pytest.approx(1, abs=0.05) and gx == pytest.approx(1, abs=0.05)


def test_nearest_upsampling_by_two_keeps_values_and_halves_gradients():
    # Hand-computed: each value is copied 4 times (forward 1), each input sums 4 gradients (backward 1/2).
    x = torch.randn(2, 3, 4, 4, dtype=torch.float64)
    out, (gx,) = grads(lambda t: U.interpolate(t, scale_factor=2, constraint=None), x)
    ref, (ref_gx,) = grads(lambda t: F.interpolate(t, scale_factor=2), x)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(gx, ref_gx / 2)


@pytest.mark.parametrize(("shape", "kwargs"), INTERPOLATIONS)
def test_interpolate_gradient_points_where_torchs_does(shape, kwargs):
    x = torch.randn(*shape[:2], *(max(s // 4, 3) for s in shape[2:]))
    out, (gx,) = grads(lambda t: U.interpolate(t, **kwargs), x)
    ref, (ref_gx,) = grads(lambda t: F.interpolate(t, **kwargs), x)
    assert cosine(gx, ref_gx) >= TRUE
    assert_proportional(out, ref)


# -- layer scale -------------------------------------------------------------------------------------


def test_layer_scale_of_a_unit_gain_has_unit_output_and_gradients():
    out, (gx, gg) = unit_stats(U.layer_scale, torch.randn(64, 196, 96), torch.ones(96))
    assert out == pytest.approx(1, abs=0.05) and gx == pytest.approx(1, abs=0.05) and gg == pytest.approx(1, abs=0.2)
    # torch's own product: the gain's gradient sums 64 * 196 unit terms.
    _, (_, torch_gg) = unit_stats(lambda a, b: a * b, torch.randn(64, 196, 96), torch.ones(96))
    assert torch_gg == pytest.approx((64 * 196) ** 0.5, rel=0.2)


def test_layer_scale_is_torchs_product_with_true_gradient_directions():
    x, gamma = torch.randn(4, 8, 5, 5), torch.randn(8, 1, 1)
    out, ours = grads(U.layer_scale, x, gamma)
    ref, theirs = grads(lambda a, b: a * b, x, gamma)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(ours[0], theirs[0])
    assert cosine(ours[1], theirs[1]) >= TRUE
    torch.testing.assert_close(ours[1], theirs[1] / 100**0.5)  # 4 * 5 * 5 copies


# -- multi-head attention ----------------------------------------------------------------------------


def mha_args(x, w_in, b_in, w_out, b_out, **kwargs):
    return (x, x, x, x.shape[-1], 4, w_in, b_in, None, None, False, 0.0, w_out, b_out), kwargs


def test_multi_head_attention_has_unit_output_and_input_gradient():
    x, w_in, w_out = torch.randn(64, 32, 64), torch.randn(192, 64), torch.randn(64, 64)
    out, (gx,) = unit_stats(
        lambda t: U.multi_head_attention_forward(
            t, t, t, 64, 4, w_in, None, None, None, False, 0.0, w_out, None, need_weights=False, constraint=None
        ),
        x,
    )
    assert out == pytest.approx(1, abs=0.15) and gx == pytest.approx(1, abs=0.3)
    ref, _ = F.multi_head_attention_forward(x, x, x, 64, 4, w_in, None, None, None, False, 0.0, w_out, None)
    assert ref.std().item() > 5  # torch's own, with unit-normal weights


@pytest.mark.parametrize(
    "kwargs",
    [
        {"need_weights": False},
        {"need_weights": True},
        {"need_weights": False, "key_padding_mask": "pad"},
        {"need_weights": False, "attn_mask": "causal", "is_causal": True},
    ],
)
@pytest.mark.parametrize(
    ("self_attention", "constraint"), [(True, "to_output_scale"), (True, "gmean"), (False, "to_output_scale")]
)
def test_multi_head_attention_gradients_point_where_torchs_do(kwargs, self_attention, constraint):
    length, batch, embed = 6, 3, 16
    kwargs = dict(kwargs)
    if kwargs.get("key_padding_mask") == "pad":
        mask = torch.zeros(batch, length, dtype=torch.bool)
        mask[0, -2:] = True
        kwargs["key_padding_mask"] = mask
    if kwargs.get("attn_mask") == "causal":
        kwargs["attn_mask"] = torch.ones(length, length, dtype=torch.bool).triu(1)
    x, memory = torch.randn(length, batch, embed), torch.randn(length, batch, embed)
    params = [torch.randn(3 * embed, embed), torch.randn(3 * embed), torch.randn(embed, embed), torch.randn(embed)]

    def ours(q, kv, w_in, b_in, w_out, b_out):
        k = q if self_attention else kv
        return U.multi_head_attention_forward(q, k, k, embed, 4, w_in, b_in, None, None, False, 0.0, w_out, b_out,
                                              constraint=constraint, **kwargs)[0]  # fmt: skip

    def torchs(q, kv, w_in, b_in, w_out, b_out):
        # The twin computes torch's attention with each weight times its linear's forward scale (hand-computed:
        # fan-in**-0.5, or under gmean the packed (3E, E) projection's (E**-0.5 * (3E)**-0.5)**0.5), and one factor
        # on the attention's output before the output projection, which moves no gradient's direction.
        k = q if self_attention else kv
        in_scale = embed**-0.5 if constraint == "to_output_scale" else (embed**-0.5 * (3 * embed) ** -0.5) ** 0.5
        return F.multi_head_attention_forward(q, k, k, embed, 4, w_in * in_scale, b_in, None, None, False, 0.0,
                                              w_out / embed**0.5, b_out, **kwargs)[0]  # fmt: skip

    out, mine = grads(ours, x, memory, *params)
    ref, theirs = grads(torchs, x, memory, *params)
    names = ["query", "memory", "in_proj_weight", "in_proj_bias", "out_proj_weight", "out_proj_bias"]
    for name, a, r in zip(names, mine, theirs, strict=True):
        if name == "memory" and self_attention:
            continue
        assert cosine(a, r) >= TRUE, name
    assert_proportional(out - params[3], ref - params[3])


def test_multi_head_attention_refuses_what_it_does_not_scale_by_name():
    x, w_in, w_out = torch.randn(4, 2, 8), torch.randn(24, 8), torch.randn(8, 8)
    with pytest.raises(ValueError, match="multi_head_attention_forward: add_zero_attn"):
        U.multi_head_attention_forward(x, x, x, 8, 2, w_in, None, None, None, True, 0.0, w_out, None)
    with pytest.raises(ValueError, match="multi_head_attention_forward: bias_k"):
        U.multi_head_attention_forward(x, x, x, 8, 2, w_in, None, torch.zeros(1, 1, 8), None, False, 0.0, w_out, None)


# -- recurrent layers: LSTM, GRU, RNN ---------------------------------------------------------------

RNNS = {  # twin, torch's op, gates per weight, h's stationary RMS as documented
    "lstm": (U.lstm, torch.lstm, 4, 0.19),
    "gru": (U.gru, torch.gru, 3, 0.41),
    "rnn_tanh": (U.rnn_tanh, torch.rnn_tanh, 1, 0.68),
    "rnn_relu": (U.rnn_relu, torch.rnn_relu, 1, 1.0),
}


def rnn_params(gates, layers, directions, inputs, hidden, biases=True):
    params = []
    for layer in range(layers):
        fan_in = inputs if layer == 0 else hidden * directions
        for _ in range(directions):
            params += [torch.randn(gates * hidden, fan_in), torch.randn(gates * hidden, hidden)]
            if biases:
                params += [torch.randn(gates * hidden), torch.randn(gates * hidden)]
    return params


def state(cell, h, c):
    return (h, c) if cell == "lstm" else h


def rms(t: torch.Tensor) -> float:
    return t.pow(2).mean().sqrt().item()


@pytest.mark.parametrize("cell", list(RNNS))
def test_recurrent_twins_have_unit_output_and_gradients(cell):
    """Before: the LSTM's input gradient had std 3.6 here (16 inputs, 128 units); GRU and RNN had no twin."""
    twin, _, gates, _ = RNNS[cell]
    h0 = torch.zeros(1, 32, 128)
    x, params = torch.randn(32, 32, 16, requires_grad=True), rnn_params(gates, 1, 1, 16, 128)
    params = [p.requires_grad_() if p.dim() == 2 else p.zero_().requires_grad_() for p in params]
    out = twin(x, state(cell, h0, h0), params, True, 1, 0.0, True, False, False, constraint=None)[0]
    out.backward(torch.randn_like(out))
    # ReLU's h climbs to its stationary RMS over the first steps from h_0 = 0 (halving the gap per step)
    assert rms(out) == pytest.approx(1, abs=0.1 if cell == "rnn_relu" else 0.05)
    assert x.grad.std().item() == pytest.approx(1, abs=0.05)
    w_ih, w_hh, b_ih, b_hh = (p.grad.std().item() for p in params)
    assert w_ih == pytest.approx(1, abs=0.1) and w_hh == pytest.approx(1, abs=0.2)
    # a bias: 128 numbers, each a sum over steps the recurrence correlates (1.6 for an LSTM, as documented)
    assert 0.7 < b_ih < 1.8 and 0.7 < b_hh < 1.8


@pytest.mark.parametrize("cell", list(RNNS))
def test_documented_rms_is_torchs_own_cell_at_unit_scale(cell):
    """The RMS the twins divide by, against torch's own kernel on weights over the root of their fan-in."""
    _, torch_fn, gates, documented = RNNS[cell]
    x, h0 = torch.randn(48, 32, 16), torch.zeros(1, 32, 192)
    params = [w / w.shape[-1] ** 0.5 for w in rnn_params(gates, 1, 1, 16, 192, biases=False)]
    out = torch_fn(x, state(cell, h0, h0), params, False, 1, 0.0, False, False, False)[0]
    assert rms(out[16:]) == pytest.approx(documented, rel=0.06)  # past the first steps, at its stationary point


def torch_scaled(cell, x, hx, params, flags):
    """By hand, torch's op: weights over the root of their fan-in, a deeper layer's W_ih also over h's RMS,
    h_0 in output units; the output and h_n times 1 / RMS."""
    _, torch_fn, _, _ = RNNS[cell]
    from unitscale.functional._recurrent import _stationary

    h_rms = _stationary(cell)[0] ** 0.5
    has_biases, layers, _, _, bidirectional, _ = flags
    per, first = (4 if has_biases else 2), (4 if has_biases else 2) * (2 if bidirectional else 1)
    weights = []
    for i, p in enumerate(params):
        if i % per == 0:
            p = p / p.shape[-1] ** 0.5 / (h_rms if i >= first else 1.0)
        elif i % per == 1:
            p = p / p.shape[-1] ** 0.5
        weights.append(p)
    hx = (hx[0] * h_rms, hx[1]) if cell == "lstm" else hx * h_rms
    out, h_n, *c_n = torch_fn(x, hx, weights, *flags)
    return (out / h_rms, h_n / h_rms, *c_n)


@pytest.mark.parametrize("cell", list(RNNS))
@pytest.mark.parametrize(("layers", "bidirectional", "batch_first"), [(1, False, False), (2, True, True)])
def test_recurrent_twins_are_torchs_op_times_the_documented_scale(cell, layers, bidirectional, batch_first):
    """Unconstrained, the forward is torch's op on the scaled weights (by hand), every output; each tensor's
    gradient points where torch's autograd of that function points (a positive multiple: cut edges, and the
    input's own scale)."""
    twin, _, gates, _ = RNNS[cell]
    directions = 2 if bidirectional else 1
    x = torch.randn(2, 5, 4) if batch_first else torch.randn(5, 2, 4)
    h0, c0 = torch.randn(layers * directions, 2, 6), torch.randn(layers * directions, 2, 6)
    params = rnn_params(gates, layers, directions, 4, 6)
    flags = (True, layers, 0.0, True, bidirectional, batch_first)
    weights = [torch.randn(3, dtype=torch.float64) for _ in range(3)]  # one loss reading every output

    def loss(outs):
        return sum((t * w.mean()).sum() + t.pow(2).sum() * w[0] for t, w in zip(outs, weights, strict=False))

    def ours(x, h, c, *p):
        return loss(twin(x, state(cell, h, c), list(p), *flags, constraint=None))

    def torchs(x, h, c, *p):
        return loss(torch_scaled(cell, x, state(cell, h, c), list(p), flags))

    as64 = [t.double() for t in (x, h0, c0, *params)]
    mine = twin(as64[0], state(cell, *as64[1:3]), as64[3:], *flags, constraint=None)
    for a, b in zip(mine, torch_scaled(cell, as64[0], state(cell, *as64[1:3]), as64[3:], flags), strict=True):
        torch.testing.assert_close(a, b)
    one = torch.tensor(1.0, dtype=torch.float64)
    _, got = grads(ours, x, h0, c0, *params, grad=one)
    _, expected = grads(torchs, x, h0, c0, *params, grad=one)
    for i, (a, r) in enumerate(zip(got, expected, strict=True)):
        if r is None:  # c_0 of a GRU or an RNN
            continue
        assert cosine(a, r) >= TRUE and (a * r).sum() > 0, i


@pytest.mark.parametrize("cell", list(RNNS))
def test_recurrent_gradients_against_finite_differences(cell):
    """float64, finite differences of the twin's own forward: with ``gmean`` the input's and ``h_0``'s
    gradients are exactly the true ones (gradcheck); unconstrained, the input's is a positive multiple of it."""
    twin, _, gates, _ = RNNS[cell]
    x, h0, c0 = (torch.randn(*shape, dtype=torch.float64) for shape in ((3, 2, 3), (1, 2, 2), (1, 2, 2)))
    params = [p.double() for p in rnn_params(gates, 1, 1, 3, 2)]
    weights = torch.randn(3, 2, 2, dtype=torch.float64)

    def run(x, h, c, constraint):
        out, h_n, *_ = twin(x, state(cell, h, c), params, True, 1, 0.0, True, False, False, constraint=constraint)
        return out * weights, h_n

    inputs = tuple(t.clone().requires_grad_() for t in (x, h0, c0))
    assert torch.autograd.gradcheck(lambda x, h, c: run(x, h, c, "gmean"), inputs[:3] if cell == "lstm" else
                                    (inputs[0], inputs[1], c0))  # fmt: skip

    leaf = x.clone().requires_grad_()
    run(leaf, h0, c0, None)[0].sum().backward()
    eps, fd = 1e-6, torch.zeros_like(x)
    for i in range(x.numel()):
        step = torch.zeros(x.numel(), dtype=x.dtype)
        step[i] = eps
        step = step.view_as(x)
        fd.view(-1)[i] = (run(x + step, h0, c0, None)[0].sum() - run(x - step, h0, c0, None)[0].sum()) / (2 * eps)
    assert cosine(leaf.grad, fd) > 1 - 1e-9 and (leaf.grad * fd).sum() > 0


@pytest.mark.parametrize("cell", list(RNNS))
def test_recurrent_twins_refuse_packed_sequences_by_name(cell):
    twin = RNNS[cell][0]
    with pytest.raises(ValueError, match=f"{cell}: packed sequences"):
        # torch's packed form: (data, batch_sizes, hx, params, has_biases, layers, dropout, train, bidirectional)
        packed = [torch.zeros(1, 2, 4)] if cell == "lstm" else torch.zeros(1, 2, 4)
        twin(torch.randn(6, 4), torch.tensor([2, 2, 2]), packed, [], True, 1, 0.0, False, False)  # type: ignore[arg-type]
