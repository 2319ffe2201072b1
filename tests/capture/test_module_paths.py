"""Every ``module_path`` a capture writes names a module of the model (or the root, ``""``)."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from tests.real_models import bart, gpt2, llama
from unitscale.capture import capture
from unitscale.capture.toolkit import normalise_graph, stack_entries
from unitscale.examples.models import MLP


def _unknown_paths(model: nn.Module, gm: fx.GraphModule) -> list[tuple[str, str]]:
    names = {name for name, _ in model.named_modules(remove_duplicate=False)}
    found = [(n.name, n.meta["module_path"]) for n in gm.graph.nodes if n.meta["module_path"] not in names]
    found += [(n.name, p) for n in gm.graph.nodes for _, p, _ in stack_entries(n) or () if p not in names]
    return found


class Flatten(nn.Module):
    """Reads its batch size (``x.shape[0]``): a dynamic export makes a ``sym_size_int`` node for it."""

    def __init__(self) -> None:
        super().__init__()
        self.mlp = MLP(4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x.reshape(x.shape[0], 4))


def test_the_batch_size_read_of_a_dynamic_export_belongs_to_the_root() -> None:
    model = Flatten()
    cap = capture(model, torch.randn(3, 2, 2), route="export", dynamic_batch=True)
    sizes = [n for n in cap.nodes() if "sym_size" in str(n.target)]
    assert sizes, "torch.export made no size read for a dynamic batch"
    # torch writes its placeholder "_empty_nn_module_stack_from_metadata_hook" on this node
    assert [n.meta["module_path"] for n in sizes] == [""] * len(sizes)
    assert [n.meta["module_type"] for n in sizes] == [f"{__name__}.Flatten"] * len(sizes)
    assert _unknown_paths(model, cap.graph_module) == []


@pytest.mark.parametrize("build", [gpt2, llama, bart], ids=["gpt2", "llama", "bart"])
def test_every_path_of_a_dynamic_export_of_a_transformers_model_is_one_of_its_modules(build) -> None:
    model, inputs = build()
    cap = capture(model, inputs, route="export", dynamic_batch=True)
    assert _unknown_paths(model, cap.graph_module) == []
    paths = {n.meta["module_path"] for n in cap.nodes(compute_only=True)}
    assert any(p.endswith("attn") or p.endswith("self_attn") for p in paths)  # the stack was read, not dropped


def test_a_path_no_rule_reads_falls_back_to_the_innermost_module_it_names() -> None:
    model = nn.Sequential(nn.Sequential(nn.Linear(2, 2)))
    gm = fx.symbolic_trace(model)
    linear = next(n for n in gm.graph.nodes if n.op == "call_module")
    linear.meta["module_path"] = "0.0.not_a_module"
    other = next(n for n in gm.graph.nodes if n.op == "placeholder")
    other.meta["module_path"] = "nowhere"
    normalise_graph(gm, model)
    assert (linear.meta["module_path"], linear.meta["module_type"]) == ("0.0", "torch.nn.modules.linear.Linear")
    assert (other.meta["module_path"], other.meta["module_type"]) == ("", "torch.nn.modules.container.Sequential")
