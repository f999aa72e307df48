"""The Seeder: requests and URL strings in, entries out, batch by batch.

Input becomes entries on the one path (frontier/entries.py: :func:`entry_for`, and
:func:`url_entries` for URL strings with Scrapy's default fingerprinter); the batches go
out through send.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from streams_sched.connect.clients import connect_ready, redact
from streams_sched.connect.replicas import ReplicaBook, ReplicaGuard
from streams_sched.connect.server_checks import allowed_by_env, check_eviction, describe_client
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import entry_for, url_entries
from streams_sched.frontier.keys import DEFAULT_SHARDS, validate_crawl_name, validate_site_name
from streams_sched.frontier.records import Entry
from streams_sched.frontier.seeding.packing import Batch
from streams_sched.frontier.seeding.send import SeedResult, Sender
from streams_sched.frontier.seeding.wire import Wire
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD
from streams_sched.wire.callbacks import check_name
from streams_sched.wire.codec import RequestCodec

__all__ = ["Seed", "SeedResult", "Seeder", "seed"]

#: What :meth:`Seeder.seeds` yields (an :class:`~streams_sched.frontier.records.Entry`).
Seed = Entry


class Seeder:
    """Adds seed requests to one crawl. Thread-safe only per instance (one per thread).

    ``redis`` is a REDIS_URL (``?cluster=1`` for Redis Cluster, ``redis+sentinel://`` for the
    master of a Sentinel service) or a redis-py client.

    It checks the server's eviction policy first (:mod:`streams_sched.connect.server_checks`):
    on an ``allkeys-*`` Redis it raises :class:`~streams_sched.errors.EvictionPolicyError`
    unless ``allow_eviction`` is True (None: the environment variable
    STREAMS_ALLOW_EVICTION); ``check_server=False`` skips the check for a caller that
    made it already (the CLI).
    """

    def __init__(
        self,
        redis: str | Any,
        crawl: str,
        *,
        fingerprinter: Any = None,
        high_priority_min: int = 1,
        low_priority_max: int = -1,
        batch: int = 500,
        connect_timeout_s: float = 10.0,
        site_key: str | None = None,
        allow_eviction: bool | None = None,
        check_server: bool = True,
        min_replicas: int = -1,
        replica_timeout_s: float = 30.0,
        shards: int = DEFAULT_SHARDS,
    ) -> None:
        validate_crawl_name(crawl, "crawl")
        if batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch!r}")
        self._owns_client = isinstance(redis, str)
        self.client = connect_ready(redis, connect_timeout_s) if isinstance(redis, str) else redis
        if check_server:
            try:
                check_eviction(
                    self.client, f"Redis at {redact(redis)}" if isinstance(redis, str) else describe_client(self.client),
                    allowed=allowed_by_env() if allow_eviction is None else allow_eviction,
                    allow_hint="pass Seeder(..., allow_eviction=True) (or set STREAMS_ALLOW_EVICTION=1)",
                )
            except BaseException:
                self.close()
                raise
        self.crawl = crawl
        self.fingerprinter = fingerprinter or RequestFingerprinter()
        self.high_min = high_priority_min
        self.low_max = low_priority_max
        self.batch = batch
        self.codec = RequestCodec(None)
        self.frontier = Frontier(self.client, crawl, crawl_bloom(self.client, crawl))
        self.frontier.ensure_layout(shards)
        self.frontier.load_scripts()
        meta = self.frontier.crawl_meta()
        self.frontier.use_crawl_defaults(meta)
        self.legacy = meta.get(LEGACY_FIELD) or None
        # a URL's site: its host, or its registered domain when the crawl's workers run
        # with STREAMS_SITE_KEY="domain" (the first worker records it in the crawl meta)
        self._site_key = site_key or meta.get("site_key") or "host"
        self.site_of = site_keyer(self._site_key)
        #: a batch counts as added once a replica of each primary that took it has it
        #: (replicas.py; ``min_replicas`` as STREAMS_MIN_REPLICAS, -1 = auto)
        self.replicas = ReplicaGuard(self.client, ReplicaBook(min_replicas), 500, f"seeder-{os.getpid()}")
        self.replica_timeout_s = replica_timeout_s
        self.sender = Sender(self)

    def __enter__(self) -> Seeder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection if this Seeder opened it (a client passed in stays open)."""
        if self._owns_client:
            self.client.close()

    # -- turning input into seeds ------------------------------------------------------------

    def seed(
        self,
        requests: Iterable[str | Request],
        *,
        priority: int | None = None,
        meta: Mapping[str, Any] | None = None,
        callback: str | None = None,
        errback: str | None = None,
        site: str | None = None,
        dont_filter: bool = False,
    ) -> SeedResult:
        """Enqueue URLs (str) or Requests; returns the URLs added and the duplicates.

        ``priority``, ``meta``, ``site`` (into ``meta["site"]``) and ``dont_filter`` apply to
        every URL; for a Request, ``priority`` (if given) replaces its own, and ``meta``
        and ``site`` are added to its meta. ``callback`` and ``errback`` name spider methods.
        Blank strings and lines starting with ``#`` are skipped. A bad URL raises
        ValueError; a bad meta, site or task type raises SerializationError; what was
        sent before the error stays sent.
        """
        result = SeedResult()
        for part in self.seed_batches(
            requests, priority=priority, meta=meta, callback=callback, errback=errback, site=site, dont_filter=dont_filter,
        ):
            result += part
        return result

    def seed_batches(
        self,
        requests: Iterable[str | Request],
        *,
        priority: int | None = None,
        meta: Mapping[str, Any] | None = None,
        callback: str | None = None,
        errback: str | None = None,
        site: str | None = None,
        dont_filter: bool = False,
    ) -> Iterator[SeedResult]:
        """:meth:`seed`, one result per batch as each is confirmed (for a caller that counts
        as it goes, like ``streams-sched push``, instead of keeping every URL). Every batch
        is reported before an error in the input is raised."""
        seeds = self.seeds(
            requests, priority=priority, meta=meta, callback=callback, errback=errback, site=site, dont_filter=dont_filter,
        )
        wire = Wire(self.client)
        sent: Batch | None = None  # sent, its replies not read yet
        register = True
        try:
            while True:
                try:
                    chunk = self._take(seeds)
                except Exception:
                    # bad input: report what went out before it, then raise
                    if sent is not None:
                        done, sent = sent, None
                        yield self.sender.finish(wire, done)
                    raise
                if not chunk:
                    break
                batch = self.sender.prepare(chunk, wire, register)
                register = False
                # the next batch goes out before the replies of the previous one are read,
                # so that Redis has work while this process reads, reports and prepares
                self.sender.send(wire, batch)
                previous, sent = sent, batch
                if previous is not None:
                    yield self.sender.finish(wire, previous)
            if sent is not None:
                done, sent = sent, None
                yield self.sender.finish(wire, done)
        finally:
            wire.close()

    def seeds(
        self,
        requests: Iterable[str | Request],
        *,
        priority: int | None = None,
        meta: Mapping[str, Any] | None = None,
        callback: str | None = None,
        errback: str | None = None,
        site: str | None = None,
        dont_filter: bool = False,
    ) -> Iterator[Entry]:
        """The entries :meth:`seed` would send for ``requests``, one per URL or Request (blank
        and ``#`` lines skipped), without sending them; raises as :meth:`seed` does."""
        if site is not None:
            validate_site_name(site)
        for name in (callback, errback):
            if name is not None:
                check_name(name)
        extra = dict(meta or {})
        if site is not None:
            extra["site"] = site
        fast = url_entries(
            self.codec, self.fingerprinter, priority=priority or 0, meta=extra, callback=callback, errback=errback,
            dont_filter=dont_filter, high_min=self.high_min, low_max=self.low_max, legacy=self.legacy is not None,
            site_of=None if self._site_key == "host" else self.site_of,
        )
        for item in requests:
            if isinstance(item, str):
                url = item.strip()
                if not url or url.startswith("#"):
                    continue
                entry = fast(url) if fast is not None else None
                if entry is not None:
                    yield entry
                    continue
                request = Request(url, priority=priority or 0, meta=dict(extra) or None, dont_filter=dont_filter)
            else:
                request = _with_options(item, priority, extra, dont_filter)
            yield entry_for(
                request, self.codec, self.fingerprinter, high_min=self.high_min, low_max=self.low_max,
                site_of=self.site_of, legacy=self.legacy is not None, callback=callback, errback=errback,
                now=self.frontier.clock.now,
            )

    def _take(self, entries: Iterator[Entry]) -> list[Entry]:
        """The next batch of entries (fewer at the end; empty when there are none left)."""
        chunk: list[Entry] = []
        append = chunk.append
        n = self.batch
        for e in entries:
            append(e)
            if len(chunk) >= n:
                break
        return chunk

    # -- sending --------------------------------------------------------------------------------

    def send(self, entries: list[Entry]) -> SeedResult:
        """Enqueue prepared entries in one round trip per primary (after one SMISMEMBER with a
        legacy dupefilter)."""
        wire = Wire(self.client)
        try:
            batch = self.sender.prepare(entries, wire, True)
            self.sender.send(wire, batch)
            return self.sender.finish(wire, batch)
        finally:
            wire.close()


def _with_options(request: Request, priority: int | None, extra: dict[str, Any], dont_filter: bool) -> Request:
    """``request`` with the options of a :meth:`Seeder.seed` call applied: ``priority`` (if
    given) replaces its own, ``extra`` is added to its meta."""
    changes: dict[str, Any] = {}
    if priority is not None:
        changes["priority"] = priority
    if extra:
        changes["meta"] = {**request.meta, **extra}
    if dont_filter:
        changes["dont_filter"] = True
    return request.replace(**changes) if changes else request


def seed(
    redis: str | Any,
    crawl: str,
    requests: Iterable[str | Request],
    **options: Any,
) -> SeedResult:
    """One-shot :meth:`Seeder.seed`: connect, seed, close."""
    with Seeder(redis, crawl) as seeder:
        return seeder.seed(requests, **options)
