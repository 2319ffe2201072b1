"""Capture once, use many times: the one cache of captures, per module and request.

Why, and what each key holds: ``unitscale/capture/README.md``.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import nn

from unitscale.fx.module_state import hook_key

__all__ = ["cached", "call_state", "clear_capture_cache", "fingerprint", "input_signature"]

_PLAIN = (bool, int, float, str, type(None), torch.dtype)
# What nn.Module.__init__ puts in every module's __dict__: parameters, buffers, submodules
# and hooks, fingerprinted on their own (``training`` is compared like any attribute).
_MODULE_INTERNALS = frozenset(vars(nn.Module())) - {"training"}


def _value_key(value: Any) -> Any:
    """An attribute's value as a comparable key: plain values and containers of them by value, else by identity."""
    if isinstance(value, _PLAIN):
        return (type(value), value)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_value_key(v) for v in value))
    if type(value) is dict and all(isinstance(k, _PLAIN) for k in value):
        return (dict, tuple((k, _value_key(v)) for k, v in value.items()))
    if isinstance(value, frozenset):
        try:
            return (frozenset, frozenset(_value_key(v) for v in value))
        except TypeError:  # an element whose key does not hash
            pass
    return (type(value), id(value))


def fingerprint(module: nn.Module) -> tuple[Any, ...]:
    """What a symbolic trace of ``module`` can depend on (its modules, attributes, names and hooks), as a key."""
    parts = []
    for name, m in module.named_modules(remove_duplicate=False):
        state = vars(m)
        # A tensor attribute is a constant that tracing copies into the graph (and stores on
        # the root as ``_tensor_constant0``, a new object each trace): not a reason to retrace.
        plain = tuple(
            (k, _value_key(v))
            for k, v in state.items()
            if k not in _MODULE_INTERNALS and not isinstance(v, torch.Tensor)
        )
        parts.append(
            (
                name,
                id(m),
                type(m),
                id(getattr(type(m), "forward", None)),
                id(state.get("forward")),
                plain,
                tuple((k, v is None) for k, v in m._parameters.items()),
                tuple((k, v is None) for k, v in m._buffers.items()),
                hook_key(m),
            )
        )
    return tuple(parts)


def call_state() -> tuple[Any, ...]:
    """What changes a graph beyond the module and its inputs: grad mode, inference mode, autocast, global hooks.

    >>> import torch
    >>> from unitscale.capture.toolkit import call_state
    >>> with torch.no_grad():
    ...     quiet = call_state()
    >>> quiet == call_state()
    False
    """
    autocast = tuple(
        (device, torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)) for device in _AUTOCAST_DEVICES
    )
    module = torch.nn.modules.module
    # the library's own global hooks (the eager recorder's, which another thread may hold while it
    # records) change no graph: only the user's count
    hooks = tuple(
        tuple(key for key, hook in getattr(module, name).items() if not _ours(hook))
        for name in _GLOBAL_HOOKS
        if hasattr(module, name)
    )
    # under torch.compile the inference-mode query is left out: TorchDynamo cannot trace it (a graph break)
    inference = False if torch.compiler.is_compiling() else torch.is_inference_mode_enabled()
    return (torch.is_grad_enabled(), inference, autocast, hooks)


def _ours(hook: Any) -> bool:
    """Whether a global module hook is one unitscale installs for itself."""
    owner = getattr(hook, "__self__", None)
    where = getattr(hook, "__module__", None) or type(owner).__module__
    return str(where).startswith("unitscale.")


_AUTOCAST_DEVICES = ("cpu", "cuda")
_GLOBAL_HOOKS = (
    "_global_forward_pre_hooks",
    "_global_forward_hooks",
    "_global_backward_pre_hooks",
    "_global_backward_hooks",
)


def input_signature(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Hashable | None:
    """What a graph made for these inputs depends on; ``None`` (do not cache) for an input of another kind."""
    signature: list[tuple[Any, ...]] = []
    for key, value in [*enumerate(args), *kwargs.items()]:
        if isinstance(value, torch.Tensor):
            signature.append((key, tuple(value.shape), value.dtype, value.device, value.requires_grad))
        elif isinstance(value, _PLAIN):
            signature.append((key, type(value), value))
        else:
            return None
    tensors = tuple(id(t) for t in (*module.parameters(), *module.buffers()))
    return (tensors, tuple(signature))


T = TypeVar("T")

# module -> request -> (fingerprint, input signature or None when the capture does not depend on it, capture)
_cache: weakref.WeakKeyDictionary[nn.Module, dict[Hashable, tuple[Any, Any, Any]]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def cached(
    module: nn.Module,
    request: Hashable,
    signature: Callable[[], Hashable | None],
    make: Callable[[], T],
    depends_on_inputs: Callable[[T], bool],
) -> T:
    """The capture ``make()`` made before for ``module`` and ``request``, if still valid; else a new one, kept.

    Args:
        module: held weakly.
        request: what was asked (routes and options).
        signature: gives :func:`input_signature` of this call, only when a capture that
            depends on it is looked up or kept.
        depends_on_inputs: whether a capture depends on the inputs' signature (an export)
            or only on the module (a symbolic trace).
    """
    state = call_state()  # before the module's fingerprint, which reads its hooks in fx.module_state
    key = (fingerprint(module), state)
    with _lock:  # threads may look up and keep captures at once; make() runs outside the lock
        entries = _cache.setdefault(module, {})
    found = entries.get(request)
    if found is not None and found[0] == key:
        if found[1] is None:  # a capture of the module alone (a symbolic trace)
            return found[2]
        this = signature()
        if found[1] == this:
            return found[2]
    result = make()
    if not depends_on_inputs(result):
        entries[request] = (key, None, result)
    elif (this := signature()) is not None:
        entries[request] = (key, this, result)
    return result


def clear_capture_cache() -> None:
    """Forget every cached capture.

    The cache notices changes to a module's structure and attributes by itself; clear it when
    ``forward`` depends on something it cannot see (a global variable, an object held by the
    module and changed in place), or to time a first call.

    >>> import torch
    >>> from unitscale.capture import capture, clear_capture_cache
    >>> model, x = torch.nn.Linear(2, 2), torch.randn(4, 2)
    >>> cap = capture(model, x, cache=True)
    >>> clear_capture_cache()
    >>> capture(model, x, cache=True) is cap
    False
    """
    with _lock:
        _cache.clear()
