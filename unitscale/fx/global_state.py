"""One lock for every change unitscale makes to process-wide state, and fx's patches made per-thread.

Two traces at once in two threads would undo each other's patches of ``nn.Module`` in the wrong
order, leaving them for good; the class-wide patches reach every thread while one trace runs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import fx, nn

__all__ = ["GLOBAL_STATE_LOCK", "this_thread_only"]

#: Held by every trace, export and TorchDynamo capture unitscale makes (reentrant).
GLOBAL_STATE_LOCK = threading.RLock()


@contextmanager
def this_thread_only(tracer: fx.Tracer) -> Iterator[None]:
    """While ``tracer`` traces, module calls and attribute reads of other threads bypass it (and after).

    ``fx.Tracer.trace`` sends every ``module(...)`` and ``module.attr`` in the process to the
    tracer; a thread may still hold the patch after the block.

    >>> import threading, torch
    >>> from unitscale.fx import ModulePathTracer
    >>> from unitscale.fx.global_state import this_thread_only
    >>> tracer, plain = ModulePathTracer(), torch.nn.Linear(2, 2)
    >>> def elsewhere():
    ...     print(tracer.call_module(plain, lambda x: "ran", (1,), {}))
    >>> with this_thread_only(tracer):
    ...     worker = threading.Thread(target=elsewhere)
    ...     worker.start(); worker.join()
    ran
    """
    state = vars(tracer)
    outer = state.get(_OWNER)
    if outer is not None:  # a trace inside a trace
        yield
        return
    if "call_module" not in state:
        call_module: Callable[..., Any] = tracer.call_module
        read_attr: Callable[..., Any] = tracer.getattr

        def guarded_call(
            m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> Any:
            if state.get(_OWNER) != threading.get_ident():
                return forward(*args, **kwargs)  # torch.nn.Module.__call__ itself
            return call_module(m, forward, args, kwargs)

        def guarded_getattr(attr: str, attr_val: Any, parameter_proxy_cache: dict[str, Any]) -> Any:
            if state.get(_OWNER) != threading.get_ident():
                return attr_val
            return read_attr(attr, attr_val, parameter_proxy_cache)

        state["call_module"], state["getattr"] = guarded_call, guarded_getattr
    state[_OWNER] = threading.get_ident()
    try:
        yield
    finally:
        state[_OWNER] = None


_OWNER = "_unitscale_tracing_thread"
