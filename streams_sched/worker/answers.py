"""What a worker learns from each answer, and tells the whole cluster (reactor thread).

Every answer goes to its site's shared politeness state: the I/O thread batches them
for feedback.lua. A 429 or 503 is a congestion signal, and its ``Retry-After`` delays
the retry of the request and pauses the site for every worker; a download timeout is a
congestion signal too; a robots.txt ``Crawl-delay`` becomes the site's shared rate. A
browser task whose render failed ends its delivery as failed (renders.py), and the
render times of browser tasks feed the node record and the worker's metrics.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.utils.httpobj import urlparse_cached

from streams_sched.config import StreamsConfig
from streams_sched.errors import SerializationError
from streams_sched.frontier.keys import BROWSER_FIRST_STREAM
from streams_sched.frontier.records import LeasedEntry
from streams_sched.politeness.adaptive import (
    THROTTLE_STATUSES,
    crawl_delay_of,
    is_timeout,
    robots_body_crawl_delay,
)
from streams_sched.politeness.retry_after import retry_after_s
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.renders import close_page, failure_text, is_render_failure

if TYPE_CHECKING:
    from scrapy.http import Response

__all__ = ["Answers", "RobotsAgent", "is_robots_request"]

logger = logging.getLogger(__name__)


def is_robots_request(request: Request) -> bool:
    """RobotsTxtMiddleware's own robots.txt request."""
    return bool(request.meta.get("dont_obey_robotstxt")) and urlparse_cached(request).path == "/robots.txt"


class RobotsAgent:
    """Whether robots.txt is obeyed, and the user agent RobotsTxtMiddleware asks it about."""

    def __init__(self, obey: bool, robots_user_agent: str = "", user_agent: str = "") -> None:
        self.obey = obey
        self.robots_user_agent = robots_user_agent
        self.user_agent = user_agent
        # Scrapy sends robots_parsed (with the parser of ROBOTSTXT_PARSER) only in its
        # newer versions; with the older ones the robots.txt answer is read here with Protego.
        self.from_body = obey and not hasattr(signals, "robots_parsed")

    def of(self, request: Request) -> str:
        if self.robots_user_agent:
            return self.robots_user_agent
        header = request.headers.get(b"User-Agent")
        return (header.decode("latin-1") if header else self.user_agent) or "*"


class Answers:
    """The scheduler's handlers of Scrapy's download signals."""

    def __init__(
        self, config: StreamsConfig, robots: RobotsAgent, *, lease_of: Callable[[Request], LeasedEntry | None],
        slot_leaving: Callable[[Request], None], site_of: Callable[[Request, dict[str, Any]], str],
        inc: Callable[[str], None],
    ) -> None:
        """``lease_of``: the lease a request holds (the scheduler's); ``slot_leaving``: a
        request leaves its downloader slot (the ready queues'); ``site_of``: a request's
        site; ``inc``: count a crawl stat."""
        self.config = config
        self.robots = robots
        self.lease_of = lease_of
        self.slot_leaving = slot_leaving
        self.site_of = site_of
        self.inc = inc
        #: the Exchange while the worker runs (:meth:`start`, :meth:`stop`)
        self.exchange: Exchange | None = None
        self.spider: Spider | None = None
        #: browser tasks whose download failed on this delivery -> what went wrong (their
        #: lease ends as a failed delivery), or None: hand the lease back (renders.py)
        self.failed: dict[Request, str | None] = {}
        #: of those, the ones given back to the engine to end their download: taken by
        #: enqueue_request without being sent anywhere
        self.swallowed: set[Request] = set()
        self.shutting_down = False
        #: browser tasks in the downloader -> time.monotonic() when they reached it
        self.rendering: dict[Request, float] = {}
        #: called with (request, seconds in the downloader) for every browser task that
        #: leaves the downloader, rendered or not
        self.render_listeners: list[Callable[[Request, float], None]] = []
        #: Redis time in epoch seconds, read without a round trip (the frontier's
        #: ``clock.estimate`` once the worker is open): the clock of ``meta["not_before"]``
        #: and of Retry-After dates
        self.redis_now: Callable[[], float] = time.time

    def connect(self, crawler: Any, on_download_error: Callable[[Callable[..., Any]], None]) -> None:
        """Listen to the crawler's signals this worker learns from."""
        connect = crawler.signals.connect
        connect(self.on_response_downloaded, signals.response_downloaded)
        on_download_error(self.on_download_error)
        if "browser" in self.config.capabilities:
            connect(self.on_reached_downloader, signals.request_reached_downloader)
            connect(self.on_left_downloader, signals.request_left_downloader)
        robots_parsed = getattr(signals, "robots_parsed", None)
        if self.robots.obey and robots_parsed is not None:
            connect(self.on_robots_parsed, robots_parsed)

    def start(self, spider: Spider, exchange: Exchange, redis_now: Callable[[], float]) -> None:
        """The worker runs: answers go to ``exchange``, times are read on ``redis_now``."""
        self.spider = spider
        self.exchange = exchange
        self.redis_now = redis_now

    def begin_shutdown(self) -> None:
        """The worker is closing: a failed render hands its lease back instead of failing it."""
        self.shutting_down = True

    def stop(self) -> None:
        """The worker closed: forget what was in flight."""
        self.exchange = None
        self.failed.clear()
        self.swallowed.clear()
        self.rendering.clear()

    def take_swallowed(self, request: Request) -> bool:
        """Whether ``request`` is a browser task given back to the engine only to end its
        download (the scheduler takes it without sending it anywhere)."""
        swallowed = self.swallowed
        if swallowed and request in swallowed:
            swallowed.discard(request)
            return True
        return False

    def take_failure(self, request: Request) -> tuple[bool, str | None]:
        """(whether ``request``'s delivery failed here, what went wrong: None to hand the
        lease back instead)"""
        failed = self.failed
        if failed and request in failed:
            return True, failed.pop(request)
        return False, None

    def _site(self, request: Request) -> str | None:
        entry = self.lease_of(request)
        if entry is not None:
            return entry.site
        try:
            return self.site_of(request, request.meta)
        except SerializationError:
            return None

    def on_response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        """Every answer goes to the site's shared politeness state (I/O thread -> feedback.lua);
        a 429 / 503 with Retry-After also delays the retry of this request."""
        self.slot_leaving(request)
        x = self.exchange
        if self.robots.from_body and is_robots_request(request):
            self._report_robots(request, robots_body_crawl_delay(response.body, self.robots.of(request)))
        if response.status not in THROTTLE_STATUSES:
            if x is not None and self.config.adaptive:
                site = self._site(request)
                if site is not None:
                    x.feedback.append((site, "ok", 1))
            return
        now = self.redis_now()
        delay = retry_after_s(response.headers.get(b"Retry-After"), now, self.config.retry_after_max_seconds)
        if delay:
            # RetryMiddleware copies the meta into the retry request, which then waits
            # in the site's delay queue until Retry-After has passed. Redis time: whichever
            # worker enqueues a copy of this meta (a retry of the retry, say) reads it on
            # the same clock, so a stale not_before is in the past for every worker.
            request.meta["not_before"] = now + delay
            self.inc("streams/retry_after")
        if x is not None:
            site = self._site(request)
            if site is not None:
                x.feedback.append((site, "throttled", int((delay or 0) * 1000)))
                x.kick()

    def on_download_error(self, request: Request, exc: BaseException) -> Request | None:
        """A download failed: a timeout is a congestion signal; a robots.txt that could
        not be fetched means no Crawl-delay (as Scrapy then allows everything); a browser
        task's failure ends its delivery (:meth:`_render_failed`). Returns the request to
        end the download with (the engine schedules it again), or None to let Scrapy's
        middlewares and the errback handle the error."""
        self.slot_leaving(request)
        x = self.exchange
        if x is None:
            return None
        site = self._site(request)
        if site is not None:
            if self.robots.obey and is_robots_request(request):
                x.feedback.append((site, "robots", "0"))
                x.kick()
            elif is_timeout(exc) and self.config.adaptive:
                x.feedback.append((site, "timeout", 1))
                x.kick()
        entry = self.lease_of(request)
        if entry is not None and entry.stream >= BROWSER_FIRST_STREAM and is_render_failure(exc):
            return self._render_failed(request, entry, exc)
        return None

    def _render_failed(self, request: Request, entry: LeasedEntry, exc: BaseException) -> Request | None:
        """A browser task did not render on this delivery (renders.py): its lease ends as a
        failed delivery. Short of the last delivery the error goes no further (the request
        is given back to end the download quietly); the last one goes on to Scrapy's own
        handling, and the entry to the dead-letter stream."""
        self.inc("streams/render_failed")
        if self.shutting_down:
            self.failed[request] = None
            return self._swallow(request)
        what = failure_text(exc)
        self.failed[request] = what
        delivery, limit = entry.deliveries + 1, self.config.max_deliveries
        last = delivery >= limit
        logger.warning(
            "browser task %s failed on its delivery %d of %d (STREAMS_MAX_DELIVERIES): %s; %s", request,
            delivery, limit, what, "it goes to the dead-letter stream" if last else "back to the frontier for another delivery",
            extra={"spider": self.spider},
        )
        return None if last else self._swallow(request)

    def _swallow(self, request: Request) -> Request:
        close_page(request.meta)
        self.swallowed.add(request)
        return request

    def on_reached_downloader(self, request: Request, spider: Spider) -> None:
        if request.meta.get("task_type") == "browser":
            self.rendering[request] = time.monotonic()

    def on_left_downloader(self, request: Request, spider: Spider) -> None:
        """A browser task left the downloader: its render time (for the node record and
        the worker's metrics)."""
        started = self.rendering.pop(request, None)
        if started is None:
            return
        seconds = time.monotonic() - started
        x = self.exchange
        if x is not None:
            x.renders += 1
            x.render_s += seconds
        for listener in self.render_listeners:
            listener(request, seconds)

    def on_robots_parsed(self, robotparser: Any, request: Request, **_: Any) -> None:
        """A worker read a host's robots.txt (Scrapy's robots_parsed signal)."""
        self._report_robots(request, crawl_delay_of(robotparser, self.robots.of(request)))

    def _report_robots(self, request: Request, delay: float | None) -> None:
        """A site's Crawl-delay (capped at STREAMS_MAX_CRAWL_DELAY; '0' = none) becomes its
        shared rate across all workers, unless its policy sets a rate (lease.lua)."""
        x = self.exchange
        site = self._site(request)
        if x is None or site is None:
            return
        if delay is not None:
            delay = min(delay, self.config.max_crawl_delay_seconds)
            self.inc("streams/robots_crawl_delay")
        x.feedback.append((site, "robots", repr(delay) if delay else "0"))
        x.kick()
