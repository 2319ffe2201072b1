"""Mark a pure function's result as constant for TorchDynamo and ``torch.export``, cheaply.

``torch.compiler.assume_constant_result`` imports TorchDynamo (about 1.5 s) the moment it
decorates, so using it at module level would make ``import unitscale`` pay for a graph capture
that most sessions never do. :func:`constant_result` sets the same mark without the import;
``tests/scaling/test_constant.py`` checks that it sets exactly what torch's decorator sets.
"""

from collections.abc import Callable
from typing import TypeVar

F = TypeVar("F", bound=Callable[..., object])

# The attribute torch._dynamo.decorators.assume_constant_result sets (torch 2.4 to 2.13).
_MARK = "_dynamo_marked_constant"


def constant_result(fn: F) -> F:
    """Mark ``fn`` so that TorchDynamo and ``torch.export`` call it once and keep its result; return it.

    ``fn`` must be a function of Python constants whose result never changes for the same arguments.

    >>> from unitscale.scaling.constant import constant_result
    >>> @constant_result
    ... def table(n: int) -> float:
    ...     return sum(1 / k for k in range(1, n + 1))
    >>> round(table(4), 4)
    2.0833
    """
    setattr(fn, _MARK, True)
    return fn
