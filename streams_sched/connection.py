"""Redis clients for workers, daemons and the CLI, and waiting for Redis at start.

One function builds every client, so TLS (``rediss://``), ACL users
(``redis://user:password@host``) and Redis Cluster (``?cluster=1`` or the
``REDIS_CLUSTER=1`` environment variable) work the same everywhere.
Clients do not retry by themselves: the worker's I/O thread and the daemons
retry with back-off and know which operations are safe to repeat.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .config import validate_redis_url
from .errors import RedisUnavailable

__all__ = ["connect", "is_cluster_client", "is_cluster_url", "redact", "wait_ready"]

logger = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}


def is_cluster_url(url: str) -> bool:
    query = parse_qs(urlparse(url).query)
    flag = (query.get("cluster") or [os.environ.get("REDIS_CLUSTER", "")])[0]
    return flag.strip().lower() in _TRUE


def is_cluster_client(client: Any) -> bool:
    """True if ``client`` (or the client of a pipeline) talks to a Redis Cluster."""
    from redis.cluster import ClusterPipeline, RedisCluster

    return isinstance(client, (RedisCluster, ClusterPipeline))


def _strip_cluster(url: str) -> str:
    parts = urlparse(url)
    query = {k: v for k, v in parse_qs(parts.query).items() if k != "cluster"}
    return urlunparse(parts._replace(query=urlencode(query, doseq=True)))


def redact(url: str) -> str:
    """The URL without its password, for logs."""
    parts = urlparse(url)
    if parts.password:
        netloc = f"{parts.username or ''}:***@{parts.hostname}"
        if parts.port:
            netloc += f":{parts.port}"
        parts = parts._replace(netloc=netloc)
    return urlunparse(parts)


def connect(
    url: str,
    *,
    socket_timeout: float = 10.0,
    connect_timeout: float = 5.0,
    decode_responses: bool = False,
    setting: str = "REDIS_URL",
) -> Any:
    """Build a client for ``url`` (standalone or cluster). Does not talk to Redis yet."""
    validate_redis_url(url, setting)
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": connect_timeout,
        "decode_responses": decode_responses,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 30,
    }
    if is_cluster_url(url):
        from redis.cluster import RedisCluster

        options.pop("health_check_interval")
        return RedisCluster.from_url(_strip_cluster(url), **options)
    return redis.Redis.from_url(url, **options)


def wait_ready(client: Any, url: str, timeout_s: float, what: str = "Redis") -> None:
    """PING until Redis answers, with back-off, for at most ``timeout_s`` seconds.

    Raises RedisUnavailable with one clear line if it never answers.
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    warned = False
    while True:
        try:
            client.ping()
            if warned:
                logger.info("%s at %s answers now", what, redact(url))
            return
        except redis.AuthenticationError as exc:
            raise RedisUnavailable(f"{what} at {redact(url)} refused the credentials: {exc}") from None
        except redis.ResponseError as exc:
            if "NOPERM" in str(exc):
                raise RedisUnavailable(f"{what} at {redact(url)}: the user may not run PING: {exc}") from None
            raise
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RedisUnavailable(
                    f"{what} at {redact(url)} did not answer within {timeout_s:g}s ({exc});"
                    " check REDIS_URL and that the server is running"
                ) from None
            if not warned:
                logger.warning(
                    "%s at %s is not answering (%s); retrying for up to %gs",
                    what, redact(url), exc, timeout_s,
                )
                warned = True
            time.sleep(min(delay, max(left, 0.01)))
            delay = min(delay * 2, 2.0)
