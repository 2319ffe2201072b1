"""u-μP roles stay on the parameters however a model is copied, saved, loaded or compiled (issue 26, item 3)."""

import copy
import io
import pickle

import pytest
import torch

import unitscale.optim as uopt
from unitscale import nn as unn
from unitscale.errors import UntaggedParameterError
from unitscale.examples.umup_models import UmupGPT
from unitscale.scaling import ParamRole, role_of, tag

# What each parameter of this model was built as: the oracle every copy is compared with.
EXPECTED = {
    "0.weight": ParamRole("embedding", 8, None),
    "1.0.weight": ParamRole("weight", 8, 2),
    "1.0.bias": ParamRole("bias", 8, 2),
    "1.1.weight": ParamRole("weight", 8, 2),
    "2.weight": ParamRole("norm", 8, None),
    "2.bias": ParamRole("bias", 8, None),
    "3.weight": ParamRole("readout", 8, None),
}


def build() -> torch.nn.Module:
    return torch.nn.Sequential(
        unn.Embedding(16, 8),
        unn.DepthSequential(unn.Linear(8, 8, bias=True), unn.Linear(8, 8)),
        unn.LayerNorm(8),
        unn.LinearReadout(8, 16),
    )


def roles(model: torch.nn.Module) -> dict[str, ParamRole | None]:
    return {name: role_of(p) for name, p in model.named_parameters()}


def saved_and_loaded(model: torch.nn.Module, weights_only: bool = False) -> torch.nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=weights_only)


@pytest.mark.parametrize(
    "copy_of",
    [
        copy.deepcopy,
        lambda m: pickle.loads(pickle.dumps(m)),
        lambda m: copy.deepcopy(pickle.loads(pickle.dumps(m))),
        lambda m: pickle.loads(pickle.dumps(copy.deepcopy(m))),
        saved_and_loaded,
        lambda m: copy.deepcopy(saved_and_loaded(m)),
        lambda m: saved_and_loaded(copy.deepcopy(saved_and_loaded(m))),
    ],
    ids=["deepcopy", "pickle", "pickle-deepcopy", "deepcopy-pickle", "save-load", "save-load-deepcopy", "twice"],
)
def test_roles_survive_every_chain_of_copies(copy_of):
    model = build()
    copied = copy_of(model)
    assert roles(copied) == EXPECTED
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), copied.parameters(), strict=True))
    assert all(a is not b for a, b in zip(model.parameters(), copied.parameters(), strict=True))


def test_a_tagged_parameter_loads_with_torchs_default_weights_only():
    param = tag(torch.nn.Parameter(torch.randn(4, 3)), "weight", depth=2)
    buffer = io.BytesIO()
    torch.save(param, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)  # weights_only=True
    assert role_of(loaded) == ParamRole("weight", 3, 2) and torch.equal(loaded, param)


@pytest.mark.parametrize("assign", [False, True])
def test_roles_survive_a_state_dict_round_trip(assign):
    source, target = build(), build()
    state = copy.deepcopy(saved_and_loaded(source).state_dict())
    target.load_state_dict(state, assign=assign)
    assert roles(target) == EXPECTED
    assert all(torch.equal(a, b) for a, b in zip(source.parameters(), target.parameters(), strict=True))


def test_roles_survive_torch_compile_and_the_compiled_model_trains_with_unitscale_optim():
    torch.manual_seed(0)
    model = UmupGPT(16, width=16, depth=2, head_dim=8, max_len=8)
    expected = roles(model)
    # TorchDynamo's capture is what could lose a role; the eager backend needs no C++ compiler.
    compiled = torch.compile(model, backend="eager")
    assert {name.removeprefix("_orig_mod."): role for name, role in roles(compiled).items()} == expected
    assert all(role is not None for role in expected.values())
    opt = uopt.Adam(compiled.parameters(), lr=0.05)
    idx = torch.randint(0, 16, (4, 8))
    before = compiled.loss(idx[:, :-1], idx[:, 1:]).item()
    for _ in range(5):
        opt.zero_grad()
        compiled.loss(idx[:, :-1], idx[:, 1:]).backward()
        opt.step()
    assert compiled.loss(idx[:, :-1], idx[:, 1:]).item() < before
    assert roles(model) == expected


def test_a_model_of_unitscale_nn_modules_trains_with_unitscale_optim_and_a_plain_one_is_refused():
    model = torch.nn.Sequential(unn.Conv1d(4, 8, 3, padding=1), unn.GELU(), unn.Conv1d(8, 4, 1))
    uopt.AdamW(model.parameters(), lr=0.01)  # every parameter has a role
    with pytest.raises(UntaggedParameterError, match=r"0.weight.*unitscale.nn modules.*allow_untagged=True"):
        uopt.Adam(torch.nn.Sequential(torch.nn.Linear(4, 4)), lr=0.01)


def test_unit_scale_tags_the_roles_unitscale_nn_modules_carry_and_trains_with_unitscale_optim():
    from unitscale import unit_scale

    torch.manual_seed(0)
    plain = torch.nn.Sequential(
        torch.nn.Embedding(10, 16),
        torch.nn.LayerNorm(16),
        torch.nn.Linear(16, 32),
        torch.nn.GELU(),
        torch.nn.Linear(32, 10),
    )
    twin = torch.nn.Sequential(
        unn.Embedding(10, 16),
        unn.LayerNorm(16),
        unn.Linear(16, 32, bias=True),
        unn.GELU(),
        unn.Linear(32, 10, bias=True),
    )
    ids = torch.randint(0, 10, (8, 5))
    scaled = unit_scale(plain, example_inputs=ids)
    assert {name.removeprefix("module."): role for name, role in roles(scaled).items()} == roles(twin)
    opt = uopt.Adam(scaled.parameters(), lr=0.05)
    targets = torch.randint(0, 10, (8, 5))

    def loss():
        return torch.nn.functional.cross_entropy(scaled(ids).flatten(0, 1), targets.flatten())

    before = loss().item()
    for _ in range(5):
        opt.zero_grad()
        loss().backward()
        opt.step()
    assert loss().item() < before
