"""What a :class:`~unitscale.tracking.ScaleMonitor` recorded: tidy records, a table, a heat map, a drift table.

Plain Python values: a history pickles, outlives the model, and ``pandas.DataFrame(list(history))``
gives a data frame with the records' fields as columns.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from unitscale.capture.toolkit import html_table
from unitscale.errors import InputError, NoRecordsError, UnknownStatError
from unitscale.formats import BF16, FP8_E4M3, FP8_E5M2, FP16, FPFormat
from unitscale.tracking.report import _aligned

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["Drift", "DriftTable", "MonitorRecord", "ScaleHistory", "STATS"]

STATS = ("std", "absmax", "underflow", "overflow", "sqnr_db")
"""The statistics a :class:`MonitorRecord` holds, by name."""

_LOG2_STATS = ("std", "absmax")
_LABELS = {
    "std": "log2(std)",
    "absmax": "log2(abs-max)",
    "underflow": "underflow fraction",
    "overflow": "overflow fraction",
    "sqnr_db": "SQNR (dB)",
}


class MonitorRecord(NamedTuple):
    """One tensor at one recorded step, in one direction.

    Attributes:
        tensor: a module's qualified name for its output (``blocks.0.mlp.fc1``; ``(root)``
            for the model's own output; ``name[i]`` or ``name.key`` where a module returns
            several tensors; ``name#2`` for a module's second call in a step), or a
            parameter's name (``blocks.0.mlp.fc1.weight``).
        kind: ``"activation"`` (a module's output) or ``"parameter"``.
        direction: ``"fwd"`` (the value; measured against the forward format) or
            ``"bwd"`` (its gradient; against the backward format).
        std, absmax, underflow, overflow, sqnr_db: see
            :class:`~unitscale.tracking.format_casts.CastStats`.

    >>> from unitscale.tracking import MonitorRecord
    >>> MonitorRecord(0, "fc", "activation", "fwd", 1.0, 3.5, 0.0, 0.0, 31.2).std
    1.0
    """

    step: int
    tensor: str
    kind: str
    direction: str
    std: float
    absmax: float
    underflow: float
    overflow: float
    sqnr_db: float


class Drift(NamedTuple):
    """How far one tensor's statistic moved between its first and last record.

    ``octaves`` is ``log2(last / first)``: +1 means the statistic doubled.

    >>> from unitscale.tracking import Drift
    >>> Drift("fc", "activation", "fwd", 0, 100, 0.5, 2.0, 2.0).octaves
    2.0
    """

    tensor: str
    kind: str
    direction: str
    first_step: int
    last_step: int
    first: float
    last: float
    octaves: float


class DriftTable:
    """The tensors that drifted most, largest ``|octaves|`` first; prints as a table.

    Iterate it (or index it) for :class:`Drift` rows.

    >>> from unitscale.tracking import Drift, DriftTable
    >>> drift = Drift("fc.weight", "parameter", "fwd", 0, 90, 0.1, 25.6, 8.0)
    >>> print(DriftTable([drift], "std"))
    tensor     kind       dir  steps  first std  last std  octaves
    fc.weight  parameter  fwd  0-90   0.1        25.6      +8.00
    """

    def __init__(self, rows: Iterable[Drift], stat: str) -> None:
        self.rows = list(rows)
        self.stat = stat

    def __iter__(self) -> Iterator[Drift]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> Drift:
        return self.rows[i]

    def table(self) -> str:
        """The rows as a fixed-width text table (3 significant digits)."""
        header = ("tensor", "kind", "dir", "steps", f"first {self.stat}", f"last {self.stat}", "octaves")
        body = [(d.tensor, d.kind, d.direction, f"{d.first_step}-{d.last_step}", *_moved(d)) for d in self.rows]
        return _aligned([header, *body])

    __repr__ = table

    def _repr_html_(self) -> str:
        """The rows as an HTML table: each tensor with its kind, direction and steps under it, then the numbers."""
        header = ("tensor", "kind · dir · steps", f"first {self.stat}", f"last {self.stat}", "octaves")
        body = [(d.tensor, f"{d.kind} · {d.direction} · {d.first_step}–{d.last_step}", *_moved(d)) for d in self.rows]
        return html_table(header, body, f"the {len(self.rows)} tensors whose {self.stat} moved most, in octaves")


def _moved(d: Drift) -> tuple[str, str, str]:
    return f"{d.first:.3g}", f"{d.last:.3g}", f"{d.octaves:+.2f}"


def _numbers(r: MonitorRecord) -> list[str]:
    return [f"{getattr(r, stat):.3g}" for stat in STATS]


def _format_name(fmt: FPFormat) -> str:
    names = {FP8_E4M3: "FP8 E4M3", FP8_E5M2: "FP8 E5M2", FP16: "FP16", BF16: "BF16"}
    return names.get(fmt, repr(fmt))


def _check_stat(caller: str, stat: object, allowed: tuple[str, ...] = STATS) -> str:
    if not isinstance(stat, str) or stat not in allowed:
        raise UnknownStatError(f"{caller}: stat={stat!r:.60} is not known; use one of {', '.join(allowed)}")
    return stat


def _check_choice(caller: str, name: str, value: object, allowed: tuple[str | None, ...]) -> None:
    if value not in allowed:
        raise InputError(f"{caller}: {name}={value!r:.60} is not known; pass one of {allowed}")


_KINDS = ("activation", "parameter", None)
_DIRECTIONS = ("fwd", "bwd", None)


class ScaleHistory:
    """Every :class:`MonitorRecord` of a monitor, with views: ``table()``, ``heatmap()``, ``drifted()``.

    Args:
        records: the records, in the order they were taken.
        fwd_format, bwd_format: the formats forward values and gradients were measured against.

    >>> from unitscale.tracking import MonitorRecord, ScaleHistory
    >>> history = ScaleHistory([
    ...     MonitorRecord(0, "fc", "activation", "fwd", 1.0, 3.5, 0.0, 0.0, 31.2),
    ...     MonitorRecord(10, "fc", "activation", "fwd", 4.0, 14.0, 0.0, 0.0, 31.0),
    ... ])
    >>> history.steps, history.drifted()[0].octaves
    ([0, 10], 2.0)
    """

    def __init__(
        self, records: Iterable[MonitorRecord] = (), fwd_format: FPFormat = FP8_E4M3, bwd_format: FPFormat = FP8_E5M2
    ) -> None:
        self.records: list[MonitorRecord] = list(records)
        self.fwd_format, self.bwd_format = fwd_format, bwd_format

    def __iter__(self) -> Iterator[MonitorRecord]:
        return iter(self.records)

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> MonitorRecord:
        return self.records[i]

    def __repr__(self) -> str:
        return f"<ScaleHistory: {len(self.records)} records, {len(self.tensors())} tensors, steps {self.steps}>"

    @property
    def steps(self) -> list[int]:
        """The recorded steps, in increasing order."""
        return sorted({r.step for r in self.records})

    def tensors(self, kind: str | None = None) -> list[str]:
        """Tensor names, activations first (in the order the forward pass met them), then parameters."""
        _check_choice("tensors", "kind", kind, _KINDS)
        seen: dict[str, str] = {}
        for r in self.records:
            seen.setdefault(r.tensor, r.kind)
        names = [n for n, k in seen.items() if kind is None or k == kind]
        return sorted(names, key=lambda n: seen[n] != "activation")

    def select(
        self, step: int | None = None, kind: str | None = None, direction: str | None = None, *, caller: str = "select"
    ) -> list[MonitorRecord]:
        """The records of one step, kind or direction (``None``: all).

        Raises:
            InputError: a step not recorded, or an unknown kind or direction (named with ``caller``).
        """
        _check_choice(caller, "kind", kind, _KINDS)
        _check_choice(caller, "direction", direction, _DIRECTIONS)
        if step is not None and step not in self.steps:
            raise InputError(
                f"{caller}: step={step!r:.60} was not recorded; pass one of the recorded steps {self.steps}"
            )
        wanted = (("step", step), ("kind", kind), ("direction", direction))
        return [r for r in self.records if all(v is None or getattr(r, k) == v for k, v in wanted)]

    def where(self, step: int | None = None, kind: str | None = None, direction: str | None = None) -> ScaleHistory:
        """The records of one step, kind or direction (``None``: all), as a history; a notebook shows its table.

        >>> from unitscale.tracking import MonitorRecord, ScaleHistory
        >>> history = ScaleHistory([
        ...     MonitorRecord(0, "fc", "activation", "fwd", 1.0, 3.5, 0.0, 0.0, 31.2),
        ...     MonitorRecord(0, "fc", "activation", "bwd", 0.5, 2.0, 0.0, 0.0, 30.1),
        ... ])
        >>> len(history.where(direction="bwd"))
        1
        """
        return ScaleHistory(self.select(step, kind, direction, caller="where"), self.fwd_format, self.bwd_format)

    def _repr_html_(self) -> str:
        """The records as an HTML table (the first 200): each tensor with its kind, direction and step under it."""
        shown = self.records[:200]
        header = ("tensor", "kind · dir · step", "std", "absmax", "underflow", "overflow", "sqnr dB")
        body = [(r.tensor, f"{r.kind} · {r.direction} · {r.step}", *_numbers(r)) for r in shown]
        formats = f"forward against {_format_name(self.fwd_format)}, gradients against {_format_name(self.bwd_format)}"
        more = f"; the first {len(shown)} of {len(self.records)}: where() selects" if len(shown) < len(self) else ""
        return html_table(header, body, f"{len(self.records)} records{more}; {formats}")

    def table(self, step: int | None = None, kind: str | None = None, direction: str | None = None) -> str:
        """A fixed-width text table of the records (all, or one step, kind or direction), 3 significant digits.

        >>> from unitscale.tracking import MonitorRecord, ScaleHistory
        >>> record = MonitorRecord(0, "fc", "activation", "fwd", 1.0, 3.5, 0.0, 0.0, 31.2)
        >>> print(ScaleHistory([record]).table())
        step  tensor  kind        dir  std  absmax  underflow  overflow  sqnr dB
        0     fc      activation  fwd  1    3.5     0          0         31.2
        """
        header = ("step", "tensor", "kind", "dir", "std", "absmax", "underflow", "overflow", "sqnr dB")
        records = self.select(step, kind, direction, caller="table")
        body = [(str(r.step), r.tensor, r.kind, r.direction, *_numbers(r)) for r in records]
        return _aligned([header, *body])

    def drifted(
        self, top: int = 10, stat: str = "std", kind: str | None = None, direction: str | None = None
    ) -> DriftTable:
        """The ``top`` tensors whose ``stat`` moved most, in octaves, from their first record to their last.

        A tensor and direction whose statistic is zero or not finite at its first or last
        record (a zero-initialised bias, a layer norm's all-ones weight: std 0) has no
        drift in octaves and is left out; rank by ``stat="absmax"`` to see those.

        Args:
            stat: ``"std"`` or ``"absmax"``.
            kind, direction: as in ``heatmap()``.

        Raises:
            UnknownStatError: ``stat`` is not ``"std"`` or ``"absmax"``.
            NoRecordsError: nothing has been recorded.
            InputError: ``top`` is not an int >= 1, or ``kind``/``direction`` unknown.
        """
        _check_stat("drifted", stat, _LOG2_STATS)
        records = self.select(None, kind, direction, caller="drifted")
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise InputError(f"drifted: top={top!r:.60} must be an int >= 1")
        if not self.records:
            raise NoRecordsError("drifted: nothing recorded yet; run a step that records (step % every == 0) first")
        last = {(r.tensor, r.direction): r for r in records}
        first = {(r.tensor, r.direction): r for r in reversed(records)}
        rows = []
        for key, b in last.items():
            a = first[key]
            va, vb = getattr(a, stat), getattr(b, stat)
            if b.step == a.step or not (0 < va < math.inf and 0 < vb < math.inf):
                continue
            # the difference of logs, not the log of the ratio: vb / va leaves float range for stds
            # far apart (1e10 against 1e-300), the logs never do
            octaves = math.log2(vb) - math.log2(va)
            rows.append(Drift(a.tensor, a.kind, a.direction, a.step, b.step, va, vb, octaves))
        rows.sort(key=lambda d: -abs(d.octaves))
        return DriftTable(rows[:top], stat)

    def heatmap(
        self, stat: str = "std", kind: str | None = None, direction: str | None = None, relative: bool = False
    ) -> Figure:
        """A heat map of one statistic (a figure 7.5 in wide): a row per tensor, a column per recorded step.

        ``std`` and ``absmax`` are coloured by ``log2``. Each direction is a panel with its own
        colour scale; cells with no value (no gradient, a std of 0) are grey.

        Args:
            kind: ``"activation"``, ``"parameter"`` or ``None`` (both: activations first).
            direction: ``"fwd"``, ``"bwd"`` or ``None`` (both panels).
            relative: colour each row by its change since its first record (in octaves for
                ``std`` and ``absmax``), on a diverging scale centred at 0.

        Raises:
            UnknownStatError: ``stat`` is not in ``STATS``.
            NoRecordsError: nothing has been recorded (for this kind and direction).
            InputError: ``kind`` or ``direction`` unknown.

        >>> from unitscale.tracking import MonitorRecord, ScaleHistory
        >>> fc = [MonitorRecord(s, "fc", "activation", "fwd", 2.0**s, 1, 0, 0, 30)
        ...       for s in (0, 1)]
        >>> ScaleHistory(fc).heatmap().axes[0].get_title()
        'forward (FP8 E4M3)'
        """
        _check_stat("heatmap", stat)
        records = self.select(None, kind, direction, caller="heatmap")
        # pyplot only when drawn: it alone costs more import time than unitscale (python -X importtime)
        import matplotlib.pyplot as plt

        if not records:
            raise NoRecordsError(
                f"heatmap: nothing recorded (kind={kind!r}, direction={direction!r}); "
                "run a step that records (step % every == 0) first"
            )
        directions = [d for d in ("fwd", "bwd") if any(r.direction == d for r in records)]
        names = [n for n in self.tensors(kind) if any(r.tensor == n for r in records)]
        steps = sorted({r.step for r in records})
        row_of = {n: i for i, n in enumerate(names)}
        col_of = {s: j for j, s in enumerate(steps)}
        height = min(max(2.4, 0.16 * len(names) + 1.3), 20.0)
        fig, axes = plt.subplots(
            1, len(directions), figsize=(7.5, height), sharey=True, squeeze=False, layout="constrained"
        )
        for ax, d in zip(axes[0], directions, strict=True):
            grid = np.full((len(names), len(steps)), np.nan)
            for r in records:
                if r.direction == d:
                    v = getattr(r, stat)
                    if stat in _LOG2_STATS:
                        v = math.log2(v) if 0 < v < math.inf else math.nan
                    grid[row_of[r.tensor], col_of[r.step]] = v
            grid[~np.isfinite(grid)] = np.nan
            label = _LABELS[stat]
            if relative:
                first = np.array([row[np.isfinite(row)][0] if np.isfinite(row).any() else np.nan for row in grid])
                grid = grid - first[:, None]
                limit = max(float(np.nanmax(np.abs(grid))) if np.isfinite(grid).any() else 1.0, 1e-9)
                cmap, vmin, vmax = plt.get_cmap("RdBu_r").with_extremes(bad="0.85"), -limit, limit
                label = f"change in {label}" + (" (octaves)" if stat in _LOG2_STATS else "")
            else:  # a colour map per panel: no one reads a forward colour against the backward scale
                name = "viridis" if d == "fwd" else "magma"
                cmap, vmin, vmax = plt.get_cmap(name).with_extremes(bad="0.85"), None, None
            image = ax.imshow(
                np.ma.masked_invalid(grid), aspect="auto", interpolation="nearest", cmap=cmap, vmin=vmin, vmax=vmax
            )
            fmt = self.fwd_format if d == "fwd" else self.bwd_format
            ax.set_title(f"{'forward' if d == 'fwd' else 'backward'} ({_format_name(fmt)})", fontsize=9)
            ticks = list(range(len(steps)))[:: max(1, math.ceil(len(steps) / 6))]
            ax.set_xticks(ticks, [str(steps[j]) for j in ticks], fontsize=9)
            ax.set_xlabel("step", fontsize=9)
            colorbar = fig.colorbar(image, ax=ax, shrink=min(1.0, 3.0 / height + 0.3))
            colorbar.set_label(label, fontsize=9)
            colorbar.ax.tick_params(labelsize=9)
        rows = list(range(len(names)))[:: max(1, math.ceil(len(names) / 110))]
        axes[0][0].set_yticks(rows, [names[i] for i in rows], fontsize=9)
        return fig
