"""The monitor daemon: ``python -m monitor`` / ``streams-monitor``.

A Prometheus exporter of every crawl's frontier, node liveness from the
workers' events and heartbeats, and webhook alerts. See :mod:`monitor.core`.
"""

from __future__ import annotations

from .core import Monitor, View
from .exporter import FAMILIES, metric_names
from .settings import MonitorSettings

__all__ = ["FAMILIES", "Monitor", "MonitorSettings", "View", "metric_names"]
