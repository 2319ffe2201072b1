"""The phone rendering of a figure (``docs/_ext/figure_widths.py``), measured in matplotlib.

The browser test (``test_browser_widths``) measures the built site; this checks, without a
build, what the kernel attaches: a rendering whose smallest text reads 11 CSS px or more in a
phone's column, laid out as the desktop one must be (``test_figure_layout``), while the figure
the notebook holds is left as it was and pyplot never sees the copy.
"""

from __future__ import annotations

import base64
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from tests.site.test_figure_layout import DRAWN, _figure, layout_problems  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

import figure_widths as fw  # noqa: E402
import output_widths  # noqa: E402

PHONE_COLUMN = 358  # a 390 px phone's column, measured in Chromium on the built site
CHOSEN = ["ScaleReport.plot, 60 long names", "StagePlan.plot, three plans"]


@pytest.mark.parametrize("name", CHOSEN)
def test_the_phone_rendering_reads_11_px_in_a_phones_column_legends_off_the_data(name: str) -> None:
    figure = _figure(DRAWN[name]())
    try:
        copy, png, phone = fw.phone_copy(figure)
        assert int.from_bytes(png[16:20], "big") == phone["width_px"]
        for column in (PHONE_COLUMN, fw.PHONE_COLUMN_PX):
            shown = min(column, phone["width_px"] / phone["density"])
            assert fw.css_text_px(phone["min_pt"], phone["dpi"], phone["width_px"], shown) >= 11
        assert [p for p in layout_problems(copy) if "legend covers" in p or "overlap" in p] == []
    finally:
        plt.close("all")


def test_the_figure_the_notebook_holds_is_unchanged_and_pyplot_never_sees_the_copy() -> None:
    figure, ax = plt.subplots(figsize=(7.5, 3))
    ax.plot([1, 2, 3], label="line")
    ax.legend(fontsize=7)
    ax.set_xticks([1, 2], ["a", "b"], fontsize=7)
    before = (tuple(figure.get_size_inches()), fw.smallest_font_pt(figure), plt.get_fignums(), plt.gcf())
    try:
        _, metadata = fw.renderings(figure, 100)
        after = (tuple(figure.get_size_inches()), fw.smallest_font_pt(figure), plt.get_fignums(), plt.gcf())
        assert after == before
        desktop = metadata[fw.METADATA_KEY]["desktop"]
        assert desktop["min_pt"] >= fw.DESKTOP_MIN_PT, "7 pt text is raised in the desktop rendering"
    finally:
        plt.close("all")


def test_the_kernel_formatter_gives_png_and_the_phone_rendering() -> None:
    figure = Figure(figsize=(4, 2))
    figure.add_subplot().plot([0, 1])
    data, metadata = fw._png_formatter(figure)  # type: ignore[misc]
    assert base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(metadata[fw.METADATA_KEY]) == {"desktop", "phone"}
    assert fw._png_formatter(Figure()) is None


def test_tables_keep_their_columns_and_everything_else_wraps() -> None:
    table = "node  module  op     shape\nx             input  (2,)\nfc1   fc1     linear (2, 4)\n"
    message = "relu_exp: cannot invert node 'relu' (torch.relu) in function relu_exp: it is not one-to-one"
    code = "def forward(self, x):\n    fc1 = self.fc1(x);  x = None\n    return fc1\n"
    assert output_widths.is_table(table)
    assert not output_widths.is_table(message)
    assert not output_widths.is_table(code)
    # fx's code frees each input after its last use, two spaces after a semicolon: where two
    # lines' statements have the same length, those gaps line up, and are still not a column
    more = "    act = self.act(fc1);  fc1 = None\n    fc2 = self.fc2(act);  act = None\n"
    code = code.replace("    return fc1\n", more)
    assert not output_widths.is_table(code)


def _boxes_overlap(a, b) -> bool:
    return a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1


def test_a_legend_moved_above_its_panel_gets_room_there() -> None:
    """Two stacked panels, a legend in each, laid out once by tight_layout: on the phone each
    legend goes above its own panel, and neither runs into the panel above it (tutorial 8's
    plans ran the lower legend and title onto the upper panel), in as many columns as fit."""
    figure, axes = plt.subplots(2, 1, figsize=(7.5, 6))
    try:
        for ax in axes:
            for label in ("by FLOPs", "by params", "by time", "equal layers"):
                ax.bar([0, 1, 2], [1, 2, 3], label=label)
            ax.legend(fontsize=9, ncols=4)
            ax.set_title("a model")
        figure.tight_layout()
        copy, _, _ = fw.phone_copy(figure)
        renderer = copy.canvas.get_renderer()
        upper, lower = copy.axes
        for ax in (upper, lower):
            legend = ax.get_legend().get_window_extent(renderer)
            assert legend.y0 >= ax.get_window_extent(renderer).y1 - 1, "the legend sits above its panel"
        assert not _boxes_overlap(lower.get_legend().get_window_extent(renderer), upper.get_tightbbox(renderer))
        assert not _boxes_overlap(lower.title.get_window_extent(renderer), upper.get_window_extent(renderer))
        assert upper.get_legend()._ncols == 2
    finally:
        plt.close("all")


def test_a_figure_legend_outside_the_panels_stays_outside_them() -> None:
    """fig.legend(loc="outside lower center") under two panels: on the phone, under both, off the data."""
    figure, axes = plt.subplots(1, 2, figsize=(7.5, 3.5), layout="constrained")
    try:
        for ax in axes:
            for label in ("forward", "backward", "FP8 E4M3 range", "FP8 E5M2 range"):
                ax.plot([0, 1], [0, len(label)], label=label)
        figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", ncols=4)
        copy, _, _ = fw.phone_copy(figure)
        renderer = copy.canvas.get_renderer()
        legend = copy.legends[0].get_window_extent(renderer)
        for ax in copy.axes:
            assert legend.y1 <= ax.get_tightbbox(renderer).y0 + 1
    finally:
        plt.close("all")
