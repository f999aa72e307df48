"""The reclaimer daemon: ``python -m reclaimer`` / ``streams-reclaimer``.

See :mod:`reclaimer.core` for what one pass does; :mod:`.prune` removes gone consumers,
:mod:`.logic` holds the pure decisions, :mod:`.results` and :mod:`.metrics` what a pass
reports.
"""

from __future__ import annotations

from .core import Reclaimer
from .results import CrawlPass, PassResult
from .settings import ReclaimerSettings

__all__ = ["CrawlPass", "PassResult", "Reclaimer", "ReclaimerSettings"]
