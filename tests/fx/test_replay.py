"""Replaying repeated blocks gives exactly the graph that tracing every call gives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from module_trees import build, descriptions
from torch import fx, nn

from unitscale import track_scales
from unitscale.examples.models import MLP, TinyGPT, resnet18
from unitscale.fx.trace_cache import ScaleTracer


def _trace(model: nn.Module, replay: bool) -> tuple[ScaleTracer, fx.Graph]:
    tracer = ScaleTracer()
    tracer.replay_blocks = replay
    return tracer, tracer.trace(model)


def _summary(tracer: ScaleTracer, graph: fx.Graph) -> dict[str, Any]:
    return {
        "code": graph.python_code("self").src,
        "nodes": [
            (
                n.format_node(),
                n.type,
                n.meta.get("module_path"),
                list(n.meta.get("nn_module_stack", {}).items()),
                tracer.node_to_originating_module.get(n),
            )
            for n in graph.nodes
        ],
        "scopes": dict(tracer.node_name_to_scope),
        "calls": dict(tracer.num_calls),
        "callables": list(tracer.callable_args),
    }


def assert_same_graph(make: Any) -> list[str]:
    """Trace ``make()`` with and without replay (fresh instances, same seed); return what was replayed."""
    torch.manual_seed(0)
    plain = _summary(*_trace(make(), replay=False))
    torch.manual_seed(0)
    tracer, graph = _trace(make(), replay=True)
    assert _summary(tracer, graph) == plain
    return tracer.replayed


class Block(nn.Module):
    def __init__(self, width: int = 8, scale: float = 1.0) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.act = nn.ReLU()
        self.scale = scale

    def forward(self, x: torch.Tensor, gate: float = 1.0) -> torch.Tensor:
        b, w = x.shape
        h = self.act(self.norm(self.fc(x))) * self.scale
        return x + gate * h.reshape(b, w)


class Stack(nn.Module):
    def __init__(self, blocks: list[nn.Module]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class TupleBlock(Block):
    def forward(self, x: torch.Tensor, gate: float = 1.0) -> Any:  # type: ignore[override]
        y = super().forward(x, gate)
        return y, 3, {"half": y / 2}


class TupleStack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = TupleBlock(), TupleBlock(), TupleBlock()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, n, extra = self.a(x, gate=0.5)
        y2, _, _ = self.b(y, gate=0.5)
        y3, _, more = self.c(y2, 2.0)  # a different constant: no replay of a's template
        return y3 + extra["half"] + more["half"] * n


class WithConstant(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor(2.0)  # a tensor constant lands on the root: not replayable


class Wrapped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = WithConstant()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class SameInputTwice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fc(x) - y


class Pairs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p, self.q = nn.Sequential(SameInputTwice()), nn.Sequential(SameInputTwice())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.p[0](x, x) + self.q[0](x, x + 1)


class Private(nn.Module):
    def __init__(self, fast: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self._fast = fast  # a private attribute that steers forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * 2 if self._fast else self.fc(x) - 1


FORWARD_CALLS: list[int] = []  # ids of the Counting blocks whose forward ran


class Counting(Block):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor, gate: float = 1.0) -> torch.Tensor:
        self.calls += 1  # changes the module while it is traced
        FORWARD_CALLS.append(id(self))
        return super().forward(x, gate)


def _double(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def _halve(x: torch.Tensor) -> torch.Tensor:
    return x / 2


class WithFunction(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.fc(x))


def _shared() -> nn.Module:
    first = Block()
    second = Block()
    second.fc = first.fc  # one Linear in two blocks
    return Stack([first, second, Block()])


def _hooked() -> nn.Module:
    blocks = [Block() for _ in range(3)]
    blocks[1].register_forward_hook(lambda m, i, o: o * 2)
    return Stack(blocks)


def _reused() -> nn.Module:
    block = Block()
    return Stack([block, block, Block()])  # the same block object twice


def _training_differs() -> nn.Module:
    blocks = [nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)) for _ in range(3)]
    blocks[1].eval()
    return Stack(blocks)


def _own_forward() -> nn.Module:
    blocks = [Block() for _ in range(3)]
    blocks[2].forward = lambda x: x  # type: ignore[method-assign]
    return Stack(blocks)


@pytest.mark.parametrize(
    ("make", "replayed"),
    [
        (lambda: TinyGPT(11, 16, 4, 2, 8), ["blocks.1", "blocks.2", "blocks.3"]),
        (lambda: TinyGPT(11, 16, 1, 2, 8), []),
        (resnet18, ["layer1.1"]),
        (lambda: MLP(4), []),
        (lambda: Stack([Block() for _ in range(3)]), ["blocks.1", "blocks.2"]),
        (lambda: Stack([Block(), Block(scale=2.0), Block()]), ["blocks.2"]),
        (TupleStack, ["b"]),
        (Wrapped, []),
        (Pairs, []),
        (_shared, ["blocks.2"]),
        (_hooked, ["blocks.2"]),
        (_reused, ["blocks.2"]),
        (_training_differs, ["blocks.2"]),
        (_own_forward, ["blocks.1"]),
        (lambda: Stack([Private(True), Private(False), Private(False)]), ["blocks.2"]),
        (lambda: Stack([Counting() for _ in range(3)]), []),
        (lambda: Stack([WithFunction(_double), WithFunction(_halve), WithFunction(_double)]), ["blocks.2"]),
    ],
    ids=[
        "tinygpt",
        "tinygpt_one_layer",
        "resnet18",
        "mlp",
        "blocks",
        "a_different_attribute",
        "tuple_outputs_and_constants",
        "tensor_constant",
        "same_proxy_twice",
        "shared_linear",
        "hooked_block",
        "block_called_twice",
        "training_flag",
        "instance_forward",
        "private_attribute",
        "forward_changes_the_module",
        "function_attributes",
    ],
)
def test_replay_gives_the_traced_graph(make: Any, replayed: list[str]) -> None:
    assert assert_same_graph(make) == replayed


@settings(max_examples=40, deadline=None)
@given(desc=descriptions)
def test_replay_gives_the_traced_graph_on_random_module_trees(desc: Any) -> None:
    assert_same_graph(lambda: build(desc))


def test_replayed_model_tracks_the_same_scales() -> None:
    torch.manual_seed(0)
    model = TinyGPT(11, 16, 3, 2, 8)
    idx = torch.randint(0, 11, (2, 8))
    with_replay = track_scales(model, idx, torch.ones(2, 8, 11))
    ScaleTracer.replay_blocks = False
    try:
        torch.manual_seed(0)
        model = TinyGPT(11, 16, 3, 2, 8)
        without = track_scales(model, idx, torch.ones(2, 8, 11))
    finally:
        ScaleTracer.replay_blocks = True
    assert with_replay.code == without.code
    assert [tuple(r) for r in with_replay] == [tuple(r) for r in without]


def test_a_block_that_changes_itself_is_traced_every_time() -> None:
    model = Stack([Counting() for _ in range(3)])
    FORWARD_CALLS.clear()
    _trace(model, replay=True)
    assert FORWARD_CALLS == [id(block) for block in model.blocks]  # every forward ran, as without replay
    assert [block.calls for block in model.blocks] == [0, 0, 0]  # and tracing left the blocks as they were
