"""Redis clients for workers, daemons and the CLI, and waiting for Redis at start.

One function builds every client, so TLS (``rediss://``), ACL users
(``redis://user:password@host``), Redis Cluster (``?cluster=1`` or the
``REDIS_CLUSTER=1`` environment variable) and Redis Sentinel
(``redis+sentinel://host:26379,host:26379/service``, see :mod:`streams_sched.connect.urls`)
work the same everywhere. Clients do not retry by themselves: the worker's I/O
thread and the daemons retry with back-off and know which operations are safe
to repeat.

A Sentinel client asks the sentinels for the master's address each time it
opens a connection (redis-py's ``SentinelConnectionPool``), and checks with
``ROLE`` that the server it reached is the master, as Redis' guidelines for
Sentinel clients ask: a sentinel can still name a server that has just been
demoted. A write that reaches a demoted master on a connection opened before
the failover fails with READONLY, which redis-py turns into a ConnectionError
and a new connection. Either way the caller sees a transient error, retries,
and the retry goes to the new master: a long-running client follows a
failover without a restart.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from typing import Any
from urllib.parse import parse_qs, urlencode, urlparse, urlunparse

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams_sched.connect.urls import is_sentinel_url, parse_sentinel_url, redact, validate_redis_url
from streams_sched.errors import ConfigError, RedisUnavailable

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
    "SentinelMaster",
    "connect",
    "connect_ready",
    "is_cluster_client",
    "is_cluster_url",
    "is_sentinel_client",
    "refresh_topology",
    "is_sentinel_url",
    "redact",
    "wait_ready",
]

logger = logging.getLogger(__name__)

_TRUE = {"1", "true", "yes", "on"}


def is_cluster_url(url: str) -> bool:
    """True if ``url`` is for a Redis Cluster (``?cluster=1``, or ``REDIS_CLUSTER=1``).
    Never for a Sentinel URL, which refuses both (see :func:`validate_redis_url`)."""
    if is_sentinel_url(url):
        return False
    query = parse_qs(urlparse(url).query)
    flag = (query.get("cluster") or [os.environ.get("REDIS_CLUSTER", "")])[0]
    return flag.strip().lower() in _TRUE


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
        return _sentinel_master(url, options, setting)
    if is_cluster_url(url):
        from redis.cluster import RedisCluster

        options.pop("health_check_interval")
        return RedisCluster.from_url(_strip_cluster(url), **options)
    return redis.Redis.from_url(url, **options)


class SentinelMaster(redis.Redis):
    """The client :func:`connect` builds for a Sentinel URL: a ``redis.Redis`` on the
    service's master whose :meth:`close` also closes its connections to the sentinels."""

    def close(self) -> None:
        super().close()
        pool = getattr(self, "connection_pool", None)
        if isinstance(pool, redis.sentinel.SentinelConnectionPool):
            pool.sentinel_manager.close()


#: Sentinel query options that apply to the connections to the sentinels too.
_SENTINEL_SOCKET_OPTIONS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")


def _sentinel_master(url: str, options: dict[str, Any], setting: str) -> Any:
    """A client of the master of the URL's service (see the module docstring)."""
    from redis.connection import URL_QUERY_ARGUMENT_PARSERS

    parsers: dict[str, Any] = URL_QUERY_ARGUMENT_PARSERS
    parsed = parse_sentinel_url(url, setting)
    extra: dict[str, Any] = {}
    for name, text in parsed.options:  # parsed as redis-py parses a redis:// URL's query
        parser = parsers.get(name)
        try:
            extra[name] = parser(text) if parser else text
        except (TypeError, ValueError):
            raise ConfigError(setting, redact(url), f"{name}={text!r} is not a valid value") from None
    master = {**options, **extra, "db": parsed.db, "username": parsed.username, "password": parsed.password}
    sentinel_options: dict[str, Any] = {
        "retry": Retry(NoBackoff(), 0),  # Sentinel.discover_master asks the next sentinel itself
        "username": parsed.sentinel_username,
        "password": parsed.sentinel_password,
        **{k: master[k] for k in _SENTINEL_SOCKET_OPTIONS if k in master},
    }
    if parsed.tls:
        tls = {k: v for k, v in extra.items() if k.startswith("ssl_")}
        sentinel_options.update(ssl=True, **tls)
        master["connection_class"] = redis.sentinel.SentinelManagedSSLConnection
    else:
        master["connection_class"] = redis.sentinel.SentinelManagedConnection
    master["redis_connect_func"] = _master_handshake
    make: Any = _Sentinels  # (redis-py's Sentinel is untyped)
    sentinels = make(list(parsed.sentinels), sentinel_kwargs=sentinel_options)
    return sentinels.master_for(parsed.service, redis_class=SentinelMaster, **master)


class _Sentinels(redis.sentinel.Sentinel):
    """redis-py's Sentinel, with a "no master" error that says what each sentinel answered
    (redis-py's names each sentinel by its client's repr and each error by its type alone)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        """Ask every sentinel, and take the master of the newest configuration (the highest
        config epoch; the most sentinels on a tie). redis-py takes the first sentinel that
        reports a master up, and a sentinel that has not yet learned of a failover names the
        old master, which, restarted at its old address, says it is a master until it is
        demoted: writes sent there are wiped by its resync. Else MasterNotFoundError, from
        the last error, saying what each sentinel answered."""
        seen: list[str] = []
        last: BaseException | None = None
        votes: dict[tuple[str, int], list[int]] = {}
        for sentinel in self.sentinels:
            kwargs = sentinel.connection_pool.connection_kwargs
            where = f"sentinel {kwargs.get('host')}:{kwargs.get('port')}"
            try:
                masters: Any = sentinel.sentinel_masters()  # {name: state}
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                hint = ""
                if _refused_credentials(exc):  # the error to raise from: waiting cannot help
                    hint = " (check sentinel_username and sentinel_password in the URL)"
                if hint or last is None or not _refused_credentials(last):
                    last = exc
                seen.append(f"{where}: {_one_line(exc)}{hint}")
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                address = (str(state["ip"]), int(state["port"]))
                votes.setdefault(address, []).append(int(state.get("config-epoch", 0) or 0))
            elif not state:
                seen.append(f"{where} monitors no {service_name!r} (it monitors {sorted(map(str, masters)) or 'nothing'})")
            else:
                seen.append(f"{where} reports the master {state['ip']}:{state['port']} down ({state['flags']})")
        if votes:
            return max(votes, key=lambda a: (max(votes[a]), len(votes[a])))
        raise redis.sentinel.MasterNotFoundError(
            f"no master for {service_name!r} from the sentinels: {'; '.join(seen)}"
        ) from last


def _refused_credentials(exc: BaseException) -> bool:
    """Wrong user or password, from Redis or (a "no master" error raised from it) a sentinel."""
    for seen in (exc, exc.__cause__):
        text = str(seen)
        if isinstance(seen, redis.exceptions.AuthenticationError) or "WRONGPASS" in text or "NOAUTH" in text:
            return True
    return False


def _master_handshake(conn: Any) -> None:
    """Each new connection of a Sentinel client: redis-py's handshake (AUTH, SELECT,
    ...), then ROLE, refusing a server that is not the master any more. The
    ConnectionError makes redis-py drop the connection; the next one asks the
    sentinels again."""
    conn.on_connect()
    conn.send_command("ROLE", check_health=False)
    reply = conn.read_response()
    role = reply[0] if isinstance(reply, (list, tuple)) and reply else reply
    role = role.decode(errors="replace") if isinstance(role, bytes) else str(role)
    if role != "master":
        service = getattr(conn.connection_pool, "service_name", "?")
        raise redis.ConnectionError(
            f"{conn.host}:{conn.port} is a {role}, not the master of {service!r} (a failover in progress?);"
            " the next connection asks the sentinels again"
        )


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
            ClusterDownError,
            ConnectionError,
            NoPermissionError,
            RedisClusterException,
            ResponseError,
            TryAgainError,
        )
        from redis.exceptions import TimeoutError as RedisTimeoutError
        from redis.sentinel import MasterNotFoundError, SlaveNotFoundError

        # (the sentinels' "no master" errors are ConnectionErrors; named for the reader)
        retryable = (
            ConnectionError, RedisTimeoutError, OSError, RedisClusterException, ClusterDownError, TryAgainError,
            MasterNotFoundError, SlaveNotFoundError,
        )

        text = _one_line(exc)
        if _refused_credentials(exc):
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
            if is_sentinel_url(self.url):
                hint = (
                    f" check the sentinels and the service name in {self.setting}, that the sentinels are"
                    " running and that they know a master (SENTINEL get-master-addr-by-name SERVICE)"
                )
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
