"""One clear line when a worker cannot start.

Scrapy reports an exception raised while a crawl starts with two or three
tracebacks (the failed deferred, then components closing that never opened),
and the setting at fault ends up somewhere in the middle. :func:`fail_clearly`
wraps the scheduler's start-up steps: a :class:`StreamsSchedError` (a bad
setting, Redis unreachable, wrong credentials, a dedupe back-end mismatch, an
incompatible Scrapy) is logged once, at CRITICAL, as one line that names the
setting and the value, then re-raised so the crawl fails and ``scrapy crawl``
exits 1. The re-raised exception carries no frames of ours.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import StreamsSchedError

__all__ = ["fail_clearly"]

logger = logging.getLogger("streams_sched")

F = TypeVar("F", bound=Callable[..., Any])


def fail_clearly(func: F) -> F:
    """Log a StreamsSchedError raised by ``func`` as one CRITICAL line, then re-raise it."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StreamsSchedError as exc:
            if not getattr(exc, "_streams_logged", False):
                logger.critical("streams-sched cannot start: %s", exc)
                exc._streams_logged = True  # type: ignore[attr-defined]
            raise exc.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]
