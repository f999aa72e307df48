"""Waiting for Redis at start: back-off, and the errors that waiting cannot fix.

It owns :class:`Waiter`, which sleeps with back-off between tries until a deadline and
turns what Redis answered into one line of RedisUnavailable: at the deadline, and at
once for wrong credentials, a user without the rights it needs and TLS certificates
that do not verify. :func:`streams_sched.connect.clients.connect_ready` and
:func:`~streams_sched.connect.clients.wait_ready` drive it.
"""

from __future__ import annotations

import logging
import ssl
import time

import redis
import redis.sentinel

from streams_sched.connect.urls import is_sentinel_url, redact
from streams_sched.errors import RedisUnavailable

__all__ = ["Waiter", "one_line", "refused_credentials", "tls_verify_failed"]

logger = logging.getLogger(__name__)


class Waiter:
    """Back-off and the one-line errors of waiting for Redis."""

    def __init__(self, url: str, timeout_s: float, what: str, deadline: float, setting: str, quiet: bool) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.what = f"{what} at {redact(url)}"
        self.deadline = deadline
        self.setting = setting if setting == "REDIS_URL" else f"{setting} / REDIS_URL"
        self.delay = 0.1
        self.warned = quiet
        #: the client once built: at the deadline, a cluster's nodes are asked why it is down
        self.client: object = None

    def answered(self) -> None:
        if self.warned:
            logger.info("%s answers now", self.what)

    def failed(self, exc: BaseException) -> None:
        """Sleep before the next try, or raise RedisUnavailable if trying again cannot help."""
        text = one_line(exc)
        self._refuse_hopeless(exc, text)
        if not isinstance(exc, _RETRYABLE):
            raise exc
        left = self.deadline - time.monotonic()
        if left <= 0:
            down = self._cluster_down()
            if down:
                raise RedisUnavailable(f"{self.what}: {down}") from None
            raise RedisUnavailable(
                f"{self.what} did not answer within {self.timeout_s:g}s ({text});{self._hint(text)}"
            ) from None
        if not self.warned:
            logger.warning(
                "%s is not answering (%s); retrying for up to %gs", self.what, text, self.timeout_s
            )
            self.warned = True
        time.sleep(min(self.delay, max(left, 0.01)))
        self.delay = min(self.delay * 2, 2.0)

    def _cluster_down(self) -> str | None:
        """Why the cluster is down, if its nodes answer and say it is (cluster_health.py)."""
        from streams_sched.connect.cluster_health import cluster_down_line

        try:
            return cluster_down_line(self.client, self.url)
        except Exception:  # the question failed too: the usual line stands
            return None

    def _refuse_hopeless(self, exc: BaseException, text: str) -> None:
        """Raise RedisUnavailable at once for what waiting cannot fix: credentials, ACL
        rights, TLS certificates."""
        from redis.exceptions import NoPermissionError, ResponseError

        if refused_credentials(exc):
            raise RedisUnavailable(
                f"{self.what} refused the credentials ({text}); check the user and password in {self.setting}"
            ) from None
        if isinstance(exc, NoPermissionError) or (isinstance(exc, ResponseError) and "NOPERM" in text):
            # (redis-py strips the NOPERM prefix from a NoPermissionError's text)
            raise RedisUnavailable(
                f"{self.what}: the ACL user may not run a command it needs ({text});"
                " give it the rules of its role (see docs/operations/security.md, 'ACL rules')"
            ) from None
        if "CERTIFICATE_REQUIRED" in text or "BAD_CERTIFICATE" in text or "CERTIFICATE_UNKNOWN" in text:
            raise RedisUnavailable(
                f"{self.what}: the server wants a client certificate it trusts ({text}); set"
                f" ssl_certfile and ssl_keyfile in {self.setting}"
            ) from None
        if tls_verify_failed(exc):
            raise RedisUnavailable(
                f"{self.what}: TLS certificate verification failed ({text}); check ssl_ca_certs"
                f" in {self.setting} (the CA that signed the server's certificate) and the host name"
            ) from None

    def _hint(self, text: str) -> str:
        """What to check when Redis never answered."""
        hint = f" check {self.setting} and that the server is running"
        if is_sentinel_url(self.url):
            hint = (
                f" check the sentinels and the service name in {self.setting}, that the sentinels are"
                " running and that they know a master (SENTINEL get-master-addr-by-name SERVICE)"
            )
        if self.url.startswith("rediss:") and "EOF" in text:
            hint += " (a TLS server may also require a client certificate: ssl_certfile, ssl_keyfile)"
        return hint


#: what waiting may fix (the sentinels' "no master" errors are ConnectionErrors; named
#: for the reader)
_RETRYABLE: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
    redis.exceptions.RedisClusterException,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    redis.sentinel.MasterNotFoundError,
    redis.sentinel.SlaveNotFoundError,
)


def refused_credentials(exc: BaseException) -> bool:
    """Wrong user or password, from Redis or (a "no master" error raised from it) a sentinel."""
    for seen in (exc, exc.__cause__):
        text = str(seen)
        if isinstance(seen, redis.exceptions.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
            return True
    return False


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def tls_verify_failed(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        if isinstance(seen, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False
