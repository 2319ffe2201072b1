"""Scale tracking: the std of every tensor in forward and backward, as a report or annotated code.

>>> import torch
>>> from unitscale.tracking import track_scales
>>> report = track_scales(torch.nn.Linear(4, 4), torch.randn(8, 4))
>>> [row.node for row in report]
['input_1', 'weight', 'bias', 'linear']
"""

from unitscale.tracking.analysis import analyse_module as analyse_module
from unitscale.tracking.analysis import track_scales as track_scales
from unitscale.tracking.annotated import AnnotatedCode as AnnotatedCode
from unitscale.tracking.compiled import ScaleTrackingInterpreter as ScaleTrackingInterpreter
from unitscale.tracking.format_casts import CastStats as CastStats
from unitscale.tracking.format_casts import cast_stats as cast_stats
from unitscale.tracking.history import Drift as Drift
from unitscale.tracking.history import DriftTable as DriftTable
from unitscale.tracking.history import MonitorRecord as MonitorRecord
from unitscale.tracking.history import ScaleHistory as ScaleHistory
from unitscale.tracking.monitor import ScaleMonitor as ScaleMonitor
from unitscale.tracking.report import FORMAT_RANGES as FORMAT_RANGES
from unitscale.tracking.report import ScalePair as ScalePair
from unitscale.tracking.report import ScaleReport as ScaleReport
from unitscale.tracking.report import ScaleRow as ScaleRow
from unitscale.tracking.report import read_rows as read_rows
from unitscale.tracking.stats import ScaleRecord as ScaleRecord
from unitscale.tracking.stats import ScaleTracker as ScaleTracker
from unitscale.tracking.stats import std_stat as std_stat

__all__ = [
    "ScalePair",
    "ScaleTracker",
    "ScaleRecord",
    "ScaleTrackingInterpreter",
    "analyse_module",
    "track_scales",
    "ScaleReport",
    "ScaleRow",
    "AnnotatedCode",
    "FORMAT_RANGES",
    "ScaleMonitor",
    "ScaleHistory",
    "MonitorRecord",
    "DriftTable",
    "Drift",
    "CastStats",
    "cast_stats",
    "std_stat",
    "read_rows",
]
