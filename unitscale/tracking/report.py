"""The result of :func:`unitscale.track_scales`: one row per tensor, a table, a plot and the annotated code.

A :class:`ScaleReport` holds only plain Python values, so it pickles and outlives the model.
"""

from __future__ import annotations

import functools
import math
import re
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from unitscale.capture.toolkit import html_table
from unitscale.errors import FormatError, InputError, NodeNotFoundError
from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FP16
from unitscale.fx.nodes import MODULE_PATH_KEY
from unitscale.tracking.stats import ScaleRecord, Stat

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from unitscale.capture import Capture

__all__ = ["ScalePair", "ScaleRow", "ScaleReport", "FORMAT_RANGES", "annotated_code", "read_rows", "read_stats"]


#: ``name -> (smallest subnormal, largest normal)`` of the formats drawn by
#: :meth:`ScaleReport.plot`, from the bit layouts in ``unitscale.formats``.
FORMAT_RANGES: dict[str, tuple[float, float]] = {
    name: (fmt.min_subnormal, fmt.max_value)
    for name, fmt in (("BF16", BF16), ("FP16", FP16), ("FP8 E5M2", FP8_E5M2), ("FP8 E4M3", FP8_E4M3))
}


def _fmt(value: float | None) -> str:
    if value is None:
        return "n/a"
    if not math.isfinite(value):
        return str(value)
    # Round to 3 significant digits, then let float's repr drop trailing zeros (1.0, 0.236).
    return repr(float(f"{value:.3g}"))


@dataclass(frozen=True)
class ScalePair:
    """A tensor's forward scale and its gradient's scale (standard deviations).

    Prints with 3 significant digits; ``None`` (not recorded: no backward pass, or a tensor
    that does not require grad) prints as ``n/a``.

    >>> from unitscale.tracking import ScalePair
    >>> ScalePair(1.0, 0.23649)
    (-> 1.0, <- 0.236)
    """

    forward: float | None = None
    backward: float | None = None

    def __post_init__(self) -> None:
        for name, value in (("forward", self.forward), ("backward", self.backward)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise InputError(
                    f"ScalePair({name}=...) got {type(value).__name__} {value!r:.60}; pass a float or None"
                )

    def __repr__(self) -> str:
        return f"(-> {_fmt(self.forward)}, <- {_fmt(self.backward)})"

    __str__ = __repr__


class ScaleRow(NamedTuple):
    """One tracked tensor: where it came from and its scales.

    Attributes:
        node: node name (``linear_1``), as in the traced code.
        module_path: qualified name of the module that produced it (``""``: the root).
        op: what produced it (``linear``, ``Tensor.reshape``, ``input``, ``parameter``).
        dtype: e.g. ``"float32"``.
        forward: std of the tensor (``None``: empty tensor).
        backward: std of its gradient (``None``: no gradient reached it).
        abs_max: largest magnitude (``None``: not recorded or empty).

    >>> from unitscale.tracking import ScaleRow
    >>> ScaleRow("x", "", "input", (2,), "float32", 1.0, 0.5).scale
    (-> 1.0, <- 0.5)
    """

    node: str
    module_path: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    forward: float | None = None
    backward: float | None = None
    abs_max: float | None = None

    @property
    def scale(self) -> ScalePair:
        """``ScalePair(forward, backward)``."""
        return ScalePair(self.forward, self.backward)

    @property
    def nonfinite(self) -> str:
        """``"fwd"``, ``"bwd"`` or ``"fwd+bwd"`` where those directions hold a NaN or an infinity, else ``""``.

        >>> from unitscale.tracking import ScaleRow
        >>> ScaleRow("x", "", "input", (2,), "float32", float("nan"), 1.0).nonfinite
        'fwd'
        """
        fwd = _bad(self.forward) or _bad(self.abs_max)
        bwd = _bad(self.backward)
        return "+".join(name for name, bad in (("fwd", fwd), ("bwd", bwd)) if bad)

    @property
    def finite(self) -> bool:
        """Whether every recorded statistic is finite (no NaN or inf reached this tensor)."""
        return not self.nonfinite


def _bad(value: float | None) -> bool:
    return value is not None and not math.isfinite(value)


def read_stats(values: Sequence[Stat | None]) -> list[float | None]:
    """Statistics as Python floats, one transfer (host sync) per device and dtype; floats and ``None`` stay.

    >>> import torch
    >>> read_stats([torch.tensor(2.0), 1.5, None])
    [2.0, 1.5, None]
    """
    out: list[Any] = list(values)
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, value in enumerate(values):
        if isinstance(value, torch.Tensor):
            groups.setdefault((value.device, value.dtype), []).append(i)
    for group in groups.values():
        for i, value in zip(group, torch.stack([out[i] for i in group]).tolist(), strict=True):
            out[i] = value
    return out


def read_rows(entries: Iterable[tuple[ScaleRow, ScaleRecord]]) -> list[ScaleRow]:
    """Each row with its record's numbers, all read to the host in one transfer.

    ``entries``: a recording's, once its backward pass is done and its ``cleanup`` closed.

    >>> import torch
    >>> from unitscale.tracking import ScaleRecord, ScaleRow, read_rows
    >>> row = ScaleRow("x", "", "input", (2,), "float32")
    >>> read_rows([(row, ScaleRecord(forward=torch.tensor(1.0)))])[0].scale
    (-> 1.0, <- n/a)
    """
    entries = list(entries)
    values = read_stats([v for _, r in entries for v in (r.forward, r.backward, r.abs_max)])
    return [
        row._replace(forward=values[i], backward=values[i + 1], abs_max=values[i + 2])
        for (row, _), i in zip(entries, range(0, len(values), 3), strict=True)
    ]


_ASSIGN = re.compile(r"^\s*(\w+) = ")
_CLEANUP = re.compile(r";  (?:\w+ = )+None$")


@functools.lru_cache(maxsize=16)
def _code_lines(code: str) -> tuple[tuple[str, str | None], ...]:
    """The code's non-blank lines without fx's ``x = None`` clean-ups, each with the name it assigns."""
    lines = [_CLEANUP.sub("", line.rstrip()) for line in code.strip("\n").splitlines()]
    return tuple((line, m.group(1) if (m := _ASSIGN.match(line)) else None) for line in lines if line.strip())


def _marked(row: ScaleRow) -> str:
    """A row's scales, with a marker when a NaN or infinity reached it."""
    return f"{row.scale} NON-FINITE" if not row.finite else str(row.scale)


def annotated_code(cap: Capture, rows: list[ScaleRow], model: str, code: str | None = None) -> str:
    """The plain text of ``cap``'s code (eager route: its op listing), each line with ``(-> forward, <- backward)``.

    What :attr:`ScaleReport.code` holds; exported graphs' lines also give their module path.

    Args:
        model: the model's name, for the listing's first line.
        code: the graph's code, where the caller has it; ``None``: ``cap.python_code()``.

    >>> import torch
    >>> from unitscale.capture import DeepTracing, capture
    >>> from unitscale.tracking import track_scales
    >>> from unitscale.tracking.report import annotated_code
    >>> class Double(torch.nn.Module):
    ...     def forward(self, x):
    ...         return x * 2
    >>> x = torch.tensor([1.0, -1.0]).requires_grad_()
    >>> grad = torch.tensor([1.0, -1.0])
    >>> report = track_scales(Double(), x, grad)
    >>> cap = capture(Double(), x, deep=DeepTracing())
    >>> print(annotated_code(cap, list(report.rows), "Double"))
    def forward(self, x):  # x (-> 1.0, <- 2.0)
        mul = x * 2  # (-> 2.0, <- 1.0)
        return mul
    """
    by_name = {r.node: r for r in rows}
    if cap.graph_module is None:
        return _listing(rows, model, cap.reasons.get("fx", ""))
    code = cap.python_code()[0] if code is None else code
    nodes, fx_code = cap.graph_module.graph.nodes, cap.route == "fx"
    # fx's code names each input in its signature; an exported graph's lines say their module path
    inputs = [n.name for n in nodes if n.op == "placeholder" and n.name in by_name] if fx_code else []
    paths = {} if fx_code else {n.name: n.meta.get(MODULE_PATH_KEY, "") for n in nodes}
    lines = [] if fx_code else [f"# {model}: captured by {_CAPTURED_BY.get(cap.route, cap.route)}"]
    for line, name in _code_lines(code):
        if line.startswith("def forward") and inputs:
            line += "  # " + ", ".join(f"{x} {_marked(by_name[x])}" for x in inputs)
        elif name in by_name:
            line += f"  # {_marked(by_name[name])}" + (f"  {paths[name]}" if paths.get(name) else "")
        lines.append(line)
    return "\n".join(lines)


_CAPTURED_BY = {"export": "torch.export", "export-strict": "torch.export (strict)", "dynamo": "TorchDynamo"}


def _listing(rows: list[ScaleRow], model: str, failure: str) -> str:
    width = max([len(r.node) for r in rows] + [4])
    why = f"; {failure.removeprefix('TraceError: ')}" if failure else ""
    # the reason can be a long sentence: wrapped as comment lines, so the listing fits a page
    header = textwrap.wrap(f"{model}: ops recorded as they ran{why}", 86, break_on_hyphens=False)
    lines = [f"# {part}" for part in header]
    for r in rows:
        where = f" in {r.module_path}" if r.module_path else ""
        lines.append(f"{r.node.ljust(width)}  # {_marked(r)}  {r.op}{where}")
    return "\n".join(lines)


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _number_cells(r: ScaleRow, note: str) -> list[str]:
    """A row's stds and abs-max, then its ``finite`` cell where a ``note`` says some row is not finite."""
    finite = ["yes" if r.finite else f"NO ({r.nonfinite})"] if note else []
    return [_num(r.forward), _num(r.backward), _num(r.abs_max), *finite]


# The characters a line of ScaleReport.table() may take by default: the site's code blocks
# show 88 (the tutorials' code is formatted to that width too).
TABLE_WIDTH = 88
# A shortened column keeps at least this many characters.
_MIN_CELL = 10


def _aligned(lines: Sequence[tuple[str, ...]], width: float = math.inf, shrinkable: tuple[int, ...] = ()) -> str:
    """``lines`` as columns two spaces apart, cut by ``_fit`` to fit ``width``."""
    widths = _fit(lines, width, shrinkable)
    return "\n".join(
        "  ".join(_cut(c, w).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )


def _fit(lines: Sequence[tuple[str, ...]], width: float, shrinkable: tuple[int, ...]) -> list[int]:
    """Column widths whose line fits ``width``: a rare long name is cut before a column of them."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    lengths = {i: [len(line[i]) for line in lines] for i in shrinkable}
    while sum(widths) + 2 * (len(widths) - 1) > width:
        open_ = [i for i in shrinkable if widths[i] > _MIN_CELL]
        if not open_:
            break
        cheapest = min(open_, key=lambda i: (lengths[i].count(widths[i]), -widths[i]))
        widths[cheapest] -= 1
    return widths


def _cut(cell: str, width: int) -> str:
    """``cell`` shortened from the left to ``width`` characters, ``…`` marking the cut."""
    return cell if len(cell) <= width else "…" + cell[len(cell) - width + 1 :]


@dataclass(eq=False, repr=False)
class ScaleReport:
    """Scales of every floating-point tensor of one forward and backward pass.

    Iterate it for :class:`ScaleRow` s, index it by position or node name, print
    :meth:`table`, draw :meth:`plot`.

    Args:
        rows: the rows, in execution order.
        code: annotated code or op listing (what :func:`unitscale.analyse_module` returns).
        route: the capture route (:func:`unitscale.capture.capture`): ``"fx"``, ``"eager"``
            (ops recorded as they ran) or ``"export"``.
        trace_failure: why fx tracing failed (eager capture only).
        no_backward: why no backward pass was recorded (``""``: one was), e.g. a call under
            ``torch.inference_mode()``.

    >>> from unitscale.tracking import ScaleReport, ScaleRow
    >>> row = ScaleRow("x", "", "input", (2,), "float32", 1.0, 0.5, 2.0)
    >>> report = ScaleReport([row], "Net")
    >>> report["x"].scale
    (-> 1.0, <- 0.5)
    """

    rows: list[ScaleRow]
    model: str
    code: str = ""
    route: str = "fx"
    trace_failure: str = ""
    no_backward: str = ""

    def __post_init__(self) -> None:
        self.rows = list(self.rows)

    @property
    def backward_recorded(self) -> bool:
        """Whether a backward pass was recorded (``False``: every ``bwd std`` is ``n/a``; ``no_backward`` says why).

        The table then ends with a line saying so.

        >>> from unitscale import ScaleReport
        >>> why = "called under torch.inference_mode()"
        >>> ScaleReport([], "Net", no_backward=why).backward_recorded
        False
        """
        return not self.no_backward

    def __iter__(self) -> Iterator[ScaleRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: int | str) -> ScaleRow:
        if isinstance(key, str):
            for row in self.rows:
                if row.node == key:
                    return row
            names = ", ".join(r.node for r in self.rows[:8]) + (", ..." if len(self.rows) > 8 else "")
            raise NodeNotFoundError(f"no tensor named {key!r} in this report; its names are {names}")
        return self.rows[key]

    def __repr__(self) -> str:
        bad = self.first_nonfinite
        marker = "" if bad is None else f", NON-FINITE from {bad.node!r}"
        marker += "" if self.backward_recorded else ", no backward pass"
        return f"<ScaleReport of {self.model}: {len(self.rows)} tensors, {self.route} capture{marker}>"

    @property
    def first_nonfinite(self) -> ScaleRow | None:
        """The row where a NaN or infinity first appears, or ``None`` if every value is finite.

        Forward values come first, in execution order; a gradient goes bad in backward
        order, so with finite forward values it is the last row in execution order whose
        gradient is non-finite.

        >>> from unitscale.tracking import ScaleReport, ScaleRow
        >>> rows = [ScaleRow("x", "", "input", (2,), "float32", 1.0, float("nan")),
        ...         ScaleRow("y", "", "exp", (2,), "float32", float("inf"), float("nan"))]
        >>> ScaleReport(rows, "Net").first_nonfinite.node
        'y'
        """
        forward = next((r for r in self.rows if "fwd" in r.nonfinite), None)
        return forward or next((r for r in reversed(self.rows) if "bwd" in r.nonfinite), None)

    def _nonfinite_note(self) -> str:
        row = self.first_nonfinite
        if row is None:
            return ""
        count = sum(not r.finite for r in self.rows)
        direction = "forward value" if "fwd" in row.nonfinite else "gradient"
        return (
            f"NON-FINITE: NaN/inf first in the {direction} of node '{row.node}' ({row.op}); {count} tensor(s) affected"
        )

    @property
    def scales(self) -> dict[str, ScalePair]:
        """``node -> ScalePair`` for every row."""
        return {row.node: row.scale for row in self.rows}

    def table(self, full: bool = False, width: int = TABLE_WIDTH) -> str:
        """A fixed-width text table, one line per tensor (3 significant digits).

        By default the ``dtype`` column is left out when every tensor has the same dtype, and the
        longest node names, module paths and ops are shortened from the left (``…`` marks the cut)
        to fit ``width``; a shortened column keeps 10 characters, so a narrow ``width`` can be
        exceeded. When a NaN or infinity reached some tensor, a ``finite`` column marks each row
        and a last line names the node where it first appeared.

        Args:
            full: every column (``dtype`` included), nothing shortened.
            width: the most characters a line may take when ``full`` is false (at least 40).

        Raises:
            InputError: ``width`` is not an int of at least 40.

        >>> from unitscale.tracking import ScaleReport, ScaleRow
        >>> row = ScaleRow("x", "", "input", (2,), "float32", float("nan"), 1.0)
        >>> print(ScaleReport([row], "Net").table())  # doctest: +ELLIPSIS
        node  module  op     shape  fwd std  bwd std  abs max  finite
        x             input  (2,)   nan      1        n/a      NO (fwd)
        NON-FINITE: NaN/inf first in the forward value of node 'x' (input); 1 tensor...
        """
        if isinstance(width, bool) or not isinstance(width, int) or width < 40:
            raise InputError(f"ScaleReport.table(width={width!r}): pass an int of at least 40 (characters per line)")
        show_dtype = full or len({r.dtype for r in self.rows}) > 1
        note = self._nonfinite_note()
        header: tuple[str, ...] = ("node", "module", "op", "shape", "dtype", "fwd std", "bwd std", "abs max")
        if note:
            header += ("finite",)
        body = [(r.node, r.module_path, r.op, str(r.shape), r.dtype, *_number_cells(r, note)) for r in self.rows]
        if not show_dtype:
            header, body = header[:4] + header[5:], [line[:4] + line[5:] for line in body]
        lines = [_aligned([header, *body], width if not full else math.inf, shrinkable=(0, 1, 2))]
        if note:
            lines.append(note)
        if self.no_backward:
            lines.append(f"no backward pass recorded: {self.no_backward}")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        """The report as an HTML table a phone's column holds: each node with its op, module, shape and stds."""
        note = self._nonfinite_note()
        header = ["node", "op · module · shape · dtype", "fwd std", "bwd std", "abs max", *(["finite"] if note else [])]
        lines = [
            [
                r.node,
                " · ".join(part for part in (r.op, r.module_path, str(r.shape), r.dtype) if part),
                *_number_cells(r, note),
            ]
            for r in self.rows
        ]
        caption = f"{self.model}: {len(self.rows)} tensors, {self.route} capture" + (f". {note}" * bool(note))
        if self.no_backward:
            caption += f"; no backward pass recorded: {self.no_backward}"
        return html_table(header, lines, caption)

    def plot(self, ax: Axes | None = None, formats: tuple[str, ...] = tuple(FORMAT_RANGES)) -> Figure:
        """Plot ``log2`` of each tensor's forward and backward std, over format ranges; return the figure.

        Outside each format's range (:data:`FORMAT_RANGES`) the band is shaded: a point there would
        underflow or overflow in that format. Parameters are hollow markers. The first NaN or
        infinity is named in the title and marked by a red dotted line.

        Args:
            ax: axes to draw on (default: a new figure).
            formats: names from :data:`FORMAT_RANGES` to draw.

        Raises:
            FormatError: ``formats`` names a format not in :data:`FORMAT_RANGES`.

        >>> from unitscale.tracking import ScaleReport, ScaleRow
        >>> row = ScaleRow("x", "", "input", (2,), "float32", 1.0, 2.0**-20)
        >>> fig = ScaleReport([row], "Net").plot()
        >>> [t.get_text() for t in fig.axes[0].get_legend().get_texts()][:2]
        ['forward', 'backward']
        """
        if isinstance(formats, str) or not isinstance(formats, (tuple, list)):
            raise FormatError(
                f"ScaleReport.plot(formats=...) got {type(formats).__name__} {formats!r:.60}; "
                f"pass a tuple of names from {tuple(FORMAT_RANGES)}"
            )
        unknown = [f for f in formats if f not in FORMAT_RANGES]
        if unknown:
            raise FormatError(
                f"ScaleReport.plot(formats=...) got unknown format(s) {', '.join(map(repr, unknown))}; "
                f"use names from {tuple(FORMAT_RANGES)}"
            )
        # pyplot only when drawn: it alone costs more import time than unitscale (python -X importtime)
        import matplotlib.pyplot as plt
        from matplotlib.axes import Axes as MplAxes

        if ax is not None and not isinstance(ax, MplAxes):
            raise InputError(
                f"ScaleReport.plot(ax=...) got {type(ax).__name__} {ax!r:.60}; pass matplotlib Axes or None"
            )
        if ax is None:
            fig, ax = plt.subplots(figsize=(7.5, 5))
        else:
            fig = ax.get_figure(root=True)  # type: ignore[assignment]
        x = list(range(len(self.rows)))

        def log2(values: list[float | None]) -> list[float]:
            return [math.log2(v) if v is not None and v > 0 and math.isfinite(v) else math.nan for v in values]

        fwd = log2([r.forward for r in self.rows])
        bwd = log2([r.backward for r in self.rows])
        is_param = [r.op in ("parameter", "buffer") for r in self.rows]
        for values, colour, marker, label in ((fwd, "C0", "o", "forward"), (bwd, "C3", "s", "backward")):
            path = [(i, v) for i, v, p in zip(x, values, is_param, strict=True) if not p]
            params = [(i, v) for i, v, p in zip(x, values, is_param, strict=True) if p]
            ax.plot([i for i, _ in path], [v for _, v in path], marker=marker, ms=3, lw=1, color=colour, label=label)
            if params:
                ax.plot(*zip(*params, strict=True), ls="none", marker=marker, ms=4, mfc="none", color=colour, alpha=0.6)
        seen = [v for v in fwd + bwd if not math.isnan(v)] or [0.0]
        lo, hi = min(min(seen), -25.0) - 1, max(max(seen), 17.0) + 1  # FP8 and FP16 in view
        colours = {"BF16": "0.5", "FP16": "C2", "FP8 E5M2": "C1", "FP8 E4M3": "C4"}
        for name in formats:
            colour = colours.get(name, "0.5")
            low, high = (math.log2(v) for v in FORMAT_RANGES[name])
            ax.axhspan(-1e4, low, color=colour, alpha=0.08, lw=0)
            ax.axhspan(high, 1e4, color=colour, alpha=0.08, lw=0)
            for edge in (low, high):
                if lo <= edge <= hi:
                    ax.axhline(edge, color=colour, lw=1, ls="--")
            ax.plot([], [], color=colour, lw=1, ls="--", label=f"{name} range $[2^{{{low:.0f}}}, 2^{{{high:.1f}}}]$")
        ax.set_ylim(lo, hi)
        ax.set_xlim(-0.5, max(len(x), 1) - 0.5)
        # At most 24 node names, each cut to its last 16 characters (the layer and op, where
        # transformers' names differ): the plot keeps most of the figure's height.
        ticks = x if len(x) <= 24 else x[:: math.ceil(len(x) / 24)]
        ax.set_xticks(ticks, [_cut(self.rows[i].node, 16) for i in ticks], rotation=90, fontsize=9)
        ax.set_ylabel("log2(std)")
        title = f"Scales through {self.model} (forward and backward)"
        bad = self.first_nonfinite
        if bad is not None:
            # NaN and inf have no place on a log axis: mark where they start instead.
            at = self.rows.index(bad)
            ax.axvline(at, color="red", lw=1.5, ls=":")
            ax.annotate(
                f"first NaN/inf: {bad.node}",
                (at, hi),
                xytext=(3, -12),
                textcoords="offset points",
                color="red",
                fontsize=9,
            )
            title += f"\nNON-FINITE from node '{bad.node}' ({'forward' if 'fwd' in bad.nonfinite else 'backward'})"
        # The legend sits above the axes, never over the points; the title above the legend.
        handles = ax.get_legend_handles_labels()[0]
        rows = math.ceil(len(handles) / 3)
        ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01, 1, 0), mode="expand", ncol=3, fontsize=9, frameon=False)
        ax.set_title(title, pad=8 + 16 * rows)
        if fig.get_layout_engine() is None:  # the caller's own layout, if any, stays
            fig.tight_layout()
        return fig
