"""The one way to record a scale: every route of scale tracking hands each tensor to :meth:`ScaleRecording.record`."""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from unitscale.tracking.backward import _grad_fns, flatten_tensors
from unitscale.tracking.report import ScaleRow
from unitscale.tracking.stats import ScaleRecord, scratch_space

__all__ = ["ScaleRecording", "Step", "input_leaf"]


class Step(NamedTuple):
    """What recording one tensor needs beside its value: fixed per graph node, or per op as it runs.

    Attributes:
        name: the row's name (the node's, or the op call's).
        kind: ``"placeholder"`` (a model input: it becomes a leaf), ``"get_attr"`` (a
            parameter or buffer), or the op's kind (``"call_function"``, ...).
        path: the module path it ran in.
        op: the op's name (``""`` for ``get_attr``: ``"parameter"`` or ``"buffer"``, from the value).
        hand_on: the name of a view that takes this record over (its only user); ``""`` if none.
        from_source: the tensor holds its source's values (a view, a copy, a cast that casts nothing).
        keep_hook: keep this tensor's gradient hook though it hands on (the view is changed in place).
        in_place: the op changed its first argument in place.
    """

    name: str
    kind: str
    path: str
    op: str
    hand_on: str = ""
    from_source: bool = False
    keep_hook: bool = False
    in_place: bool = False


@dataclass
class ScaleRecording:
    """What one forward pass under scale tracking produced.

    Attributes:
        entries: ``(row without numbers, record)`` per tracked tensor, in execution order.
        leaves: tensors gradients are taken with respect to (detached inputs, parameters).
        cleanup: for the caller to close once the backward pass is done: removes the gradient
            hooks and leaves the CPU stds' :func:`~unitscale.tracking.stats.scratch_space`.
        differentiate_inputs: :func:`input_leaf`'s ``always``.
        new_record: makes each record (its ``fill`` measures).

    >>> import torch
    >>> from unitscale.tracking.recording import ScaleRecording
    >>> captured = ScaleRecording(abs_max=True)
    >>> x = torch.ones(3, requires_grad=True)
    >>> record = captured.track(x * 2, "y", "", "mul")
    >>> captured.entries[0][0][:5]
    ('y', '', 'mul', (3,), 'float32')
    >>> captured.cleanup.close()  # after the backward pass: removes the hooks
    """

    output: Any = None
    entries: list[tuple[ScaleRow, ScaleRecord]] = field(default_factory=list)
    leaves: list[torch.Tensor] = field(default_factory=list)
    cleanup: ExitStack = field(default_factory=ExitStack, repr=False)
    differentiate_inputs: bool = False
    abs_max: bool = False
    new_record: Callable[[], ScaleRecord] = ScaleRecord
    # the name of a view that takes a record over -> the record (Step.hand_on)
    _shared: dict[str, ScaleRecord] = field(default_factory=dict, repr=False)
    # id(tensor) -> (the tensor, weakly; its version counter when recorded; its latest record;
    # the gradient hook that fills it, if any)
    _latest: dict[int, tuple[weakref.ref[torch.Tensor], int, ScaleRecord, RemovableHandle | None]] = field(
        default_factory=dict, repr=False
    )
    # (source's grad_fn, its output_nr, source's record, its hook, view's grad_fn, view's record)
    # per view that took its source's forward numbers: candidates for sharing the gradient's too
    _views: list[tuple[Any, int, ScaleRecord, RemovableHandle, Any, ScaleRecord]] = field(
        default_factory=list, repr=False
    )
    # id(gradient) -> (the gradient, weakly; its version when measured; its std): autograd hands
    # one gradient to several hooks (both operands of an add), about a third of GPT-2's backward
    _grad_stds: dict[int, tuple[weakref.ref[torch.Tensor], int, Any]] = field(default_factory=dict, repr=False)

    def record(self, value: Any, step: Step, source: Any = None) -> Any:
        """The one recording function: record ``value`` as ``step`` describes it; return what the model goes on with.

        Anything but a floating-point tensor is returned as it is. ``source``: the tensor ``value``
        was made from where ``step.from_source`` (:meth:`track_same_values`).

        >>> import torch
        >>> from unitscale.tracking.recording import ScaleRecording, Step
        >>> captured = ScaleRecording()
        >>> x = torch.tensor([1.0, 3.0])
        >>> x = captured.record(x, Step("x", "placeholder", "", "input"))
        >>> view = Step("view", "call_method", "", "Tensor.view", from_source=True)
        >>> t = captured.record(x.view(2, 1), view, x)
        >>> [(row.node, record.forward) for row, record in captured.entries]
        [('x', 1.0), ('view', 1.0)]
        """
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            return value
        op = step.op
        if step.kind == "placeholder":
            leaf, value = input_leaf(value, self.differentiate_inputs)
            if leaf is not None:
                self.leaves.append(leaf)
        elif step.kind == "get_attr":
            op = "parameter" if isinstance(value, nn.Parameter) else "buffer"
            if value.requires_grad and value.is_leaf:
                self.leaves.append(value)
        if step.in_place and value._base is not None:
            self.forget_view_gradients(value)  # hooks on views of its base now see part of a gradient
        shared = self._shared.pop(step.name, None) if self._shared else None
        hook = step.keep_hook or not step.hand_on
        if shared is None and step.from_source:
            # the source has other users too: same forward numbers, its own gradient
            record = self.track_same_values(value, source, step.name, step.path, op, hook)
        else:
            record = self.track(value, step.name, step.path, op, record=shared, hook=hook)
        if step.hand_on:
            self._shared[step.hand_on] = record
        return value

    def track(
        self,
        t: torch.Tensor,
        node: str,
        module_path: str,
        op: str,
        record: ScaleRecord | None = None,
        hook: bool = True,
    ) -> ScaleRecord:
        """Record ``t`` as one row, in ``record`` if given; ``hook``: record its gradient too."""
        version = _version(t)
        if record is None:
            record = self.new_record()
            self.measure(record, "forward", t)
        handle = None
        if hook and t.requires_grad:
            handle = t.register_hook(partial(self.measure, record, "backward"))
            self.cleanup.callback(handle.remove)
        row = ScaleRow(node, module_path, op, tuple(t.shape), str(t.dtype).removeprefix("torch."))
        self.entries.append((row, record))
        if version is not None:
            self._latest[id(t)] = (weakref.ref(t), version, record, handle)
        return record

    def measure(self, record: ScaleRecord, slot: str, t: torch.Tensor) -> None:
        """``t``'s statistics into ``record``: called by :meth:`track` in forward, and its gradient hook.

        A gradient handed to several hooks is measured once.

        >>> import torch
        >>> from unitscale.tracking import ScaleRecord
        >>> captured, record = ScaleRecording(abs_max=True), ScaleRecord()
        >>> captured.measure(record, "forward", torch.tensor([1.0, 3.0]))
        >>> captured.measure(record, "backward", torch.tensor([0.0, 4.0]))
        >>> record
        ScaleRecord(forward=1.0, backward=2.0, abs_max=3.0)
        >>> captured.cleanup.close()
        """
        if not self.entries:
            self.cleanup.enter_context(scratch_space())
            self.cleanup.callback(self._grad_stds.clear)
        if slot == "forward":
            record.fill(t, slot, self.abs_max)
            return
        key, version = id(t), _version(t)
        seen = self._grad_stds.get(key)
        if seen is not None and seen[0]() is t and seen[1] == version:
            record.fill(t, slot, known=seen[2])
            return
        record.fill(t, slot)
        if version is not None:
            self._grad_stds[key] = (weakref.ref(t), version, record.backward)

    def track_same_values(
        self, t: torch.Tensor, source: Any, node: str, module_path: str, op: str, hook: bool = True
    ) -> ScaleRecord:
        """Record ``t``, which holds the values of ``source`` (a view or copy of it), as one row.

        Where ``source`` was recorded here and has not changed since (same version counter),
        its forward statistics are reused; ``t`` being ``source`` itself (``x.to(x.dtype)``)
        shares the whole record. Otherwise as :meth:`track`.

        >>> import torch
        >>> from unitscale.tracking.recording import ScaleRecording
        >>> captured = ScaleRecording()
        >>> x = torch.tensor([1.0, 2.0, 3.0, 6.0])
        >>> first = captured.track(x, "x", "", "input")
        >>> captured.track_same_values(x.view(4), x, "view", "", "Tensor.view").forward
        1.8708286933869707
        >>> _ = x.mul_(2)  # changed in place: computed afresh
        >>> captured.track_same_values(x.view(4), x, "view_1", "", "Tensor.view").forward
        3.7416573867739413
        """
        known = self.latest(source)
        if (
            known is None
            or t.dtype != source.dtype
            or t.device != source.device
            or t.numel() != source.numel()
            or (self.abs_max and known[2].abs_max is None and t.numel() > 0)
        ):
            return self.track(t, node, module_path, op, hook=hook)
        if t is source:
            return self.track(t, node, module_path, op, record=known[2], hook=False)
        record = ScaleRecord(known[2].forward, abs_max=known[2].abs_max if self.abs_max else None)
        self.track(t, node, module_path, op, record=record, hook=hook)
        if known[3] is not None and source.grad_fn is not None and t.grad_fn is not None:
            self._views.append((source.grad_fn, source.output_nr, known[2], known[3], t.grad_fn, record))
        return record

    def latest(self, t: Any) -> tuple[Any, int, ScaleRecord, RemovableHandle | None] | None:
        """``t``'s entry (ref, version, record, hook) where ``t`` was recorded here and has not changed since."""
        known = self._latest.get(id(t))
        fresh = isinstance(t, torch.Tensor) and known is not None and known[0]() is t and known[1] == _version(t)
        return known if fresh else None

    def share_view_gradients(self) -> None:
        """After the forward pass: a source whose only consumer is one view takes the view's gradient std.

        Its hook is removed and its rows take the view's record; counting the autograd graph's
        edges from the outputs sees every consumer, recorded or not.

        >>> import torch
        >>> from unitscale.tracking.recording import ScaleRecording
        >>> captured = ScaleRecording()
        >>> x = torch.ones(4, requires_grad=True) * 2
        >>> _ = captured.track(x, "x", "", "mul")
        >>> view = x.view(2, 2)
        >>> _ = captured.track_same_values(view, x, "view", "", "Tensor.view")
        >>> captured.output = view * torch.tensor([1.0, 3.0])
        >>> captured.share_view_gradients()
        >>> _ = captured.output.backward(torch.ones(2, 2)); captured.cleanup.close()
        >>> [record.backward for _, record in captured.entries]
        [1.0, 1.0]
        """
        if not self._views:
            return
        outputs = [t for _, t in flatten_tensors(self.output)]
        # an output's own gradient is an edge too
        edges = Counter((t.grad_fn, t.output_nr) for t in outputs if t.grad_fn is not None)
        via: dict[tuple[Any, int], Any] = {}
        for fn in _grad_fns(outputs):
            for edge in fn.next_functions:
                if edge[0] is not None:
                    edges[edge] += 1
                    via[edge] = fn
        # last view first: along x -> view -> view_1, view takes view_1's record before x takes view's
        taken: dict[int, ScaleRecord] = {}
        for fn, nr, record, handle, view_fn, view_record in reversed(self._views):
            if edges[(fn, nr)] == 1 and via.get((fn, nr)) is view_fn:
                handle.remove()
                taken[id(record)] = taken.get(id(view_record), view_record)
        self._views.clear()
        if taken:
            self.entries = [(row, taken.get(id(record), record)) for row, record in self.entries]

    def forget_view_gradients(self, changed: torch.Tensor) -> None:
        """Remove the gradient hooks of the views of ``changed``'s base, which was just changed in place.

        torch takes a changed view's gradient through its base, so such a hook would see part
        of it or none: their rows read n/a.

        >>> import torch
        >>> from unitscale.tracking.recording import ScaleRecording
        >>> captured = ScaleRecording()
        >>> h = torch.ones(4, requires_grad=True) * 2
        >>> view = h.view(2, 2)
        >>> _ = captured.track(view, "view", "", "Tensor.view")
        >>> _ = view.add_(1)
        >>> captured.forget_view_gradients(view)
        >>> h.sum().backward(); captured.cleanup.close()
        >>> print(captured.entries[0][1].backward)
        None
        """
        base = changed._base
        forgotten = set()
        for key, (ref, version, record, handle) in list(self._latest.items()):
            t = ref()
            if t is None or t._base is not base or handle is None:
                continue
            handle.remove()
            self._latest[key] = (ref, version, record, None)
            forgotten |= {id(handle), id(record)}
        self._views = [v for v in self._views if id(v[3]) not in forgotten and id(v[5]) not in forgotten]


def _version(t: torch.Tensor) -> int | None:
    """``t``'s version counter (bumped by every in-place change to it or a view of it); ``None`` if it has none."""
    try:
        return t._version
    except RuntimeError:  # an inference tensor counts no versions
        return None


def input_leaf(t: torch.Tensor, always: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
    """For a model input: the leaf its gradient is taken with respect to, and the copy to run the model on.

    As in a training step, the leaf is ``None`` unless the input requires grad or ``always``
    (set for a model with no trainable parameter): its gradient would cost the first layer a
    product the user's step never does. A leaf is detached from the caller's tensor; the model
    gets a copy either way (inference tensors become ordinary ones).

    >>> import torch
    >>> from unitscale.tracking.recording import input_leaf
    >>> leaf, value = input_leaf(torch.ones(2, requires_grad=True))
    >>> leaf.requires_grad, leaf.is_leaf, value.is_leaf
    (True, True, False)
    >>> leaf, value = input_leaf(torch.ones(2))
    >>> leaf is None, value.requires_grad
    (True, False)
    """
    if not (t.requires_grad or always):
        return None, t.clone()
    leaf = (t.clone() if t.is_inference() else t).detach().requires_grad_()
    return leaf, leaf.clone()
