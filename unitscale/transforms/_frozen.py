"""The unit-scaling pass's rules that freeze gradient factors measured once, for batch norm's gradient growth.

Only on the trunk does a backward scale multiply every gradient upstream by one number: the first
backward pass measures it (``1 / RMS``) into a buffer of :class:`GradScales`, so backward stays linear.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import torch
from torch import fx, nn

import unitscale.functional as U
from unitscale.fx.nodes import MODULE_PATH_KEY
from unitscale.transforms._graph import _insert_after

if TYPE_CHECKING:
    from unitscale.transforms.pass_state import PassState


class GradScales(nn.Module):
    """The frozen gradient factors of one model: a scalar buffer per ``<module path>_<ordinal>``, 0 until measured.

    Loading a ``state_dict`` creates its buffers and sets ``loaded`` (the parameters are not re-initialised).
    """

    def __init__(self) -> None:
        super().__init__()
        self.loaded = False

    def factor(self, key: str) -> torch.Tensor:
        """The buffer for ``key``, made (0: not measured) on first use."""
        if key not in self._buffers:
            self.register_buffer(key, torch.zeros((), dtype=torch.float64))
        found = self._buffers[key]
        assert found is not None
        return found

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any) -> None:
        for name in state_dict:
            key = name[len(prefix) :]
            if name.startswith(prefix) and key and "." not in key:
                self.factor(key)
        self.loaded = True
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def _key(node: fx.Node, ordinal: int) -> str:
    path = str(node.meta.get(MODULE_PATH_KEY) or "root")
    return "".join(c if c.isalnum() else "_" for c in path) + f"_{ordinal}"


def freeze_grad_scale(gm: fx.GraphModule, store: GradScales, source: fx.Node, reader: fx.Node, ordinal: int) -> fx.Node:
    """Put ``U.frozen_grad_scale(source, <buffer>)`` between ``source`` and ``reader``; returns the new node."""
    key = _key(reader, ordinal)
    attr = f"unit_grad_scale_{key}"
    if not hasattr(gm, attr):
        gm.register_buffer(attr, store.factor(key), persistent=False)
    with gm.graph.inserting_after(source):
        buffer = gm.graph.get_attr(attr)
    buffer.meta["example_value"] = store.factor(key)
    value = source.meta.get("example_value")
    scaled = _insert_after(buffer, U.frozen_grad_scale, (source, buffer), f"{source.name}_grad_frozen", reader, value)
    reader.replace_input_with(source, scaled)
    return scaled


def freeze_before_batch_norm_blocks(state: PassState) -> None:
    """Freeze a measured gradient factor on the trunk before each residual block holding batch norm."""
    nodes = list(state.graph.nodes)
    position = {node: i for i, node in enumerate(nodes)}
    added: list[fx.Node] = []
    for split in [n for n in nodes if n.target is U.residual_split and n.args]:
        source = split.args[0]
        stream = source
        while isinstance(stream, fx.Node) and stream.target is U.scale and stream not in state.trunk and stream.args:
            stream = stream.args[0]
        if not (isinstance(source, fx.Node) and stream in state.trunk):
            continue
        block = itertools.takewhile(lambda n: n not in state.trunk, nodes[position[split] + 1 :])
        if any(n.target is U.batch_norm for n in block):
            added.append(freeze_grad_scale(state.gm, state.grad_scales, source, split, len(added)))
    state.done.update(added)
    state.blocks = len(added)


def freeze_trunk_batch_norms(state: PassState) -> None:
    """A batch norm on the trunk keeps its constraint (else its gradient scale is each batch's) and a frozen factor."""
    ordinal = state.blocks
    for node in list(state.graph.nodes):
        if node.target is not U.batch_norm or node not in state.trunk or not node.args:
            continue
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "constraint"}
        source = node.args[0]
        if isinstance(source, fx.Node):
            state.done.add(freeze_grad_scale(state.gm, state.grad_scales, source, node, ordinal))
            ordinal += 1
