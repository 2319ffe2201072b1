"""Graph rewrites: inline module calls, invert functions.

:func:`inline` replaces ``call_module`` nodes by the traced bodies of their
modules; :func:`invert` builds the inverse of a function of one tensor by walking
its graph backwards through a registry of inverses (:func:`register_inverse`).

>>> import torch
>>> from unitscale.rewrite import invert
>>> invert(lambda x: torch.exp(2 * x))(torch.tensor([1.0])).exp().square()
tensor([1.])
"""

from __future__ import annotations

from unitscale._inline import inline
from unitscale._invert import invert, register_inverse
from unitscale.errors import NotInvertibleError

__all__ = ["inline", "invert", "register_inverse", "NotInvertibleError"]
