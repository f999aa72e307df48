"""The pure half of ``streams-sched upgrade``: what to move, and what the reads found.

It owns the names of the keys a site's move copies (old and new, with the revisit
buckets that may still exist), which nodes count as online, what a site's read reply
means, and the counts an upgrade reports. :mod:`.upgrade` does the Redis I/O with them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams_sched.errors import StreamsSchedError
from streams_sched.frontier.keys import STREAMS, SiteKeys
from streams_sched.frontier.records import BloomParams
from streams_sched.service.liveness import ALIVE, node_states

__all__ = [
    "Counts",
    "NodesOnline",
    "SiteRead",
    "UpgradeError",
    "UpgradeResult",
    "bucket_window",
    "key_pairs",
    "online_nodes",
    "parse_site_read",
]

#: the site attributes that name one key each, old and new layout alike (streams and
#: revisit buckets come on top); the old per-site ``sync`` key is not moved: it only
#: marks a replica barrier and expires by itself
SITE_KEY_FIELDS = ("delayed", "seen", "seen_meta", "dlq", "stats", "policy", "obs", "obs_v1")
#: 1-based positions in key_pairs' old keys of what upgrade_read.lua counts
DELAYED_AT, DLQ_AT, STATS_AT = (len(STREAMS) + 1 + SITE_KEY_FIELDS.index(n) for n in ("delayed", "dlq", "stats"))


class UpgradeError(StreamsSchedError):
    """The crawl cannot be upgraded as it is (unknown crawl, shards out of range, ...)."""


class NodesOnline(UpgradeError):
    """Nodes of the crawl are online: their writes would race the move."""

    def __init__(self, crawl: str, nodes: Sequence[str]) -> None:
        self.nodes = list(nodes)
        shown = ", ".join(self.nodes[:5]) + (f" and {len(self.nodes) - 5} more" if len(self.nodes) > 5 else "")
        super().__init__(
            f"{len(self.nodes)} node(s) of crawl {crawl!r} are online ({shown}): stop the workers first"
            " (and the reclaimers and Seeders of the previous version), then run the upgrade again;"
            " --force moves the keys anyway (what a running worker writes meanwhile may be lost)"
        )


@dataclass
class Counts:
    """Requests of one site (or summed over sites) in the four places a request can be."""

    queued: int = 0
    pending: int = 0
    delayed: int = 0
    dead_letters: int = 0

    def add(self, other: Counts) -> None:
        self.queued += other.queued
        self.pending += other.pending
        self.delayed += other.delayed
        self.dead_letters += other.dead_letters

    def as_tuple(self) -> tuple[int, int, int, int]:
        return (self.queued, self.pending, self.delayed, self.dead_letters)


@dataclass
class UpgradeResult:
    crawl: str
    shards: int
    #: sites of the old registry looked at
    sites: int = 0
    #: sites whose keys this run moved
    moved: int = 0
    #: sites without any old key: moved by an earlier run (or without keys at all)
    skipped: int = 0
    keys_moved: int = 0
    #: new keys an earlier run restored from old keys that have gone since
    keys_dropped: int = 0
    #: the moved sites' requests before (old keys) and after (new keys)
    before: Counts = field(default_factory=Counts)
    after: Counts = field(default_factory=Counts)
    #: moved sites whose counts differ before and after (something wrote meanwhile)
    mismatched: list[str] = field(default_factory=list)
    #: sites that could not be moved (site -> Redis' answer); the old registry stays
    failed: dict[str, str] = field(default_factory=dict)
    #: the crawl already had the sharded layout: nothing was done
    already: bool = False
    #: the old registry is deleted: the crawl runs on this version now
    finished: bool = False
    duration_s: float = 0.0


def online_nodes(records: Mapping[str, Mapping[str, Any]], now_s: float) -> list[str]:
    """Nodes that are online: state "online" and heard from within three of their heartbeats."""
    return [n for n, st in node_states(records, now_s).items() if st.state == ALIVE]


def bucket_window(meta: Mapping[str, str], now_s: float) -> list[int]:
    """Revisit buckets whose filters may still exist (none without revisits): the ones
    dedupe looks at, one newer and two older (a bucket lives on for up to two bucket
    widths past the window, and writers' clocks differ)."""
    try:
        revisit_s = float(meta.get("revisit_seconds") or 0)
        n = int(float(meta.get("revisit_buckets") or 4))
    except ValueError:
        return []
    if revisit_s <= 0 or n < 1:
        return []
    params = BloomParams(revisit_seconds=revisit_s, revisit_buckets=n)
    current = params.buckets(now_s)[0]
    return list(range(current + 1, current - n - 3, -1))


def key_pairs(old: SiteKeys, new: SiteKeys, buckets: Iterable[int] = ()) -> list[tuple[str, str]]:
    """(old name, new name) of every key of a site an upgrade moves."""
    pairs = list(zip(old.streams, new.streams, strict=True))
    pairs += [(getattr(old, name), getattr(new, name)) for name in SITE_KEY_FIELDS]
    for bucket in buckets:
        pairs += zip(old.seen_bucket(bucket), new.seen_bucket(bucket), strict=True)
    return pairs


@dataclass
class SiteRead:
    """What the first read of a chunk found of one site."""

    name: str
    pairs: list[tuple[str, str]]
    #: DUMP and PTTL of each old key (None: no such key)
    dumps: list[tuple[bytes, int] | None]
    before: Counts
    #: the site's enqueued counter (old stats if it has old keys, else new)
    enqueued: int

    @property
    def has_old(self) -> bool:
        return any(d is not None for d in self.dumps)

    @property
    def stale(self) -> list[str]:
        """New names whose old key is gone: what an earlier run restored and is out of date."""
        return [new for (_, new), dumped in zip(self.pairs, self.dumps, strict=True) if dumped is None]


def parse_site_read(name: str, pairs: list[tuple[str, str]], read: Sequence[Any], new_enqueued: Any) -> SiteRead:
    """What upgrade_read.lua's reply ``read`` says of site ``name``: per stream XLEN and
    pending entries, delayed and dead-letter counts, the old enqueued counter, then
    {position, DUMP, PTTL} of each old key that exists. ``new_enqueued``: the new
    layout's counter, which counts when the site has no old key."""
    n = len(STREAMS)
    queued = sum(max(0, int(read[2 * i]) - int(read[2 * i + 1])) for i in range(n))
    pending = sum(int(read[2 * i + 1]) for i in range(n))
    delayed, dead, old_enq = int(read[2 * n]), int(read[2 * n + 1]), read[2 * n + 2]
    dumps: list[tuple[bytes, int] | None] = [None] * len(pairs)
    rest = read[2 * n + 3 :]
    for i in range(0, len(rest), 3):
        dumps[int(rest[i]) - 1] = (rest[i + 1], int(rest[i + 2]))
    site = SiteRead(name, pairs, dumps, Counts(queued, pending, delayed, dead), 0)
    site.enqueued = int((old_enq if site.has_old else new_enqueued) or 0)
    return site
