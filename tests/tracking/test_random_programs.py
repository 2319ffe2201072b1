"""track_scales on random op sequences, against the same sequence run out of place by hand.

Each program is a chain of single torch calls on an 8x8 activation: views and slices, copies
and casts (some return their input itself), in-place changes, broadcasts, reductions, an
activation read twice. The oracle runs the chain with every op out
of place and a zero tensor ``e_i`` added to each op's output: the forward std of row ``i`` is
the std of that output (its float32 values, in float64), its backward std the std of
``d loss / d e_i``, which is
the gradient at that value whatever the program later does to the tensor in place.

One case may have no number: a view that the program later changes in place. torch then
takes the gradient through the view's base and never calls a hook on the view, so the row
reads n/a; it must never read a wrong number. The fx route, which sees the whole graph first,
gives a view of a tensor read by nothing else its source's gradient (the same numbers,
rearranged): the last test checks it.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn

from unitscale import track_scales

# name -> (the op as the model runs it, the same op out of place)
Op = tuple[Callable[..., torch.Tensor], Callable[..., torch.Tensor]]
OPS: dict[str, Op] = {
    "linear": (lambda h, w: F.linear(h, w), lambda h, w: F.linear(h, w)),
    "relu_": (lambda h, w: torch.relu_(h), lambda h, w: torch.relu(h)),
    "mul_": (lambda h, w: h.mul_(0.5), lambda h, w: h * 0.5),
    "add_": (lambda h, w: h.add_(1.5), lambda h, w: h + 1.5),
    "t": (lambda h, w: h.t(), lambda h, w: h.t()),
    "reshape": (lambda h, w: h.reshape(8, 8), lambda h, w: h.reshape(8, 8)),
    "contiguous": (lambda h, w: h.contiguous(), lambda h, w: h.contiguous()),
    "clone": (lambda h, w: h.clone(), lambda h, w: h.clone()),
    "mul": (lambda h, w: h * 3.0, lambda h, w: h * 3.0),
    "add_self": (lambda h, w: h + h, lambda h, w: h + h),
    "gelu": (lambda h, w: F.gelu(h), lambda h, w: F.gelu(h)),
    "tanh": (lambda h, w: torch.tanh(h), lambda h, w: torch.tanh(h)),
    "mean0": (lambda h, w: h.mean(0, keepdim=True), lambda h, w: h.mean(0, keepdim=True)),
    "expand": (lambda h, w: h.expand(8, 8), lambda h, w: h.expand(8, 8)),
    "flip": (lambda h, w: torch.flip(h, [0]), lambda h, w: torch.flip(h, [0])),
    "roll": (lambda h, w: torch.roll(h, 1, 0), lambda h, w: torch.roll(h, 1, 0)),
    "neg": (lambda h, w: -h, lambda h, w: -h),
    "square": (lambda h, w: h * h, lambda h, w: h * h),
    "matmul_self": (lambda h, w: h @ h, lambda h, w: h @ h),
    "softmax": (lambda h, w: F.softmax(h, -1), lambda h, w: F.softmax(h, -1)),
    "layer_norm": (lambda h, w: F.layer_norm(h, (8,)), lambda h, w: F.layer_norm(h, (8,))),
    "masked_fill_": (lambda h, w: h.masked_fill_(MASK, 0.0), lambda h, w: h.masked_fill(MASK, 0.0)),
    "dropout_eval": (lambda h, w: F.dropout(h, 0.5, training=False), lambda h, w: F.dropout(h, 0.5, training=False)),
    "t_": (lambda h, w: h.t_(), lambda h, w: h.t()),
    "unsqueeze": (lambda h, w: h.unsqueeze(0), lambda h, w: h.unsqueeze(0)),
    "squeeze": (lambda h, w: h.squeeze(0), lambda h, w: h.squeeze(0)),
    "slice": (lambda h, w: h[:4], lambda h, w: h[:4]),
    "cat_self": (lambda h, w: torch.cat([h, h]), lambda h, w: torch.cat([h, h])),
    "transpose": (lambda h, w: h.transpose(0, 1), lambda h, w: h.transpose(0, 1)),
    "sum0": (lambda h, w: h.sum(0, keepdim=True), lambda h, w: h.sum(0, keepdim=True)),
    "mul_self_": (lambda h, w: h.mul_(h), lambda h, w: h * h),
    "to64": (lambda h, w: h.to(torch.float64), lambda h, w: h.to(torch.float64)),
    "to32": (lambda h, w: h.to(torch.float32), lambda h, w: h.to(torch.float32)),
    "float": (lambda h, w: h.float(), lambda h, w: h.float()),  # itself where h is float32
}
MASK = torch.rand(8, 8, generator=torch.Generator().manual_seed(9)) < 0.3


class Program(nn.Module):
    def __init__(self, ops: list[str]) -> None:
        super().__init__()
        self.ops = ops
        self.w = nn.Parameter(torch.randn(8, 8, generator=torch.Generator().manual_seed(1)) / 8**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for name in self.ops:
            h = OPS[name][0](h, self.w)
        return h


def _oracle(ops: list[str], w: torch.Tensor, x: torch.Tensor, grad: torch.Tensor) -> list[tuple[float, float]]:
    w = w.detach().clone().requires_grad_()
    h = x
    outputs, eps = [], []
    for name in ops:
        h = OPS[name][1](h, w)
        e = torch.zeros_like(h, requires_grad=True)
        h = h + e
        outputs.append(h)
        eps.append(e)
    grads = torch.autograd.grad(h, eps, grad.to(h.dtype).expand_as(h), allow_unused=True)
    grads = tuple(torch.zeros_like(e) if g is None else g for e, g in zip(eps, grads, strict=True))

    def std(t: torch.Tensor) -> float:
        return 0.0 if t.numel() == 1 else t.detach().double().std().item()

    return [(std(o), std(g)) for o, g in zip(outputs, grads, strict=True)]


def _views_changed_later(ops: list[str], w: torch.Tensor, x: torch.Tensor) -> set[int]:
    """Indices of the ops whose output is a view that a later op changes in place (run here to see)."""
    h, outs, changed = x, [], set()
    with torch.no_grad():
        for name in ops:
            h = OPS[name][0](h, w)
            if name.endswith("_"):
                ptr = h.untyped_storage().data_ptr()
                changed |= {i for i, (view, p) in enumerate(outs) if view and p == ptr}
            outs.append((h._base is not None, h.untyped_storage().data_ptr()))
    return changed


@settings(max_examples=400, deadline=None)
@given(ops=st.lists(st.sampled_from(sorted(OPS)), min_size=1, max_size=8), route=st.sampled_from(["fx", "eager"]))
def test_every_row_has_the_std_of_the_value_its_op_made_and_of_its_gradient(ops: list[str], route: str) -> None:
    ops = ["linear", *ops]
    model = Program(ops)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    try:  # torch itself refuses some chains: shapes that do not fit, relu_ then add_ (relu's saved output)
        out = model(x)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=out.dtype)
        out.backward(grad)
    except (RuntimeError, IndexError):
        return
    report = track_scales(model, x, grad, route=route)
    rows = [r for r in report if r.op not in ("input", "parameter")]
    expected = _oracle(ops, model.w, x, grad)
    no_hook = _views_changed_later(ops, model.w, x)
    assert len(rows) == len(ops), ([r.node for r in rows], ops)
    for i, (row, (fwd, bwd)) in enumerate(zip(rows, expected, strict=True)):
        assert row.forward == pytest.approx(fwd, rel=1e-5, abs=1e-7), (route, ops, row.node, "forward")
        if i in no_hook and row.backward is None:
            continue  # n/a, not a wrong number
        assert row.backward == pytest.approx(bwd, rel=1e-5, abs=1e-7), (route, ops, row.node, "backward")


@pytest.mark.parametrize("graph_module", [False, True], ids=["compiled", "interpreted"])
@pytest.mark.parametrize(
    "ops",
    [
        ["linear", "reshape", "add_"],
        ["linear", "t", "reshape", "mul_", "tanh"],
        ["linear", "squeeze", "float", "add_"],  # float() of a float32 tensor is the tensor itself
    ],
)
def test_on_the_fx_route_a_view_changed_in_place_has_its_sources_gradient(ops: list[str], graph_module: bool) -> None:
    # the view's hook never fires; its source, read by the view alone, keeps its own hook and
    # gives both rows its gradient (before the fix neither row had one). A GraphModule of
    # one's own runs through ScaleTrackingInterpreter, a traced model as compiled code.
    # (x.float() is no view: its row, the same tensor as the view, may still read n/a.)
    model = Program(ops)
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    grad = torch.randn(8, 8, generator=torch.Generator().manual_seed(3))
    run = fx.symbolic_trace(model) if graph_module else model
    rows = [r for r in track_scales(run, x, grad, route="fx") if r.op not in ("input", "parameter")]
    for row, name, (_, bwd) in zip(rows, ops, _oracle(ops, model.w, x, grad), strict=True):
        if name != "float":
            assert row.backward == pytest.approx(bwd, rel=1e-5), row.node
