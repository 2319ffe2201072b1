"""unit_scale on CNNs from torchvision and timm: unit scale holds, or ``scale_check`` says where it breaks.

Each model (``tests/vision_models.py``) is unit-scaled as built, in training mode. The
protocol of the issue that asked for this: the output std and the input-gradient std
(for an ``N(0, 1)`` output gradient) in training mode; then three training batches (batch
norm's running statistics follow them); then the same in eval mode. The band is [0.5, 2].
A model either holds it in a mode, or its ``scale_check`` for that mode is off unit scale
and names the ops that moved it, with the std it measured before and after each.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import pytest
import torch

import unitscale.functional as U
from tests.vision_models import MODELS, build
from unitscale.transforms import ScaleCheck, TransformedModule, unit_scale

BAND = (0.5, 2.0)

#: Models and modes that hold the band today; a change that loses one fails here. The others
#: (measured: MobileNetV3's input gradient 0.45, torchvision's MobileNetV2 0.1, LeViT's output
#: 2.7, EfficientNet's eval gradient 0.46) are held to the check's report above.
HELD = {
    *(
        (name, mode)
        for name in ("resnet18", "regnet_y_400mf", "regnetx_002", "botnet26t_256")
        for mode in ("train", "eval")
    ),
    ("efficientnet_b0", "train"),
}


@dataclass
class Run:
    out: float
    grad: float
    check: ScaleCheck


@dataclass
class Measured:
    train: Run
    eval: Run
    scaled: TransformedModule


def _run(model: torch.nn.Module, x: torch.Tensor) -> tuple[float, float]:
    x = x.clone().requires_grad_()
    out = model(x)
    out.backward(torch.randn(out.shape, generator=torch.Generator().manual_seed(1)))
    return out.std(correction=0).item(), x.grad.std(correction=0).item()


@functools.cache
def measured(name: str) -> Measured:
    model, x = build(name)
    torch.manual_seed(0)
    scaled = unit_scale(model)
    train = _run(scaled, x)
    assert scaled.scale_check is not None
    train_check = scaled.scale_check
    with torch.no_grad():
        for seed in (1, 2, 3):
            scaled(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)))
    scaled.eval()
    evaluated = _run(scaled, x)
    return Measured(Run(*train, train_check), Run(*evaluated, scaled.scale_check), scaled)


def _inside(value: float) -> bool:
    return BAND[0] <= value <= BAND[1]


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_unit_scale_holds_or_the_check_names_the_ops_that_break_it(name: str, mode: str) -> None:
    run: Run = getattr(measured(name), mode)
    check = run.check
    # the check measured the call that captured this mode's graph: the same model and
    # input, another output gradient (80 logits: the input gradient's std varies by a third)
    assert math.isclose(run.out, check.output_std, rel_tol=1e-4), (name, mode, run)
    assert 0.5 < run.grad / check.grad_std < 2, (name, mode, run)
    if check.ok:
        return
    assert check.breaks or check.drift, (name, mode, check.summary())
    for off in [*check.breaks, *check.drift]:
        assert off.op and off.direction in ("forward", "backward") and off.before > 0
        assert f"std {off.before:.3g} -> {off.after:.3g}" in check.summary()


@pytest.mark.parametrize(("name", "mode"), sorted(HELD))
def test_these_models_hold_unit_scale(name: str, mode: str) -> None:
    run: Run = getattr(measured(name), mode)
    assert _inside(run.out) and _inside(run.grad), (name, mode, run.out, run.grad, run.check.summary())


def test_squeeze_excitation_gates_and_hard_activations_all_get_twins() -> None:
    for name, twins in [
        ("mobilenet_v3_small", {U.hardswish, U.hardsigmoid, U.mul}),
        ("efficientnet_b0", {U.sigmoid, U.silu, U.mul}),
        ("regnet_y_400mf", {U.sigmoid, U.mul}),
    ]:
        scaled = measured(name).scaled
        targets = {n.target for n in scaled.graph_module.graph.nodes}
        assert twins <= targets and scaled.unscaled_ops == [], (name, scaled.unscaled_ops)


def test_batch_norm_statistics_follow_the_training_batches() -> None:
    scaled = measured("resnet18").scaled
    bn = scaled.module.bn1
    # the capturing call and three training batches: four updates, none by the captures
    assert bn.num_batches_tracked.item() == 4
    assert not torch.equal(bn.running_var, torch.ones_like(bn.running_var))


def test_projection_shortcuts_become_residual_pairs_at_their_fork() -> None:
    graph = measured("resnet18").scaled.graph_module.graph
    joins = [n for n in graph.nodes if n.target is U.residual_add]
    assert len(joins) == 8 and not any(n.target is U.add for n in graph.nodes)
