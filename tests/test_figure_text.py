"""Every figure the library draws, and every tutorial, keeps its text at 9 pt or more.

The site shows figures drawn at 100 dpi at 72% of their width or more (the browser test checks
that), so 9 pt text reads at 9 px or more on a desktop; a plotting method or a tutorial that
asked for smaller text would slip under it. Each plotting method is drawn here on a small input
and every visible text on it measured; tutorials are read for explicit small sizes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MIN_PT = 9
SMALL = re.compile(
    r"""\b(?:fontsize|labelsize|titlesize)\s*=\s*(?:(?:[0-7]|8)(?:\.\d+)?\b|["'](?:x{0,2}-?small|smaller)["'])"""
)


def _small_texts(figure: Figure) -> list[str]:
    figure.canvas.draw()  # tick labels are made when drawn
    return [
        f"{t.get_text()!r} at {t.get_fontsize():.1f} pt"
        for t in figure.findobj(Text)
        if t.get_visible() and t.get_text().strip() and t.get_fontsize() < MIN_PT
    ]


def _scale_report() -> object:
    from unitscale import track_scales
    from unitscale.examples import MLP

    return track_scales(MLP(8, 16), torch.randn(16, 8)).plot()


def _stage_plan() -> object:
    from unitscale import partition
    from unitscale.examples import MLP

    plan = partition(MLP(8, 16), 2, torch.randn(4, 8))
    return plan.plot(compare={"other": plan.with_bounds(plan.bounds)})


def _timeline() -> object:
    from unitscale.stages.planner.simulation import simulate_bounds
    from unitscale.stages.schedules import ChainCosts

    return simulate_bounds(ChainCosts.uniform([1.0] * 4, backward_ratio=2.0), [0, 2, 4], "1f1b", 4).plot()


def _monitor_heatmap() -> object:
    from unitscale.tracking import ScaleMonitor

    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with ScaleMonitor(model, every=1) as monitor:
        for _ in range(2):
            with monitor.step():
                model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return monitor.heatmap("std", kind="activation")


def _coord_check() -> object:
    from unitscale.scaling.transfer import CoordCheck

    return CoordCheck([8, 16], 1, {"a": [0.5, 0.6], "b": [1.0, 1.1]}, {"a": [1.0, 1.0], "b": [1.0, 0.9]}).plot()


def _lr_sweep() -> object:
    from unitscale.examples import MarkovSource
    from unitscale.examples.umup_models import UmupGPT, markov_batches
    from unitscale.scaling.transfer import lr_sweep

    data = markov_batches(MarkovSource(8), batch=4, seq_len=8)
    return lr_sweep(lambda w: UmupGPT(8, width=w, depth=1), [16, 32], [0.01, 0.1, 1.0], data, steps=2).plot()


FIGURES: dict[str, Callable[[], object]] = {
    "ScaleReport.plot": _scale_report,
    "StagePlan.plot": _stage_plan,
    "Timeline.plot": _timeline,
    "ScaleMonitor.heatmap": _monitor_heatmap,
    "CoordCheck.plot": _coord_check,
    "LRSweep.plot": _lr_sweep,
}


@pytest.mark.parametrize("draw", FIGURES.values(), ids=FIGURES.keys())
def test_every_text_the_library_draws_is_at_least_9_pt(draw: Callable[[], object]) -> None:
    drawn = draw()
    figure = drawn if isinstance(drawn, Figure) else drawn.figure  # type: ignore[attr-defined]
    try:
        assert _small_texts(figure) == []
    finally:
        plt.close(figure)


@pytest.mark.parametrize("tutorial", sorted((ROOT / "tutorials").glob("[0-9][0-9]*_*.md")), ids=lambda p: p.stem)
def test_tutorials_ask_for_no_text_under_9_pt(tutorial: Path) -> None:
    found = [m.group(0) for m in SMALL.finditer(tutorial.read_text(encoding="utf-8"))]
    assert found == [], f"{tutorial.name} asks for text under {MIN_PT} pt: {found}"


def test_the_size_pattern_sees_small_sizes_and_only_them() -> None:
    small = ["fontsize=8", "fontsize=7.5", 'fontsize="small"', "labelsize='x-small'", "titlesize='smaller'"]
    fine = ["fontsize=9", "fontsize=10", "fontsize=18", "batch_size=4", 'fontsize="large"']
    assert [bool(SMALL.search(s)) for s in small + fine] == [True] * len(small) + [False] * len(fine)
