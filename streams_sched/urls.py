"""The forms REDIS_URL takes, checked and masked before anything connects.

:func:`validate_redis_url` refuses a URL that cannot work with a
:class:`~streams_sched.errors.ConfigError` naming the setting, the URL with
its password masked (:func:`redact`) and what to change. Used by the
scheduler's settings, the daemons' settings and :mod:`streams_sched.connection`.
"""

from __future__ import annotations

import os
import re
from typing import Any
from urllib.parse import parse_qs, urlparse, urlunparse

from .errors import ConfigError

__all__ = ["URL_OPTIONS", "redact", "validate_redis_url"]

#: Query options a REDIS_URL may carry (redis-py's connection options, plus ``cluster``).
URL_OPTIONS: frozenset[str] = frozenset({
    "db", "cluster", "protocol", "client_name", "socket_timeout", "socket_connect_timeout",
    "socket_keepalive", "health_check_interval", "max_connections", "timeout",
    "ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password",
    "ssl_cert_reqs", "ssl_check_hostname", "ssl_min_version",
})
#: URL options that name a file, checked at start.
_URL_FILES = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")


def redact(url: str) -> str:
    """The URL without its password, for logs and error messages."""
    try:
        parts = urlparse(url)
        if not parts.password:
            return url
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # an unparsable port: mask "user:password@" by hand
        return re.sub(r"^([a-z]+://[^:@/]*):[^@/]*@", r"\1:***@", url)
    netloc = f"{parts.username or ''}:***@{host}"
    if port:
        netloc += f":{port}"
    return urlunparse(parts._replace(netloc=netloc))


def validate_redis_url(url: Any, setting: str = "REDIS_URL") -> str:
    """Return ``url`` if it is a usable Redis URL; else raise ConfigError saying what is wrong.

    Checks the scheme, host, port, database number and query options (an
    unknown option would only fail at the first connection, deep inside
    redis-py), and that the TLS files it names exist. The password never
    appears in the message.
    """
    if not isinstance(url, str) or not url:
        raise ConfigError(
            setting,
            url,
            "set REDIS_URL (in the Scrapy settings or the environment) to the frontier's"
            " Redis, e.g. redis://localhost:6379/0",
        )
    shown = redact(url)
    try:
        parts = urlparse(url)
        port = parts.port
    except ValueError as exc:
        raise ConfigError(setting, shown, f"the port is not a number ({exc})") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigError(setting, shown, "expected a redis://, rediss:// or unix:// URL")
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
        raise ConfigError(setting, shown, f"unknown option(s) {unknown}; known: {sorted(URL_OPTIONS)}")
    db = parts.path.lstrip("/") if parts.scheme != "unix" else (query.get("db") or ["0"])[0]
    if db and not db.isdigit():
        raise ConfigError(setting, shown, f"database {db!r} is not a number")
    for option in _URL_FILES:
        for path in query.get(option, []):
            if not os.path.isfile(path):
                raise ConfigError(setting, shown, f"{option}: no such file {path!r}")
    if parts.scheme != "rediss" and any(o in query for o in _URL_FILES):
        raise ConfigError(setting, shown, "TLS options need a rediss:// URL")
    return url
