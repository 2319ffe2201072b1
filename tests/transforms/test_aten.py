"""to_torch_functions: an exported graph's aten ops read as the torch functions the passes know."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from unitscale.transforms.aten import to_torch_functions


def _exported(model: nn.Module, *args: torch.Tensor) -> torch.fx.GraphModule:
    return torch.export.export(model.eval(), args).module(check_guards=False)


class EmbedNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.norm = nn.Embedding(10, 4, padding_idx=0), nn.LayerNorm(4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.norm(self.emb(ids)), dim=-1)


def test_arguments_are_put_in_the_torch_functions_order_and_outputs_stay_equal() -> None:
    torch.manual_seed(0)
    for model, x in [
        (EmbedNorm(), torch.randint(0, 10, (2, 3))),
        (nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.MaxPool2d(2)), torch.randn(2, 3, 8, 8)),
    ]:
        gm = _exported(model, x)
        expected = gm(x)
        to_torch_functions(gm)
        targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
        assert not any(isinstance(t, torch._ops.OpOverload) for t in targets), targets
        torch.testing.assert_close(gm(x), expected)
    emb = next(n for n in EmbedNormGraph().graph.nodes if n.target is F.embedding)
    assert emb.args[1].target == "emb.weight" and emb.kwargs["padding_idx"] == 0


def EmbedNormGraph() -> torch.fx.GraphModule:  # noqa: N802 - reads as the graph it returns
    return to_torch_functions(_exported(EmbedNorm(), torch.randint(0, 10, (2, 3))))


def _shared_in_place(x: torch.Tensor) -> torch.Tensor:
    y = torch.ops.aten.mul.Tensor(x, 2)
    z = torch.ops.aten.relu_.default(y)  # overwrites y, which the add below reads too
    return torch.ops.aten.add.Tensor(z, y)


def test_an_in_place_op_on_a_tensor_others_read_is_left_as_it_is() -> None:
    x = torch.randn(5)
    gm = to_torch_functions(torch.fx.symbolic_trace(_shared_in_place))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets == [torch.mul, torch.ops.aten.relu_.default, torch.add]
    torch.testing.assert_close(gm(x), 2 * (2 * x).relu())


class ClampPadT(nn.Module):
    """ReLU6 and explicit padding (MobileNetV2 in transformers) and ``x @ w.T`` (Falcon's linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(5, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.pad(F.relu6(x), (1, 1), "constant", 0.0)[..., 1:-1] @ self.weight.T
        return F.hardtanh(y, -2.0, 2.0) + x.mT.mT.sum()


def test_clamps_padding_and_numpy_transposes_become_torch_functions_with_equal_outputs() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    gm = _exported(ClampPadT(), x)
    expected = gm(x)
    to_torch_functions(gm)
    targets = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert {F.hardtanh, F.pad, torch.t} <= targets
    assert not {torch.ops.aten.hardtanh.default, torch.ops.aten.pad.default, torch.ops.aten.numpy_T.default} & targets
    torch.testing.assert_close(gm(x), expected)
