"""The scheduler's settings: the table :data:`SETTINGS` (one row per Scrapy setting) and
:class:`StreamsConfig`, the validated values of one worker, built from it.

Each row holds a setting's name, field, default, meaning and section of the reference
page (:func:`settings_markdown`, the docs' ``streams-settings`` directive), and how its
value is parsed and checked (streams_sched/settings_parse.py). A bad value fails at start
with a :class:`~streams_sched.errors.ConfigError` naming the setting and the value.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams_sched import settings_parse as p
from streams_sched.connect.urls import URL_OPTIONS, redact, validate_redis_url
from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import DEFAULT_SHARDS
from streams_sched.settings_parse import (
    DEFAULT_FEED_KEY,
    STRICT_RATIO,
    check_port,
    check_positive,
    parse_band_ratio,
    validate_node_id,
)

__all__ = [
    "DEFAULT_FEED_KEY", "SETTINGS", "STRICT_RATIO", "URL_OPTIONS", "Lookup", "Setting", "StreamsConfig",
    "check_port", "check_positive", "default_of", "parse_band_ratio", "redact", "settings_markdown", "validate_node_id",
    "validate_redis_url",
]

DEDUPE_BACKENDS = ("auto", "redisbloom", "bitmap")
#: What a worker does with a request the codec cannot encode (STREAMS_UNSERIALIZABLE).
UNSERIALIZABLE_MODES = ("local", "error")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


#: The ``fixed`` of a Lookup whose field must be given when StreamsConfig is built by hand.
REQUIRED: Any = _Required()


@dataclass(frozen=True)
class Lookup:
    """A default looked up when the settings are read: ``find(spider_name)``.

    ``fixed`` is the field's default when a StreamsConfig is built by hand (REQUIRED: the
    field must be given)."""

    find: Callable[[str | None], Any]
    fixed: Any = REQUIRED


@dataclass(frozen=True)
class Setting:
    """One setting: where it goes, its default, what it means and how it is read."""

    #: the Scrapy setting, e.g. "STREAMS_LEASE_SECONDS"
    name: str
    #: the StreamsConfig field it sets; when several rows set one field, the first that is set wins
    field: str
    #: the field's value when the setting is not set (a Lookup: found when the settings are read)
    default: Any
    #: its meaning, one short paragraph (Markdown inline code allowed)
    doc: str
    #: the heading it is listed under in the reference
    section: str
    #: parse(name, raw) -> the field's value, from a Python value or text (``-s``, the environment)
    parse: Callable[[str, Any], Any]
    #: check(name, value) raises ConfigError when the parsed value is out of range
    check: Callable[[str, Any], None] | None
    #: the default as the reference shows it, when the value alone would not say it
    doc_default: str | None = None

    def default_text(self) -> str:
        """The default as Markdown: ``doc_default``, else the value written as in settings.py."""
        if self.doc_default is not None:
            return self.doc_default
        value = self.default
        if isinstance(value, bool):
            return str(value)
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, (int, float)):
            return str(value)
        return f"`{json.dumps(list(value) if isinstance(value, tuple) else value)}`"


CONNECTION = "Connection"
LEASES = "Leases and delivery"
DEDUPE = "Dedupe and revisits"
CONTINUOUS = "Continuous crawling"
PRIORITIES = "Priorities and fairness"
POLITENESS = "Politeness"
BROWSER = "Browser"
SERIALIZATION = "Serialization"
REPLICAS = "Replicas"
FEED = "scrapy-redis feed"
WORKER = "Worker"
SAFETY = "Safety overrides"
#: The reference's sections, in order.
SECTIONS = (CONNECTION, LEASES, DEDUPE, CONTINUOUS, PRIORITIES, POLITENESS, BROWSER, SERIALIZATION, REPLICAS, FEED, WORKER, SAFETY)


def _env(variable: str, fallback: str) -> Lookup:
    """The environment variable, else ``fallback``; a StreamsConfig built by hand must be given it."""
    return Lookup(lambda spider: os.environ.get(variable, fallback))


def _env_flag(variable: str) -> Lookup:
    """The environment variable read as a flag, else False (also when built by hand)."""
    return Lookup(lambda spider: p.env_flag(variable), fixed=False)


S = Setting
#: Every setting of the scheduler, in the order of the reference (and of the checks).
SETTINGS: tuple[Setting, ...] = (
    S("REDIS_URL", "redis_url", _env("REDIS_URL", ""),
      "`redis://`, `rediss://` (TLS) or `unix://`; user and password in the URL for ACLs; `?cluster=1` for Redis Cluster; "
      "`redis+sentinel://host:port,host:port/service[/db]` (`rediss+sentinel://` with TLS) for the master of a Redis Sentinel service (see *Redis Sentinel*)",
      CONNECTION, p.as_is, p.redis_url, "env `REDIS_URL`"),
    S("STREAMS_PREFIX", "crawl", Lookup(lambda spider: spider or ""), "the crawl namespace",
      CONNECTION, p.as_is, p.crawl_name, "spider name"),
    S("STREAMS_SHARDS", "shards", DEFAULT_SHARDS,
      "shards a new crawl spreads its sites over (1 to 1,024), fixed when the crawl is created (meta `shards`): each lease, "
      "ack and enqueue call serves the sites of one shard, and a drain check reads every shard; on Redis Cluster give a "
      "crawl a few shards per master", CONNECTION, p.whole, p.shards),
    S("STREAMS_CONNECT_TIMEOUT_SECONDS", "connect_timeout_seconds", 30.0, "how long a starting worker waits for Redis",
      CONNECTION, p.number, p.positive_or_zero),
    S("STREAMS_SOCKET_TIMEOUT_SECONDS", "socket_timeout_seconds", 10.0, "socket timeout of the I/O thread's Redis calls",
      CONNECTION, p.number, p.positive),

    S("STREAMS_LEASE_SECONDS", "lease_seconds", 300.0, "how long a leased request is reserved for its worker",
      LEASES, p.number, p.positive),
    S("STREAMS_MAX_DELIVERIES", "max_deliveries", 5, "deliveries after which an entry goes to the dead-letter stream",
      LEASES, p.whole, p.at_least(1)),
    S("STREAMS_PREFETCH", "prefetch", 0, "requests leased ahead of the downloader (0 = `CONCURRENT_REQUESTS`)",
      LEASES, p.whole, p.at_least(0), "`CONCURRENT_REQUESTS`"),
    S("STREAMS_PREFETCH_PER_SITE", "prefetch_per_site", 0,
      "requests leased ahead per site, less with `DOWNLOAD_DELAY` or a rate limit (0 = `CONCURRENT_REQUESTS_PER_DOMAIN`)",
      LEASES, p.whole, p.at_least(0), "`CONCURRENT_REQUESTS_PER_DOMAIN`"),
    S("STREAMS_IDLE_POLL_SECONDS", "idle_poll_seconds", 1.0, "longest wait between looks for work when idle",
      LEASES, p.number, p.positive),
    S("STREAMS_FLUSH_INTERVAL_SECONDS", "flush_interval_seconds", 0.02, "longest time follow-ups and acks wait to be batched",
      LEASES, p.number, p.positive),

    S("STREAMS_DEDUPE", "dedupe", "auto", "`auto` (RedisBloom when the server has it, else bitmap), `redisbloom`, `bitmap`",
      DEDUPE, p.keyword, p.one_of(DEDUPE_BACKENDS)),
    S("STREAMS_BLOOM_ERROR_RATE", "bloom_error_rate", 0.001, "false-positive rate of the seen filter (per site)",
      DEDUPE, p.number, p.between_0_and_1("expected a rate between 0 and 1")),
    S("STREAMS_BLOOM_CAPACITY", "bloom_capacity", 100_000,
      "size of a site's Bloom filter, made when the site passes 1,024 fingerprints (smaller sites keep an exact set); "
      "past it the filter adds a layer (about 2 bytes per fingerprint at 0.1%)", DEDUPE, p.whole, p.at_least(1)),
    S("STREAMS_BLOOM_EXPANSION", "bloom_expansion", 2, "growth factor of each new layer", DEDUPE, p.whole, p.at_least(1)),
    S("STREAMS_LOCAL_SEEN_CACHE", "local_seen_cache", 200_000, "fingerprints a worker remembers to skip sending known duplicates",
      DEDUPE, p.whole, p.at_least(0)),
    S("STREAMS_URL_SHORTCUT", "url_shortcut", True,
      "with Scrapy's own fingerprinter, a GET URL this worker already sent is a duplicate without fingerprinting it again",
      DEDUPE, p.flag, p.is_flag),
    S("STREAMS_REVISIT_AFTER_SECONDS", "revisit_after_seconds", 0.0,
      "a fingerprint stops being a duplicate after this long (0 = never; e.g. 2592000 for 30 days); costs "
      "`STREAMS_REVISIT_BUCKETS` + 1 filters per site", DEDUPE, p.number, p.positive_or_zero),
    S("STREAMS_REVISIT_BUCKETS", "revisit_buckets", 4, "time buckets the revisit window is cut into",
      DEDUPE, p.whole, p.at_least(1)),

    S("STREAMS_REVISIT_EVERY_SECONDS", "revisit_every_seconds", 0.0,
      "track every page of the crawl: once acked, a page comes back after this long (0 = only pages with "
      "`meta[\"revisit\"]` or a site policy `revisit`; see *Continuous crawling*)", CONTINUOUS, p.number, p.positive_or_zero),
    S("STREAMS_REVISIT_ADAPTIVE", "revisit_adaptive", False,
      "a tracked page's interval adapts to how often it changes (a tracked page's own `adaptive` wins)",
      CONTINUOUS, p.flag, p.is_flag),
    S("STREAMS_REVISIT_RULE", "revisit_rule", "freshness",
      "how an adaptive page's interval moves: `freshness` spends each site's revisit budget where it buys the most "
      "freshness, from each page's estimated change rate; `nutch` multiplies the interval by the changed or "
      "unchanged factor", CONTINUOUS, p.keyword, p.one_of(("freshness", "nutch"), 'expected "freshness" or "nutch"')),
    S("STREAMS_REVISIT_CONDITIONAL", "revisit_conditional", True,
      "a tracked page's revisit sends `If-None-Match` / `If-Modified-Since` with the validators of its last answer; "
      "a 304 is an unchanged visit (a request's `meta[\"revisit_conditional\"] = False` turns it off for that page)",
      CONTINUOUS, p.flag, p.is_flag),
    S("STREAMS_REVISIT_MIN_SECONDS", "revisit_min_seconds", 60.0, "the shortest adaptive interval (a page's own `min` wins)",
      CONTINUOUS, p.number, p.positive),
    S("STREAMS_REVISIT_MAX_SECONDS", "revisit_max_seconds", 31_536_000.0,
      "the longest adaptive interval, 365 days (a page's own `max` wins)", CONTINUOUS, p.number, p.positive),
    S("STREAMS_REVISIT_CHANGED_FACTOR", "revisit_changed_factor", 0.8, "a revisit that found a change multiplies the interval by this",
      CONTINUOUS, p.number, p.between_0_and_1("expected a factor between 0 and 1, e.g. 0.8")),
    S("STREAMS_REVISIT_UNCHANGED_FACTOR", "revisit_unchanged_factor", 1.4,
      "a revisit that found no change multiplies the interval by this", CONTINUOUS, p.number,
      p.above_1("expected a factor above 1, e.g. 1.4")),
    S("STREAMS_REVISIT_JITTER", "revisit_jitter", 0.1,
      "each revisit is moved by up to this share of its interval, either way, so a site's pages spread out",
      CONTINUOUS, p.number, p.share("expected a share from 0 up to 1, e.g. 0.1")),
    S("STREAMS_REVISIT_STOP_AFTER", "revisit_stop_after", 3,
      "a tracked page that answers 404 or 410 this many times in a row is no longer tracked", CONTINUOUS, p.whole, p.at_least(1)),
    S("STREAMS_REVISIT_BACKOFF_LIMIT", "revisit_backoff_limit", 8,
      "a tracked page's temporary failures in a row (no answer, 429, 5xx) double its next delay, up to this many "
      "times its interval", CONTINUOUS, p.whole, p.at_least(1)),
    S("STREAMS_REVISIT_BUDGET_SHARE", "revisit_budget_share", 0.9,
      "the share of a site's rate its tracked pages' revisits may need; beyond it every page's next visit is "
      "stretched by the same factor", CONTINUOUS, p.number, p.above_0_up_to_1("expected a share above 0 and at most 1, e.g. 0.9")),

    S("STREAMS_HIGH_PRIORITY_MIN", "high_priority_min", 1, "`Request.priority` at or above this: high band (redirects get +2)",
      PRIORITIES, p.whole, p.check_whole),
    S("STREAMS_LOW_PRIORITY_MAX", "low_priority_max", -1,
      "`Request.priority` at or below this: low band (retries get -1); below `STREAMS_HIGH_PRIORITY_MIN`",
      PRIORITIES, p.whole, p.check_whole),
    S("STREAMS_BAND_RATIO", "band_ratio", (8, 3, 1),
      "how often high:default:low are served when all have work (`\"8:3:1\"`, a list, or a `{band: weight}` dict); "
      "`strict` = plain priority", PRIORITIES, p.band_ratio, None, "`8:3:1`"),

    S("STREAMS_SITES", "sites", {}, "per-site policy written to Redis at start, `{site: {rate, burst, ...}}`; "
      "the key `\"*\"` is the default for sites not listed", POLITENESS, p.json_dict, p.site_policies),
    S("STREAMS_SITE_KEY", "site_key", "host",
      "what a site is: `host`, or `domain` (registered domain: `a.shop.co.uk` and `b.shop.co.uk` are `shop.co.uk`)",
      POLITENESS, p.keyword, p.one_of(("host", "domain"), 'expected "host" or "domain"')),
    S("STREAMS_POLICY_REFRESH_SECONDS", "policy_refresh_seconds", 2.0, "how often a worker re-reads the crawl's default policy",
      POLITENESS, p.number, p.positive),
    S("STREAMS_RETRY_AFTER_MAX_SECONDS", "retry_after_max_seconds", 3600.0, "cap on a `Retry-After` delay",
      POLITENESS, p.number, p.positive),
    S("STREAMS_ADAPTIVE", "adaptive", True, "cluster-wide AIMD back-off on 429 / 503 / download timeouts, and a "
      "`Retry-After` pauses the whole site for every worker (see *Per-site policy*)", POLITENESS, p.flag, p.is_flag),
    S("STREAMS_ADAPTIVE_DECREASE", "adaptive_decrease", 0.7, "a congestion signal multiplies the site's rate by this",
      POLITENESS, p.number, p.between_0_and_1("expected a factor between 0 and 1, e.g. 0.7")),
    S("STREAMS_ADAPTIVE_INCREASE", "adaptive_increase", 0.5, "healthy answers raise a backed-off rate by this many req/s per second",
      POLITENESS, p.number, p.positive),
    S("STREAMS_ADAPTIVE_MIN_RATE", "adaptive_min_rate", 0.1,
      "the back-off never goes below this (req/s; or the policy rate if that is lower)", POLITENESS, p.number, p.positive),
    S("STREAMS_ADAPTIVE_FORGET_SECONDS", "adaptive_forget_seconds", 600.0,
      "a site without a policy or robots rate is unlimited again after this long without a congestion signal",
      POLITENESS, p.number, p.positive),
    S("STREAMS_FEEDBACK_INTERVAL_SECONDS", "feedback_interval_seconds", 0.5,
      "how often a worker reports healthy answers to Redis (429 / 503 / timeouts / robots.txt go at once)",
      POLITENESS, p.number, p.positive),
    S("STREAMS_MAX_CRAWL_DELAY", "max_crawl_delay_seconds", 30.0, "cap on a robots.txt `Crawl-delay` (seconds), with `ROBOTSTXT_OBEY`",
      POLITENESS, p.number, p.positive),

    S("STREAMS_CAPABILITIES", "capabilities", ("http",), "task types this worker leases (`http`, `browser`)",
      BROWSER, p.names, p.capabilities),
    S("STREAMS_BROWSER_MAX", "browser_max", 4,
      "most browser requests a worker holds at once: leased, prefetched, rendering or taken over (see *Browser pages*)", BROWSER, p.whole, p.at_least(0)),

    S("STREAMS_REQUEST_CLASSES", "request_classes", (),
      "import paths of extra Request subclasses allowed in entries (e.g. `scrapy_splash.SplashRequest`)",
      SERIALIZATION, p.names, None),
    S("STREAMS_META_CLASSES", "meta_classes", (), "import paths of classes, beyond item classes, whose objects may travel in "
      "meta and cb_kwargs (as their attributes; Enums by value, namedtuples by fields); loaded at start",
      SERIALIZATION, p.names, p.import_paths),
    S("STREAMS_META_CODECS", "meta_codecs", {}, "`{class import path: codec import path}`: a codec is any object with "
      "`encode(obj) -> data` and `decode(data) -> obj` (e.g. `streams_sched.MetaCodec`); or register from Python with "
      "`streams_sched.register_meta_codec(cls, encode, decode)`", SERIALIZATION, p.json_dict, p.codec_paths),
    S("STREAMS_MAX_REQUEST_BYTES", "max_request_bytes", 1_000_000, "largest encoded request sent to Redis (0 = no limit); "
      "a larger one is handled as `STREAMS_UNSERIALIZABLE` says", SERIALIZATION, p.whole, p.at_least(0)),
    S("STREAMS_UNSERIALIZABLE", "unserializable", "local", "a request that cannot be encoded (a lambda callback, a Response "
      "in meta, over `STREAMS_MAX_REQUEST_BYTES`): `\"local\"` = this worker crawls it from memory (not shared, not leased, "
      "lost if the worker dies); `\"error\"` = refuse it with an ERROR and make the crawl exit 1",
      SERIALIZATION, p.keyword, p.one_of(UNSERIALIZABLE_MODES)),

    S("STREAMS_MIN_REPLICAS", "min_replicas", -1, "replicas of each primary that must have a request's follow-ups before its "
      "ack is sent (`WAIT`): `\"auto\"` = 1 where the primary reports a connected replica, else 0 (and 0 again, with one "
      "ERROR line, once a primary has had no replica for 10 s); a number = always that many, holding acks while fewer are "
      "connected; 0 = never wait", REPLICAS, p.min_replicas, p.at_least(-1), '`"auto"`'),
    S("STREAMS_REPLICA_WAIT_MS", "replica_wait_ms", 500, "longest one `WAIT` for those replicas may block the I/O thread; "
      "when it falls short the acks stay held and the wait is tried again, never dropped", REPLICAS, p.whole, p.at_least(1)),

    S("STREAMS_FEED_KEY", "feed_key", Lookup(lambda spider: DEFAULT_FEED_KEY, fixed=""),
      "the scrapy-redis feed the workers move into the crawl; `%(name)s` is the crawl name (`STREAMS_PREFIX`, by default "
      "the spider name, so the key scrapy-redis uses); `\"\"` = no feed", FEED, p.feed_key, None, "`%(name)s:start_urls`"),
    S("REDIS_START_URLS_KEY", "feed_key", DEFAULT_FEED_KEY, "scrapy-redis's name of the feed key, read when `STREAMS_FEED_KEY` is not set",
      FEED, p.feed_key, None),
    S("REDIS_START_URLS_AS_SET", "feed_as_set", False, "the feed is a SET instead of a list", FEED, p.flag, p.is_flag),
    S("REDIS_START_URLS_AS_ZSET", "feed_as_zset", False, "the feed is a ZSET (highest score first) instead of a list",
      FEED, p.flag, p.is_flag),
    S("REDIS_ENCODING", "feed_encoding", "utf-8", "encoding of feed entries", FEED, p.text, p.encoding),
    S("STREAMS_FEED_BATCH", "feed_batch", 100, "feed entries moved per round", FEED, p.whole, p.at_least(1)),
    S("STREAMS_FEED_POLL_SECONDS", "feed_poll_seconds", 1.0, "how often an empty feed is looked at (one `LLEN`)",
      FEED, p.number, p.positive),

    S("STREAMS_NODE_ID", "node_id", "", "this worker's consumer name", WORKER, p.text, p.node_id, "host-pid-random"),
    S("STREAMS_HEARTBEAT_SECONDS", "heartbeat_seconds", 5.0, "node heartbeat interval", WORKER, p.number, p.positive),
    S("STREAMS_CLOSE_ON_DRAIN", "close_on_drain", True, "close once the whole crawl is drained; False: wait for new work",
      WORKER, p.flag, p.is_flag),
    S("STREAMS_EXIT_ON_MOVE", "exit_on_move", True, "a worker whose crawl was moved to another Redis (`streams-sched "
      "move`) closes and ends its process with exit code 6 once Scrapy has stopped; False: Scrapy's own exit code "
      "(a crawl run inside another program)", WORKER, p.flag, p.is_flag),
    S("STREAMS_EMPTY_CRAWL_WAIT_SECONDS", "empty_crawl_wait_seconds", 60.0, "a worker on a crawl that never had a request "
      "waits this long for seeds before it counts the crawl as drained", WORKER, p.number, p.positive_or_zero),
    S("STREAMS_SHUTDOWN_TIMEOUT_SECONDS", "shutdown_timeout_seconds", 25.0, "on SIGTERM / Ctrl-C, how long requests in "
      "progress may take to finish before their leases are handed back and the worker exits",
      WORKER, p.number, p.positive_or_zero),
    S("STREAMS_METRICS_PORT", "metrics_ports", (), "serve this worker's Prometheus metrics on this port, or the first free "
      "one of a range (`\"9410-9419\"`: one per worker on a host); unset = no metrics", WORKER, p.ports, None, "unset"),
    S("STREAMS_METRICS_ADDR", "metrics_addr", "0.0.0.0", "address the metrics server binds", WORKER, p.bind_address, p.address),

    S("STREAMS_ALLOW_UNTESTED_SCRAPY", "allow_untested_scrapy", _env_flag("STREAMS_ALLOW_UNTESTED_SCRAPY"),
      "let a Scrapy release above the tested range start, with a warning (see *Scrapy versions*); the engine's hook points "
      "are checked all the same",
      SAFETY, p.flag, p.is_flag, "env `STREAMS_ALLOW_UNTESTED_SCRAPY`, else False"),
    S("STREAMS_ALLOW_EVICTION", "allow_eviction", _env_flag("STREAMS_ALLOW_EVICTION"),
      "start even on a Redis whose `maxmemory-policy` is `allkeys-*` (which evicts queued requests silently), with a "
      "warning; without it such a worker refuses to start (see *Faults*)", SAFETY, p.flag, p.is_flag,
      "env `STREAMS_ALLOW_EVICTION`, else False"),
)
del S

#: field -> the first row that sets it (whose default is the field's)
_ROWS: dict[str, Setting] = {}
for _row in SETTINGS:
    _ROWS.setdefault(_row.field, _row)


def default_of(name: str) -> Any:
    """The default of StreamsConfig field ``name``, from its row of :data:`SETTINGS` (so a
    daemon that falls back to a worker's default cannot drift from it)."""
    row = _ROWS[name]
    return row.default.fixed if isinstance(row.default, Lookup) else row.default


def _field(name: str) -> Any:
    """The dataclass field ``name``, its default taken from its row of :data:`SETTINGS`."""
    row = _ROWS[name]
    default = default_of(name)
    metadata = {"setting": row.name}
    if default is REQUIRED:
        return field(metadata=metadata)
    if isinstance(default, (dict, list, set)):
        return field(default_factory=lambda: copy.copy(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class StreamsConfig:
    """Validated settings of one crawl's scheduler. Units are in the names; each field's
    setting, default and meaning are its row of :data:`SETTINGS`."""

    redis_url: str = _field("redis_url")
    crawl: str = _field("crawl")
    shards: int = _field("shards")
    connect_timeout_seconds: float = _field("connect_timeout_seconds")
    socket_timeout_seconds: float = _field("socket_timeout_seconds")
    lease_seconds: float = _field("lease_seconds")
    max_deliveries: int = _field("max_deliveries")
    prefetch: int = _field("prefetch")
    prefetch_per_site: int = _field("prefetch_per_site")
    idle_poll_seconds: float = _field("idle_poll_seconds")
    flush_interval_seconds: float = _field("flush_interval_seconds")
    dedupe: str = _field("dedupe")
    bloom_error_rate: float = _field("bloom_error_rate")
    bloom_capacity: int = _field("bloom_capacity")
    bloom_expansion: int = _field("bloom_expansion")
    local_seen_cache: int = _field("local_seen_cache")
    url_shortcut: bool = _field("url_shortcut")
    revisit_after_seconds: float = _field("revisit_after_seconds")
    revisit_buckets: int = _field("revisit_buckets")
    revisit_every_seconds: float = _field("revisit_every_seconds")
    revisit_adaptive: bool = _field("revisit_adaptive")
    revisit_rule: str = _field("revisit_rule")
    revisit_conditional: bool = _field("revisit_conditional")
    revisit_min_seconds: float = _field("revisit_min_seconds")
    revisit_max_seconds: float = _field("revisit_max_seconds")
    revisit_changed_factor: float = _field("revisit_changed_factor")
    revisit_unchanged_factor: float = _field("revisit_unchanged_factor")
    revisit_jitter: float = _field("revisit_jitter")
    revisit_stop_after: int = _field("revisit_stop_after")
    revisit_backoff_limit: int = _field("revisit_backoff_limit")
    revisit_budget_share: float = _field("revisit_budget_share")
    high_priority_min: int = _field("high_priority_min")
    low_priority_max: int = _field("low_priority_max")
    band_ratio: tuple[int, int, int] = _field("band_ratio")
    sites: Mapping[str, Mapping[str, Any]] = _field("sites")
    site_key: str = _field("site_key")
    policy_refresh_seconds: float = _field("policy_refresh_seconds")
    retry_after_max_seconds: float = _field("retry_after_max_seconds")
    adaptive: bool = _field("adaptive")
    adaptive_decrease: float = _field("adaptive_decrease")
    adaptive_increase: float = _field("adaptive_increase")
    adaptive_min_rate: float = _field("adaptive_min_rate")
    adaptive_forget_seconds: float = _field("adaptive_forget_seconds")
    feedback_interval_seconds: float = _field("feedback_interval_seconds")
    max_crawl_delay_seconds: float = _field("max_crawl_delay_seconds")
    capabilities: tuple[str, ...] = _field("capabilities")
    browser_max: int = _field("browser_max")
    request_classes: tuple[str, ...] = _field("request_classes")
    meta_classes: tuple[str, ...] = _field("meta_classes")
    meta_codecs: Mapping[str, str] = _field("meta_codecs")
    max_request_bytes: int = _field("max_request_bytes")
    unserializable: str = _field("unserializable")
    min_replicas: int = _field("min_replicas")
    replica_wait_ms: int = _field("replica_wait_ms")
    feed_key: str = _field("feed_key")
    feed_as_set: bool = _field("feed_as_set")
    feed_as_zset: bool = _field("feed_as_zset")
    feed_encoding: str = _field("feed_encoding")
    feed_batch: int = _field("feed_batch")
    feed_poll_seconds: float = _field("feed_poll_seconds")
    node_id: str = _field("node_id")
    heartbeat_seconds: float = _field("heartbeat_seconds")
    close_on_drain: bool = _field("close_on_drain")
    exit_on_move: bool = _field("exit_on_move")
    empty_crawl_wait_seconds: float = _field("empty_crawl_wait_seconds")
    shutdown_timeout_seconds: float = _field("shutdown_timeout_seconds")
    metrics_ports: tuple[int, ...] = _field("metrics_ports")
    metrics_addr: str = _field("metrics_addr")
    allow_untested_scrapy: bool = _field("allow_untested_scrapy")
    allow_eviction: bool = _field("allow_eviction")

    def __post_init__(self) -> None:
        for row in SETTINGS:
            if row.check is not None:
                row.check(row.name, getattr(self, row.field))
        if self.low_priority_max >= self.high_priority_min:
            raise ConfigError(
                "STREAMS_LOW_PRIORITY_MAX", self.low_priority_max, f"must be below STREAMS_HIGH_PRIORITY_MIN={self.high_priority_min}"
            )
        if self.feed_as_set and self.feed_as_zset:
            raise ConfigError("REDIS_START_URLS_AS_ZSET", True, "REDIS_START_URLS_AS_SET is set too; choose one")
        if self.revisit_every_seconds > 0 and self.revisit_after_seconds > 0:
            raise ConfigError(
                "STREAMS_REVISIT_EVERY_SECONDS", self.revisit_every_seconds,
                f"STREAMS_REVISIT_AFTER_SECONDS={self.revisit_after_seconds} is set too: a page found again after that"
                " window passes the seen filter and is tracked a second time. Tracked pages come back on their own:"
                " set STREAMS_REVISIT_AFTER_SECONDS = 0",
            )
        if self.revisit_min_seconds > self.revisit_max_seconds:
            raise ConfigError(
                "STREAMS_REVISIT_MIN_SECONDS", self.revisit_min_seconds,
                f"must not be above STREAMS_REVISIT_MAX_SECONDS={self.revisit_max_seconds}",
            )

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @property
    def feed_kind(self) -> str:
        """What the scrapy-redis feed is: "list", "set" or "zset"."""
        return "set" if self.feed_as_set else "zset" if self.feed_as_zset else "list"

    @classmethod
    def from_settings(cls, settings: Any, spider_name: str | None = None) -> StreamsConfig:
        """Build from Scrapy settings (or any mapping with ``get``).

        Each field takes the first of its rows in :data:`SETTINGS` that is set (not None),
        read by the row's parser; a field none of whose settings is set keeps its default,
        or looks it up (the environment, the spider name) when that default is a Lookup.
        """
        values: dict[str, Any] = {}
        for row in SETTINGS:
            if row.field not in values:
                raw = settings.get(row.name)
                if raw is not None:
                    values[row.field] = row.parse(row.name, raw)
        for row in SETTINGS:
            if row.field not in values and isinstance(row.default, Lookup):
                values[row.field] = row.default.find(spider_name)
        if values["feed_key"]:  # a template checked by its parser: %(name)s is the crawl name
            values["feed_key"] %= {"name": values["crawl"]}
        return cls(**values)


def settings_markdown(level: int | None = 2) -> str:
    """The settings reference in Markdown: per section a heading of ``level`` (None: a bold
    line, for a page whose headings must stay its own) and a table (setting, default,
    meaning) of its rows of :data:`SETTINGS`."""
    lines: list[str] = []
    for section in SECTIONS:
        title = f"**{section}**" if level is None else f"{'#' * level} {section}"
        lines += ["", title, "", "| setting | default | meaning |", "| --- | --- | --- |"]
        for row in SETTINGS:
            if row.section == section:
                lines.append(f"| `{row.name}` | {_cell(row.default_text())} | {_cell(row.doc)} |")
    return "\n".join(lines).lstrip("\n") + "\n"


def _cell(text: str) -> str:
    """Text that stays in one cell of a Markdown table."""
    return text.replace("|", "\\|").replace("\n", " ")
