"""The statistic every benchmark records: the median of ``n`` measurements, with their min and max.

>>> from spread import spread
>>> spread("ratio", [1.2, 1.0, 1.1])
{'ratio': 1.1, 'ratio min': 1.0, 'ratio max': 1.2}
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

__all__ = ["STATISTIC", "spread"]

#: what a recorded value is, said once in the recording's header
STATISTIC = "median of n, with min and max (columns '<name> min' and '<name> max'; n in each row)"


def spread(name: str, values: Iterable[float]) -> dict[str, float]:
    """``name``: the median of ``values``; ``name min`` and ``name max``: their least and greatest."""
    values = list(values)
    return {name: statistics.median(values), f"{name} min": min(values), f"{name} max": max(values)}
