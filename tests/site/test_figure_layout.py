"""Every figure the library draws is drawn for the site's column: measured in matplotlib, at draw time.

The site shows figures at the width of its text column (7.5 in at 100 dpi on a desktop, shrunk
to the column on a phone; ``test_browser_reading`` checks that). What the browser cannot see is
inside the image, so each plotting method is drawn here, on a small input and on a large one
(hundreds of tensors with long names, as a ``transformers`` model gives), and measured:

- **no legend over data**: no plotted point or bar lies under a legend's box;
- **the plot area is most of the figure**: the axes cover at least :data:`MIN_AXES_SHARE` of
  it, so tick labels and titles do not squeeze the data into a strip;
- **tick labels readable**: no two labels of an axis overlap, none is cut off at the edge;
- **at most 7.5 in wide**, the width the site's column shows at about nine tenths.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402

from tests.test_figure_text import FIGURES  # noqa: E402  (the same figures)

MIN_AXES_SHARE = 0.4
MAX_WIDTH_IN = 7.5


def _large_scale_report() -> Figure:
    from unitscale import ScaleReport
    from unitscale.tracking import ScaleRow

    rng = np.random.default_rng(0)
    rows = []
    for layer in range(12):
        for part in ("input_layernorm", "self_attn_q_proj", "self_attn_o_proj", "mlp_up_proj", "mlp_down_proj"):
            name = f"model_layers_{layer}_{part}"
            op = "parameter" if part.endswith("layernorm") else "linear"
            std = float(2.0 ** rng.normal(0, 2))
            rows.append(ScaleRow(name, name.replace("_", "."), op, (4, 32, 64), "float32", std, std * 2.0**-12))
    return ScaleReport(rows, "LlamaForCausalLM").plot()


def _many_stages() -> Figure:
    import torch

    from unitscale import partition

    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(8)])
    plan = partition(model, 4, torch.randn(8, 32), cost="params")
    naive = plan.with_bounds(plan.bounds)
    ax = plan.plot(compare={"equal count": naive, "greedy": naive})
    return ax.get_figure(root=True)  # type: ignore[return-value]


DRAWN: dict[str, Callable[[], object]] = {
    **FIGURES,
    "ScaleReport.plot, 60 long names": _large_scale_report,
    "StagePlan.plot, three plans": _many_stages,
}


def _figure(drawn: object) -> Figure:
    if isinstance(drawn, Figure):
        return drawn
    if isinstance(drawn, Axes):
        return drawn.get_figure(root=True)  # type: ignore[return-value]
    return drawn.figure  # type: ignore[attr-defined]


def _data_points(ax: Axes) -> np.ndarray:
    """Display coordinates of every plotted point, and of every bar's top corners and centre."""
    points = []
    for artist in ax.get_children():
        if isinstance(artist, Line2D) and artist.get_visible() and artist.get_label() != "_nolegend_":
            xy = np.column_stack(artist.get_data()).astype(float)
            if len(xy) and not (artist.get_linestyle() in ("--", "-.", ":") and len(np.unique(xy[:, 1])) == 1):
                points.append(artist.get_transform().transform(xy[np.isfinite(xy).all(axis=1)]))
        elif isinstance(artist, PathCollection) and artist.get_visible():
            offsets = np.asarray(artist.get_offsets(), dtype=float)
            if len(offsets):
                points.append(artist.get_offset_transform().transform(offsets))
        elif isinstance(artist, Rectangle) and artist is not ax.patch and artist.get_visible():
            if artist.get_height() and artist.get_width() and artist.get_alpha() != 0:
                x0, y0 = artist.get_xy()
                w, h = artist.get_width(), artist.get_height()
                corners = [(x0, y0 + h), (x0 + w, y0 + h), (x0 + w / 2, y0 + h / 2)]
                points.append(artist.get_transform().transform(corners))
    return np.concatenate(points) if points else np.empty((0, 2))


def _within(box, points: np.ndarray) -> np.ndarray:
    x, y = points[:, 0], points[:, 1]
    return (x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)


def layout_problems(figure: Figure) -> list[str]:
    """What is wrong with ``figure``'s layout, each problem named."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()  # type: ignore[attr-defined]
    problems = []
    width, height = figure.get_size_inches()
    if width > MAX_WIDTH_IN + 1e-9:
        problems.append(f"{width:.2f} in wide (at most {MAX_WIDTH_IN})")
    axes = [ax for ax in figure.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    share = sum(ax.get_window_extent(renderer).width * ax.get_window_extent(renderer).height for ax in axes) / (
        figure.bbox.width * figure.bbox.height
    )
    if share < MIN_AXES_SHARE:
        problems.append(f"the axes cover {share:.0%} of the figure (at least {MIN_AXES_SHARE:.0%})")
    legends = [ax.get_legend() for ax in axes if ax.get_legend()] + list(figure.legends)
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in axes:
            points = _data_points(ax)
            inside = _within(box, points) & _within(ax.get_window_extent(renderer), points)
            if inside.any():
                problems.append(f"a legend covers {int(inside.sum())} data points of {ax.get_title()[:40]!r}")
    for ax in axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            labels = [  # the labels drawn: a tick outside the view has a label that is not
                tick.label1
                for tick in axis.get_major_ticks()
                if lo - 1e-9 <= tick.get_loc() <= hi + 1e-9
                and tick.label1.get_visible()
                and tick.label1.get_text().strip()
            ]
            boxes = [t.get_window_extent(renderer) for t in labels]
            overlapping = sum(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
            if overlapping:
                problems.append(f"{overlapping} pairs of {axis.axis_name} tick labels overlap")
            cut = sum(b.x0 < -1 or b.y0 < -1 or b.x1 > figure.bbox.x1 + 1 or b.y1 > figure.bbox.y1 + 1 for b in boxes)
            if cut:
                problems.append(f"{cut} {axis.axis_name} tick labels are cut off at the figure's edge")
    return problems


@pytest.mark.parametrize("draw", DRAWN.values(), ids=DRAWN.keys())
def test_every_figure_the_library_draws_fits_the_column(draw: Callable[[], object]) -> None:
    figure = _figure(draw())
    try:
        assert layout_problems(figure) == []
    finally:
        plt.close(figure)


def test_the_layout_check_sees_a_legend_over_data_a_strip_and_crowded_ticks() -> None:
    figure, ax = plt.subplots(figsize=(8, 3))
    ax.plot(range(10), [5] * 10, "o", label="data")
    ax.legend(loc="center")
    ax.set_xticks(range(10), [f"a_rather_long_tick_label_{i}" for i in range(10)])
    try:
        problems = layout_problems(figure)
        assert any("8.00 in wide" in p for p in problems)
        assert any("a legend covers" in p for p in problems)
        assert any("x tick labels overlap" in p for p in problems)
    finally:
        plt.close(figure)
    figure, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    ax.set_xticks(range(5), ["x" * 40] * 5, rotation=90)
    try:
        assert any("the axes cover" in p for p in layout_problems(figure))
    finally:
        plt.close(figure)
