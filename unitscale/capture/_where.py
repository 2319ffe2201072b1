"""Where a failure or a node came from: the innermost frame outside torch, as ``file:line``.

One home for reading frames, so a route's failure reason and a node's ``source`` are
written the same way. Frames inside torch (and inside unitscale's own machinery, for
failures) say nothing to the user; the innermost other frame is the line they can change.
"""

from __future__ import annotations

import re
import traceback
import types
from collections.abc import Callable
from pathlib import Path

from unitscale.fx.trace_errors import exception_chain

__all__ = ["exception_summary", "failure_frame", "innermost_frame", "is_machinery", "show_frame", "user_code_frame"]

_TORCH = ("/torch/",)
_UNITSCALE = str(Path(__file__).resolve().parents[1]).replace("\\", "/") + "/"
_EXAMPLES = _UNITSCALE + "examples/"
_FRAME = re.compile(r'File "([^"]+)", line (-?\d+)')


def is_machinery(filename: str, skip_unitscale: bool) -> bool:
    name = filename.replace("\\", "/")
    if any(part in name for part in _TORCH):
        return True
    # The reference models in unitscale.examples are user code as far as a reader is concerned.
    return skip_unitscale and name.startswith(_UNITSCALE) and not name.startswith(_EXAMPLES)


_machinery: dict[str, bool] = {}


def user_code_frame(frame: types.FrameType | None) -> types.FrameType | None:
    """The innermost frame at or above ``frame`` that is neither torch's nor unitscale's machinery."""
    while frame is not None:
        name = frame.f_code.co_filename
        inside = _machinery.get(name)
        if inside is None:
            inside = _machinery[name] = is_machinery(name, skip_unitscale=True)
        if not inside:
            return frame
        frame = frame.f_back
    return None


def show_frame(filename: str, line: int) -> str:
    # A notebook cell's "file" is a temporary name that tells the reader nothing.
    if "ipykernel_" in filename or filename.startswith("<"):
        return f"line {line} of a notebook cell"
    return f"{filename}:{line}"


def innermost_frame(stack_trace: str | None) -> str:
    """``"file.py:LINE"`` of the innermost frame outside torch (and unitscale's tracers) in a ``stack_trace``.

    Falls back to the innermost frame of all when every frame is inside torch, and to
    ``""`` when there is none.

    >>> mine = 'File "/m/model.py", line 3, in f'
    >>> torchs = 'File "/x/torch/nn/linear.py", line 9, in g'
    >>> innermost_frame(mine + "\\n  " + torchs)
    '/m/model.py:3'
    """
    frames = [(f, int(n)) for f, n in _FRAME.findall(stack_trace or "") if int(n) > 0]
    if not frames:
        return ""
    outside = [f for f in frames if not is_machinery(f[0], skip_unitscale=True)]
    return show_frame(*(outside or frames)[-1])


def failure_frame(exc: BaseException) -> str:
    """``file:line (`code`)`` of the user's line that made ``exc``, or ``"an unknown line"``.

    Looks at the tracebacks of ``exc`` and the exceptions it came from (innermost first),
    then at ``File "...", line N`` lines in their messages: TorchDynamo runs the user's
    code as bytecode, so its errors name the user's line only in the message.
    """
    chain = exception_chain(exc)
    for e in reversed(chain):
        frames = [f for f in traceback.extract_tb(e.__traceback__) if not is_machinery(f.filename, True)]
        if frames:
            f = frames[-1]
            return f"{show_frame(f.filename, f.lineno or 0)} (`{(f.line or '').strip()}`)"
    for e in chain:
        found = [(f, int(n)) for f, n in _FRAME.findall(str(e)) if not is_machinery(f, True) and int(n) > 0]
        if found:
            return show_frame(*found[-1])
    return "an unknown line"


def exception_summary(exc: BaseException, limit: int = 400, fallback: Callable[[], str] | None = None) -> str:
    """``"TypeName: first lines of the message (at file:line (`code`))"``, for a route's reason.

    ``fallback()`` names the place when no frame outside torch is found (the forward's
    line); called only then, as reading a source file costs more than the rest.

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
