"""Redis key names, in one place.

Every key of one site of one crawl carries the same Redis Cluster hash tag,
``{crawl/site}``, so every script that works on a site touches one slot and
the same code runs on Redis Cluster. Crawl-level keys carry ``{crawl}``.

Key layout (``C`` = crawl, ``S`` = site)::

    ss:crawls                       SET     names of every crawl (daemons find crawls here)
    ss:health:<daemon>:<name>       STRING  a daemon's last pass (JSON), expires when it stops
    ss:{C}:sites                    SET     the crawl's site registry (no KEYS/SCAN needed)
    ss:{C}:nodes                    HASH    node id -> JSON {host, pid, state, last_seen, ...}
    ss:{C}:meta                     HASH    crawl settings fixed at first start (dedupe back-end)
    ss:{C}:events                   channel pub/sub: node_online, node_offline, heartbeat
    ss:{C}:feed-lock                STRING  node moving the scrapy-redis feed now (short TTL)
    ss:{C}:legacy-seen              SET     a migrated scrapy-redis dupefilter (read-only)
    ss:{C/_feed}:dlq                STREAM  feed entries that are not requests, with the reason
    ss:{C/S}:q:<task>:<band>        STREAM  requests; consumer group "workers"; task in
                                            (http, browser), band in (high, default, low);
                                            deleted with its group once empty (ack.lua, dead.lua),
                                            recreated by the next enqueue
    ss:{C/S}:delayed                ZSET    requests that must wait, scored by due time (ms)
    ss:{C/S}:seen                   STRING  up to 1,024 fingerprints: their first 8 bytes, concatenated
                                    Bloom   past that: RedisBloom BF or a bitmap Bloom string holding
                                            the 8-byte prefixes (crawls started before issue 10 keep
                                            their 20-byte Bloom filters)
    ss:{C/S}:seen:meta              HASH    w = 8 on filters converted from the exact set; layers and
                                            count of the bitmap Bloom filter
    ss:{C/S}:seen:<n>[:meta]        (same)  with STREAMS_REVISIT_AFTER_SECONDS: one filter per time
                                            bucket n, expiring on its own (TTL)
    ss:{C/S}:dlq                    STREAM  dead letters: the entry, the reason, its origin
    ss:{C/S}:stats                  HASH    counters kept in Redis (enqueued, acked, ...); absent = 0
    ss:{C/S}:policy                 HASH    per-site policy (rate, burst, weight, paused, max_pages, ...),
                                            its token bucket, and its shared politeness state
                                            (a_rate, a_until, robots_delay, ...; see feedback.lua)
    ss:{C/S}:window                 STRING  answers seen over the last second, "o_ts,o_n,o_ok,o_rate,
                                            o_okrate" (feedback.lua), expires 3 s after the last report
    ss:{C/S}:obs                    HASH    the same, as the previous version kept it: only its workers
                                            write it during a rolling upgrade; it expires the same way
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from .errors import ConfigError

__all__ = [
    "BANDS",
    "BROWSER_FIRST_STREAM",
    "GROUP",
    "ROOT",
    "SITE_TASK",
    "STREAMS",
    "TASK_TYPES",
    "stream_code",
    "stream_for",
    "stream_mask",
    "stream_of_code",
    "health_key",
    "CrawlKeys",
    "SiteKeys",
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

# Stream codes: the Python<->Lua contract (lua/_codes.lua holds the Lua side; tests/
# test_contract.py checks the two agree). In Python a stream is its 0-based index in
# STREAMS; the scripts get and return it as a 1-based code (Lua arrays start at 1):
#
#   index 0..5   code 1..6     the (task, band) streams, in STREAMS order
#   SITE_TASK+b  code 11..13   band b (0 high, 1 default, 2 low), task type from the
#                              site's policy (or the crawl's default): enqueue only

#: ``Outgoing.stream`` of ``SITE_TASK + band``: the site's policy picks the task type.
SITE_TASK = 10


def stream_for(task: str | None, band: int) -> int:
    """``Outgoing.stream`` of a request: its (task, band) stream, or ``SITE_TASK + band``
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
    def sites(self) -> str:
        return f"{ROOT}:{self.tag}:sites"

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
    def sync(self) -> str:
        """Written just before a WAIT for replicas of this shard (replicas.py); expires by itself."""
        return f"{ROOT}:{self.tag}:sync"

    @staticmethod
    def registry() -> str:
        """The global SET of crawl names."""
        return f"{ROOT}:crawls"


@dataclass(frozen=True)
class SiteKeys:
    """Key names of one site of one crawl; all share the hash tag ``{crawl/site}``."""

    crawl: str
    site: str

    @cached_property
    def tag(self) -> str:
        return "{" + self.crawl + "/" + self.site + "}"

    @cached_property
    def base(self) -> str:
        return f"{ROOT}:{self.tag}"

    def stream(self, task: str, band: str) -> str:
        return f"{self.base}:q:{task}:{band}"

    @cached_property
    def streams(self) -> tuple[str, ...]:
        """Every request stream of the site, in :data:`STREAMS` order."""
        return tuple(self.stream(t, b) for t, b in STREAMS)

    @cached_property
    def delayed(self) -> str:
        return f"{self.base}:delayed"

    @cached_property
    def seen(self) -> str:
        return f"{self.base}:seen"

    @cached_property
    def seen_meta(self) -> str:
        return f"{self.base}:seen:meta"

    def seen_bucket(self, bucket: int) -> tuple[str, str]:
        """The seen filter (and its meta) of one revisit time bucket."""
        return f"{self.base}:seen:{bucket}", f"{self.base}:seen:{bucket}:meta"

    @cached_property
    def dlq(self) -> str:
        return f"{self.base}:dlq"

    @cached_property
    def stats(self) -> str:
        return f"{self.base}:stats"

    @cached_property
    def policy(self) -> str:
        return f"{self.base}:policy"

    @cached_property
    def obs(self) -> str:
        """The answers the workers saw in the last second (feedback.lua): a string that
        expires when idle. It has a name of its own, so workers of the previous version,
        which keep a hash at :attr:`obs_v1`, go on working beside these in a rolling upgrade."""
        return f"{self.base}:window"

    @cached_property
    def sync(self) -> str:
        """Written just before a WAIT for replicas of this site's shard (replicas.py); expires by itself."""
        return f"{self.base}:sync"

    @cached_property
    def obs_v1(self) -> str:
        """The previous version's observed window (a hash that expires when idle); purged only."""
        return f"{self.base}:obs"

    @cached_property
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
            self.obs,
            self.obs_v1,
            self.sync,
        )
