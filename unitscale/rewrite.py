"""``unitscale.rewrite``, kept as an import path: :func:`inline` and :func:`invert` live in
:mod:`unitscale.fx`.

>>> import torch
>>> from unitscale.rewrite import invert
>>> invert(lambda x: torch.exp(2 * x))(torch.tensor([1.0])).exp().square()
tensor([1.])
"""

from unitscale.errors import NotInvertibleError as NotInvertibleError
from unitscale.fx.inline import inline as inline
from unitscale.fx.invert import invert as invert
from unitscale.fx.invert import register_inverse as register_inverse

__all__ = ["inline", "invert", "register_inverse", "NotInvertibleError"]
