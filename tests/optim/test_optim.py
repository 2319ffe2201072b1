"""u-μP optimisers: per-role learning rates, independent weight decay, untagged parameters."""

import math
import warnings

import pytest
import torch

import unitscale.optim as uopt
from unitscale import nn as unn
from unitscale.errors import InputError, NotAModuleError, UntaggedParameterError, UntaggedParameterWarning
from unitscale.examples.umup_models import UmupGPT
from unitscale.scaling import ParamRole


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


@pytest.mark.parametrize(
    ("role", "adam", "sgd_constrained"),
    [
        (ParamRole("weight", 256), 1 / 16, 16.0),
        (ParamRole("weight", 256, depth=4), 1 / 32, 8.0),
        (ParamRole("embedding", 64), 1 / 8, 8.0),
        (ParamRole("readout", 1024), 1.0, 1.0),
        (ParamRole("readout", 1024, depth=16), 0.25, 0.25),
        (ParamRole("bias", 100), 1.0, 100.0),
        (ParamRole("norm", 49, depth=9), 1 / 3, 49 / 3),
    ],
)
def test_lr_scale_follows_the_paper_for_adam_and_both_sgd_cases(role, adam, sgd_constrained):
    assert uopt.lr_scale(role) == pytest.approx(adam)
    assert uopt.lr_scale(role, "sgd") == pytest.approx(adam)  # unit-scaled gradients: Adam's rules
    assert uopt.lr_scale(role, "sgd_to_output_scale") == pytest.approx(sgd_constrained)


def test_lr_scales_name_every_parameter_of_a_umup_model():
    scales = uopt.lr_scales(UmupGPT(16, width=64, depth=4))
    assert scales["tokens.weight"] == pytest.approx(64**-0.5)
    assert scales["readout.weight"] == 1.0 and scales["norm.weight"] == 1.0
    assert scales["blocks.0.attn.linear_qkv.weight"] == pytest.approx(64**-0.5 / 2)
    assert scales["blocks.3.mlp.down.weight"] == pytest.approx(256**-0.5 / 2)
    assert scales["blocks.1.mlp_norm.weight"] == pytest.approx(0.5)


@pytest.mark.parametrize("cls", [uopt.SGD, uopt.Adam, uopt.AdamW])
def test_optimisers_give_each_parameter_lr_times_its_scale(cls):
    model = UmupGPT(16, width=32, depth=2)
    opt = cls(model.parameters(), lr=0.5)
    scales = uopt.lr_scales(model)
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        assert lr_of[id(p)] == pytest.approx(0.5 * scales[name]), name
    assert sum(len(g["params"]) for g in opt.param_groups) == len(scales)
    assert isinstance(opt, {uopt.SGD: torch.optim.SGD, uopt.Adam: torch.optim.Adam, uopt.AdamW: torch.optim.AdamW}[cls])


def test_adam_update_of_a_hidden_weight_shrinks_as_fan_in_to_the_minus_half():
    sizes = {}
    for width in (64, 1024):
        layer = unn.Linear(width, 8)
        before = layer.weight.detach().clone()
        opt = uopt.Adam(layer.parameters(), lr=1.0)
        layer(torch.randn(32, width)).square().mean().backward()
        opt.step()
        sizes[width] = (layer.weight.detach() - before).abs().mean().item()
    # Adam's first step moves each element by lr * scale: 64**-0.5 and 1024**-0.5.
    assert sizes[64] == pytest.approx(1 / 8, rel=0.02) and sizes[1024] == pytest.approx(1 / 32, rel=0.02)


def test_independent_weight_decay_shrinks_weights_by_the_same_step_at_any_lr():
    shrink = []
    for lr in (1e-3, 1e-1):
        norm = unn.RMSNorm(4)
        opt = uopt.AdamW(norm.parameters(), lr=lr, weight_decay=0.1)
        norm.weight.grad = torch.zeros(4)
        opt.step()
        shrink.append(1 - norm.weight[0].item())
    assert shrink == pytest.approx([0.1, 0.1])
    coupled = unn.RMSNorm(4)
    opt = uopt.AdamW(coupled.parameters(), lr=0.5, weight_decay=0.1, independent_weight_decay=False)
    coupled.weight.grad = torch.zeros(4)
    opt.step()
    assert 1 - coupled.weight[0].item() == pytest.approx(0.05)


def test_sgd_weight_decay_is_independent_of_lr_too():
    norm = unn.RMSNorm(4)
    opt = uopt.SGD(norm.parameters(), lr=0.01, weight_decay=0.2)
    norm.weight.grad = torch.zeros(4)
    opt.step()
    assert 1 - norm.weight[0].item() == pytest.approx(0.2)


def test_param_groups_plug_the_rules_into_any_optimiser_and_keep_group_options():
    model = torch.nn.Sequential(unn.Linear(64, 64), unn.LinearReadout(64, 10))
    groups = uopt.param_groups(
        [{"params": list(model[0].parameters()), "lr": 2.0, "momentum": 0.5}, {"params": model[1].weight}], lr=0.1
    )
    assert [(g["lr"], g.get("momentum"), g["umup_scale"]) for g in groups] == [(0.25, 0.5, 0.125), (0.1, None, 1.0)]
    opt = torch.optim.SGD(groups, lr=0.1)
    assert [g["lr"] for g in opt.param_groups] == [0.25, 0.1]


def test_untagged_parameters_raise_naming_them_and_saying_how_to_tag():
    model = torch.nn.Sequential(unn.Linear(8, 8), torch.nn.Linear(8, 2))
    expected = r"2 parameter\(s\) have no u-μP role \(a plain torch.nn module.s parameters have none\): 1.weight, 1.b"
    with pytest.raises(UntaggedParameterError, match=expected + r".*unitscale.nn modules.*scaling.tag"):
        uopt.Adam(model, lr=0.1)
    with pytest.raises(UntaggedParameterError, match=r"params\[1\]"):
        uopt.SGD(list(model.parameters()), lr=0.1)
    with pytest.raises(UntaggedParameterError, match="1.weight"):
        uopt.lr_scales(model)


def test_untagged_parameters_fall_back_to_scale_one_with_our_warning_when_allowed():
    model = torch.nn.Sequential(unn.Linear(16, 8), torch.nn.Linear(8, 2))
    with pytest.warns(UntaggedParameterWarning, match=r"2 parameter\(s\) without a u-μP role learn at the global lr"):
        opt = uopt.AdamW(model, lr=0.1, allow_untagged=True)
    assert sorted(g["lr"] for g in opt.param_groups) == pytest.approx([0.025, 0.1])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        uopt.Adam(model[0].parameters(), lr=0.1)  # all tagged: no warning


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lr": 0}, "lr=0 must be > 0"),
        ({"lr": math.nan}, "lr=nan is not a finite number"),
        ({"lr": 0.1, "weight_decay": -1}, "weight_decay=-1 must be >= 0"),
    ],
)
def test_bad_learning_rates_and_decays_are_refused(kwargs, message):
    with pytest.raises(InputError, match=message):
        uopt.param_groups(unn.Linear(4, 4), **kwargs)


def test_bad_rule_readout_constraint_and_params_are_refused():
    layer = unn.Linear(4, 4)
    with pytest.raises(InputError, match="rule='lamb' is not one of adam, sgd, sgd_to_output_scale"):
        uopt.lr_scales(layer, rule="lamb")
    with pytest.raises(InputError, match="readout_constraint='gmean' must be None or 'to_output_scale'"):
        uopt.SGD(layer.parameters(), readout_constraint="gmean")
    with pytest.raises(InputError, match="single tensor"):
        uopt.Adam(layer.weight)
    with pytest.raises(InputError, match=r"params\[0\] is a str"):
        uopt.Adam(["w"])
    with pytest.raises(NotAModuleError, match="pass a torch.nn.Module"):
        uopt.lr_scales([layer.weight])


def test_sgd_with_a_constrained_readout_grows_hidden_rates_with_width():
    opt = uopt.SGD(unn.Linear(256, 4).parameters(), lr=0.01, readout_constraint="to_output_scale")
    assert opt.param_groups[0]["lr"] == pytest.approx(0.16)
