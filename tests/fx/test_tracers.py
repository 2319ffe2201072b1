"""Tests for the tracers of unitscale.fx: module paths, leaf choice, tagging, execution order."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from torch import fx, nn

from tests.fx.module_trees import build, descriptions
from unitscale.capture import trace_exec_order
from unitscale.errors import InputError, NotAModuleError, PredicateError, TraceError
from unitscale.examples.models import MLP, TinyGPT, resnet18
from unitscale.fx import (
    DeepTracer,
    ExecOrder,
    ExecOrderTracer,
    LeafTracer,
    ModulePathTracer,
    TaggingTracer,
    fx_exec_order,
)

ALL_TRACERS = [DeepTracer, ModulePathTracer, LeafTracer, TaggingTracer, ExecOrderTracer]


@pytest.fixture(scope="module")
def resnet() -> nn.Module:
    torch.manual_seed(0)
    return resnet18()


# -- ModulePathTracer -----------------------------------------------------------------


CLASSIC_TABLE = {
    "x": "",
    "conv1": "conv1",
    "layer1_0_conv1": "layer1.0.conv1",
    "add": "layer1.0",
    "layer1_0_relu_1": "layer1.0.relu",
    "layer2_0_downsample_0": "layer2.0.downsample.0",
    "flatten": "",
    "fc": "fc",
    "output": None,
}


@pytest.mark.parametrize(("node_name", "module_path"), CLASSIC_TABLE.items())
def test_module_path_tracer_gives_the_classic_resnet18_table(resnet, node_name, module_path):
    tracer = ModulePathTracer()
    nodes = {n.name: n for n in tracer.trace(resnet).nodes}
    node = nodes[node_name]
    assert tracer.node_to_originating_module.get(node) == module_path
    assert node.meta.get("module_path") == module_path


def test_module_path_tracer_records_every_node_but_the_output(resnet):
    tracer = ModulePathTracer()
    graph = tracer.trace(resnet)
    missing = [n.name for n in graph.nodes if n not in tracer.node_to_originating_module]
    assert missing == ["output"]
    assert len(tracer.node_to_originating_module) == len(graph.nodes) - 1


def test_module_path_tracer_state_lives_on_the_instance():
    a, b = ModulePathTracer(), ModulePathTracer()
    graph_a = a.trace(MLP(4))
    assert b.node_to_originating_module == {}
    b.trace(nn.Sequential(nn.ReLU()))
    assert set(a.node_to_originating_module) == {n for n in graph_a.nodes if n.op != "output"}
    # a second trace replaces the first one's records
    graph_a2 = a.trace(nn.Sequential(nn.ReLU()))
    assert set(a.node_to_originating_module) == {n for n in graph_a2.nodes if n.op != "output"}


# -- DeepTracer (fixes) -----------------------------------------------------------------


def test_deep_tracer_traces_batchnorm_models_and_leaves_them_unchanged():
    torch.manual_seed(0)
    model = resnet18(num_classes=10, width=8).eval()  # a deep trace fixes the mode it sees
    gm = fx.GraphModule(model, DeepTracer().trace(model))
    assert not [n for n in gm.graph.nodes if n.op == "call_module"]
    assert "_check_input_dim" not in model.bn1.__dict__
    x = torch.randn(2, 3, 32, 32)
    assert torch.allclose(gm(x), model(x), atol=1e-6)


def test_deep_tracer_without_recursion_makes_every_submodule_a_leaf():
    graph = DeepTracer(recurse_modules=False).trace(nn.Sequential(MLP(2), nn.ReLU()))
    assert [(n.op, n.target) for n in graph.nodes if n.op == "call_module"] == [
        ("call_module", "0"),
        ("call_module", "1"),
    ]


def test_tracers_proxy_buffers_so_tinygpt_traces():
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=11, d_model=8, n_layers=1, n_heads=2, seq_len=8).eval()
    gm = fx.GraphModule(model, ModulePathTracer().trace(model))
    idx = torch.randint(0, 11, (2, 5))
    assert torch.equal(gm(idx), model(idx))


# -- LeafTracer -------------------------------------------------------------------------


def test_leaf_tracer_tracing_through_relu_gives_call_function_relu_inplace_false():
    graph = LeafTracer(trace_types=(nn.ReLU,)).trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    relu = next(n for n in graph.nodes if n.name == "relu")
    assert (relu.op, relu.target, relu.kwargs) == ("call_function", F.relu, {"inplace": False})
    default = fx.symbolic_trace(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
    assert [n.op for n in default.graph.nodes if n.name == "_1"] == ["call_module"]


def test_leaf_tracer_keeps_chosen_types_as_leaves():
    model = nn.Sequential(MLP(2), MLP(2, activation=nn.GELU()))
    graph = LeafTracer(leaf_types=(MLP,)).trace(model)
    assert [n.target for n in graph.nodes if n.op == "call_module"] == ["0", "1"]
    graph = LeafTracer().trace(model)
    assert [n.target for n in graph.nodes if n.op == "call_module"] == [
        "0.fc1",
        "0.act",
        "0.fc2",
        "1.fc1",
        "1.act",
        "1.fc2",
    ]


def test_leaf_predicate_decides_before_types_and_none_falls_back():
    model = MLP(2)
    tracer = LeafTracer(
        leaf_types=(nn.ReLU,),
        is_leaf=lambda m, name: False if name == "act" else None,
    )
    graph = tracer.trace(model)
    assert [(n.op, n.name) for n in graph.nodes][1:4] == [
        ("call_module", "fc1"),
        ("call_function", "relu"),
        ("call_module", "fc2"),
    ]


def test_leaf_predicate_that_raises_names_the_module():
    def is_leaf(m, name):
        if name == "act":
            raise KeyError("no rule")
        return None

    with pytest.raises(
        PredicateError,
        match=re.escape(
            "the is_leaf predicate raised KeyError: 'no rule' on module 'act' (ReLU); make it return True, False "
            "or None for every module"
        ),
    ):
        LeafTracer(is_leaf=is_leaf).trace(MLP(2))


def test_leaf_predicate_returning_a_non_bool_is_rejected():
    with pytest.raises(
        PredicateError, match=re.escape("the is_leaf predicate returned 'yes' for module 'fc1' (Linear)")
    ):
        LeafTracer(is_leaf=lambda m, name: "yes").trace(MLP(2))


def test_leaf_tracer_rejects_bad_configuration():
    with pytest.raises(
        NotAModuleError, match=re.escape("LeafTracer(leaf_types=...) holds 'ReLU', which is not an nn.Module subclass")
    ):
        LeafTracer(leaf_types=("ReLU",))
    with pytest.raises(PredicateError, match=re.escape("LeafTracer(is_leaf=...) got bool True; pass a function")):
        LeafTracer(is_leaf=True)


# -- TaggingTracer ----------------------------------------------------------------------


def test_tagging_tracer_tags_every_node_with_a_constant_by_default():
    graph = TaggingTracer().trace(MLP(2))
    assert {n.meta["tag"] for n in graph.nodes} == {"untagged"}
    graph = TaggingTracer(default_tag=7, key="stage").trace(MLP(2))
    assert [n.meta["stage"] for n in graph.nodes] == [7] * 5


def test_tagging_tracer_calls_tag_fn_on_each_node():
    graph = TaggingTracer(tag_fn=lambda n: (n.op, n.name)).trace(MLP(2))
    assert [n.meta["tag"] for n in graph.nodes] == [
        ("placeholder", "x"),
        ("call_module", "fc1"),
        ("call_module", "act"),
        ("call_module", "fc2"),
        ("output", "output"),
    ]


def test_tag_fn_that_raises_names_the_node():
    def tag(node):
        if node.op == "call_module":
            raise ValueError("bad node")
        return 0

    with pytest.raises(
        PredicateError, match=re.escape("the tag_fn raised ValueError: bad node on node 'fc1' (call_module fc1)")
    ):
        TaggingTracer(tag_fn=tag).trace(MLP(2))
    with pytest.raises(PredicateError, match=re.escape("TaggingTracer(tag_fn=...) got str 'x'")):
        TaggingTracer(tag_fn="x")


# -- composition ------------------------------------------------------------------------


class PathTagLeafTracer(TaggingTracer, ModulePathTracer, LeafTracer):
    """Module paths, tags that read them, and relu traced through, in one trace."""


def test_tracers_compose_module_path_tagging_and_leaf_choice():
    model = resnet18(num_classes=10, width=8)
    tracer = PathTagLeafTracer(
        trace_types=(nn.ReLU,),
        tag_fn=lambda n: n.meta.get("module_path", "").split(".")[0] or "stem",
    )
    nodes = {n.name: n for n in tracer.trace(model).nodes}
    relu = nodes["relu_1"]
    assert (relu.op, relu.target, relu.kwargs) == ("call_function", F.relu, {"inplace": True})
    assert relu.meta["module_path"] == tracer.node_to_originating_module[relu] == "layer1.0.relu"
    assert relu.meta["tag"] == "layer1"
    assert nodes["fc"].meta["tag"] == "fc"
    assert nodes["x"].meta["tag"] == nodes["output"].meta["tag"] == "stem"
    assert not [
        n for n in nodes.values() if n.op == "call_module" and isinstance(model.get_submodule(n.target), nn.ReLU)
    ]


def test_exec_order_tracer_composes_with_leaf_choice():
    class ExecLeafTracer(ExecOrderTracer, ModulePathTracer, LeafTracer):
        pass

    tracer = ExecLeafTracer(leaf_types=(MLP,))
    model = nn.Sequential(MLP(2), nn.Linear(2, 2))
    graph = tracer.trace(model)
    assert tracer.exec_order.module_names() == ["", "0", "1"]
    assert {n.meta["module_path"] for n in graph.nodes if n.op == "call_module"} == {"0", "1"}


# -- faster tracing, same graphs ---------------------------------------------------------


class _FxReference(DeepTracer):
    """DeepTracer with torch.fx's own proxies and argument handling: the reference graph."""

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return fx.Proxy(node, self)

    def create_arg(self, a):
        return fx.Tracer.create_arg(self, a)


class Unpacking(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(6.0).reshape(2, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, d = x.shape
        first, second = x.split(d // 2, dim=1)
        (left, right), kept = first.chunk(2, dim=1), second
        scale = torch.tensor(2.0)  # a tensor constant: goes through fx's constant handling
        return torch.cat([right, left, kept * scale], dim=1).reshape(b, -1, 2)[:, 1:, ...] + self.table.sum()


@pytest.mark.parametrize(
    "make", [Unpacking, lambda: TinyGPT(11, 16, 2, 2, 8), resnet18], ids=["unpacking", "tinygpt", "resnet18"]
)
def test_unpacking_proxies_and_fast_arguments_give_fxs_graph(make):
    # separate instances: tracing stores tensor constants on the module it traces
    ours, reference = DeepTracer().trace(make()), _FxReference().trace(make())
    assert ours.python_code("self").src == reference.python_code("self").src
    assert [n.format_node() for n in ours.nodes] == [n.format_node() for n in reference.nodes]
    assert [type(n.args) for n in ours.nodes] == [type(n.args) for n in reference.nodes]


def test_unpacking_proxy_still_refuses_loops_like_fx():
    class Loop(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return sum(row for row in x)

    class Starred(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            first, *rest = x.shape
            return x * first

    for module in (Loop(), Starred()):
        with pytest.raises(TraceError, match="Proxy object cannot be iterated"):
            DeepTracer().trace(module)


def test_unpacking_table_is_built_once_per_function(monkeypatch):
    import dis

    from unitscale.fx import _unpack_proxy

    calls = []
    original = dis.get_instructions
    monkeypatch.setattr(_unpack_proxy.dis, "get_instructions", lambda code: calls.append(code) or original(code))
    model = TinyGPT(11, 16, 3, 2, 8)  # 3 attention layers, each unpacking twice
    _unpack_proxy._TABLES.clear()
    DeepTracer().trace(model)
    assert len(calls) == 1  # Attention.forward, disassembled once for 6 unpackings
    DeepTracer().trace(model)
    assert len(calls) == 1


# -- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("tracer_cls", ALL_TRACERS)
def test_tracing_a_non_module_raises_not_a_module_error(tracer_cls):
    with pytest.raises(NotAModuleError, match=re.escape(f"{tracer_cls.__name__}.trace got int 42;")):
        tracer_cls().trace(42)


@pytest.mark.parametrize("tracer_cls", ALL_TRACERS)
def test_a_tracer_built_with_an_option_no_tracer_takes_is_refused_in_its_name(tracer_cls):
    with pytest.raises(InputError, match=re.escape(f"{tracer_cls.__name__}() got arguments it does not take")):
        tracer_cls(no_such_option=1)


@pytest.mark.parametrize("tracer_cls", [ModulePathTracer, LeafTracer, TaggingTracer, ExecOrderTracer])
def test_a_positional_argument_reaches_autowrap_modules_and_is_checked_there(tracer_cls):
    with pytest.raises(PredicateError, match=re.escape(f"{tracer_cls.__name__}(autowrap_modules=...) got int 42")):
        tracer_cls(42)


def test_options_of_the_wrong_type_are_refused_when_the_tracer_is_built():
    with pytest.raises(InputError, match=re.escape("DeepTracer(recurse_modules=...) got str 'no'")):
        DeepTracer(recurse_modules="no")
    with pytest.raises(InputError, match=re.escape("TaggingTracer(key=...) got int 3")):
        TaggingTracer(key=3)


def test_exec_order_needs_a_module_not_a_function():
    with pytest.raises(NotAModuleError, match=re.escape("ExecOrderTracer.trace got function")):
        ExecOrderTracer().trace(lambda x: x + 1)
    with pytest.raises(NotAModuleError, match=re.escape("fx_exec_order() got str 'model'")):
        fx_exec_order("model")
    with pytest.raises(NotAModuleError, match=re.escape("trace_exec_order got str 'model'; pass the nn.Module")):
        trace_exec_order("model")


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x if x.sum() > 0 else -x


@pytest.mark.parametrize("tracer_cls", ALL_TRACERS)
def test_data_dependent_control_flow_raises_a_typed_trace_error(tracer_cls):
    with pytest.raises(
        TraceError,
        match=r"torch.fx could not trace DataDependent at .*test_tracers\.py:\d+ "
        r"\(`return x if x\.sum\(\) > 0 else -x`\): symbolically traced variables cannot be used as inputs "
        "to control flow",
    ):
        tracer_cls().trace(DataDependent())


# -- execution order --------------------------------------------------------------------


def test_trace_exec_order_on_mlp():
    model = MLP(3)
    order = trace_exec_order(model)
    assert isinstance(order, ExecOrder)
    assert order.module_forward_order == [model, model.fc1, model.act, model.fc2]
    assert order.param_names() == ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    assert [u.module for u in order.module_to_param_usage_infos[model]] == [model.fc1, model.fc2]
    assert [n for n, _ in order.module_to_param_usage_infos[model.fc1][0].named_params] == ["weight", "bias"]
    assert repr(order) == "ExecOrder(4 module calls, 4 parameters: fc1.weight, fc1.bias, fc2.weight, fc2.bias)"


class DirectParams(nn.Module):
    """Uses its own parameters in ops (not through a submodule); ``gain`` by keyword or not."""

    def __init__(self, gain_by_keyword: bool = True) -> None:
        super().__init__()
        self.gain_by_keyword = gain_by_keyword
        self.w = nn.Parameter(torch.randn(3, 3))
        self.b = nn.Parameter(torch.randn(3))
        self.head = nn.Linear(3, 3)
        self.gain = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(F.linear(x, self.w, self.b))
        return torch.mul(x, other=self.gain) if self.gain_by_keyword else torch.mul(x, self.gain)


def test_exec_order_counts_parameters_passed_by_keyword():
    model = DirectParams()
    order = trace_exec_order(model)
    assert order.param_names() == ["w", "b", "head.weight", "head.bias", "gain"]
    usage = order.module_to_param_usage_infos[model]
    assert [(u.module, [n for n, _ in u.named_params]) for u in usage] == [
        (model, ["w", "b"]),
        (model.head, ["weight", "bias"]),
        (model, ["gain"]),
    ]


def _fsdp_exec_info(model: nn.Module):
    trace_utils = pytest.importorskip("torch.distributed.fsdp._trace_utils")

    class BufferProxyTracer(fx.Tracer):
        proxy_buffer_attributes = True  # as ours, so TinyGPT traces for both

    tracer = BufferProxyTracer()
    fsdp = trace_utils._ExecOrderTracer()
    with fsdp.patch_tracer(tracer, model):
        tracer.trace(model)
    return fsdp.exec_info


def _usage(infos):
    return {id(m): [(u.module, [(n, id(p)) for n, p in u.named_params]) for u in us] for m, us in infos.items()}


@pytest.mark.parametrize(
    "make",
    [
        lambda: resnet18(num_classes=10, width=8),
        lambda: TinyGPT(vocab_size=11, d_model=8, n_layers=2, n_heads=2, seq_len=8),
        lambda: MLP(4),
        lambda: nn.Sequential(DirectParams(gain_by_keyword=False), nn.ReLU()),
    ],
    ids=["resnet18", "tinygpt", "mlp", "direct_params"],
)
def test_exec_order_agrees_with_fsdps_private_exec_order_tracer(make):
    torch.manual_seed(0)
    model = make()
    ours, theirs = trace_exec_order(model), _fsdp_exec_info(model)
    assert [id(m) for m in ours.module_forward_order] == [id(m) for m in theirs.module_forward_order]
    assert [id(p) for p in ours.param_forward_order] == [id(p) for p in theirs.param_forward_order]
    assert list(map(id, ours.module_to_param_usage_infos)) == list(map(id, theirs.module_to_param_usage_infos))
    assert _usage(ours.module_to_param_usage_infos) == _usage(theirs.module_to_param_usage_infos)


@settings(max_examples=25, deadline=None)
@given(descriptions)
def test_exec_order_agrees_with_forward_hook_order_on_random_trees(desc):
    torch.manual_seed(0)
    model = nn.Sequential(build(desc))
    seen: list[nn.Module] = []
    handles = [m.register_forward_pre_hook(lambda m, args: seen.append(m)) for m in model.modules()]
    model(torch.randn(5, 4))
    for h in handles:
        h.remove()
    order = trace_exec_order(model)
    assert [id(m) for m in order.module_forward_order] == [id(m) for m in seen]
    first_use: list[nn.Parameter] = []
    for m in seen:
        for p in m.parameters(recurse=False):
            if all(p is not q for q in first_use):
                first_use.append(p)
    assert [id(p) for p in order.param_forward_order] == [id(p) for p in first_use]
