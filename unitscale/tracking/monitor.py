"""Scales over training: a monitor that measures every tensor every N steps of your own loop.

A module whose output is the very tensor a submodule returned (a ``Sequential``) is recorded
once, under the submodule. On an accelerator nothing is read per tensor.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch
from torch import nn

from unitscale.errors import MonitorSettingError, MonitorStateError, NotAModuleError
from unitscale.formats import FP8_E4M3, FP8_E5M2, FPFormat
from unitscale.tracking.format_casts import RAW_FIELDS, CastBatch, Scratch, finish_cast_stats, raw_cast_stats
from unitscale.tracking.history import DriftTable, MonitorRecord, ScaleHistory
from unitscale.tracking.recording import ScaleRecording, Step
from unitscale.tracking.report import read_stats
from unitscale.tracking.stats import ScaleRecord, Stat

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ScaleMonitor", "ROOT", "BATCH_LIMIT"]

BATCH_LIMIT = 2**17
"""Tensors of at most this many elements are measured together (:class:`~unitscale.tracking.format_casts.CastBatch`)."""

ROOT = "(root)"
"""The tensor name of the model's own output (when no submodule returned it)."""


class _Batched(NamedTuple):
    """A record's place in one of the step's :class:`CastBatch` objects, measured when the step ends."""

    batch: CastBatch
    row: int


_Pending = tuple["_CastRecord", str, "tuple[Stat, ...] | _Batched"]


class _CastRecord(ScaleRecord):
    """A module output's or parameter's record: measured against the monitor's formats, read when the step ends."""

    __slots__ = ("monitor",)

    def __init__(self, monitor: ScaleMonitor) -> None:
        super().__init__()
        self.monitor = monitor

    def fill(self, t: torch.Tensor, slot: str = "forward", abs_max: bool = False, known: Any = None) -> None:
        # known: another record's measure of the same gradient
        if slot == "backward":
            self.backward = self.monitor._measure(self, "bwd", t, known)
        else:
            self.monitor._measure(self, "fwd", t)


def _check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise MonitorSettingError(
            f"ScaleMonitor: {name}={value!r:.60} must be an int >= {low} (got {type(value).__name__})"
        )
    return value


def _float_tensors(output: Any) -> list[tuple[str, torch.Tensor]]:
    """The nonempty floating-point tensors of a module's output, one level deep, with name suffixes."""
    if isinstance(output, torch.Tensor):
        items: list[tuple[str, Any]] = [("", output)]
    elif isinstance(output, (tuple, list)):
        items = [(f"[{i}]", v) for i, v in enumerate(output)]
    elif isinstance(output, Mapping):
        items = [(f".{k}", v) for k, v in output.items()]
    else:
        return []
    found = [(s, v) for s, v in items if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel() > 0]
    return [("", found[0][1])] if len(found) == 1 else found


class ScaleMonitor:
    """Record every tensor's scale, underflow, overflow and SQNR every ``every`` steps of training.

    Wrap each training step in ``with monitor.step():``; read the results from ``history`` (a
    :class:`~unitscale.tracking.ScaleHistory`). :meth:`close` (or leaving ``with
    ScaleMonitor(...)``) removes every hook; the model is then exactly as before.

    Parameter values are read when a record step starts, their gradients when it ends:
    zero gradients after the ``with`` block (or with ``set_to_none=True``), not inside it.

    Args:
        every: record steps whose number is a multiple of this (0, every, 2*every, ...).
        fwd_format, bwd_format: the formats forward values and gradients would be cast to.
        activations: record module outputs and their gradients.
        parameters: record parameters and their gradients.

    Raises:
        NotAModuleError: ``model`` is not an ``nn.Module``.
        MonitorSettingError: ``every`` is not an int >= 1, or a format is not an ``FPFormat``.

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.tracking import ScaleMonitor
    >>> model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> with ScaleMonitor(model, every=2) as monitor:
    ...     for step in range(4):
    ...         with monitor.step():
    ...             model(torch.randn(16, 8)).pow(2).mean().backward()
    ...         opt.step(); opt.zero_grad()
    >>> monitor.history.steps, monitor.history.tensors("activation")
    ([0, 2], ['0', '1', '2'])
    """

    def __init__(
        self,
        model: nn.Module,
        every: int = 10,
        fwd_format: FPFormat = FP8_E4M3,
        bwd_format: FPFormat = FP8_E5M2,
        *,
        activations: bool = True,
        parameters: bool = True,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise NotAModuleError(
                f"ScaleMonitor: model is a {type(model).__name__}, not a torch.nn.Module; pass the model you train"
            )
        self.every = _check_int("every", every, 1)
        for name, fmt in (("fwd_format", fwd_format), ("bwd_format", bwd_format)):
            if not isinstance(fmt, FPFormat):
                raise MonitorSettingError(
                    f"ScaleMonitor: {name}={fmt!r:.60} is a {type(fmt).__name__}; pass an FPFormat "
                    "such as unitscale.formats.FP8_E4M3"
                )
        for name, flag in (("activations", activations), ("parameters", parameters)):
            if not isinstance(flag, bool):
                raise MonitorSettingError(f"ScaleMonitor: {name}={flag!r:.60} must be True or False")
        self.model = model
        self.fwd_format, self.bwd_format = fwd_format, bwd_format
        self.activations, self.parameters = activations, parameters
        self.history = ScaleHistory(fwd_format=fwd_format, bwd_format=bwd_format)
        self._modules = [(ROOT if name == "" else name, m) for name, m in model.named_modules()]
        self._next_step = 0
        self._in_step = False
        self._closed = False
        self._cleanup = ExitStack()  # the record step's hooks, removed when it ends
        self._recording = ScaleRecording(new_record=partial(_CastRecord, self))
        self._params: list[tuple[ScaleRecord, nn.Parameter]] = []
        self._pending: list[_Pending] = []
        self._calls: dict[str, int] = {}
        self._scratch = Scratch()
        self._batches = {"fwd": CastBatch(fwd_format), "bwd": CastBatch(bwd_format)}

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"next step {self._next_step}"
        return f"<ScaleMonitor every {self.every} steps, {len(self.history.steps)} steps recorded, {state}>"

    def __enter__(self) -> ScaleMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_record_step(self, step: int) -> bool:
        """Whether step number ``step`` records (is a multiple of ``every``)."""
        return step % self.every == 0

    @contextmanager
    def step(self, step: int | None = None) -> Iterator[bool]:
        """A context for one training step (forward and backward); yields whether it records.

        Args:
            step: the step's number; ``None`` counts on from the last step given (0 first).

        Raises:
            MonitorSettingError: ``step`` is not an int >= 0.
            MonitorStateError: the monitor is closed, or a step is already open.
        """
        if step is not None:
            _check_int("step", step, 0)
        if self._closed:
            raise MonitorStateError("ScaleMonitor.step(): the monitor is closed; make a new ScaleMonitor")
        if self._in_step:
            raise MonitorStateError("ScaleMonitor.step(): a step is already open; close it before opening another")
        n = self._next_step if step is None else step
        self._next_step = n + 1
        record = self.is_record_step(n)
        self._in_step = True
        try:
            if record:
                self._arm()
            yield record
            self._cleanup.close()
            if record:
                self._collect(n)
        finally:  # on an error too: the hooks go, the step's measures are dropped
            self._cleanup.close()
            self._drop_pending()
            self._in_step = False

    def close(self) -> None:
        """Remove every hook (there are none outside a record step) and refuse further steps."""
        self._cleanup.close()
        self._drop_pending()
        self._scratch = Scratch()
        self._batches = {"fwd": CastBatch(self.fwd_format), "bwd": CastBatch(self.bwd_format)}  # frees buffers
        self._closed = True

    def _arm(self) -> None:
        self._calls = {}
        self._recording = ScaleRecording(new_record=partial(_CastRecord, self))
        self._cleanup.enter_context(self._recording.cleanup)
        self._params = []
        for name, p in self.model.named_parameters() if self.parameters else ():
            if p.is_floating_point() and p.numel():
                # detached, so no gradient hook: the gradient is read from p.grad when the step ends
                self._recording.record(p.detach(), Step(name, "parameter", name.rpartition(".")[0], "parameter"))
                self._params.append((self._recording.entries[-1][1], p))
        if self.activations:
            for name, module in self._modules:
                self._cleanup.callback(module.register_forward_hook(partial(self._on_forward, name)).remove)

    def _drop_pending(self) -> None:
        self._pending = []
        for batch in self._batches.values():
            batch.clear()

    def _on_forward(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        for suffix, t in _float_tensors(output):
            if self._recording.latest(t) is not None:
                continue  # a parent returning its child's output unchanged: the child's row only
            full = name + suffix
            calls = self._calls[full] = self._calls.get(full, 0) + 1
            self._recording.record(t, Step(full if calls == 1 else f"{full}#{calls}", "call_module", name, ""))

    def _measure(self, record: _CastRecord, direction: str, t: torch.Tensor, raw: Any = None) -> Any:
        """Measure ``t`` (or take ``raw``, another record's measure of the same tensor) when the step ends."""
        batch = self._batches[direction]
        if raw is None and t.numel() <= BATCH_LIMIT and t.dtype != torch.float64:
            raw = _Batched(batch, batch.add(t))
        elif raw is None:
            raw = raw_cast_stats(t, batch.fmt, self._scratch)
        self._pending.append((record, direction, raw))
        return raw

    def _collect(self, step: int) -> None:
        for record, p in self._params:
            if p.grad is not None and p.grad.is_floating_point() and p.grad.numel():
                record.fill(p.grad, "backward")
        batched = {id(batch): batch.finish() for batch in self._batches.values()}
        alone = [i for i, (*_, raw) in enumerate(self._pending) if not isinstance(raw, _Batched)]
        flat: list[Any] = read_stats([v for i in alone for v in cast("tuple[Stat, ...]", self._pending[i][2])])
        width = len(RAW_FIELDS)
        read = {i: tuple(flat[k * width : (k + 1) * width]) for k, i in enumerate(alone)}
        rows = {id(record): row for row, record in self._recording.entries}
        append = self.history.records.append
        for i, (record, direction, raw) in enumerate(self._pending):
            values = batched[id(raw.batch)][raw.row] if isinstance(raw, _Batched) else read[i]
            row = rows[id(record)]
            kind = "parameter" if row.op == "parameter" else "activation"
            append(MonitorRecord(step, row.node, kind, direction, *finish_cast_stats(values)))

    def table(self, step: int | None = None, kind: str | None = None, direction: str | None = None) -> str:
        """:meth:`ScaleHistory.table` of ``history``."""
        return self.history.table(step, kind, direction)

    def heatmap(
        self, stat: str = "std", kind: str | None = None, direction: str | None = None, relative: bool = False
    ) -> Figure:
        """:meth:`ScaleHistory.heatmap` of ``history``: a row per tensor, a column per recorded step."""
        return self.history.heatmap(stat, kind, direction, relative)

    def drifted(
        self, top: int = 10, stat: str = "std", kind: str | None = None, direction: str | None = None
    ) -> DriftTable:
        """:meth:`ScaleHistory.drifted` of ``history``: the tensors whose ``stat`` moved most, in octaves."""
        return self.history.drifted(top, stat, kind, direction)
