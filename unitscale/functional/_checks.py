"""How the ops turn torch's errors on arguments that do not fit into an ``InputError`` naming the op."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch as _torch

from unitscale import errors as _errors

_TORCH_ERRORS = (RuntimeError, ValueError, IndexError, TypeError)


def _describe(value: object) -> str:
    if isinstance(value, _torch.Tensor):
        return f"{tuple(value.shape)} {str(value.dtype).removeprefix('torch.')}"
    return f"{value!r:.60}"


def _tracing(error: Exception, *args: object) -> bool:
    # Tracers raise through these ops too (fx proxies, symbolic shapes, TorchDynamo, fake
    # tensors): those failures are the tracer's to report, not a misfit of the caller's shapes.
    if type(error).__module__.startswith(("torch.fx", "torch._dynamo", "torch._subclasses")):
        return True
    return any(isinstance(a, _torch.fx.Proxy) for a in args)


@contextmanager
def _misfits(op: str, fits: str, **args: object) -> Iterator[None]:
    """Raise torch's error on ``args`` in the block as an ``InputError`` naming ``op``, ``args`` and what ``fits``.

    unitscale's own errors, and a tracer's (:func:`_tracing` over ``args``), pass through as they are.
    """
    try:
        yield
    except _errors.UnitscaleError:
        raise
    except _TORCH_ERRORS as e:
        if _tracing(e, *args.values()):
            raise
        got = ", ".join(f"{name}={_describe(v)}" for name, v in args.items() if v is not None)
        raise _errors.InputError(f"{op}: {got} do not fit; {fits}. torch said {type(e).__name__}: {e}") from e
