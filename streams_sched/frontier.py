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

from . import script_keys
from .connection import TRANSIENT, is_cluster_client, refresh_topology
from .errors import DedupeBackendError
from .keys import GROUP, STREAMS, TASK_TYPES, CrawlKeys, SiteKeys, stream_code, stream_mask, stream_of_code
from .replies import text
from .scripts import Scripts

__all__ = [
    "BloomParams",
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
#: lease.lua ARGV[11..15]: the crawl's default policy ("*"), kept in the crawl meta hash
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
class Outgoing:
    """A request ready to enqueue: fingerprint (b"" = no dedupe), stream, delay, payload.

    ``stream`` is an index into STREAMS, or ``SITE_TASK + band`` (see keys.stream_for).
    """

    fp: bytes
    stream: int
    delay_ms: int
    payload: bytes


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


def parse_enqueue(reply: Sequence[Any]) -> tuple[int, int, int, bytes]:
    """-> (added, duplicates, delayed, flags) where flags[i] is ord('1') if request i was
    added, ord('0') a duplicate, ord('c') over the site's page cap (see over_cap_of)."""
    return int(reply[0]), int(reply[1]), int(reply[2]), bytes(reply[3])


def over_cap_of(reply: Sequence[Any]) -> int:
    """Requests of an enqueue reply dropped over the site's page cap (max_pages)."""
    return int(reply[4]) if len(reply) > 4 else 0


def _entries(site: str, flat: Sequence[Any], start: int, claimed: bool = False) -> list[LeasedEntry]:
    out = []
    for i in range(start, len(flat), 4):
        d = int(flat[i + 3])
        out.append(LeasedEntry(site, stream_of_code(int(flat[i])), flat[i + 1], flat[i + 2] or None, d, claimed or d > 0))
    return out


def parse_lease(site: str, reply: Sequence[Any]) -> LeaseReply:
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
    ) -> None:
        self.client = client
        self.crawl = crawl
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

    def site(self, site: str) -> SiteKeys:
        keys = self._sites.get(site)
        if keys is None:
            keys = self._sites[site] = SiteKeys(self.crawl, site)
        return keys

    def _target(self, pipe: Any) -> Any:
        return self.client if pipe is None else pipe

    # -- crawl-level ------------------------------------------------------

    def register(self, pipe: Any = None) -> Any:
        """Add the crawl to the global registry of crawls."""
        return self._target(pipe).sadd(CrawlKeys.registry(), self.crawl)

    def register_sites(self, sites: Iterable[str], pipe: Any = None) -> Any:
        sites = list(sites)
        if not sites:
            return 0
        return self._target(pipe).sadd(self.keys.sites, *sites)

    def sites(self) -> list[str]:
        return sorted(s.decode() if isinstance(s, bytes) else s for s in self.client.smembers(self.keys.sites))

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

    def enqueue(self, site: str, items: Sequence[Outgoing], pipe: Any = None) -> Any:
        """Dedupe and add requests of one site. ``Outgoing.stream`` is an index into
        STREAMS, or ``SITE_TASK + band`` for the task type from the site's policy."""
        k = self.site(site)
        b = self.bloom
        ttl = b.bucket_ttl if b.revisit_seconds else 0
        args: list[Any] = [self.group, b.mode, b.error_rate, b.capacity, b.expansion, ttl, self.default_task]
        for it in items:
            args += (it.fp, stream_code(it.stream), it.delay_ms, it.payload)
        reply = self.scripts.call(self.scripts.enqueue, script_keys.enqueue(k, self.filters(site)), args, pipe)
        return reply if pipe is not None else parse_enqueue(reply)

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
        k = self.site(site)
        max_http = total if max_http is None else max_http
        reply = self.scripts.call(
            self.scripts.lease,
            script_keys.lease(k),
            [self.group, consumer, total, max_http, max_browser, *weights, promote_limit, max_suspects,
             *self.default_policy, self.politeness],
            pipe,
        )
        return reply if pipe is not None else parse_lease(site, reply)

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
            [self.group, consumer, min_idle_ms, count, max_deliveries, mode, mask],
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
        k = self.site(site)
        args: list[Any] = [self.group]
        if answers is None:
            args.append(0)
        else:
            ok, params = answers
            extra = self._feedback_args((ok, 0, 0, 0), "", params)
            args += (len(extra), *extra)
        for stream, entry_id in entries:
            args += (stream_code(stream), entry_id)
        return self.scripts.call(self.scripts.ack, script_keys.ack(k), args, pipe)

    def dead_letter(
        self, site: str, node: str, items: Iterable[tuple[int, bytes, str]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, node]
        for stream, entry_id, reason in items:
            args += (stream_code(stream), entry_id, reason)
        return self.scripts.call(self.scripts.dead, script_keys.dead(k), args, pipe)

    def release(
        self, site: str, consumer: str, entries: Iterable[tuple[int, bytes]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, consumer]
        for stream, entry_id in entries:
            args += (stream_code(stream), entry_id)
        return self.scripts.call(self.scripts.release, script_keys.release(k), args, pipe)

    def extend(self, site: str, consumer: str, stream: int, entry_id: bytes, pipe: Any = None) -> Any:
        """Reset the idle time of a lease this consumer holds (it lasts a full lease again)."""
        k = self.site(site)
        return self._target(pipe).xclaim(
            k.streams[stream], self.group, consumer, 0, [entry_id], justid=True
        )

    def promote(self, site: str, limit: int = 1000, pipe: Any = None) -> Any:
        k = self.site(site)
        return self.scripts.call(
            self.scripts.promote, script_keys.promote(k), [self.group, limit], pipe
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
            self.scripts.requeue_dead, script_keys.requeue_dead(self.site(site)), [self.group, *ids], pipe
        )
        return reply if pipe is not None else (int(reply[0]), int(reply[1]), int(reply[2]))

    def load_scripts(self, client: Any = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        self.scripts.load(client)

    def status(self, site: str, client: Any = None) -> SiteStatus:
        """Read-only snapshot of a site (works for a read-only ACL user)."""
        k = self.site(site)
        reply = self.scripts.status_ro(
            client or self.client, script_keys.status(k), [self.group]
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

    def drain_probe(self, sites: Sequence[str]) -> list[tuple[str, bool, int]]:
        """(site, holds_keys, enqueued) for many sites in one pipeline, without a script.

        A site whose streams and delayed queue do not exist holds nothing: ack.lua
        deletes a stream once it is empty, and a sorted set with no member does not
        exist. ``holds_keys`` False is therefore proof the site is empty; True proves
        nothing (a stream may exist with nothing left to lease), so the caller reads
        such sites with :meth:`status_many`. Two commands per site (EXISTS over its
        seven queue keys, HGET of its enqueue counter) cost a fraction of status.lua,
        which a drain check would otherwise run for every site of a broad crawl, twice.
        """
        if not sites:
            return []
        pipe = self.client.pipeline(transaction=False)
        for s in sites:
            k = self.site(s)
            pipe.exists(k.delayed, *k.streams)
            pipe.hget(k.stats, "enqueued")
        replies = pipe.execute()
        return [
            (s, int(replies[2 * i]) > 0, int(replies[2 * i + 1] or 0)) for i, s in enumerate(sites)
        ]

    def _status_pipeline(self, client: Any, sites: Sequence[str]) -> dict[str, Any]:
        sha = self.scripts._status.sha
        pipe = client.pipeline(transaction=False)
        for s in sites:
            keys = script_keys.status(self.site(s))
            pipe.execute_command("EVALSHA_RO", sha, len(keys), *keys, self.group)
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
        keys = list(self.site(site).all)
        if self.bloom.revisit_seconds:
            keys += self.filters(site)
        return self._target(pipe).delete(*keys)

    def purge(self) -> int:
        """Delete the whole crawl: every site's keys, the registry, nodes, meta, the feed
        lock and a migrated scrapy-redis dupefilter (never the scrapy-redis keys themselves)."""
        sites = self.sites()
        deleted = 0
        for s in sites:
            deleted += int(self.purge_site(s))
        k = self.keys
        deleted += int(self.client.delete(k.sites, k.nodes, k.meta, k.feed_lock, k.legacy_seen, k.sync))
        self.client.srem(CrawlKeys.registry(), self.crawl)
        return deleted
