"""Argument text that many unit-scaled ops and modules share, written once and filled into their docstrings.

A docstring names a placeholder on a line of its own, ``{constraint}`` under
``Args:`` or ``{constraint_errors}`` under ``Raises:``, and :func:`fill_docstring`
replaces it with the text of :data:`TEXTS`, indented like the placeholder. Braces
anywhere else in the docstring are left alone.

>>> from unitscale.scaling.docs import fill_docstring
>>> @fill_docstring
... def op(x, constraint="gmean"):
...     '''An op.
...
...     Args:
...         {constraint}
...     '''
>>> "a callable" in op.__doc__
True
"""

from __future__ import annotations

import re
from typing import TypeVar

__all__ = ["TEXTS", "fill_docstring"]

TEXTS: dict[str, str] = {
    "constraint": (
        "constraint: how the output scale and the gradient scales become one number where the gradient\n"
        "    must stay a true gradient: a name from :data:`~unitscale.scaling.CONSTRAINTS`, a callable\n"
        "    ``(output_scale, *grad_input_scales) -> float``, or ``None`` (each direction scaled on its own)."
    ),
    "constraint_errors": (
        "UnknownConstraintError: ``constraint`` names no constraint.\n"
        "PredicateError: a callable ``constraint`` returned no positive, finite number."
    ),
    "mult": (
        "mult: u-μP's α for this op, a finite number > 0: it multiplies the input of the\n"
        "    nonlinearity, and the op's scales follow, so it changes the shape, not the scale, of the output."
    ),
    "mult_errors": "MultiplierError: ``mult`` is not a finite number > 0.",
    "conv": (
        "stride: as in torch.\n"
        'padding: as in torch (``"same"`` and ``"valid"`` included).\n'
        "dilation: as in torch.\n"
        "groups: as in torch."
    ),
}
"""Each placeholder's text; continuation lines are indented relative to the first."""

_T = TypeVar("_T")
_PLACEHOLDER = re.compile(r"^([ \t]*)\{(" + "|".join(TEXTS) + r")\}[ \t]*$", re.MULTILINE)


def fill_docstring(obj: _T) -> _T:
    """Replace each placeholder line of ``obj``'s docstring by its text from :data:`TEXTS`, and return ``obj``.

    >>> from unitscale.scaling.docs import fill_docstring
    >>> class Op:
    ...     '''Raises:
    ...         {mult_errors}
    ...     '''
    >>> fill_docstring(Op).__doc__.split()[1]
    'MultiplierError:'
    """
    doc = obj.__doc__
    if doc:

        def fill(match: re.Match[str]) -> str:
            indent, name = match.group(1), match.group(2)
            return "\n".join(indent + line for line in TEXTS[name].splitlines())

        obj.__doc__ = _PLACEHOLDER.sub(fill, doc)
    return obj
