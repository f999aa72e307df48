"""Reading one crawl's state from Redis into plain data (read-only commands only).

A crawl may have a million sites, most of them idle, so a read never looks at every
site. What it reads each time, per crawl:

- TIME, HGETALL of the nodes and meta hashes (one round trip);
- every shard's sizes: SCARD of its registry, ZCARD of its ready and leased indexes,
  its ``enqueued`` counter (one pipeline, five commands per shard);
- the first ``index_per_shard`` sites of each shard's leased and ready indexes: every
  site with backlog, leases or delayed requests while there are fewer (one pipeline);
- a slice of the shards' registries (one SSCAN step per shard, about ``sweep`` sites
  in all), continued where the last read stopped, so every registered site is read
  once every ``sites / sweep`` reads: what changed on a site that went through all of
  its work between two reads (it was never in an index when read) shows then;
- the read-only status script for the sites so found, the sites with their own label
  and the sites the indexes named the read before (so that a site's last ack or dead
  letter is seen once it leaves the indexes), ``chunk`` sites per round trip, and the
  size of their seen filters (one or two commands per site and revisit bucket).

None of it grows with the number of idle sites. The crawl-wide figures (dead letters,
the counters, the seen estimate, paused sites) are sums over a :class:`SiteBook`, the
monitor's memory of every site's last read (a dozen numbers per site that was ever
read, about 240 bytes), kept up to date by difference as sites are read again and dropped when
a registry sweep finds a site gone. They are exact for every site read since it last
changed; the shards' own figures (sites, ready, leased, enqueued) are exact at once.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.indexes import ShardSizes, indexed_sites, shard_sizes
from streams_sched.frontier.keys import shard_of
from streams_sched.frontier.records import BloomParams, SiteStatus
from streams_sched.frontier.replies import text

__all__ = ["CrawlSnapshot", "SUMMED", "SiteBook", "bitmap_items", "read_crawl"]

logger = logging.getLogger(__name__)

#: the stats counters the crawl-wide families sum over every site
SUMMED: tuple[str, ...] = ("enqueued", "acked", "dead", "reclaimed", "duplicates", "timeouts", "backoffs",
                           "throttled", "over_cap", "tracked", "revisits", "changed", "unchanged")
#: a :class:`SiteBook` row: SUMMED, then dead letters, paused (0/1), seen filter size
ROW_FIELDS: tuple[str, ...] = (*SUMMED, "dead_letters", "paused", "seen")


@dataclass
class CrawlSnapshot:
    crawl: str
    #: Redis TIME, epoch seconds
    now_s: float
    #: the sites read this time (see the module docstring), not every site of the crawl
    sites: list[SiteStatus] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: fingerprints in the seen filters of every site (None: the back-end or the ACL cannot tell)
    seen_estimate: int | None = None
    #: the crawl's default rate (policy "*"; 0 = none), for the sites' effective rates
    default_rate: float = 0.0
    #: crawl-wide sums of ROW_FIELDS over every site's last read (None: sum ``sites``)
    totals: dict[str, int] | None = None
    #: the shards' figures, summed (None: not read)
    shards: ShardSizes | None = None
    #: some shard's index named more sites than were read: per-site gauges are partial
    truncated: bool = False

    @property
    def dead_letters(self) -> int:
        if self.totals is not None:
            return self.totals["dead_letters"]
        return sum(s.dead_letters for s in self.sites)

    def stat(self, name: str) -> int:
        if self.totals is not None and name in self.totals:
            return self.totals[name]
        return sum(s.stats.get(name, 0) for s in self.sites)

    @property
    def site_count(self) -> int:
        """Registered sites (the shards' registries), or the sites read."""
        return self.shards.sites if self.shards is not None else len(self.sites)

    @property
    def paused_count(self) -> int:
        if self.totals is not None:
            return self.totals["paused"]
        return sum(1 for s in self.sites if s.policy.get("paused") == "1")

    @property
    def leased(self) -> bool:
        """Some request of the crawl is leased now."""
        return any(s.pending > 0 for s in self.sites) or (self.shards is not None and self.shards.leased > 0)


def _row(st: SiteStatus, seen: int) -> tuple[int, ...]:
    return (*(st.stats.get(name, 0) for name in SUMMED), st.dead_letters,
            1 if st.policy.get("paused") == "1" else 0, seen)


def _blank(st: SiteStatus) -> bool:
    """A site without any key (purged, or only registered)."""
    return st.is_empty and st.dead_letters == 0 and not st.stats and not st.policy


#: a book row as stored: ROW_FIELDS, then the sweep round in which the site was last
#: found, packed (a bytes object of 8 bytes a number costs a third of a tuple of ints)
_ROW = struct.Struct(f"<{len(ROW_FIELDS) + 1}q")


class SiteBook:
    """The monitor's memory of one crawl: each site's figures at its last read, their sums,
    where the registry sweep stands, and which sites the indexes named the read before.

    Memory: one packed row per site ever read, about 240 bytes with a 20-character name
    and its dict entry (measured with tracemalloc): 240 MB for a million sites.
    """

    def __init__(self) -> None:
        #: shard -> site -> packed (ROW_FIELDS..., sweep round in which it was last found)
        self.rows: dict[int, dict[str, bytes]] = {}
        self.totals = dict.fromkeys(ROW_FIELDS, 0)
        #: shard -> SSCAN cursor of the registry sweep, and the round it is in
        self.cursors: dict[int, int] = {}
        self.rounds: dict[int, int] = {}
        #: sites the indexes named at the last read
        self.indexed: list[str] = []
        self.shards = 0

    def __len__(self) -> int:
        return sum(len(rows) for rows in self.rows.values())

    def row(self, shard: int, site: str) -> tuple[int, ...] | None:
        """A site's figures at its last read (ROW_FIELDS), None if it was never read."""
        packed = self.rows.get(shard, {}).get(site)
        return _ROW.unpack(packed)[:-1] if packed is not None else None

    def seen_of(self, shard: int, site: str) -> int:
        row = self.row(shard, site)
        return row[-1] if row is not None else 0

    def put(self, shard: int, site: str, row: tuple[int, ...] | None) -> None:
        """Record a site's new figures (None: it has no key left, forget it)."""
        rows = self.rows.setdefault(shard, {})
        old = rows.pop(site, None)
        if old is not None:
            for name, v in zip(ROW_FIELDS, _ROW.unpack(old)[:-1], strict=True):
                self.totals[name] -= v
        if row is not None:
            rows[site] = _ROW.pack(*row, self.rounds.get(shard, 0))
            for name, v in zip(ROW_FIELDS, row, strict=True):
                self.totals[name] += v

    def found(self, shard: int, site: str) -> None:
        """The registry sweep found the site: it is still registered this round."""
        packed = self.rows.get(shard, {}).get(site)
        if packed is not None:
            self.rows[shard][site] = _ROW.pack(*_ROW.unpack(packed)[:-1], self.rounds.get(shard, 0))

    def round_done(self, shard: int) -> None:
        """The sweep went through the whole registry of ``shard``: sites it did not find
        are gone (purged); the next round starts."""
        current = self.rounds.get(shard, 0)
        for site, packed in list(self.rows.get(shard, {}).items()):
            if _ROW.unpack(packed)[-1] < current:
                self.put(shard, site, None)
        self.rounds[shard] = current + 1


def _sweep(frontier: Frontier, book: SiteBook, sweep: int) -> tuple[list[str], list[int]]:
    """One SSCAN step of each shard's registry, where the last read stopped (one pipeline).
    -> the sites found, and the shards whose round this step finished."""
    if book.shards != frontier.shards:  # the first read (or the crawl got its layout since)
        book.cursors.clear()
        book.shards = frontier.shards
    count = max(10, sweep // max(1, frontier.shards))
    pipe = frontier.client.pipeline(transaction=False)
    shards = frontier.shard_keys()
    for n, shard in enumerate(shards):
        pipe.sscan(shard.sites, book.cursors.get(n, 0), count=count)
    found: list[str] = []
    finished = []
    for n, (cursor, names) in enumerate(pipe.execute()):
        book.cursors[n] = int(cursor)
        found += (text(s) for s in names)
        if int(cursor) == 0:
            finished.append(n)
    return found, finished


def bitmap_items(layers: int, count: int, capacity: int, expansion: int) -> int:
    """Items in a bitmap Bloom filter: every full layer holds its capacity
    (a layer is added when the newest reaches it), plus ``count`` in the newest."""
    if layers <= 0:
        return 0
    return sum(int(capacity * expansion**i) for i in range(layers - 1)) + max(count, 0)



def read_statuses(frontier: Frontier, sites: list[str], chunk: int = 500) -> list[SiteStatus]:
    """Status of every site, ``chunk`` sites per round trip."""
    out: list[SiteStatus] = []
    if not sites:
        return out
    for i in range(0, len(sites), chunk):
        part = sites[i : i + chunk]
        try:
            out += frontier.status_many(part)
        except NoScriptError:
            frontier.status(part[0])  # EVAL_RO caches the script for the EVALSHA_RO calls
            out += frontier.status_many(part)
    return out


def seen_keys(frontier: Frontier, site: str, meta: dict[str, str], now_s: float) -> list[tuple[str, str]]:
    """(filter, layer state) keys of a site's seen filters: one, or one per live revisit bucket."""
    keys = frontier.site(site)
    revisit_s = float(meta.get("revisit_seconds", 0) or 0)
    if revisit_s <= 0:
        return [(keys.seen, keys.seen_meta)]
    params = BloomParams(revisit_s=revisit_s, revisit_buckets=int(float(meta.get("revisit_buckets", 4))))
    return [keys.seen_bucket(b) for b in params.buckets(now_s)]


def _replies(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``commands`` in one pipeline. A command this user may not run (or RedisBloom
    missing) raises PermissionError; another refusal (a key of another type) gives None."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    out = []
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, ResponseError):
            message = str(reply)
            if "NOPERM" in message or "no permissions" in message or "unknown command" in message.lower():
                raise PermissionError(message)
            reply = None
        elif isinstance(reply, Exception):
            raise reply
        out.append(reply)
    return out


#: TYPE of a RedisBloom filter
BF_TYPE = "MBbloom--"


def read_seen(
    frontier: Frontier, sites: list[str], meta: dict[str, str], now_s: float = 0.0, chunk: int = 500
) -> dict[str, int] | None:
    """Fingerprints recorded in each site's seen filters (summed over the live revisit
    buckets, if any), or None if this user or back-end cannot tell.

    A small site's filter is an exact set of 8-byte prefixes (a string: STRLEN / 8); a
    Bloom filter answers BF.CARD, or its layer state in the meta hash (bitmap). No
    command here fails on a key of the other form: each failed call would count in
    INFO errorstats, which operators alert on, so RedisBloom keys are told apart by TYPE.
    """
    mode = meta.get("dedupe")
    if mode not in ("bf", "bitmap"):
        return None
    client = frontier.client
    out = dict.fromkeys(sites, 0)
    capacity = int(float(meta.get("bloom_capacity", 100_000)))
    expansion = int(float(meta.get("bloom_expansion", 2)))
    for i in range(0, len(sites), chunk):
        pairs = [(site, pair) for site in sites[i : i + chunk] for pair in seen_keys(frontier, site, meta, now_s)]
        if mode == "bf":
            kinds = [text(k) for k in _replies(client, [("TYPE", seen) for _, (seen, _) in pairs])]
            asks = [(site, "STRLEN" if kind == "string" else "BF.CARD", seen)
                    for (site, (seen, _)), kind in zip(pairs, kinds, strict=True) if kind in ("string", BF_TYPE)]
            for (site, command, _), reply in zip(asks, _replies(client, [a[1:] for a in asks]), strict=True):
                if reply is not None:
                    out[site] += int(reply) // 8 if command == "STRLEN" else int(reply)
            continue
        commands = [c for _, (seen, seen_meta) in pairs for c in (("STRLEN", seen), ("HMGET", seen_meta, "layers", "count"))]
        replies = _replies(client, commands)
        for (site, _), exact, state in zip(pairs, replies[::2], replies[1::2], strict=True):
            if state is not None and state[0] is not None:
                layers, count = (int(v) if v is not None else 0 for v in state)
                out[site] += bitmap_items(layers, count, capacity, expansion)
            elif exact is not None:
                out[site] += int(exact) // 8  # else a key of another type: that site is skipped
    return out


def read_crawl(
    frontier: Frontier,
    *,
    seen: bool = True,
    chunk: int = 500,
    book: SiteBook | None = None,
    labelled: Iterable[str] = (),
    index_per_shard: int = 500,
    sweep: int = 2000,
) -> CrawlSnapshot:
    """One crawl's state (see the module docstring for what is read). ``book`` carries the
    crawl-wide sums from one read to the next (a fresh one: this read's sites only, plus a
    first slice of the registry); ``labelled`` sites are read every time; ``seen=False``
    skips the seen-filter sizes."""
    book = book if book is not None else SiteBook()
    now_s, nodes, meta = _read_head(frontier)
    frontier.use_crawl_defaults(meta)  # status.lua counts the crawl's defaults in the sites' rates
    sizes = ShardSizes()
    for part in shard_sizes(frontier):
        sizes.add(part)
    indexed = indexed_sites(frontier, index_per_shard)
    swept, finished = _sweep(frontier, book, sweep)
    names = list(dict.fromkeys([*indexed.sites, *labelled, *book.indexed, *swept]))
    statuses = read_statuses(frontier, names, chunk)
    sizes_seen = read_seen(frontier, names, meta, now_s, chunk) if seen else None
    # every read is in hand: now the book changes (a PermissionError above leaves it as it was)
    read = _update_book(book, frontier.shards, swept, finished, statuses, sizes_seen)
    book.indexed = indexed.sites
    snap = CrawlSnapshot(frontier.crawl, now_s, read, nodes, totals=dict(book.totals), shards=sizes,
                         truncated=indexed.truncated)
    try:
        snap.default_rate = float(meta.get("default_rate") or 0)
    except ValueError:
        snap.default_rate = 0.0
    if sizes_seen is not None:
        snap.seen_estimate = book.totals["seen"]
    return snap


def _read_head(frontier: Frontier) -> tuple[float, dict[str, dict[str, Any]], dict[str, str]]:
    """Redis time, the node records (unreadable ones left out) and the crawl's meta, in
    one round trip."""
    pipe = frontier.client.pipeline(transaction=False)
    pipe.time()
    pipe.hgetall(frontier.keys.nodes)
    pipe.hgetall(frontier.keys.meta)
    (sec, usec), raw_nodes, raw_meta = pipe.execute()
    nodes: dict[str, dict[str, Any]] = {}
    for k, v in raw_nodes.items():
        try:
            info = json.loads(v)
        except ValueError:
            continue
        if isinstance(info, dict):
            nodes[text(k)] = info
    meta = {text(k): text(v) for k, v in raw_meta.items()}
    return int(sec) + int(usec) / 1e6, nodes, meta


def _update_book(
    book: SiteBook,
    shards: int,
    swept: Iterable[str],
    finished: Iterable[int],
    statuses: Iterable[SiteStatus],
    sizes_seen: Mapping[str, int] | None,
) -> list[SiteStatus]:
    """Put this read's sites into ``book``; the statuses of the sites with something in them."""
    for site in swept:
        book.found(shard_of(site, shards), site)
    read: list[SiteStatus] = []
    for st in statuses:
        shard = shard_of(st.site, shards)
        if _blank(st):
            book.put(shard, st.site, None)
            continue
        count = sizes_seen[st.site] if sizes_seen is not None else book.seen_of(shard, st.site)
        book.put(shard, st.site, _row(st, count))
        read.append(st)
    for shard in finished:
        book.round_done(shard)
    return read
