"""Scale tracking through models: numbers, output structures, capture routes, bad input."""

from __future__ import annotations

import copy
import pickle
import re

import matplotlib
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from unitscale import ScaleReport, analyse_module, track_scales
from unitscale.capture import DeepTracing, capture, clear_capture_cache
from unitscale.errors import BackwardShapeError, InputError, NoFloatOutputError, NotAModuleError, TraceError
from unitscale.examples import MLP, TinyGPT, resnet18
from unitscale.tracking import AnnotatedCode, ScalePair

matplotlib.use("Agg")


class Scale(nn.Module):
    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor


class Branchy(nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        if y.sum() > 0:
            return y * 2
        return y * -2


def test_classic_mlp_scales_match_the_reference_numbers() -> None:
    torch.manual_seed(0)
    # as in Graphcore's example, the input requires grad, so its gradient is recorded
    x, grad = torch.randn(256, 1024).requires_grad_(), torch.randn(256, 1024)
    scales = track_scales(MLP(1024), x, grad).scales
    expected = {
        "x": (1.0, 0.236),
        "linear": (0.578, 0.204),
        "relu": (0.337, 0.288),
        "linear_1": (0.235, 0.999),
    }
    for node, (fwd, bwd) in expected.items():
        assert scales[node].forward == pytest.approx(fwd, rel=0.03), node
        assert scales[node].backward == pytest.approx(bwd, rel=0.03), node


def test_analyse_module_annotates_each_line_with_its_scale_pair() -> None:
    torch.manual_seed(0)
    code = analyse_module(MLP(64), torch.randn(128, 64), torch.randn(128, 64))
    lines = code.splitlines()
    assert lines[0].startswith("def forward(self, x):  # x (-> ")
    assert re.search(
        r"^    linear = torch\._C\._nn\.linear\(x, fc1_weight, fc1_bias\)  # \(-> [\d.]+, <- [\d.]+\)$", code, re.M
    )
    assert re.search(r"^    relu = .*  # \(-> [\d.]+, <- [\d.]+\)$", code, re.M)
    assert lines[-1] == "    return linear_1"
    assert "= None" not in code  # fx's clean-up statements are dropped


def test_analysed_code_prints_plain_and_renders_html_in_notebooks(capsys: pytest.CaptureFixture[str]) -> None:
    torch.manual_seed(0)
    code = analyse_module(MLP(8), torch.randn(4, 8))
    assert isinstance(code, AnnotatedCode) and isinstance(code, str)
    print(code)
    assert capsys.readouterr().out == code.plain + "\n"  # captured stdout is not a terminal: no ANSI
    assert repr(code) == code.plain
    html = code._repr_html_()
    assert html is not None and "<span" in html and "linear_1" in html
    plain = analyse_module(MLP(8), torch.randn(4, 8), syntax_highlight=False)
    assert "<span" not in (plain._repr_html_() or "")
    assert pickle.loads(pickle.dumps(code)) == code


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(2, 6), min_size=1, max_size=3),
    x_scale=st.floats(1e-3, 1e3),
    factor=st.floats(0.01, 100),
    grad_scale=st.floats(1e-3, 1e3),
    seed=st.integers(0, 2**16),
)
def test_recorded_stds_match_torch_std(
    shape: list[int], x_scale: float, factor: float, grad_scale: float, seed: int
) -> None:
    torch.manual_seed(seed)
    x = torch.randn(shape, dtype=torch.float64) * x_scale
    grad = torch.randn(shape, dtype=torch.float64) * grad_scale
    report = track_scales(Scale(factor), x, grad)
    by_op = {row.op: row for row in report}
    assert by_op["input"].forward == pytest.approx(x.std(correction=0).item(), rel=1e-9)
    assert by_op["input"].backward == pytest.approx((grad * factor).std(correction=0).item(), rel=1e-9)
    assert by_op["mul"].forward == pytest.approx((x * factor).std(correction=0).item(), rel=1e-9)
    assert by_op["mul"].backward == pytest.approx(grad.std(correction=0).item(), rel=1e-9)
    assert by_op["mul"].abs_max == pytest.approx((x * factor).abs().max().item(), rel=1e-12)


def test_track_scales_reports_module_paths_shapes_and_dtypes_for_tinygpt() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=11, d_model=16, n_layers=2, n_heads=2, seq_len=8)
    report = track_scales(model, torch.randint(0, 11, (3, 8)))
    paths = {row.module_path for row in report}
    assert {"tok_emb", "blocks.0.attn.qkv", "blocks.1.mlp.fc2", "ln_f", "head"} <= paths
    head = [row for row in report if row.module_path == "head" and row.op == "linear"][0]
    assert head.shape == (3, 8, 11) and head.dtype == "float32"
    assert all(row.dtype.startswith(("float", "bfloat")) for row in report)  # the int positions are skipped
    assert all(row.forward is not None and row.backward is not None for row in report)
    # a reshape/transpose chain shares its input's record: same numbers
    reshape = report["reshape"]
    assert report["transpose"].scale == reshape.scale
    assert reshape.scale in [row.scale for row in report if row.op == "getitem"]


def test_tuple_list_and_dict_outputs_all_take_part_in_backward() -> None:
    class Outputs(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, object]:
            return {"a": x * 2, "rest": [x * 3, (x * 4, x.argmax())]}

    torch.manual_seed(0)
    x = torch.randn(32, 4)
    grads = {"a": torch.ones(32, 4), "rest": [torch.zeros(32, 4), (torch.full((32, 4), 2.0),)]}
    grads["a"][0, 0] = 5.0
    report = track_scales(Outputs(), x, grads)
    expected_grad_x = 2 * grads["a"] + 4 * grads["rest"][1][0]
    assert report["x"].backward == pytest.approx(expected_grad_x.std(correction=0).item(), rel=1e-6)
    assert report["mul_1"].backward == 0.0
    default = track_scales(Outputs(), x)  # unit-normal noise for every float output
    assert all(row.backward is not None and row.backward > 0 for row in default)


def test_scalar_loss_is_backpropagated_with_a_unit_gradient() -> None:
    class Loss(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x**2).sum()

    torch.manual_seed(0)
    x = torch.randn(100)
    report = track_scales(Loss(), x)
    assert report["x"].backward == pytest.approx((2 * x).std(correction=0).item(), rel=1e-6)
    assert report["sum_1"].forward == 0.0 and report["sum_1"].shape == ()


def test_integer_and_boolean_tensors_are_skipped() -> None:
    class Masked(nn.Module):
        def forward(self, x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
            mask = x > 0
            picked = idx * 2
            return x * mask + picked.float()

    report = track_scales(Masked(), (torch.randn(6), torch.arange(6)))
    assert [row.node for row in report] == ["x", "mul_1", "float_1", "add"]


def test_empty_and_one_element_tensors_are_reported_without_nan() -> None:
    class Slices(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            return x[:0] * 1.0, x[:1] * 1.0, x * 1.0

    report = track_scales(Slices(), torch.randn(5))
    rows = [row for row in report if row.op == "mul"]
    assert [row.shape for row in rows] == [(0,), (1,), (5,)]
    assert rows[0].forward is None and rows[0].backward is None and rows[0].abs_max is None
    assert rows[1].forward == 0.0 and rows[1].backward == 0.0
    assert "nan" not in report.table()


def test_untraceable_model_falls_back_to_recording_ops_as_they_run() -> None:
    torch.manual_seed(0)
    model = Branchy()
    x, grad = torch.randn(16, 8), torch.randn(16, 8)
    report = track_scales(model, x, grad)
    assert report.route == "eager"
    assert "y.sum() > 0" in report.trace_failure
    assert [(row.node, row.module_path, row.op) for row in report][:2] == [
        ("x", "", "input"),
        ("linear", "fc", "linear"),
    ]
    y = model.fc(x)
    out_row = [row for row in report if row.op == "Tensor.mul"][0]
    assert out_row.forward == pytest.approx((y * (2 if y.sum() > 0 else -2)).std(correction=0).item(), rel=1e-6)
    assert out_row.backward == pytest.approx(grad.std(correction=0).item(), rel=1e-6)
    listing = analyse_module(model, x, grad)
    assert listing.startswith("# Branchy: ops recorded as they ran")
    assert max(len(line) for line in listing.splitlines()) <= 88  # the trace failure's reason wraps
    assert re.search(r"^linear +# \(-> [\d.]+, <- [\d.]+\)  linear in fc$", listing, re.M)


def test_eager_capture_gives_the_same_numbers_as_fx_on_the_mlp() -> None:
    model, x = MLP(32), torch.randn(64, 32)
    torch.manual_seed(1)
    fx_report = track_scales(model, x)
    torch.manual_seed(1)
    eager_report = track_scales(model, x, route="eager")
    for node in ("x", "linear", "relu", "linear_1"):
        assert eager_report[node].scale == fx_report[node].scale
        assert eager_report[node].module_path == fx_report[node].module_path


def test_capture_fx_raises_trace_error_naming_the_line() -> None:
    with pytest.raises(
        TraceError, match=r"could not trace Branchy at .*test_analysis\.py:\d+ \(`if y\.sum\(\) > 0:`\)"
    ):
        track_scales(Branchy(), torch.randn(2, 8), route="fx")
    with pytest.raises(TraceError, match="Use route='auto'"):
        analyse_module(Branchy(), torch.randn(2, 8), route="fx")


def test_inplace_ops_on_tracked_tensors_work_in_resnet() -> None:
    torch.manual_seed(0)
    model = resnet18(num_classes=10, width=4)
    report = track_scales(model, torch.randn(2, 3, 32, 32))
    assert report.route == "fx"
    assert any(row.module_path == "layer4.1.bn2" for row in report)
    assert all(row.backward is not None for row in report if row.op not in ("buffer", "input"))
    assert [row.backward for row in report if row.op == "input"] == [None]  # the image does not require grad


def test_a_model_may_modify_its_input_in_place() -> None:
    class InPlace(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x.mul_(3.0)
            return x * 1.0

    torch.manual_seed(0)
    x, grad = torch.randn(4, 2), torch.randn(4, 2)
    original = x.clone()
    for route in ("fx", "eager"):
        report = track_scales(InPlace(), x, grad, route=route)
        assert [row.node for row in report] == ["x", "mul_", "mul"]
        assert report["x"].forward == pytest.approx(x.std(correction=0).item(), rel=1e-6)
        assert report["x"].backward == pytest.approx(3 * grad.std(correction=0).item(), rel=1e-6)
        assert report["mul"].forward == pytest.approx(3 * x.std(correction=0).item(), rel=1e-6)
    assert torch.equal(x, original)  # the caller's tensor is not modified


def test_tracking_works_under_no_grad_and_on_inference_tensors() -> None:
    torch.manual_seed(0)
    model = MLP(8)
    with torch.inference_mode():
        x = torch.randn(4, 8)
    with torch.no_grad():
        report = track_scales(model, x)
        assert not torch.is_grad_enabled()  # the caller's mode is restored
    assert all(row.backward is not None for row in report if row.op != "input")
    assert report["x"].backward is None  # an inference tensor cannot require grad


@pytest.mark.parametrize("route", ["fx", "eager", "export"])
def test_an_input_gets_a_gradient_only_when_it_requires_grad(route: str) -> None:
    torch.manual_seed(0)
    model, x, grad = MLP(8), torch.randn(4, 8), torch.randn(4, 8)
    plain = track_scales(model, x, grad, route=route)
    assert plain["x"].backward is None  # as in a training step: nobody asked for it
    assert all(row.backward is not None for row in plain if row.op != "input")
    asked = track_scales(model, x.clone().requires_grad_(), grad, route=route)
    leaf = x.clone().requires_grad_()
    (want,) = torch.autograd.grad(model(leaf), leaf, grad)
    assert asked["x"].backward == pytest.approx(want.std(correction=0).item(), rel=1e-5)
    for row, other in zip(plain, asked, strict=True):  # everything else is the same
        if row.op != "input":
            assert (row.forward, row.backward) == pytest.approx((other.forward, other.backward), rel=1e-6)


@pytest.mark.parametrize("route", ["fx", "eager"])
def test_a_model_without_trainable_parameters_differentiates_its_inputs(route: str) -> None:
    torch.manual_seed(0)
    x, grad = torch.randn(4, 8), torch.randn(4, 8)
    frozen = MLP(8).requires_grad_(False)
    for model in (nn.Sequential(nn.ReLU()), frozen):
        report = track_scales(model, x, grad, route=route)
        leaf = x.clone().requires_grad_()
        (want,) = torch.autograd.grad(model(leaf), leaf, grad)
        assert report[report.rows[0].node].backward == pytest.approx(want.std(correction=0).item(), rel=1e-5)
        assert not x.requires_grad and x.grad is None
    assert all(p.grad is None for p in frozen.parameters())


def test_the_model_and_inputs_are_left_untouched() -> None:
    torch.manual_seed(0)
    model, x = MLP(8), torch.randn(4, 8)
    state = copy.deepcopy(model.state_dict())
    track_scales(model, x)
    track_scales(Branchy(), torch.randn(4, 8))
    assert all(p.grad is None and not p._backward_hooks for p in model.parameters())
    assert not x.requires_grad and x.grad is None
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, state[name])
    assert not hasattr(model, "_tensor_constant0")


def test_traced_module_and_report_pickle_and_deepcopy() -> None:
    model = MLP(8)
    gm = capture(model, torch.randn(4, 8), deep=DeepTracing()).graph_module
    assert gm is not None
    torch.manual_seed(0)
    scales = track_scales(gm, torch.randn(4, 8)).scales
    assert set(scales) >= {"x", "linear", "relu", "linear_1"}
    x = torch.randn(3, 8)
    for clone in (copy.deepcopy(gm), pickle.loads(pickle.dumps(gm))):
        torch.testing.assert_close(clone(x), model(x))
    report = track_scales(model, torch.randn(4, 8))
    again = pickle.loads(pickle.dumps(report))
    assert isinstance(again, ScaleReport) and list(again) == list(report) and again.code == report.code


def _deep(model: nn.Module) -> object:
    return capture(model, torch.randn(4, 8), deep=DeepTracing(), check=False, cache=True)


def test_trace_is_reused_until_the_module_changes() -> None:
    clear_capture_cache()
    model = MLP(8)
    first = _deep(model)
    assert _deep(model) is first
    model.eval()
    assert _deep(model) is not first
    model.act = nn.GELU()
    assert "gelu" in _deep(model).python_code()[0]
    torch.manual_seed(0)
    assert "gelu" in track_scales(model, torch.randn(4, 8)).scales


def test_report_table_iteration_indexing_and_plot() -> None:
    torch.manual_seed(0)
    report = track_scales(MLP(8), torch.randn(16, 8))
    lines = report.table().splitlines()
    assert lines[0].split() == ["node", "module", "op", "shape", "fwd", "std", "bwd", "std", "abs", "max"]
    assert len(lines) == len(report) + 1 == 9
    assert report[0] is report.rows[0] and report["relu"].op == "relu"
    assert isinstance(report.scales["relu"], ScalePair)
    with pytest.raises(KeyError, match="no tensor named 'nope'"):
        report["nope"]
    fig = report.plot()
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels[:2] == ["forward", "backward"]
    assert "FP8 E4M3 range $[2^{-9}, 2^{8.8}]$" in labels  # mathtext: drawn as powers
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:2] == ["x", "fc1_weight"]
    import matplotlib.pyplot as plt

    plt.close(fig)


def double_then_relu(x: torch.Tensor) -> torch.Tensor:
    return (x * 2).relu()


class UsesHelper(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return double_then_relu(x) + 1


def test_recurse_modules_and_autowrap_functions_control_the_granularity() -> None:
    torch.manual_seed(0)
    shallow = track_scales(MLP(8), torch.randn(4, 8), recurse_modules=False)
    assert [(row.node, row.op) for row in shallow] == [
        ("x", "input"),
        ("fc1", "Linear"),
        ("act", "ReLU"),
        ("fc2", "Linear"),
    ]
    assert [row.node for row in track_scales(UsesHelper(), torch.randn(4))] == ["x", "mul", "relu", "add"]
    wrapped = track_scales(UsesHelper(), torch.randn(4), autowrap_functions=(double_then_relu,))
    assert [(row.node, row.op) for row in wrapped] == [
        ("x", "input"),
        ("double_then_relu", "double_then_relu"),
        ("add", "add"),
    ]


# Bad input: a typed error naming the problem.


def test_not_a_module_raises_not_a_module_error() -> None:
    with pytest.raises(NotAModuleError, match=r"^track_scales\(\) expects a torch.nn.Module, got function <"):
        track_scales(F.relu, torch.randn(3))  # type: ignore[arg-type]


def test_inputs_of_the_wrong_type_raise_input_error() -> None:
    with pytest.raises(
        InputError,
        match=r"^analyse_module\(inputs=\.\.\.\) must be a torch.Tensor or a tuple/list of the positional inputs "
        "of MLP, got str",
    ):
        analyse_module(MLP(4), "x")  # type: ignore[arg-type]
    import numpy as np

    with pytest.raises(InputError, match=r"inputs\[0\] is a numpy ndarray; convert it with torch.as_tensor"):
        track_scales(MLP(4), (np.ones((2, 4)),))


def test_wrong_number_of_inputs_raises_input_error() -> None:
    with pytest.raises(InputError, match="MLP.forward cannot take the 2 input\\(s\\) given: too many positional"):
        track_scales(MLP(4), (torch.randn(2, 4), torch.randn(2, 4)))


def test_inputs_of_the_wrong_shape_raise_input_error_naming_the_node() -> None:
    with pytest.raises(
        InputError,
        match=r"MLP failed at node 'linear' \(call_function linear\) on inputs of shape \(2, 5\): "
        r"mat1 and mat2 shapes cannot be multiplied \(2x5 and 4x16\)\. Check that the inputs have the shapes",
    ):
        track_scales(MLP(4), torch.randn(2, 5))
    with pytest.raises(InputError, match=r"Branchy failed at .*test_analysis\.py:\d+ \(`y = self\.fc\(x\)`\)"):
        track_scales(Branchy(), torch.randn(2, 5))


def test_backward_of_the_wrong_shape_raises_backward_shape_error() -> None:
    msg = r"backward for output has shape \(3, 4\) but output has shape \(2, 4\); pass a gradient of the output's shape"
    with pytest.raises(BackwardShapeError, match=msg):
        analyse_module(MLP(4), torch.randn(2, 4), torch.randn(3, 4))
    with pytest.raises(BackwardShapeError, match=r"backward has no gradient for output\['b'\]"):

        class Two(nn.Module):
            def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
                return {"a": x * 1.0, "b": x * 2.0}

        track_scales(Two(), torch.randn(2), {"a": torch.ones(2)})
    with pytest.raises(
        BackwardShapeError, match="backward must be a tensor, a tuple/list/dict of tensors, or None; got float"
    ):
        track_scales(MLP(4), torch.randn(2, 4), 1.0)


def test_model_with_no_float_output_raises_no_float_output_error() -> None:
    class ArgMax(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.argmax(-1)

    with pytest.raises(
        NoFloatOutputError, match=r"ArgMax returned no floating-point tensor \(got output: torch.int64\)"
    ):
        track_scales(ArgMax(), torch.randn(2, 3))


def test_unknown_route_raises_input_error() -> None:
    with pytest.raises(InputError, match=r"^track_scales\(route=\.\.\.\) got 'jit'; pass 'auto', 'fx', 'export'"):
        track_scales(MLP(4), torch.randn(2, 4), route="jit")


def test_track_scales_reads_all_stds_in_one_transfer(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model, x = MLP(8), torch.randn(4, 8, requires_grad=True)
    on_cpu = track_scales(model, x, backward=torch.ones(4, 8))
    # What an accelerator's device does, here on the CPU: values stay tensors until the end.
    monkeypatch.setattr("unitscale.tracking.stats.reads_at_once", lambda device: False)
    calls = []
    original = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda self: calls.append(self.shape) or original(self))
    monkeypatch.setattr(torch.Tensor, "item", lambda self: pytest.fail("item() syncs once per tensor"))
    report = track_scales(model, x, backward=torch.ones(4, 8))
    assert calls == [torch.Size([len(report) * 3])]  # forward, backward and abs-max of every row
    for row, cpu_row in zip(report, on_cpu, strict=True):
        assert row.backward is not None and row.abs_max is not None
        assert (row.forward, row.backward, row.abs_max) == pytest.approx(
            (cpu_row.forward, cpu_row.backward, cpu_row.abs_max), rel=1e-5
        )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype feature:UserWarning")
def test_tracking_on_gpu_never_synchronises_before_the_final_read() -> None:
    torch.manual_seed(0)
    model = TinyGPT(vocab_size=11, d_model=16, n_layers=1, n_heads=2, seq_len=8).cuda()
    idx = torch.randint(0, 11, (2, 8), device="cuda")
    track_scales(model, idx)  # warm up: trace, CUDA init
    original = torch.stack

    def read(tensors: list[torch.Tensor]) -> torch.Tensor:
        torch.cuda.set_sync_debug_mode(0)  # the one read at the end may sync
        return original(tensors)

    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("unitscale.tracking.stats.torch.stack", read)
            report = track_scales(model, idx)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert all(row.forward is not None for row in report)


def test_backward_is_taken_once_per_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = MLP(8)
    seen: list[list[int]] = []
    original = torch.autograd.grad

    def grad(outputs: object, inputs: list[torch.Tensor], *args: object, **kwargs: object) -> object:
        seen.append([id(t) for t in inputs])
        return original(outputs, inputs, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(torch.autograd, "grad", grad)
    track_scales(model, torch.randn(4, 8))
    track_scales(model, torch.randn(4, 8, requires_grad=True))
    without, with_input = seen
    assert len(without) == len(set(without)) == len(list(model.parameters()))  # each parameter once
    assert len(with_input) == len(set(with_input)) == 1 + len(list(model.parameters()))  # and the input
