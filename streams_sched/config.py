"""Settings of the scheduler, read once and validated when the scheduler is built.

Every setting is prefixed ``STREAMS_`` except ``REDIS_URL``. Defaults are
documented here and in the README; a bad value fails at start with a
:class:`~streams_sched.errors.ConfigError` naming the setting and the value.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams_sched.connect.urls import URL_OPTIONS, redact, validate_redis_url
from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import BANDS, DEFAULT_SHARDS, MAX_SHARDS, TASK_TYPES, validate_crawl_name

__all__ = ["SETTINGS", "URL_OPTIONS", "StreamsConfig", "check_port", "check_positive", "parse_band_ratio", "redact", "validate_redis_url"]

#: Band weights used for "strict": high always first, low only when nothing else.
STRICT_RATIO: tuple[int, int, int] = (1_000_000_000_000, 1_000_000, 1)

DEDUPE_BACKENDS = ("auto", "redisbloom", "bitmap")
#: What a worker does with a request the codec cannot encode (STREAMS_UNSERIALIZABLE).
UNSERIALIZABLE_MODES = ("local", "error")


def parse_band_ratio(value: Any, setting: str = "STREAMS_BAND_RATIO") -> tuple[int, int, int]:
    """Parse "5:3:2" (or a 3-sequence, a {band: weight} dict, or "strict") into three
    positive weights."""
    if isinstance(value, str) and value.strip().lower() == "strict":
        return STRICT_RATIO
    parts: list[Any]
    if isinstance(value, str) and value.lstrip().startswith("{"):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(setting, value, f"is not valid JSON ({exc})") from None
    if isinstance(value, Mapping):
        unknown = [b for b in value if b not in BANDS]
        if unknown:
            raise ConfigError(setting, dict(value), f"unknown band(s) {unknown}; the bands are {list(BANDS)}")
        parts = [value.get(b, 1) for b in BANDS]
    elif isinstance(value, str):
        parts = value.split(":")
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise ConfigError(setting, value, 'expected "high:default:low" weights like "8:3:1", or "strict"')
    try:
        weights = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        raise ConfigError(setting, value, "weights must be whole numbers, e.g. \"8:3:1\"") from None
    if len(weights) != len(BANDS) or any(w < 1 for w in weights):
        raise ConfigError(setting, value, "expected three weights of at least 1 (high:default:low)")
    return weights  # type: ignore[return-value]


@dataclass(frozen=True)
class StreamsConfig:
    """Validated settings of one crawl's scheduler. Units are in the names."""

    #: REDIS_URL: the frontier's Redis (redis://, rediss:// with TLS, unix://, or redis+sentinel:// /
    #: rediss+sentinel:// for the master of a Sentinel service: see streams_sched/connect/urls.py).
    redis_url: str
    #: STREAMS_PREFIX: the crawl namespace; default the spider name.
    crawl: str
    #: STREAMS_LEASE_SECONDS: how long a leased request is reserved for its worker.
    lease_seconds: float = 300.0
    #: STREAMS_MAX_DELIVERIES: deliveries after which an entry goes to the dead-letter stream.
    max_deliveries: int = 5
    #: STREAMS_DEDUPE: "auto" (RedisBloom when the server has it, else bitmap),
    #: "redisbloom" or "bitmap".
    dedupe: str = "auto"
    #: STREAMS_BLOOM_ERROR_RATE: false-positive rate of the seen filter (per site).
    bloom_error_rate: float = 0.001
    #: STREAMS_BLOOM_CAPACITY: size of a site's Bloom filter, made when the site passes
    #: 1,024 fingerprints (an exact set until then); past it the filter adds a layer
    #: (about 2 bytes per fingerprint at 0.1%).
    bloom_capacity: int = 100_000
    #: STREAMS_BLOOM_EXPANSION: growth factor of each new layer.
    bloom_expansion: int = 2
    #: STREAMS_HIGH_PRIORITY_MIN: Request.priority at or above this goes to the high band.
    high_priority_min: int = 1
    #: STREAMS_LOW_PRIORITY_MAX: Request.priority at or below this goes to the low band.
    low_priority_max: int = -1
    #: STREAMS_BAND_RATIO: how often each band is served when all have work.
    band_ratio: tuple[int, int, int] = (8, 3, 1)
    #: STREAMS_PREFETCH: requests leased ahead per worker; 0 = CONCURRENT_REQUESTS.
    prefetch: int = 0
    #: STREAMS_PREFETCH_PER_SITE: leased ahead per site; 0 = CONCURRENT_REQUESTS_PER_DOMAIN.
    prefetch_per_site: int = 0
    #: STREAMS_CLOSE_ON_DRAIN: close the worker once the whole crawl is drained.
    close_on_drain: bool = True
    #: STREAMS_IDLE_POLL_SECONDS: longest wait between looks for work when idle.
    idle_poll_seconds: float = 1.0
    #: STREAMS_FLUSH_INTERVAL_SECONDS: longest time follow-ups and acks wait to be batched.
    flush_interval_seconds: float = 0.02
    #: STREAMS_HEARTBEAT_SECONDS: interval of node heartbeats.
    heartbeat_seconds: float = 5.0
    #: STREAMS_NODE_ID: this worker's consumer name; "" = host-pid-random.
    node_id: str = ""
    #: STREAMS_RETRY_AFTER_MAX_SECONDS: cap on a Retry-After delay.
    retry_after_max_seconds: float = 3600.0
    #: STREAMS_LOCAL_SEEN_CACHE: fingerprints a worker remembers to skip sending known duplicates.
    local_seen_cache: int = 200_000
    #: STREAMS_MIN_REPLICAS: replicas of each primary that must hold a request's follow-ups
    #: before its ack is sent; -1 = "auto" (1 where the primary has a connected replica, else 0).
    min_replicas: int = -1
    #: STREAMS_REPLICA_WAIT_MS: how long one WAIT for those replicas may take before the
    #: acks stay held and the wait is tried again.
    replica_wait_ms: int = 500
    #: STREAMS_CONNECT_TIMEOUT_SECONDS: how long a starting worker waits for Redis.
    connect_timeout_seconds: float = 30.0
    #: STREAMS_SOCKET_TIMEOUT_SECONDS: socket timeout of Redis calls (the I/O thread's, not the reactor's).
    socket_timeout_seconds: float = 10.0
    #: STREAMS_SHUTDOWN_TIMEOUT_SECONDS: on close (SIGTERM, Ctrl-C), how long requests in
    #: progress may take to finish before their leases are handed back and the worker exits.
    shutdown_timeout_seconds: float = 25.0
    #: STREAMS_MAX_REQUEST_BYTES: largest encoded request accepted; 0 = no limit.
    max_request_bytes: int = 1_000_000
    #: STREAMS_REQUEST_CLASSES: import paths of extra Request subclasses allowed in entries.
    request_classes: tuple[str, ...] = ()
    #: STREAMS_META_CLASSES: import paths of classes (beyond item classes) whose objects may
    #: travel in meta and cb_kwargs, as their attributes; loaded at start.
    meta_classes: tuple[str, ...] = ()
    #: STREAMS_META_CODECS: {class import path: codec import path}, a codec being an object
    #: with encode(obj) -> plain data and decode(data) -> obj callables; loaded at start.
    meta_codecs: Mapping[str, str] = field(default_factory=dict)
    #: STREAMS_CAPABILITIES: task types this worker leases.
    capabilities: tuple[str, ...] = ("http",)
    #: STREAMS_BROWSER_MAX: most browser requests leased at once by this worker.
    browser_max: int = 4
    #: STREAMS_SITES: per-site policy written to Redis at start, {site: {rate, burst, ...}};
    #: the key "*" is the default for sites not listed.
    sites: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    #: STREAMS_REVISIT_AFTER_SECONDS: a fingerprint stops being a duplicate after this long
    #: (0 = never; e.g. 2592000 for 30 days). Costs STREAMS_REVISIT_BUCKETS + 1 filters per site.
    revisit_after_seconds: float = 0.0
    #: STREAMS_REVISIT_BUCKETS: time buckets the revisit window is cut into.
    revisit_buckets: int = 4
    #: STREAMS_POLICY_REFRESH_SECONDS: how often a worker re-reads the crawl's default policy.
    policy_refresh_seconds: float = 2.0
    #: STREAMS_EMPTY_CRAWL_WAIT_SECONDS: how long a worker on a crawl that never had a
    #: request waits for seeds before it counts the crawl as drained.
    empty_crawl_wait_seconds: float = 60.0
    #: STREAMS_ALLOW_UNTESTED_SCRAPY (or the environment variable): let a Scrapy release
    #: above the tested range start (with a warning), to try it; the engine's hook
    #: points are checked all the same.
    allow_untested_scrapy: bool = False
    #: STREAMS_ALLOW_EVICTION (or the environment variable): start even on a Redis whose
    #: maxmemory-policy is allkeys-*, which evicts queued requests silently (with a warning).
    allow_eviction: bool = False
    #: STREAMS_FEED_KEY (or scrapy-redis's REDIS_START_URLS_KEY): the scrapy-redis feed the
    #: worker moves into the crawl, "%(name)s" = the crawl name (STREAMS_PREFIX, by default
    #: the spider name, as in scrapy-redis); "" = no feed.
    feed_key: str = ""
    #: REDIS_START_URLS_AS_SET / REDIS_START_URLS_AS_ZSET (scrapy-redis's): "list", "set" or "zset".
    feed_kind: str = "list"
    #: STREAMS_FEED_BATCH: feed entries moved per round.
    feed_batch: int = 100
    #: STREAMS_FEED_POLL_SECONDS: how often an empty feed is looked at (one LLEN).
    feed_poll_seconds: float = 1.0
    #: STREAMS_SHARDS: shards a new crawl spreads its sites over (keys.py), fixed when the
    #: crawl is created; more shards spread a crawl over more Redis Cluster masters.
    shards: int = DEFAULT_SHARDS
    #: REDIS_ENCODING (scrapy-redis's): encoding of feed entries.
    feed_encoding: str = "utf-8"
    #: STREAMS_UNSERIALIZABLE: a request that cannot be encoded (a lambda callback, a
    #: Response in meta, over STREAMS_MAX_REQUEST_BYTES) is crawled by this worker from
    #: its memory ("local": not shared, not leased, lost if the worker dies) or refused
    #: with an error, and the crawl then ends with exit code 1 ("error").
    unserializable: str = "local"
    #: STREAMS_ADAPTIVE: cluster-wide AIMD back-off on 429 / 503 / timeouts, and a
    #: Retry-After pauses the whole site (see feedback.lua and the README).
    adaptive: bool = True
    #: STREAMS_ADAPTIVE_DECREASE: a congestion signal multiplies the site's rate by this.
    adaptive_decrease: float = 0.7
    #: STREAMS_ADAPTIVE_INCREASE: healthy answers raise a backed-off rate by this many req/s per second.
    adaptive_increase: float = 0.5
    #: STREAMS_ADAPTIVE_MIN_RATE: the back-off never goes below this (req/s).
    adaptive_min_rate: float = 0.1
    #: STREAMS_ADAPTIVE_FORGET_SECONDS: a site without a policy or robots rate is unlimited
    #: again after this long without a congestion signal.
    adaptive_forget_seconds: float = 600.0
    #: STREAMS_FEEDBACK_INTERVAL_SECONDS: how often a worker reports healthy answers
    #: (429 / 503 / timeouts / robots.txt are reported at once).
    feedback_interval_seconds: float = 0.5
    #: STREAMS_MAX_CRAWL_DELAY: cap on a robots.txt Crawl-delay, seconds.
    max_crawl_delay_seconds: float = 30.0
    #: STREAMS_SITE_KEY: "host" (a site is a host name) or "domain" (its registered domain).
    site_key: str = "host"
    #: with Scrapy's own fingerprinter, a GET URL this worker already sent is a duplicate
    url_shortcut: bool = True

    def __post_init__(self) -> None:
        validate_redis_url(self.redis_url)
        validate_crawl_name(self.crawl)
        check_positive("STREAMS_LEASE_SECONDS", self.lease_seconds)
        _whole("STREAMS_MAX_DELIVERIES", self.max_deliveries, minimum=1)
        if self.dedupe not in DEDUPE_BACKENDS:
            raise ConfigError("STREAMS_DEDUPE", self.dedupe, f"expected one of {DEDUPE_BACKENDS}")
        if not (0 < self.bloom_error_rate < 1):
            raise ConfigError(
                "STREAMS_BLOOM_ERROR_RATE", self.bloom_error_rate, "expected a rate between 0 and 1"
            )
        _whole("STREAMS_BLOOM_CAPACITY", self.bloom_capacity, minimum=1)
        _whole("STREAMS_BLOOM_EXPANSION", self.bloom_expansion, minimum=1)
        _whole("STREAMS_HIGH_PRIORITY_MIN", self.high_priority_min, minimum=None)
        _whole("STREAMS_LOW_PRIORITY_MAX", self.low_priority_max, minimum=None)
        if self.low_priority_max >= self.high_priority_min:
            raise ConfigError(
                "STREAMS_LOW_PRIORITY_MAX",
                self.low_priority_max,
                f"must be below STREAMS_HIGH_PRIORITY_MIN={self.high_priority_min}",
            )
        _whole("STREAMS_PREFETCH", self.prefetch, minimum=0)
        _whole("STREAMS_PREFETCH_PER_SITE", self.prefetch_per_site, minimum=0)
        check_positive("STREAMS_IDLE_POLL_SECONDS", self.idle_poll_seconds)
        check_positive("STREAMS_FLUSH_INTERVAL_SECONDS", self.flush_interval_seconds)
        check_positive("STREAMS_HEARTBEAT_SECONDS", self.heartbeat_seconds)
        check_positive("STREAMS_RETRY_AFTER_MAX_SECONDS", self.retry_after_max_seconds)
        _whole("STREAMS_LOCAL_SEEN_CACHE", self.local_seen_cache, minimum=0)
        check_positive("STREAMS_CONNECT_TIMEOUT_SECONDS", self.connect_timeout_seconds, zero_ok=True)
        check_positive("STREAMS_SOCKET_TIMEOUT_SECONDS", self.socket_timeout_seconds)
        check_positive("STREAMS_SHUTDOWN_TIMEOUT_SECONDS", self.shutdown_timeout_seconds, zero_ok=True)
        _whole("STREAMS_MAX_REQUEST_BYTES", self.max_request_bytes, minimum=0)
        _whole("STREAMS_BROWSER_MAX", self.browser_max, minimum=0)
        check_positive("STREAMS_REVISIT_AFTER_SECONDS", self.revisit_after_seconds, zero_ok=True)
        _whole("STREAMS_REVISIT_BUCKETS", self.revisit_buckets, minimum=1)
        check_positive("STREAMS_POLICY_REFRESH_SECONDS", self.policy_refresh_seconds)
        check_positive("STREAMS_EMPTY_CRAWL_WAIT_SECONDS", self.empty_crawl_wait_seconds, zero_ok=True)
        _whole("STREAMS_FEED_BATCH", self.feed_batch, minimum=1)
        check_positive("STREAMS_FEED_POLL_SECONDS", self.feed_poll_seconds)
        _whole("STREAMS_SHARDS", self.shards, minimum=1)
        if self.shards > MAX_SHARDS:
            raise ConfigError("STREAMS_SHARDS", self.shards, f"at most {MAX_SHARDS} (a drain check reads every shard)")
        if self.feed_kind not in ("list", "set", "zset"):
            raise ConfigError("REDIS_START_URLS_AS_SET", self.feed_kind, "expected list, set or zset")
        try:
            "".encode(self.feed_encoding)
        except LookupError:
            raise ConfigError("REDIS_ENCODING", self.feed_encoding, "unknown encoding") from None
        _whole("STREAMS_MIN_REPLICAS", self.min_replicas, minimum=-1)
        _whole("STREAMS_REPLICA_WAIT_MS", self.replica_wait_ms, minimum=1)
        if self.unserializable not in UNSERIALIZABLE_MODES:
            raise ConfigError("STREAMS_UNSERIALIZABLE", self.unserializable, f"expected one of {UNSERIALIZABLE_MODES}")
        if not (0 < self.adaptive_decrease < 1):
            raise ConfigError("STREAMS_ADAPTIVE_DECREASE", self.adaptive_decrease, "expected a factor between 0 and 1, e.g. 0.7")
        check_positive("STREAMS_ADAPTIVE_INCREASE", self.adaptive_increase)
        check_positive("STREAMS_ADAPTIVE_MIN_RATE", self.adaptive_min_rate)
        check_positive("STREAMS_ADAPTIVE_FORGET_SECONDS", self.adaptive_forget_seconds)
        check_positive("STREAMS_FEEDBACK_INTERVAL_SECONDS", self.feedback_interval_seconds)
        check_positive("STREAMS_MAX_CRAWL_DELAY", self.max_crawl_delay_seconds)
        if not isinstance(self.allow_eviction, bool):
            raise ConfigError("STREAMS_ALLOW_EVICTION", self.allow_eviction, "expected True or False")
        if self.site_key not in ("host", "domain"):
            raise ConfigError("STREAMS_SITE_KEY", self.site_key, 'expected "host" or "domain"')
        if self.node_id and not validate_node_id(self.node_id):
            raise ConfigError(
                "STREAMS_NODE_ID", self.node_id, "use letters, digits and . _ : @ - (max 128)"
            )
        bad = [c for c in self.capabilities if c not in TASK_TYPES]
        if bad or not self.capabilities:
            raise ConfigError(
                "STREAMS_CAPABILITIES", list(self.capabilities), f"expected a non-empty subset of {list(TASK_TYPES)}"
            )
        if not isinstance(self.meta_codecs, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.meta_codecs.items()
        ):
            raise ConfigError(
                "STREAMS_META_CODECS", self.meta_codecs, "expected a dict of class import path -> codec import path"
            )
        if not all(isinstance(c, str) for c in self.meta_classes):
            raise ConfigError("STREAMS_META_CLASSES", list(self.meta_classes), "expected a list of import paths")
        if not isinstance(self.sites, Mapping):
            raise ConfigError("STREAMS_SITES", self.sites, "expected a dict of site -> policy dict")
        from streams_sched.politeness.policy import validate_policy

        for site, policy in self.sites.items():
            validate_policy(site, policy)

    @property
    def lease_ms(self) -> int:
        return int(self.lease_seconds * 1000)

    @classmethod
    def from_settings(cls, settings: Any, spider_name: str | None = None) -> StreamsConfig:
        """Build from Scrapy settings (or any mapping with ``get``).

        A setting that is not set (or is None) keeps the field's default above; the
        table :data:`SETTINGS` names each field's setting and how its value is read.
        """
        redis_url = settings.get("REDIS_URL")
        crawl = settings.get("STREAMS_PREFIX")
        values: dict[str, Any] = {
            "redis_url": os.environ.get("REDIS_URL", "") if redis_url is None else redis_url,
            "crawl": (spider_name or "") if crawl is None else crawl,
        }
        for name, (setting, parse) in SETTINGS.items():
            value = settings.get(setting)
            if value is not None:
                values[name] = parse(setting, value)
        for name, env_name in (("allow_untested_scrapy", "STREAMS_ALLOW_UNTESTED_SCRAPY"), ("allow_eviction", "STREAMS_ALLOW_EVICTION")):
            if name not in values:  # the environment variable of the same name
                values[name] = os.environ.get(env_name, "").strip().lower() in _TRUE
        values["feed_key"] = _feed_key(settings, values["crawl"])
        values["feed_kind"] = _feed_kind(settings)
        return cls(**values)


def validate_node_id(node_id: str) -> bool:
    return 0 < len(node_id) <= 128 and all(c.isalnum() or c in "._:@-" for c in node_id)


#: scrapy-redis's default START_URLS_KEY.
DEFAULT_FEED_KEY = "%(name)s:start_urls"


def _feed_key(settings: Any, name: str) -> str:
    setting = "STREAMS_FEED_KEY"
    value = settings.get(setting)
    if value is None:
        setting = "REDIS_START_URLS_KEY"
        value = settings.get(setting, DEFAULT_FEED_KEY)
    if value is None or value is False:
        return ""
    if value is True:
        value = DEFAULT_FEED_KEY
    if not isinstance(value, str):
        raise ConfigError(setting, value, 'expected a key name like "%(name)s:start_urls", or "" for no feed')
    try:
        return value.strip() % {"name": name}
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(setting, value, f"only %(name)s may be substituted ({exc})") from None


def _feed_kind(settings: Any) -> str:
    as_set = _setting(settings, "REDIS_START_URLS_AS_SET", _bool, False)
    as_zset = _setting(settings, "REDIS_START_URLS_AS_ZSET", _bool, False)
    if as_set and as_zset:
        raise ConfigError("REDIS_START_URLS_AS_ZSET", True, "REDIS_START_URLS_AS_SET is set too; choose one")
    return "set" if as_set else "zset" if as_zset else "list"


def _setting(settings: Any, name: str, parse: Callable[[str, Any], Any], default: Any) -> Any:
    """``parse(name, value)`` of a setting that is set, else ``default``."""
    value = settings.get(name)
    return default if value is None else parse(name, value)


def _num(name: str, value: Any) -> float:
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "expected a number") from None
    if isinstance(value, bool) or not math.isfinite(result):
        raise ConfigError(name, value, "expected a finite number")
    return result


def _int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(name, value, "expected a whole number")
    try:
        result = int(value)
    except (TypeError, ValueError):
        raise ConfigError(name, value, "expected a whole number") from None
    if isinstance(value, float) and value != result:
        raise ConfigError(name, value, "expected a whole number")
    return result


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, value, "expected True or False")


def _str(name: str, value: Any) -> str:
    return str(value)


def _word(name: str, value: Any) -> str:
    """A keyword setting, case-insensitive ("auto", "local", ...); checked in __post_init__."""
    return str(value).strip().lower()


def _names(name: str, value: Any) -> tuple[Any, ...]:
    """A list, or a comma-separated string ("http,browser")."""
    if isinstance(value, str):
        return tuple(c.strip() for c in value.split(",") if c.strip())
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise ConfigError(name, value, 'expected a list, or names separated by commas ("a,b")')
    return tuple(value)


def _json_dict(name: str, value: Any) -> Any:
    """A dict, or its JSON text ("" = empty); anything else is left for __post_init__ to name."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise ConfigError(name, value, f"not valid JSON ({exc})") from None
    return dict(value) if isinstance(value, Mapping) else value


def _min_replicas(name: str, value: Any) -> int:
    """"auto" (-1) or a number of replicas."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return -1
    n = _int(name, value)
    if n < 0:
        raise ConfigError(name, value, 'expected "auto" or a number of replicas (0 = do not wait for any)')
    return n


def _band_ratio(name: str, value: Any) -> tuple[int, int, int]:
    return parse_band_ratio(value, name)


#: field of :class:`StreamsConfig` -> (its setting, how a value that is set is read).
#: A setting left unset keeps the field's default. Not in the table: redis_url and
#: crawl (their defaults come from the environment and the spider), feed_key and
#: feed_kind (scrapy-redis's settings, read by _feed_key and _feed_kind), and the
#: defaults of allow_untested_scrapy and allow_eviction (the environment variables of
#: the same names).
SETTINGS: dict[str, tuple[str, Callable[[str, Any], Any]]] = {
    "lease_seconds": ("STREAMS_LEASE_SECONDS", _num),
    "max_deliveries": ("STREAMS_MAX_DELIVERIES", _int),
    "dedupe": ("STREAMS_DEDUPE", _word),
    "bloom_error_rate": ("STREAMS_BLOOM_ERROR_RATE", _num),
    "bloom_capacity": ("STREAMS_BLOOM_CAPACITY", _int),
    "bloom_expansion": ("STREAMS_BLOOM_EXPANSION", _int),
    "high_priority_min": ("STREAMS_HIGH_PRIORITY_MIN", _int),
    "low_priority_max": ("STREAMS_LOW_PRIORITY_MAX", _int),
    "band_ratio": ("STREAMS_BAND_RATIO", _band_ratio),
    "prefetch": ("STREAMS_PREFETCH", _int),
    "prefetch_per_site": ("STREAMS_PREFETCH_PER_SITE", _int),
    "close_on_drain": ("STREAMS_CLOSE_ON_DRAIN", _bool),
    "idle_poll_seconds": ("STREAMS_IDLE_POLL_SECONDS", _num),
    "flush_interval_seconds": ("STREAMS_FLUSH_INTERVAL_SECONDS", _num),
    "heartbeat_seconds": ("STREAMS_HEARTBEAT_SECONDS", _num),
    "node_id": ("STREAMS_NODE_ID", _str),
    "retry_after_max_seconds": ("STREAMS_RETRY_AFTER_MAX_SECONDS", _num),
    "local_seen_cache": ("STREAMS_LOCAL_SEEN_CACHE", _int),
    "min_replicas": ("STREAMS_MIN_REPLICAS", _min_replicas),
    "replica_wait_ms": ("STREAMS_REPLICA_WAIT_MS", _int),
    "connect_timeout_seconds": ("STREAMS_CONNECT_TIMEOUT_SECONDS", _num),
    "socket_timeout_seconds": ("STREAMS_SOCKET_TIMEOUT_SECONDS", _num),
    "shutdown_timeout_seconds": ("STREAMS_SHUTDOWN_TIMEOUT_SECONDS", _num),
    "max_request_bytes": ("STREAMS_MAX_REQUEST_BYTES", _int),
    "request_classes": ("STREAMS_REQUEST_CLASSES", _names),
    "meta_classes": ("STREAMS_META_CLASSES", _names),
    "meta_codecs": ("STREAMS_META_CODECS", _json_dict),
    "capabilities": ("STREAMS_CAPABILITIES", _names),
    "browser_max": ("STREAMS_BROWSER_MAX", _int),
    "sites": ("STREAMS_SITES", _json_dict),
    "revisit_after_seconds": ("STREAMS_REVISIT_AFTER_SECONDS", _num),
    "revisit_buckets": ("STREAMS_REVISIT_BUCKETS", _int),
    "policy_refresh_seconds": ("STREAMS_POLICY_REFRESH_SECONDS", _num),
    "empty_crawl_wait_seconds": ("STREAMS_EMPTY_CRAWL_WAIT_SECONDS", _num),
    "allow_untested_scrapy": ("STREAMS_ALLOW_UNTESTED_SCRAPY", _bool),
    "allow_eviction": ("STREAMS_ALLOW_EVICTION", _bool),
    "feed_batch": ("STREAMS_FEED_BATCH", _int),
    "feed_poll_seconds": ("STREAMS_FEED_POLL_SECONDS", _num),
    "shards": ("STREAMS_SHARDS", _int),
    "feed_encoding": ("REDIS_ENCODING", _str),
    "unserializable": ("STREAMS_UNSERIALIZABLE", _word),
    "adaptive": ("STREAMS_ADAPTIVE", _bool),
    "adaptive_decrease": ("STREAMS_ADAPTIVE_DECREASE", _num),
    "adaptive_increase": ("STREAMS_ADAPTIVE_INCREASE", _num),
    "adaptive_min_rate": ("STREAMS_ADAPTIVE_MIN_RATE", _num),
    "adaptive_forget_seconds": ("STREAMS_ADAPTIVE_FORGET_SECONDS", _num),
    "feedback_interval_seconds": ("STREAMS_FEEDBACK_INTERVAL_SECONDS", _num),
    "max_crawl_delay_seconds": ("STREAMS_MAX_CRAWL_DELAY", _num),
    "site_key": ("STREAMS_SITE_KEY", _word),
    "url_shortcut": ("STREAMS_URL_SHORTCUT", _bool),
}


def check_positive(name: str, value: float, zero_ok: bool = False) -> None:
    """A finite number above 0 (or 0 too with ``zero_ok``), else a ConfigError naming ``name``."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(name, value, "must be 0 or more" if zero_ok else "must be greater than 0")


def check_port(name: str, port: int) -> None:
    if not (0 <= port <= 65535):
        raise ConfigError(name, port, "expected a port (0-65535)")


def _whole(name: str, value: int, minimum: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(name, value, "expected a whole number")
    if minimum is not None and value < minimum:
        raise ConfigError(name, value, f"must be at least {minimum}")

