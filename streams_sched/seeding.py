"""Seed a crawl from any program: a web app, an Airflow task, a cron job.

::

    from streams_sched import Seeder

    with Seeder("redis://localhost:6379/0", crawl="books") as seeder:
        result = seeder.seed(["https://example.com/"], priority=5, callback="parse_list")
    result.added, result.duplicates      # the URLs of each kind

Seeds go through the same atomic enqueue as the workers' requests: fingerprinted
with Scrapy's own fingerprinter (pass the crawl's, e.g. ``crawler.request_fingerprinter``,
if the project changes REQUEST_FINGERPRINTER_CLASS), deduped by the site's Bloom filter
(and by a migrated scrapy-redis dupefilter, see :mod:`streams_sched.legacy`), and
routed by the site's policy: a seed that names no ``meta["task_type"]`` lands in the
browser streams of a site whose ``task_type`` is ``browser``. One pipeline per batch;
on Redis Cluster the pipeline is split per node by redis-py.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgpack
from redis.exceptions import NoScriptError
from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter

from .codec import RequestCodec
from .connection import TRANSIENT, connect_ready, redact, refresh_topology
from .errors import RedisUnavailable, SerializationError
from .frontier import Frontier, Outgoing, crawl_bloom, parse_enqueue
from .keys import (
    DEFAULT_SHARDS,
    SITE_TASK,
    TASK_TYPES,
    shard_of,
    stream_for,
    validate_crawl_name,
    validate_site_name,
)
from .legacy import LEGACY_FIELD, legacy_fingerprint, legacy_seen
from .replicas import ReplicaBook, ReplicaGuard, Verdict
from .selection import band_for
from .server_checks import allowed_by_env, check_eviction, describe_client
from .sitekey import site_keyer

__all__ = ["SITE_TASK", "Seed", "SeedResult", "Seeder", "outgoing_for", "seed"]



@dataclass
class SeedResult:
    """What one :meth:`Seeder.seed` call did: URLs added, URLs that were duplicates."""

    added: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    def __iadd__(self, other: SeedResult) -> SeedResult:
        self.added += other.added
        self.duplicates += other.duplicates
        return self


@dataclass(slots=True)
class Seed:
    """A request ready to enqueue: its site, the Outgoing entry, and scrapy-redis's fingerprint."""

    site: str
    out: Outgoing
    url: str
    legacy_fp: bytes = b""


def _callback_name(func: Any, given: str | None, what: str) -> str | None:
    if given is not None:
        name = given
    elif func is None:
        return None
    elif isinstance(func, str):
        name = func
    else:
        name = getattr(func, "__name__", "")
    if not name.isidentifier() or name.startswith("_"):
        raise SerializationError(repr(func or given), what, f"{name!r} is not a public method name of the spider")
    return name


def outgoing_for(
    request: Request,
    codec: RequestCodec,
    fingerprinter: Any,
    *,
    high_min: int = 1,
    low_max: int = -1,
    callback: str | None = None,
    errback: str | None = None,
    fingerprint: bytes | None = None,
    legacy: bool = False,
    site_of: Callable[[str], str] | None = None,
) -> Seed:
    """Turn a request into what enqueue.lua takes. Callbacks are spider methods by
    name (``callback``, or the ``__name__`` of the request's own); raises
    SerializationError (bad meta, site, task type) or ValueError. ``site_of`` maps a
    host name to its site (STREAMS_SITE_KEY; default: the host itself)."""
    meta = request.meta
    site = meta.get("site")
    if site is None:
        host = urlparse_cached(request).hostname
        site = (site_of(host) if site_of is not None else host) if host else "_nohost"
    else:
        try:
            validate_site_name(site)
        except ValueError as exc:
            raise SerializationError(repr(request), "meta['site']", str(exc)) from None
    task = meta.get("task_type")
    if task is not None and task not in TASK_TYPES:
        raise SerializationError(repr(request), "meta['task_type']", f"unknown task type {task!r}; expected one of {list(TASK_TYPES)}")
    cb = _callback_name(request.callback, callback, "callback")
    eb = _callback_name(request.errback, errback, "errback")
    if codec.spider is None and (request.callback is not None or request.errback is not None):
        request = request.replace(callback=None, errback=None)
    payload = codec.encode(request)
    if codec.spider is None and (cb or eb):
        d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
        if cb:
            d["c"] = cb
        if eb:
            d["e"] = eb
        payload = msgpack.packb(d, use_bin_type=True)
    if fingerprint is not None:
        fp = fingerprint
    else:
        fp = b"" if request.dont_filter else fingerprinter.fingerprint(request)
    band = band_for(request.priority, high_min, low_max)
    stream = stream_for(task, band)
    lfp = legacy_fingerprint(request) if legacy and not request.dont_filter else b""
    return Seed(site, Outgoing(fp, stream, 0, payload), request.url, lfp)


class Seeder:
    """Adds seed requests to one crawl. Thread-safe only per instance (one per thread).

    ``redis`` is a REDIS_URL (``?cluster=1`` for Redis Cluster, ``redis+sentinel://`` for the
    master of a Sentinel service) or a redis-py client.

    It checks the server's eviction policy first (:mod:`streams_sched.server_checks`):
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
        self.site_of = site_keyer(site_key or meta.get("site_key") or "host")
        #: a batch counts as added once a replica of each primary that took it has it
        #: (replicas.py; ``min_replicas`` as STREAMS_MIN_REPLICAS, -1 = auto)
        self.replicas = ReplicaGuard(self.client, ReplicaBook(min_replicas), 500, f"seeder-{os.getpid()}")
        self.replica_timeout_s = replica_timeout_s

    def __enter__(self) -> Seeder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection if this Seeder opened it (a client passed in stays open)."""
        if self._owns_client:
            self.client.close()

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
        if site is not None:
            validate_site_name(site)
        for name in (callback, errback):
            if name is not None and (not name.isidentifier() or name.startswith("_")):
                raise ValueError(f"{name!r} is not a public method name of the spider")
        extra = dict(meta or {})
        if site is not None:
            extra["site"] = site
        result = SeedResult()
        batch: list[Seed] = []
        for item in requests:
            if isinstance(item, str):
                url = item.strip()
                if not url or url.startswith("#"):
                    continue
                request = Request(url, priority=priority or 0, meta=dict(extra) or None, dont_filter=dont_filter)
            else:
                request = item
                changes: dict[str, Any] = {}
                if priority is not None:
                    changes["priority"] = priority
                if extra:
                    changes["meta"] = {**request.meta, **extra}
                if dont_filter:
                    changes["dont_filter"] = True
                if changes:
                    request = request.replace(**changes)
            batch.append(
                outgoing_for(
                    request, self.codec, self.fingerprinter, high_min=self.high_min, low_max=self.low_max,
                    callback=callback, errback=errback, legacy=self.legacy is not None,
                    site_of=self.site_of,
                )
            )
            if len(batch) >= self.batch:
                result += self.send(batch)
                batch = []
        if batch:
            result += self.send(batch)
        return result

    def send(self, seeds: list[Seed]) -> SeedResult:
        """Enqueue prepared seeds in one pipeline (after one SMISMEMBER with a legacy dupefilter)."""
        result = SeedResult()
        if self.legacy is not None:
            checked = [s for s in seeds if s.legacy_fp]
            for s, seen in zip(checked, legacy_seen(self.client, self.legacy, [s.legacy_fp for s in checked]), strict=True):
                if seen:
                    result.duplicates.append(s.url)
                    s.url = ""
            seeds = [s for s in seeds if s.url]
        by_site: dict[str, list[Seed]] = defaultdict(list)
        for s in seeds:
            by_site[s.site].append(s)
        if not by_site:
            return result
        # one enqueue.lua call per shard (it registers the sites it adds to)
        f = self.frontier
        shards = f.shards
        by_shard: dict[int, list[str]] = defaultdict(list)
        for site in by_site:
            by_shard[shard_of(site, shards)].append(site)
        order = [site for sites in by_shard.values() for site in sites]

        def send_all() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            f.register(pipe)
            for sites in by_shard.values():
                f.enqueue_shard([(site, [it.out for it in by_site[site]]) for site in sites], pipe)
            return [part for reply in pipe.execute()[1:] for part in reply]

        try:
            replies = send_all()
        except NoScriptError:
            # The server has lost its script cache since the Seeder loaded the scripts: a
            # new master after a failover, a restart, SCRIPT FLUSH. No enqueue ran (they all
            # call the one script), and registering again changes nothing: load and resend.
            self.frontier.load_scripts()
            replies = send_all()
        self._replicated(list(by_shard.values()), send_all)
        for site, reply in zip(order, replies, strict=True):
            items = by_site[site]
            flags = parse_enqueue(reply)[3]
            for it, flag in zip(items, flags, strict=True):
                (result.added if flag == ord("1") else result.duplicates).append(it.url)
        return result


    def _replicated(self, shards: list[list[str]], send_all: Any) -> None:
        """Return once what a batch wrote is on a replica of each primary that took it (where
        the primary has one), so that what :meth:`send` reports as added survives a failover.
        A primary that is gone or replaced gets the batch again (dedupe makes that safe)."""
        guard, f = self.replicas, self.frontier
        targets = {guard.primary_of(f.site(s[0]).sync): f.site(s[0]).sync for s in shards}
        targets.setdefault(guard.primary_of(f.keys.sync), f.keys.sync)  # the crawl registry
        deadline = time.monotonic() + self.replica_timeout_s
        for primary, key in targets.items():
            while True:
                now = time.monotonic()
                if guard.required(primary, now) == 0:
                    break
                verdict = guard.barrier(primary, key, now)
                if verdict is Verdict.PASS:
                    break
                if now > deadline:
                    raise RedisUnavailable(
                        f"seeds of crawl {self.crawl!r} are on Redis primary {primary or '(this server)'} but on"
                        f" none of its replicas after {self.replica_timeout_s:g}s: a failover would lose them."
                        " Seed again once the replica is back (seeding is idempotent), or pass min_replicas=0"
                    )
                if verdict is Verdict.RESEND:
                    refresh_topology(self.client)
                    try:
                        send_all()
                    except TRANSIENT:
                        pass  # the new primary is not there yet: try again
                time.sleep(0.05)


def seed(
    redis: str | Any,
    crawl: str,
    requests: Iterable[str | Request],
    **options: Any,
) -> SeedResult:
    """One-shot :meth:`Seeder.seed`: connect, seed, close."""
    with Seeder(redis, crawl) as seeder:
        return seeder.seed(requests, **options)
