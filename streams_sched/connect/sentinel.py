"""Clients of the master of a Redis Sentinel service.

A Sentinel client asks the sentinels for the master's address each time it
opens a connection (redis-py's ``SentinelConnectionPool``), and checks with
``ROLE`` that the server it reached is the master, as Redis' guidelines for
Sentinel clients ask: a sentinel can still name a server that has just been
demoted. A write that reaches a demoted master on a connection opened before
the failover fails with READONLY, which redis-py turns into a ConnectionError
and a new connection. Either way the caller sees a transient error, retries,
and the retry goes to the new master: a long-running client follows a
failover without a restart.

It owns building that client from a parsed ``redis+sentinel://`` URL
(:mod:`.urls`), choosing the master the sentinels agree on, and the ROLE handshake;
:func:`streams_sched.connect.clients.connect` calls it.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.sentinel
from redis.backoff import NoBackoff
from redis.retry import Retry

from streams_sched.connect.urls import parse_sentinel_url, redact
from streams_sched.connect.waiting import one_line, refused_credentials
from streams_sched.errors import ConfigError

__all__ = ["SentinelMaster", "sentinel_master"]


class SentinelMaster(redis.Redis):
    """The client :func:`connect` builds for a Sentinel URL: a ``redis.Redis`` on the
    service's master whose :meth:`close` also closes its connections to the sentinels."""

    def close(self) -> None:
        super().close()
        pool = getattr(self, "connection_pool", None)
        if isinstance(pool, redis.sentinel.SentinelConnectionPool):
            # each sentinel client by itself: redis-py's Sentinel.close() is new in 8.1
            for sentinel in pool.sentinel_manager.sentinels:
                sentinel.close()


#: Sentinel query options that apply to the connections to the sentinels too.
_SENTINEL_SOCKET_OPTIONS = ("socket_timeout", "socket_connect_timeout", "socket_keepalive")


def sentinel_master(url: str, options: dict[str, Any], setting: str) -> Any:
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
                if refused_credentials(exc):  # the error to raise from: waiting cannot help
                    hint = " (check sentinel_username and sentinel_password in the URL)"
                if hint or last is None or not refused_credentials(last):
                    last = exc
                seen.append(f"{where}: {one_line(exc)}{hint}")
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
