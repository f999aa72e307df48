"""Thin Redis I/O for the frontier: one method per script or command.

Every method takes ``pipe=``: pass a pipeline to batch many calls into one
round trip, then turn each reply into data with the matching ``parse_*``
function. Without ``pipe`` the call runs at once and returns the parsed reply.
Workers, daemons and the CLI all go through this class, so the key layout and
the scripts have one Python face.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError

from streams_sched.connect.clients import TRANSIENT, is_cluster_client, refresh_topology
from streams_sched.errors import DedupeBackendError, LayoutError
from streams_sched.frontier import script_keys
from streams_sched.frontier.keys import (
    DEFAULT_SHARDS,
    GROUP,
    MAX_SHARDS,
    STREAMS,
    TASK_TYPES,
    CrawlKeys,
    ShardKeys,
    SiteKeys,
    shard_of,
    stream_code,
    stream_mask,
    stream_of_code,
)
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import Scripts

__all__ = [
    "BloomParams",
    "Entry",
    "Frontier",
    "LeaseReply",
    "LeasedEntry",
    "Outgoing",
    "SiteStatus",
    "crawl_bloom",
    "detect_dedupe",
    "parse_claim",
    "over_cap_of",
    "parse_enqueue",
    "parse_lease",
    "parse_status",
]

#: claim.lua stream mask that considers every stream
NO_MASK = stream_mask(TASK_TYPES)
#: lease.lua ARGV[8..12]: the crawl's default policy ("*"), kept in the crawl meta hash
#: as ``default_<field>`` (policy.set_policy writes them).
DEFAULT_POLICY_FIELDS: tuple[str, ...] = ("rate", "burst", "paused", "weight", "max_browser")
_DEFAULT_RATE = DEFAULT_POLICY_FIELDS.index("rate")  # feedback.lua ARGV[11]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BloomParams:
    """Dedupe back-end ('bf' = RedisBloom, 'bitmap'), its sizing, and revisits.

    With ``revisit_seconds`` (W) set, fingerprints live in time buckets of width
    W / ``revisit_buckets``; a fingerprint is a duplicate while it is in the
    current bucket or one of the ``revisit_buckets`` before it, so a page can be
    crawled again no sooner than W and no later than W plus one bucket after
    it was last enqueued. Each bucket's filter expires on its own.
    """

    mode: str = "bitmap"
    error_rate: float = 0.001
    capacity: int = 100_000
    expansion: int = 2
    revisit_seconds: float = 0.0
    revisit_buckets: int = 4

    @property
    def bucket_seconds(self) -> float:
        return self.revisit_seconds / self.revisit_buckets

    def buckets(self, now: float) -> list[int]:
        """The current bucket id, then the older ones still in the window."""
        current = int(now // self.bucket_seconds)
        return [current - i for i in range(self.revisit_buckets + 1)]

    @property
    def bucket_ttl(self) -> int:
        return int((self.revisit_buckets + 2) * self.bucket_seconds) + 1


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
    entries: list[LeasedEntry] = field(default_factory=list)


@dataclass(slots=True)
class StreamStatus:
    backlog: int
    pending: int
    oldest_pending_ms: int


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
    def is_empty(self) -> bool:
        return self.backlog == 0 and self.pending == 0 and self.delayed == 0

    def band_backlog(self, band: str) -> int:
        return sum(s.backlog for (t, b), s in self.streams.items() if b == band)


def _int(v: Any) -> int:
    return int(v) if v is not None else 0


def _first_site(reply: Sequence[Any]) -> Sequence[Any]:
    """The first site's part of a reply of a script that serves several sites."""
    return reply[0] if reply and isinstance(reply[0], list) else reply


def parse_enqueue(reply: Sequence[Any]) -> tuple[int, int, int, bytes]:
    """-> (added, duplicates, delayed, flags) where flags[i] is ord('1') if request i was
    added, ord('0') a duplicate, ord('c') over the site's page cap (see over_cap_of).
    Takes one site's part of enqueue.lua's reply (or the reply of a one-site call)."""
    reply = _first_site(reply)
    return int(reply[0]), int(reply[1]), int(reply[2]), bytes(reply[3])


def over_cap_of(reply: Sequence[Any]) -> int:
    """Requests of an enqueue reply dropped over the site's page cap (max_pages)."""
    reply = _first_site(reply)
    return int(reply[4]) if len(reply) > 4 else 0


def _entries(site: str, flat: Sequence[Any], start: int, claimed: bool = False) -> list[LeasedEntry]:
    out = []
    for i in range(start, len(flat), 4):
        d = int(flat[i + 3])
        out.append(LeasedEntry(site, stream_of_code(int(flat[i])), flat[i + 1], flat[i + 2] or None, d, claimed or d > 0))
    return out


@dataclass(slots=True)
class ShardLease:
    """lease.lua's reply: one :class:`LeaseReply` per site asked, in order (None: the call's
    budget was spent before that site); ready sites of the shard for the next call; ms
    until its next site that is not ready yet is due (-1 none)."""

    sites: list[LeaseReply | None]
    named: list[str]
    next_in_ms: int


def parse_shard_lease(sites: Sequence[str], reply: Sequence[Any]) -> ShardLease:
    n = len(sites)
    return ShardLease(
        [parse_lease(site, part) if part else None for site, part in zip(sites, reply[:n], strict=True)],
        [text(s) for s in reply[n]],
        int(reply[n + 1]),
    )


def parse_lease(site: str, reply: Sequence[Any]) -> LeaseReply:
    reply = _first_site(reply)
    head = [int(v) for v in reply[:7]]
    r = LeaseReply(head[0], head[1], head[2], head[3], head[4], head[5], head[6])
    try:
        r.weight = float(reply[7]) if reply[7] else 1.0
    except ValueError:
        r.weight = 1.0
    r.max_browser = int(reply[8])
    r.rate = float(reply[9] or 0)
    r.entries = _entries(site, reply, 10)
    return r


def parse_claim(site: str, reply: Sequence[Any]) -> tuple[int, int, list[LeasedEntry]]:
    """-> (taken, dead-lettered, entries returned in claim mode)."""
    return int(reply[0]), int(reply[1]), _entries(site, reply, 2, claimed=True)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in zip(flat[::2], flat[1::2], strict=True)
    }


def parse_status(site: str, reply: Sequence[Any]) -> SiteStatus:
    streams = {}
    for n, key in enumerate(STREAMS):
        base = 1 + 3 * n
        streams[key] = StreamStatus(int(reply[base]), int(reply[base + 1]), int(reply[base + 2]))
    tail = 1 + 3 * len(STREAMS)
    stats = {k: int(float(v)) for k, v in _pairs(reply[tail + 3]).items() if _is_number(v)}
    return SiteStatus(
        site=site,
        now_ms=int(reply[0]),
        streams=streams,
        delayed=int(reply[tail]),
        next_due_ms=int(reply[tail + 1]),
        dead_letters=int(reply[tail + 2]),
        stats=stats,
        policy=_pairs(reply[tail + 4]),
    )


def _chunked(items: Sequence[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield list(items[i : i + n])


def _is_moved(exc: Exception) -> bool:
    """A cluster redirection: the slot moved (resharding) since the client read the map."""
    text = str(exc)
    return text.startswith(("MOVED", "ASK")) or type(exc).__name__ in ("MovedError", "AskError")


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def detect_dedupe(client: Any, crawl: str, wanted: str) -> str:
    """Decide the dedupe back-end ('bf' or 'bitmap') for a crawl, once per crawl.

    ``wanted`` is the STREAMS_DEDUPE setting: 'auto', 'redisbloom' or 'bitmap'.
    The first worker records its choice in the crawl meta hash; later workers
    follow it, so one crawl never mixes back-ends.
    """
    keys = CrawlKeys(crawl)
    has_bf = server_has_bloom(client, keys.meta + ":bfprobe")
    if wanted == "redisbloom" and not has_bf:
        raise DedupeBackendError(
            'STREAMS_DEDUPE="redisbloom" but this Redis has no RedisBloom module (BF.* commands);'
            ' use Redis 8 or Redis Stack, load redisbloom.so, or set STREAMS_DEDUPE="bitmap"'
        )
    choice = {"redisbloom": "bf", "bitmap": "bitmap"}.get(wanted, "bf" if has_bf else "bitmap")
    client.hsetnx(keys.meta, "dedupe", choice)
    recorded = text(client.hget(keys.meta, "dedupe"))
    if recorded != choice:
        if wanted != "auto":
            raise DedupeBackendError(
                f"crawl {crawl!r} was started with dedupe back-end {recorded!r}, but"
                f" STREAMS_DEDUPE={wanted!r}; a crawl cannot switch back-ends (purge it first)"
            )
        if recorded == "bf" and not has_bf:
            raise DedupeBackendError(
                f"crawl {crawl!r} uses RedisBloom for dedupe, but this Redis has no BF.* commands;"
                " load the RedisBloom module or purge the crawl"
            )
        choice = recorded
    return choice


def server_has_bloom(client: Any, probe_key: str = "ss:bfprobe") -> bool:
    """True if the server answers RedisBloom commands (BF.EXISTS on a missing key)."""
    try:
        client.execute_command("BF.EXISTS", probe_key, "x")
        return True
    except Exception as exc:  # unknown command
        text = str(exc).lower()
        # a cluster client asks COMMAND for the key positions first, and says so itself
        if "unknown command" in text or "err unknown" in text or "doesn't exist in redis commands" in text:
            return False
        raise


def crawl_bloom(
    client: Any,
    crawl: str,
    wanted: str = "auto",
    error_rate: float | None = None,
    capacity: int | None = None,
    expansion: int | None = None,
    revisit_seconds: float | None = None,
    revisit_buckets: int | None = None,
) -> BloomParams:
    """The crawl's Bloom parameters, fixed by its first worker and shared by every client.

    The bitmap filter's layout depends on them, so a worker with other
    settings uses the recorded ones and says so. ``None`` means "whatever the
    crawl uses" (the defaults if nobody recorded any yet).
    """
    mode = detect_dedupe(client, crawl, wanted)
    meta = CrawlKeys(crawl).meta
    default = BloomParams()
    asked = (error_rate, capacity, expansion, revisit_seconds, revisit_buckets)
    mine = {
        "bloom_error_rate": repr(default.error_rate if error_rate is None else error_rate),
        "bloom_capacity": str(default.capacity if capacity is None else capacity),
        "bloom_expansion": str(default.expansion if expansion is None else expansion),
        "revisit_seconds": repr(float(default.revisit_seconds if revisit_seconds is None else revisit_seconds)),
        "revisit_buckets": str(default.revisit_buckets if revisit_buckets is None else revisit_buckets),
    }
    for field_name, value in mine.items():
        client.hsetnx(meta, field_name, value)
    rec = [text(v) for v in client.hmget(meta, list(mine))]
    params = BloomParams(mode, float(rec[0]), int(rec[1]), int(rec[2]), float(rec[3]), int(rec[4]))
    recorded = (params.error_rate, params.capacity, params.expansion, params.revisit_seconds, params.revisit_buckets)
    if None not in asked and recorded != asked:
        logger.warning(
            "crawl %s keeps the dedupe parameters it started with (error_rate, capacity, expansion,"
            " revisit_seconds, revisit_buckets = %s); the settings ask for %s",
            crawl, recorded, asked,
        )
    return params



class Frontier:
    """The crawl frontier of one crawl in one Redis (or Redis Cluster)."""

    def __init__(
        self,
        client: Any,
        crawl: str,
        bloom: BloomParams | None = None,
        group: str = GROUP,
        shards: int | None = None,
    ) -> None:
        self.client = client
        self.crawl = crawl
        #: the crawl's number of shards (keys.py), read from its meta hash on first use
        self._shards = shards
        self.keys = CrawlKeys(crawl)
        self.bloom = bloom or BloomParams()
        self.group = group
        self.scripts = Scripts(client)
        #: Redis Cluster: node events use sharded pub/sub (SPUBLISH), so they stay
        #: on the shard of the crawl's slot instead of being broadcast to every node.
        self.cluster = is_cluster_client(client)
        self._sites: dict[str, SiteKeys] = {}
        #: task type of requests that name none, for sites whose policy names none
        self.default_task = "http"
        #: the crawl's default policy ("*"), as lease.lua ARGV: DEFAULT_POLICY_FIELDS in order
        self.default_policy: tuple[str, ...] = ("",) * len(DEFAULT_POLICY_FIELDS)
        #: lease.lua's politeness flags: "a" adaptive back-off, "r" robots.txt obeyed
        self.politeness = ""

    def crawl_meta(self) -> dict[str, str]:
        """The crawl's meta hash, decoded (dedupe parameters, defaults, site key, ...)."""
        return {text(k): text(v) for k, v in self.client.hgetall(self.keys.meta).items()}

    def use_crawl_defaults(self, meta: Mapping[str, str]) -> None:
        """Take the crawl's default policy and default task type from its meta hash (decoded),
        for the scripts that fall back on them (lease, feedback, enqueue)."""
        self.default_policy = tuple(meta.get(f"default_{name}", "") for name in DEFAULT_POLICY_FIELDS)
        self.default_task = meta.get("default_task_type") or "http"

    # -- key layout ----------------------------------------------------------

    @property
    def shards(self) -> int:
        """The crawl's number of shards: recorded in its meta hash by the first writer
        (:meth:`ensure_layout`); a crawl nobody wrote yet reads as the default."""
        if self._shards is None:
            recorded = self.client.hget(self.keys.meta, "shards")
            if recorded is not None:
                self._shards = int(recorded)
                return self._shards
            self._refuse_unsharded()
            return DEFAULT_SHARDS
        return self._shards

    def _refuse_unsharded(self) -> None:
        if self.client.exists(self.keys.sites):
            raise LayoutError(
                f"crawl {self.crawl!r} was written by a version of streams-sched that keeps each site"
                " in a hash slot of its own; this version groups sites into shards. Stop every worker,"
                " reclaimer and Seeder of the crawl, then run `streams-sched upgrade --crawl"
                f" {self.crawl}` (it moves the keys and keeps every queued, leased and delayed request)"
            )

    def ensure_layout(self, shards: int = DEFAULT_SHARDS) -> int:
        """Record the crawl's number of shards if nobody has (a writer calls this at start);
        returns the number the crawl uses, which may differ from ``shards``."""
        if self._shards is not None:
            return self._shards
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"a crawl has 1 to {MAX_SHARDS} shards, not {shards}")
        if self.client.hget(self.keys.meta, "shards") is None:
            self._refuse_unsharded()
            self.client.hsetnx(self.keys.meta, "shards", shards)
        recorded = int(self.client.hget(self.keys.meta, "shards"))
        if recorded != shards:
            logger.info("crawl %s keeps its %d shards (STREAMS_SHARDS=%d)", self.crawl, recorded, shards)
        self._shards = recorded
        return recorded

    def site(self, site: str) -> SiteKeys:
        keys = self._sites.get(site)
        if keys is None:
            if len(self._sites) > 8192:
                self._sites.clear()  # a cache, not a registry: a broad crawl must not grow it
            keys = self._sites[site] = SiteKeys(self.crawl, site, shard_of(site, self.shards))
        return keys

    def shard(self, n: int) -> ShardKeys:
        return ShardKeys(self.crawl, n)

    def shard_keys(self) -> list[ShardKeys]:
        return [ShardKeys(self.crawl, n) for n in range(self.shards)]

    def _target(self, pipe: Any) -> Any:
        return self.client if pipe is None else pipe

    # -- crawl-level ------------------------------------------------------

    def register(self, pipe: Any = None) -> Any:
        """Add the crawl to the global registry of crawls."""
        return self._target(pipe).sadd(CrawlKeys.registry(), self.crawl)

    def register_sites(self, sites: Iterable[str], pipe: Any = None) -> Any:
        """Add sites to their shards' registries (enqueue.lua does it for the sites it
        adds to; this is for a site that gets a policy or dead letters first)."""
        by_shard: dict[str, list[str]] = {}
        for site in sites:
            by_shard.setdefault(self.site(site).index.sites, []).append(site)
        target = self._target(pipe)
        return [target.sadd(key, *names) for key, names in by_shard.items()]

    def sites(self) -> list[str]:
        """Every site of the crawl (an operator's listing: it reads every shard's registry)."""
        out: list[str] = []
        for shard in self.shard_keys():
            out += (s.decode() if isinstance(s, bytes) else s for s in self.client.sscan_iter(shard.sites, count=1000))
        return sorted(out)

    @staticmethod
    def crawls(client: Any) -> list[str]:
        return sorted(
            c.decode() if isinstance(c, bytes) else c for c in client.smembers(CrawlKeys.registry())
        )

    def publish(self, event: dict[str, Any], pipe: Any = None) -> Any:
        """Publish a node event on the crawl's channel (SPUBLISH on Redis Cluster)."""
        command = "SPUBLISH" if self.cluster else "PUBLISH"
        return self._target(pipe).execute_command(command, self.keys.events, json.dumps(event, sort_keys=True))

    def subscribe_events(self) -> Any:
        """A pub/sub object subscribed to the crawl's node events (SSUBSCRIBE on a cluster).

        Read it with ``get_sharded_message()`` on a cluster, ``get_message()`` otherwise.
        """
        pubsub = self.client.pubsub()
        if self.cluster:
            pubsub.ssubscribe(self.keys.events)
        else:
            pubsub.subscribe(self.keys.events)
        return pubsub

    def record_node(self, node: str, info: dict[str, Any], pipe: Any = None) -> Any:
        return self._target(pipe).hset(self.keys.nodes, node, json.dumps(info, sort_keys=True))

    def nodes(self) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(self.keys.nodes)
        out = {}
        for k, v in raw.items():
            try:
                out[k.decode() if isinstance(k, bytes) else k] = json.loads(v)
            except ValueError:
                continue
        return out

    # -- per-site scripts ---------------------------------------------------

    def filters(self, site: str, now: float | None = None) -> list[str]:
        """Bloom filter keys (filter, meta, ...) for enqueue: current filter first."""
        k = self.site(site)
        b = self.bloom
        if not b.revisit_seconds:
            return [k.seen, k.seen_meta]
        keys: list[str] = []
        for bucket in b.buckets(time.time() if now is None else now):
            keys += k.seen_bucket(bucket)
        return keys

    def enqueue(self, site: str, items: Sequence[Entry], pipe: Any = None) -> Any:
        """Dedupe and add requests of one site (their own ``site`` is not read). ``Entry.stream`` is an index into
        STREAMS, or ``SITE_TASK + band`` for the task type from the site's policy."""
        reply = self.enqueue_shard([(site, items)], pipe)
        return reply if pipe is not None else parse_enqueue(reply)

    def enqueue_shard(self, sites: Sequence[tuple[str, Sequence[Entry]]], pipe: Any = None) -> Any:
        """Dedupe and add requests of several sites of ONE shard in one call. The reply
        has one part per site, in order (read each with :func:`parse_enqueue`)."""
        b = self.bloom
        ttl = b.bucket_ttl if b.revisit_seconds else 0
        now = time.time()
        first = self.site(sites[0][0])
        keyed = [(self.site(site), self.filters(site, now)) for site, _ in sites]
        args: list[Any] = [self.group, b.mode, b.error_rate, b.capacity, b.expansion, ttl, self.default_task,
                           len(keyed[0][1]) // 2]
        for site, items in sites:
            args += (site, len(items))
            for it in items:
                args += (it.fp, stream_code(it.stream), it.delay_ms, it.payload)
        return self.scripts.call(self.scripts.enqueue, script_keys.enqueue(first.index, keyed), args, pipe)

    def lease(
        self,
        site: str,
        consumer: str,
        total: int,
        weights: Sequence[int],
        max_http: int | None = None,
        max_browser: int = 0,
        promote_limit: int = 100,
        max_suspects: int = 1,
        pipe: Any = None,
    ) -> Any:
        """Lease up to ``total`` entries (at most ``max_http`` http, ``max_browser`` browser,
        ``max_suspects`` that failed a delivery before)."""
        max_http = total if max_http is None else max_http
        reply = self.lease_shard(
            self.site(site).shard or 0, consumer, [(site, total, max_http, max_browser)], weights,
            promote_limit=promote_limit, max_suspects=max_suspects, pipe=pipe,
        )
        return reply if pipe is not None else parse_lease(site, reply)

    def lease_shard(
        self,
        shard: int,
        consumer: str,
        plans: Sequence[tuple[str, int, int, int]],
        weights: Sequence[int],
        *,
        name: int = 0,
        spread: int = 0,
        tasks: str = "hb",
        paused_wait_ms: int = 1000,
        promote_limit: int = 100,
        max_suspects: int = 1,
        budget: int | None = None,
        pipe: Any = None,
    ) -> Any:
        """Lease from several sites of ONE shard: ``plans`` = (site, total, max http, max
        browser) each; and name up to ``name`` of the shard's ready sites per task type in
        ``tasks`` ('h', 'b'), from a place that ``spread`` (a random number) picks among the
        oldest ones; lease no more than
        ``budget`` entries in all (default: the plans' sum). Read the reply with
        :func:`parse_shard_lease`."""
        keys = script_keys.lease(self.shard(shard), [self.site(p[0]) for p in plans])
        if budget is None:
            budget = sum(p[1] for p in plans)
        args: list[Any] = [self.group, consumer, *weights, promote_limit, max_suspects,
                           *self.default_policy, self.politeness, name, spread, tasks, paused_wait_ms, budget]
        for site, total, max_http, max_browser in plans:
            args += (site, total, max_http, max_browser)
        return self.scripts.call(self.scripts.lease, keys, args, pipe)

    def feedback(self, site: str, outcome: Sequence[int], robots_delay: str, params: Sequence[Any], pipe: Any = None) -> Any:
        """Report a batch of a site's answers: ``outcome`` = (healthy, 429/503, timeouts,
        longest Retry-After in ms); ``robots_delay`` its Crawl-delay in s ('' not reported);
        ``params`` = (adaptive '1'/'0', decrease, increase, floor, forget ms). See feedback.lua."""
        k = self.site(site)
        return self.scripts.call(
            self.scripts.feedback, script_keys.feedback(k), self._feedback_args(outcome, robots_delay, params), pipe
        )

    def _feedback_args(self, outcome: Sequence[int], robots_delay: str, params: Sequence[Any]) -> list[Any]:
        """feedback.lua's ARGV (also carried by ack.lua)."""
        return [*outcome, robots_delay, *params, self.default_policy[_DEFAULT_RATE]]

    def claim(
        self,
        site: str,
        consumer: str,
        min_idle_ms: int,
        count: int,
        max_deliveries: int,
        mode: str = "claim",
        mask: str = NO_MASK,
        pipe: Any = None,
    ) -> Any:
        k = self.site(site)
        reply = self.scripts.call(
            self.scripts.claim,
            script_keys.claim(k),
            [self.group, consumer, min_idle_ms, count, max_deliveries, mode, mask, site],
            pipe,
        )
        return reply if pipe is not None else parse_claim(site, reply)

    def ack(
        self,
        site: str,
        entries: Iterable[tuple[int, bytes]],
        pipe: Any = None,
        answers: tuple[int, Sequence[Any]] | None = None,
    ) -> Any:
        """Ack and delete finished entries of a site. ``answers`` = (healthy answers,
        feedback params as for :meth:`feedback`) reports the site's healthy answers in
        the same call (what :meth:`feedback` would do with outcome (n, 0, 0, 0))."""
        reply = self.ack_shard([(site, entries, answers)], pipe)
        return reply if pipe is not None else int(reply[0])

    def ack_shard(
        self,
        sites: Sequence[tuple[str, Iterable[tuple[int, bytes]], tuple[int, Sequence[Any]] | None]],
        pipe: Any = None,
    ) -> Any:
        """Ack entries of several sites of ONE shard in one call: (site, entries, answers)
        each, as for :meth:`ack`. The reply has the count acked per site, in order."""
        args: list[Any] = [self.group]
        for site, entries, answers in sites:
            args.append(site)
            if answers is None:
                args.append(0)
            else:
                ok, params = answers
                extra = self._feedback_args((ok, 0, 0, 0), "", params)
                args += (len(extra), *extra)
            pairs: list[Any] = []
            for stream, entry_id in entries:
                pairs += (stream_code(stream), entry_id)
            args += (len(pairs) // 2, *pairs)
        keyed = [self.site(site) for site, _, _ in sites]
        return self.scripts.call(self.scripts.ack, script_keys.ack(keyed[0].index, keyed), args, pipe)

    def dead_letter(
        self, site: str, node: str, items: Iterable[tuple[int, bytes, str]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, node, site]
        for stream, entry_id, reason in items:
            args += (stream_code(stream), entry_id, reason)
        return self.scripts.call(self.scripts.dead, script_keys.dead(k), args, pipe)

    def release(
        self, site: str, consumer: str, entries: Iterable[tuple[int, bytes]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, consumer, site]
        for stream, entry_id in entries:
            args += (stream_code(stream), entry_id)
        return self.scripts.call(self.scripts.release, script_keys.release(k), args, pipe)

    def fail(
        self,
        site: str,
        consumer: str,
        max_deliveries: int,
        entries: Iterable[tuple[int, bytes, str]],
        pipe: Any = None,
    ) -> Any:
        """Leases whose delivery failed, each with what went wrong: back to their stream
        with the delivery counted, or to the dead-letter stream once they have had
        ``max_deliveries``. -> [requeued, dead-lettered] (the pipeline's reply)."""
        k = self.site(site)
        args: list[Any] = [self.group, consumer, site, max_deliveries]
        for stream, entry_id, what in entries:
            args += (stream_code(stream), entry_id, what)
        return self.scripts.call(self.scripts.fail, script_keys.fail(k), args, pipe)

    def extend(self, site: str, consumer: str, stream: int, entry_id: bytes, pipe: Any = None) -> Any:
        """Reset the idle time of a lease this consumer holds (it lasts a full lease again)."""
        k = self.site(site)
        return self._target(pipe).xclaim(
            k.streams[stream], self.group, consumer, 0, [entry_id], justid=True
        )

    def promote(self, site: str, limit: int = 1000, pipe: Any = None) -> Any:
        k = self.site(site)
        return self.scripts.call(
            self.scripts.promote, script_keys.promote(k), [self.group, limit, site], pipe
        )

    def prune(self, site: str, victims: Iterable[tuple[int, str]], pipe: Any = None) -> Any:
        """Remove consumers (stream index, consumer name) of a site that own no pending
        entries. -> consumers removed (the raw reply with ``pipe``)."""
        args: list[Any] = [self.group]
        for stream, consumer in victims:
            args += (stream_code(stream), consumer)
        reply = self.scripts.call(self.scripts.prune, script_keys.prune(self.site(site)), args, pipe)
        return reply if pipe is not None else int(reply)

    def requeue_dead(self, site: str, ids: Sequence[str], pipe: Any = None) -> Any:
        """Put dead letters of a site back into their streams. -> (requeued, kept, missing)."""
        reply = self.scripts.call(
            self.scripts.requeue_dead, script_keys.requeue_dead(self.site(site)), [self.group, site, *ids], pipe
        )
        return reply if pipe is not None else (int(reply[0]), int(reply[1]), int(reply[2]))

    def reindex(self, site: str, lease_score_ms: int = 0, pipe: Any = None) -> Any:
        """Put a site in its shard's indexes as its keys say (for keys written by anything
        but these scripts). -> (backlog http, backlog browser, pending, delayed)."""
        reply = self.scripts.call(
            self.scripts.reindex, script_keys.reindex(self.site(site)), [self.group, site, lease_score_ms], pipe
        )
        return reply if pipe is not None else tuple(int(v) for v in reply)

    def load_scripts(self, client: Any = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        self.scripts.load(client)

    def status(self, site: str, client: Any = None) -> SiteStatus:
        """Read-only snapshot of a site (works for a read-only ACL user)."""
        k = self.site(site)
        reply = self.scripts.status_ro(
            client or self.client, script_keys.status(k), [self.group, site]
        )
        return parse_status(site, reply)

    def status_many(self, sites: Sequence[str]) -> list[SiteStatus]:
        """Snapshots of many sites in one round trip (EVALSHA_RO in a pipeline; on a
        cluster, one pipeline per node). Works for a read-only ACL user."""
        if not sites:
            return []
        replies: dict[str, Any] = {}
        if self.cluster:
            # redis-py's cluster pipeline routes EVALSHA_RO with a COMMAND GETKEYS round
            # trip per call: send each node its own sites in a plain pipeline instead.
            by_node: dict[str, tuple[Any, list[str]]] = {}
            for s in sites:
                node = self.client.get_node_from_key(self.site(s).tag)
                by_node.setdefault(node.name, (node.redis_connection, []))[1].append(s)
            for connection, node_sites in by_node.values():
                try:
                    replies.update(self._status_pipeline(connection, node_sites))
                except TRANSIENT:
                    refresh_topology(self.client)  # so the caller's retry asks the node's successor
                    raise
        else:
            replies = self._status_pipeline(self.client, sites)
        out = []
        for s in sites:
            reply = replies[s]
            if isinstance(reply, NoScriptError) or (isinstance(reply, Exception) and _is_moved(reply)):
                out.append(self.status(s))  # EVAL_RO loads nothing; the cluster client follows MOVED
            elif isinstance(reply, Exception):
                raise reply
            else:
                out.append(parse_status(s, reply))
        return out

    def shard_counts(self) -> list[tuple[int, int, int, int]]:
        """(sites ready for http, for browser, sites with leases, enqueued) of every shard,
        in one pipeline: what the drain check reads, whatever the number of
        idle sites (an idle site is in none of the indexes)."""
        replies = list(_chunked(self._counts_pipeline(self.client, self.shard_keys()), 4))
        out = []
        for part in replies:
            for v in part:
                if isinstance(v, Exception):
                    raise v
            out.append((int(part[0]), int(part[1]), int(part[2]), int(part[3] or 0)))
        return out

    @staticmethod
    def _counts_pipeline(client: Any, shards: Sequence[ShardKeys]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for shard in shards:
            for ready in shard.readies:
                pipe.zcard(ready)
            pipe.zcard(shard.leased)
            pipe.hget(shard.stats, "enqueued")
        return list(pipe.execute(raise_on_error=False))

    def expired_sites(self, older_than_ms: int, per_shard: int) -> list[str]:
        """Sites whose oldest lease was granted more than ``older_than_ms`` ago (Redis
        time), up to ``per_shard`` per shard: where a takeover may find expired leases.
        One round trip per shard's server, whatever the number of idle sites."""
        now_s, now_us = self.client.time()
        cutoff = now_s * 1000 + now_us // 1000 - older_than_ms
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shard_keys():
            pipe.zrangebyscore(shard.leased, "-inf", cutoff, start=0, num=per_shard)
        return [text(s) for part in pipe.execute() for s in part]

    def leased_sites(self, per_shard: int = 10_000) -> list[str]:
        """Sites that hold leased entries (at most ``per_shard`` per shard)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shard_keys():
            pipe.zrange(shard.leased, 0, per_shard - 1)
        return [text(s) for part in pipe.execute() for s in part]

    def _status_pipeline(self, client: Any, sites: Sequence[str]) -> dict[str, Any]:
        sha = self.scripts._status.sha
        pipe = client.pipeline(transaction=False)
        for s in sites:
            keys = script_keys.status(self.site(s))
            pipe.execute_command("EVALSHA_RO", sha, len(keys), *keys, self.group, s)
        return dict(zip(sites, pipe.execute(raise_on_error=False), strict=True))

    def dead_letters(self, site: str, count: int = 100, start: str = "-") -> list[dict[str, Any]]:
        out = []
        for entry_id, fields in self.client.xrange(self.site(site).dlq, start, "+", count=count):
            d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in fields.items()}
            d["dlq_id"] = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
            d["site"] = site
            out.append(d)
        return out

    def purge_site(self, site: str, pipe: Any = None) -> Any:
        """Delete every key of a site (one DEL: all keys share the site's hash slot).
        Revisit buckets older than the window expire on their own."""
        k = self.site(site)
        keys = list(k.all)
        if self.bloom.revisit_seconds:
            keys += self.filters(site)
        target = pipe if pipe is not None else self.client.pipeline(transaction=False)
        target.execute_command("DEL", *keys)  # one slot; a cluster pipeline refuses a multi-key delete()
        ix = k.index
        for ready in ix.readies:
            target.zrem(ready, site)
        target.zrem(ix.leased, site)
        target.hdel(ix.inbox, site)
        target.srem(ix.sites, site)
        if pipe is not None:
            return None
        return int(target.execute()[0])

    def purge(self) -> int:
        """Delete the whole crawl: every site's keys, the shards' indexes, nodes, meta, the
        feed lock and a migrated scrapy-redis dupefilter (never the scrapy-redis keys themselves)."""
        sites = self.sites()
        deleted = 0
        pipe = self.client.pipeline(transaction=False)
        for i, s in enumerate(sites):
            # the site's own keys only: the shards' indexes go whole below
            keys = list(self.site(s).all) + (self.filters(s) if self.bloom.revisit_seconds else [])
            pipe.execute_command("DEL", *keys)
            if i % 1000 == 999:
                deleted += sum(int(n) for n in pipe.execute())
        deleted += sum(int(n) for n in pipe.execute())
        for shard in self.shard_keys():
            deleted += int(self.client.delete(*shard.all))
        k = self.keys
        deleted += int(self.client.delete(k.sites, k.nodes, k.meta, k.feed_lock, k.legacy_seen, k.sync))
        self.client.srem(CrawlKeys.registry(), self.crawl)
        return deleted
