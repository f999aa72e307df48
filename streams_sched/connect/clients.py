"""Redis clients for workers, daemons and the CLI, and waiting for Redis at start.

One function builds every client, so TLS (``rediss://``), ACL users
(``redis://user:password@host``), Redis Cluster (``?cluster=1`` or the
``REDIS_CLUSTER=1`` environment variable) and Redis Sentinel
(``redis+sentinel://host:26379,host:26379/service``, see :mod:`streams_sched.connect.urls`)
work the same everywhere. Clients do not retry by themselves: the worker's I/O
thread and the daemons retry with back-off and know which operations are safe
to repeat.

It owns choosing the kind of client and waiting until it answers; Sentinel clients
are built in :mod:`.sentinel`, the back-off and the errors of waiting are in
:mod:`.waiting`.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, TypeAlias
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams_sched.connect.sentinel import sentinel_master
from streams_sched.connect.server_checks import server_name
from streams_sched.connect.urls import (
    cluster_nodes,
    has_cluster_flag,
    is_sentinel_url,
    redact,
    validate_redis_url,
)
from streams_sched.connect.waiting import Waiter

if TYPE_CHECKING:
    from redis.client import Pipeline as PlainPipeline
    from redis.cluster import ClusterPipeline

#: A client :func:`connect` builds: a plain (or Sentinel-managed) Redis, or a Redis Cluster.
RedisClient: TypeAlias = "redis.Redis | redis.RedisCluster"
#: A pipeline of either kind of client (``client.pipeline(transaction=False)``).
Pipeline: TypeAlias = "PlainPipeline | ClusterPipeline"

#: Errors that mean "Redis is not answering right now" (also a cluster mid-failover or
#: resharding, or sentinels that know no master yet): retry with back-off instead of failing.
TRANSIENT: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
    redis.exceptions.RedisClusterException,
    redis.sentinel.MasterNotFoundError,
    redis.sentinel.SlaveNotFoundError,
    OSError,
)

__all__ = [
    "TRANSIENT",
    "Pipeline",
    "RedisClient",
    "connect",
    "connect_ready",
    "describe_nodes",
    "primary_address",
    "is_cluster_client",
    "is_cluster_url",
    "is_sentinel_client",
    "refresh_topology",
    "is_sentinel_url",
    "redact",
    "wait_ready",
]

logger = logging.getLogger(__name__)

def is_cluster_url(url: str) -> bool:
    """True if ``url`` is for a Redis Cluster (``?cluster=1``, or ``REDIS_CLUSTER=1``).
    Never for a Sentinel URL, which refuses both (see :func:`validate_redis_url`)."""
    if is_sentinel_url(url):
        return False
    return has_cluster_flag(urlparse(url).query)


def is_cluster_client(client: Any) -> bool:
    """True if ``client`` (or the client of a pipeline) talks to a Redis Cluster."""
    from redis.cluster import ClusterPipeline, RedisCluster

    return isinstance(client, (RedisCluster, ClusterPipeline))


def is_sentinel_client(client: Any) -> bool:
    """True if ``client`` (or the client of a pipeline) finds its master through sentinels."""
    return isinstance(getattr(client, "connection_pool", None), redis.sentinel.SentinelConnectionPool)


def _strip_cluster(url: str) -> str:
    parts = urlparse(url)
    query = {k: v for k, v in parse_qs(parts.query).items() if k != "cluster"}
    return urlunparse(parts._replace(query=urlencode(query, doseq=True)))


def connect(
    url: str,
    *,
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    decode_responses: bool = False,
    setting: str = "REDIS_URL",
) -> Any:
    """Build a client for ``url`` (standalone, cluster or the master of a Sentinel
    service). Does not talk to Redis yet. Options in the URL's query win over these."""
    validate_redis_url(url, setting)
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "decode_responses": decode_responses,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if is_sentinel_url(url):
        return sentinel_master(url, options, setting)
    if is_cluster_url(url):
        from redis.cluster import ClusterNode, RedisCluster

        options.pop("health_check_interval")
        # redis-py reads the options from a one-host URL; every node named is a startup
        # node, so a client can start while the first is down
        first, nodes = cluster_nodes(url, setting)
        others = [ClusterNode(host, port) for host, port in nodes[1:]]
        if others:
            options["startup_nodes"] = others
        return RedisCluster.from_url(_strip_cluster(first), **options)
    return redis.Redis.from_url(url, **options)


def connect_ready(
    url: str,
    timeout_s: float,
    *,
    what: str = "Redis",
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    decode_responses: bool = False,
    setting: str = "REDIS_URL",
    quiet: bool = False,
) -> Any:
    """Build a client for ``url`` and wait until Redis answers, with back-off, for at
    most ``timeout_s`` seconds; raise RedisUnavailable with one clear line if it never does.

    Use this at start rather than :func:`connect` + :func:`wait_ready`: a Redis
    Cluster client reads the cluster's topology when it is built, so building
    it is what has to be retried while the cluster is not up yet. ``quiet``
    leaves out the one warning logged when Redis does not answer at once
    (daemons and the CLI print their own single line).
    """
    validate_redis_url(url, setting)
    deadline = time.monotonic() + timeout_s
    waiter = Waiter(url, timeout_s, what, deadline, setting, quiet)
    while True:
        try:
            client = connect(
                url,
                socket_timeout=socket_timeout,
                connect_timeout=connect_timeout,
                decode_responses=decode_responses,
                setting=setting,
            )
            break
        except Exception as exc:
            waiter.failed(exc)
    waiter.client = client
    _wait(client, waiter)
    return client


def wait_ready(client: Any, url: str, timeout_s: float, what: str = "Redis") -> None:
    """PING until Redis answers, with back-off, for at most ``timeout_s`` seconds.

    Raises RedisUnavailable with one clear line if it never answers, and at
    once when retrying cannot help: wrong credentials, a user without the
    right to PING, a server certificate that does not verify.
    """
    _wait(client, Waiter(url, timeout_s, what, time.monotonic() + timeout_s, "REDIS_URL", False))


def _wait(client: Any, waiter: Waiter) -> None:
    while True:
        try:
            client.ping()
            waiter.answered()
            return
        except Exception as exc:
            waiter.failed(exc)


def refresh_topology(client: Any) -> bool:
    """On a cluster client, read the slot map again from any node that answers; True if it
    did. A failed-over master's slots move to its replica: redis-py learns that from its
    own commands' errors, but not from a command sent on a node's own client (the
    per-node pipelines of status and barriers), which would retry the dead address for ever."""
    if not is_cluster_client(client):
        return False
    try:
        client.nodes_manager.initialize()
    except Exception as exc:  # no node answers yet: the next error tries again
        logger.debug("cluster topology not refreshed: %s", exc)
        return False
    return True


def describe_nodes(client: Any) -> str:
    """The servers ``client`` tries, for a log line: every node a cluster client knows
    (the URL's and those it learnt), the sentinels and service of a Sentinel client, or
    the one address of a plain client. Reads only what the client already holds."""
    if is_cluster_client(client):
        manager = client.nodes_manager
        names = list(dict.fromkeys([*manager.startup_nodes, *manager.nodes_cache]))
        return "cluster nodes " + ", ".join(names) if names else "no cluster node"
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        sentinels = ", ".join(
            "{host}:{port}".format(**s.connection_pool.connection_kwargs) for s in pool.sentinel_manager.sentinels
        )
        return f"the primary of {pool.service_name!r} through sentinels {sentinels}"
    return server_name(client)


def primary_address(client: Any) -> str:
    """host:port of the server a standalone or Sentinel client writes to now, for log
    lines (a Sentinel client asks a sentinel; "" if none answers)."""
    pool = getattr(client, "connection_pool", None)
    if isinstance(pool, redis.sentinel.SentinelConnectionPool):
        try:
            host, port = pool.get_master_address()
        except Exception:  # no sentinel answers: the line names the service instead
            return f"(primary of {pool.service_name!r})"
        return f"{host}:{port} (primary of {pool.service_name!r})"
    return server_name(client)
