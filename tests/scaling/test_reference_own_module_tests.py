"""The reference's own tests of modules, optimisers and parameters, translated to this API.

unit-scaling 0.3.5's ``tests/test_modules.py``, ``tests/test_optim.py`` and ``tests/test_parameter.py``,
one test of ours per test of theirs and of the same name, under its seed (1472) and tolerances (its ops'
tests are in ``test_reference_own_tests.py``; ``reference_ledger.py`` sorts them all). Where this library
differs on purpose the test pins the difference with its measured numbers and says why in its docstring;
``docs/against-the-reference.md`` measures the same numbers while the site builds.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import unit_scaling as uu
import unit_scaling.optim as ropt

import unitscale.functional as U
from unitscale import nn as unn
from unitscale import optim
from unitscale.errors import UntaggedParameterError
from unitscale.scaling import role_of, tag

from .reference_ledger import DIFFERENCES, NO_COUNTERPART, OUTSIDE, REFERENCE_TESTS
from .test_reference_own_tests import assert_not_unit, assert_scale, leaf, tau_share, unit_backward


@pytest.fixture(autouse=True)
def reference_seed():
    torch.manual_seed(1472)


def std(t: torch.Tensor) -> float:
    return t.detach().std().item()


def sgd_step(model: torch.nn.Module, **kwargs) -> None:
    optim.SGD(model.parameters(), lr=1, **kwargs).step()


DEFAULT_WHY = """
    This library's modules default to ``constraint="gmean"`` (unit scaling's default, Blake et al.: the
    output and the input gradient miss 1 by one factor, in opposite directions); the reference's to
    ``"to_output_scale"``, under which ours give 1 too (asserted)."""


# -- test_modules.py ---------------------------------------------------------------------------------------


def test_gelu():
    """Output std 0.86 under the default ``gmean`` (the reference asks 1 within 0.1, and gives it)."""
    x = torch.randn(2**10)
    assert std(uu.GELU()(x)) == pytest.approx(1, abs=0.1)
    assert std(unn.GELU(constraint="to_output_scale")(x)) == pytest.approx(1, abs=0.1)
    assert std(unn.GELU()(x)) == pytest.approx(0.86, abs=0.03)


def test_silu():
    """Output std 0.88 under the default ``gmean`` (the reference asks 1 within 0.1, and gives it)."""
    x = torch.randn(2**10)
    assert std(uu.SiLU()(x)) == pytest.approx(1, abs=0.1)
    assert std(unn.SiLU(constraint="to_output_scale")(x)) == pytest.approx(1, abs=0.1)
    assert std(unn.SiLU()(x)) == pytest.approx(0.88, abs=0.03)


def test_softmax():
    assert 0.1 < std(unn.Softmax(dim=0)(torch.randn(2**14))) < 10


def test_dropout():
    """Unit output (as the reference). The reference refuses ``Dropout(inplace=True)``; this library's
    module does what torch's does (the functional test checks the in-place result)."""
    x = leaf(2**12)
    assert std(unn.Dropout()(x)) == pytest.approx(1, abs=0.1)
    with pytest.raises(ValueError):
        uu.Dropout(0.5, inplace=True)
    y = torch.randn(2**12)
    assert unn.Dropout(0.5, inplace=True)(y) is y


def layer_then_sgd(model, x, **sgd):
    out = model(x)
    unit_backward(out)
    sgd_step(model, **sgd)
    return out


def test_linear():
    """Output std 0.71 where the reference asks 1: ``gmean`` of the forward scale ``1024**-0.5`` and the
    backward ``4096**-0.5`` is ``2048**-0.5``, and ``32 / 2048**0.5`` is 0.71."""
    x = leaf(2**8, 2**10)
    model = unn.Linear(2**10, 2**12, bias=True)
    assert_scale(model.weight)
    assert torch.all(model.bias == 0)
    to_output = unn.Linear(2**10, 2**12, constraint="to_output_scale")
    to_output.weight.data.copy_(model.weight.data)
    assert std(to_output(x)) == pytest.approx(1, abs=0.1)
    out = layer_then_sgd(model, x, readout_constraint="to_output_scale")
    assert out.shape == (2**8, 2**12)
    assert std(out) == pytest.approx(0.71, abs=0.03)
    assert_not_unit(model.weight)
    assert torch.any(model.bias != 0)


def test_conv1d():
    """Output std 0.89 where the reference asks 1 (``gmean`` of the forward scale, from 192 channels in,
    and the backward, from 320 out: ``(320 / 192) ** -0.25`` is 0.88). The reference's shapes, with a
    batch of 2**3 for its 2**6 (a million outputs still)."""
    d_in, d_out = 2**6 * 3, 2**6 * 5
    x = leaf(2**3, d_in, 2**6 * 7)
    model = unn.Conv1d(d_in, d_out, 11, bias=True)
    assert_scale(model.weight)
    assert torch.all(model.bias == 0)
    to_output = unn.Conv1d(d_in, d_out, 11, constraint="to_output_scale")
    to_output.weight.data.copy_(model.weight.data)
    assert std(to_output(x)) == pytest.approx(1, abs=0.1)
    out = layer_then_sgd(model, x, readout_constraint="to_output_scale")
    assert std(out) == pytest.approx(0.89, abs=0.03)
    assert_not_unit(model.weight)
    assert torch.any(model.bias != 0)


def test_linear_readout():
    """The reference's ``mup_type == "output"`` is this library's role ``readout``."""
    model = unn.LinearReadout(2**10, 2**12)
    assert role_of(model.weight).role == "readout"
    assert_scale(model.weight)
    out = layer_then_sgd(model, leaf(2**8, 2**10))
    assert out.shape == (2**8, 2**12)
    assert std(out) == pytest.approx(2**-5, rel=0.1)
    assert_not_unit(model.weight)


def test_layer_norm():
    x = leaf(2**8, 2**10)
    model = unn.LayerNorm(2**10, elementwise_affine=True)
    out = layer_then_sgd(model, x)
    assert out.shape == (2**8, 2**10)
    assert_scale(out, x.grad, model.weight.grad, model.bias.grad)


def test_rms_norm():
    x = leaf(2**8, 2**10)
    model = unn.RMSNorm(2**10, elementwise_affine=True)
    out = layer_then_sgd(model, x)
    assert out.shape == (2**8, 2**10) and model.weight is not None
    assert_scale(out, x.grad, model.weight.grad)


def test_embedding():
    """A unit table gradient (as the reference). The reference's ``Embedding`` takes ``scale_grad_by_freq``
    and ``sparse`` only to refuse them (``ValueError``); this library's has no such arguments (a
    ``TypeError``, as for any unknown argument), and its functional ``embedding`` passes them to torch."""
    idx = torch.randint(0, 2**12, (2**4, 2**5))
    model = unn.Embedding(2**12, 2**6)
    out = model(idx)
    assert out.shape == (2**4, 2**5, 2**6)
    unit_backward(out)
    assert_scale(model.weight.grad)
    for kwargs in ({"scale_grad_by_freq": True}, {"sparse": True}):
        with pytest.raises(ValueError):
            uu.Embedding(2**12, 2**6, **kwargs)
        with pytest.raises(TypeError):
            unn.Embedding(2**12, 2**6, **kwargs)


def test_cross_entropy_loss():
    """A unit logit gradient (as the reference). The reference refuses ``weight`` and ``label_smoothing``;
    this library's module gives torch's loss with them."""
    x, labels = leaf(2**12, 2**8), torch.randint(0, 2**8, (2**12,))
    unn.CrossEntropyLoss()(x, labels).backward()
    assert_scale(x.grad)
    for kwargs in ({"weight": torch.rand(2**8)}, {"label_smoothing": 0.5}):
        with pytest.raises(ValueError):
            uu.CrossEntropyLoss(**kwargs)
        expected = torch.nn.CrossEntropyLoss(**kwargs)(x, labels)
        assert unn.CrossEntropyLoss(**kwargs)(x, labels) == expected


def test_mlp():
    """The reference's ``MLP`` is a gated (SiLU-GLU) block: here :class:`~unitscale.nn.SwiGLU`, which
    mirrors its scales as the reference's does (its ``MLP`` is the GELU block)."""
    model = unn.SwiGLU(2**10)
    weights = [model.up.weight, model.gate.weight, model.down.weight]
    assert_scale(*weights)
    out = layer_then_sgd(model, leaf(2**8, 2**10), readout_constraint="to_output_scale")
    assert out.shape == (2**8, 2**10)
    assert std(out) == pytest.approx(1, abs=0.2)
    assert_scale(*(w.grad for w in weights))
    assert_not_unit(*weights)


def test_mhsa():
    model = unn.MHSA(2**6, heads=8, is_causal=False, dropout_p=0.1)
    assert_scale(model.linear_qkv.weight, model.linear_o.weight)
    out = layer_then_sgd(model, leaf(2**8, 2**6, 2**6), readout_constraint="to_output_scale")
    assert out.shape == (2**8, 2**6, 2**6)
    assert std(out) == pytest.approx(1, abs=0.5)
    assert_not_unit(model.linear_qkv.weight, model.linear_o.weight)


def test_transformer_layer():
    """Output std 0.85 where the reference asks 1: the attention's projections take the default ``gmean``.
    The reference's taus 0.1 and 1 (ratios) are the shares ``t²/(1+t²)``; its layer's MLP is gated."""
    x = leaf(2**8, 2**6, 2**6)
    kwargs = dict(heads=8, is_causal=False, dropout_p=0.1, mlp="swiglu", attn_tau=tau_share(0.1), mlp_tau=0.5)
    model = unn.TransformerLayer(2**6, **kwargs)
    to_output = unn.TransformerLayer(2**6, constraint="to_output_scale", **kwargs)
    to_output.load_state_dict(model.state_dict())
    assert std(to_output(x)) == pytest.approx(1, abs=0.1)
    out = layer_then_sgd(model, x)
    assert out.shape == (2**8, 2**6, 2**6)
    assert std(out) == pytest.approx(0.85, abs=0.03)


for _test in (test_gelu, test_silu, test_linear, test_conv1d, test_transformer_layer):
    _test.__doc__ += DEFAULT_WHY


def test_depth_module_list():
    """The reference's ``mup_scaling_depth`` is the ``depth`` of this library's role; a plain torch
    layer is refused with :class:`~unitscale.errors.UntaggedParameterError` (a ``TypeError``, where the
    reference raises ``ValueError``: it is the wrong kind of module, not a wrong value)."""
    layers = unn.DepthModuleList([unn.Linear(10, 10) for _ in range(5)])
    assert len(layers) == 5 and all(role_of(layer.weight).depth == 5 for layer in layers)
    with pytest.raises(UntaggedParameterError):
        unn.DepthModuleList([torch.nn.Linear(10, 10) for _ in range(5)])


def test_depth_sequential():
    """As ``test_depth_module_list``: the depth on every parameter's role, a plain layer refused."""
    model = unn.DepthSequential(*(unn.Linear(2**6, 2**6) for _ in range(7)))
    assert all(role_of(p) is not None and role_of(p).depth == 7 for p in model.parameters())
    x = leaf(2**4, 2**6)
    out = model(x)
    unit_backward(out)
    assert_scale(out, x.grad)
    with pytest.raises(UntaggedParameterError):
        unn.DepthSequential(*(torch.nn.Linear(2**6, 2**6) for _ in range(7)))


def test_transformer_decoder():
    """The arguments are ``(vocab_size, hidden_size, ...)`` here, ``(hidden_size, vocab_size, ...)`` there.
    A batch of 2**4 sequences for the reference's 2**8 (its logits take a gigabyte with their gradient)."""
    vocab = 2**12
    ids = torch.randint(0, vocab, (2**4, 2**6))
    model = unn.TransformerDecoder(vocab, 2**6, layers=2, heads=4, dropout_p=0.1)
    loss = model.loss(ids)
    expected = torch.tensor(vocab).log().item()
    assert expected / 2 < loss.item() < expected * 2
    loss.backward()
    sgd_step(model)
    for name, p in model.named_parameters():
        assert 1 / 5 <= std(p.grad) <= 5, name


# -- test_optim.py -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("opt_type", [optim.Adam, optim.AdamW, optim.SGD])
def test_optim_optimizers(opt_type):
    torch.manual_seed(100)
    inputs, targets = torch.randn(10, 16), torch.randn(10, 25)
    model = unn.Linear(16, 25)
    opt = opt_type(model.parameters(), lr=0.01, weight_decay=1e-6)
    opt.zero_grad()
    loss = U.mse_loss(model(inputs), targets)
    loss.backward()
    opt.step()
    assert U.mse_loss(model(inputs), targets) < loss


@pytest.mark.parametrize("rule", ["adam", "sgd", "sgd_to_output_scale"])
def test_scaled_parameters(rule):
    """The reference's ``scaled_parameters(params, lr_scale_func_*)`` is ``param_groups(params, rule=...)``;
    its ``readout_constraint="to_output_scale"`` with SGD is the rule ``sgd_to_output_scale`` (and
    ``"adam"`` with it, which the reference also tests, is the ``adam`` rule: the readout's constraint does
    not change Adam's rates, so that case is the first one)."""
    readout_constraint = "to_output_scale" if rule == "sgd_to_output_scale" else None
    model = torch.nn.Sequential(
        unn.Embedding(2**8, 2**4),
        unn.DepthSequential(*(unn.Linear(2**4, 2**4, bias=True) for _ in range(3))),
        unn.LinearReadout(2**4, 2**10, constraint=readout_constraint),
    )
    base_lr, base_wd, sqrt_d = 0.1, 0.001, 3**0.5
    expected = {
        (2**8, 2**4): base_lr / 2**2,
        (2**4, 2**4): base_lr / 2**2 / sqrt_d,
        (2**4,): base_lr / sqrt_d,
        (2**10, 2**4): base_lr,
    }
    if rule == "sgd_to_output_scale":
        for shape in [(2**8, 2**4), (2**4, 2**4), (2**4,)]:
            expected[shape] *= 2**4
    groups = optim.param_groups(model.parameters(), lr=base_lr, weight_decay=base_wd, rule=rule)
    seen = set()
    for group in groups:
        for param in group["params"]:
            seen.add(tuple(param.shape))
            assert group["lr"] == pytest.approx(expected[tuple(param.shape)], rel=1e-3), param.shape
            assert group["weight_decay"] == pytest.approx(base_wd / group["lr"], rel=1e-3)
    assert seen == set(expected)


def test_scaled_parameters_with_existing_groups():
    """Groups keep their own ``lr`` and ``weight_decay`` and a tensor ``lr`` stays a tensor (as the
    reference); an untagged parameter is refused unless allowed. One difference: ``lr`` is a required
    argument here, even when every group has its own (the reference then accepts none): it is the global
    rate the u-μP rules multiply, and one signature for every call keeps a missing group rate from
    surfacing only when a group without one is added."""
    groups = [
        {
            "params": [
                tag(torch.nn.Parameter(torch.zeros(1, 2**4)), "weight"),
                tag(torch.nn.Parameter(torch.zeros(2, 2**6)), "readout"),
            ],
            "lr": torch.tensor(0.3),
            "weight_decay": 0.05,
        },
        {"params": [tag(torch.nn.Parameter(torch.zeros(3, 2**6)), "weight", depth=5)]},
    ]
    g0, g1, g2 = optim.param_groups(groups, lr=torch.tensor(0.02))
    assert g0["params"][0].shape == (1, 2**4) and isinstance(g0["lr"], torch.Tensor)
    torch.testing.assert_close(g0["lr"], torch.tensor(0.3 / 2**2))
    assert float(g0["weight_decay"]) == pytest.approx(0.05 * 2**2 / 0.3)
    assert g1["params"][0].shape == (2, 2**6)
    torch.testing.assert_close(g1["lr"], torch.tensor(0.3))
    assert float(g1["weight_decay"]) == pytest.approx(0.05 / 0.3)
    assert g2["params"][0].shape == (3, 2**6)
    torch.testing.assert_close(g2["lr"], torch.tensor(0.02 / 2**3 / 5**0.5))
    assert g2["weight_decay"] == 0
    plain = [*groups, {"params": [torch.nn.Parameter(torch.zeros(4, 2**4))]}]
    with pytest.raises(UntaggedParameterError):
        optim.param_groups(plain, lr=0.1)
    with pytest.warns(Warning):
        assert len(optim.param_groups(plain, lr=0.1, allow_untagged=True)) == 4
    with pytest.raises(ValueError):
        ropt.scaled_parameters(groups, ropt.lr_scale_func_adam)  # the reference: no lr, one group without


# -- test_parameter.py -------------------------------------------------------------------------------------


def test_parameter():
    """The reference's ``Parameter(data, mup_type)`` is ``tag(Parameter(data), role)``; its
    ``mup_scaling_depth`` is the role's ``depth``, set here by tagging again with a depth."""
    param = tag(torch.nn.Parameter(torch.zeros(10)), "weight")
    assert role_of(param).role == "weight" and role_of(param).depth is None
    param = tag(param, "weight", depth=8)
    for copied in (copy.deepcopy(param), pickle.loads(pickle.dumps(param))):
        assert role_of(copied) == role_of(param) and role_of(copy.deepcopy(copied)) == role_of(param)


def test_parameter_compile():
    """A tagged parameter's data changed in place inside a function Dynamo captures whole (the eager
    backend: the question is the capture, and inductor's start-up warns under this suite)."""
    param = tag(torch.nn.Parameter(torch.empty(3)), "norm")

    def update(mult: torch.Tensor) -> torch.Tensor:
        param.data.mul_(mult)
        return param

    param.data.fill_(1)
    torch.testing.assert_close(update(torch.tensor(123.0)), torch.full((3,), 123.0))
    param.data.fill_(1)
    compiled = torch.compile(update, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(torch.tensor(0.5)), torch.full((3,), 0.5))
    torch.testing.assert_close(compiled(torch.tensor(8.0)), torch.full((3,), 4.0))
    torch.testing.assert_close(compiled(param), torch.full((3,), 16.0))
    assert role_of(param).role == "norm"


# -- the ledger ------------------------------------------------------------------------------------------


def test_the_ledger_names_a_translation_for_every_reference_test_with_a_counterpart():
    """Every reference test is translated (a test of the same name in the file of its kind) or has no
    counterpart, with a reason; every difference names a translated test."""
    from . import test_reference_own_tests as ops
    from . import test_reference_own_transform_tests as transforms

    here = globals()
    for file, names in REFERENCE_TESTS.items():
        if file in OUTSIDE:
            continue
        for name in names:
            key = f"{file}::{name}"
            if key in NO_COUNTERPART:
                assert key not in DIFFERENCES and NO_COUNTERPART[key]
                continue
            module = vars(ops)
            if file in ("test_modules.py", "test_optim.py", "test_parameter.py"):
                module = here
            elif file.startswith("transforms/") or file == "test_utils.py":
                module = vars(transforms)
            assert callable(module.get(name)), key
    assert set(DIFFERENCES) <= {f"{f}::{n}" for f, names in REFERENCE_TESTS.items() for n in names}
