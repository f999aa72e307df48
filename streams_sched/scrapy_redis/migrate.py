"""Copy a half-done scrapy-redis crawl into a streams-sched crawl.

What a scrapy-redis 0.9.1 crawl leaves in Redis, and where each part goes:

- ``<spider>:start_urls`` (list, set or zset of plain URLs or JSON entries): read
  without removing, parsed as the feed is (feed.py), and seeded (deduped, and
  checked against the legacy dupefilter below, like every new request).
- ``<spider>:dupefilter`` (SET of scrapy-redis fingerprints, see legacy.py): copied
  into ``ss:{C}:legacy-seen`` (SADD, idempotent) and recorded in the crawl's meta
  hash, so workers drop any request scrapy-redis already saw.
- ``<spider>:requests`` (pickled ``Request.to_dict`` entries: a ZSET for
  PriorityQueue, a LIST for FifoQueue and LifoQueue): unpickled only with
  ``trust_pickle`` (unpickling runs code), turned into payloads (callbacks by name)
  and enqueued **without** the legacy check (scrapy-redis put them in its SET when
  it queued them; they were never crawled). A ``dont_filter`` request is deduped by
  a digest of its entry, so a second run adds nothing.

The source is only read: the scrapy-redis crawl stays as it was.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

from streams_sched.errors import EntryError, SerializationError, StreamsSchedError
from streams_sched.frontier.entries import entry_for
from streams_sched.frontier.records import Entry
from streams_sched.frontier.seeding import Seeder, SeedResult
from streams_sched.scrapy_redis.feed import parse_feed_entry
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD
from streams_sched.wire.codec import RequestCodec

__all__ = ["MIGRATE_DLQ_SITE", "MigrationCounts", "PickleRefused", "ScrapyRedisCrawl", "request_from_scrapy_redis"]

#: The pseudo-site whose dead-letter stream holds entries that could not be migrated.
MIGRATE_DLQ_SITE = "_migrate"

_CLASSES: dict[str, type[Request]] = {
    "scrapy.http.request.Request": Request,
    "scrapy.Request": Request,
    "scrapy.http.Request": Request,
    "scrapy.http.request.form.FormRequest": FormRequest,
    "scrapy.http.FormRequest": FormRequest,
    "scrapy.FormRequest": FormRequest,
    "scrapy.http.request.json_request.JsonRequest": JsonRequest,
    "scrapy.http.JsonRequest": JsonRequest,
}


class PickleRefused(StreamsSchedError):
    """Raised when a pending request queue would have to be unpickled without --trust-pickle."""


def request_from_scrapy_redis(raw: bytes) -> tuple[Request, str | None, str | None]:
    """Unpickle one scrapy-redis queue entry (a ``Request.to_dict``) into a request
    without callbacks, and the callback and errback names. RUNS PICKLE: trusted data only."""
    try:
        d = pickle.loads(raw)  # noqa: S301 - only with --trust-pickle
    except Exception as exc:
        raise EntryError(f"entry does not unpickle: {type(exc).__name__}: {exc}") from None
    if not isinstance(d, dict) or not isinstance(d.get("url"), str):
        raise EntryError(f"entry is a {type(d).__name__}, not a scrapy-redis request dict")
    cls_path = d.get("_class", "scrapy.http.request.Request")
    cls = _CLASSES.get(cls_path)
    if cls is None:
        raise EntryError(f"request class {cls_path} is not FormRequest or JsonRequest; migrate it by hand")
    kwargs = {k: d[k] for k in ("url", "headers", "method", "body", "cookies", "meta", "priority", "dont_filter", "flags", "cb_kwargs") if d.get(k) is not None}
    kwargs["encoding"] = d.get("_encoding") or "utf-8"
    try:
        request = cls(**kwargs)
    except Exception as exc:
        raise EntryError(f"Scrapy rejects the request: {type(exc).__name__}: {exc}") from None
    return request, d.get("callback"), d.get("errback")


@dataclass
class Part:
    """Counts of one part of the migration."""

    found: int = 0
    read: int = 0
    added: int = 0
    duplicates: int = 0
    dead: int = 0

    def take(self, result: SeedResult) -> None:
        self.added += len(result.added)
        self.duplicates += len(result.duplicates)


@dataclass
class MigrationCounts:
    """What a migration found (``found``) and did."""

    start_urls: Part = field(default_factory=Part)
    start_urls_kind: str = "none"
    queue: Part = field(default_factory=Part)
    queue_kind: str = "none"
    dupefilter: Part = field(default_factory=Part)


def _kind(client: Any, key: str) -> str:
    t = client.type(key)
    return t.decode() if isinstance(t, bytes) else str(t)


class ScrapyRedisCrawl:
    """One scrapy-redis crawl (``source``) and the streams-sched crawl it moves to (``seeder``)."""

    def __init__(
        self,
        source: Any,
        seeder: Seeder | None,
        *,
        start_urls_key: str,
        queue_key: str,
        dupefilter_key: str,
        lifo: bool = False,
        chunk: int = 500,
        encoding: str = "utf-8",
    ) -> None:
        self.source = source
        self.seeder = seeder
        self.start_urls_key = start_urls_key
        self.queue_key = queue_key
        self.dupefilter_key = dupefilter_key
        self.lifo = lifo
        self.chunk = chunk
        self.encoding = encoding
        self.node = "migrate-scrapy-redis"

    def _s(self) -> Seeder:
        if self.seeder is None:
            raise RuntimeError("ScrapyRedisCrawl.seeder is not set: counting needs none, copying does")
        return self.seeder

    def count(self) -> MigrationCounts:
        """What there is to migrate (reads only)."""
        c = MigrationCounts()
        s = self.source
        c.start_urls_kind = _kind(s, self.start_urls_key)
        c.start_urls.found = _size(s, self.start_urls_key, c.start_urls_kind)
        c.queue_kind = _kind(s, self.queue_key)
        c.queue.found = _size(s, self.queue_key, c.queue_kind)
        kind = _kind(s, self.dupefilter_key)
        c.dupefilter.found = int(s.scard(self.dupefilter_key)) if kind == "set" else 0
        for name, k in (("start URLs", c.start_urls_kind), ("request queue", c.queue_kind)):
            if k not in ("none", "list", "set", "zset"):
                raise StreamsSchedError(f"the scrapy-redis {name} key is a {k}; expected a list, set or zset")
        if c.queue_kind == "set":
            raise StreamsSchedError(f"{self.queue_key} is a set; scrapy-redis queues are a zset or a list")
        return c

    # -- reading ---------------------------------------------------------

    def _entries(self, key: str, kind: str, oldest_first: bool = True) -> Iterator[list[bytes]]:
        s, n = self.source, self.chunk
        if kind == "list":
            total = int(s.llen(key))
            # LPUSH puts the newest at the head: FIFO order is from the tail
            for start in range(0, total, n):
                if oldest_first:
                    chunk = s.lrange(key, -(start + n), -(start + 1))
                    yield list(reversed(chunk))
                else:
                    yield list(s.lrange(key, start, start + n - 1))
        elif kind == "zset":
            total = int(s.zcard(key))
            for start in range(0, total, n):
                yield list(s.zrange(key, start, start + n - 1))  # score = -priority: most urgent first
        elif kind == "set":
            cursor = 0
            while True:
                cursor, members = s.sscan(key, cursor, count=n)
                if members:
                    yield list(members)
                if int(cursor) == 0:
                    break

    # -- the three parts -----------------------------------------------------

    def copy_dupefilter(self, progress: Callable[[int], None] = lambda n: None) -> Part:
        """Copy the fingerprint SET into ss:{C}:legacy-seen and record it for the workers."""
        part = Part(found=int(self.source.scard(self.dupefilter_key)))
        target = self._s().client
        keys = self._s().frontier.keys
        for chunk in self._entries(self.dupefilter_key, "set"):
            part.read += len(chunk)
            part.added += int(target.sadd(keys.legacy_seen, *chunk))
            progress(len(chunk))
        part.duplicates = part.read - part.added
        if part.read or target.exists(keys.legacy_seen):
            target.hset(keys.meta, LEGACY_FIELD, keys.legacy_seen)
            self._s().legacy = keys.legacy_seen
        self._s().frontier.register()
        return part

    def copy_start_urls(self, kind: str, progress: Callable[[int], None] = lambda n: None) -> Part:
        s = self._s()

        def entries_of(raw: bytes) -> list[Entry]:
            return [
                entry_for(
                    r, s.codec, s.fingerprinter, high_min=s.high_min, low_max=s.low_max, legacy=s.legacy is not None,
                    site_of=s.site_of, now=s.frontier.clock.now,
                )
                for r in parse_feed_entry(raw, self.encoding)
            ]

        return self._copy(self._entries(self.start_urls_key, kind), entries_of, self.start_urls_key, progress)

    def copy_queue(self, kind: str, trust_pickle: bool, progress: Callable[[int], None] = lambda n: None) -> Part:
        if kind == "none":
            return Part()
        if not trust_pickle:
            raise PickleRefused(
                f"{self.queue_key} holds pickled requests, and unpickling runs whatever code the data"
                " names: anyone who could write to this Redis could run code on this machine. Pass"
                " --trust-pickle if only your own scrapy-redis workers ever wrote to it (or migrate"
                " without the queue: --skip-queue)"
            )
        s = self._s()
        codec = RequestCodec(None)

        def entries_of(raw: bytes) -> list[Entry]:
            request, cb, eb = request_from_scrapy_redis(raw)
            # a dont_filter request is deduped by its entry, so a second run adds nothing
            fp = hashlib.sha1(b"ss-migrate:" + raw).digest() if request.dont_filter else None
            return [entry_for(
                request, codec, s.fingerprinter, high_min=s.high_min, low_max=s.low_max,
                callback=cb, errback=eb, fingerprint=fp, site_of=s.site_of, now=s.frontier.clock.now,
            )]

        return self._copy(self._entries(self.queue_key, kind, oldest_first=not self.lifo), entries_of, self.queue_key, progress)

    def _copy(
        self, chunks: Iterable[list[bytes]], entries_of: Callable[[bytes], list[Entry]], origin: str,
        progress: Callable[[int], None],
    ) -> Part:
        """Seed the entries of each chunk of raw values; a value that cannot become an entry
        goes to the dead letters with the reason."""
        part = Part()
        s = self._s()
        for chunk in chunks:
            entries: list[Entry] = []
            dead: list[tuple[bytes, str]] = []
            for raw in chunk:
                try:
                    entries += entries_of(raw)
                except (EntryError, SerializationError, ValueError) as exc:
                    dead.append((raw, str(exc)))
            part.read += len(chunk)
            part.take(s.send(entries))
            part.dead += self._dead_letter(dead, origin)
            progress(len(chunk))
        return part

    def _dead_letter(self, entries: list[tuple[bytes, str]], origin: str) -> int:
        """Record entries that cannot be migrated, once each (a second run finds them there)."""
        if not entries:
            return 0
        f = self._s().frontier
        keys = f.site(MIGRATE_DLQ_SITE)
        client = self._s().client
        done_key = keys.stats
        new = 0
        pipe = client.pipeline(transaction=False)
        ts = int(f.clock.now() * 1000)  # the scripts' dead letters have Redis time
        for raw, reason in entries:
            digest = hashlib.sha1(raw).hexdigest()
            if client.hsetnx(done_key, f"entry:{digest}", 1):
                pipe.xadd(keys.dlq, {"r": raw, "reason": reason, "stream": origin, "id": "", "deliveries": 0, "node": self.node, "ts": ts})
                pipe.hincrby(keys.stats, "dead", 1)
                new += 1
        f.register_sites([MIGRATE_DLQ_SITE], pipe)
        pipe.execute()
        return new


def _size(client: Any, key: str, kind: str) -> int:
    if kind == "list":
        return int(client.llen(key))
    if kind == "set":
        return int(client.scard(key))
    if kind == "zset":
        return int(client.zcard(key))
    return 0
