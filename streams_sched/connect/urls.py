"""The forms REDIS_URL takes, checked and masked before anything connects::

    redis://[user:password@]host[:port][/db][?option=value&...]
    rediss://...                   the same over TLS (ssl_* options)
    redis://[user:password@]host[:port][,host[:port]...]/0?cluster=1
                                   a Redis Cluster reached through any of these nodes
    unix:///path/to/redis.sock[?db=N]
    redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db][?option=value&...]
    rediss+sentinel://...          TLS to the sentinels and to the master (ssl_* options)

:func:`validate_redis_url` refuses a URL that cannot work with a
:class:`~streams_sched.errors.ConfigError` naming the setting, the URL with
its secrets masked (:func:`redact`) and what to change. Used by the
scheduler's settings, the daemons' settings and :mod:`streams_sched.connect.clients`.

In the Sentinel form (that of the redis-sentinel-url package) the hosts are
the sentinels (port 26379 when left out), ``service`` is the name they
monitor the master under, and the user and password are the master's (and
its replicas'); ``sentinel_username`` and ``sentinel_password`` in the query
are the sentinels' own, for sentinels that require a password.
:func:`parse_sentinel_url` turns such a URL into a :class:`SentinelUrl`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from streams_sched.errors import ConfigError

__all__ = [
    "DEFAULT_REDIS_PORT",
    "DEFAULT_SENTINEL_PORT",
    "SENTINEL_SCHEMES",
    "SENTINEL_URL_OPTIONS",
    "URL_OPTIONS",
    "SentinelUrl",
    "cluster_nodes",
    "has_cluster_flag",
    "is_sentinel_url",
    "parse_sentinel_url",
    "redact",
    "validate_redis_url",
]

#: Query options a REDIS_URL may carry (redis-py's connection options, plus ``cluster``).
URL_OPTIONS: frozenset[str] = frozenset({
    "db", "cluster", "protocol", "client_name", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "health_check_interval", "max_connections", "timeout",
    "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password",
    "ssl_cert_reqs", "ssl_check_hostname", "ssl_min_version",
})
#: URL options that name a file, checked at start.
_URL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")

#: Schemes of the Sentinel form; the second one uses TLS.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: Port of a sentinel whose host comes without one (Redis Sentinel's own default).
DEFAULT_SENTINEL_PORT = 26379
#: Port of a cluster node whose host comes without one.
DEFAULT_REDIS_PORT = 6379
#: Query options of the Sentinel form: those of redis:// (but ``cluster``) and the
#: sentinels' credentials. socket_timeout, socket_connect_timeout, socket_keepalive
#: and the ssl_* options apply to the sentinels too.
SENTINEL_URL_OPTIONS: frozenset[str] = (URL_OPTIONS - {"cluster"}) | {"sentinel_username", "sentinel_password"}
#: Query options whose values are secrets, masked by :func:`redact`.
_SECRET_OPTIONS = ("sentinel_password", "ssl_password")

_SENTINEL_EXAMPLE = "redis+sentinel://sentinel-1:26379,sentinel-2:26379/mymaster/0"
_CLUSTER_EXAMPLE = "redis://node-1:6379,node-2:6379,node-3:6379/0?cluster=1"


def is_sentinel_url(url: str) -> bool:
    """True for a ``redis+sentinel://`` or ``rediss+sentinel://`` URL."""
    return url.partition("://")[0].lower() in SENTINEL_SCHEMES


def redact(url: str) -> str:
    """The URL without its secrets, for logs and error messages: the password in
    ``user:password@`` and the values of ``sentinel_password`` and ``ssl_password``
    become ``***``; the rest is left as it was written.

    Works on any text, parsable or not (a bad port, a list of sentinels), since it
    is what error messages about unparsable URLs show.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        return _redact_query(url)
    head, q, query = rest.partition("?")
    at = head.rfind("@")  # the last @ before the path's host: a password may hold "@" or "/"
    if at >= 0:
        userinfo, hosts = head[:at], head[at + 1 :]
        user, colon, _password = userinfo.partition(":")
        if colon:
            head = f"{user}:***@{hosts}"
    return f"{scheme}{sep}{head}{q}{_redact_query(query) if q else ''}"


def _redact_query(text: str) -> str:
    names = "|".join(_SECRET_OPTIONS)
    return re.sub(rf"((?:^|[?&])(?:{names})=)[^&#]*", r"\1***", text)


@dataclass(frozen=True)
class SentinelUrl:
    """A parsed ``redis+sentinel://`` URL (see the module docstring)."""

    #: (host, port) of every sentinel, in the URL's order.
    sentinels: tuple[tuple[str, int], ...]
    #: the name the sentinels monitor the master under (``sentinel monitor <name> ...``).
    service: str
    db: int
    #: rediss+sentinel://: TLS to the sentinels and to the master.
    tls: bool
    #: the master's (and replicas') ACL user and password.
    username: str | None
    password: str | None
    #: the sentinels' own ACL user and password (``?sentinel_username=&sentinel_password=``).
    sentinel_username: str | None
    sentinel_password: str | None
    #: the other query options, first value of each (db, sentinel_* left out).
    options: tuple[tuple[str, str], ...]


def parse_sentinel_url(url: str, setting: str = "REDIS_URL") -> SentinelUrl:
    """Parse a Sentinel URL; raise ConfigError saying what is wrong (secrets masked)."""
    shown = redact(url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    if scheme not in SENTINEL_SCHEMES:
        raise ConfigError(setting, shown, f"expected a {' or '.join(s + '://' for s in SENTINEL_SCHEMES)} URL")
    rest = rest.partition("#")[0]
    head, _, query_text = rest.partition("?")
    at = head.rfind("@")
    userinfo, after = (head[:at], head[at + 1 :]) if at >= 0 else (None, head)
    hosts_text, _, path = after.partition("/")
    sentinels = tuple(_sentinel_address(h, setting, shown) for h in hosts_text.split(","))
    service_text, _, db_text = path.partition("/")
    service = unquote(service_text)
    if not service:
        raise ConfigError(
            setting, shown,
            f"no service name: the path names the master the sentinels monitor, e.g. {_SENTINEL_EXAMPLE}",
        )
    query = parse_qs(query_text, keep_blank_values=True)
    _check_sentinel_query(query, setting, shown)
    if "db" in query:  # as in redis://, ?db= wins over the path
        db_text = query["db"][0]
    if db_text and not db_text.isdigit():
        raise ConfigError(setting, shown, f"database {db_text!r} is not a number (the path is /service[/db])")
    tls = scheme == "rediss+sentinel"
    if not tls and any(o in query for o in _URL_FILES):
        raise ConfigError(setting, shown, "TLS options need a rediss+sentinel:// URL")
    username = password = None
    if userinfo is not None:
        user, colon, secret = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(secret) if colon else None

    def first(name: str) -> str | None:
        values = query.get(name)
        return values[0] if values else None

    return SentinelUrl(
        sentinels=sentinels,
        service=service,
        db=int(db_text or 0),
        tls=tls,
        username=username,
        password=password,
        sentinel_username=first("sentinel_username") or None,
        sentinel_password=first("sentinel_password") or None,
        options=tuple(
            (name, values[0]) for name, values in query.items()
            if name not in ("db", "sentinel_username", "sentinel_password")
        ),
    )


_TRUE = {"1", "true", "yes", "on"}


def has_cluster_flag(query_text: str) -> bool:
    """``?cluster=1`` in the query, or REDIS_CLUSTER=1 in the environment."""
    query = parse_qs(query_text)
    flag = (query.get("cluster") or [os.environ.get("REDIS_CLUSTER", "")])[0]
    return flag.strip().lower() in _TRUE


def _check_sentinel_query(query: dict[str, list[str]], setting: str, shown: str) -> None:
    """Refuse a Sentinel URL's query that asks for a cluster, or names unknown options or
    files that cannot be read."""
    if "cluster" in query:
        raise ConfigError(
            setting, shown,
            "?cluster= in a Sentinel URL: Redis Sentinel and Redis Cluster are two different set-ups;"
            " drop ?cluster for Sentinel, or use redis://node:6379/0?cluster=1 for a cluster",
        )
    if os.environ.get("REDIS_CLUSTER", "").strip().lower() in _TRUE:
        raise ConfigError(
            setting, shown,
            "REDIS_CLUSTER is set in the environment, but a Sentinel URL is not a Redis Cluster; unset REDIS_CLUSTER",
        )
    unknown = sorted(set(query) - SENTINEL_URL_OPTIONS)
    if unknown:
        raise ConfigError(setting, shown, f"unknown option(s) {unknown}; known: {sorted(SENTINEL_URL_OPTIONS)}")
    _check_files(query, setting, shown)
_BRACKETED = re.compile(r"\[([^\]]+)\](?::(.*))?")


def _sentinel_address(text: str, setting: str, shown: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port`` of one sentinel."""
    return _address(text, setting, shown, "sentinel", DEFAULT_SENTINEL_PORT, _SENTINEL_EXAMPLE)


def _address(text: str, setting: str, shown: str, what: str, default_port: int, example: str) -> tuple[str, int]:
    """``host``, ``host:port``, ``[ipv6]`` or ``[ipv6]:port`` of one of several hosts."""
    text = text.strip()
    bracketed = _BRACKETED.fullmatch(text)
    if bracketed:
        host, port_text = bracketed[1], bracketed[2]
    else:
        host, colon, port_text = text.partition(":")
        if not colon:
            port_text = None
        if ":" in (port_text or ""):
            raise ConfigError(
                setting, shown, f"{what} {text!r}: write an IPv6 address in brackets, e.g. [::1]:{default_port}"
            )
    if not host:
        raise ConfigError(
            setting, shown,
            f"a {what} without a host ({text!r}); expected host:port[,host:port...], e.g. {example}",
        )
    if port_text is None or port_text == "":
        return unquote(host), default_port
    if not port_text.isdigit() or not 0 < int(port_text) <= 65535:
        raise ConfigError(setting, shown, f"{what} {text!r}: the port {port_text!r} is not a port number (1-65535)")
    return unquote(host), int(port_text)


def _split_hosts(url: str) -> tuple[str, str, str]:
    """(text before the hosts, the hosts as written, text after them) of a redis:// URL."""
    scheme, _, rest = url.partition("://")
    end = len(rest)
    for mark in "/?#":
        at = rest.find(mark, rest.rfind("@") + 1)
        if at >= 0:
            end = min(end, at)
    head = rest[:end]
    at = head.rfind("@")
    return f"{scheme}://{head[: at + 1]}", head[at + 1 :], rest[end:]


def cluster_nodes(url: str, setting: str = "REDIS_URL") -> tuple[str, list[tuple[str, int]]]:
    """A cluster URL naming one node or several: (the URL with only the first node, so
    redis-py can read its options, and the (host, port) of every node named).

    Any node that answers tells the client the whole cluster, so naming several lets a
    client start while the first is down (a managed service's configuration endpoint
    is one name that does the same)."""
    before, hosts, after = _split_hosts(url)
    shown = redact(url)
    nodes = [
        _address(h, setting, shown, "cluster node", DEFAULT_REDIS_PORT, _CLUSTER_EXAMPLE) for h in hosts.split(",")
    ]
    first = hosts.split(",")[0].strip()
    return f"{before}{first}{after}", nodes


def _check_files(query: dict[str, list[str]], setting: str, shown: str) -> None:
    for option in _URL_FILES:
        for path in query.get(option, []):
            if not os.path.isfile(path):
                raise ConfigError(setting, shown, f"{option}: no such file {path!r}")


def validate_redis_url(url: Any, setting: str = "REDIS_URL") -> str:
    """Return ``url`` if it is a usable Redis URL; else raise ConfigError saying what is wrong.

    Checks the scheme, host, port, database number and query options (an
    unknown option would only fail at the first connection, deep inside
    redis-py), and that the TLS files it names exist; for the Sentinel form,
    every sentinel's host and port and the service name too. The secrets never
    appear in the message.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(
            setting,
            url,
            "set REDIS_URL (in the Scrapy settings or the environment) to the frontier's"
            " Redis, e.g. redis://localhost:6379/0",
        )
    if is_sentinel_url(url):
        parse_sentinel_url(url, setting)
        return url
    shown = redact(url)
    parts = urlparse(url)
    if "," in _split_hosts(url)[1]:
        if not has_cluster_flag(parts.query) or parts.scheme not in ("redis", "rediss"):
            raise ConfigError(
                setting, shown,
                "several hosts: nodes of a Redis Cluster take ?cluster=1 (e.g."
                f" {_CLUSTER_EXAMPLE}), and a list of sentinels a redis+sentinel:// URL (e.g. {_SENTINEL_EXAMPLE})",
            )
        first, _nodes = cluster_nodes(url, setting)
        validate_redis_url(first, setting)
        return url
    try:
        port = parts.port
    except ValueError as exc:
        raise ConfigError(setting, shown, f"the port is not a number ({exc})") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(
            setting, shown, "expected a redis://, rediss://, unix://, redis+sentinel:// or rediss+sentinel:// URL"
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigError(setting, shown, "a unix:// URL needs the socket path, e.g. unix:///run/redis.sock")
    elif not parts.hostname:
        raise ConfigError(setting, shown, "no host; expected e.g. redis://localhost:6379/0")
    if port == 0:
        raise ConfigError(setting, shown, "port 0 is not a Redis port")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - URL_OPTIONS)
    if unknown:
        hint = "; sentinel_* options take a redis+sentinel:// URL" if any(u.startswith("sentinel_") for u in unknown) else ""
        raise ConfigError(setting, shown, f"unknown option(s) {unknown}; known: {sorted(URL_OPTIONS)}{hint}")
    db = parts.path.lstrip("/") if parts.scheme != "unix" else (query.get("db") or ["0"])[0]
    if db and not db.isdigit():
        raise ConfigError(setting, shown, f"database {db!r} is not a number")
    _check_files(query, setting, shown)
    if parts.scheme != "rediss" and any(o in query for o in _URL_FILES):
        raise ConfigError(setting, shown, "TLS options need a rediss:// URL")
    return url
