"""Check at start that the ACL user may run every command of its role.

A missing right would otherwise show only when the command is first used (XAUTOCLAIM,
say, once a lease expires), as errors on the I/O thread of a worker that looks alive.
Redis checks a command against the ACL when it is queued after MULTI, and refuses it
there with NOPERM; DISCARD then drops the queue, so the probe runs nothing. It needs
``+multi +discard``, which every role's rules include (see :mod:`streams_sched.admin.acl`).

On Redis Cluster the probe is skipped (a transaction cannot span the slots of one
crawl's keys); a missing right shows when the command is first used.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import NoPermissionError, ResponseError

from streams_sched.admin.acl import role_commands
from streams_sched.errors import RedisUnavailable
from streams_sched.frontier.keys import GROUP, CrawlKeys, SiteKeys

__all__ = ["PROBES", "check_rights", "missing_rights"]

#: Arguments that make each command valid (so its arity passes) on a key of the crawl
#: (``K``), a stream of it (``S``), its events channel (``C``). Never run: see above.
PROBES: dict[str, tuple[str, ...]] = {
    "ping": ("PING",),
    "evalsha": ("EVALSHA", "0" * 40, "1", "K"),
    "evalsha_ro": ("EVALSHA_RO", "0" * 40, "1", "K"),
    "eval_ro": ("EVAL_RO", "return 1", "1", "K"),
    "script|load": ("SCRIPT", "LOAD", "return 1"),
    "xclaim": ("XCLAIM", "S", GROUP, "probe", "0", "0-1"),
    "xpending": ("XPENDING", "S", GROUP),
    "hsetnx": ("HSETNX", "K", "f", "v"),
    "hmget": ("HMGET", "K", "f"),
    "hset": ("HSET", "K", "f", "v"),
    "sadd": ("SADD", "K", "m"),
    "smembers": ("SMEMBERS", "K"),
    "publish": ("PUBLISH", "C", "probe"),
    "spublish": ("SPUBLISH", "C", "probe"),
    "exists": ("EXISTS", "K"),
    "expire": ("EXPIRE", "K", "1"),
    "pexpire": ("PEXPIRE", "K", "1"),
    "pttl": ("PTTL", "K"),
    "getrange": ("GETRANGE", "K", "0", "1"),
    "hget": ("HGET", "K", "f"),
    "hdel": ("HDEL", "K", "f"),
    "hgetall": ("HGETALL", "K"),
    "hincrby": ("HINCRBY", "K", "f", "1"),
    "setrange": ("SETRANGE", "K", "0", "v"),
    "time": ("TIME",),
    "type": ("TYPE", "K"),
    "xack": ("XACK", "S", GROUP, "0-1"),
    "xadd": ("XADD", "S", "*", "f", "v"),
    "xautoclaim": ("XAUTOCLAIM", "S", GROUP, "probe", "0", "0"),
    "xdel": ("XDEL", "S", "0-1"),
    "xgroup|create": ("XGROUP", "CREATE", "S", GROUP, "$", "MKSTREAM"),
    "xlen": ("XLEN", "S"),
    "xrange": ("XRANGE", "S", "-", "+", "COUNT", "1"),
    "xreadgroup": ("XREADGROUP", "GROUP", GROUP, "probe", "COUNT", "1", "STREAMS", "S", ">"),
    "zadd": ("ZADD", "K", "1", "m"),
    "zcard": ("ZCARD", "K"),
    "zcount": ("ZCOUNT", "K", "-inf", "+inf"),
    "zrange": ("ZRANGE", "K", "0", "1"),
    "zrangebyscore": ("ZRANGEBYSCORE", "K", "0", "1"),
    "zrem": ("ZREM", "K", "m"),
    # the shards' lists of new sites (enqueue.lua, lease.lua)
    "rpush": ("RPUSH", "K", "m"),
    "lpop": ("LPOP", "K", "1"),
    # the scrapy-redis feed and a migrated dupefilter (feed.py)
    "llen": ("LLEN", "K"),
    "scard": ("SCARD", "K"),
    "lrange": ("LRANGE", "K", "0", "1"),
    "srandmember": ("SRANDMEMBER", "K", "1"),
    "zrevrange": ("ZREVRANGE", "K", "0", "1"),
    "lrem": ("LREM", "K", "0", "v"),
    "srem": ("SREM", "K", "m"),
    "set": ("SET", "K", "v"),
    "get": ("GET", "K"),
    "del": ("DEL", "K"),
    "smismember": ("SMISMEMBER", "K", "m"),
    "mset": ("MSET", "K", "v"),
    # a load's ledger (enqueue.lua's 'load' keys, which only streams-sched load sends)
    "bitfield": ("BITFIELD", "K", "GET", "u1", "0"),
    # acks that wait for replicas (replicas.py), the eviction-policy check at start
    # (server_checks.py)
    "info": ("INFO", "replication"),
    "wait": ("WAIT", "0", "0"),
}


def missing_rights(client: Any, crawl: str, role: str = "worker") -> list[str]:
    """The commands of ``role`` the connected user may not run on ``crawl``'s keys."""
    site = SiteKeys(crawl, "rights-probe", 0)
    names = {"K": site.base + ":probe", "S": site.base + ":probe-stream", "C": CrawlKeys(crawl).events}
    commands = [c for c in role_commands(role) if c in PROBES]
    conn = client.connection_pool.get_connection()
    try:
        # First MULTI and DISCARD alone: without MULTI the probes below would really run.
        refused = [c for c, ok in zip(("multi", "discard"), _send(conn, [("MULTI",), ("DISCARD",)]), strict=True) if not ok]
        if refused:
            conn.disconnect()  # (it may be left inside MULTI)
            return refused
        probes = [tuple(names.get(a, a) for a in PROBES[c]) for c in commands]
        allowed = _send(conn, [("MULTI",), *probes, ("DISCARD",)])
        return [c for c, ok in zip(commands, allowed[1:-1], strict=True) if not ok]
    finally:
        client.connection_pool.release(conn)


def _send(conn: Any, commands: list[tuple[str, ...]]) -> list[bool]:
    """Send ``commands`` in one round trip on ``conn``; False for each refused with NOPERM.
    (Raw replies: redis-py's reply parsers do not expect QUEUED.)"""
    conn.send_packed_command(conn.pack_commands(commands))
    allowed = []
    for _ in commands:
        try:
            conn.read_response()
            allowed.append(True)
        except NoPermissionError:
            allowed.append(False)
        except ResponseError:  # another error reply (DISCARD without MULTI): not a right
            allowed.append(True)
    return allowed


def check_rights(client: Any, crawl: str, what: str, role: str = "worker") -> None:
    """Raise RedisUnavailable naming every command of ``role`` the user may not run."""
    if hasattr(client, "get_primaries"):  # a cluster client: see the module docstring
        return
    missing = missing_rights(client, crawl, role)
    if missing:
        raise RedisUnavailable(
            f"{what}: the ACL user may not run {', '.join(missing)} on crawl {crawl!r};"
            " give it the rules of its role (see docs/operations/security.md, 'ACL rules')"
        )
