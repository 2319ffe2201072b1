"""Is a unit-scaled graph at unit scale? Measure the std along it, and name the ops that move it off.

An op *breaks* unit scale when its output (forward) or its input's gradient (backward) leaves the
band that its input, or the gradient arriving, was inside. Only the activation stream counts, not
an op only batch norm reads nor one ``unit_scale`` kept; a tensor of one element shows NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from unitscale.tracking import ScaleTrackingInterpreter, read_rows, std_stat
from unitscale.transforms._kept import _whole_regions
from unitscale.transforms.unit_scale_pass import KEPT_KEY, describe

__all__ = ["BAND", "OffScale", "ScaleCheck", "check_scale"]

#: The band a unit-scaled tensor's std is held in: within a factor of 2 of 1.
BAND = (0.5, 2.0)


@dataclass(frozen=True)
class OffScale:
    """One op that moves a tensor off unit scale.

    Attributes:
        op: the op, as ``unit_scale`` names ops (function, node, module path, source line).
        node: the graph node's name.
        direction: ``"forward"`` (its output) or ``"backward"`` (its input's gradient).
        before: the std it was given (its main input; the gradient arriving at its output).
        after: the std it made (its output; the gradient it passes to its input).
    """

    op: str
    node: str
    direction: str
    before: float
    after: float

    @property
    def factor(self) -> float:
        """``after / before``: how much the op changed the scale."""
        return self.after / self.before if self.before > 0 else math.inf

    def __str__(self) -> str:
        return f"{self.op}: {self.direction} std {self.before:.3g} -> {self.after:.3g} (x{self.factor:.3g})"


@dataclass
class ScaleCheck:
    """What one forward and backward run of a unit-scaled graph measured.

    Attributes:
        output_std: std of the float outputs (their concatenation).
        grad_std: std of the gradient at the float inputs, or, for a model fed integer
            ids, at the first activations computed from them (the embeddings).
        breaks: the ops that moved a tensor off unit scale, in graph order (forward first).
        drift: where the output or the input gradient is off unit scale, the ops that moved
            it most that way (up to 5 per direction, largest first), even if none left the band.
        stds: ``(node, forward std, gradient std)`` for every activation, in graph order
            (``nan`` where there is no gradient, and for a tensor of one element).
        band: the band held, ``BAND``, (0.5, 2).

    >>> import torch
    >>> from unitscale import unit_scale
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU())
    >>> scaled = unit_scale(model)
    >>> _ = scaled(torch.randn(256, 64))
    >>> scaled.scale_check.ok, len(scaled.scale_check.stds)
    (True, 3)
    """

    output_std: float
    grad_std: float
    breaks: list[OffScale] = field(default_factory=list)
    stds: list[tuple[str, float, float]] = field(default_factory=list)
    band: tuple[float, float] = BAND
    drift: list[OffScale] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the output std and the input-gradient std are both inside the band."""
        return all(_inside(v, self.band) for v in (self.output_std, self.grad_std) if not math.isnan(v))

    def __iter__(self) -> Iterator[OffScale]:
        return iter(self.breaks)

    def summary(self) -> str:
        """One paragraph: the two stds and, when off unit scale, the ops that moved them.

        >>> from unitscale.transforms.scale_check import OffScale, ScaleCheck
        >>> off = OffScale("torch.exp (node exp)", "exp", "forward", 1.0, 3.1)
        >>> check = ScaleCheck(3.1, 1.0, [off])
        >>> print(check.summary())
        output std 3.1, input-gradient std 1 (band [0.5, 2]); off unit scale at:
          torch.exp (node exp): forward std 1 -> 3.1 (x3.1)
        """
        head = f"output std {self.output_std:.3g}, input-gradient std {self.grad_std:.3g} (band [{self.band[0]:g}, "
        head += f"{self.band[1]:g}])"
        if self.ok:
            return head + ": at unit scale"
        lines = [f"  {b}" for b in self.breaks]
        if self.drift:
            lines += ["  the ops that moved it most:", *(f"    {d}" for d in self.drift)]
        return head + "; off unit scale at:\n" + "\n".join(lines)


def _inside(value: float, band: tuple[float, float]) -> bool:
    return band[0] <= value <= band[1]


def _spread(std: Any, numel: int) -> float:
    """A tensor's std as the check judges it: NaN (not judged) where there is none, or one element (a loss)."""
    return float(std) if std is not None and numel > 1 else math.nan


class _Recorder(ScaleTrackingInterpreter):
    """Scale tracking over the activation stream; keeps each recorded tensor, to take the gradient there."""

    def __init__(self, gm: fx.GraphModule, stream: set[fx.Node]) -> None:
        super().__init__(gm, only=stream)
        self.captured.differentiate_inputs = True  # every float input starts the stream's gradients
        self.values: dict[fx.Node, torch.Tensor] = {}

    def run_node(self, n: fx.Node) -> Any:
        result = super().run_node(n)
        if n in self._steps and isinstance(result, torch.Tensor) and result.is_floating_point():
            self.values[n] = result
        return result


def _stream(graph: fx.Graph, skip: set[fx.Node]) -> set[fx.Node]:
    """The inputs (token ids too: the embeddings computed from them are activations) and what follows from them."""
    stream: set[fx.Node] = set()
    for n in graph.nodes:
        if n.op == "placeholder" or (
            n.op != "output" and n not in skip and any(a in stream for a in n.all_input_nodes)
        ):
            stream.add(n)
    return stream


def check_scale(
    gm: fx.GraphModule,
    inputs: list[Any],
    band: tuple[float, float] = BAND,
    outputs: list[int] | None = None,
    backward: bool = True,
) -> ScaleCheck:
    """Run ``gm`` on ``inputs`` (one per placeholder) forward and backward, and measure the std along it.

    Parameters' ``.grad`` are left alone; buffers and the random number generator are not (batch
    norm in training mode updates its running statistics, dropout draws): keep them if you must.

    Args:
        outputs: the positions, among the graph's output leaves, of the model's outputs
            (``None``: all); TorchDynamo's graphs also return values the model stores.
        backward: ``False`` for a graph captured under ``torch.no_grad()``, which may hold ops
            with no derivative: its input-gradient std is then ``nan``.

    >>> import torch
    >>> from torch import fx
    >>> from unitscale.transforms import check_scale
    >>> class Net(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.pow(x, 3)
    >>> check = check_scale(fx.symbolic_trace(Net()), [torch.randn(10_000)])
    >>> [(b.op.split(" ")[0], b.direction, round(b.factor)) for b in check.breaks]
    [('torch.pow', 'forward', 4), ('torch.pow', 'backward', 5)]
    """
    graph = gm.graph
    # Tensors inside an inlined vmap are batched views that must not escape it.
    inside = {n for nodes in _whole_regions(graph).values() for n in nodes}
    recorder = _Recorder(gm, _stream(graph, inside))
    captured = recorder.captured
    try:
        with torch.enable_grad():
            leaves = pytree.tree_leaves(recorder.run(*inputs, enable_io_processing=False))
            chosen = leaves if outputs is None else [leaves[i] for i in outputs]
            float_outputs = [o for o in chosen if isinstance(o, torch.Tensor) and o.is_floating_point()]
            differentiable = [o for o in float_outputs if o.requires_grad]
            targets = [v for v in recorder.values.values() if v.requires_grad]
            if backward and differentiable and targets:
                generator = torch.Generator(device=differentiable[0].device).manual_seed(0)
                # A one-element output is a loss: its gradient is 1, as in ``loss.backward()``.
                seeds = [
                    torch.ones_like(o)
                    if o.numel() == 1
                    else torch.randn(o.shape, generator=generator, dtype=o.dtype, device=o.device)
                    for o in differentiable
                ]
                torch.autograd.grad(differentiable, targets, seeds, allow_unused=True)  # the hooks measure them
    finally:
        captured.cleanup.close()
    rows = {row.node: row for row in read_rows(captured.entries)}
    sizes = {n: v.numel() for n, v in recorder.values.items()}
    stds = {n: _spread(rows[n.name].forward, size) for n, size in sizes.items()}
    grads = {n: _spread(rows[n.name].backward, size) for n, size in sizes.items() if rows[n.name].backward is not None}
    whole = torch.cat([o.detach().flatten() for o in float_outputs]) if float_outputs else torch.empty(0)
    output_std = _spread(std_stat(whole), whole.numel())
    placeholders = [n for n in sizes if n.op == "placeholder" and n in grads]
    first = placeholders or [n for n in sizes if n.op != "placeholder" and n in grads][:1]
    grad_std = grads[first[0]] if first else math.nan
    # each op with its main input: the activation input with the most elements (the tensor, not a gain)
    steps = [
        (n, max((a for a in n.all_input_nodes if a in sizes), key=sizes.__getitem__))
        for n in graph.nodes
        if n in sizes and n.op != "placeholder" and any(a in sizes for a in n.all_input_nodes)
    ]
    ahead = [(n, stds[s], stds[n]) for n, s in steps if not _only_normalised(n) and KEPT_KEY not in n.meta]
    back = [(n, grads.get(n, math.nan), grads.get(s, math.nan)) for n, s in steps]
    breaks = [
        OffScale(describe(n), n.name, "forward", before, after)
        for n, before, after in ahead
        if _inside(before, band) and not math.isnan(after) and not _inside(after, band)
    ] + _backward_breaks(graph, grads, band)
    drift = []
    for direction, std, moves in (("forward", output_std, ahead), ("backward", grad_std, back)):
        if not math.isnan(std) and not _inside(std, band):
            drift += _drift(moves, direction, up=std > band[1])
    named = {(b.node, b.direction) for b in breaks}
    drift = [d for d in drift if (d.node, d.direction) not in named]
    table = [(n.name, stds[n], grads.get(n, math.nan)) for n in sizes]
    return ScaleCheck(output_std, grad_std, breaks, table, band, drift)


def _drift(moves: list[tuple[fx.Node, float, float]], direction: str, up: bool) -> list[OffScale]:
    """The (up to) 5 ops whose factor moved the scale furthest up (or down), in ``direction``."""
    # a std of inf (a mask of -inf or the dtype's lowest added to scores) has no factor to rank
    found = [
        OffScale(describe(n), n.name, direction, before, after)
        for n, before, after in moves
        if 0 < before < math.inf and 0 < after < math.inf and (after > 1.05 * before if up else after < before / 1.05)
    ]
    return sorted(found, key=lambda s: -abs(math.log(s.factor)))[:5]


def _only_normalised(node: fx.Node) -> bool:
    """Whether only batch norm reads ``node`` (through a frozen gradient factor or not): its scale does not matter."""
    if node.users and all(getattr(u.target, "__name__", "") == "frozen_grad_scale" for u in node.users):
        return all(_only_normalised(u) for u in node.users)
    return bool(node.users) and all(
        getattr(user.target, "__name__", "") == "batch_norm" and user.args[:1] == (node,) for user in node.users
    )


def _backward_breaks(graph: fx.Graph, grads: dict[fx.Node, float], band: tuple[float, float]) -> list[OffScale]:
    found = []
    for node in reversed(graph.nodes):
        readers = [u for u in node.users if u in grads]
        reader = max(readers, key=lambda u: grads[u]) if node in grads and readers else None
        if reader is not None and _inside(grads[reader], band) and not _inside(grads[node], band):
            found.append(OffScale(describe(reader), reader.name, "backward", grads[reader], grads[node]))
    return found
