"""What the capture layer gives graph transforms: flat fx graphs and the per-signature Dynamo graph."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from unitscale.capture import capture
from unitscale.capture.toolkit import dynamo_graph
from unitscale.errors import CaptureError, InputError
from unitscale.examples.models import MLP, TinyGPT
from unitscale.fx.nodes import MODULE_PATH_KEY, MODULE_TYPE_KEY, SOURCE_KEY

MLP_LINE = inspect.getsourcelines(MLP.forward)[1] + 1


def test_flat_fx_capture_holds_torch_functions_with_the_module_they_came_from() -> None:
    model, x = MLP(8), torch.randn(4, 8)
    cap = capture(model, x, flat=True)
    assert cap.route == "fx" and torch.equal(cap.graph_module(x), model(x))
    ops = cap.nodes(compute_only=True)
    assert [(n.op, n.target.__name__, n.meta[MODULE_PATH_KEY]) for n in ops] == [
        ("call_function", "linear", "fc1"),
        ("call_function", "relu", "act"),
        ("call_function", "linear", "fc2"),
    ]
    weights = [n for n in cap.nodes() if n.op == "get_attr"]
    assert [(n.target, n.meta[MODULE_PATH_KEY]) for n in weights][:2] == [("fc1.weight", "fc1"), ("fc1.bias", "fc1")]
    assert ops[0].meta[MODULE_TYPE_KEY] == "torch.nn.modules.linear.Linear"
    # the source is the user's line that called the module, not torch's F.linear call
    assert ops[0].meta[SOURCE_KEY].endswith(f"models.py:{MLP_LINE}")
    # the flat graph reads the model's own parameters
    assert cap.graph_module.get_parameter("fc1.weight") is model.fc1.weight


def test_flat_must_be_a_bool() -> None:
    with pytest.raises(InputError, match=r"capture\(flat=...\) got str 'yes'; pass True or False"):
        capture(MLP(4), torch.randn(2, 4), flat="yes")  # type: ignore[arg-type]


def test_dynamo_graph_nodes_carry_normalised_module_paths() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=32, d_model=32, n_layers=1, n_heads=2, seq_len=8)
    idx = torch.randint(0, 32, (2, 8))
    found = dynamo_graph(model, (idx,), {})
    nodes = list(found.graph_module.graph.nodes)
    paths = {n.meta[MODULE_PATH_KEY] for n in nodes}
    assert {"tok_emb", "blocks.0.attn.qkv", "blocks.0.ln1", "head"} <= paths
    assert not any(p.startswith(("L", "module")) for p in paths)
    attrs = [n.target for n in nodes if n.op == "get_attr"]
    assert "blocks.0.attn.qkv.weight" in attrs  # parameters under the model's own names
    out = found.graph_module(*[[idx][i] for i in found.input_positions])
    torch.testing.assert_close(found.rebuild(out, [idx]), model(idx))


def test_dynamo_graph_names_the_line_of_a_graph_break() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                return x * 2
            return x

    with pytest.raises(
        CaptureError, match=r"could not capture Branchy.forward in one graph at .*\(if x.sum\(\) > 0:\)"
    ):
        dynamo_graph(Branchy(), (torch.randn(2, 2),), {})


class Structured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor, scale: float, *, shift: torch.Tensor) -> dict[str, object]:
        return {"y": self.fc(x) * scale + shift, "x": x, "n": 3}


def test_the_dynamo_route_is_dynamo_graph_with_the_models_call_signature() -> None:
    torch.manual_seed(0)
    model, x, shift = Structured(), torch.randn(2, 4), torch.randn(4)
    cap = capture(model, (x, 2.0), {"shift": shift}, route="dynamo")
    out = cap.graph_module(x, 2.0, shift=shift)
    assert set(out) == {"y", "x", "n"} and out["x"] is x and out["n"] == 3
    torch.testing.assert_close(out["y"], model(x, 2.0, shift=shift)["y"])
    found = dynamo_graph(model, (x, 2.0), {"shift": shift})
    ops = [(n.target, n.meta[MODULE_PATH_KEY]) for n in found.graph_module.graph.nodes if n.op == "call_function"]
    assert [(n.target, n.meta[MODULE_PATH_KEY]) for n in cap.nodes() if n.op == "call_function"] == ops
