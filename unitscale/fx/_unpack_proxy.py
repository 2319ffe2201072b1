"""Proxies that recognise tuple unpacking from a bytecode table built once per function.

``Proxy.__iter__`` disassembles the caller on every unpacking: a fifth of a transformer's tracing time.
"""

from __future__ import annotations

import dis
import sys
import types
import weakref
from collections.abc import Iterator

from torch import fx
from torch.fx.proxy import Attribute

__all__ = ["UnpackProxy", "unpack_length"]

_TABLES: weakref.WeakKeyDictionary[types.CodeType, dict[int, int]] = weakref.WeakKeyDictionary()


def unpack_length(code: types.CodeType, offset: int) -> int | None:
    """How many names the instruction of ``code`` at byte ``offset`` unpacks into; ``None`` if it is no unpacking.

    >>> def f(pair):
    ...     a, b = pair
    >>> code = dis.get_instructions(f)
    >>> unpacks = [i for i in code if i.opname == "UNPACK_SEQUENCE"]
    >>> [unpack_length(f.__code__, i.offset) for i in unpacks]
    [2]
    """
    table = _TABLES.get(code)
    if table is None:
        table = {i.offset: i.argval for i in dis.get_instructions(code) if i.opname == "UNPACK_SEQUENCE"}
        _TABLES[code] = table
    return table.get(offset)


class UnpackProxy(fx.Proxy):
    """A ``torch.fx.Proxy`` whose unpacking (``a, b = proxy``), and its attributes', skips re-disassembling the caller.

    >>> import torch
    >>> class Halves(torch.nn.Module):
    ...     def forward(self, x):
    ...         a, b = x.chunk(2)
    ...         return a - b
    >>> class Tracer(fx.Tracer):
    ...     def proxy(self, node):
    ...         return UnpackProxy(node, self)
    >>> [n.name for n in Tracer().trace(Halves()).nodes]
    ['x', 'chunk', 'getitem', 'getitem_1', 'sub', 'output']
    """

    def __iter__(self) -> Iterator[fx.Proxy]:
        caller = sys._getframe(1)
        n = unpack_length(caller.f_code, caller.f_lasti)
        if n is not None:
            return (self[i] for i in range(n))  # type: ignore[index]  # fx adds __getitem__ at import
        return self.tracer.iter(self)

    def __getattr__(self, k: str) -> UnpackAttribute:
        return UnpackAttribute(self, k)


class UnpackAttribute(Attribute, UnpackProxy):
    """An attribute of an :class:`UnpackProxy` (``x.shape``), created lazily as in ``torch.fx``."""
