"""Figures for two widths: each figure a page shows is drawn for a desktop column and for a phone.

A figure drawn 7.5 in wide shrinks to half its width in a phone's 360 px column, and its 9 pt
text to 6 px. Shrinking is what a browser can do with one image; what a phone needs is the
figure drawn again, narrower and with larger text, as a paper's figure is drawn for one column.

Two halves, one module:

- **In the kernel** that executes a page (:func:`install`, run by ``figure_widths_startup.py``,
  which ``conf.py`` hands to every kernel as ``PYTHONSTARTUP``): the inline backend's PNG of a
  figure comes with a second rendering in its output's metadata: a copy of the figure
  :data:`PHONE_WIDTH_IN` wide, side-by-side panels stacked, every text at least
  :func:`phone_floor_pt` (and texts that would then collide inside a plot left out). Both
  renderings carry their smallest font size, their dpi and their pixel width, so what a
  reader sees can be measured. A figure whose text is under :data:`DESKTOP_MIN_PT` is drawn
  again for the desktop too, its text raised to that size.
- **In Sphinx** (:func:`setup`): MyST-NB's image output becomes a ``<picture>`` whose
  ``<source>`` serves the phone rendering below :data:`PHONE_MEDIA`, and whose ``<img>`` is the
  desktop one; both carry the measurements as ``data-`` attributes
  (``tests/site/test_browser_figures.py`` computes the text's CSS size from them).

A reader's own Jupyter runs none of this: the download (``notebook_download``) leaves the phone
rendering out, and the notebook's code is the page's.
"""

from __future__ import annotations

import base64
import hashlib
import math
import pickle
import warnings
from typing import Any

from docutils import nodes

#: where the renderings' measurements (and the phone PNG) live in the output's ``image/png`` metadata
METADATA_KEY = "unitscale_site_figure"
#: the phone rendering's width: about what a 360-400 px column shows at a desktop's text size
PHONE_WIDTH_IN = 4.2
#: rendered at twice the density the page asks for (``srcset ... 2x``): sharp on a phone's screen
PHONE_DPI = 200
PHONE_DENSITY = 2
#: the narrowest column a phone rendering is drawn for: a 360 px phone's, less the page's margins
PHONE_COLUMN_PX = 330
#: the CSS px a figure's smallest text is drawn for, on a phone and on a desktop (the bar is 11)
TARGET_TEXT_PX = 12.0
#: text under this size is raised to it in the desktop rendering: at 100 dpi it reads 12.5 px at
#: the figure's own size, and 11 px at the 0.88 of it a desktop column shows at the least
DESKTOP_MIN_PT = 9.0
#: the viewports that get the phone rendering: up to where the desktop one, shown at the
#: column's width, still reads its 9 pt text at 11 px
PHONE_MEDIA = "(max-width: 720px)"


def phone_floor_pt(width_in: float, column_px: float = PHONE_COLUMN_PX, text_px: float = TARGET_TEXT_PX) -> float:
    """The font size (pt) that reads ``text_px`` CSS px in a figure ``width_in`` wide shown ``column_px`` wide."""
    return text_px * 72 * width_in / column_px


def css_text_px(font_pt: float, dpi: float, width_px: float, shown_px: float) -> float:
    """The CSS px of ``font_pt`` text in a PNG ``width_px`` wide drawn at ``dpi`` and shown ``shown_px`` wide."""
    return font_pt * dpi / 72 * shown_px / width_px


# ---------------------------------------------------------------------------------------------
# In the kernel


def _texts(figure: Any) -> list[Any]:
    from matplotlib.text import Text

    return [t for t in figure.findobj(Text) if t.get_visible() and t.get_text().strip()]


def smallest_font_pt(figure: Any) -> float:
    """The smallest font size of the texts ``figure`` shows (drawn first: tick labels are made then)."""
    figure.canvas.draw()
    sizes = [t.get_fontsize() for t in _texts(figure)]
    return min(sizes) if sizes else 0.0


def _copy(figure: Any) -> Any:
    """A copy of ``figure`` that pyplot does not know (so the inline backend never shows it)."""
    from matplotlib import _pylab_helpers
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    # A pyplot figure pickles with a flag that registers its copy with pyplot on unpickling
    # (Figure.__getstate__): with pyplot's registry empty meanwhile, the copy stays unregistered.
    registry = _pylab_helpers.Gcf.figs
    _pylab_helpers.Gcf.figs = type(registry)()
    try:
        data = pickle.dumps(figure)
    finally:
        _pylab_helpers.Gcf.figs = registry
    copy = pickle.loads(data)
    FigureCanvasAgg(copy)
    return copy


def _stack_side_by_side_panels(figure: Any) -> int:
    """Panels in one row of one grid go under each other; returns how many rows there are now."""
    from matplotlib.gridspec import GridSpec

    axes = [ax for ax in figure.axes if ax.get_visible()]
    specs = [ax.get_subplotspec() for ax in axes]
    if not axes or any(s is None for s in specs):
        return 1
    grids = {id(s.get_gridspec()) for s in specs}
    grid = specs[0].get_gridspec()
    if len(grids) != 1 or grid.nrows != 1 or grid.ncols < 2 or any(ax.get_label() == "<colorbar>" for ax in axes):
        return 1
    column = GridSpec(grid.ncols, 1, figure=figure, height_ratios=grid.get_width_ratios())
    for ax, spec in zip(axes, specs, strict=True):
        ax.set_subplotspec(column[spec.colspan.start : spec.colspan.stop, 0])
        # a panel that shared its neighbour's y axis had its tick labels hidden (label_outer)
        ax.yaxis.set_tick_params(which="both", labelleft=ax.yaxis.get_ticks_position() != "right")
    return grid.ncols


def _raise_fonts(figure: Any, floor_pt: float) -> None:
    figure.canvas.draw()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for which, labels in (("major", axis.get_majorticklabels()), ("minor", axis.get_minorticklabels())):
                if labels:
                    size = max(label.get_fontsize() for label in labels)
                    axis.set_tick_params(which=which, labelsize=max(size, floor_pt))
    for text in _texts(figure):
        text.set_fontsize(max(text.get_fontsize(), floor_pt))
    for ax in figure.axes:  # a title or an axis label longer than the narrower figure breaks
        for text in (ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label):
            text.set_wrap(True)


def _refit_legends(figure: Any, size_pt: float) -> None:
    """Legends rebuilt at ``size_pt`` with as many columns as fit their axes' width (or the figure's).

    Legend keeps its columns in a box built once (``Legend._init_legend_box``, private): larger
    text in the same columns ran into each other, so the box is built again for each count of
    columns tried.
    """
    renderer = figure.canvas.get_renderer()
    owners = [(ax.get_legend(), ax) for ax in figure.axes if ax.get_legend()] + [(g, None) for g in figure.legends]
    for legend, ax in owners:
        handles, labels = list(legend.legend_handles), [t.get_text() for t in legend.texts]
        # the axes' share of the grid's columns, less a tick labels' margin, not its width as
        # drawn: a layout drawn mid-way, with a legend still too wide for it, can have squeezed
        # the axes to a sliver
        spec = ax.get_subplotspec() if ax is not None else None
        share = 0.85 * len(spec.colspan) / spec.get_gridspec().ncols if spec else 1.0
        room = figure.get_window_extent(renderer).width * share
        legend.prop.set_size(max(legend.prop.get_size_in_points(), size_pt))
        legend._fontsize = legend.prop.get_size_in_points()
        title = legend.get_title()
        title_text, title_prop = title.get_text(), title.get_fontproperties()

        outside = legend._outside_loc  # fig.legend(loc="outside ..."): set_loc forgets it

        def rebuild(legend: Any = legend, handles: list = handles, labels: list = labels) -> None:
            # what Legend.__init__ does after its own _init_legend_box
            legend._init_legend_box(handles, labels)
            legend.set_loc(legend._loc)
            legend._outside_loc = outside  # noqa: B023 (called in this iteration only)
            legend.set_title(title_text, prop=title_prop)  # noqa: B023

        if ax is not None and legend._bbox_to_anchor is None:  # inside the plot: above it, off the data
            legend.set_bbox_to_anchor((0, 1, 1, 0), transform=ax.transAxes)
            legend._loc = 8  # lower center
            moved = legend.get_window_extent(renderer).height  # the figure grows by it: room above
            _grow(figure, moved)
        else:
            moved = 0.0
        mode, legend._mode = legend._mode, None  # "expand" stretches the box: measure the columns' own width
        for ncols in range(max(legend._ncols, 1), 0, -1):
            legend.set_ncols(ncols)
            rebuild()
            figure.canvas.draw()
            if legend.get_window_extent(renderer).width <= room + 1:
                break
        legend._mode = mode
        rebuild()
        if moved:  # by what the legend takes at its new size and columns
            figure.canvas.draw()
            _grow(figure, legend.get_window_extent(renderer).height - moved)
        if ax is not None:
            _title_above(ax, legend, renderer)


def _grow(figure: Any, height_px: float) -> None:
    width_in, height_in = figure.get_size_inches()
    figure.set_size_inches(width_in, height_in + height_px / figure.dpi)


def _title_above(ax: Any, legend: Any, renderer: Any) -> None:
    """An axes' titles moved up above its legend where the legend sits above the axes."""
    ax.figure.canvas.draw()
    box, top = legend.get_window_extent(renderer), ax.get_window_extent(renderer).y1
    if box.y0 < top - 2:
        return
    pad = (box.y1 - top) * 72 / ax.figure.dpi + 4
    for loc, title in (("center", ax.title), ("left", ax._left_title), ("right", ax._right_title)):
        if title.get_text().strip() and title.get_window_extent(renderer).y0 < box.y1:
            ax.set_title(title.get_text(), loc=loc, pad=pad, fontsize=title.get_fontsize())


def _wrap_wide_titles(figure: Any) -> None:
    """A panel's title wider than its panel (panels side by side) breaks into balanced lines."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        room = ax.get_window_extent(renderer).width
        for title in (ax.title, ax._left_title, ax._right_title):
            words = title.get_text().split()
            if len(words) < 2 or "\n" in title.get_text() or title.get_window_extent(renderer).width <= room:
                continue
            lines = math.ceil(title.get_window_extent(renderer).width / room)
            per_line = math.ceil(len(words) / lines)
            title.set_text("\n".join(" ".join(words[i : i + per_line]) for i in range(0, len(words), per_line)))


def _thin_crowded_ticks(figure: Any) -> None:
    """An axis whose fixed tick labels now overlap keeps every second (third, ...) one."""
    from matplotlib.ticker import FixedLocator

    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        for axis in (ax.xaxis, ax.yaxis):
            if not isinstance(axis.get_major_locator(), FixedLocator):
                continue
            ticks = list(axis.get_majorticklocs())
            labels = [t.get_text() for t in axis.get_majorticklabels()]
            size = axis.get_majorticklabels()[0].get_fontsize() if labels else 0
            for step in range(2, len(ticks)):
                figure.canvas.draw()
                boxes = [t.get_window_extent(renderer) for t in axis.get_majorticklabels() if t.get_text().strip()]
                if not any(a.overlaps(b) for a, b in zip(boxes, boxes[1:], strict=False)):
                    break
                axis.set_ticks(ticks[::step], labels[::step])
                axis.set_tick_params(labelsize=size)


def _leave_out_colliding_labels(figure: Any) -> None:
    """Texts inside a plot (labels in bars) that would overlap a neighbour at the larger size are left out."""
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        kept: list[Any] = []
        for text in [t for t in ax.texts if t.get_visible() and t.get_text().strip()]:
            box = text.get_window_extent(renderer).padded(1)
            if any(box.overlaps(other) for other in kept):
                text.set_visible(False)
            else:
                kept.append(box)


def _png(figure: Any, dpi: float) -> tuple[bytes, int]:
    from IPython.core.pylabtools import print_figure

    data = print_figure(figure, fmt="png", bbox_inches="tight", dpi=dpi)
    width = int.from_bytes(data[16:20], "big")  # the PNG's IHDR: width, then height
    return data, width


def phone_rendering(figure: Any) -> tuple[bytes, dict[str, float]]:
    """``figure`` drawn for a phone: PNG bytes, and its dpi, smallest font (pt) and width (px).

    Warnings (constrained layout giving up on a crowded copy) are the site's, not the page's:
    they are not shown in the cell's output.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, data, measured = phone_copy(figure)
    return data, measured


def phone_copy(figure: Any) -> tuple[Any, bytes, dict[str, float]]:
    """The copy of ``figure`` drawn for a phone, its PNG and its measurements."""
    copy = _copy(figure)
    width_in, height_in = copy.get_size_inches()
    rows = _stack_side_by_side_panels(copy)
    original = smallest_font_pt(copy) or DESKTOP_MIN_PT
    floor = phone_floor_pt(PHONE_WIDTH_IN)
    grow = max(1.0, floor / original) ** 0.5  # more room for larger text, not all of it
    copy.set_size_inches(PHONE_WIDTH_IN, height_in * grow * (1 if rows == 1 else 0.75 * rows))
    # fig.tight_layout() leaves a placeholder engine that lays out nothing: the original's
    # spacing, kept for a narrower figure with larger text and a legend moved above a plot, ran
    # one panel's legend into the panel over it; tight layout is laid out again at each draw
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if copy.get_layout_engine() is None:
        copy.set_layout_engine("constrained")
    elif isinstance(copy.get_layout_engine(), PlaceHolderLayoutEngine):
        copy.set_layout_engine("tight")  # what its author asked for, done again at each draw
    data, width = b"", 0
    for ax in copy.axes:  # a label in a plot ends at its edge: larger, it would widen the figure
        for text in ax.texts:
            text.set_clip_on(True)
    for _ in range(3):  # the tight box can come out wider than the figure (a legend outside it)
        with warnings.catch_warnings():  # larger text before its legend is refit can collapse a layout
            warnings.simplefilter("ignore")
            _raise_fonts(copy, floor)
            _refit_legends(copy, floor)
            _wrap_wide_titles(copy)
            _thin_crowded_ticks(copy)
            _leave_out_colliding_labels(copy)
        data, width = _png(copy, PHONE_DPI)
        smallest = smallest_font_pt(copy)
        shown = min(PHONE_COLUMN_PX, width / PHONE_DENSITY)
        if css_text_px(smallest, PHONE_DPI, width, shown) >= TARGET_TEXT_PX - 0.05:
            break
        if width > 1.5 * PHONE_WIDTH_IN * PHONE_DPI:  # larger text widens it further: no end to it
            break
        floor *= TARGET_TEXT_PX / css_text_px(smallest, PHONE_DPI, width, shown)
    return copy, data, {"dpi": PHONE_DPI, "density": PHONE_DENSITY, "min_pt": smallest, "width_px": width}


def renderings(figure: Any, dpi: float) -> tuple[bytes, dict[str, Any]]:
    """The desktop PNG of ``figure`` at ``dpi``, and the metadata that carries the phone PNG."""
    smallest = smallest_font_pt(figure)
    desktop = figure
    if 0 < smallest < DESKTOP_MIN_PT:
        desktop = _copy(figure)
        _raise_fonts(desktop, DESKTOP_MIN_PT)
        smallest = smallest_font_pt(desktop)
    data, width = _png(desktop, dpi)
    phone, measured = phone_rendering(figure)
    return data, {
        METADATA_KEY: {
            "desktop": {"dpi": dpi, "density": 1, "min_pt": smallest, "width_px": width},
            "phone": {**measured, "png": base64.b64encode(phone).decode("ascii")},
        }
    }


def _png_formatter(figure: Any) -> tuple[str, dict[str, Any]] | None:
    if not figure.axes and not figure.texts:
        return None  # as IPython's: an empty figure shows nothing
    data, metadata = renderings(figure, figure.dpi)
    return base64.b64encode(data).decode("ascii"), metadata


def install(shell: Any = None) -> None:
    """Make the kernel's PNG of a figure carry its phone rendering (see the module's docstring).

    The inline backend registers its own PNG formatter when pyplot is first imported, so this
    one is registered again before each cell's figures are shown (``post_execute`` callbacks
    run in the order they were registered, and this one comes first).
    """
    from IPython import get_ipython

    shell = shell or get_ipython()
    if shell is None:
        return

    def register() -> None:
        from matplotlib.figure import Figure

        shell.display_formatter.formatters["image/png"].for_type(Figure, _png_formatter)

    shell.events.register("post_execute", register)
    register()
    shell.events.register("pre_execute", register)
    # A cell that imports pyplot and shows a figure (plt.show()) before it ends: the inline backend
    # registers its formatter when it is first loaded, mid-cell, through select_figure_formats
    import matplotlib_inline.backend_inline as inline

    select = inline.select_figure_formats

    def select_then_register(*args: Any, **kwargs: Any) -> None:
        select(*args, **kwargs)
        register()

    inline.select_figure_formats = select_then_register
    register()


# ---------------------------------------------------------------------------------------------
# In Sphinx


class two_widths(nodes.General, nodes.Element):  # noqa: N801 (docutils names nodes in lower case)
    """A figure's desktop image and its phone image, and their measurements (``desktop``, ``phone``)."""


def _attributes(measured: dict[str, Any], prefix: str = "") -> str:
    names = {"dpi": "dpi", "density": "density", "min_pt": "min-font-pt", "width_px": "width-px"}
    return " ".join(f'data-{prefix}{names[k]}="{measured[k]}"' for k in names)


def setup(app: Any) -> dict:
    import os
    import posixpath
    import urllib.parse
    from pathlib import Path

    from myst_nb.core.render import NbElementRenderer

    # the kernels MyST-NB starts inherit the environment: each runs figure_widths_startup.py first
    os.environ["PYTHONSTARTUP"] = str(Path(__file__).with_name("figure_widths_startup.py"))
    render_image = NbElementRenderer.render_image

    def render_two_widths(self: Any, data: Any) -> list[Any]:
        rendered = render_image(self, data)
        site = data.output_metadata.get(data.mime_type, {}).get(METADATA_KEY)
        if not site or len(rendered) != 1:
            return rendered
        phone = base64.b64decode(site["phone"]["png"])
        uri = self.write_file([hashlib.sha256(phone).hexdigest() + ".png"], phone, overwrite=False, exists_ok=True)
        node = two_widths(desktop=site["desktop"], phone={k: v for k, v in site["phone"].items() if k != "png"})
        node += rendered[0]
        node += nodes.image(uri=uri)
        return [node]

    NbElementRenderer.render_image = render_two_widths

    def src(translator: Any, image: Any) -> str:
        uri = image["uri"]
        if uri in translator.builder.images:
            uri = posixpath.join(translator.builder.imgpath, urllib.parse.quote(translator.builder.images[uri]))
        return str(uri)

    def visit_html(translator: Any, node: Any) -> None:
        desktop, phone = node.children
        translator.body.append(
            f'<picture class="figure-two-widths">'
            f'<source media="{PHONE_MEDIA}" srcset="{src(translator, phone)} {node["phone"]["density"]}x" '
            f"{_attributes(node['phone'])}>"
            f'<img src="{src(translator, desktop)}" alt="" {_attributes(node["desktop"])} '
            f"{_attributes(node['phone'], 'phone-')}></picture>"
        )
        raise nodes.SkipNode

    def visit_other(translator: Any, node: Any) -> None:
        pass  # other formats show both images

    app.add_node(two_widths, html=(visit_html, None), latex=(visit_other, visit_other), text=(visit_other, visit_other))
    return {"parallel_read_safe": True, "parallel_write_safe": True}
