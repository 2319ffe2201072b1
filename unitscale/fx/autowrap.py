"""The modules whose functions our tracers keep as single nodes unless told otherwise.

A layer above the fx tools registers its own (``unitscale.functional`` does, at import), so the
tracers never import the layers above them.
"""

from __future__ import annotations

import math
import types

import einops

from unitscale.errors import InputError

__all__ = ["register_autowrap_module", "default_autowrap_modules"]

_registered: list[types.ModuleType] = [math, einops]


def register_autowrap_module(module: types.ModuleType) -> None:
    """Keep ``module``'s functions as single nodes in every trace that uses the default ``autowrap_modules``.

    Raises:
        InputError: ``module`` is not a module.

    >>> import math
    >>> from unitscale.fx.autowrap import default_autowrap_modules
    >>> from unitscale.fx.autowrap import register_autowrap_module
    >>> register_autowrap_module(math)
    >>> default_autowrap_modules().count(math)
    1
    """
    if not isinstance(module, types.ModuleType):
        raise InputError(
            f"register_autowrap_module expects a module, got {type(module).__name__} {module!r:.60}; "
            "pass the module object (import it first), or list single functions as autowrap_functions"
        )
    if module not in _registered:
        _registered.append(module)


def default_autowrap_modules() -> tuple[types.ModuleType, ...]:
    """The modules registered so far, in order (``math``, ``einops``, then the registered ones).

    >>> from unitscale.fx.autowrap import default_autowrap_modules
    >>> [m.__name__ for m in default_autowrap_modules()][:3]
    ['math', 'einops', 'unitscale.functional']
    """
    return tuple(_registered)
