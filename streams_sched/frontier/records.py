"""What the frontier's calls take and give back: entries, leases, status, dedupe sizing.

Plain records, no I/O: :class:`Entry` is a request on its way into a stream (the one
form every producer builds, frontier/entries.py), :class:`LeasedEntry` a request a
worker holds, :class:`LeaseReply` and :class:`ShardLease` what lease.lua answers,
:class:`SiteStatus` a site's read-only snapshot with its :class:`EffectiveRate`,
:class:`BloomParams` the crawl's dedupe
back-end and sizing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = ["BloomParams", "EffectiveRate", "Entry", "LeaseReply", "LeasedEntry", "Outgoing", "ShardLease", "SiteStatus",
           "payload_digest",
           "StreamStatus"]


@dataclass(frozen=True)
class BloomParams:
    """Dedupe back-end ('bf' = RedisBloom, 'bitmap'), its sizing, and revisits.

    With ``revisit_s`` (W) set, fingerprints live in time buckets of width
    W / ``revisit_buckets``; a fingerprint is a duplicate while it is in the
    current bucket or one of the ``revisit_buckets`` before it, so a page can be
    crawled again no sooner than W and no later than W plus one bucket after
    it was last enqueued. Each bucket's filter expires on its own.
    """

    mode: str = "bitmap"
    error_rate: float = 0.001
    capacity: int = 100_000
    expansion: int = 2
    revisit_s: float = 0.0
    revisit_buckets: int = 4

    @property
    def bucket_s(self) -> float:
        return self.revisit_s / self.revisit_buckets

    def buckets(self, now: float) -> list[int]:
        """The current bucket id, then the older ones still in the window."""
        current = int(now // self.bucket_s)
        return [current - i for i in range(self.revisit_buckets + 1)]

    @property
    def bucket_ttl(self) -> int:
        return int((self.revisit_buckets + 2) * self.bucket_s) + 1


@dataclass(slots=True)
class Entry:
    """A request ready to enqueue: fingerprint (b"" = no dedupe), stream, delay, payload,
    and the site whose frontier takes it. frontier/entries.py makes them, from a request.

    ``stream`` is an index into STREAMS, or ``SITE_TASK + band`` (see keys.stream_for).
    ``legacy_fp`` is scrapy-redis's fingerprint of the request while the crawl migrated
    from scrapy-redis has a dupefilter to check (scrapy_redis/legacy.py; b"": none, or
    checked already); ``url`` is the request's URL, for a seeder to report.
    """

    fp: bytes
    stream: int
    delay_ms: int
    payload: bytes
    site: str = ""
    legacy_fp: bytes = b""
    url: str = ""


#: The name :meth:`Frontier.enqueue` (public) took its items under.
Outgoing = Entry


@dataclass(slots=True)
class LeasedEntry:
    """An entry leased from a site's stream (stream is a 0-based index into STREAMS).

    ``deliveries`` counts earlier deliveries that did not end in an ack; a
    ``suspect`` entry had one (it was taken over or requeued after its lease
    expired), so a worker holds at most one at a time.
    """

    site: str
    stream: int
    id: bytes
    payload: bytes | None
    deliveries: int
    suspect: bool = False
    #: time.monotonic() when this worker got the lease (for lease-to-ack latency)
    leased_at: float = 0.0
    #: its site's policy ``revisit`` when this worker leased it ("" none)
    revisit: str = ""
    #: its site's freshness multiplier when this worker leased it (None: unknown)
    mu: float | None = None
    #: :func:`payload_digest` of its payload, kept when the payload is dropped: a resend
    #: after a failover leaves out the requests this worker crawled since (worker/ops.py)
    digest: bytes = b""


def payload_digest(payload: bytes) -> bytes:
    """8 bytes that tell one entry payload from another (BLAKE2b)."""
    return hashlib.blake2b(payload, digest_size=8).digest()


@dataclass(slots=True)
class LeaseReply:
    backlog_http: int
    backlog_browser: int
    pending: int
    delayed: int
    next_due_in_ms: int
    wait_ms: int
    deferred: int = 0
    weight: float = 1.0
    max_browser: int = -1
    rate: float = 0.0
    #: the site's policy ``revisit`` ("" none): its pages are tracked
    revisit: str = ""
    #: the site's freshness multiplier (seconds; None: none yet, see worker/freshness.py)
    mu: float | None = None
    entries: list[LeasedEntry] = field(default_factory=list)


@dataclass(slots=True)
class StreamStatus:
    backlog: int
    pending: int
    oldest_pending_ms: int


@dataclass(frozen=True)
class EffectiveRate:
    """A site's rate now and why, as status.lua reads it (lua/lib/rate.lua): ``reason`` is
    one of ``paused`` (operator; rate 0), ``retry-after`` (paused until ``paused_until_ms``),
    ``backoff`` (AIMD), ``robots`` (Crawl-delay), ``policy`` (the policy's or crawl default's
    rate), ``unlimited`` (rate 0)."""

    rate: float
    reason: str
    paused_until_ms: int = 0


@dataclass(slots=True)
class SiteStatus:
    site: str
    now_ms: int
    streams: dict[tuple[str, str], StreamStatus]
    delayed: int
    next_due_ms: int
    dead_letters: int
    stats: dict[str, int]
    policy: dict[str, str]
    rate: EffectiveRate = EffectiveRate(0.0, "unlimited")
    #: delayed requests past their due time (tracked pages' revisits among them)
    overdue: int = 0
    #: the interval (s) of the first overdue request when it is a tracked page, else 0
    oldest_overdue_interval_s: float = 0.0

    @property
    def backlog(self) -> int:
        return sum(s.backlog for s in self.streams.values())

    @property
    def pending(self) -> int:
        return sum(s.pending for s in self.streams.values())

    @property
    def oldest_pending_ms(self) -> int:
        return max((s.oldest_pending_ms for s in self.streams.values()), default=-1)

    @property
    def oldest_overdue_s(self) -> float:
        """How long the first overdue request has been due (s), 0 none."""
        if not self.overdue or self.next_due_ms < 0:
            return 0.0
        return max(0.0, (self.now_ms - self.next_due_ms) / 1000.0)

    @property
    def overdue_ratio(self) -> float:
        """How many of its intervals the first overdue tracked page is late by (0: none)."""
        if self.oldest_overdue_interval_s <= 0:
            return 0.0
        return self.oldest_overdue_s / self.oldest_overdue_interval_s

    @property
    def revisit_demand_per_s(self) -> float:
        """The fetches per second the site's tracked pages need (ack.lua's ``tdemand``)."""
        return max(0, self.stats.get("tdemand", 0)) / 1e6

    @property
    def revisit_stretch(self) -> float:
        """The factor ack.lua stretches the site's revisits by to fit its budget (1: none)."""
        return max(1000, self.stats.get("stretch", 1000)) / 1000.0

    @property
    def is_empty(self) -> bool:
        return self.backlog == 0 and self.pending == 0 and self.delayed == 0

    def band_backlog(self, band: str) -> int:
        return sum(s.backlog for (t, b), s in self.streams.items() if b == band)


@dataclass(slots=True)
class ShardLease:
    """lease.lua's reply: one :class:`LeaseReply` per site asked, in order (None: the call's
    budget was spent before that site); ready sites of the shard for the next call; ms
    until its next site that is not ready yet is due (-1 none); the shard's halt."""

    sites: list[LeaseReply | None]
    named: list[str]
    next_in_ms: int
    #: the shard's halt (keys.py): '' none, ``pause:<id>`` while a move copies the crawl,
    #: ``moved:<url>`` once it has moved
    halt: str = ""
