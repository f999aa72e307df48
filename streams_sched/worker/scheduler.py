"""The Scrapy scheduler: a shared crawl frontier on Redis Streams consumer groups.

Enable it with two settings::

    SCHEDULER = "streams_sched.worker.scheduler.StreamsScheduler"
    REDIS_URL = "redis://localhost:6379/0"

How it behaves (implementation details, see the README for the guarantees):

- ``enqueue_request`` fingerprints the request with ``crawler.request_fingerprinter``,
  encodes it with msgpack and queues an ``Enqueue`` (ops.py) for the I/O thread
  (pump.py) in the ``Exchange`` they share (exchange.py); it never touches
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
import os
import socket
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import DontCloseSpider
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter

from streams_sched import __version__
from streams_sched.admin.rights import check_rights
from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import connect_ready, redact
from streams_sched.connect.server_checks import check_eviction
from streams_sched.errors import SerializationError
from streams_sched.frontier.client import Frontier, LeasedEntry, Outgoing, crawl_bloom
from streams_sched.frontier.keys import BROWSER_FIRST_STREAM, TASK_TYPES, stream_for, validate_site_name
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.politeness.adaptive import (
    THROTTLE_STATUSES,
    crawl_delay_of,
    is_timeout,
    robots_body_crawl_delay,
)
from streams_sched.politeness.retry_after import retry_after_seconds
from streams_sched.scrapy_redis.legacy import legacy_fingerprint
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.engine import EngineHooks, check_scrapy
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.fairness import ReadySites
from streams_sched.worker.io.pump import Pump, make_node_id
from streams_sched.worker.io.recovery import release_orphans
from streams_sched.worker.ops import Ack, Enqueue, Extend, Failed, Op, Release
from streams_sched.worker.renders import close_page, failure_text, is_render_failure
from streams_sched.worker.seen import SeenCache
from streams_sched.worker.selection import band_for, credit_at_level
from streams_sched.worker.startup import fail_clearly
from streams_sched.worker.unserializable import UnserializablePolicy

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector

__all__ = ["StreamsScheduler"]

logger = logging.getLogger(__name__)



class Fingerprinter(Protocol):
    def fingerprint(self, request: Request) -> bytes: ...


class StreamsScheduler(BaseScheduler):
    """A Scrapy scheduler whose queue is a Redis Streams crawl frontier shared by many workers."""

    #: fingerprints travel as 20 bytes (a SHA-1, Scrapy's default); others are hashed to that
    FINGERPRINT_BYTES = 20
    #: move the hot-path counters into the crawl stats every this many dequeues
    STATS_EVERY_DEQUEUES = 256
    #: Requests handed to the engine per turn of the event loop. The engine asks for
    #: requests until its downloader is full, so a batch of leases would start a few
    #: hundred downloads in one turn, and their responses, coroutines and Deferreds
    #: would then live side by side: Python's garbage collector finds them in every
    #: young collection, promotes them, and runs full collections over the whole heap
    #: again and again. Handed out a few at a time, each turn's work is done before the
    #: next starts. On a CPU-bound crawl of one-page sites that took the worker from
    #: about 1.2 to about 0.7 ms of CPU per page (``python -m bench sites``); with real
    #: downloads it only spreads the ramp-up over more turns.
    HANDOUT_PER_TURN = 4

    def __init__(
        self,
        config: StreamsConfig,
        *,
        fingerprinter: Fingerprinter,
        stats: StatsCollector | None = None,
        crawler: Crawler | None = None,
        concurrency: int = 16,
        per_site_concurrency: int = 8,
        download_delay: float = 0.0,
        dupefilter_debug: bool = False,
        url_shortcut: bool = True,
        robots_obey: bool = False,
        robots_user_agent: str = "",
        user_agent: str = "",
    ) -> None:
        self.config = config
        self.fingerprinter = fingerprinter
        self.stats = stats
        self.crawler = crawler
        self.concurrency = concurrency
        self.per_site_concurrency = per_site_concurrency
        self.download_delay = download_delay
        self.dupefilter_debug = dupefilter_debug
        self.robots_obey = robots_obey
        self.robots_user_agent = robots_user_agent
        self.user_agent = user_agent
        # Scrapy sends robots_parsed (with the parser of ROBOTSTXT_PARSER) only in its
        # newer versions; before that the robots.txt answer is read here with Protego.
        self._robots_from_body = robots_obey and not hasattr(signals, "robots_parsed")
        self._site_key = site_keyer(config.site_key)
        self.node_id = config.node_id or make_node_id()
        self.seen = SeenCache(config.local_seen_cache)
        # With Scrapy's own fingerprinter a GET without body has a fingerprint that
        # depends on the URL string alone, so a URL this worker already sent is a
        # duplicate without canonicalize_url + json + sha1 (~13 us; most links on a
        # page were seen before). Any other fingerprinter always fingerprints.
        self.url_shortcut = url_shortcut and type(fingerprinter) is RequestFingerprinter
        self.seen_urls = SeenCache(config.local_seen_cache if self.url_shortcut else 0)
        #: the I/O thread's Exchange.seen_epoch when the seen caches were last trusted
        self._seen_epoch = 0
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.codec: RequestCodec | None = None
        #: the I/O thread; the scheduler only starts and stops it
        self._pump: Pump | None = None
        #: everything the scheduler and the I/O thread share (exchange.py)
        self._x: Exchange | None = None
        self._hooks: EngineHooks | None = None
        #: requests handed to the engine this turn of the event loop (HANDOUT_PER_TURN)
        self._handed = 0
        self._turn_full = False
        #: requests ready per site: (request, lease or None for a local request, downloader slot key)
        self._ready: dict[str, deque[tuple[Request, LeasedEntry | None, str | None]]] = {}
        #: the sites of _ready in the order fairness serves them (fairness.py)
        self._fair = ReadySites()
        #: requests handed to the engine and not finished, per site (leased and local): with
        #: _ready, the sites whose served count and weight this worker keeps
        self._held: dict[str, int] = {}
        #: slot keys of full downloader slots a request is leaving: parked sites behind
        #: them compete again once the slot has room
        self._recheck: set[Any] = set()
        #: sites gone (nothing ready, nothing held) whose weight the Exchange still stores
        self._unweigh: set[str] = set()
        self._downloader: Any = None
        self._nready = 0
        self._leases: dict[Request, LeasedEntry] = {}
        self._sites: dict[str, str] = {}
        self._logged_dupe = False
        self._fatal_reported = False
        self._n_enqueued = self._n_dequeued = self._n_filtered = 0
        #: requests that cannot travel (see unserializable.py): kept in _ready with no lease
        self.unserializable = UnserializablePolicy(config.unserializable, config.crawl)
        self._nlocal = 0  # local requests waiting in _ready
        self._local_busy: dict[Request, str] = {}  # local requests the engine has not finished -> site
        self._n_local_in = self._n_local_out = 0
        self._applied: dict[str, int] = {}
        #: called on the reactor thread with (entry, seconds from lease to ack) for every ack
        self.ack_listeners: list[Callable[[LeasedEntry, float], None]] = []
        #: browser tasks whose download failed on this delivery -> what went wrong (their
        #: lease ends as a failed delivery), or None: hand the lease back (renders.py)
        self._failed: dict[Request, str | None] = {}
        #: of those, the ones given back to the engine to end their download: taken by
        #: enqueue_request without being sent anywhere
        self._swallowed: set[Request] = set()
        self._shutting_down = False
        #: browser tasks in the downloader -> time.monotonic() when they reached it
        self._rendering: dict[Request, float] = {}
        #: called on the reactor thread with (request, seconds in the downloader) for every
        #: browser task that leaves the downloader, rendered or not
        self.render_listeners: list[Callable[[Request, float], None]] = []

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
            concurrency=settings.getint("CONCURRENT_REQUESTS"),
            per_site_concurrency=settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN") or settings.getint("CONCURRENT_REQUESTS"),
            download_delay=settings.getfloat("DOWNLOAD_DELAY"),
            dupefilter_debug=settings.getbool("DUPEFILTER_DEBUG"),
            url_shortcut=config.url_shortcut,
            robots_obey=settings.getbool("ROBOTSTXT_OBEY"),
            robots_user_agent=settings.get("ROBOTSTXT_USER_AGENT") or "",
            user_agent=settings.get("USER_AGENT") or "",
        )
        from streams_sched.worker.metrics import attach_worker_metrics

        attach_worker_metrics(crawler, scheduler)  # only when STREAMS_METRICS_PORT is set
        return scheduler

    # -- lifecycle ------------------------------------------------------------

    @fail_clearly
    def open(self, spider: Spider) -> None:
        cfg = self.config
        self.spider = spider
        client = connect_ready(
            cfg.redis_url,
            cfg.connect_timeout_seconds,
            socket_timeout=cfg.socket_timeout_seconds,
            connect_timeout=min(5.0, cfg.socket_timeout_seconds),
        )
        where = f"Redis at {redact(cfg.redis_url)}"
        check_rights(client, cfg.crawl, where)
        check_eviction(client, where, allowed=cfg.allow_eviction, allow_hint="set STREAMS_ALLOW_EVICTION = True")
        bloom = crawl_bloom(
            client, cfg.crawl, cfg.dedupe, cfg.bloom_error_rate, cfg.bloom_capacity, cfg.bloom_expansion,
            cfg.revisit_after_seconds, cfg.revisit_buckets,
        )
        mode = bloom.mode
        self.frontier = frontier = Frontier(client, cfg.crawl, bloom)
        frontier.ensure_layout(cfg.shards)
        frontier.load_scripts()
        frontier.register()
        frontier.politeness = ("a" if cfg.adaptive else "") + ("r" if self.robots_obey else "")
        self._record_site_key(frontier)
        self._apply_site_policies()
        self.codec = RequestCodec(spider, cfg.request_classes, cfg.max_request_bytes, cfg.meta_classes, cfg.meta_codecs)
        self.unserializable = UnserializablePolicy(cfg.unserializable, spider.name, spider)
        node_info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": time.time(),
            "capabilities": list(cfg.capabilities),
            "version": __version__,
            # the reclaimer requeues a lease only after the longest lease of the live workers
            "lease_s": cfg.lease_seconds,
            "max_deliveries": cfg.max_deliveries,
        }
        x = self._x = Exchange()
        # in the node record: lost if this worker dies
        x.local_count = lambda: self.local_held
        self._pump = Pump(
            frontier,
            cfg,
            self.codec,
            self.node_id,
            concurrency=self.concurrency,
            per_site_concurrency=self.per_site_concurrency,
            download_delay=self.download_delay,
            node_info=node_info,
            exchange=x,
            feed=self._feed_mover(spider, frontier),
        )
        if self.crawler is not None:
            self._hooks = EngineHooks(
                self.crawler, self, self.request_done, fail_at_end=cfg.unserializable == "error"
            )
            self._hooks.on_closing(self._begin_shutdown, cfg.shutdown_timeout_seconds, self._shutdown_timed_out)
            self._downloader = getattr(self.crawler.engine, "downloader", None)
            x.wake = self._hooks.wake
            self.crawler.signals.connect(self._on_response_downloaded, signals.response_downloaded)
            self._hooks.on_download_error(self._on_download_error)
            if "browser" in cfg.capabilities:
                self.crawler.signals.connect(self._on_reached_downloader, signals.request_reached_downloader)
                self.crawler.signals.connect(self._on_left_downloader, signals.request_left_downloader)
            robots_parsed = getattr(signals, "robots_parsed", None)
            if self.robots_obey and robots_parsed is not None:
                self.crawler.signals.connect(self._on_robots_parsed, robots_parsed)
            if not cfg.close_on_drain:
                self.crawler.signals.connect(self._on_spider_idle, signals.spider_idle)
        frontier.record_node(self.node_id, {**node_info, "node": self.node_id, "state": "online", "last_seen": time.time(), "crawl": cfg.crawl, "heartbeat_s": cfg.heartbeat_seconds})
        frontier.publish({"event": "node_online", "node": self.node_id, "crawl": cfg.crawl, **node_info})
        if cfg.node_id:
            # A restarted worker with a stable node id: the leases of its previous run
            # will never be finished by anyone holding them; hand them back now.
            release_orphans(
                frontier, self.node_id, frontier.leased_sites(), set(), why="left by a previous run of this node"
            )
        self._pump.refresh_policy()
        self._pump.start()
        logger.info(
            "streams-sched %s opened: crawl=%s node=%s redis=%s dedupe=%s lease_s=%g"
            " max_deliveries=%d band_ratio=%s close_on_drain=%s",
            __version__,
            cfg.crawl,
            self.node_id,
            redact(cfg.redis_url),
            "redisbloom" if mode == "bf" else "bitmap",
            cfg.lease_seconds,
            cfg.max_deliveries,
            ":".join(map(str, cfg.band_ratio)),
            cfg.close_on_drain,
        )

    def _feed_mover(self, spider: Spider, frontier: Frontier) -> Any:
        """The scrapy-redis feed mover of this worker (None without STREAMS_FEED_KEY).

        A spider that still subclasses scrapy-redis's RedisSpider / RedisCrawlSpider
        keeps working: its own feed reading (LRANGE + LTRIM on the reactor, lost if
        the worker dies) is turned off, its ``redis_key`` becomes the feed, and an
        overridden ``make_request_from_data`` is used to read entries.
        """
        from streams_sched.scrapy_redis.feed import FeedMover
        from streams_sched.scrapy_redis.spiders import adopt_redis_spider

        cfg = self.config
        key, make_requests = adopt_redis_spider(spider, cfg.feed_key)
        if not key:
            return None
        fingerprinter: Any = self.fingerprinter
        if type(fingerprinter) is RequestFingerprinter:
            # its cache is not meant for two threads; the same class gives the same fingerprints
            fingerprinter = RequestFingerprinter(self.crawler)
        assert self.codec is not None
        logger.info("streams-sched moves the scrapy-redis feed %s (%s) into crawl %s", key, cfg.feed_kind, cfg.crawl)
        return FeedMover(
            frontier, key, self.codec, fingerprinter, self.node_id, kind=cfg.feed_kind, batch=cfg.feed_batch,
            encoding=cfg.feed_encoding, high_min=cfg.high_priority_min, low_max=cfg.low_priority_max,
            make_requests=make_requests, site_of=self._site_key,
        )
    def _record_site_key(self, frontier: Frontier) -> None:
        """The first worker records STREAMS_SITE_KEY in the crawl meta (push reads it);
        a worker with another one would split the crawl's sites two ways: say so."""
        client = frontier.client
        client.hsetnx(frontier.keys.meta, "site_key", self.config.site_key)
        recorded = client.hget(frontier.keys.meta, "site_key")
        recorded = recorded.decode() if isinstance(recorded, bytes) else recorded
        if recorded != self.config.site_key:
            logger.warning(
                "crawl %s was started with STREAMS_SITE_KEY=%r but this worker has %r: requests it"
                " enqueues are grouped by %s, the others' by %s",
                self.config.crawl, recorded, self.config.site_key, self.config.site_key, recorded,
            )

    def _apply_site_policies(self) -> None:
        assert self.frontier is not None
        sites = self.config.sites
        if not sites:
            return
        from streams_sched.politeness.policy import apply_site_policies

        apply_site_policies(self.frontier, sites)

    def close(self, reason: str) -> None:
        pump = self._pump
        if pump is None:
            return
        pump.begin_close()
        unstarted = self._hand_back_unstarted() + self._hand_back_in_progress()
        self._local_busy.clear()
        self._held.clear()
        self._failed.clear()
        self._swallowed.clear()
        self._rendering.clear()
        flushed = pump.finish(timeout=30.0)
        self._apply_stats()
        self._pump = self._x = None
        failure = self.unserializable.failure()
        if failure is not None:
            logger.error("%s", failure, extra={"spider": self.spider})
            if self._hooks is not None:
                self._hooks.fail_crawl(failure)
        if self._hooks is not None:
            self._hooks.unhook()
            self._hooks = None
        logger.info(
            "streams-sched closed (%s): node=%s handed back %d unstarted leases; all acks sent: %s",
            reason, self.node_id, unstarted, flushed,
        )

    def _hand_back_unstarted(self) -> int:
        """Release every prefetched request the engine has not started (local requests,
        which cannot travel, are lost: counted and logged)."""
        self._absorb()
        n = 0
        for queue in self._ready.values():
            for _request, entry, _slot in queue:
                if entry is not None:
                    self._put(Release(entry))
                    n += 1
        if self._nlocal:
            self._inc("streams/unserializable_lost", self._nlocal)
            logger.warning(
                "streams-sched closing with %d local requests not crawled: they could not travel"
                " through the shared queue (see the warnings above), so no other worker will crawl them",
                self._nlocal, extra={"spider": self.spider},
            )
        sites = list(self._ready)
        self._ready.clear()
        self._fair.clear()
        self._recheck.clear()
        self._nready = self._nlocal = 0
        for site in sites:
            if site not in self._held:
                self._site_gone(site)
        if self._x is not None:
            self._x.kick()
        return n

    def _hand_back_in_progress(self) -> int:
        """Release the leases of requests the engine started but did not finish."""
        n = len(self._leases)
        for entry in self._leases.values():
            self._put(Release(entry))
            self._release_site(entry.site)
        self._leases.clear()
        if self._x is not None:
            self._x.inflight = 0
            self._x.kick()
        return n

    def _begin_shutdown(self) -> None:
        """The spider is closing (SIGTERM, Ctrl-C, CLOSESPIDER_*): lease nothing more and
        hand back at once what was prefetched, so other workers get it without waiting
        for the lease to expire. Requests in progress may finish (see _shutdown_timed_out)."""
        if self._pump is None:
            return
        self._shutting_down = True
        self._pump.stop_leasing()
        n = self._hand_back_unstarted()
        if n or self._leases:
            logger.info(
                "streams-sched closing: stopped leasing, handed back %d unstarted leases; waiting up to"
                " %gs (STREAMS_SHUTDOWN_TIMEOUT_SECONDS) for %d requests in progress",
                n, self.config.shutdown_timeout_seconds, len(self._leases),
            )

    def _shutdown_timed_out(self, in_progress: int) -> None:
        n = self._hand_back_in_progress()
        self._inc("streams/shutdown_handed_back", n)
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
        if self._nready or x.arrivals or self._leases or self._local_busy:
            return True
        if x.may_be_busy():
            return True
        if x.enqueues_done < self._n_enqueued:
            return True  # in the pipeline now: a local request's follow-ups may undo "drained"
        return not x.drained

    def enqueue_request(self, request: Request) -> bool:
        codec = self.codec
        if codec is None:
            raise RuntimeError("StreamsScheduler.enqueue_request() called before open()")
        if self._swallowed and request in self._swallowed:
            # a browser task whose failed delivery ended its download: its lease ends in
            # request_done, and the frontier delivers it again
            self._swallowed.discard(request)
            return True
        url_key = None
        x = self._x
        if x is not None and x.seen_epoch != self._seen_epoch:
            self._forget_seen(x.seen_epoch)
        if request.dont_filter:
            fp = b""
        else:
            if self.url_shortcut and request.method == "GET" and not request.body and not request.meta.get("verbatim_url"):
                url_key = request.url.encode()
                if url_key in self.seen_urls:
                    self._filtered(request)
                    return False
            fp = self.fingerprinter.fingerprint(request)
            if len(fp) != self.FINGERPRINT_BYTES:
                fp = _sha1(fp)
            if fp in self.seen:
                if url_key is not None:
                    self.seen_urls.add(url_key)
                self._filtered(request)
                return False
        meta = request.meta
        try:
            site = self._site_of(request, meta)
            task = meta.get("task_type")
            if task is not None and task not in TASK_TYPES:
                raise SerializationError(repr(request), "meta['task_type']", f"unknown task type {task!r}; expected one of {list(TASK_TYPES)}")
            payload = codec.encode(request)
        except SerializationError as exc:
            return self._cannot_travel(request, exc, fp, url_key)
        cfg = self.config
        band = band_for(request.priority, cfg.high_priority_min, cfg.low_priority_max)
        stream = stream_for(task, band)  # task None: the site's policy decides http or browser
        delay_ms = 0
        not_before = meta.get("not_before")
        if not_before:
            try:
                delay_ms = max(0, int((float(not_before) - time.time()) * 1000))
            except (TypeError, ValueError):
                logger.error("ignoring meta['not_before']=%r of %s: not epoch seconds", not_before, request)
        if fp and x is not None and x.legacy is not None:
            # checked against the migrated scrapy-redis dupefilter by the I/O thread
            self._put(Enqueue(site, Outgoing(fp, stream, delay_ms, payload), legacy_fingerprint(request)))
        else:
            self._put(Enqueue(site, Outgoing(fp, stream, delay_ms, payload)))
        if fp:
            self.seen.add(fp)
            if url_key is not None:
                self.seen_urls.add(url_key)
        self._n_enqueued += 1
        return True

    def next_request(self) -> Request | None:
        x = self._x
        if x is None:
            return None
        if x.stats:
            self._apply_stats()
        if not self._ready:
            # Tell the I/O thread to wake the engine when requests arrive. Set before
            # looking at the arrivals: the thread appends first and reads this after.
            x.starved = True
        if x.weights.changed:
            self._reweigh(x)
        if self._unweigh:
            self._forget_weights(x)
        if x.arrivals:
            self._absorb()
        if not self._ready:
            x.kick()
            return None
        hooks = self._hooks
        if hooks is not None and self._handed >= self.HANDOUT_PER_TURN:
            self._turn_full = True
            return None
        site = self._pick_site()
        if site is None:
            return None  # every site with requests has a full downloader slot
        queue = self._ready[site]
        request, entry, _slot = queue.popleft()
        if hooks is not None:
            if self._handed == 0:
                hooks.next_turn(self._new_turn)
            self._handed += 1
        served = x.served
        n = served[site] = served.get(site, 0.0) + 1.0
        held = self._held
        held[site] = held.get(site, 0) + 1
        if queue:
            self._fair.update(site, n / x.weight(site), queue[0][2])
        else:
            del self._ready[site]
            self._fair.remove(site)
        self._nready -= 1
        if entry is None:
            return self._local_out(request, site)
        self._leases[request] = entry
        x.inflight = len(self._leases)
        if self._nready - self._nlocal <= x.low_water:
            x.kick()
        self._n_dequeued += 1
        if self._n_dequeued % self.STATS_EVERY_DEQUEUES == 0:
            self._apply_stats()
        return request

    def _new_turn(self) -> None:
        self._handed = 0
        if self._turn_full and self._hooks is not None:
            self._turn_full = False
            self._hooks.pull()

    def _pick_site(self) -> str | None:
        """The site to serve next: the least served relative to its weight among the
        sites whose downloader slot can take a request now (so one slow site never
        fills the downloader, and weights hold when the worker is the bottleneck);
        between equals, the one ready first. O(log ready sites): see fairness.py."""
        fair = self._fair
        if self._downloader is None:
            return fair.pick()
        if self._recheck:
            self._unpark_freed()
        site = fair.pick(self._slot_full)
        if site is None and fair.parked:
            # Every ready site waits behind a full slot. Look at each of them again: a
            # downloader that frees a slot without the signals this scheduler watches
            # must not leave its sites waiting for ever.
            for key in list(fair.parked):
                if not self._slot_full(key):
                    fair.unpark(key)
            site = fair.pick(self._slot_full)
        return site

    def _slot_full(self, key: Any) -> bool:
        slot = self._downloader.slots.get(key)
        return slot is not None and len(slot.active) >= slot.concurrency

    def _unpark_freed(self) -> None:
        """Unpark the sites behind the slots a request left, once those have room."""
        recheck = self._recheck
        for key in list(recheck):
            if not self._slot_full(key):
                recheck.discard(key)
                self._fair.unpark(key)

    def _slot_leaving(self, request: Request) -> None:
        """``request`` is leaving (or left) its downloader slot: a full slot is looked at
        again at the next pick, and again until the request is out of it."""
        if self._downloader is None:
            return
        key = request.meta.get("download_slot")
        if key is not None and (key in self._fair.parked or self._slot_full(key)):
            self._recheck.add(key)

    def __len__(self) -> int:
        return self._nready + len(self._x.arrivals if self._x else ())

    # -- acks and leases ---------------------------------------------------------

    def request_done(self, request: Request) -> None:
        """The engine is done with ``request``: ack its lease (after its follow-ups), or end
        it as a failed delivery if its render failed (:meth:`_render_failed`).

        Called by the engine hook; call it yourself only when running the
        scheduler without a crawler.
        """
        if self._fair.parked:
            self._slot_leaving(request)
        entry = self._leases.pop(request, None)
        marked = bool(self._failed) and request in self._failed
        failed = self._failed.pop(request) if marked else None
        if entry is None:
            site = self._local_busy.pop(request, None)
            if site is not None:
                self._release_site(site)
            return
        self._release_site(entry.site)
        if marked:
            self._put(Failed(entry, failed) if failed is not None else Release(entry))
            x = self._x
            if x is not None:
                x.inflight = len(self._leases)
            return
        self._put(Ack(entry))
        if self.ack_listeners:
            latency = time.monotonic() - entry.leased_at
            for listener in self.ack_listeners:
                listener(entry, latency)
        x = self._x
        if x is not None:
            x.inflight = len(self._leases)

    def extend_lease(self, request: Request) -> bool:
        """Give a long-running request a full lease again. False if it holds no lease."""
        entry = self._leases.get(request)
        if entry is None:
            return False
        self._put(Extend(entry))
        return True

    def lease_of(self, request: Request) -> LeasedEntry | None:
        """The lease a request holds (site, stream, entry id, prior deliveries), if any."""
        return self._leases.get(request)

    # -- internals -------------------------------------------------------------

    def _put(self, op: Op) -> None:
        x = self._x
        if x is not None:
            x.put(op)

    def _absorb(self) -> None:
        x = self._x
        if x is None:
            return
        arrivals = x.arrivals
        ready = self._ready
        slot_key = self._downloader.get_slot_key if self._downloader is not None else None
        n = 0
        while arrivals:
            request, entry = arrivals.popleft()
            item = (request, entry, slot_key(request) if slot_key is not None else None)
            queue = ready.get(entry.site)
            if queue is None:
                self._make_ready(entry.site, item)
            else:
                queue.append(item)
            n += 1
        self._nready += n

    def _make_ready(self, site: str, item: tuple[Request, LeasedEntry | None, str | None]) -> None:
        """``site`` has a request ready again (``item``), and none before."""
        x = self._x
        fair = self._fair
        level = 0.0
        if x is not None:
            if x.weights.changed:
                self._reweigh(x)
            weight = x.weight(site)
            served = x.served
            count = served.get(site, 0.0)
            least = fair.least_level()
            if least is not None:
                # a site coming back starts level with the least served, not far behind
                count = served[site] = credit_at_level(count, weight, least)
            level = count / weight
        self._ready[site] = deque((item,))
        fair.add(site, level, item[2])

    # -- per-site state: only for the sites ready or in progress ------------------

    def _release_site(self, site: str) -> None:
        """A request of ``site`` handed to the engine is finished (or handed back)."""
        held = self._held
        n = held.get(site, 0) - 1
        if n > 0:
            held[site] = n
            return
        held.pop(site, None)
        if site not in self._ready:
            self._site_gone(site)

    def _site_gone(self, site: str) -> None:
        """``site`` has nothing ready and holds nothing: forget what fairness kept of it
        (if it comes back, it starts level with the others: credit_at_level)."""
        x = self._x
        if x is None:
            return
        x.served.pop(site, None)
        if x.weights.holds(site):
            self._unweigh.add(site)

    def _is_gone(self, site: str) -> bool:
        return site not in self._ready and site not in self._held

    def _reweigh(self, x: Exchange) -> None:
        """The I/O thread changed weights: re-rank the ready sites among them."""
        changed = x.weights.changed
        ready = self._ready
        served = x.served
        while changed:
            site = changed.popleft()
            queue = ready.get(site)
            if queue is not None:
                self._fair.update(site, served.get(site, 0.0) / x.weight(site), queue[0][2])
            elif site not in self._held and x.weights.holds(site):
                self._unweigh.add(site)  # e.g. a lease reply without requests

    def _forget_weights(self, x: Exchange) -> None:
        """Drop the stored weights of the sites gone (SiteWeights: in two steps around
        taking in the arrivals, so that a weight for requests on their way stays)."""
        weights = x.weights
        sites = self._unweigh
        self._unweigh = set()
        marked = weights.begin_forget(sites)
        if x.arrivals:
            self._absorb()
        again = weights.end_forget(marked, self._is_gone)
        if len(marked) < len(sites):
            kept = sites.difference(marked)
            again.extend(site for site in kept if self._is_gone(site))
        self._unweigh.update(again)

    # -- requests that cannot travel (unserializable.py) --------------------------

    def _cannot_travel(self, request: Request, exc: SerializationError, fp: bytes, url_key: bytes | None) -> bool:
        """The codec refused ``request``: keep it here and crawl it ("local"), or refuse it ("error")."""
        self._inc("streams/unserializable")
        if exc.field == "size":
            self._inc("streams/oversize")
        if not self.unserializable.keep_local(exc):
            self._inc("streams/unserializable_refused")
            return False
        self._inc("streams/unserializable_local")
        self._inc("scheduler/unserializable")  # Scrapy's own name, as its disk queues count them
        try:
            site = self._site_of(request, request.meta)
        except SerializationError:
            site = urlparse_cached(request).hostname or "_nohost"
        slot = self._downloader.get_slot_key(request) if self._downloader is not None else None
        queue = self._ready.get(site)
        if queue is None:
            self._make_ready(site, (request, None, slot))
        else:
            queue.append((request, None, slot))
        self._nready += 1
        self._nlocal += 1
        self._n_local_in += 1
        if self._x is not None:
            self._x.started_locally = True
        if fp:  # deduplicated by this worker only: it never reaches the Redis filter
            self.seen.add(fp)
            if url_key is not None:
                self.seen_urls.add(url_key)
        return True

    def _local_out(self, request: Request, site: str) -> Request:
        self._nlocal -= 1
        self._local_busy[request] = site
        self._n_local_out += 1
        return request

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
        return self._nlocal

    @property
    def local_held(self) -> int:
        """Requests only this worker holds (they cannot travel): waiting or in progress."""
        return self._nlocal + len(self._local_busy)

    def _site_of(self, request: Request, meta: dict[str, Any]) -> str:
        site = meta.get("site")
        if site is None:
            host = urlparse_cached(request).hostname
            return self._site_key(host) if host else "_nohost"
        known = self._sites.get(site)
        if known is None:
            try:
                known = self._sites[site] = validate_site_name(site)
            except ValueError as exc:
                raise SerializationError(repr(request), "meta['site']", str(exc)) from None
        return known

    def _forget_seen(self, epoch: int) -> None:
        """A Redis primary was replaced: what this worker remembers sending may not have
        arrived there, so let Redis' own dedupe decide again."""
        self._seen_epoch = epoch
        forgotten = len(self.seen)
        self.seen = SeenCache(self.config.local_seen_cache)
        self.seen_urls = SeenCache(self.config.local_seen_cache if self.url_shortcut else 0)
        logger.info("forgot %d fingerprints sent before a Redis primary was replaced", forgotten)

    def _filtered(self, request: Request) -> None:
        self._n_filtered += 1
        if self.dupefilter_debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request}, extra={"spider": self.spider})
        elif not self._logged_dupe:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": self.spider},
            )
            self._logged_dupe = True

    def _inc(self, key: str, n: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, n)

    def _apply_stats(self) -> None:
        """Move the hot-path counters (kept as plain ints: Scrapy's stats calls are not
        cheap) and the I/O thread's counters into the crawl stats."""
        for key, n in (
            ("scheduler/enqueued/redis", self._n_enqueued),
            ("scheduler/enqueued/memory", self._n_local_in),
            ("scheduler/enqueued", self._n_enqueued + self._n_local_in),
            ("scheduler/dequeued/redis", self._n_dequeued),
            ("scheduler/dequeued/memory", self._n_local_out),
            ("scheduler/dequeued", self._n_dequeued + self._n_local_out),
            ("dupefilter/filtered", self._n_filtered),
        ):
            done = self._applied.get(key, 0)
            if n > done:
                self._inc(key, n - done)
                self._applied[key] = n
        x = self._x
        if x is None:
            return
        stats = x.stats
        while stats:
            key, n = stats.popleft()
            self._inc(key, n)

    def _on_spider_idle(self, spider: Spider) -> None:
        raise DontCloseSpider

    def _answer_site(self, request: Request) -> str | None:
        entry = self._leases.get(request)
        if entry is not None:
            return entry.site
        try:
            return self._site_of(request, request.meta)
        except SerializationError:
            return None

    def _on_response_downloaded(self, response: Response, request: Request, spider: Spider) -> None:
        """Every answer goes to the site's shared politeness state (I/O thread -> feedback.lua);
        a 429 / 503 with Retry-After also delays the retry of this request."""
        self._slot_leaving(request)
        x = self._x
        status = response.status
        if self._robots_from_body and _is_robots_request(request):
            self._report_robots(request, robots_body_crawl_delay(response.body, self._robots_agent(request)))
        if status not in THROTTLE_STATUSES:
            if x is not None and self.config.adaptive:
                site = self._answer_site(request)
                if site is not None:
                    x.feedback.append((site, "ok", 1))
            return
        now = time.time()
        delay = retry_after_seconds(response.headers.get(b"Retry-After"), now, self.config.retry_after_max_seconds)
        if delay:
            # RetryMiddleware copies the meta into the retry request, which then waits
            # in the site's delay queue until Retry-After has passed.
            request.meta["not_before"] = now + delay
            self._inc("streams/retry_after")
        if x is not None:
            site = self._answer_site(request)
            if site is not None:
                x.feedback.append((site, "throttled", int((delay or 0) * 1000)))
                x.kick()

    def _on_download_error(self, request: Request, exc: BaseException) -> Request | None:
        """A download failed: a timeout is a congestion signal; a robots.txt that could
        not be fetched means no Crawl-delay (as Scrapy then allows everything); a browser
        task's failure ends its delivery (:meth:`_render_failed`). Returns the request to
        end the download with (the engine schedules it again), or None to let Scrapy's
        middlewares and the errback handle the error."""
        self._slot_leaving(request)
        x = self._x
        if x is None:
            return None
        site = self._answer_site(request)
        if site is not None:
            if self.robots_obey and _is_robots_request(request):
                x.feedback.append((site, "robots", "0"))
                x.kick()
            elif is_timeout(exc) and self.config.adaptive:
                x.feedback.append((site, "timeout", 1))
                x.kick()
        entry = self._leases.get(request)
        if entry is not None and entry.stream >= BROWSER_FIRST_STREAM and is_render_failure(exc):
            return self._render_failed(request, entry, exc)
        return None

    def _render_failed(self, request: Request, entry: LeasedEntry, exc: BaseException) -> Request | None:
        """A browser task did not render on this delivery (renders.py): its lease ends as a
        failed delivery. Before the last one the error goes no further (the request is
        given back to end the download quietly); the last one goes on to Scrapy's own
        handling, and the entry to the dead-letter stream."""
        self._inc("streams/render_failed")
        if self._shutting_down:
            self._failed[request] = None
            return self._swallow(request)
        what = failure_text(exc)
        self._failed[request] = what
        delivery, limit = entry.deliveries + 1, self.config.max_deliveries
        if delivery >= limit:
            logger.warning(
                "browser task %s failed on its delivery %d of %d (STREAMS_MAX_DELIVERIES): %s;"
                " it goes to the dead-letter stream", request, delivery, limit, what,
                extra={"spider": self.spider},
            )
            return None
        logger.warning(
            "browser task %s failed on its delivery %d of %d (STREAMS_MAX_DELIVERIES): %s;"
            " back to the frontier for another delivery", request, delivery, limit, what,
            extra={"spider": self.spider},
        )
        return self._swallow(request)

    def _swallow(self, request: Request) -> Request:
        close_page(request.meta)
        self._swallowed.add(request)
        return request

    def _on_reached_downloader(self, request: Request, spider: Spider) -> None:
        if request.meta.get("task_type") == "browser":
            self._rendering[request] = time.monotonic()

    def _on_left_downloader(self, request: Request, spider: Spider) -> None:
        """A browser task left the downloader: its render time (for the node record and
        the worker's metrics)."""
        started = self._rendering.pop(request, None)
        if started is None:
            return
        seconds = time.monotonic() - started
        x = self._x
        if x is not None:
            x.renders += 1
            x.render_seconds += seconds
        for listener in self.render_listeners:
            listener(request, seconds)

    def _on_robots_parsed(self, robotparser: Any, request: Request, **_: Any) -> None:
        """A worker read a host's robots.txt (Scrapy's robots_parsed signal)."""
        self._report_robots(request, crawl_delay_of(robotparser, self._robots_agent(request)))

    def _robots_agent(self, request: Request) -> str:
        """The user agent RobotsTxtMiddleware asks robots.txt about."""
        if self.robots_user_agent:
            return self.robots_user_agent
        header = request.headers.get(b"User-Agent")
        return (header.decode("latin-1") if header else self.user_agent) or "*"

    def _report_robots(self, request: Request, delay: float | None) -> None:
        """A site's Crawl-delay (capped at STREAMS_MAX_CRAWL_DELAY; '0' = none) becomes its
        shared rate across all workers, unless its policy sets a rate (lease.lua)."""
        x = self._x
        site = self._answer_site(request)
        if x is None or site is None:
            return
        if delay is not None:
            delay = min(delay, self.config.max_crawl_delay_seconds)
            self._inc("streams/robots_crawl_delay")
        x.feedback.append((site, "robots", repr(delay) if delay else "0"))
        x.kick()

    def _report_fatal(self) -> None:
        if self._fatal_reported:
            return
        self._fatal_reported = True
        logger.error("streams-sched I/O thread died: %r; closing the spider", self._x.fatal if self._x else None)
        if self.crawler is not None and self.crawler.engine is not None:
            from streams_sched.worker.engine import close_spider

            close_spider(self.crawler.engine, "streams_sched_error")


def _is_robots_request(request: Request) -> bool:
    """RobotsTxtMiddleware's own robots.txt request."""
    return bool(request.meta.get("dont_obey_robotstxt")) and urlparse_cached(request).path == "/robots.txt"


def _sha1(data: bytes) -> bytes:
    import hashlib

    return hashlib.sha1(data).digest()

