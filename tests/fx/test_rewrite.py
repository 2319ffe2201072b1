"""Tests for unitscale.fx's rewrites: inlining module calls and inverting functions."""

from __future__ import annotations

import math
import operator
import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from torch import fx, nn

import unitscale
from tests.fx.module_trees import build, descriptions
from unitscale.errors import (
    NotAModuleError,
    NotCallableError,
    NotInvertibleError,
    PredicateError,
    TraceError,
    UnitscaleError,
)
from unitscale.examples.models import MLP, TinyGPT, resnet18
from unitscale.fx import inline, invert, register_inverse


def _call_modules(gm: fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_module"]


# -- inline -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_inline_flattens_resnet18_with_no_call_module_left(mode):
    torch.manual_seed(0)
    model = getattr(resnet18(num_classes=10, width=8), mode)()
    x = torch.randn(2, 3, 32, 32)
    flat = inline(fx.symbolic_trace(model), example_inputs=(x,))
    assert _call_modules(flat) == []
    names = [n.name for n in flat.graph.nodes]
    assert names[:3] == ["x", "conv1_weight", "conv1_conv2d"]
    assert {"layer1_0_conv1_conv2d", "layer1_0_bn1_batch_norm", "layer1_0_relu_1_relu", "fc_linear"} <= set(names)
    with torch.no_grad():
        expected = model(x)
        assert torch.allclose(flat(x), expected, atol=1e-6)


def test_inline_marks_where_each_node_came_from():
    model = nn.Sequential(MLP(2), nn.Tanh())
    flat = inline(model)
    origin = {n.name: n.meta.get("inlined_from") for n in flat.graph.nodes}
    assert origin == {
        "input_1": None,
        "_0_fc1_weight": "0.fc1",
        "_0_fc1_bias": "0.fc1",
        "_0_fc1_linear": "0.fc1",
        "_0_act_relu": "0.act",
        "_0_fc2_weight": "0.fc2",
        "_0_fc2_bias": "0.fc2",
        "_0_fc2_linear": "0.fc2",
        "_1_tanh": "1",
        "output": None,
    }


def test_inline_predicate_picks_modules_and_leaves_the_input_alone():
    torch.manual_seed(0)
    model = resnet18(num_classes=10, width=8).eval()
    gm = fx.symbolic_trace(model)
    before = gm.code
    flat = inline(gm, lambda m, name: not isinstance(m, nn.Conv2d))
    assert gm.code == before
    convs = [name for name, m in model.named_modules() if isinstance(m, nn.Conv2d)]
    assert _call_modules(flat) == convs
    x = torch.randn(1, 3, 16, 16)
    assert torch.equal(flat(x), model(x))


def test_inline_recurses_into_modules_a_custom_tracer_kept_whole():
    model = nn.Sequential(MLP(3), MLP(3, activation=nn.GELU()))
    gm = fx.GraphModule(model, unitscale.fx.LeafTracer(leaf_types=(MLP,)).trace(model))
    assert _call_modules(gm) == ["0", "1"]
    assert _call_modules(inline(gm, lambda m, name: not isinstance(m, nn.GELU))) == ["1.act"]
    x = torch.randn(4, 3)
    assert torch.equal(inline(gm)(x), model(x))


def test_inline_works_on_tinygpt():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=11, d_model=8, n_layers=2, n_heads=2, seq_len=8).eval()
    idx = torch.randint(0, 11, (2, 6))
    flat = inline(model, example_inputs=(idx,))
    assert _call_modules(flat) == []
    assert torch.equal(flat(idx), model(idx))


def test_inline_rejects_bad_input():
    with pytest.raises(
        NotAModuleError, match=re.escape("inline() got list [1, 2]; pass an nn.Module or fx.GraphModule")
    ):
        inline([1, 2])
    with pytest.raises(PredicateError, match=re.escape("inline(predicate=...) got str 'all'")):
        inline(MLP(2), "all")


def test_inline_predicate_that_raises_names_the_module():
    def pick(m, name):
        raise RuntimeError("oops")

    with pytest.raises(
        PredicateError, match=re.escape("the inline predicate raised RuntimeError: oops on module 'fc1' (Linear)")
    ):
        inline(MLP(2), pick)
    with pytest.raises(
        PredicateError,
        match=re.escape("the inline predicate returned 1 for module 'fc1' (Linear); it must return True or False"),
    ):
        inline(MLP(2), lambda m, name: 1)


class Flaky(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, 0.5, training=True)


def test_inline_reports_outputs_that_differ():
    torch.manual_seed(0)
    with pytest.raises(
        TraceError, match=r"the inlined module's output 0 differs from Sequential's by up to .*random ops"
    ):
        inline(nn.Sequential(Flaky()), example_inputs=(torch.randn(64),))


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


def test_inline_of_an_untraceable_module_says_how_to_skip_it():
    gm = fx.GraphModule(
        nn.Sequential(DataDependent()),
        unitscale.fx.LeafTracer(leaf_types=(DataDependent,)).trace(nn.Sequential(DataDependent())),
    )
    with pytest.raises(
        TraceError, match=re.escape("cannot inline module '0' (DataDependent): torch.fx could not trace DataDependent")
    ):
        inline(gm)
    assert _call_modules(inline(gm, lambda m, name: False)) == ["0"]


@settings(max_examples=25, deadline=None)
@given(descriptions)
def test_random_nested_module_trees_inline_to_the_same_outputs(desc):
    torch.manual_seed(0)
    model = build(desc)
    x = torch.randn(5, 4)
    flat = inline(model)
    assert _call_modules(flat) == []
    for mode in ("train", "eval"):
        getattr(model, mode)()
        assert torch.allclose(inline(model)(x), model(x), atol=1e-6)


# -- invert: the registry ---------------------------------------------------------------


def test_classic_exp_tan_inverts_exactly_on_one_to_five():
    def f(x):
        return torch.exp(torch.tan(x))

    assert torch.equal(f(invert(f)(torch.arange(5) + 1)), torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))


UNARY = [
    # (name, f, inputs inside f's domain where it is well conditioned)
    ("sin", torch.sin, (-1.2, 1.2)),
    ("arcsin", torch.arcsin, (-0.9, 0.9)),
    ("cos", lambda x: x.cos(), (0.2, 2.9)),
    ("arccos", lambda x: torch.acos(x), (-0.9, 0.9)),
    ("tan", lambda x: x.tan(), (-1.2, 1.2)),
    ("arctan", torch.arctan, (-5.0, 5.0)),
    ("exp", lambda x: x.exp(), (-3.0, 3.0)),
    ("log", torch.log, (0.1, 5.0)),
    ("sigmoid", torch.sigmoid, (-4.0, 4.0)),
    ("expit", torch.special.expit, (-4.0, 4.0)),
    ("logit", lambda x: x.logit(), (0.1, 0.9)),
    ("tanh", F.tanh, (-2.0, 2.0)),
    ("atanh", torch.atanh, (-0.9, 0.9)),
    ("neg", lambda x: -x, (-3.0, 3.0)),
    ("negative", torch.negative, (-3.0, 3.0)),
    ("reciprocal", lambda x: x.reciprocal(), (0.5, 3.0)),
]


@pytest.mark.parametrize(("name", "f", "domain"), UNARY, ids=[u[0] for u in UNARY])
def test_each_registered_op_inverts_in_every_spelling(name, f, domain):
    x = torch.linspace(*domain, 11, dtype=torch.float64)
    g = invert(lambda t: f(t))
    assert torch.allclose(g(f(x)), x, atol=1e-10)
    assert torch.allclose(f(g(f(x))), f(x), atol=1e-10)


CONSTANT_OPS = [
    ("x * c", lambda x: x * 2.5),
    ("c * x", lambda x: 2.5 * x),
    ("torch.mul", lambda x: torch.mul(x, -3)),
    ("x.mul", lambda x: x.mul(0.5)),
    ("x + c", lambda x: x + 4),
    ("c + x", lambda x: 4 + x),
    ("torch.add alpha", lambda x: torch.add(x, 2, alpha=3)),
    ("x - c", lambda x: x - 1.5),
    ("x.sub", lambda x: x.sub(1.5)),
    ("c - x", lambda x: 1.5 - x),
    ("torch.sub alpha", lambda x: torch.sub(2, x, alpha=4)),
    ("x / c", lambda x: x / 8),
    ("x.div", lambda x: x.div(8)),
    ("c / x", lambda x: 8 / x),
    ("x ** c", lambda x: x**3),
    ("x.pow", lambda x: x.pow(0.5)),
    ("c ** x", lambda x: 2**x),
    ("x * tensor", lambda x: x * torch.tensor(3.0, dtype=torch.float64)),
]


@pytest.mark.parametrize(("spelling", "f"), CONSTANT_OPS, ids=[c[0] for c in CONSTANT_OPS])
def test_ops_with_a_constant_operand_invert(spelling, f):
    x = torch.linspace(0.5, 3.0, 7, dtype=torch.float64)
    assert torch.allclose(invert(f)(f(x)), x, atol=1e-10)


def test_invert_emits_the_inverse_in_reverse_order():
    g = invert(lambda x: torch.sigmoid(3 * x.tan() + 1))
    assert [(n.op, n.name) for n in g.graph.nodes] == [
        ("placeholder", "y"),
        ("call_function", "logit"),
        ("call_function", "sub"),
        ("call_function", "truediv"),
        ("call_function", "atan"),
        ("output", "output"),
    ]


def test_invert_a_module_with_a_constant_buffer():
    class Affine(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("scale", torch.tensor([2.0, 4.0]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.tanh(x * self.scale) + 1

    model = Affine()
    x = torch.tensor([0.1, -0.2])
    assert torch.allclose(invert(model)(model(x)), x, atol=1e-6)
    seq = nn.Sequential(nn.Tanh(), nn.Sigmoid())
    y = torch.tensor([0.6, 0.7])
    assert torch.allclose(seq(invert(seq)(y)), y)


def cube(x: torch.Tensor) -> torch.Tensor:
    return x * x * x


def cube_root(x: torch.Tensor) -> torch.Tensor:
    return x.sign() * x.abs() ** (1 / 3)


torch.fx.wrap("cube")
torch.fx.wrap("cube_root")


def test_register_inverse_teaches_invert_a_new_function():
    def f(x):
        return cube(x) + 1

    with pytest.raises(
        NotInvertibleError,
        match=re.escape(f"cannot invert node 'cube' ({__name__}.cube) in function f: no inverse is registered"),
    ):
        invert(f)
    register_inverse(cube, cube_root)
    x = torch.tensor([-2.0, 0.5, 3.0])
    assert torch.allclose(invert(f)(f(x)), x)
    assert torch.allclose(invert(lambda t: cube_root(t))(torch.tensor([2.0])), torch.tensor([8.0]))


def test_register_inverse_rejects_non_callables():
    with pytest.raises(
        NotCallableError, match=re.escape("register_inverse(g=...) got str 'log'; pass a function of one tensor")
    ):
        register_inverse(torch.exp, "log")


# -- invert: what cannot be inverted ----------------------------------------------------


def relu_then_exp(x):
    return torch.relu(x).exp()


def two_tensors(x):
    return x.sin() * x


def branch(x):
    y = x.exp()
    return y.sin() + y.cos()


def two_outputs(x):
    return x.sin(), x.cos()


def two_inputs(x, y):
    return x + y


def times_zero(x):
    return x * 0


def in_place(x):
    y = x * 2
    y.view(-1).mul_(2)  # changes y through a view: an inverse read off y's own chain would be wrong
    return y


def constant(x):
    return torch.ones(3)


def python_branch(x):
    return x if x.sum() > 0 else -x


def with_eps(x):
    return torch.logit(x, eps=1e-6)


NOT_INVERTIBLE = [
    (
        relu_then_exp,
        (
            "cannot invert node 'relu' (torch.relu) in function relu_then_exp: no inverse is registered for "
            "torch.relu. If it is one-to-one on your inputs, register one with unitscale.fx.register_inverse(f, g); "
            "an op that is not (relu, abs) cannot be inverted"
        ),
    ),
    (
        two_tensors,
        (
            "cannot invert function two_tensors: node 'mul' (operator.mul) combines 2 values computed from the "
            "input (sin, x); only ops of one tensor and constants can be inverted"
        ),
    ),
    (
        branch,
        (
            "cannot invert function branch: node 'add' (operator.add) combines 2 values computed from the input "
            "(sin, cos); only ops of one tensor and constants can be inverted"
        ),
    ),
    (
        two_outputs,
        (
            "cannot invert function two_outputs: it returns 2 values (tuple); invert needs a function with "
            "exactly one tensor output"
        ),
    ),
    (
        two_inputs,
        "cannot invert function two_inputs: it takes 2 inputs (x, y); invert needs a function of exactly one tensor",
    ),
    (times_zero, "cannot invert node 'mul' (operator.mul): it multiplies by 0, which loses the input"),
    (
        in_place,
        (
            "cannot invert function in_place: node 'mul_' (Tensor.mul_) changes its input in place; use the "
            "out-of-place op"
        ),
    ),
    (constant, "cannot invert function constant: its output does not depend on its input"),
    (
        python_branch,
        (
            "cannot invert function python_branch: it cannot be traced (symbolically traced variables cannot be "
            "used as inputs to control flow); control flow that depends on the input (a Python if on a tensor) "
            "is not invertible as one chain"
        ),
    ),
    (
        with_eps,
        (
            "cannot invert node 'logit' (torch.logit) in function with_eps: it is called with extra arguments () "
            "{'eps': 1e-06}; its registered inverse takes one tensor"
        ),
    ),
]


@pytest.mark.parametrize(("f", "message"), NOT_INVERTIBLE, ids=[f.__name__ for f, _ in NOT_INVERTIBLE])
def test_not_invertible_functions_raise_naming_the_op_and_node(f, message):
    with pytest.raises(NotInvertibleError, match=re.escape(message)) as info:
        invert(f)
    assert isinstance(info.value, (UnitscaleError, ValueError))


def test_an_alias_the_trace_misses_is_refused_not_inverted_wrongly():
    def alias(x):
        y = x * 2
        z = y
        y += 1  # changes the tensor z holds; torch.fx traces it as y + 1, unused
        return z

    y = torch.tensor([3.0, 5.0])
    wrong = torch.fx.symbolic_trace(alias)(y / 2)  # what an inverse read off the trace would undo
    assert not torch.equal(wrong, alias(y / 2))
    with pytest.raises(
        NotInvertibleError, match=r"node 'add' \(operator.add\) is computed from the input and never used"
    ):
        invert(alias)


def test_the_refusals_remedy_inverts_the_function_as_it_runs():
    def alias(x):  # as the refusal above advises: the change written as y.add_(1)
        y = x * 2
        z = y
        y.add_(1)
        return z

    y = torch.tensor([3.0, 5.0])
    assert torch.equal(alias(invert(alias)(y)), y)


def test_an_unused_shape_is_no_reason_to_refuse():
    def with_shape(x):
        x.size()
        x.dim()
        return x * 2

    y = torch.tensor([3.0, 5.0])
    assert torch.equal(with_shape(invert(with_shape)(y)), y)


def test_an_in_place_op_inverts_as_its_operator_does():
    def in_place(x):
        y = x * 2
        y.add_(1)
        return y.exp_()

    def augmented(x):
        y = x * 2
        y += 1
        return y.exp()

    y = torch.tensor([0.5, 2.0, 7.0])
    for f in (in_place, augmented):
        assert torch.allclose(f(invert(f)(y)), y)
    assert invert(in_place).code == invert(augmented).code


BINARY_OPS = [operator.mul, operator.truediv, operator.add, operator.sub]
LOSES_THE_INPUT = (0.0, -0.0, float("nan"), float("inf"), -float("inf"))


@settings(max_examples=120, deadline=None)
@given(
    op=st.sampled_from(BINARY_OPS),
    c=st.one_of(st.floats(1e-3, 1e3), st.floats(-1e3, -1e-3), st.sampled_from(LOSES_THE_INPUT)),
    as_tensor=st.booleans(),
    y=st.floats(-4.0, 4.0),
)
def test_a_constant_operand_inverts_exactly_or_is_refused_naming_the_op(op, c, as_tensor, y):
    """``x * 0``, ``x * nan``, ``x + inf`` (as a number or inside a tensor constant) lose the input:
    their inverse would return NaN for every ``y``, so ``invert`` refuses them; every other constant
    gives ``f(g(y)) == y``, checked in float64 against ``y`` itself."""
    const = torch.tensor([c, 1.0], dtype=torch.float64) if as_tensor else c

    def f(x):
        return op(x, const)

    loses = not math.isfinite(c) or (c == 0 and op in (operator.mul, operator.truediv))
    if loses:
        with pytest.raises(NotInvertibleError, match=rf"^cannot invert node '\w+' \(operator\.{op.__name__}\)"):
            invert(f)
        return
    target = torch.tensor([y, y], dtype=torch.float64)
    assert torch.allclose(f(invert(f)(target)), target, rtol=1e-9, atol=1e-9)


def test_a_constant_computed_in_the_graph_is_checked_by_its_value():
    """The constant is a node (``torch.zeros(()) + 0``, a buffer): its value, not its spelling, decides."""

    class Masked(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("mask", torch.tensor([1.0, 0.0, 2.0]))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x * self.mask)

    with pytest.raises(NotInvertibleError, match=re.escape("multiplies by a tensor holding 0 (1 of 3 elements)")):
        invert(Masked())
    with pytest.raises(NotInvertibleError, match=re.escape("node 'mul' (operator.mul): it multiplies by a tensor")):
        invert(lambda x: x * (torch.zeros(()) + 0))
    g = invert(lambda x: x * (torch.ones(()) * 3))
    assert g(torch.tensor([6.0])).item() == 2.0


def test_invert_of_a_non_callable_raises_not_a_module_error():
    with pytest.raises(NotAModuleError, match=re.escape("invert() got float 3.0; pass a Python function or nn.Module")):
        invert(3.0)


def test_invert_is_exported_with_its_error():
    assert unitscale.errors.NotInvertibleError is NotInvertibleError
    assert unitscale.invert is invert and unitscale.inline is inline


# -- invert: random chains --------------------------------------------------------------

# op -> (its spellings, the inputs on which it is one-to-one with its principal inverse and
# well conditioned: outside them g picks another branch, e.g. acos(cos(-1)) = 1)
CHAIN_OPS = {
    "sin": ([torch.sin, lambda x: x.sin()], lambda v: v.abs().max() < 1.5),
    "arcsin": ([torch.arcsin, torch.asin, lambda x: x.arcsin()], lambda v: v.abs().max() < 0.99),
    "cos": ([torch.cos, lambda x: x.cos()], lambda v: (v.min() > 0.05) & (v.max() < 3.1)),
    "tan": ([torch.tan, lambda x: x.tan()], lambda v: v.abs().max() < 1.4),
    "arctan": ([torch.arctan, lambda x: x.atan()], lambda v: v.abs().max() < 1e3),
    "exp": ([torch.exp, lambda x: x.exp()], lambda v: v.max() < 5),
    "log": ([torch.log, lambda x: x.log()], lambda v: v.min() > 1e-2),
    "sigmoid": ([torch.sigmoid, lambda x: x.sigmoid()], lambda v: v.abs().max() < 8),
    "logit": ([torch.logit, lambda x: x.logit()], lambda v: (v.min() > 1e-3) & (v.max() < 1 - 1e-3)),
    "tanh": ([torch.tanh, lambda x: x.tanh()], lambda v: v.abs().max() < 4),
    "atanh": ([torch.atanh, lambda x: x.arctanh()], lambda v: v.abs().max() < 0.99),
    "neg": ([torch.neg, lambda x: -x, lambda x: x.neg()], lambda v: True),
    "reciprocal": ([torch.reciprocal, lambda x: x.reciprocal()], lambda v: v.abs().min() > 1e-2),
    "mul": ([lambda x: x * 1.7, lambda x: -0.6 * x, lambda x: x.mul(2.0)], lambda v: True),
    "add": ([lambda x: x + 0.3, lambda x: 1.1 + x, lambda x: torch.add(x, -0.7)], lambda v: True),
    "sub": ([lambda x: x - 0.4, lambda x: 0.9 - x, lambda x: x.sub(2)], lambda v: True),
    "div": ([lambda x: x / 3.0, lambda x: x.div(-0.5)], lambda v: True),
    "rdiv": ([lambda x: 2.0 / x], lambda v: v.abs().min() > 1e-2),
    "pow": ([lambda x: x**2, lambda x: x.pow(0.5), lambda x: torch.pow(x, 3)], lambda v: v.min() > 0.05),
    "rpow": ([lambda x: 2.0**x], lambda v: v.abs().max() < 10),
}

chains = st.lists(
    st.tuples(st.sampled_from(sorted(CHAIN_OPS)), st.integers(0, 2)),
    min_size=1,
    max_size=6,
)


@settings(max_examples=60, deadline=None)
@given(chains, st.floats(-2.0, 2.0))
def test_random_chains_of_invertible_ops_invert_within_1e5_on_their_domain(chain, start):
    ops = [CHAIN_OPS[name][0][spelling % len(CHAIN_OPS[name][0])] for name, spelling in chain]
    x = torch.tensor([start, start / 2 + 0.1, start / 3 - 0.2], dtype=torch.float64)
    v = x
    for (name, _), op in zip(chain, ops, strict=True):
        assume(bool(CHAIN_OPS[name][1](v)))
        v = op(v)
        assume(bool(torch.isfinite(v).all()) and bool(v.abs().max() < 1e4))

    def f(t):
        for op in ops:
            t = op(t)
        return t

    y = f(x)
    g = invert(f)
    assert torch.allclose(f(g(y)), y, rtol=1e-5, atol=1e-5)
    assert torch.allclose(g(y), x, rtol=1e-5, atol=1e-5)


def test_operator_module_spellings_are_covered():
    g = invert(lambda x: operator.truediv(operator.neg(x), 4))
    assert torch.allclose(g(torch.tensor([-0.5])), torch.tensor([2.0]))
