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
import ssl
import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .config import redact, validate_redis_url
from .errors import RedisUnavailable

#: Errors that mean "Redis is not answering right now" (also a cluster mid-failover or
#: resharding): retry with back-off instead of failing.
TRANSIENT: tuple[type[BaseException], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.exceptions.MasterDownError,
    redis.exceptions.RedisClusterException,
    OSError,
)

__all__ = ["TRANSIENT", "connect", "connect_ready", "is_cluster_client", "is_cluster_url", "redact", "wait_ready"]

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
    waiter = _Waiter(url, timeout_s, what, deadline, setting, quiet)
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
    _wait(client, waiter)
    return client


def wait_ready(client: Any, url: str, timeout_s: float, what: str = "Redis") -> None:
    """PING until Redis answers, with back-off, for at most ``timeout_s`` seconds.

    Raises RedisUnavailable with one clear line if it never answers, and at
    once when retrying cannot help: wrong credentials, a user without the
    right to PING, a server certificate that does not verify.
    """
    _wait(client, _Waiter(url, timeout_s, what, time.monotonic() + timeout_s, "REDIS_URL", False))


def _wait(client: Any, waiter: _Waiter) -> None:
    while True:
        try:
            client.ping()
            waiter.answered()
            return
        except Exception as exc:
            waiter.failed(exc)


class _Waiter:
    """Back-off and the one-line errors of waiting for Redis."""

    def __init__(self, url: str, timeout_s: float, what: str, deadline: float, setting: str, quiet: bool) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.what = f"{what} at {redact(url)}"
        self.deadline = deadline
        self.setting = setting if setting == "REDIS_URL" else f"{setting} / REDIS_URL"
        self.delay = 0.1
        self.warned = quiet

    def answered(self) -> None:
        if self.warned:
            logger.info("%s answers now", self.what)

    def failed(self, exc: BaseException) -> None:
        """Sleep before the next try, or raise RedisUnavailable if trying again cannot help."""
        from redis.exceptions import (
            AuthenticationError,
            ClusterDownError,
            ConnectionError,
            RedisClusterException,
            ResponseError,
            TryAgainError,
        )
        from redis.exceptions import TimeoutError as RedisTimeoutError

        retryable = (
            ConnectionError, RedisTimeoutError, OSError, RedisClusterException, ClusterDownError, TryAgainError,
        )

        text = _one_line(exc)
        if isinstance(exc, AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
            raise RedisUnavailable(
                f"{self.what} refused the credentials ({text}); check the user and password in {self.setting}"
            ) from None
        if isinstance(exc, ResponseError) and "NOPERM" in text:
            raise RedisUnavailable(
                f"{self.what}: the ACL user may not run a command it needs ({text});"
                " give it the rules of its role (see the README, 'ACL rules')"
            ) from None
        if "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text or "CERTIFICATE_UNKNOWN" in text:
            raise RedisUnavailable(
                f"{self.what}: the server wants a client certificate it trusts ({text}); set"
                f" ssl_certfile and ssl_keyfile in {self.setting}"
            ) from None
        if _tls_verify_failed(exc):
            raise RedisUnavailable(
                f"{self.what}: TLS certificate verification failed ({text}); check ssl_ca_certs"
                f" in {self.setting} (the CA that signed the server's certificate) and the host name"
            ) from None
        if not isinstance(exc, retryable):
            raise exc
        left = self.deadline - time.monotonic()
        if left <= 0:
            hint = f" check {self.setting} and that the server is running"
            if self.url.startswith("rediss:") and "EOF" in text:
                hint += " (a TLS server may also require a client certificate: ssl_certfile, ssl_keyfile)"
            raise RedisUnavailable(
                f"{self.what} did not answer within {self.timeout_s:g}s ({text});{hint}"
            ) from None
        if not self.warned:
            logger.warning(
                "%s is not answering (%s); retrying for up to %gs", self.what, text, self.timeout_s
            )
            self.warned = True
        time.sleep(min(self.delay, max(left, 0.01)))
        self.delay = min(self.delay * 2, 2.0)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _tls_verify_failed(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
