"""The Scrapy scheduler: a shared crawl frontier on Redis Streams consumer groups.

Enable it with two settings::

    SCHEDULER = "streams_sched.scheduler.StreamsScheduler"
    REDIS_URL = "redis://localhost:6379/0"

How it behaves (the guarantees are in the docs, "Guarantees"). The scheduler is the
Scrapy-facing side; it keeps its parts in modules of their own: ready.py (the ready
requests per site, in fair order), answers.py (what each answer tells the cluster),
dedupe.py (what this worker already sent), counters.py, opening.py (start-up), and the
I/O thread in :mod:`streams_sched.worker.io`.

- ``enqueue_request`` fingerprints the request with ``crawler.request_fingerprinter``,
  makes its ``Entry`` on the one path every producer takes (frontier/entries.py: site,
  stream, msgpack payload) and queues it for the I/O thread
  (io/cycle.py) in the ``Exchange`` they share (exchange.py); it never touches
  Redis. The I/O thread sends it through ``enqueue.lua``, which dedupes it
  (Bloom filter) and adds it to the site's stream for its band in one atomic
  step. A fingerprint this worker already sent is dropped locally.
- ``next_request`` pops a prefetched request: the I/O thread leases small
  batches with ``lease.lua`` (XREADGROUP) ahead of demand, so the reactor
  never waits on Redis.
- A request is acked (an ``Ack``, sent by ``ack.lua``: XACK + XDEL) once the
  engine is done with it: its download, its callback or errback, every
  follow-up request it yielded (already sent to Redis before the ack) and its
  items through the pipelines.
- Leases that expire (a worker died) are taken over with XAUTOCLAIM by a
  worker with nothing else to do, or by the reclaimer daemon; an entry
  delivered more than STREAMS_MAX_DELIVERIES times goes to the dead-letter stream.
- The worker closes only when the whole crawl is drained (no backlog, lease
  or delayed request anywhere), unless STREAMS_CLOSE_ON_DRAIN is False.
- Closing never deletes shared state; prefetched requests not started are
  handed back at once.
- A request the codec cannot encode (a lambda callback, a Response in meta, over
  STREAMS_MAX_REQUEST_BYTES) is kept in this worker's memory and crawled here
  (STREAMS_UNSERIALIZABLE="local", see unserializable.py), served among the
  leased requests of its site, without a lease; the worker does not close while
  it holds any. With "error" it is refused and the crawl exits with code 1.
- A browser task whose download raises (a render that timed out, a crashed tab)
  ends its lease as a failed delivery: retried by the frontier, dead-lettered
  with the error after STREAMS_MAX_DELIVERIES (renders.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.httpobj import urlparse_cached

from streams_sched import __version__
from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import redact
from streams_sched.errors import SerializationError
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import FINGERPRINT_BYTES, entry_for, fingerprint_of, site_for
from streams_sched.frontier.records import LeasedEntry
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.answers import Answers, RobotsAgent
from streams_sched.worker.counters import Counters
from streams_sched.worker.dedupe import LocalDedupe
from streams_sched.worker.drain import work_left
from streams_sched.worker.engine import EngineHooks, check_scrapy, tolerate_stop_before_start
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.handback import hand_back_in_progress, hand_back_unstarted
from streams_sched.worker.io.cycle import IOThread, make_node_id
from streams_sched.worker.opening import (
    announce,
    check_server,
    connect_worker,
    feed_mover,
    node_info,
    set_up_crawl,
)
from streams_sched.worker.ops import Ack, Extend, Failed, Op, Release
from streams_sched.worker.ready import ReadyQueues
from streams_sched.worker.revisits import Revisits
from streams_sched.worker.start_wait import open_when_writable
from streams_sched.worker.startup import fail_clearly
from streams_sched.worker.turns import HANDOUT_PER_TURN, TurnBudget
from streams_sched.worker.unserializable import UnserializablePolicy
from streams_sched.worker.watchdog import Watchdog

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.defer import Deferred
    from twisted.python.failure import Failure

__all__ = ["Limits", "StreamsScheduler"]

logger = logging.getLogger(__name__)


class Fingerprinter(Protocol):
    def fingerprint(self, request: Request) -> bytes: ...


class Limits(NamedTuple):
    """The engine's limits a worker leases for: CONCURRENT_REQUESTS,
    CONCURRENT_REQUESTS_PER_DOMAIN and DOWNLOAD_DELAY."""

    concurrency: int = 16
    per_site: int = 8
    download_delay: float = 0.0


DEFAULT_LIMITS = Limits()


class StreamsScheduler(BaseScheduler):
    """A Scrapy scheduler whose queue is a Redis Streams crawl frontier shared by many workers."""

    #: fingerprints travel as 20 bytes (a SHA-1, Scrapy's default); others are hashed to that
    FINGERPRINT_BYTES = FINGERPRINT_BYTES
    #: move the hot-path counters into the crawl stats every this many dequeues
    STATS_EVERY_DEQUEUES = 256
    #: requests handed to the engine per turn of the event loop (turns.py says why)
    HANDOUT_PER_TURN = HANDOUT_PER_TURN

    def __init__(
        self,
        config: StreamsConfig,
        *,
        fingerprinter: Fingerprinter,
        stats: StatsCollector | None = None,
        crawler: Crawler | None = None,
        limits: Limits = DEFAULT_LIMITS,
        dupefilter_debug: bool = False,
        robots: RobotsAgent | None = None,
        io_thread: bool = True,
    ) -> None:
        """``io_thread=False`` opens without starting the I/O thread: the caller runs its
        cycles with ``io.run_cycle()`` (an in-process test harness, tests/harness.py)."""
        self.config = config
        self._start_io_thread = io_thread
        self.fingerprinter = fingerprinter
        self.crawler = crawler
        self.limits = limits
        self.counts = Counters(stats)
        self._site_key = site_keyer(config.site_key)
        self.node_id = config.node_id or make_node_id()
        self.dedupe = LocalDedupe(config.local_seen_cache, fingerprinter, config.url_shortcut, dupefilter_debug)
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.codec: RequestCodec | None = None
        #: the I/O thread; the scheduler only starts and stops it
        self._io: IOThread | None = None
        self._hooks: EngineHooks | None = None
        self.turn = TurnBudget(self.HANDOUT_PER_TURN)
        self.ready = ReadyQueues()
        self._leases: dict[Request, LeasedEntry] = {}
        #: requests that cannot travel (see unserializable.py): kept in the ready queues with no lease
        self.unserializable = UnserializablePolicy(config.unserializable, config.crawl)
        self.answers = Answers(
            config, robots or RobotsAgent(False), lease_of=self._leases.get, slot_leaving=self.ready.slot_leaving,
            site_of=self._site_of, inc=self.counts.inc,
        )
        #: everything the scheduler and the I/O thread share (exchange.py), while open
        self._x: Exchange | None = None
        #: tracked pages in flight and the acks that carry their next visits; built in open()
        self.revisits: Revisits | None = None
        #: called on the reactor thread with (entry, seconds from lease to ack) for every ack
        self.ack_listeners: list[Callable[[LeasedEntry, float], None]] = []
        self._fatal_reported = False
        self._moved_reported = False
        #: notices an I/O cycle that never returns (watchdog.py); built in open()
        self.watchdog: Watchdog | None = None

    @classmethod
    @fail_clearly
    def from_crawler(cls, crawler: Crawler) -> StreamsScheduler:
        settings = crawler.settings
        spider_name = crawler.spider.name if crawler.spider is not None else None
        config = StreamsConfig.from_settings(settings, spider_name)
        check_scrapy(allow_untested=config.allow_untested_scrapy)
        scheduler = cls(
            config,
            fingerprinter=crawler.request_fingerprinter,
            stats=crawler.stats,
            crawler=crawler,
            limits=Limits(
                settings.getint("CONCURRENT_REQUESTS"),
                settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") or settings.getint("CONCURRENT_REQUESTS"),
                settings.getfloat("DOWNLOAD_DELAY"),
            ),
            dupefilter_debug=settings.getbool("DUPEFILTER_DEBUG"),
            robots=RobotsAgent(
                settings.getbool("ROBOTSTXT_OBEY"),
                settings.get("ROBOTSTXT_USER_AGENT") or "",
                settings.get("USER_AGENT") or "",
            ),
        )
        from streams_sched.worker.metrics import attach_worker_metrics

        attach_worker_metrics(crawler, scheduler)  # only when STREAMS_METRICS_PORT is set
        return scheduler

    @property
    def io(self) -> IOThread | None:
        """The I/O thread, while open (for tests and tools that drive or inspect its cycles)."""
        return self._io

    @property
    def render_listeners(self) -> list[Callable[[Request, float], None]]:
        """Called on the reactor thread with (request, seconds in the downloader) for every
        browser task that leaves the downloader, rendered or not."""
        return self.answers.render_listeners

    # -- lifecycle ------------------------------------------------------------

    @fail_clearly
    def open(self, spider: Spider) -> Deferred[None] | None:
        """Connect and set the crawl up, then start the I/O thread. None once started; a
        Deferred that fires once started if Redis refuses writes for now (start_wait.py)."""
        cfg = self.config
        self.spider = spider
        self.codec = codec = RequestCodec(spider, cfg.request_classes, cfg.max_request_bytes, cfg.meta_classes, cfg.meta_codecs)
        self.unserializable = UnserializablePolicy(cfg.unserializable, spider.name, spider)
        self.revisits = Revisits(cfg, codec, self._holds_tracked)
        client = connect_worker(cfg)
        checked: list[bool] = []

        def set_up() -> tuple[Frontier, dict[str, Any]]:
            # every write of the start, each safe to repeat while Redis refuses writes; the
            # checks of the server before them until they pass once (they only read)
            if not checked:
                check_server(client, cfg)
                checked.append(True)
            frontier = set_up_crawl(client, cfg, self.answers.robots.obey)
            info = node_info(cfg, frontier.clock.now())
            announce(frontier, cfg, self.node_id, info)
            return frontier, info

        waiting = open_when_writable(
            set_up, lambda opened: self._start(spider, codec, *opened), f"Redis at {redact(cfg.redis_url)}", self._start_failed,
        )
        if waiting is not None and self.crawler is not None:
            tolerate_stop_before_start(self.crawler)  # a SIGTERM may come before the engine starts
        return waiting

    def _start(self, spider: Spider, codec: RequestCodec, frontier: Frontier, info: dict[str, Any]) -> None:
        """The crawl is set up in Redis and the node announced: start the I/O thread."""
        cfg = self.config
        self.frontier = frontier
        x = self._x = self.ready.exchange = Exchange()
        self.answers.start(spider, x, frontier.clock.estimate)
        if self.revisits is not None:
            self.revisits.crawl_stopped = lambda: frontier.revisits_stopped
        # longer than any cycle that is only slow: every command of it may take a socket timeout
        self.watchdog = Watchdog(x, max(cfg.lease_seconds, 3 * cfg.socket_timeout_seconds))
        # in the node record: lost if this worker dies
        x.local_count = lambda: self.local_held
        self._io = IOThread(
            frontier,
            cfg,
            codec,
            self.node_id,
            concurrency=self.limits.concurrency,
            per_site_concurrency=self.limits.per_site,
            download_delay=self.limits.download_delay,
            node_info=info,
            exchange=x,
            feed=feed_mover(cfg, spider, frontier, codec, self.fingerprinter, self.crawler, self.node_id, self._site_key),
        )
        if self.crawler is not None:
            self._hook_engine(self.crawler, x)
        self._io.refresh_policy()
        if self._start_io_thread:
            self._io.start()
        logger.info(
            "streams-sched %s opened: crawl=%s node=%s redis=%s dedupe=%s lease_s=%g"
            " max_deliveries=%d band_ratio=%s close_on_drain=%s",
            __version__, cfg.crawl, self.node_id, redact(cfg.redis_url),
            "redisbloom" if frontier.bloom.mode == "bf" else "bitmap",
            cfg.lease_seconds, cfg.max_deliveries, ":".join(map(str, cfg.band_ratio)), cfg.close_on_drain,
        )

    @fail_clearly
    def _start_failed(self, failure: Failure) -> None:
        """The start failed after waiting for Redis to accept writes: one line, as at once."""
        failure.raiseException()

    def _hook_engine(self, crawler: Crawler, x: Exchange) -> None:
        cfg = self.config
        hooks = self._hooks = self.turn.hooks = EngineHooks(
            crawler, self, self.request_done, fail_at_end=cfg.unserializable == "error"
        )
        hooks.on_closing(self._begin_shutdown, cfg.shutdown_timeout_seconds, self._shutdown_timed_out)
        self.ready.downloader = getattr(crawler.engine, "downloader", None)
        x.wake = hooks.wake
        self.answers.connect(crawler, hooks.on_download_error)
        revisits = self.revisits
        if revisits is not None:
            # from the first tracked request on (Revisits.handed_out), before its answer
            revisits.listen = lambda: crawler.signals.connect(revisits.on_response, signals.response_received)
        if not cfg.close_on_drain:
            crawler.signals.connect(self._on_spider_idle, signals.spider_idle)

    def close(self, reason: str) -> None:
        io = self._io
        if io is None:
            return
        io.begin_close()
        unstarted = self._hand_back_unstarted() + self._hand_back_in_progress()
        self.ready.local_busy.clear()
        self.ready.busy.clear()
        self.answers.stop()
        if self.revisits is not None:
            self.revisits.clear()  # answers and URLs of tracked pages whose leases were handed back
        flushed = io.finish(timeout=30.0)
        self.counts.apply(self._x)
        self._io = None
        self._x = self.ready.exchange = None
        failure = self.unserializable.failure()
        if failure is not None:
            logger.error("%s", failure, extra={"spider": self.spider})
            if self._hooks is not None:
                self._hooks.fail_crawl(failure)
        if self._hooks is not None:
            self._hooks.unhook()
            self._hooks = self.turn.hooks = None
        logger.info(
            "streams-sched closed (%s): node=%s handed back %d unstarted leases; all acks sent: %s",
            reason, self.node_id, unstarted, flushed,
        )

    def _begin_shutdown(self) -> None:
        """The spider is closing (SIGTERM, Ctrl-C, CLOSESPIDER_*): lease nothing more and
        hand back at once what was prefetched, so other workers get it without waiting
        for the lease to expire. Requests in progress may finish (see _shutdown_timed_out)."""
        if self._io is None:
            return
        self.answers.begin_shutdown()
        self._io.stop_leasing()
        n = self._hand_back_unstarted()
        if n or self._leases:
            logger.info(
                "streams-sched closing: stopped leasing, handed back %d unstarted leases; waiting up to"
                " %gs (STREAMS_SHUTDOWN_TIMEOUT_SECONDS) for %d requests in progress",
                n, self.config.shutdown_timeout_seconds, len(self._leases),
            )

    def _hand_back_unstarted(self) -> int:
        return hand_back_unstarted(self.ready, self._put, self.counts, self.spider)

    def _hand_back_in_progress(self) -> int:
        n = hand_back_in_progress(self._leases, self.ready, self._put, self._x)
        if self._x is not None:
            self._x.inflight = 0
        return n

    def _shutdown_timed_out(self, in_progress: int) -> None:
        n = self._hand_back_in_progress()
        self.counts.inc("streams/shutdown_handed_back", n)
        logger.warning(
            "streams-sched: %d requests still in progress after STREAMS_SHUTDOWN_TIMEOUT_SECONDS=%g;"
            " handed back their %d leases for other workers and closing anyway",
            in_progress, self.config.shutdown_timeout_seconds, n,
        )

    # -- Scrapy's scheduler interface ------------------------------------------

    def has_pending_requests(self) -> bool:
        x = self._x
        if x is None:
            return False
        if x.fatal is not None:
            self._report_fatal()
            return False
        if x.moved is not None:
            self._report_moved(x.moved)
            return True  # closing already, for its own reason: not "finished"
        if self.watchdog is not None:
            self.watchdog.check()
        held_here = bool(self.ready.count or self._leases or self.ready.local_busy)
        return work_left(x, held_here=held_here, enqueued=self.counts.enqueued)

    def enqueue_request(self, request: Request) -> bool:
        codec = self.codec
        if codec is None:
            raise RuntimeError("StreamsScheduler.enqueue_request() called before open()")
        answers = self.answers
        if answers.swallowed and answers.take_swallowed(request):
            # a browser task whose failed delivery ended its download: its lease ends in
            # request_done, and the frontier delivers it again
            return True
        url_key = None
        x = self._x
        dedupe = self.dedupe
        if x is not None and x.seen_epoch != dedupe.epoch:
            dedupe.forget(x.seen_epoch)
        revisits = self.revisits
        if revisits is not None and revisits.live and revisits.copy_of_tracked(request):
            # a retry's or a redirect's copy of a tracked page in flight: crawled once, past
            # the seen filter as the page's own revisit is, and not tracked on its own
            fp = b""
        elif request.dont_filter:
            fp = b""
        else:
            if dedupe.url_shortcut and request.method == "GET" and not request.body and not request.meta.get("verbatim_url"):
                url_key = request.url.encode()
                if url_key in dedupe.seen_urls:
                    self._filtered(request)
                    return False
            fp = fingerprint_of(request, self.fingerprinter)
            if fp in dedupe.seen:
                if url_key is not None:
                    dedupe.seen_urls.add(url_key)
                self._filtered(request)
                return False
        cfg = self.config
        try:
            # the seen caches above decide whether to build the entry; frontier/entries.py, how
            entry = entry_for(
                request, codec, self.fingerprinter, high_min=cfg.high_priority_min, low_max=cfg.low_priority_max,
                site_of=self._site_key, legacy=x is not None and x.legacy is not None, fingerprint=fp,
                now=self.answers.redis_now,
            )
        except SerializationError as exc:
            return self._cannot_travel(request, exc, fp, url_key)
        if x is not None:
            x.put(entry)  # a legacy_fp is checked by the I/O thread (frontier/batches.py)
        if fp:
            dedupe.seen.add(fp)
            if url_key is not None:
                dedupe.seen_urls.add(url_key)
        self.counts.enqueued += 1
        return True

    def next_request(self) -> Request | None:
        x = self._x
        if x is None:
            return None
        if x.moved is not None:
            self._report_moved(x.moved)
            return None
        if x.stats:
            self.counts.apply(x)
        ready = self.ready
        if not ready:
            # Tell the I/O thread to wake the engine when requests arrive. Set before
            # looking at the arrivals: the thread appends first and reads this after.
            x.starved = True
        if x.weights.changed:
            ready.reweigh(x)
        if ready.unweigh:
            ready.forget_weights(x)
        if x.arrivals:
            ready.absorb()
        if not ready:
            x.kick()
            return None
        if self.turn.spent():
            return None
        popped = ready.pop(x)
        if popped is None:
            return None  # every site with requests has a full downloader slot
        request, entry, _site = popped
        self.turn.take()
        if entry is None:
            self.counts.local_out += 1
            return request
        self._leases[request] = entry
        if entry.payload is not None and self.revisits is not None:
            self.revisits.handed_out(request)
        x.inflight = len(self._leases)
        if ready.count - ready.local <= x.low_water:
            x.kick()
        counts = self.counts
        counts.dequeued += 1
        if counts.dequeued % self.STATS_EVERY_DEQUEUES == 0:
            counts.apply(x)
        return request

    def __len__(self) -> int:
        return self.ready.count + len(self._x.arrivals if self._x else ())

    # -- acks and leases ---------------------------------------------------------

    def request_done(self, request: Request) -> None:
        """The engine is done with ``request``: ack its lease (after its follow-ups), or end
        it as a failed delivery if its render failed (answers.py).

        Called by the engine hook; call it yourself only when running the
        scheduler without a crawler.
        """
        ready = self.ready
        if ready.fair.parked:
            ready.slot_leaving(request)
        entry = self._leases.pop(request, None)
        marked, failed = self.answers.take_failure(request) if self.answers.failed else (False, None)
        if entry is None:
            site = ready.local_busy.pop(request, None)
            if site is not None:
                ready.release_site(site)
            return
        ready.release_site(entry.site)
        x = self._x
        if x is None:
            return
        if marked:
            x.put(Failed(entry, failed) if failed is not None else Release(entry))
        else:
            revisits = self.revisits
            # a tracked page (its payload kept, io/leasing.py) acks with its next visit
            x.put(Ack(entry) if entry.payload is None or revisits is None else revisits.ack(entry, request))
            if self.ack_listeners:
                latency = time.monotonic() - entry.leased_at
                for listener in self.ack_listeners:
                    listener(entry, latency)
        x.inflight = len(self._leases)

    def extend_lease(self, request: Request) -> bool:
        """Give a long-running request a full lease again. False if it holds no lease."""
        entry = self._leases.get(request)
        if entry is None:
            return False
        self._put(Extend(entry))
        return True

    def _holds_tracked(self, request: Request) -> bool:
        entry = self._leases.get(request)
        return entry is not None and entry.payload is not None

    def lease_of(self, request: Request) -> LeasedEntry | None:
        """The lease a request holds (site, stream, entry id, prior deliveries), if any."""
        return self._leases.get(request)

    # -- internals -------------------------------------------------------------

    def _put(self, op: Op) -> None:
        x = self._x
        if x is not None:
            x.put(op)

    def _cannot_travel(self, request: Request, exc: SerializationError, fp: bytes, url_key: bytes | None) -> bool:
        """The codec refused ``request``: keep it here and crawl it ("local"), or refuse it ("error")."""
        inc = self.counts.inc
        inc("streams/unserializable")
        if exc.field == "size":
            inc("streams/oversize")
        if not self.unserializable.keep_local(exc):
            inc("streams/unserializable_refused")
            return False
        inc("streams/unserializable_local")
        inc("scheduler/unserializable")  # Scrapy's own name, as its disk queues count them
        try:
            site = self._site_of(request, request.meta)
        except SerializationError:
            site = urlparse_cached(request).hostname or "_nohost"
        self.ready.add_local(site, request)
        self.counts.local_in += 1
        if self._x is not None:
            self._x.started_locally = True
        if fp:  # deduplicated by this worker only: it never reaches the Redis filter
            self.dedupe.seen.add(fp)
            if url_key is not None:
                self.dedupe.seen_urls.add(url_key)
        return True

    @property
    def browser_leases(self) -> int:
        """Browser leases this worker holds (prefetched or in progress), as its I/O thread
        counts them against STREAMS_BROWSER_MAX."""
        x = self._x
        return x.browser_held if x is not None else 0

    @property
    def browser_max(self) -> int:
        """STREAMS_BROWSER_MAX, or 0 for a worker without the browser capability."""
        return self.config.browser_max if "browser" in self.config.capabilities else 0

    @property
    def local_waiting(self) -> int:
        """Local requests (they cannot travel) not yet handed to the engine."""
        return self.ready.local

    @property
    def redis_unreachable_s(self) -> float:
        """Seconds the I/O thread has reached no Redis server (0.0 while it does)."""
        x = self._x
        since = x.unreachable_since if x is not None else None
        return 0.0 if since is None else max(0.0, time.monotonic() - since)

    @property
    def io_stuck_s(self) -> float:
        """Seconds the I/O thread's current cycle has run (0.0 between cycles)."""
        return self.watchdog.stuck_s() if self.watchdog is not None else 0.0

    @property
    def local_held(self) -> int:
        """Requests only this worker holds (they cannot travel): waiting or in progress."""
        return self.ready.local + len(self.ready.local_busy)

    def _site_of(self, request: Request, meta: dict[str, Any]) -> str:
        return site_for(request, self._site_key)

    def _filtered(self, request: Request) -> None:
        self.counts.filtered += 1
        self.dedupe.log_filtered(request, self.spider)

    def _on_spider_idle(self, spider: Spider) -> None:
        raise DontCloseSpider

    def _report_moved(self, to: str) -> None:
        """The crawl has moved to another Redis (streams-sched move): one line naming it, close
        the spider, and (STREAMS_EXIT_ON_MOVE) end the process with EXIT_MOVED, so that
        systemd or Kubernetes start it again with the new REDIS_URL. The worker never
        connects to a place it read from Redis."""
        if self._moved_reported:
            return
        self._moved_reported = True
        from streams_sched.exit_codes import EXIT_MOVED

        logger.warning(
            "streams-sched: crawl %r has moved to %s (streams-sched move); closing%s: start this worker again with"
            " REDIS_URL=%s (with its password, if it has one)",
            self.config.crawl, to, f" with exit code {EXIT_MOVED}" if self.config.exit_on_move else "", to,
        )
        if self.config.exit_on_move:
            from streams_sched.worker.exit_code import exit_with_at_end

            exit_with_at_end(EXIT_MOVED)
        if self.crawler is not None and self.crawler.engine is not None:
            from streams_sched.worker.engine import close_spider

            close_spider(self.crawler.engine, "streams_sched_moved")

    def _report_fatal(self) -> None:
        if self._fatal_reported:
            return
        self._fatal_reported = True
        logger.error("streams-sched I/O thread died: %r; closing the spider", self._x.fatal if self._x else None)
        if self.crawler is not None and self.crawler.engine is not None:
            from streams_sched.worker.engine import close_spider

            close_spider(self.crawler.engine, "streams_sched_error")


