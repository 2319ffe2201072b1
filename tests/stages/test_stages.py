"""``unitscale.partition`` and ``StagePlan`` on real models, in one process."""

from __future__ import annotations

import itertools
import math
import zlib

import matplotlib
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import fx, nn
from torch.utils.flop_counter import FlopCounterMode

from tests.stages.test_partition import brute_force_bottleneck
from unitscale import StagePlan, partition
from unitscale.errors import CostError, InputError, StageCountError, TraceError
from unitscale.examples.models import MLP, TinyGPT, resnet18
from unitscale.stages.partitioner import costs
from unitscale.stages.partitioner.split import live_values

matplotlib.use("Agg")


@pytest.fixture
def gpt() -> tuple[TinyGPT, torch.Tensor]:
    torch.manual_seed(0)
    return TinyGPT(vocab_size=16, d_model=16, n_layers=4, n_heads=2, seq_len=8), torch.randint(0, 16, (2, 8))


def _is_contiguous(plan: StagePlan) -> bool:
    stages = [plan.assignment[name] for name, _ in plan.node_costs]
    return stages[0] == 0 and all(b - a in (0, 1) for a, b in itertools.pairwise(stages))


# --- cost models --------------------------------------------------------------------------------


def test_params_cost_counts_each_parameter_once_at_its_first_use() -> None:
    model = MLP(4, 8)
    plan = partition(model, 1, torch.randn(2, 4))
    assert plan.node_costs == [("fc1", 40.0), ("act", 0.0), ("fc2", 36.0)]


def test_flops_cost_counts_matmul_flops_per_node() -> None:
    plan = partition(MLP(8, 16), 2, torch.randn(4, 8), cost="flops")
    assert dict(plan.node_costs) == {"fc1": 2 * 4 * 8 * 16, "act": 0.0, "fc2": 2 * 4 * 16 * 8}
    assert plan.stage_costs == [1024.0, 1024.0]


def test_memory_cost_is_output_bytes_per_node() -> None:
    plan = partition(MLP(8, 16), 1, torch.randn(4, 8), cost="memory")
    assert dict(plan.node_costs) == {"fc1": 4 * 16 * 4, "act": 4 * 16 * 4, "fc2": 4 * 8 * 4}


def test_time_cost_is_positive_for_every_node(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    plan = partition(model, 3, idx, cost="time", repeats=2)
    assert all(c > 0 for _, c in plan.node_costs)
    assert _is_contiguous(plan) and sorted(set(plan.assignment.values())) == [0, 1, 2]


def test_callable_cost_sees_shapes_and_module_paths(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    seen = {}

    def cost(node: fx.Node) -> float:
        seen[node.name] = node.meta["module_path"]
        return 1.0

    plan = partition(model, 4, idx, cost=cost)
    assert seen["blocks_2_attn_qkv"] == "blocks.2.attn.qkv"
    assert all(c == 1.0 for _, c in plan.node_costs) and sum(plan.stage_costs) == len(plan.node_costs)


# --- the split ----------------------------------------------------------------------------------


def test_plan_is_optimal_and_verifies_on_tinygpt(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    for cost in ("params", "flops", "memory"):
        plan = partition(model, 3, idx, cost=cost)
        assert _is_contiguous(plan)
        assert plan.verify(idx)
        assert plan.verify(torch.randint(0, 16, (5, 8)))


def test_boundary_depth_cuts_only_between_transformer_blocks(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    plan = partition(model, 4, idx, boundary_depth=2)
    paths = {n.name: n.meta.get("module_path") for n in plan.module.graph.nodes}
    firsts = [plan.node_costs[b][0] for b in plan.bounds[1:-1]]
    assert [paths[name] for name in firsts] == ["blocks.1.ln1", "blocks.2.ln1", "blocks.3.ln1"]
    assert plan.stage_costs == [3664.0, 3280.0, 3280.0, 3584.0]
    assert plan.verify(idx)


def test_split_moves_parameters_and_buffers_into_the_stage_that_uses_them(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    split = partition(model, 2, idx, boundary_depth=2).split()
    assert [n.op for n in split.graph.nodes] == ["placeholder", "call_module", "call_module", "output"]
    assert list(split.named_parameters(recurse=False)) == [] and list(split.named_buffers(recurse=False)) == []
    assert sum(p.numel() for p in split.parameters()) == sum(p.numel() for p in model.parameters())
    assert torch.equal(split(idx), model(idx))


def test_split_moves_batchnorm_buffers_into_their_stage() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=3, width=4).eval()
    x = torch.randn(1, 3, 32, 32)
    split = partition(model, 2, x).split()
    assert list(split.named_buffers(recurse=False)) == []
    stage_buffers = [dict(getattr(split, f"submod_{i}").named_buffers()) for i in range(2)]
    assert any(name.endswith("running_mean") for name in stage_buffers[0])
    assert sum(b.numel() for b in split.buffers()) == sum(b.numel() for b in model.buffers())
    assert torch.equal(split(x), model(x))


class Tied(nn.Module):
    """Uses one parameter at both ends, so two stages need it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 4))
        self.mid = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mid(x @ self.w) @ self.w.t()


def test_shared_parameter_lives_in_every_stage_that_uses_it() -> None:
    torch.manual_seed(0)
    model, x = Tied(), torch.randn(3, 4)
    plan = partition(model, 2, x, cost=lambda n: 1.0)
    split = plan.split()
    owners = [name for name, sub in split.named_children() if any(p is plan.module.w for p in sub.parameters())]
    assert owners == ["submod_0", "submod_1"]
    assert torch.equal(split(x), model(x))
    stages = plan.stage_modules()
    assert all("w" in dict(s.named_parameters()) for s in stages)
    assert plan.verify(x)


def test_stage_modules_pass_skip_values_through_middle_stages() -> None:
    class Skip(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b, self.c = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.c(self.b(self.a(x))) + x

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    plan = partition(Skip(), 3, x)
    stages = plan.stage_modules()
    assert [[n.name for n in s.graph.nodes if n.op == "placeholder"] for s in stages] == [["x"], ["x", "a"], ["x", "b"]]
    assert plan.verify(x)


def test_cuts_only_ever_send_tensors(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    # TinyGPT's attention reads ``x.shape`` into ints; no cut may separate those from their use
    model, idx = gpt
    plan = partition(model, 1, idx)
    most = len(plan.pieces) - 1
    assert most < len(plan.node_costs)
    plan = partition(model, most, idx, cost=lambda n: 1.0)
    live = live_values(plan.module.graph, plan.assignment, plan.num_stages)
    assert all(issubclass(v.meta["type"], torch.Tensor) for values in live for v in values)
    assert plan.verify(idx)


def test_partition_leaves_the_users_module_untouched() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=4, width=4).train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = partition(model, 3, torch.randn(2, 3, 16, 16), cost="time", repeats=2)
    plan.verify(torch.randn(2, 3, 16, 16))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_costing_a_training_model_leaves_its_plan_with_the_models_running_statistics() -> None:
    """Timing every node (and its backward) runs batch norms in training mode many times: the
    plan's copy keeps the model's running statistics, so its stages match it in eval mode."""
    from unitscale.stages.partitioner.costs import backward_times

    torch.manual_seed(0)
    model = resnet18(num_classes=4, width=4).train()
    x = torch.randn(2, 3, 16, 16) * 3 + 1
    plan = partition(model, 2, x, cost="time", repeats=2)
    backward_times(plan, x, repeats=2)
    ours = {name.replace(".", "_"): b for name, b in model.named_buffers()}
    # submod_0.layer1_0_bn1.running_mean -> layer1_0_bn1_running_mean
    theirs = {name.split(".", 1)[1].replace(".", "_"): b for name, b in plan.split().named_buffers()}
    assert theirs.keys() == ours.keys()
    assert all(torch.equal(theirs[name], ours[name]) for name in ours)
    model.eval()
    assert torch.equal(plan.split().eval()(x), model(x))


def test_report_lists_boundary_tensors_params_and_bubble(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    report = partition(model, 2, idx, boundary_depth=2).report(num_microbatches=4)
    first, last = report.rows
    assert first.sends == [("add_4", (2, 8, 16), 2 * 8 * 16 * 4)] and last.sends == []
    assert first.params + last.params == sum(p.numel() for p in model.parameters())
    assert report.bubble == pytest.approx(1 / 5)
    assert math.isclose(first.share + last.share, 1.0)
    assert "add_4[2, 8, 16] (1,024 B)" in str(report) and "1/5 = 0.200" in str(report)


def test_plot_draws_one_bar_per_stage_and_plan_and_the_ideal(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    plan = partition(model, 3, idx, cost="flops")
    naive = partition(model, 3, idx, cost="flops", method="equal_count")
    ax = plan.plot(compare={"equal count": naive})
    assert len(ax.patches) == 6 and ax.lines[0].get_ydata()[0] == pytest.approx(sum(plan.stage_costs) / 3)
    assert naive.bottleneck >= plan.bottleneck


def test_costs_under_measures_a_plan_with_another_cost_model(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    by_params = partition(model, 2, idx)
    by_flops = partition(model, 2, idx, cost="flops")
    assert sum(by_params.costs_under(by_flops)) == pytest.approx(sum(by_flops.stage_costs))
    assert max(by_params.costs_under(by_flops)) >= by_flops.bottleneck


# --- bad input ----------------------------------------------------------------------------------


def test_zero_stages_is_refused() -> None:
    with pytest.raises(StageCountError, match=r"^num_stages=0 must be an int >= 1$"):
        partition(MLP(4), 0, torch.randn(2, 4))


def test_more_stages_than_nodes_is_refused() -> None:
    with pytest.raises(
        StageCountError, match=r"^num_stages=4 is more than the 3 pieces MLP can be cut into; use num_stages <= 3$"
    ):
        partition(MLP(4), 4, torch.randn(2, 4))


def test_more_stages_than_module_boundaries_is_refused(gpt: tuple[TinyGPT, torch.Tensor]) -> None:
    model, idx = gpt
    with pytest.raises(StageCountError, match=r"more than the \d+ pieces TinyGPT can be cut into at module depth 1;"):
        partition(model, 9, idx, boundary_depth=1)


@pytest.mark.parametrize("bad", [-1.0, float("nan")])
def test_negative_or_nan_cost_is_refused_naming_the_node(bad: float) -> None:
    with pytest.raises(
        CostError, match=rf"^the cost callable returned {bad} for node 'fc1' \(.*\); costs must be finite and >= 0$"
    ):
        partition(MLP(4), 2, torch.randn(2, 4), cost=lambda n: bad)


def test_non_number_cost_is_refused() -> None:
    with pytest.raises(CostError, match=r"^the cost callable returned 'big' for node 'fc1', which is not a number"):
        partition(MLP(4), 2, torch.randn(2, 4), cost=lambda n: "big")


def test_unknown_cost_model_is_refused() -> None:
    with pytest.raises(CostError, match=r"^unknown cost model 'bytes'; use one of 'params', 'flops', 'time', 'memory'"):
        partition(MLP(4), 2, torch.randn(2, 4), cost="bytes")


def test_inputs_of_the_wrong_shape_are_refused_naming_the_line() -> None:
    with pytest.raises(InputError, match=r"^MLP failed on the example inputs \(\(2, 5\)\) at .*models\.py:\d+ .*mat1"):
        partition(MLP(4), 2, torch.randn(2, 5))


def test_wrong_number_of_inputs_is_refused() -> None:
    with pytest.raises(InputError, match=r"^MLP.forward\(x\) cannot take 2 positional input\(s\)"):
        partition(MLP(4), 2, (torch.randn(2, 4), torch.randn(2, 4)))


def test_untraceable_model_is_refused() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x if x.sum() > 0 else -x

    with pytest.raises(
        TraceError,
        match=r"(?s)^partition\(\) no route could capture Branchy \(tried fx, export\):\n  fx: TraceError: torch.fx "
        r"could not trace Branchy at .*test_stages\.py:\d+ .*symbolically.*\n  export: .*make the model traceable",
    ):
        partition(Branchy(), 1, torch.randn(2))


def test_verify_with_bad_inputs_raises_input_error() -> None:
    plan = partition(MLP(4), 2, torch.randn(2, 4))
    with pytest.raises(InputError, match=r"^verify\(\) could not run MLP on the given inputs"):
        plan.verify(torch.randn(2, 7))


# --- property: random DAG models ----------------------------------------------------------------


class RandomDAG(nn.Module):
    """Each step applies an op to earlier values (any of them), so values skip across stages."""

    def __init__(self, spec: list[tuple[str, int, int]], width: int = 3) -> None:
        super().__init__()
        self.spec = spec
        self.linears = nn.ModuleList(nn.Linear(width, width) for op, _, _ in spec if op == "linear")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, linear = [x], 0
        for op, i, j in self.spec:
            a, b = values[i % len(values)], values[j % len(values)]
            if op == "linear":
                values.append(self.linears[linear](a))
                linear += 1
            elif op == "add":
                values.append(a + b)
            elif op == "mul":
                values.append(a * b)
            else:
                values.append(torch.tanh(a))
        return values[-1], values[len(values) // 2]


spec_strategy = st.lists(
    st.tuples(st.sampled_from(["linear", "add", "mul", "tanh"]), st.integers(0, 50), st.integers(0, 50)),
    min_size=1,
    max_size=9,
)


def _name_cost(node: fx.Node) -> float:
    return float(zlib.crc32(node.name.encode()) % 7)


@settings(max_examples=25, deadline=None)
@given(spec=spec_strategy, data=st.data())
def test_plan_is_contiguous_optimal_and_exact_on_random_dags(
    spec: list[tuple[str, int, int]], data: st.DataObject
) -> None:
    torch.manual_seed(0)
    model, x = RandomDAG(spec), torch.randn(2, 3)
    num_nodes = len(partition(model, 1, x).node_costs)
    k = data.draw(st.integers(1, num_nodes))
    cost = data.draw(st.sampled_from(["params", _name_cost]))
    plan = partition(model, k, x, cost=cost)
    assert _is_contiguous(plan)
    assert sorted(set(plan.assignment.values())) == list(range(k))
    costs = [c for _, c in plan.node_costs]
    assert plan.bottleneck == brute_force_bottleneck(costs, k)
    assert plan.verify(x) and plan.verify(torch.randn(4, 3))


class DictOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = torch.tanh(self.a(x))
        return {"logits": self.b(h), "hidden": h}


def test_dict_output_is_sent_as_leaves_and_rebuilt() -> None:
    from unitscale.stages.runtime.launch import loss_on_model_output

    torch.manual_seed(0)
    model, x = DictOut(), torch.randn(3, 4)
    plan = partition(model, 2, x)
    assert plan.verify(x)
    first, last = plan.stage_modules()
    leaves = last(first(x))
    assert isinstance(leaves, tuple) and len(leaves) == 2
    rebuilt = plan.output_from_leaves(leaves)
    assert list(rebuilt) == ["logits", "hidden"]
    assert all(torch.equal(rebuilt[k], v) for k, v in model(x).items())
    assert plan.output_spec is not None
    loss = loss_on_model_output(lambda out, t: (out["logits"] - t).pow(2).mean(), plan.output_spec)
    target = torch.zeros(3, 2)
    assert torch.equal(loss(leaves, target), (model(x)["logits"] - target).pow(2).mean())


# --- what crosses a cut: contiguous for gloo, with the model's own strides on the other side -----


class _Strided(nn.Module):
    """A channels-last view (a dense permutation) and a slice with gaps cross the cut after ``mid``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.LayerNorm(8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x).permute(0, 2, 3, 1)  # channels last, as ConvNeXt's blocks
        gappy = y[:, :, ::2]
        return self.out(self.norm(y)).sum(dim=(1, 2)) + gappy.sum(dim=(1, 2))


def test_stages_send_contiguous_tensors_and_the_next_stage_sees_the_models_strides() -> None:
    from torch.fx.passes.shape_prop import ShapeProp

    from unitscale.stages.partitioner.split import chain_stages

    torch.manual_seed(0)
    model, x = _Strided(), torch.randn(2, 3, 6, 6)
    gm = fx.symbolic_trace(model)
    ShapeProp(gm).propagate(x)
    names = [n.name for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module")]
    assignment = {n: int(i >= names.index("norm")) for i, n in enumerate(names)}  # after the permute and the slice
    first, second = chain_stages(gm, assignment, 2)
    sent = first(x)
    assert all(t.is_contiguous() for t in sent)
    # the dense permutation travels permuted back to its own layout, no copy; the slice as a copy
    assert [n.target for n in first.graph.nodes if n.op == "call_method"][-2:] == ["permute", "contiguous"]
    assert torch.equal(second(*sent), model(x))


class _SharedBlock(nn.Module):
    """``block`` runs twice in one forward pass (shared weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.out = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.block(self.inp(x))))


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
def test_split_spec_names_only_modules_that_run_once() -> None:
    from torch.distributed.pipelining import SplitPoint, pipeline

    from unitscale.errors import SplitSpecError

    model, x = _SharedBlock(), torch.randn(2, 4)
    # before out: a module that runs once; torch's pipeline makes the same two stages
    late = partition(model, 2, x, boundary_depth=1, cost=lambda n: 10.0 if n.name == "out" else 1.0)
    assert late.split_spec() == {"out": SplitPoint.BEGINNING}
    pipe = pipeline(model, (x,), split_spec=late.split_spec())
    assert pipe.num_stages == 2
    names = [sorted(n for n, _ in pipe.get_stage_module(s).named_parameters()) for s in range(2)]
    assert names == [sorted(s) for s in late.stage_parameter_names()]
    # before block's first call: torch would split before its second call too
    early = partition(model, 2, x, boundary_depth=1, cost=lambda n: 10.0 if n.name == "inp" else 1.0)
    with pytest.raises(SplitSpecError, match=r"\('block' runs 2 times, as do the 1 inside it that start there\)"):
        early.split_spec()
    assert pipeline(model, (x,), split_spec={"block": SplitPoint.BEGINNING}).num_stages > 2


class CrossAttention(nn.Module):
    """Queries from ``x``, keys and values from ``context`` (of another length), as a decoder attends."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(8, 8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        a, _ = self.attn(self.q(x), context, context, need_weights=False)
        return self.out(a)


@pytest.mark.parametrize(
    "build,inputs",
    [
        (lambda: CrossAttention().eval(), lambda: (torch.randn(2, 5, 8), torch.randn(2, 7, 8))),
        (
            lambda: nn.TransformerDecoderLayer(8, 2, 16, batch_first=True).eval(),
            lambda: (torch.randn(2, 5, 8), torch.randn(2, 7, 8)),
        ),
        # eval mode under no_grad takes the fused fast path, which torch's counter counts as 0 FLOPs
        (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval(), lambda: (torch.randn(2, 5, 8),)),
    ],
    ids=["cross_attention", "decoder_layer", "encoder_layer_fast_path"],
)
def test_flops_cost_is_the_flop_counters_count_of_the_training_forward(build, inputs) -> None:
    torch.manual_seed(0)
    model, args = build(), inputs()
    plan = partition(model, 2, args, cost="flops")
    with FlopCounterMode(display=False) as counter:
        model(*args)
    assert counter.get_total_flops() > 0 and sum(plan.stage_costs) == counter.get_total_flops()


def test_a_flop_counter_that_fails_under_no_grad_is_not_blamed_on_the_inputs(monkeypatch) -> None:
    """The counter failing under no_grad (as on cross-attention) was reported as inputs that do not fit."""

    class FailsWithoutGrad(FlopCounterMode):
        def __enter__(self):
            if not torch.is_grad_enabled():
                raise RuntimeError("no formula under no_grad")
            return super().__enter__()

    class AlwaysFails(FlopCounterMode):
        def __enter__(self):
            raise RuntimeError("counter broken")

    model, args = CrossAttention(), (torch.randn(2, 5, 8), torch.randn(2, 7, 8))
    monkeypatch.setattr(costs, "FlopCounterMode", FailsWithoutGrad)
    with torch.no_grad():  # the caller's grad mode does not matter
        plan = partition(model, 2, args, cost="flops")
    with FlopCounterMode(display=False) as counter:
        model(*args)
    assert sum(plan.stage_costs) == counter.get_total_flops()
    monkeypatch.setattr(costs, "FlopCounterMode", AlwaysFails)
    message = r"^partition\(cost='flops'\): torch's FlopCounterMode .* failed on node 'q' .*the example inputs are fine"
    with pytest.raises(CostError, match=message):
        partition(model, 2, args, cost="flops")
