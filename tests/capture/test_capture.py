"""capture(): the route each model takes, equal outputs, normalised meta, typed errors."""

from __future__ import annotations

import inspect
import re

import pytest
import torch
from torch import nn

from tests.real_models import BUILDERS, gpt2, llama
from unitscale.capture import ROUTES, Capture, capture, module_paths
from unitscale.errors import InputError, NoGraphError, NoRouteError, NotAModuleError, UnknownRouteError
from unitscale.examples.models import MLP, TinyGPT
from unitscale.fx.nodes import MODULE_PATH_KEY, MODULE_TYPE_KEY, SOURCE_KEY


def _same(a: object, b: object) -> bool:
    la = [t for t in torch.utils._pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    lb = [t for t in torch.utils._pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    return len(la) == len(lb) > 0 and all(
        torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(la, lb, strict=True)
    )


class DataDependent(nn.Module):
    """Python control flow on a tensor's value, and an output no graph route can return."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> object:
        y = self.fc(x)
        if y.sum().item() > 0:  # the line every graph route fails on
            y = y * 2
        return {"y": y, "note": object()}


class KeywordOnly(nn.Module):
    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return x * scale


def test_our_mlp_takes_the_fx_route_and_keeps_call_module_nodes() -> None:
    model, x = MLP(8), torch.randn(4, 8)
    cap = capture(model, x)  # a single tensor is accepted as (x,)
    assert cap.route == "fx" and cap.reasons == {} and cap.exported_program is None
    assert [n.op for n in cap.nodes(compute_only=True)] == ["call_module"] * 3
    assert torch.equal(cap.graph_module(x), model(x))
    assert repr(cap) == "Capture(MLP via 'fx', 5 nodes)"
    fc1 = cap.nodes()[1]
    assert fc1.meta["tensor_meta"].shape == (4, 32) and fc1.meta["val"].dtype == torch.float32
    assert fc1.meta[SOURCE_KEY].endswith(f"unitscale/examples/models.py:{inspect.getsourcelines(MLP.forward)[1] + 1}")


@pytest.mark.parametrize("name", list(BUILDERS))
def test_transformers_models_take_the_export_route_with_equal_outputs(name: str) -> None:
    model, inputs = BUILDERS[name]()
    cap = capture(model, inputs)
    assert cap.route == "export"
    assert list(cap.reasons) == ["fx"] and cap.exported_program is not None
    with torch.no_grad():
        assert _same(cap.graph_module(*inputs), model(*inputs))
    compute = cap.nodes(compute_only=True)
    assert compute and all(MODULE_PATH_KEY in n.meta and n.meta[MODULE_TYPE_KEY] for n in compute)
    assert not any(n.op == "call_module" for n in compute)  # flat: no guard call either
    modeling = f"transformers/models/{name}/modeling_{name}.py:"
    in_modeling = [n for n in compute if modeling in n.meta[SOURCE_KEY]]
    assert len(in_modeling) > 0.6 * len(compute)  # the rest: transformers.activations, Conv1D


def test_llama_nodes_name_their_innermost_module_and_class() -> None:
    model, inputs = llama()
    cap = capture(model, inputs, route="export")
    q_proj = [n for n in cap.nodes() if n.meta[MODULE_PATH_KEY] == "model.layers.0.self_attn.q_proj"]
    linear = [n for n in q_proj if n.op == "call_function"]
    assert [n.target for n in linear] == [torch.ops.aten.linear.default]
    assert linear[0].meta[MODULE_TYPE_KEY] == "torch.nn.modules.linear.Linear"
    assert re.search(r"modeling_llama\.py:\d+$", linear[0].meta[SOURCE_KEY])
    assert tuple(linear[0].meta["val"].shape) == (2, 16, 64)
    weight = [n for n in q_proj if n.op == "get_attr"]
    assert [n.target for n in weight] == ["model.layers.0.self_attn.q_proj.weight"]
    root = [n for n in cap.nodes() if n.op == "placeholder"]
    assert [(n.meta[MODULE_PATH_KEY], n.meta[MODULE_TYPE_KEY]) for n in root] == [
        ("", "transformers.models.llama.modeling_llama.LlamaForCausalLM")
    ]
    paths = set(module_paths(cap).values())
    assert {"model.embed_tokens", "model.layers.1.mlp.down_proj", "lm_head"} <= paths


def test_dynamo_and_strict_routes_write_the_same_meta_as_export() -> None:
    model, x = TinyGPT(vocab_size=32, d_model=16, n_layers=2, n_heads=2, seq_len=8), torch.randint(0, 32, (2, 8))
    per_route = {}
    for route in ("export", "export-strict", "dynamo"):
        cap = capture(model, x, route=route)
        assert cap.route == route and _same(cap.graph_module(x), model(x))
        per_route[route] = [(n.meta[MODULE_PATH_KEY], n.meta[MODULE_TYPE_KEY]) for n in cap.nodes(compute_only=True)]
        # TorchDynamo's shape reads (sym_size) carry no line; every other node names its line.
        sourced = [n for n in cap.nodes(compute_only=True) if n.target is not torch.ops.aten.sym_size.int]
        assert all(re.search(r"examples/models\.py:\d+$", n.meta[SOURCE_KEY]) for n in sourced)
    # Each route spells paths its own way (L['self'].blocks[0], blocks.0); all read as the same names.
    for route in ("export-strict", "dynamo"):
        assert {p for p, _ in per_route[route]} == {p for p, _ in per_route["export"]}


def test_a_forced_route_that_fails_raises_no_route_error_with_its_reason() -> None:
    model, inputs = gpt2()
    with pytest.raises(NoRouteError, match=r"no route could capture GPT2LMHeadModel \(tried fx\)") as info:
        capture(model, inputs, route="fx")
    assert list(info.value.reasons) == ["fx"]
    assert re.match(r"\w+Error: .+ \(at .+\)$", info.value.reasons["fx"])


def test_a_model_only_the_eager_route_can_capture_lists_every_graph_routes_reason() -> None:
    torch.manual_seed(0)
    model, x = DataDependent(), torch.randn(3, 4)
    with pytest.raises(NoRouteError) as info:
        capture(model, x, route="graph")
    assert list(info.value.reasons) == ["fx", "export", "export-strict", "dynamo"]
    for route, why in info.value.reasons.items():
        assert "test_capture.py:" in why, (route, why)
    assert "`if y.sum().item() > 0:" in info.value.reasons["fx"]
    cap = capture(model, x)
    assert cap.route == "eager" and cap.graph_module is None and list(cap.reasons) == list(ROUTES[:-1])
    assert [(op.op, op.module_path) for op in cap.ops][:1] == [("linear", "fc")]
    assert cap.ops[0].params == ("fc.weight", "fc.bias") and cap.ops[0].shapes == ((3, 4),)
    assert cap.module_calls == ["", "fc"]
    with pytest.raises(NoGraphError, match=r"my tool needs a graph of DataDependent.*\n  fx: ") as err:
        cap.require_graph("my tool")
    assert isinstance(err.value, NoRouteError) and len(err.value.reasons) == 4
    assert repr(cap).startswith("Capture(DataDependent via 'eager', ")


def test_fx_graph_that_differs_from_the_model_is_rejected() -> None:
    class Frozen(nn.Module):
        """Python state changes per call; fx runs the forward once, at trace time, and freezes it."""

        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            Frozen.calls += 1  # Python state fx runs once, at trace time
            return x * Frozen.calls

    cap = capture(Frozen(), torch.ones(2))
    assert cap.route != "fx"
    assert "differs from the model's" in cap.reasons["fx"]


def test_keyword_only_forward_says_how_to_pass_it() -> None:
    with pytest.raises(InputError, match=r"keyword-only input\(s\) 'scale'.*kwargs=\{'scale': \.\.\.\}"):
        capture(KeywordOnly(), torch.ones(2))
    cap = capture(KeywordOnly(), (torch.ones(2),), kwargs={"scale": torch.full((2,), 3.0)})
    assert torch.equal(cap.graph_module(torch.ones(2), scale=torch.full((2,), 3.0)), torch.full((2,), 3.0))


@pytest.mark.parametrize(
    ("inputs", "kwargs", "error", "words"),
    [
        ((torch.ones(2, 8), torch.ones(2)), None, InputError, "MLP.forward(x) cannot take 2 positional input(s)"),
        (([1.0] * 8,), None, InputError, "input 'x' (example_inputs[0]) of MLP.forward is a list"),
        ({"x": torch.ones(8)}, None, InputError, "example_inputs is a dict (keys 'x')"),
        ("text", None, InputError, "must be a tensor or a tuple of MLP's positional inputs, got str"),
        ((torch.ones(2, 5),), None, InputError, "MLP failed on the example inputs ((2, 5))"),
        ((torch.ones(2, 8),), [1], InputError, "kwargs must be a dict"),
    ],
)
def test_inputs_that_do_not_fit_raise_input_error_naming_them(
    inputs: object, kwargs: object, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)):
        capture(MLP(8), inputs, kwargs)  # type: ignore[arg-type]


def test_not_a_module_and_unknown_route_are_typed() -> None:
    with pytest.raises(NotAModuleError, match="capture\\(\\) got builtin_function_or_method"):
        capture(torch.relu, torch.ones(2))  # type: ignore[arg-type]
    with pytest.raises(UnknownRouteError, match="capture\\(route=...\\) got 'jit'"):
        capture(MLP(2), torch.ones(1, 2), route="jit")
    with pytest.raises(UnknownRouteError):
        capture(MLP(2), torch.ones(1, 2), route=("fx", "onnx"))


def test_capture_leaves_buffers_and_rng_as_they_were() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5)).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(8, 4)
    torch.manual_seed(3)
    expected_next = torch.rand(2)
    torch.manual_seed(3)
    cap = capture(model, x)
    assert isinstance(cap, Capture) and cap.route == "fx"
    assert torch.equal(torch.rand(2), expected_next)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_the_name_capture_is_the_package_and_its_function_lives_inside_it() -> None:
    import importlib
    import types

    import unitscale
    import unitscale.capture as package

    assert isinstance(unitscale.capture, types.ModuleType) and unitscale.capture is package
    assert importlib.import_module("unitscale.capture") is package
    assert callable(package.capture) and package.capture.__module__ == "unitscale.capture._capture"
