"""Leave the user's module as it was: undo what running or tracing its ``forward`` changed.

A ``forward`` that assigns to its module (``self.last = y``) would otherwise keep a tracer's ``Proxy``.
"""

from __future__ import annotations

import operator
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import fx, nn

__all__ = ["hook_key", "module_state_kept", "pytree_specs_quiet", "registered_hooks"]

_MISSING = object()


def _snapshot(root: nn.Module) -> list[tuple[nn.Module, dict[str, Any], dict[str, Any], list[str]]]:
    """Every submodule's ``__dict__``, copies of its non-empty dicts and sets, and its empty ones' names."""
    snapshot = []
    for m in root.modules():
        attrs = dict(m.__dict__)
        containers, empty = {}, []
        for k, v in attrs.items():
            if isinstance(v, (dict, set)):
                if v:
                    containers[k] = type(v)(v)
                else:
                    empty.append(k)
        snapshot.append((m, attrs, containers, empty))
    return snapshot


def _restore_attrs(state: dict[str, Any], attrs: dict[str, Any], keep: Collection[str]) -> None:
    for k in [k for k in state if k not in attrs]:
        if k not in keep or isinstance(state[k], fx.Proxy):
            del state[k]
    for k, v in attrs.items():
        if state.get(k, _MISSING) is not v:
            state[k] = v


@contextmanager
def module_state_kept(root: Any, values: bool = False) -> Iterator[set[str]]:
    """Within this block, changes to ``root``'s module tree are undone on exit, on success and on failure.

    Every submodule's attributes and its parameter, buffer, submodule and hook containers are
    put back (``root`` not a module: nothing is kept); with ``values=True`` the buffers' values
    too. The block gets a set of new root attributes to keep (a trace's ``_tensor_constant0``).

    >>> import torch
    >>> from torch import nn
    >>> from unitscale.fx.module_state import module_state_kept
    >>> m = nn.BatchNorm1d(2)
    >>> with module_state_kept(m, values=True):
    ...     _ = m(torch.randn(4, 2))
    ...     m.last, m.training = "a proxy", False
    >>> m.num_batches_tracked.item(), m.running_mean.tolist()
    (0, [0.0, 0.0])
    >>> hasattr(m, "last"), m.training
    (False, True)
    """
    module = root if isinstance(root, nn.Module) else None
    snapshot = _snapshot(module) if module is not None else []
    buffers = []
    if values and module is not None:
        with torch.no_grad():
            buffers = [(b, b.detach().clone()) for b in module.buffers()]
    keep: set[str] = set()
    try:
        yield keep
    finally:
        for m, attrs, containers, empty in snapshot:
            state = m.__dict__
            if len(state) != len(attrs) or not all(map(operator.is_, state.values(), attrs.values())):
                _restore_attrs(state, attrs, keep if m is module else ())
            for k in empty:
                if state[k]:
                    state[k].clear()
            for k, saved in containers.items():
                current = state[k]
                if isinstance(saved, dict):
                    same = current.keys() == saved.keys() and all(map(operator.is_, current.values(), saved.values()))
                else:
                    same = current == saved
                if not same:
                    current.clear()
                    current.update(saved)
        with torch.no_grad():
            for b, copy in buffers:
                # BatchNorm's kernel updates its running statistics without bumping the
                # version counter, so the values themselves are compared.
                if b.shape == copy.shape and b.dtype == copy.dtype:
                    if not torch.equal(b, copy):
                        b.copy_(copy)
                else:
                    b.data = copy


@contextmanager
def pytree_specs_quiet() -> Iterator[None]:
    """Silence torch's ``LeafSpec`` FutureWarning, tripped by copying or unpickling a captured graph module.

    >>> import warnings
    >>> from unitscale.fx.module_state import pytree_specs_quiet
    >>> with pytree_specs_quiet():
    ...     warnings.warn("LeafSpec is deprecated", FutureWarning)  # not shown
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        yield


_HOOKS = (
    ("_forward_pre_hooks", "forward pre-hook"),
    ("_forward_hooks", "forward hook"),
    ("_backward_pre_hooks", "backward pre-hook"),
    ("_backward_hooks", "backward hook"),
)


def registered_hooks(module: nn.Module) -> list[str]:
    """The kinds of hook registered on ``module`` itself, which a trace of its ``forward`` never runs.

    >>> from torch import nn
    >>> from unitscale.fx.module_state import registered_hooks
    >>> m = nn.Linear(2, 2)
    >>> _ = m.register_forward_hook(lambda *args: None)
    >>> registered_hooks(m)
    ['forward hook']
    """
    return [kind for attr, kind in _HOOKS if getattr(module, attr, None)]


def hook_key(module: nn.Module) -> tuple[tuple[int, ...], ...]:
    """The handles of ``module``'s own hooks: each registration has a new id, so an added or removed hook shows."""
    return tuple(tuple(getattr(module, attr, None) or ()) for attr, _ in _HOOKS)
