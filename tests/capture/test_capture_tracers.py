"""The fx route's tracers: the deep one scale tracking uses is the fx layer's tracers composed."""

from __future__ import annotations

from torch import nn

from unitscale.capture._tracers import DeepCaptureTracer
from unitscale.examples.models import MLP, TinyGPT, resnet18


def test_scale_tracer_composes_module_paths_with_deep_tracing() -> None:
    graph = DeepCaptureTracer().trace(MLP(4))
    assert [(n.name, n.meta.get("module_path")) for n in graph.nodes if n.op != "output"] == [
        ("x", ""),
        ("fc1_weight", "fc1"),
        ("fc1_bias", "fc1"),
        ("linear", "fc1"),
        ("relu", "act"),
        ("fc2_weight", "fc2"),
        ("fc2_bias", "fc2"),
        ("linear_1", "fc2"),
    ]


def test_scale_tracer_gives_the_same_graph_as_the_composed_tracers() -> None:
    from unitscale.fx import DeepTracer, ModulePathTracer

    class Composed(ModulePathTracer, DeepTracer):
        pass

    shared = nn.Linear(4, 4)
    tied = nn.Sequential(shared, nn.ReLU(), shared)  # one parameter reached under two names
    for model in (TinyGPT(vocab_size=11, d_model=16, n_layers=2, n_heads=2, seq_len=8), resnet18(width=4), tied):
        ours, reference = DeepCaptureTracer().trace(model), Composed().trace(model)
        assert ours.python_code("self").src == reference.python_code("self").src
        paths = [n.meta.get("module_path") for n in ours.nodes if n.op != "output"]
        assert paths == [n.meta.get("module_path") for n in reference.nodes if n.op != "output"]
