"""Exceptions raised by streams-sched.

Every exception derives from :class:`StreamsSchedError`, so one ``except``
catches them all::

    StreamsSchedError
    ├── ConfigError            a setting or option has an invalid value (also a ValueError)
    ├── RedisUnavailable       Redis could not be reached within the configured time
    ├── EvictionPolicyError    Redis may evict any key (maxmemory-policy allkeys-*), queued requests too
    ├── DedupeBackendError     the dedupe back-end asked for is not available or disagrees
    ├── SerializationError     a request cannot be encoded for the shared queue
    ├── EntryError             a stream entry cannot be turned back into a request
    ├── ScrapyCompatError      the installed Scrapy lacks an engine hook streams-sched needs
    ├── RequestsRefused        the crawl refused requests that cannot travel (STREAMS_UNSERIALIZABLE="error")
    ├── BadInput               a dump file cannot be read on from a line (cut short, corrupt, another format)
    ├── DumpBusy               another dump of the crawl is running
    ├── JournalLost            a dump lost a shard's journal (it would miss requests): run it again
    ├── CrawlMoved             the crawl was moved to another Redis (streams-sched move)
    ├── MoveRefused            a move cannot start: the crawl is moving or moved, or the target
    │                          holds it (in streams_sched.transfer.move)
    └── PickleRefused          a scrapy-redis queue would be unpickled without --trust-pickle
                               (in streams_sched.scrapy_redis.migrate, which needs Scrapy)

tests/test_exports.py checks that every subclass defined in the package is drawn here.
"""

from __future__ import annotations

__all__ = [
    "BadInput",
    "ConfigError",
    "CrawlMoved",
    "DedupeBackendError",
    "DumpBusy",
    "EntryError",
    "EvictionPolicyError",
    "JournalLost",
    "RedisUnavailable",
    "RequestsRefused",
    "ScrapyCompatError",
    "SerializationError",
    "StreamsSchedError",
]


class StreamsSchedError(Exception):
    """Root of every exception raised by streams-sched."""


class ConfigError(StreamsSchedError, ValueError):
    """Raised when a setting or option has an invalid value.

    The message names the setting and the value it was given.
    """

    def __init__(self, setting: str, value: object, problem: str) -> None:
        self.setting = setting
        self.value = value
        super().__init__(f"{setting}={value!r}: {problem}")


class RedisUnavailable(StreamsSchedError):
    """Raised when Redis cannot be reached within the configured time."""


class EvictionPolicyError(StreamsSchedError):
    """Raised at start when Redis has an ``allkeys-*`` maxmemory-policy.

    Such a Redis evicts any key once it reaches maxmemory, queued requests and
    seen filters included, and nothing tells the workers: pages are lost without
    an error. The message names the server, the policy and the fix (noeviction,
    or the component's allow-eviction option to run anyway). ``policy`` is the
    policy and ``servers`` the servers (host:port) that have it.
    """

    def __init__(self, message: str, policy: str, servers: tuple[str, ...]) -> None:
        self.policy = policy
        self.servers = servers
        super().__init__(message)


class DedupeBackendError(StreamsSchedError):
    """Raised when the requested dedupe back-end cannot be used.

    For example ``STREAMS_DEDUPE = "redisbloom"`` against a server without the
    RedisBloom module, or a worker whose back-end differs from the one the
    crawl was started with.
    """


class SerializationError(StreamsSchedError):
    """Raised when a request cannot be encoded for the shared queue.

    ``field`` names what could not be encoded, e.g. ``meta['page_obj']`` or
    ``callback``.
    """

    def __init__(self, request_repr: str, field: str, problem: str) -> None:
        self.request_repr = request_repr
        self.field = field
        super().__init__(f"cannot enqueue {request_repr}: {field}: {problem}")


class EntryError(StreamsSchedError):
    """Raised when a stream entry cannot be decoded into a request.

    The entry goes to the dead-letter stream with this message as its reason.
    """


class ScrapyCompatError(StreamsSchedError):
    """Raised when the installed Scrapy does not have the engine internals
    streams-sched hooks (the per-request release point of the engine slot)."""


class RequestsRefused(StreamsSchedError):
    """A crawl refused requests which cannot travel through the shared queue
    (``STREAMS_UNSERIALIZABLE = "error"``). Its name starts the CRITICAL line that
    ends such a crawl, which then counts as failed (``scrapy crawl`` exits with
    code 1); it is not raised, since Scrapy 2.13 and 2.14 exit 0 after a crawl that
    raised (see ``_engine.EngineHooks.fail_crawl``)."""


class BadInput(StreamsSchedError):
    """Raised when a dump file cannot be read on from a line: cut short, corrupt, of another
    format. ``line`` is the line it stopped at (0: before the first)."""

    def __init__(self, line: int, reason: str) -> None:
        self.line = line
        self.reason = reason
        super().__init__(f"line {line}: {reason}" if line else reason)


class DumpBusy(StreamsSchedError):
    """Raised when another dump of the crawl is running: one dump of a crawl runs at a time."""


class JournalLost(StreamsSchedError):
    """Raised when a dump lost a shard's journal (it was paused longer than the journal lives,
    or Redis lost the key): the dump would miss the requests added meanwhile."""


class CrawlMoved(StreamsSchedError):
    """Raised when the crawl was moved to another Redis by ``streams-sched move``: this Redis
    holds only the mark it left. ``to`` is the new place (a URL without its password). A
    process that meets it stops with exit code 6 (``EXIT_MOVED``), to be started again with
    the new REDIS_URL."""

    def __init__(self, crawl: str, to: str) -> None:
        self.crawl = crawl
        self.to = to
        super().__init__(
            f"crawl {crawl!r} has moved to {to} (streams-sched move); start this again with REDIS_URL={to}"
            " (with its password, if it has one)"
        )
