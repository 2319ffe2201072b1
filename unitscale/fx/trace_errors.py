"""One place that turns a failed ``torch.fx`` trace into a :class:`~unitscale.errors.TraceError`
naming the line of the user's code that did it; the frame helpers it reads that line with.
"""

from __future__ import annotations

import traceback
import types
from pathlib import Path

from unitscale.errors import TraceError

__all__ = [
    "UNITSCALE_DIR",
    "TOOL_DIRS",
    "exception_chain",
    "is_machinery",
    "user_code_frame",
    "show_frame",
    "user_line",
    "user_frame",
    "trace_error",
]

#: unitscale's folder, and its tools' folders: they run models rather than being part of one, so
#: the torch calls their own code makes are the library's work (statistics, checks), not the model's.
UNITSCALE_DIR = str(Path(__file__).resolve().parents[1]).replace("\\", "/") + "/"
TOOL_DIRS = tuple(UNITSCALE_DIR + room + "/" for room in ("capture", "tracking", "transforms", "stages", "fx"))
_EXAMPLES = UNITSCALE_DIR + "examples/"


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, innermost last.

    >>> from unitscale.fx.trace_errors import exception_chain
    >>> try:
    ...     try:
    ...         1 / 0
    ...     except ZeroDivisionError as e:
    ...         raise ValueError("outer") from e
    ... except ValueError as e:
    ...     [type(x).__name__ for x in exception_chain(e)]
    ['ValueError', 'ZeroDivisionError']
    """
    chain = [exc]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and cause not in chain:
        chain.append(cause)
    return chain


def is_machinery(filename: str) -> bool:
    """Whether a frame of this file is torch's or unitscale's (its example models count as the user's)."""
    name = filename.replace("\\", "/")
    return "/torch/" in name or (name.startswith(UNITSCALE_DIR) and not name.startswith(_EXAMPLES))


_machinery: dict[str, bool] = {}


def user_code_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The innermost frame at or above ``frame`` that is not :func:`is_machinery`'s."""
    while frame is not None:
        name = frame.f_code.co_filename
        inside = _machinery.get(name)
        if inside is None:
            inside = _machinery[name] = is_machinery(name)
        if not inside:
            return frame
        frame = frame.f_back
    return None


def show_frame(filename: str, line: int) -> str:
    """``file:line``; a notebook cell's "file" is a temporary name that tells the reader nothing."""
    if "ipykernel_" in filename or filename.startswith("<"):
        return f"line {line} of a notebook cell"
    return f"{filename}:{line}"


def user_line(frame: types.FrameType | None) -> str:
    """``file:line`` of :func:`user_code_frame` (``""`` when every frame is machinery).

    >>> import sys
    >>> from unitscale.fx.trace_errors import user_line
    >>> user_line(sys._getframe())
    'line 1 of a notebook cell'
    """
    found = user_code_frame(frame)
    return "" if found is None else show_frame(found.f_code.co_filename, found.f_lineno)


def user_frame(exc: BaseException) -> str:
    """``file:line (`code`)`` of the innermost frame outside torch and unitscale, in ``exc`` or its causes.

    >>> from unitscale.fx.trace_errors import user_frame
    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError as e:
    ...     user_frame(e)
    'line 2 of a notebook cell (`1 / 0`)'
    """
    for e in reversed(exception_chain(exc)):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not is_machinery(f.filename)]
        if frames:
            f = frames[-1]
            return f"{show_frame(f.filename, f.lineno or 0)} (`{(f.line or '').strip()}`)"
    return "an unknown line"


def trace_error(what: str, failure: BaseException, advice: str) -> TraceError:
    """The ``TraceError`` for a failed trace of ``what``: ``failure``'s user line and innermost reason, then ``advice``.

    >>> from unitscale.fx.trace_errors import trace_error
    >>> try:
    ...     int("x")
    ... except ValueError as e:
    ...     message = str(trace_error("Net", e, "Fix it."))
    >>> for part in message.split(": "):
    ...     print(part)
    torch.fx could not trace Net at line 2 of a notebook cell (`int("x")`)
    invalid literal for int() with base 10
    'x'. Fix it.
    """
    reason = exception_chain(failure)[-1]
    return TraceError(f"torch.fx could not trace {what} at {user_frame(failure)}: {reason}. {advice}")
