"""The reference's own tests of its graph transforms and of ``analyse_module``, translated to this API.

unit-scaling 0.3.5's ``tests/transforms/`` (``unit_scale``, ``simulate_fp8``, ``track_scales``, compile)
and ``tests/test_utils.py``, one test of ours per test of theirs and of the same name, under its seed
(1472) and tolerances (``reference_ledger.py`` sorts them all). The reference checks its log lines
("unit scaling weight", "quantising function"); here the same facts are read from the transformed graph
and measured on its outputs and gradients. Where this library differs on purpose the test pins the
difference with its measured numbers and says why in its docstring.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import unitscale.functional as U
from tests.reference_models import InPlaceResiduals
from unitscale import analyse_module, simulate_fp8, track_scales, unit_scale
from unitscale import nn as unn


@pytest.fixture(autouse=True)
def reference_seed():
    torch.manual_seed(1472)


def calls(model, fn) -> list[torch.fx.Node]:
    return [n for n in model.graph_module.graph.nodes if n.op == "call_function" and n.target is fn]


QUANTISE = torch.ops.unitscale.quantise_fwd


class Linear(nn.Module):
    """The reference's ``Model`` of its FP8 tests: one linear layer (its output summed, or not)."""

    def __init__(self, d_in: int, d_out: int, layer: type[nn.Module] = nn.Linear, total: bool = True) -> None:
        super().__init__()
        self.linear, self.total = layer(d_in, d_out), total

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        out = self.linear(t)
        return out.sum() if self.total else out


# -- transforms/test_compile.py ----------------------------------------------------------------------------


class CompileModule(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(hidden)
        self.l1, self.l2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.dropout(self.l2(F.gelu(self.l1(self.layer_norm(x)))), 0.2)
        return x, x.sum()


def test_compile():
    """The reference only runs the plain and the unit-scaled model compiled (its ``compile`` is its own
    wrapper; here it is ``torch.compile``, so the plain model's run tests torch alone and is left out).
    Here the unit-scaled model, compiled before its first call (so captured inside ``torch.compile``),
    computes what it computes eagerly under the same seed, dropout's mask included, to float rounding.
    Backend ``aot_eager``: the question is the capture, and inductor's start-up warns under this suite."""
    mod = CompileModule(2**6)
    x = torch.randn(2**3, 2**6)
    scaled = []
    for compiled in (False, True):
        model = unit_scale(mod, check=False)
        torch.manual_seed(1)
        scaled.append((torch.compile(model, backend="aot_eager") if compiled else model)(x))
    torch.testing.assert_close(scaled[0], scaled[1])
    assert scaled[1][0].std().item() == pytest.approx(1, abs=0.2)
    assert (scaled[1][0] == 0).float().mean().item() == pytest.approx(0.2, abs=0.05)


# -- transforms/test_simulate_format.py --------------------------------------------------------------------


def fp32_and_fp8(model: nn.Module, inputs: list[torch.Tensor]):
    """Forward and backward through ``model`` and ``simulate_fp8(model)``: outputs, input gradients, the
    parameters' gradients of each pass (cloned: the two share their parameters), and the FP8 model."""
    out = model(*inputs)
    out.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    inputs8 = [t.detach().clone().requires_grad_() for t in inputs]
    fp8 = simulate_fp8(model)
    out8 = fp8(*inputs8)
    out8.backward()
    grads8 = {name.removeprefix("module."): p.grad for name, p in fp8.named_parameters()}
    return (out, [t.grad for t in inputs], grads), (out8, [t.grad for t in inputs8], grads8), fp8


SHARED_WHY = """
    The reference's ``simulate_fp8`` deep-copies the model, so its test compares two ``.grad``s; this
    library's shares the parameters (documented: ``simulate_fp8(m)`` trains ``m``), so the two passes'
    gradients accumulate in one ``.grad`` and the test compares each pass's, cloned."""


def test_simulate_fp8_linear():
    x = torch.randn(2**8, 2**9, requires_grad=True)
    model = Linear(2**9, 2**10)
    (out, (dx,), grads), (out8, (dx8,), grads8), fp8 = fp32_and_fp8(model, [x])
    assert fp8.module.linear.weight is model.linear.weight
    assert out8.item() != out.item()
    assert not torch.equal(dx8, dx)
    assert not torch.equal(grads8["linear.weight"], grads["linear.weight"])
    # "quantising function": the input and the weight of the one linear, each rounded to E4M3
    assert len(calls(fp8, QUANTISE)) == 2
    rel = ((grads8["linear.weight"] - grads["linear.weight"]).std() / grads["linear.weight"].std()).item()
    assert 1e-3 < rel < 0.2


def test_simulate_fp8_unit_scaled_linear():
    x = torch.randn(2**8, 2**9, requires_grad=True)
    model = Linear(2**9, 2**10, layer=unn.Linear)
    (out, (dx,), grads), (out8, (dx8,), grads8), fp8 = fp32_and_fp8(model, [x])
    assert fp8.module.linear.weight is model.linear.weight
    assert out8.item() != out.item()
    assert not torch.equal(dx8, dx)
    assert not torch.equal(grads8["linear.weight"], grads["linear.weight"])
    assert len(calls(fp8, QUANTISE)) == 2


for _test in (test_simulate_fp8_linear, test_simulate_fp8_unit_scaled_linear):
    _test.__doc__ = "The reference's assertions, each true." + SHARED_WHY


class Attention(nn.Module):
    def __init__(self, attention) -> None:
        super().__init__()
        self.attention = attention

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.attention(q, k, v).sum()


def check_fp8_attention(attention) -> None:
    inputs = [torch.randn(2**8, 2**8, requires_grad=True) for _ in range(3)]
    (out, grads, _), (out8, grads8, _), fp8 = fp32_and_fp8(Attention(attention), inputs)
    assert out8.item() != out.item()
    assert all(not torch.equal(a, b) for a, b in zip(grads, grads8, strict=True))
    assert len(calls(fp8, QUANTISE)) == 3  # q, k and v


def test_simulate_fp8_attention():
    check_fp8_attention(F.scaled_dot_product_attention)


def test_simulate_fp8_unit_scaled_attention():
    check_fp8_attention(U.scaled_dot_product_attention)


# -- transforms/test_track_scales.py -----------------------------------------------------------------------


class ReluPlusOnes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(x)
        y = torch.ones_like(x, dtype=x.dtype)
        z = x + y
        return z.sum()


def test_track_scales():
    """The reference's stds, numels and abs-maxes, each true. Its tracker also records the mean |x|,
    |mean x| and min |x| of each tensor, which this library's does not: a scale report is the std (and
    the largest magnitude, for the format's range), in one forward and backward call, where the
    reference's has no backward statistics until ``loss.backward()``."""
    x = torch.randn(2**4, 2**10)
    report = track_scales(ReluPlusOnes(), x)
    rows = {row.node: row for row in report}
    assert set(rows) == {"x", "relu", "ones_like", "add", "sum_1"}
    assert rows["x"].forward == pytest.approx(1, abs=0.01)
    assert math.prod(rows["x"].shape) == 2**14
    assert rows["relu"].forward == pytest.approx(math.sqrt((1 - 1 / math.pi) / 2), abs=0.01)
    assert math.prod(rows["relu"].shape) == 2**14
    assert rows["ones_like"].forward == 0.0 and rows["ones_like"].abs_max == 1.0
    assert rows["ones_like"].backward is None  # nothing is differentiated through ones_like
    assert math.prod(rows["sum_1"].shape) == 1 and rows["sum_1"].backward is not None
    assert rows["add"].backward == 0.0  # the sum's gradient: all ones
    assert rows["x"].backward == pytest.approx(0.5, abs=0.01)  # relu's gradient: 0s and 1s
    for name in ("mean_abs", "abs_mean", "abs_min"):
        assert not hasattr(rows["x"], name)


class EmbedSoftmaxGather(nn.Module):
    def __init__(self, emb_size: int, dim: int) -> None:
        super().__init__()
        self.emb, self.linear = nn.Embedding(emb_size, dim), nn.Linear(dim, dim)

    def forward(self, idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.emb(idxs)
        scores = F.softmax(self.linear(x), dim=-1)
        top_idx = torch.unsqueeze(torch.argmax(scores, dim=-1), -1)
        top_score_x = torch.gather(x, -1, top_idx)
        top_score_x -= x.mean()
        return top_score_x, top_idx


def test_prune_non_float_tensors():
    """The report never has the rows the reference's ``prune_non_float_tensors`` removes (the integer
    input, ``argmax``, ``unsqueeze``): its rows are what the reference's graph keeps after pruning."""
    idxs = torch.randint(0, 2**10, (2**3, 2**5))
    model = EmbedSoftmaxGather(2**10, 2**6)
    traced = {str(n.target) for n in torch.fx.symbolic_trace(model).graph.nodes}
    assert {"idxs", str(torch.argmax), str(torch.unsqueeze)} <= traced  # in the graph, not in the report
    report = track_scales(model, idxs)
    assert {row.node for row in report} == {
        "emb_weight", "embedding", "linear_weight", "linear_bias", "linear", "softmax", "gather", "mean", "sub",
    }  # fmt: skip
    assert all(row.dtype == "float32" for row in report)


class FlattenView(nn.Module):
    def __init__(self, emb_size: int, dim: int) -> None:
        super().__init__()
        self.emb, self.linear = nn.Embedding(emb_size, dim), nn.Linear(dim, dim // 2)

    def forward(self, idxs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.emb(idxs)
        x = x.flatten(start_dim=0, end_dim=-1).view(x.shape)
        scores = F.softmax(self.linear(x), dim=-1)
        top_idx = torch.unsqueeze(torch.argmax(scores, dim=-1), -1)
        top_score_x = torch.gather(x, -1, top_idx)
        top_score_x += torch.randn_like(top_score_x)
        return top_score_x, top_idx


def same_scale(row, source, rtol: float, backward: bool = True) -> bool:
    """The reference's test for pruning a node of one float input, on stds: the same within ``rtol``."""
    pairs = [(row.forward, source.forward)] + ([(row.backward, source.backward)] if backward else [])
    return all(
        (a is None and b is None) or (a is not None and b is not None and math.isclose(a, b, rel_tol=rtol))
        for a, b in pairs
    )


def test_prune_same_scale_tensors():
    """What ``prune_same_scale_tensors`` decides, read from the report's stds (the reference compares the
    mean |x|; it has no pruning functions here: a report's rows are a list). At ``rtol=2**-16`` only the
    flatten and the view keep their input's scale, both ways; at ``2**-4`` the gather and the embedding
    also do (forward: the reference's test runs no backward pass)."""
    idxs = torch.randint(0, 2**10, (2**3, 2**5))
    rows = {row.node: row for row in track_scales(FlattenView(2**10, 2**6), idxs)}
    one_input = {"flatten": "embedding", "view": "flatten", "softmax": "linear", "gather": "view"}
    one_input |= {"embedding": "emb_weight", "randn_like": "gather"}
    tight = {n for n, src in one_input.items() if same_scale(rows[n], rows[src], 2**-16)}
    assert tight == {"flatten", "view"}
    loose = {n for n, src in one_input.items() if same_scale(rows[n], rows[src], 2**-4, backward=False)}
    assert loose == {"flatten", "view", "gather", "embedding"}


class DivMulReluSub(nn.Module):
    def forward(self, a: torch.Tensor) -> torch.Tensor:
        b = a / 1.0
        c = b * 1.0
        d = F.relu(c)
        e = b - d
        return e.sum()


def test_prune_same_scale_tensors_with_grad():
    """Forward, the reference's pruning holds on stds: the division and the product keep their input's
    scale, the relu and the difference do not. Backward it differs: the reference keeps ``c = b * 1.0``
    because ``b``'s gradient, ``1 - [c > 0]``, has a different mean |g| from ``c``'s, ``-[c > 0]``
    (0.5009 and 0.4991 here, torch's own autograd); their stds are the same number (an indicator and its
    complement have one std), so on this library's statistic the product keeps its scale both ways."""
    a = torch.randn(2**6, 2**8)
    rows = {row.node: row for row in track_scales(DivMulReluSub(), a)}
    assert same_scale(rows["truediv"], rows["a"], 2**-16) and same_scale(rows["mul"], rows["truediv"], 2**-16)
    assert not same_scale(rows["relu"], rows["mul"], 2**-16, backward=False)
    leaf = a.clone().requires_grad_()
    b = leaf / 1.0
    c = b * 1.0
    kept = {}
    for name, t in (("b", b), ("c", c)):
        t.register_hook(lambda g, name=name: kept.__setitem__(name, g))
    (b - F.relu(c)).sum().backward()
    mean_abs = {name: g.abs().mean().item() for name, g in kept.items()}
    assert mean_abs["b"] != mean_abs["c"]
    assert mean_abs["b"] == pytest.approx(0.5009, abs=1e-4) and mean_abs["c"] == pytest.approx(0.4991, abs=1e-4)
    assert rows["mul"].backward == pytest.approx(kept["c"].std(correction=0).item(), rel=1e-6)
    assert rows["truediv"].backward == pytest.approx(kept["b"].std(correction=0).item(), rel=1e-6)
    assert rows["mul"].backward == pytest.approx(rows["truediv"].backward, rel=2**-16)


class AddReluAbs(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(F.relu(x + 1)).sum()


def test_prune_selected_nodes():
    """Each row names the function that made it, so leaving out ``abs`` and ``relu`` is a selection."""
    report = track_scales(AddReluAbs(), torch.randn(2**6, 2**8))
    assert [row.op for row in report] == ["input", "add", "relu", "abs", "Tensor.sum"]
    assert [row.node for row in report if row.op not in ("abs", "relu")] == ["x", "add", "sum_1"]


# -- transforms/test_unit_scale.py -------------------------------------------------------------------------


def custom_gelu(x: torch.Tensor) -> torch.Tensor:
    inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
    return 0.5 * x * (1.0 + torch.tanh(inner))


class MLPLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.layer_norm = nn.LayerNorm(hidden)
        self.l1, self.l2 = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = F.dropout(self.l2(custom_gelu(self.l1(self.layer_norm(x)))), 0.2)
        return x, x.sum()


def test_unit_scale():
    """The reference's log lines, read from the graph: weights unit-scaled (``N(0, 1)``), biases set to
    zero, the functions unit-scaled, the written-out GELU replaced, and every op unconstrained (no
    residual add: each is on the trunk)."""
    x = torch.randn(2**6, 2**10, requires_grad=True)
    model = unit_scale(nn.Sequential(MLPLayer(2**10)), replace={custom_gelu: F.gelu})
    out, loss = model(x)
    loss.backward()
    layer = model.module[0]
    for t in (out, x.grad, layer.layer_norm.weight.grad, layer.l1.weight.grad, layer.l2.weight.grad):
        assert t.std().item() == pytest.approx(1, abs=0.2)
    assert layer.l1.weight.std().item() == pytest.approx(1, abs=0.01)
    assert not layer.l1.bias.any() and not layer.l2.bias.any()
    assert len(calls(model, U.linear)) == 2 and len(calls(model, U.layer_norm)) == 1
    assert len(calls(model, U.gelu)) == 1 and not calls(model, torch.tanh)
    assert all(n.kwargs.get("constraint", "missing") is None for n in calls(model, U.linear) + calls(model, U.gelu))


class ResidualMLPLayer(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        skip = x
        x = x + 1
        x = self.l1(x)
        x = x + skip
        skip = x
        x += 1
        x = self.l2(x)
        x += skip
        return x, x.sum()


def test_unit_scale_residual_add():
    """Two residual adds, ``tau`` 0.5 (the reference's ratio 1 is the share 0.5), and the two adds of a
    constant unit-scaled functions (:func:`~unitscale.functional.add`, which leaves a shift unscaled, as
    the reference's does); before, they were left as they were and reported unscaled."""
    x = torch.randn(2**6, 2**10, requires_grad=True)
    model = unit_scale(ResidualMLPLayer(2**10))
    out, loss = model(x)
    loss.backward()
    adds = calls(model, U.residual_add)
    assert len(adds) == 2 and all(n.args[2] == 0.5 for n in adds)
    assert [n.args[1] for n in calls(model, U.add)] == [1, 1]
    assert not [line for line in model.unscaled_ops if "add" in line]
    assert x.grad is not None and torch.isfinite(out).all()


def test_unit_scaling_keeps_what_an_in_place_add_after_a_skip_computes():
    """Not the reference's: ``skip = x; x += 1`` changes the skip too, so the residual split goes after the
    change (the translation found it placed before, so ``+ 1`` reached the branch alone; outputs off by 0.71)."""

    class OutOfPlace(InPlaceResiduals):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.l1(x + 1) + x
            x = x + 1
            return self.l2(x) + x

    x = torch.randn(4, 8)
    in_place, out_of_place = InPlaceResiduals(8), OutOfPlace(8)
    out_of_place.load_state_dict(in_place.state_dict())
    torch.testing.assert_close(in_place(x.clone()), out_of_place(x))
    outputs = []
    for model in (in_place, out_of_place):
        torch.manual_seed(1)
        outputs.append(unit_scale(model)(x.clone()))
    torch.testing.assert_close(*outputs)


def test_fp8_unit_scaling():
    """``unit_scale(simulate_fp8(m))``: unit scaling moves before the quantisation (in the list of
    transforms and in the graph, where each rounded operand feeds a unit-scaled linear), so it computes
    what ``simulate_fp8(unit_scale(m))`` does."""
    x = torch.randn(2**8, 2**9)
    base = Linear(2**9, 2**10, total=False)
    model = unit_scale(simulate_fp8(base))
    assert [t.__name__ for t in model.transforms] == ["unit_scale", "simulate_format"]
    outputs = []
    for m in (model, simulate_fp8(unit_scale(base))):
        torch.manual_seed(1)
        outputs.append(m(x))
    torch.testing.assert_close(*outputs)
    assert outputs[0].std().item() == pytest.approx(1, abs=0.1)
    (linear,) = calls(model, U.linear)
    assert all(arg.target is torch.ops.unitscale.quantise_bwd for arg in linear.args[:2])


# -- test_utils.py -----------------------------------------------------------------------------------------

ANNOTATED = re.compile(r"^\s*(\w+) = (.*?)  # \(-> [\d.e+-]+, <- [\d.e+-]+\)$")


def annotated_lines(code: str) -> list[tuple[str, str]]:
    """``(name, what it calls)`` of every line of the annotated code that carries scales."""
    found = [ANNOTATED.match(line) for line in code.splitlines()]
    return [(m[1], m[2].split("(")[0]) for m in found if m]


def check_input_scales(code: str, x: torch.Tensor, module: nn.Module, grad: torch.Tensor) -> None:
    """The input's scales are torch's own: ``x``'s std and that of its gradient from ``backward``."""
    leaf = x.detach().clone().requires_grad_()
    module(leaf).backward(grad)
    found = re.search(r"def forward.*# input_1 \(-> ([\d.]+), <- ([\d.]+)\)", code)
    assert found is not None, code
    fwd, bwd = found.groups()
    assert float(fwd) == pytest.approx(leaf.std(correction=0).item(), rel=5e-3)
    assert float(bwd) == pytest.approx(leaf.grad.std(correction=0).item(), rel=5e-3)


FORMAT_WHY = """
    The reference compares its printed code with its scales blanked out; this library prints another
    format (each scale in a comment, ``# (-> 1.0, <- 1.44)``, its ops under their full names, its modules'
    own attribute names), so the test compares the lines that carry scales, in order, and checks the
    input's numbers against torch's own."""


def test_analyse_mlp():
    """The reference's gated ``MLP`` is :class:`~unitscale.nn.SwiGLU` here: the same lines (the input,
    up, gate, their product, down), each with its scales (a batch of 2**8, not 2**10: a quarter the time)."""
    x = torch.randn(2**8, 2**10).requires_grad_()
    grad = torch.randn(2**8, 2**10)
    module = unn.SwiGLU(2**10)
    code = analyse_module(module, x, grad, syntax_highlight=False)
    assert annotated_lines(code) == [
        ("input_1", "input"),
        ("up_weight", "self.up.weight"),
        ("linear", "unitscale_functional_linear"),
        ("gate_weight", "self.gate.weight"),
        ("linear_1", "unitscale_functional_linear"),
        ("silu_glu", "unitscale_functional_silu_glu"),
        ("down_weight", "self.down.weight"),
        ("linear_2", "unitscale_functional_linear"),
    ]
    check_input_scales(code, x, module, grad)


def test_analyse_mhsa():
    """The same lines as the reference's, and torch's reshapes in place of ``einops.rearrange``
    (``unflatten``, ``movedim``, ``transpose`` into heads; ``transpose``, ``flatten`` back)."""
    x = torch.randn(2**8, 2**6, 2**6).requires_grad_()
    grad = torch.randn(2**8, 2**6, 2**6)
    module = unn.MHSA(2**6, 4, is_causal=False, dropout_p=0.1)
    code = analyse_module(module, x, grad, syntax_highlight=False)
    ops = [call for _, call in annotated_lines(code)]
    assert ops == [
        "input", "self.linear_qkv.weight", "unitscale_functional_linear",
        "linear.unflatten", "unflatten.movedim", "movedim.transpose", "transpose[0]", "transpose[1]",
        "transpose[2]", "unitscale_functional_scaled_dot_product_attention",
        "scaled_dot_product_attention.transpose", "transpose_1.flatten", "self.linear_o.weight",
        "unitscale_functional_linear",
    ]  # fmt: skip
    module.eval()  # the oracle's own pass: attention dropout off, as the tracked run's is not
    x_eval = x.detach()
    code_eval = analyse_module(module, x_eval.requires_grad_(), grad, syntax_highlight=False)
    check_input_scales(code_eval, x_eval, module, grad)


for _test in (test_analyse_mlp, test_analyse_mhsa):
    _test.__doc__ += FORMAT_WHY


class _Chain(nn.Module):
    """Three pre-norm residual adds, each one's skip the previous add: ``x + f_1 + f_2 + f_3``.

    Each branch normalises its input, as a batch-normalised block's output does not depend on its input's
    scale: the unit-scaled stream (the sum divided by ``(k + 1)**0.5``) gives the branch the same output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fs = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for f in self.fs:
            x = x + f(F.layer_norm(x, x.shape[-1:]))
        return x


def test_chained_residual_adds_keep_the_plain_sums_weights():
    """Deliberate difference: the ``k``-th add of a chain gets tau ``1 / (k + 1)`` (the paper's running
    mean), where the reference's transform gives each add tau 0.5 and the latest branch the weight of the whole
    stream. So the output is the model's own sum, with its (re-initialised) weights, times ``4**-0.5``."""
    model = unit_scale(_Chain(16))
    x = torch.randn(8, 16)
    out = model(x)
    assert [n.args[2] for n in calls(model, U.residual_add)] == pytest.approx([1 / 2, 1 / 3, 1 / 4])
    expected = x
    for f in model.module.fs:
        normed = F.layer_norm(expected, (16,))
        expected = expected + F.linear(normed, f.weight / 16**0.5)  # unit-scaled linear: fan_in**-0.5
    torch.testing.assert_close(out, expected / 2, rtol=1e-4, atol=1e-4)
