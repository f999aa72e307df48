"""Seed a crawl from any program: a web app, an Airflow task, a cron job.

::

    from streams_sched import Seeder

    with Seeder("redis://localhost:6379/0", crawl="books") as seeder:
        result = seeder.seed(["https://example.com/"], priority=5, callback="parse_list")
    result.added, result.duplicates      # the URLs of each kind

Seeds go through the same atomic enqueue as the workers' requests: fingerprinted
with Scrapy's own fingerprinter (pass the crawl's, e.g. ``crawler.request_fingerprinter``,
if the project changes REQUEST_FINGERPRINTER_CLASS), deduped by the site's Bloom filter
(and by a migrated scrapy-redis dupefilter, see :mod:`streams_sched.scrapy_redis.legacy`), and
routed by the site's policy: a seed that names no ``meta["task_type"]`` lands in the
browser streams of a site whose ``task_type`` is ``browser``.

Speed, for a frontier of millions of one-URL sites:

- A URL given as a string, with Scrapy's default fingerprinter, takes a path that
  builds no Request: the URL Scrapy's Request would hold (``safe_url_string``), the
  default fingerprint of it and the payload ``codec.encode`` would give are computed
  directly (the payload's fields after the URL are packed once per call), and a URL
  already in the form those functions leave unchanged skips them. Any other fingerprinter,
  a migrated scrapy-redis dupefilter or ``meta["verbatim_url"]`` takes the Request path.
- A batch is one enqueue.lua call per shard. Calls go out on one connection per
  primary, and the next batch is sent before the replies of the previous one are
  read: Redis works on one batch while this process prepares the next.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import hiredis
import msgpack
from redis.exceptions import NoScriptError, ResponseError
from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.request import fingerprint as scrapy_fingerprint
from w3lib.url import canonicalize_url, safe_url_string

from streams_sched.connect.clients import (
    TRANSIENT,
    connect_ready,
    is_cluster_client,
    redact,
    refresh_topology,
)
from streams_sched.connect.server_checks import allowed_by_env, check_eviction, describe_client
from streams_sched.errors import RedisUnavailable, SerializationError
from streams_sched.frontier import script_keys
from streams_sched.frontier.client import Frontier, Outgoing, crawl_bloom, parse_enqueue
from streams_sched.frontier.keys import (
    DEFAULT_SHARDS,
    SITE_TASK,
    TASK_TYPES,
    CrawlKeys,
    ShardKeys,
    SiteKeys,
    shard_of,
    stream_code,
    stream_for,
    validate_crawl_name,
    validate_site_name,
)
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD, legacy_fingerprint, legacy_seen
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.io.replicas import ReplicaBook, ReplicaGuard, Verdict
from streams_sched.worker.selection import band_for

__all__ = ["SITE_TASK", "Seed", "SeedResult", "Seeder", "outgoing_for", "seed"]

logger = logging.getLogger(__name__)


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


# --- plain URLs: what Request(url) and Scrapy's default fingerprinter make of them ----------

#: The JSON Scrapy's default fingerprinter hashes for a GET without body (json.dumps of
#: {"method", "url", "body", "headers"} with sort_keys), up to the URL.
_FP_HEAD = b'{"body": "", "headers": {}, "method": "GET", "url": '
#: A URL that safe_url_string leaves as it is and that canonicalize_url leaves as it is
#: (but for the "/" of an empty path): http(s), a lowercase host name whose last label
#: starts with a letter (no IP address, no IDNA, no port, no user), a path of unreserved
#: characters with no "." or ".." segment and no "//", no query, no fragment. Segments
#: are separated by exactly one "/", so a URL that does not match fails in linear time.
_PLAIN_URL = re.compile(
    r"https?://((?:[a-z0-9]+(?:-[a-z0-9]+)*\.)*[a-z][a-z0-9]*(?:-[a-z0-9]+)*)"
    r"(/(?:[A-Za-z0-9_~-][A-Za-z0-9_~.-]*(?:/[A-Za-z0-9_~-][A-Za-z0-9_~.-]*)*/?)?)?\Z"
)


def _url_facts(url: str) -> tuple[str, str | None, bytes]:
    """(``request.url``, its host name, its fingerprint) of ``Request(url)`` as Scrapy has
    them: the URL made safe, ``urlparse(request.url).hostname`` and the default
    RequestFingerprinter's fingerprint. Raises ValueError where Request(url) would."""
    m = _PLAIN_URL.match(url)
    if m is not None:
        canonical = url if m.group(2) else url + "/"
        return url, m.group(1), hashlib.sha1(_FP_HEAD + b'"' + canonical.encode() + b'"}').digest()
    safe = safe_url_string(url, "utf-8")
    if "://" not in safe and not safe.startswith(("about:", "data:")):
        raise ValueError(f"Missing scheme in request url: {safe}")
    host = urlsplit(safe).hostname
    canonical = canonicalize_url(safe)
    return safe, host, hashlib.sha1(_FP_HEAD + json.dumps(canonical).encode() + b"}").digest()


#: URLs checked against Scrapy itself before the first plain-URL seed of a process
_PROBE_URLS = (
    "http://s1.test/", "https://a-b.example.com/x/y.html", "http://a.test", "http://a.test/p/",
    "http://Ex.COM/p?b=2&a=1#f", "http://bücher.de/ü?q=ü", "http://a.test:8080/./x/../y",
    "HTTP://A.TEST:80/", "http://127.0.0.1/", "data:,x",
)


@functools.cache
def _facts_agree() -> bool:
    """True if :func:`_url_facts` agrees with this Scrapy and w3lib on the probe URLs; a
    version that changed how it makes URLs safe or fingerprints them turns the plain-URL
    path off (with a warning) instead of letting seeds dedupe apart from the workers."""
    fingerprinter = RequestFingerprinter()
    for url in _PROBE_URLS:
        request = Request(url)
        scrapy_facts = (request.url, urlparse_cached(request).hostname, fingerprinter.fingerprint(request))
        if _url_facts(url) != scrapy_facts:
            logger.warning(
                "seeding: this Scrapy (or w3lib) fingerprints %r otherwise than streams-sched expects;"
                " every seed goes through scrapy.Request (slower)", url,
            )
            return False
    return True


def _default_fingerprinter(fingerprinter: Any) -> bool:
    """True for Scrapy's own RequestFingerprinter (REQUEST_FINGERPRINTER_CLASS unchanged)."""
    return type(fingerprinter) is RequestFingerprinter and getattr(fingerprinter, "_fingerprint", None) is scrapy_fingerprint


# --- sending ----------------------------------------------------------------------------------


class _Call:
    """One enqueue.lua call: the sites of one shard in a batch, and then its reply."""

    __slots__ = ("shard", "sites", "command", "node", "reply")

    def __init__(self, shard: int, sites: list[str], command: bytes, node: str) -> None:
        self.shard = shard
        self.sites = sites
        self.command = command
        self.node = node
        self.reply: Any = None


@dataclass
class _Batch:
    """A batch of seeds on its way: its sites' seeds, its calls, a crawl registration."""

    by_site: dict[str, list[Seed]]
    calls: list[_Call]
    result: SeedResult
    register: str | None = None
    #: the primary the registration went to (the one to read its reply from)
    register_node: str = ""


class _Link:
    """One connection to one primary: commands are written to it now, replies read later, in order."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.conn = pool.get_connection()
        self.owed = 0

    def write(self, commands: list[bytes]) -> None:
        """Send commands packed in the Redis protocol, in one write."""
        self.owed += len(commands)
        self.conn.send_packed_command([b"".join(commands)], check_health=False)

    def read(self) -> Any:
        """The next reply; an error reply is returned, not raised."""
        self.owed -= 1
        try:
            return self.conn.read_response()
        except ResponseError as exc:
            return exc

    def close(self) -> None:
        if self.owed:
            # replies nobody will read (an error cut the batch short): the connection
            # cannot be used again
            self.conn.disconnect()
        self.pool.release(self.conn)


class _Wire:
    """The links of one seeding run: a connection per primary that takes calls of this run."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.cluster = is_cluster_client(client)
        self.links: dict[str, _Link] = {}

    def node_of(self, key: str) -> str:
        return str(self.client.get_node_from_key(key).name) if self.cluster else ""

    def link(self, node: str) -> _Link:
        link = self.links.get(node)
        if link is None:
            if self.cluster:
                target = self.client.get_node(node_name=node)
                pool = self.client.get_redis_connection(target).connection_pool
            else:
                pool = self.client.connection_pool
            link = self.links[node] = _Link(pool)
        return link

    def close(self) -> None:
        links, self.links = self.links, {}
        for link in links.values():
            link.close()


def _bulk(value: bytes) -> bytes:
    """One argument of a command in the Redis protocol (a bulk string)."""
    return b"$%d\r\n%b\r\n" % (len(value), value)


def _unpack(command: bytes) -> list[bytes]:
    """The arguments of a command packed in the Redis protocol."""
    reader = hiredis.Reader()
    reader.feed(command)
    parts: list[bytes] = reader.gets()
    return parts


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
        self._shard_parts: dict[int, tuple[str, int, bytes, bytes]] = {}

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
        wire = _Wire(self.client)
        sent: _Batch | None = None  # sent, its replies not read yet
        register = True
        try:
            while True:
                try:
                    chunk = self._take(seeds)
                except Exception:
                    # bad input: report what went out before it, then raise
                    if sent is not None:
                        done, sent = sent, None
                        yield self._finish(wire, done)
                    raise
                if not chunk:
                    break
                batch = self._prepare(chunk, wire, register)
                register = False
                # the next batch goes out before the replies of the previous one are read,
                # so that Redis has work while this process reads, reports and prepares
                self._send(wire, batch)
                previous, sent = sent, batch
                if previous is not None:
                    yield self._finish(wire, previous)
            if sent is not None:
                done, sent = sent, None
                yield self._finish(wire, done)
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
    ) -> Iterator[Seed]:
        """The seeds :meth:`seed` would send for ``requests``, one per URL or Request (blank
        and ``#`` lines skipped), without sending them; raises as :meth:`seed` does."""
        if site is not None:
            validate_site_name(site)
        for name in (callback, errback):
            if name is not None and (not name.isidentifier() or name.startswith("_")):
                raise ValueError(f"{name!r} is not a public method name of the spider")
        extra = dict(meta or {})
        if site is not None:
            extra["site"] = site
        plain = self._url_plan(priority or 0, extra, callback, errback, dont_filter)
        for item in requests:
            if isinstance(item, str):
                url = item.strip()
                if not url or url.startswith("#"):
                    continue
                if plain is not None:
                    fast = plain(url)
                    if fast is not None:
                        yield fast
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
            yield outgoing_for(
                request, self.codec, self.fingerprinter, high_min=self.high_min, low_max=self.low_max,
                callback=callback, errback=errback, legacy=self.legacy is not None, site_of=self.site_of,
            )

    def _url_plan(
        self, priority: Any, meta: dict[str, Any], callback: str | None, errback: str | None, dont_filter: bool
    ) -> Callable[[str], Seed | None] | None:
        """The Request-free path for URL strings of one call, or None where it does not apply:
        a fingerprinter of the project's own, a migrated scrapy-redis dupefilter (its
        fingerprint needs the Request), ``verbatim_url``, or options the Request path
        refuses (it then raises with its own message)."""
        if self.legacy is not None or "verbatim_url" in meta or not _default_fingerprinter(self.fingerprinter):
            return None
        if type(priority) is not int:
            return None
        task = meta.get("task_type")
        fixed_site = meta.get("site")
        if task is not None and task not in TASK_TYPES:
            return None
        if fixed_site is not None:
            try:
                validate_site_name(fixed_site)
            except ValueError:
                return None
        try:
            encode = self.codec.url_encoder(
                callback=callback, errback=errback, meta=meta, priority=priority, dont_filter=dont_filter,
            )
        except SerializationError:
            return None
        if not _facts_agree():
            return None
        stream = stream_for(task, band_for(priority, self.high_min, self.low_max))
        site_of = None if self._site_key == "host" else self.site_of
        facts = _url_facts

        def plan(url: str) -> Seed | None:
            try:
                request_url, host, fp = facts(url)
            except ValueError:
                return None  # the Request path raises Scrapy's own error
            if fixed_site is not None:
                name = fixed_site
            elif not host:
                name = "_nohost"
            else:
                name = host if site_of is None else site_of(host)
            return Seed(name, Outgoing(b"" if dont_filter else fp, stream, 0, encode(request_url)), request_url)

        return plan

    def _take(self, seeds: Iterator[Seed]) -> list[Seed]:
        """The next batch of seeds (fewer at the end; empty when there are none left)."""
        chunk: list[Seed] = []
        append = chunk.append
        n = self.batch
        for s in seeds:
            append(s)
            if len(chunk) >= n:
                break
        return chunk

    # -- sending --------------------------------------------------------------------------------

    def send(self, seeds: list[Seed]) -> SeedResult:
        """Enqueue prepared seeds in one round trip per primary (after one SMISMEMBER with a
        legacy dupefilter)."""
        wire = _Wire(self.client)
        try:
            batch = self._prepare(seeds, wire, True)
            self._send(wire, batch)
            return self._finish(wire, batch)
        finally:
            wire.close()

    def _shard_part(self, shard: int) -> tuple[str, int, bytes, bytes]:
        """A shard's first key, the number and the RESP of the keys enqueue.lua takes for the
        shard itself, and the prefix of its sites' keys (bytes)."""
        part = self._shard_parts.get(shard)
        if part is None:
            probe = SiteKeys(self.crawl, "\x00", shard)
            if not probe.base.endswith("\x00"):  # pragma: no cover - keys.py puts the site last
                raise AssertionError(f"site keys of {probe!r} do not end with the site")
            keys = script_keys.enqueue(ShardKeys(self.crawl, shard), [])
            part = (keys[0], len(keys), b"".join(_bulk(k.encode()) for k in keys), probe.base[:-1].encode())
            self._shard_parts[shard] = part
        return part

    def _site_layout(self, now: float) -> tuple[list[bytes], list[bytes]]:
        """The suffixes of the keys enqueue.lua takes per site (after the site's key prefix;
        the same for every site at time ``now``: revisit buckets change with it), and the
        call's ARGV head, as :meth:`Frontier.enqueue_shard` builds them, as bytes."""
        f, b = self.frontier, self.frontier.bloom
        probe = "\x00"
        k = SiteKeys(self.crawl, probe, 0)
        if b.revisit_seconds:
            filters: list[str] = []
            for bucket in b.buckets(now):
                filters += k.seen_bucket(bucket)
        else:
            filters = [k.seen, k.seen_meta]
        keys = script_keys.enqueue(k.index, [(k, filters)])[len(script_keys.enqueue(k.index, [])):]
        if not all(key.startswith(k.base) for key in keys):  # pragma: no cover - keys.py puts the site last
            raise AssertionError("enqueue.lua's site keys do not all start with the site's key prefix")
        suffixes = [key[len(k.base):].encode() for key in keys]
        ttl = b.bucket_ttl if b.revisit_seconds else 0
        # numbers as redis-py sends them (repr)
        head = [f.group, b.mode, repr(b.error_rate), repr(b.capacity), repr(b.expansion), repr(ttl),
                f.default_task, repr(len(filters) // 2)]
        return suffixes, [str(v).encode() for v in head]

    def _prepare(self, seeds: list[Seed], wire: _Wire, register: bool) -> _Batch:
        """Group a batch by site and shard into enqueue.lua calls (after dropping what a
        migrated scrapy-redis dupefilter saw), each packed as Redis protocol: what redis-py
        would send for :meth:`Frontier.enqueue_shard`, byte for byte, built from per-site
        templates (a million sites' keys cost less as one formatting each than as eleven
        arguments to pack)."""
        result = SeedResult()
        if self.legacy is not None:
            checked = [s for s in seeds if s.legacy_fp]
            for s, seen in zip(checked, legacy_seen(self.client, self.legacy, [s.legacy_fp for s in checked]), strict=True):
                if seen:
                    result.duplicates.append(s.url)
                    s.url = ""
            seeds = [s for s in seeds if s.url]
        by_site: dict[str, list[Seed]] = {}
        for s in seeds:
            items = by_site.get(s.site)
            if items is None:
                by_site[s.site] = [s]
            else:
                items.append(s)
        shards = self.frontier.shards
        by_shard: dict[int, list[str]] = defaultdict(list)
        for name in by_site:
            by_shard[shard_of(name, shards)].append(name)
        calls: list[_Call] = []
        if by_shard:
            suffixes, head = self._site_layout(time.time())
            n_sfx = len(suffixes)
            head_resp = b"".join(_bulk(v) for v in head)
            templates: dict[int, bytes] = {}  # by key prefix length: the RESP of a site's keys
            codes: dict[tuple[int, int], bytes] = {}  # (stream, delay) -> their RESP
            start = _bulk(b"EVALSHA") + _bulk(self.frontier.scripts.enqueue.sha.encode())
            for shard, sites in by_shard.items():
                first_key, n_shard_keys, shard_resp, prefix = self._shard_part(shard)
                keys: list[bytes] = [shard_resp]
                args: list[bytes] = [head_resp]
                nargs = len(head)
                for name in sites:
                    site_b = name.encode()
                    base = prefix + site_b
                    template = templates.get(len(base))
                    if template is None:
                        template = templates[len(base)] = b"".join(
                            b"$%d\r\n%%b%b\r\n" % (len(base) + len(sfx), sfx.replace(b"%", b"%%")) for sfx in suffixes
                        )
                    keys.append(template % ((base,) * n_sfx))
                    items = by_site[name]
                    args.append(b"$%d\r\n%b\r\n%b" % (len(site_b), site_b, _bulk(b"%d" % len(items))))
                    nargs += 2 + 4 * len(items)
                    for s in items:
                        o = s.out
                        cd = codes.get((o.stream, o.delay_ms))
                        if cd is None:
                            cd = codes[(o.stream, o.delay_ms)] = _bulk(b"%d" % stream_code(o.stream)) + _bulk(b"%d" % o.delay_ms)
                        fp, payload = o.fp, o.payload
                        args.append(b"$%d\r\n%b\r\n%b$%d\r\n%b\r\n" % (len(fp), fp, cd, len(payload), payload))
                nkeys = n_shard_keys + n_sfx * len(sites)
                command = b"".join([b"*%d\r\n" % (3 + nkeys + nargs), start, _bulk(b"%d" % nkeys), *keys, *args])
                calls.append(_Call(shard, sites, command, wire.node_of(first_key)))
        return _Batch(by_site, calls, result, CrawlKeys.registry() if register else None)

    def _send(self, wire: _Wire, batch: _Batch) -> None:
        """Write a batch's calls (after the crawl's registration, on the first) on the links
        of their primaries, one write per primary. :meth:`_read` reads in the same order."""
        out: dict[str, list[bytes]] = defaultdict(list)
        if batch.register is not None:
            sadd = b"*3\r\n" + _bulk(b"SADD") + _bulk(batch.register.encode()) + _bulk(self.crawl.encode())
            batch.register_node = wire.node_of(batch.register)
            out[batch.register_node].append(sadd)
        for call in batch.calls:
            out[call.node].append(call.command)
        try:
            for node, commands in out.items():
                wire.link(node).write(commands)
        except TRANSIENT:
            refresh_topology(self.client)
            raise

    def _read(self, wire: _Wire, batch: _Batch) -> None:
        """Read a batch's replies; calls the server refused to run (scripts lost, slot moved)
        run again on their own."""
        redo: list[_Call] = []
        try:
            if batch.register is not None:
                reply = wire.link(batch.register_node).read()
                if isinstance(reply, Exception):
                    raise reply
            for call in batch.calls:
                call.reply = reply = wire.link(call.node).read()
                if isinstance(reply, NoScriptError) or (isinstance(reply, ResponseError) and _is_moved(reply)):
                    redo.append(call)
                elif isinstance(reply, Exception):
                    raise reply
        except TRANSIENT:
            refresh_topology(self.client)
            raise
        if redo:
            # Nothing of a call that got NOSCRIPT or MOVED ran (the whole call is one
            # script on one slot): load the scripts (a new master after a failover, a
            # restart, SCRIPT FLUSH), learn where the slots are, and run those calls again.
            if any(_is_moved(c.reply) for c in redo):
                refresh_topology(self.client)
            self.frontier.load_scripts()
            for call in redo:
                call.reply = self._run(call)

    def _run(self, call: _Call) -> Any:
        """Run one call through redis-py (it reloads a lost script, follows a moved slot)."""
        command = _unpack(call.command)
        nkeys = int(command[2])
        keys, args = [k.decode() for k in command[3 : 3 + nkeys]], command[3 + nkeys :]
        f = self.frontier
        return f.scripts.call(f.scripts.enqueue, keys, args)

    def _finish(self, wire: _Wire, batch: _Batch) -> SeedResult:
        """Read a batch's replies, wait until a replica has it, and say what was added."""
        self._read(wire, batch)
        self._replicated(batch)
        result = batch.result
        added, dups = result.added, result.duplicates
        by_site = batch.by_site
        one = ord("1")
        for call in batch.calls:
            for name, part in zip(call.sites, call.reply, strict=True):
                flags = parse_enqueue(part)[3]
                for s, flag in zip(by_site[name], flags, strict=True):
                    (added if flag == one else dups).append(s.url)
        return result

    def _replicated(self, batch: _Batch) -> None:
        """Return once what a batch wrote is on a replica of each primary that took it (where
        the primary has one), so that what :meth:`send` reports as added survives a failover.
        A primary that is gone or replaced gets the batch again (dedupe makes that safe)."""
        guard, f = self.replicas, self.frontier
        if not batch.calls and batch.register is None:
            return
        targets = {guard.primary_of(ShardKeys(self.crawl, c.shard).sync): ShardKeys(self.crawl, c.shard).sync for c in batch.calls}
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
                        self.client.sadd(CrawlKeys.registry(), self.crawl)
                        for call in batch.calls:
                            self._run(call)
                    except TRANSIENT:
                        pass  # the new primary is not there yet: try again
                time.sleep(0.05)


def _is_moved(exc: Any) -> bool:
    """A cluster redirection: the slot moved (resharding, failover) since the client read the map."""
    text = str(exc)
    return isinstance(exc, ResponseError) and (
        text.startswith(("MOVED", "ASK")) or type(exc).__name__ in ("MovedError", "AskError")
    )


def seed(
    redis: str | Any,
    crawl: str,
    requests: Iterable[str | Request],
    **options: Any,
) -> SeedResult:
    """One-shot :meth:`Seeder.seed`: connect, seed, close."""
    with Seeder(redis, crawl) as seeder:
        return seeder.seed(requests, **options)
