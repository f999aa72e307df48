"""Browser tasks in a worker: what a failed render becomes, and how long renders take.

A browser task is a request leased from one of a site's browser streams. When
its download raises (scrapy-playwright's navigation timeout, a tab that
crashed, a browser that died), that delivery failed, not the request: a page
that times out on a busy node often renders on the next. So the scheduler ends
the lease as a failed delivery (ops.Failed, lua/fail.lua): the entry goes back
to its stream with the delivery counted, for any worker with the browser
capability, and once it has had ``STREAMS_MAX_DELIVERIES`` it goes to the
dead-letter stream with the error as its reason.

Only the last delivery reaches Scrapy's own handling (RetryMiddleware, the
request's errback, the "Error downloading" log line), so a spider sees one
failure per request, as it would without streams-sched. The earlier ones are
given back to the engine as the download's result (a downloader middleware may
return a request: the engine schedules it), and the scheduler takes that
request without sending it anywhere; a page the download kept for the callback
(``playwright_include_page``) is closed, as nobody will get it.

A worker that is stopping hands such leases back unchanged: its browser goes
down with it (systemd stops the unit's whole control group), which says nothing
about the page.

IgnoreRequest is no failed render (a middleware decided not to download).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from scrapy.exceptions import IgnoreRequest

__all__ = ["MAX_REASON_CHARS", "close_page", "failure_text", "is_render_failure"]

logger = logging.getLogger(__name__)

#: the longest error text kept in a dead letter's reason
MAX_REASON_CHARS = 300


def is_render_failure(exc: BaseException) -> bool:
    """Whether a browser task's download error is a failed delivery."""
    return not isinstance(exc, IgnoreRequest)


def failure_text(exc: BaseException) -> str:
    """``TimeoutError: Page.goto: Timeout 1000ms exceeded.``: the error's class and the
    first line of its message (Playwright adds a multi-line call log after it)."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 3] + "..."


def close_page(meta: dict[str, Any]) -> None:
    """Close the browser page a failed download left in ``meta`` for its callback
    (scrapy-playwright's ``playwright_page``), without waiting for it."""
    page = meta.pop("playwright_page", None)
    close = getattr(page, "close", None)
    if close is None:
        return
    try:
        result = close()
        if inspect.isawaitable(result):
            from scrapy.utils.defer import deferred_from_coro

            deferred_from_coro(result).addErrback(lambda failure: logger.debug("closing a page: %s", failure.value))
    except Exception as exc:  # the page or its browser is gone already
        logger.debug("closing a page: %s", exc)
