"""Move what scrapy-redis producers push into ``<spider>:start_urls`` into the frontier.

Producers stay unchanged: they LPUSH (or SADD, or ZADD) plain URLs or scrapy-redis's
JSON entries into the feed key. Each worker's I/O thread (never the reactor) runs
:meth:`FeedMover.move` now and then:

1. ``LLEN`` (``SCARD``, ``ZCARD``): nothing to do when the feed is empty (one command).
2. ``SET ss:{C}:feed-lock <node> NX PX`` and read a batch **without removing it**
   (``LRANGE key -N -1``, the oldest of an LPUSH feed; ``SRANDMEMBER``; ``ZREVRANGE``).
3. Parse each entry, then one pipeline: enqueue.lua per site (dedupe + XADD), and the
   entries that are not requests into the dead-letter stream ``ss:{C/_feed}:dlq``.
4. Only once Redis confirmed step 3: remove exactly those entries (``LREM key -1 e``
   per entry, ``SREM``, ``ZREM``), and free the lock.

A worker that dies between 2 and 4 leaves its entries in the feed: the next mover
enqueues them again and the seen filter answers "duplicate", so nothing is lost and
nothing is crawled twice (a ``dont_filter`` entry would be, which is why feed entries
are always deduped). The feed key has no hash tag, so on Redis Cluster it lives on
another slot than the crawl: no script can span both, hence this read / enqueue /
remove order instead of one atomic move. The lock only keeps two movers from doing
the same work; it is not needed for safety (it expires after ``lock_ms`` if its
holder dies; LREM removes one occurrence per entry read, so a URL pushed again
meanwhile is still there for the next move, where dedupe drops it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from scrapy import Request
from scrapy.http import FormRequest

from streams_sched.errors import EntryError, SerializationError
from streams_sched.frontier.batches import drop_legacy_seen, queue_enqueues
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import entry_for
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import enqueue
from streams_sched.scrapy_redis.legacy import legacy_key
from streams_sched.wire.codec import RequestCodec

__all__ = ["FEED_DLQ_SITE", "FEED_KINDS", "FeedMover", "MoveResult", "parse_feed_entry"]

logger = logging.getLogger(__name__)

#: The pseudo-site whose dead-letter stream holds bad feed entries.
FEED_DLQ_SITE = "_feed"
#: How a feed is stored: scrapy-redis's list (default), REDIS_START_URLS_AS_SET, _AS_ZSET.
FEED_KINDS = ("list", "set", "zset")


def parse_feed_entry(raw: bytes | str, encoding: str = "utf-8") -> list[Request]:
    """The request(s) of one feed entry, as scrapy-redis 0.9.1's ``make_request_from_data``.

    A JSON object: ``url`` (required), ``method`` (default GET), ``meta`` (an object);
    every other key is form data (a FormRequest, so for GET it goes into the query
    string, for POST into the body). Anything else is a plain URL. Unlike scrapy-redis,
    the request is deduped (not ``dont_filter``). Raises EntryError with the reason.
    """
    try:
        text = raw.decode(encoding) if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise EntryError(f"feed entry is not {encoding} text ({exc}); see REDIS_ENCODING") from None
    text = text.strip()
    if not text:
        raise EntryError("feed entry is empty")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if data is None or isinstance(data, (int, float, bool)) or (isinstance(data, str) and not data.strip()):
        return [_request(text)]  # a plain URL (JSON numbers, null etc. fail as URLs below)
    if isinstance(data, str):
        return [_request(data.strip())]
    if not isinstance(data, dict):
        raise EntryError(f"feed entry is a JSON {type(data).__name__}, expected an object with a url or a plain URL")
    params = dict(data)
    url = params.pop("url", None)
    if not isinstance(url, str) or not url.strip():
        raise EntryError("feed entry (JSON) has no url")
    method = params.pop("method", "GET")
    if not isinstance(method, str) or not method.isalpha():
        raise EntryError(f"feed entry has a bad method {method!r}")
    meta = params.pop("meta", None) or {}
    if not isinstance(meta, dict):
        raise EntryError(f"feed entry's meta is a {type(meta).__name__}, expected an object")
    for key, value in params.items():
        if not isinstance(value, (str, list)) or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
            raise EntryError(f"feed entry's form field {key!r} is a {type(value).__name__}, expected a string (or list of strings)")
    try:
        return [FormRequest(url.strip(), method=method.upper(), formdata=params, meta=meta)]
    except Exception as exc:
        raise EntryError(f"Scrapy rejects the request: {type(exc).__name__}: {exc}") from None


def _request(url: str) -> Request:
    try:
        return Request(url)
    except Exception as exc:
        raise EntryError(f"not a URL Scrapy accepts: {exc}") from None


@dataclass
class MoveResult:
    """One :meth:`FeedMover.move`: entries read, requests added, duplicates, dead letters, feed length before."""

    read: int = 0
    added: int = 0
    duplicates: int = 0
    dead: int = 0
    length: int = 0
    #: sites that got new requests
    sites: frozenset[str] = frozenset()


class FeedMover:
    """Moves a scrapy-redis feed into one crawl, batch by batch (see the module docstring)."""

    def __init__(
        self,
        frontier: Frontier,
        key: str,
        codec: RequestCodec,
        fingerprinter: Any,
        node_id: str,
        *,
        kind: str = "list",
        batch: int = 100,
        lock_ms: int = 10_000,
        encoding: str = "utf-8",
        high_min: int = 1,
        low_max: int = -1,
        make_requests: Callable[[bytes], Any] | None = None,
        site_of: Callable[[str], str] | None = None,
    ) -> None:
        if kind not in FEED_KINDS:
            raise ValueError(f"feed kind {kind!r} is not one of {FEED_KINDS}")
        self.frontier = frontier
        #: redis-py types the feed's reads as text and LREM's value as str; the feed's
        #: entries are raw bytes
        self.client: Any = frontier.client
        self.key = key
        self.codec = codec
        self.fingerprinter = fingerprinter
        self.site_of = site_of
        self.node_id = node_id
        self.kind = kind
        self.batch = batch
        self.lock_ms = lock_ms
        self.encoding = encoding
        self.high_min = high_min
        self.low_max = low_max
        self.make_requests = make_requests
        self.legacy: str | None = None
        self.legacy_checked = 0.0
        self.length = 0
        self.logged_dead = False

    def _requests(self, raw: bytes) -> list[Request]:
        if self.make_requests is None:
            return parse_feed_entry(raw, self.encoding)
        try:
            made = self.make_requests(raw)
        except Exception as exc:
            raise EntryError(f"make_request_from_data raised {type(exc).__name__}: {exc}") from None
        if made is None:
            return []
        if isinstance(made, Request):
            return [made]
        if isinstance(made, Iterable):
            out = list(made)
            if all(isinstance(r, Request) for r in out):
                return out
        raise EntryError(f"make_request_from_data returned {type(made).__name__}, not Requests")

    def pending(self) -> int:
        """The feed's length (one command)."""
        c = self.client
        n = c.llen(self.key) if self.kind == "list" else c.scard(self.key) if self.kind == "set" else c.zcard(self.key)
        self.length = int(n)
        return self.length

    def move(self) -> MoveResult:
        """Move one batch if the feed has entries and no other worker is moving it."""
        if not self.pending():
            return MoveResult()
        now = time.monotonic()
        if now - self.legacy_checked > 10.0:
            self.legacy = legacy_key(self.client, self.frontier.keys.meta)
            self.legacy_checked = now
        c = self.client
        lock = self.frontier.keys.feed_lock
        if not c.set(lock, self.node_id, nx=True, px=self.lock_ms):
            return MoveResult(length=self.length)
        try:
            return self._move_batch()
        finally:
            try:
                if c.get(lock) == self.node_id.encode():
                    c.delete(lock)
            except Exception:  # the lock expires on its own
                pass

    def _read(self) -> list[bytes]:
        c, n = self.client, self.batch
        if self.kind == "list":
            raw = c.lrange(self.key, -n, -1)
            return list(reversed(raw))  # oldest first
        if self.kind == "set":
            return list(c.srandmember(self.key, n))
        return list(c.zrevrange(self.key, 0, n - 1))

    def _move_batch(self) -> MoveResult:
        raws = self._read()
        result = MoveResult(read=len(raws), length=self.length)
        if not raws:
            return result
        entries, dead = self._entries(raws)
        entries, dropped = drop_legacy_seen(self.client, self.legacy, entries)
        result.duplicates += len(dropped)
        f = self.frontier
        pipe = self.client.pipeline(transaction=False)
        # enqueue.lua registers the sites it adds to; the feed's dead letters need it done here
        offset = 0
        if dead:
            f.register_sites([FEED_DLQ_SITE], pipe)
            offset = 1
        calls = queue_enqueues(f, pipe, entries)
        if dead:
            self._queue_dead(pipe, dead)
        replies = pipe.execute()  # raises: nothing is removed from the feed
        for reply in replies[offset : offset + len(calls)]:
            for site_reply in enqueue.parse(reply):
                result.added += site_reply.added
                result.duplicates += site_reply.duplicates
        result.dead = len(dead)
        result.sites = frozenset(site for parts in calls for site, _ in parts)
        if dead:
            self._log_dead(dead)
        self._remove(raws)
        return result

    def _entries(self, raws: list[bytes]) -> tuple[list[Entry], list[tuple[bytes, str]]]:
        """The entries of the requests of feed entries, and the feed entries that are not
        requests (with the reason)."""
        entries: list[Entry] = []
        dead: list[tuple[bytes, str]] = []
        for raw in raws:
            try:
                for request in self._requests(raw):
                    entries.append(entry_for(
                        request, self.codec, self.fingerprinter, high_min=self.high_min,
                        low_max=self.low_max, legacy=self.legacy is not None, site_of=self.site_of,
                        now=self.frontier.clock.now,
                    ))
            except (EntryError, SerializationError, ValueError) as exc:
                dead.append((raw, str(exc)))
        return entries, dead

    def _queue_dead(self, pipe: Any, dead: list[tuple[bytes, str]]) -> None:
        keys = self.frontier.site(FEED_DLQ_SITE)
        ts = int(self.frontier.clock.now() * 1000)  # the scripts' dead letters have Redis time
        for raw, reason in dead:
            pipe.xadd(keys.dlq, {"r": raw, "reason": reason, "stream": self.key, "id": "", "deliveries": 0, "node": self.node_id, "ts": ts})
        pipe.hincrby(keys.stats, "dead", len(dead))

    def _log_dead(self, dead: list[tuple[bytes, str]]) -> None:
        # the first time at error level, then at debug: they are counted (streams/feed_dead_lettered)
        # and kept with their reasons (streams-sched dlq list --site _feed)
        logger.log(
            logging.DEBUG if self.logged_dead else logging.ERROR,
            "feed %s: %d entr%s moved to the dead-letter stream of site %s, e.g. %r: %s%s",
            self.key, len(dead), "y" if len(dead) == 1 else "ies", FEED_DLQ_SITE, dead[0][0][:200], dead[0][1],
            "" if self.logged_dead else " (more are logged at DEBUG level only)",
        )
        self.logged_dead = True

    def _remove(self, entries: list[bytes]) -> None:
        c = self.client
        if self.kind == "list":
            pipe = c.pipeline(transaction=False)
            for raw in entries:
                pipe.lrem(self.key, -1, raw)
            pipe.execute()
        elif self.kind == "set":
            c.srem(self.key, *entries)
        else:
            c.zrem(self.key, *entries)
        self.length = max(0, self.length - len(entries))
