"""The reclaimer daemon: ``python -m reclaimer`` / ``streams-reclaimer``.

See :mod:`reclaimer.core` for what one pass does.
"""

from __future__ import annotations

from .core import CrawlPass, PassResult, Reclaimer
from .settings import ReclaimerSettings

__all__ = ["CrawlPass", "PassResult", "Reclaimer", "ReclaimerSettings"]
