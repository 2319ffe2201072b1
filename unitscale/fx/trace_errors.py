"""One place that turns a failed ``torch.fx`` trace into a :class:`~unitscale.errors.TraceError`.

A symbolic trace fails deep inside torch (a proxy used in an ``if``, a tensor value read
as a Python number); the user needs to know which line of *their* code did it. Every tool
that traces (the tracers, scale tracking, stage partitioning) builds its error here, so
each message has the same shape::

    torch.fx could not trace <what> at <file>:<line> (`<code>`): <why>. <what to do>

>>> import torch
>>> from unitscale.fx import DeepTracer
>>> class Branchy(torch.nn.Module):
...     def forward(self, x):
...         return x if x.sum() > 0 else -x
>>> try:
...     DeepTracer().trace(Branchy())
... except Exception as e:
...     print(type(e).__name__, str(e)[:40])
TraceError torch.fx could not trace Branchy at line
"""

from __future__ import annotations

import traceback

from unitscale.errors import TraceError

__all__ = ["exception_chain", "user_frame", "describe_failure", "trace_error"]


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


def user_frame(exc: BaseException) -> str:
    """``file:line (`code`)`` of the innermost frame outside torch and unitscale.

    Looks through the exceptions ``exc`` was raised from, innermost first: a wrapped
    trace failure keeps the user's line in its cause's traceback. A notebook cell is
    named as such (its file is a temporary name that tells the reader nothing).

    >>> from unitscale.fx.trace_errors import user_frame
    >>> try:
    ...     1 / 0
    ... except ZeroDivisionError as e:
    ...     user_frame(e)
    'line 2 of a notebook cell (`1 / 0`)'
    """
    for e in reversed(exception_chain(exc)):
        frames = [
            f
            for f in traceback.extract_tb(e.__traceback__)
            if "/torch/" not in f.filename and "/unitscale/" not in f.filename.replace("\\", "/")
        ]
        if frames:
            f = frames[-1]
            cell = "ipykernel_" in f.filename or f.filename.startswith("<")
            where = f"line {f.lineno} of a notebook cell" if cell else f"{f.filename}:{f.lineno}"
            return f"{where} (`{(f.line or '').strip()}`)"
    return "an unknown line"


def describe_failure(exc: BaseException) -> str:
    """``"<user's file:line (`code`)>: <innermost reason>"`` for a failed trace.

    >>> from unitscale.fx.trace_errors import describe_failure
    >>> try:
    ...     int("x")
    ... except ValueError as e:
    ...     print(describe_failure(e))  # doctest: +ELLIPSIS
    line 2 of a notebook cell (`int("x")`): invalid literal for int() with ...
    """
    return f"{user_frame(exc)}: {exception_chain(exc)[-1]}"


def trace_error(what: str, failure: BaseException | str, advice: str) -> TraceError:
    """The :class:`~unitscale.errors.TraceError` to raise when tracing ``what`` failed.

    Args:
        what: what was being traced, as the user knows it (``"Branchy"``, a class name).
        failure: the exception tracing raised, or a :func:`describe_failure` of it
            kept from earlier (a cached failure).
        advice: what the user can do, one or two sentences.

    Returns:
        The error, for ``raise trace_error(...) from exc``.

    >>> from unitscale.fx.trace_errors import trace_error
    >>> print(trace_error("Net", "model.py:3 (`if x:`): bool of a proxy", "Fix it."))
    torch.fx could not trace Net at model.py:3 (`if x:`): bool of a proxy. Fix it.
    """
    described = failure if isinstance(failure, str) else describe_failure(failure)
    return TraceError(f"torch.fx could not trace {what} at {described}. {advice}")
