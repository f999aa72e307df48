"""Redis key names, in one place.

A crawl's sites are spread over a fixed number of shards (``shards`` in the
crawl's meta hash, STREAMS_SHARDS when the crawl is created; a site's shard is
the CRC-32 of its name modulo that number). Every key of a shard's sites, and
the shard's own indexes, carry the same Redis Cluster hash tag ``{crawl/#n}``,
so one script can lease, ack or enqueue for several sites of a shard at once,
on one server or on a cluster. Crawl-level keys carry ``{crawl}``.

The shard's indexes make a worker's cost follow the work: a worker finds sites
with work in ``#ready:<task>`` (and new ones in ``#fresh:<task>``) instead of
asking every site, takes over expired leases from ``#leased``, and decides that
the crawl is drained from the shards' sizes, whatever the number of idle sites.
Every script that gives a site work or a lease indexes it in the same call; a
site an index names after its work is gone is dropped by the next lease or
takeover that finds it empty.

Key layout (``C`` = crawl, ``n`` = shard, ``S`` = site)::

    ss:crawls                       SET     names of every crawl (daemons find crawls here)
    ss:health:<daemon>:<name>       STRING  a daemon's last pass (JSON), expires when it stops
    ss:{C}:nodes                    HASH    node id -> JSON {host, pid, state, last_seen (Redis TIME), ...}
    ss:{C}:meta                     HASH    crawl settings fixed at first start (dedupe back-end);
                                            moved_to: where `streams-sched move` moved the crawl
    ss:{C}:events                   channel pub/sub: node_online, node_offline, heartbeat
    ss:{C}:feed-lock                STRING  node moving the scrapy-redis feed now (short TTL)
    ss:{C}:legacy-seen              SET     a migrated scrapy-redis dupefilter (read-only)
    ss:{C}:dump-lock                STRING  the dump running now (its id; a short TTL it renews)
    ss:{C}:loads                    HASH    file id -> what loaded it (JSON): the ledgers to delete on purge
    ss:{C/#n}:_feed:dlq             STREAM  feed entries that are not requests, with the reason
    ss:{C/#n}:#sites                SET     the shard's site registry (no KEYS/SCAN needed)
    ss:{C/#n}:#ready:<task>         ZSET    sites with backlog (or delayed requests) of that task
                                            type, scored by the time (ms) they may be leased again
    ss:{C/#n}:#fresh:<task>         LIST    new sites with requests due now in the inbox, oldest first;
                                            lease.lua moves them into ready as it names sites
    ss:{C/#n}:#leased               ZSET    sites with leased entries, scored by their oldest lease (ms)
    ss:{C/#n}:#inbox                HASH    site -> the few queued requests of a small site, packed
                                            (msgpack: stream code, payload, ...), until it is leased
                                            or grows: a site with one queued URL has no stream
    ss:{C/#n}:#stats                HASH    the shard's counters (enqueued), read by the drain check
    ss:{C/#n}:#journal              STREAM  what enqueue.lua adds to the shard while a dump reads it
                                            (transfer/journal.py); exists only then, expires by itself
    ss:{C/#n}:#halt                 STRING  set by `streams-sched move` (transfer/move.py): ``pause:<id>``
                                            while it copies (lease.lua leases nothing, claim.lua takes
                                            nothing over), ``moved:<url>`` once the crawl has moved
                                            (enqueue.lua refuses too: CRAWLMOVED <url>)
    ss:{C/#n}:#loaded:<id>          STRING  a load's ledger: a bitmap of the lines of file <id> the
                                            shard took (transfer/load.py), so loading it again adds nothing
    ss:{C/#n}:#scratch:<name>       (any)   a dump's or a load's short-lived copies (they expire)
    ss:{C/#n}:S:q:<task>:<band>     STREAM  requests; consumer group "workers"; task in
                                            (http, browser), band in (high, default, low);
                                            deleted with its group once empty (ack.lua, dead.lua),
                                            recreated by the next enqueue
    ss:{C/#n}:S:delayed             ZSET    requests that must wait, scored by due time (ms)
    ss:{C/#n}:S:seen                STRING  up to 1,024 fingerprints: their first 8 bytes, concatenated
                                    Bloom   past that: RedisBloom BF or a bitmap Bloom string holding
                                            the 8-byte prefixes
    ss:{C/#n}:S:seen:meta           HASH    w = 8 on filters converted from the exact set (for workers
                                            of 0.1.0); layers and count of the bitmap Bloom filter
    ss:{C/#n}:S:seen:<n>[:meta]     (same)  with STREAMS_REVISIT_AFTER_SECONDS: one filter per time
                                            bucket n, expiring on its own (TTL)
    ss:{C/#n}:S:dlq                 STREAM  dead letters: the entry, the reason, its origin
    ss:{C/#n}:S:stats               HASH    counters kept in Redis (enqueued, acked, ...); absent = 0
    ss:{C/#n}:S:policy              HASH    per-site policy (rate, burst, weight, paused, max_pages, ...),
                                            its token bucket, and its shared politeness state
                                            (a_rate, a_until, robots_delay, ...; see feedback.lua)
    ss:{C/#n}:S:window              STRING  answers seen over the last second (feedback.lua), expires
                                            3 s after the last report
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property, lru_cache

from streams_sched.errors import ConfigError

__all__ = [
    "BANDS",
    "BROWSER_FIRST_STREAM",
    "DEAD_LETTER",
    "GROUP",
    "ROOT",
    "SEEN_ONLY",
    "SITE_TASK",
    "STREAMS",
    "TASK_TYPES",
    "band_for",
    "stream_code",
    "stream_for",
    "stream_mask",
    "stream_of_code",
    "health_key",
    "CrawlKeys",
    "DEFAULT_SHARDS",
    "ShardKeys",
    "SiteKeys",
    "shard_keys_for",
    "shard_of",
    "validate_crawl_name",
    "validate_site_name",
]

#: Root of every key name.
ROOT = "ss"
#: The one consumer group of every request stream.
GROUP = "workers"
#: Priority bands, most urgent first.
BANDS: tuple[str, ...] = ("high", "default", "low")
#: Task types; each has its own streams so only capable workers lease them.
TASK_TYPES: tuple[str, ...] = ("http", "browser")
#: Every (task, band) stream of a site, in the order scripts receive them in KEYS.
STREAMS: tuple[tuple[str, str], ...] = tuple((t, b) for t in TASK_TYPES for b in BANDS)
#: Index in :data:`STREAMS` of the first browser stream (the http streams come first).
BROWSER_FIRST_STREAM = TASK_TYPES.index("browser") * len(BANDS)

# Stream codes: the Python<->Lua contract (lua/lib/codes.lua holds the Lua side; tests/
# test_contract.py checks the two agree). In Python a stream is its 0-based index in
# STREAMS; the scripts get and return it as a 1-based code (Lua arrays start at 1):
#
#   index 0..5   code 1..6     the (task, band) streams, in STREAMS order
#   SITE_TASK+b  code 11..13   band b (0 high, 1 default, 2 low), task type from the
#                              site's policy (or the crawl's default): enqueue only
#   DEAD_LETTER+i  code 21..26 a dead letter of stream i (enqueue's 'load' keys)
#   SEEN_ONLY    code 30       a fingerprint only (enqueue's 'load' keys)

#: ``Entry.stream`` of ``SITE_TASK + band``: the site's policy picks the task type.
SITE_TASK = 10
#: ``Entry.stream`` of ``DEAD_LETTER + index``: a dead letter of that stream (code 21..26,
#: enqueue.lua's 'load' keys only: ``streams-sched load`` restores dead letters through it)
DEAD_LETTER = 20
#: ``Entry.stream`` whose code (30) records a fingerprint and adds nothing ('load' keys only:
#: a URL a file says was done)
SEEN_ONLY = 29


def band_for(priority: int, high_min: int, low_max: int) -> int:
    """Band index (0 high, 1 default, 2 low) of a request priority."""
    if priority >= high_min:
        return 0
    if priority <= low_max:
        return 2
    return 1


def stream_for(task: str | None, band: int) -> int:
    """``Entry.stream`` of a request: its (task, band) stream, or ``SITE_TASK + band``
    when the request names no task type (the site's policy decides in enqueue.lua)."""
    if task is None:
        return SITE_TASK + band
    return TASK_TYPES.index(task) * len(BANDS) + band


def stream_code(index: int) -> int:
    """The code a script gets for stream ``index`` (or ``SITE_TASK + band``)."""
    return index + 1


def stream_of_code(code: int) -> int:
    """The stream index of a code a script returns (the inverse of :func:`stream_code`)."""
    return code - 1


def stream_mask(tasks: Iterable[str]) -> str:
    """claim.lua's stream mask: one char per stream of STREAMS, '1' = a task type in ``tasks``."""
    wanted = set(tasks)
    return "".join("1" if task in wanted else "0" for task, _ in STREAMS)

#: shards of a new crawl (STREAMS_SHARDS): enough that a cluster's masters share them
#: evenly and one lease call serves several sites, few enough that a drain check
#: (a few commands per shard) stays cheap
DEFAULT_SHARDS = 16
#: the most shards a crawl may have (a drain check reads every shard)
MAX_SHARDS = 1024


def shard_of(site: str, shards: int) -> int:
    """The shard of ``site`` in a crawl of ``shards`` shards (stable across processes)."""
    return zlib.crc32(site.encode("utf-8")) % shards


_CRAWL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
_SITE_RE = re.compile(r"^[A-Za-z0-9._:\[\]@-]{1,253}$")


def health_key(daemon: str, name: str) -> str:
    """Key of a daemon's health record (``daemon`` is e.g. "reclaimer")."""
    return f"{ROOT}:health:{daemon}:{name}"


def validate_crawl_name(name: str, setting: str = "STREAMS_PREFIX") -> str:
    """Return ``name`` if it is usable as a crawl namespace, else raise ConfigError."""
    if not isinstance(name, str) or not _CRAWL_RE.match(name):
        raise ConfigError(
            setting,
            name,
            "a crawl name is 1-128 characters of letters, digits and . _ : @ -,"
            " starting with a letter or digit (no braces: they would break the"
            " Redis Cluster hash tag)",
        )
    return name


def validate_site_name(site: str) -> str:
    """Return ``site`` if it is usable as a site name, else raise ValueError."""
    if not isinstance(site, str) or not _SITE_RE.match(site):
        raise ValueError(
            f"invalid site name {site!r}: a site is a host name (letters, digits, . - _ :)"
        )
    return site


@dataclass(frozen=True)
class CrawlKeys:
    """Key names of one crawl's crawl-level keys."""

    crawl: str

    @property
    def tag(self) -> str:
        return "{" + self.crawl + "}"

    @cached_property
    def nodes(self) -> str:
        return f"{ROOT}:{self.tag}:nodes"

    @cached_property
    def meta(self) -> str:
        return f"{ROOT}:{self.tag}:meta"

    @cached_property
    def events(self) -> str:
        return f"{ROOT}:{self.tag}:events"

    @cached_property
    def feed_lock(self) -> str:
        return f"{ROOT}:{self.tag}:feed-lock"

    @cached_property
    def legacy_seen(self) -> str:
        return f"{ROOT}:{self.tag}:legacy-seen"

    @cached_property
    def dump_lock(self) -> str:
        """The dump that reads the crawl now (transfer/journal.py): one at a time."""
        return f"{ROOT}:{self.tag}:dump-lock"

    @cached_property
    def loads(self) -> str:
        """HASH of the files loaded into the crawl (their ledgers, transfer/load.py)."""
        return f"{ROOT}:{self.tag}:loads"

    @cached_property
    def sync(self) -> str:
        """Written just before a WAIT for replicas of this shard (replicas.py); expires by itself."""
        return f"{ROOT}:{self.tag}:sync"

    @staticmethod
    def registry() -> str:
        """The global SET of crawl names."""
        return f"{ROOT}:crawls"


@dataclass(frozen=True)
class ShardKeys:
    """Key names of one shard's indexes; they share the hash tag of the shard's sites."""

    crawl: str
    shard: int

    @cached_property
    def tag(self) -> str:
        return "{" + self.crawl + "/#" + str(self.shard) + "}"

    @cached_property
    def base(self) -> str:
        return f"{ROOT}:{self.tag}:#"

    def ready(self, task: str) -> str:
        return f"{self.base}ready:{task}"

    @cached_property
    def readies(self) -> tuple[str, ...]:
        """The ready index of every task type, in :data:`TASK_TYPES` order."""
        return tuple(self.ready(t) for t in TASK_TYPES)

    @cached_property
    def freshes(self) -> tuple[str, ...]:
        """The list of new sites of every task type, in :data:`TASK_TYPES` order."""
        return tuple(f"{self.base}fresh:{t}" for t in TASK_TYPES)

    @cached_property
    def leased(self) -> str:
        return f"{self.base}leased"

    @cached_property
    def inbox(self) -> str:
        return f"{self.base}inbox"

    @cached_property
    def sites(self) -> str:
        return f"{self.base}sites"

    @cached_property
    def stats(self) -> str:
        return f"{self.base}stats"

    @cached_property
    def sync(self) -> str:
        """Written just before a WAIT for replicas of this shard's primary (replicas.py)."""
        return f"{self.base}sync"

    @cached_property
    def journal(self) -> str:
        """What enqueue.lua adds to the shard while a dump reads it (transfer/journal.py)."""
        return f"{self.base}journal"

    @cached_property
    def halt(self) -> str:
        """Set while ``streams-sched move`` moves the crawl (``pause:<id>``: nothing is leased
        or taken over) and once it has moved (``moved:<url>``: enqueues are refused too)."""
        return f"{self.base}halt"

    def ledger(self, file_id: str) -> str:
        """The lines of file ``file_id`` this shard took (a bitmap; transfer/load.py)."""
        return f"{self.base}loaded:{file_id}"

    def scratch(self, name: str) -> str:
        """A short-lived key of a dump or a load in this shard's slot (copies of a site's keys)."""
        return f"{self.base}scratch:{name}"

    @cached_property
    def all(self) -> tuple[str, ...]:
        return (*self.readies, *self.freshes, self.leased, self.inbox, self.sites, self.stats, self.sync,
                self.journal, self.halt)


#: the suffixes of a site's request streams after its base, in :data:`STREAMS` order
_STREAM_SUFFIXES: tuple[str, ...] = tuple(f":q:{t}:{b}" for t, b in STREAMS)


@lru_cache(maxsize=4096)
def shard_keys_for(crawl: str, shard: int) -> ShardKeys:
    """One ShardKeys per shard, shared by its sites' keys."""
    return ShardKeys(crawl, shard)


class SiteKeys:
    """Key names of one site of one crawl; all share the hash tag of the site's shard,
    ``{crawl/#n}``.

    Treat it as immutable (it hashes by crawl, site and shard). The keys a worker's
    scripts take are built with the object, in slots (a worker makes one per site it
    leases from: one object for the collector, not two with a ``__dict__``, and a third
    of the time to build); the rest are built when asked.
    """

    __slots__ = ("base", "crawl", "delayed", "dlq", "policy", "shard", "site", "stats", "streams", "tag", "window")

    def __init__(self, crawl: str, site: str, shard: int) -> None:
        self.crawl = crawl
        self.site = site
        self.shard = shard
        self.tag = "{" + crawl + "/#" + str(shard) + "}"
        self.base = base = f"{ROOT}:{self.tag}:{site}"
        #: every request stream of the site, in :data:`STREAMS` order
        self.streams = tuple([base + sfx for sfx in _STREAM_SUFFIXES])
        self.delayed = base + ":delayed"
        self.dlq = base + ":dlq"
        self.stats = base + ":stats"
        self.policy = base + ":policy"
        #: the answers the workers saw in the last second (feedback.lua), a string that expires
        #: when idle
        self.window = base + ":window"

    def __eq__(self, other: object) -> bool:
        if type(other) is not SiteKeys:
            return NotImplemented
        return (self.crawl, self.site, self.shard) == (other.crawl, other.site, other.shard)

    def __hash__(self) -> int:
        return hash((self.crawl, self.site, self.shard))

    def __repr__(self) -> str:
        return f"SiteKeys(crawl={self.crawl!r}, site={self.site!r}, shard={self.shard!r})"

    @property
    def index(self) -> ShardKeys:
        """The keys of the site's shard."""
        return shard_keys_for(self.crawl, self.shard)

    def stream(self, task: str, band: str) -> str:
        return f"{self.base}:q:{task}:{band}"

    @property
    def seen(self) -> str:
        return f"{self.base}:seen"

    @property
    def seen_meta(self) -> str:
        return f"{self.base}:seen:meta"

    def seen_bucket(self, bucket: int) -> tuple[str, str]:
        """The seen filter (and its meta) of one revisit time bucket."""
        return f"{self.base}:seen:{bucket}", f"{self.base}:seen:{bucket}:meta"

    @property
    def revisit_stops(self) -> str:
        """SET of URLs whose tracking was stopped while a visit of them may be in flight or
        queued (admin/revisits.py): ack.lua schedules no next visit for them. It expires."""
        return f"{self.base}:revisit_stops"

    @property
    def sync(self) -> str:
        """The replica barrier key (replicas.py): the shard's, for all its sites."""
        return self.index.sync

    @property
    def all(self) -> tuple[str, ...]:
        """Every key of the site (used by purge)."""
        return (
            *self.streams,
            self.delayed,
            self.seen,
            self.seen_meta,
            self.dlq,
            self.stats,
            self.policy,
            self.window,
            self.revisit_stops,
        )
