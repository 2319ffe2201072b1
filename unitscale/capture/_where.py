"""Where a failure or a node came from, as ``file:line``: a route's reason, a node's ``source``."""

from __future__ import annotations

import re
from collections.abc import Callable

from unitscale.fx.trace_errors import exception_chain, is_machinery, show_frame, user_frame

__all__ = ["exception_summary", "failure_frame", "innermost_frame"]

_FRAME = re.compile(r'File "([^"]+)", line (-?\d+)')


def innermost_frame(stack_trace: str | None) -> str:
    """``"file.py:LINE"`` of the innermost frame outside torch and unitscale in a ``stack_trace``, else of all.

    >>> mine = 'File "/m/model.py", line 3, in f'
    >>> torchs = 'File "/x/torch/nn/linear.py", line 9, in g'
    >>> innermost_frame(mine + "\\n  " + torchs)
    '/m/model.py:3'
    """
    frames = [(f, int(n)) for f, n in _FRAME.findall(stack_trace or "") if int(n) > 0]
    if not frames:
        return ""
    outside = [f for f in frames if not is_machinery(f[0])]
    return show_frame(*(outside or frames)[-1])


def failure_frame(exc: BaseException) -> str:
    """``file:line (`code`)`` of the user's line that made ``exc`` (from the tracebacks, else the messages)."""
    where = user_frame(exc)
    if where != "an unknown line":
        return where
    for e in exception_chain(exc):
        found = [(f, int(n)) for f, n in _FRAME.findall(str(e)) if not is_machinery(f) and int(n) > 0]
        if found:
            return show_frame(*found[-1])
    return "an unknown line"


def exception_summary(exc: BaseException, limit: int = 400, fallback: Callable[[], str] | None = None) -> str:
    """``"TypeName: first lines of the message (at file:line (`code`))"``, for a route's reason.

    ``fallback()`` names the place when no frame outside torch is found (called only then: it costs).

    >>> try:
    ...     int("x")
    ... except ValueError as e:
    ...     print(exception_summary(e).split(" (at ")[0])
    ValueError: invalid literal for int() with base 10: 'x'
    """
    message = " ".join(line.strip() for line in str(exc).strip().splitlines()[:6] if line.strip())
    if len(message) > limit:
        message = message[: limit - 3] + "..."
    where = failure_frame(exc)
    if where == "an unknown line" and fallback is not None:
        where = fallback() or where
    if where in message:  # our own TraceError names the line already
        return f"{type(exc).__name__}: {message}"
    return f"{type(exc).__name__}: {message} (at {where})"
