"""Checks that a parametrisation transfers across width: a coordinate check and a learning-rate sweep.

Both train with ``model.loss(inputs, targets)`` when the model has one, else cross-entropy of
``model(inputs)`` against ``targets``. Tutorial 10 (u-μP) shows both at work.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from unitscale.errors import InputError, NotCallableError, SweepGridError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["coord_check", "CoordCheck", "lr_sweep", "LRSweep"]

Data: TypeAlias = Callable[[int], tuple[Tensor, Tensor]] | tuple[Tensor, Tensor]
"""``step -> (inputs, targets)`` (the same batch for the same step, for every model), or one fixed batch."""

OptimizerFactory: TypeAlias = Callable[..., torch.optim.Optimizer]
"""Called as ``optimizer(model.parameters(), lr=lr)``: ``torch.optim.Adam``, ``unitscale.optim.Adam``, ..."""


def _batch(data: Data, step: int) -> tuple[Tensor, Tensor]:
    return data if isinstance(data, tuple) else data(step)


def _loss(model: nn.Module, inputs: Tensor, targets: Tensor) -> Tensor:
    if callable(getattr(model, "loss", None)):
        return model.loss(inputs, targets)  # type: ignore[operator]
    out = model(inputs)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))


def _default_optimizer() -> OptimizerFactory:
    from unitscale.optim import Adam  # optim imports unitscale.scaling: at the top, a cycle

    return Adam


def _check_common(owner: str, make_model: Any, widths: Any, steps: Any, optimizer: Any, data: Any) -> list[int]:
    if not callable(make_model):
        raise NotCallableError(f"{owner}: make_model is a {type(make_model).__name__}; pass width -> nn.Module")
    if optimizer is not None and not callable(optimizer):
        raise NotCallableError(f"{owner}: optimizer is a {type(optimizer).__name__}; pass e.g. torch.optim.Adam")
    if not (callable(data) or (isinstance(data, tuple) and len(data) == 2)):
        raise InputError(f"{owner}: data is a {type(data).__name__}; pass step -> (inputs, targets) or one such pair")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise InputError(f"{owner}: steps={steps!r:.60} must be an int >= 0")
    widths = list(widths)
    if not widths or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in widths):
        raise SweepGridError(f"{owner}: widths={widths!r:.80} must be one or more ints >= 1")
    if len(set(widths)) != len(widths):
        raise SweepGridError(f"{owner}: widths={widths!r:.80} repeats a width; pass each once")
    return sorted(widths)


@dataclass
class CoordCheck:
    """The result of :func:`coord_check`: activation std by kind and width.

    Attributes:
        widths: the widths, ascending.
        steps: the number of updates between the two measurements.
        init: ``{kind: [std at each width]}`` at initialisation.
        trained: the same after ``steps`` updates.
        change: the std of (after - before) for the same input, per kind and width.
    """

    widths: list[int]
    steps: int
    init: dict[str, list[float]] = field(default_factory=dict)
    trained: dict[str, list[float]] = field(default_factory=dict)
    change: dict[str, list[float]] = field(default_factory=dict)

    def extremes(self, exclude: Sequence[str] = ()) -> tuple[float, float]:
        """The smallest and largest std at init and after training over every width and kind not in ``exclude``.

        >>> from unitscale.scaling import CoordCheck
        >>> check = CoordCheck([8], 1, {"a": [0.5], "b": [3.0]}, {"a": [1.0], "b": [1.0]})
        >>> check.extremes(exclude=["b"])
        (0.5, 1.0)
        """
        values = [
            v for table in (self.init, self.trained) for kind, row in table.items() if kind not in exclude for v in row
        ]
        return (min(values), max(values)) if values else (math.nan, math.nan)

    def table(self) -> str:
        """A text table: one row per kind, the std at init -> after training for each width."""
        head = f"{'activation':<28}" + "".join(f"{'w=' + str(w):>16}" for w in self.widths)
        rows = [head]
        for kind in self.init:
            cells = "".join(f"{a:>7.3g} -> {b:<6.3g}" for a, b in zip(self.init[kind], self.trained[kind], strict=True))
            rows.append(f"{kind:<28.28}" + cells)
        return "\n".join(rows)

    def plot(self) -> Figure:
        """Std against width (log-log), one line per activation kind: at init (left) and after training (right)."""
        import matplotlib.pyplot as plt  # lazy: pyplot adds about 1.9 s to `import unitscale`; only plots need it

        fig, axes = plt.subplots(1, 2, figsize=(7.5, 3.6), sharey=True, layout="constrained")
        for ax, table, title in ((axes[0], self.init, "at init"), (axes[1], self.trained, f"after {self.steps} steps")):
            for i, (kind, row) in enumerate(table.items()):
                # matplotlib cycles ten colours: a new line style for each further ten kinds
                ax.plot(self.widths, row, ["-", "--", ":", "-."][i // 10 % 4], marker="o", ms=3, lw=1, label=kind)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log", base=2)
            ax.set_xlabel("width", fontsize=10)
            ax.set_title(title, fontsize=10)
            ax.tick_params(labelsize=9)
            ax.axhspan(0.5, 2.0, color="0.9", zorder=0)
        axes[0].set_ylabel("activation std", fontsize=10)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right upper", fontsize=9, frameon=False)
        return fig


def _record(model: nn.Module, inputs: Tensor, keep: Callable[[str, nn.Module], bool]) -> dict[str, list[Tensor]]:
    outputs: dict[str, list[Tensor]] = {}
    handles = []
    for path, module in model.named_modules():
        if path and keep(path, module):
            # Layers of a stack are one kind: "blocks.3.attn" and "blocks.0.attn" are both "blocks.*.attn".
            kind = re.sub(r"(^|\.)\d+(?=\.|$)", r"\1*", path)

            def hook(_m: nn.Module, _a: Any, out: Any, kind: str = kind) -> None:
                if isinstance(out, Tensor) and out.is_floating_point():
                    outputs.setdefault(kind, []).append(out.detach().float().clone())

            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            model(inputs)
    finally:
        for handle in handles:
            handle.remove()
    return outputs


def _rms_of_stds(tensors: list[Tensor]) -> float:
    return float(torch.tensor([t.std(correction=0).item() ** 2 for t in tensors]).mean().sqrt())


def coord_check(
    make_model: Callable[[int], nn.Module],
    widths: Sequence[int],
    data: Data,
    steps: int = 5,
    optimizer: OptimizerFactory | None = None,
    lr: float = 2**-4,
    seed: int = 0,
    modules: Callable[[str, nn.Module], bool] | None = None,
) -> CoordCheck:
    """Std of every module's output at each width, at initialisation and after ``steps`` updates.

    Each model is built after ``torch.manual_seed(seed)``, measured on batch 0 and trained on
    batches ``0..steps-1``; where the loss leaves float range training stops and the stds after
    are NaN. The layers of a stack are one kind (``blocks.*.attn``), their stds averaged (RMS).
    Under u-μP the readout's logits are the one exception to width-independence, by design: they
    start near ``fan_in**-0.5`` (μP's ``1/fan_in`` multiplier) and training grows them.

    Args:
        widths: distinct ints >= 1.
        data: ``step -> (inputs, targets)``, or one fixed batch.
        optimizer: called as ``optimizer(model.parameters(), lr=lr)``; ``None``: :class:`unitscale.optim.Adam`.
        seed: the seed before each model is built.
        modules: ``(path, module) -> bool`` choosing the modules to record; ``None``: all.

    Raises:
        NotCallableError: ``make_model`` or ``optimizer`` is not callable.
        SweepGridError: ``widths`` is empty, repeats a width, or holds a non-int or one below 1.
        InputError: ``steps`` is negative or ``data`` is neither a function nor a pair.

    >>> from unitscale.examples import MarkovSource, UmupGPT, markov_batches
    >>> from unitscale.scaling import coord_check
    >>> data = markov_batches(MarkovSource(8), batch=4, seq_len=8)
    >>> model = lambda width: UmupGPT(8, width=width, depth=1)
    >>> check = coord_check(model, [16, 64], data, steps=2)
    >>> low, high = check.extremes(exclude=["readout"])
    >>> 0.5 < low and high < 2
    True
    """
    widths = _check_common("coord_check", make_model, widths, steps, optimizer, data)
    make_optimizer = optimizer or _default_optimizer()
    keep = modules or (lambda _path, _module: True)
    result = CoordCheck(widths, steps)
    inputs, _ = _batch(data, 0)
    for index, width in enumerate(widths):
        torch.manual_seed(seed)
        model = make_model(width)
        before = _record(model, inputs, keep)
        if _train(model, make_optimizer(model.parameters(), lr=lr), data, steps, tail=1) < math.inf:
            after = _record(model, inputs, keep)
        else:  # the loss left float range: no measurement after training
            after = {kind: [t * math.nan for t in tensors] for kind, tensors in before.items()}
        for kind, old in before.items():
            change = [a - b for a, b in zip(after[kind], old, strict=True)]
            for table, tensors in ((result.init, old), (result.trained, after[kind]), (result.change, change)):
                table.setdefault(kind, [math.nan] * len(widths))[index] = _rms_of_stds(tensors)
    return result


@dataclass
class LRSweep:
    """The result of :func:`lr_sweep`.

    Attributes:
        widths: the widths, ascending.
        lrs: the learning rates, ascending.
        losses: ``{width: [final loss at each lr]}`` (``inf`` where training diverged).
        best_lr: ``{width: the lr of the lowest final loss}``.
        drift_octaves: ``log2(max(best_lr) / min(best_lr))``: how far the best lr moves across the widths.
    """

    widths: list[int]
    lrs: list[float]
    losses: dict[int, list[float]]
    best_lr: dict[int, float]
    drift_octaves: float

    def table(self) -> str:
        """A text table of final losses, one row per width, the best marked with ``*``."""
        rows = [f"{'width':>6} " + "".join(f"{'2^' + format(math.log2(lr), '.3g'):>9}" for lr in self.lrs)]
        for width in self.widths:
            cells = "".join(
                f"{loss:>8.4g}" + ("*" if lr == self.best_lr[width] else " ")
                for lr, loss in zip(self.lrs, self.losses[width], strict=True)
            )
            rows.append(f"{width:>6} {cells}")
        return "\n".join(rows)

    def plot(self, ax: Any = None, title: str | None = None) -> Figure:
        """Final loss against learning rate (log2), one curve per width, each best lr marked."""
        import matplotlib.pyplot as plt  # lazy: pyplot adds about 1.9 s to `import unitscale`; only plots need it

        fig, ax = plt.subplots(figsize=(7.5, 3.4), layout="constrained") if ax is None else (ax.figure, ax)
        colours = plt.get_cmap("viridis")(torch.linspace(0, 0.9, len(self.widths)).tolist())
        for colour, width in zip(colours, self.widths, strict=True):
            finite = [(lr, loss) for lr, loss in zip(self.lrs, self.losses[width], strict=True) if math.isfinite(loss)]
            if finite:
                ax.plot(*zip(*finite, strict=True), marker="o", ms=3, color=colour, label=f"width {width}")
            best = self.best_lr[width]
            ax.plot([best], [self.losses[width][self.lrs.index(best)]], marker="*", ms=11, color=colour)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("learning rate", fontsize=10)
        ax.set_ylabel("final loss", fontsize=10)
        ax.tick_params(labelsize=9)
        ax.set_title(title or f"best lr moves {self.drift_octaves:.3g} octaves", fontsize=10)
        ax.legend(fontsize=9, frameon=False)
        return fig


def _check_lrs(lrs: Any) -> list[float]:
    lrs = list(lrs)
    if len(lrs) < 3:
        raise SweepGridError(
            f"lr_sweep: lrs has {len(lrs)} point(s); pass at least 3 learning rates (the best needs a neighbour "
            "on each side to be a minimum), e.g. [2**-k for k in range(2, 10)]"
        )
    for lr in lrs:
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not 0 < lr < math.inf:
            raise SweepGridError(f"lr_sweep: lrs holds {lr!r:.60}; every learning rate must be a finite number > 0")
    if len(set(lrs)) != len(lrs):
        raise SweepGridError(f"lr_sweep: lrs={lrs!r:.80} repeats a learning rate; pass each once")
    return sorted(float(lr) for lr in lrs)


def _train(model: nn.Module, opt: torch.optim.Optimizer, data: Data, steps: int, tail: int) -> float:
    losses = []
    for step in range(steps):
        x, y = _batch(data, step)
        opt.zero_grad()
        loss = _loss(model, x, y)
        value = loss.item()
        if not math.isfinite(value):
            return math.inf
        losses.append(value)
        loss.backward()
        opt.step()
    recent = losses[-tail:] or [0.0]  # no steps (a coordinate check at initialisation only)
    return sum(recent) / len(recent)


def lr_sweep(
    make_model: Callable[[int], nn.Module],
    widths: Sequence[int],
    lrs: Sequence[float],
    data: Data,
    steps: int,
    optimizer: OptimizerFactory | None = None,
    seed: int = 0,
    tail: int | None = None,
) -> LRSweep:
    """Train each width at each learning rate for ``steps`` steps; the best lr per width and how far it moves.

    Every run builds its model after ``torch.manual_seed(seed)`` and trains on batches
    ``0..steps-1``; a run whose loss becomes NaN or infinite stops and scores ``inf``. The best
    lr is a grid point, so the drift is a whole number of grid steps: use a grid as fine as the
    answer needs (half-octave steps resolve half an octave).

    Args:
        make_model: ``width -> module``; the int may be any size the model scales with, such
            as its depth (a depth-transfer check sweeps depths the same way).
        widths: distinct ints >= 1 (or depths).
        lrs: 3 or more distinct, finite numbers > 0.
        data: ``step -> (inputs, targets)``, or one fixed batch.
        steps: updates per run (>= 1).
        optimizer: called as ``optimizer(model.parameters(), lr=lr)``; ``None``: :class:`unitscale.optim.Adam`.
        seed: the seed before each model is built.
        tail: how many final steps the reported loss averages (the loss is measured before each
            update); ``None``: a fifth of the steps, at least 1.

    Raises:
        SweepGridError: fewer than 3 learning rates, one that is not a finite number > 0, a repeat,
            or bad widths.
        NotCallableError: ``make_model`` or ``optimizer`` is not callable.
        InputError: ``steps`` below 1, a bad ``tail``, or ``data`` neither a function nor a pair.

    >>> from unitscale.scaling import lr_sweep
    >>> lr_sweep(lambda w: None, [8], [0.1, 1.0], (None, None), 1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    unitscale.errors.SweepGridError: lr_sweep: lrs has 2 point(s); pass at least 3 ...
    """
    grid = _check_lrs(lrs)
    widths = _check_common("lr_sweep", make_model, widths, steps, optimizer, data)
    if steps < 1:
        raise InputError("lr_sweep: steps=0; pass the number of updates per run (>= 1)")
    tail = max(1, steps // 5) if tail is None else tail
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= steps:
        raise InputError(f"lr_sweep: tail={tail!r:.60} must be an int in 1..steps={steps}")
    make_optimizer = optimizer or _default_optimizer()
    losses: dict[int, list[float]] = {width: [] for width in widths}
    for width in widths:
        for lr in grid:
            torch.manual_seed(seed)
            model = make_model(width)
            losses[width].append(_train(model, make_optimizer(model.parameters(), lr=lr), data, steps, tail))
    best = {w: grid[losses[w].index(min(losses[w]))] for w in widths}
    return LRSweep(widths, grid, losses, best, math.log2(max(best.values()) / min(best.values())))
