"""Minimal Redis ACL rules for each role that talks to the frontier.

Redis checks ACLs on every command a Lua script runs too, so a role's rules
list the commands of its scripts as well as the ones it sends itself. Every
rule set is scoped to the keys and the event channel of one crawl (or of every
crawl when ``crawl`` is None)::

    worker     a Scrapy worker: enqueue, lease, ack, claim, dead-letter, release,
               node record and events (also enough for ``streams-sched push``)
    reclaimer  the reclaimer daemon: requeue expired leases, dead-letter, promote
               delayed requests, remove consumers that are gone, health key
    monitor    the monitor daemon: read-only (status via EVALSHA_RO), events

The reclaimer and monitor rules are drafted from the Redis commands their code
needs (issue 3); they are checked against the daemons once those land.

``rules(role, crawl)`` gives the rules as ACL SETUSER arguments; ``setuser``
applies them to a user (on every node of a cluster), keeping only the optional
commands the server knows: RedisBloom's ``BF.*`` exist only where the module
is loaded, and ``CLIENT SETINFO`` (sent by redis-py on connect, refused
quietly) only from Redis 7.2.
"""

from __future__ import annotations

from typing import Any

from .keys import ROOT, CrawlKeys, validate_crawl_name

__all__ = ["OPTIONAL_COMMANDS", "ROLES", "channel_patterns", "denials", "deluser", "key_patterns", "rules", "setuser"]

#: Commands the scripts run (lua/*.lua), by every role that calls them.
_SCRIPT_COMMANDS = (
    "time", "exists", "type",
    "xadd", "xack", "xdel", "xlen", "xrange", "xpending", "xreadgroup", "xautoclaim", "xgroup|create",
    "zadd", "zrem", "zcard", "zrange", "zrangebyscore",
    "hget", "hmget", "hset", "hgetall", "hincrby",
    "getrange", "setrange",
)

#: Scripting and connection commands every role sends itself.
_BASE = ("ping", "evalsha", "evalsha_ro", "eval_ro", "script|load")

#: Redis Cluster clients read the topology and the command table.
_CLUSTER = ("cluster|slots", "cluster|shards", "cluster|nodes", "command", "readonly")

_ROLE_COMMANDS: dict[str, tuple[str, ...]] = {
    # worker: frontier.py (enqueue, lease, claim, ack, dead, release, extend=XCLAIM,
    # status), crawl_bloom (HSETNX/HMGET on meta), registry (SADD/SMEMBERS), node
    # record (HSET) and events (PUBLISH / SPUBLISH on a cluster).
    "worker": (
        *_BASE, *_SCRIPT_COMMANDS,
        "xclaim", "hsetnx", "sadd", "smembers", "publish", "spublish",
    ),
    # reclaimer (draft): claim.lua in requeue mode and promote.lua for every site of
    # every registered crawl, XINFO CONSUMERS + XGROUP DELCONSUMER for consumers that
    # are gone (only those owning no entries), the nodes hash, and a health key with
    # a TTL (SET ... EX).
    "reclaimer": (
        *_BASE, *_SCRIPT_COMMANDS,
        "smembers", "hdel", "xinfo|consumers", "xinfo|groups", "xgroup|delconsumer",
        "set", "subscribe", "ssubscribe",
    ),
    # monitor: read-only. Status through EVALSHA_RO / EVAL_RO (works without SCRIPT
    # LOAD), node records and events.
    "monitor": (
        "@read", "-keys", "-scan", "ping", "time", "evalsha_ro", "eval_ro", "subscribe", "ssubscribe",
    ),
}

#: Commands in the rules only where the server knows them.
OPTIONAL_COMMANDS: dict[str, tuple[str, ...]] = {
    "worker": ("bf.exists", "bf.reserve", "bf.madd", "client|setinfo"),
    "reclaimer": ("client|setinfo",),
    "monitor": ("bf.info", "bf.card", "client|setinfo"),
}

ROLES: tuple[str, ...] = tuple(_ROLE_COMMANDS)


def key_patterns(crawl: str | None = None) -> list[str]:
    """Key patterns of one crawl (its crawl-level keys, every site's keys and the
    global crawl registry), or of every crawl."""
    if crawl is None:
        return [f"~{ROOT}:*"]
    validate_crawl_name(crawl, "crawl")
    # ss:{C}:...  (crawl level)   ss:{C/site}:...  (sites)   ss:crawls  (registry)
    return [f"~{ROOT}:{{{crawl}}}:*", f"~{ROOT}:{{{crawl}/*", f"~{CrawlKeys.registry()}"]


def channel_patterns(crawl: str | None = None) -> list[str]:
    if crawl is None:
        return [f"&{ROOT}:*"]
    return [f"&{CrawlKeys(crawl).events}"]


def rules(
    role: str,
    crawl: str | None = None,
    *,
    cluster: bool = False,
    optional: tuple[str, ...] | None = None,
) -> list[str]:
    """ACL SETUSER rules (after ``on`` and the password) for ``role``.

    ``optional`` lists which of :data:`OPTIONAL_COMMANDS` to include (default:
    all of them, as printed in the README).
    """
    if role not in _ROLE_COMMANDS:
        raise ValueError(f"unknown role {role!r}; expected one of {list(ROLES)}")
    commands = list(_ROLE_COMMANDS[role])
    commands += [c for c in OPTIONAL_COMMANDS[role] if optional is None or c in optional]
    if cluster:
        commands += _CLUSTER
    out = ["resetkeys", "resetchannels", *key_patterns(crawl), *channel_patterns(crawl), "-@all"]
    for c in commands:
        out.append(c if c.startswith("-") else ("+" + c))
    return out


def _known(client: Any, command: str) -> bool:
    """True if the server (every node of a cluster) knows ``command`` (``name|sub``)."""
    name, _, sub = command.partition("|")
    try:
        info = client.execute_command("COMMAND", "INFO", name)
    except Exception:
        return False
    if isinstance(info, dict):  # redis-py parses COMMAND INFO into a dict
        entry = info.get(name)
        if not entry:
            return False
        if not sub:
            return True
        wanted = f"{name}|{sub}".lower()
        for s in entry.get("subcommands") or []:
            sub_name = s[0] if isinstance(s, list) else s
            if isinstance(sub_name, bytes):
                sub_name = sub_name.decode()
            if str(sub_name).lower() == wanted:
                return True
        return False
    return bool(info and info[0])


def _everywhere(client: Any) -> dict[str, Any]:
    """ACL commands go to one node by default on a cluster: send them to all."""
    from .connection import is_cluster_client

    return {"target_nodes": "all"} if is_cluster_client(client) else {}


def setuser(client: Any, user: str, password: str, role: str, crawl: str | None = None) -> list[str]:
    """Create or reset ``user`` with exactly the rules of ``role`` (on every node of a
    cluster); returns the rules applied."""
    everywhere = _everywhere(client)
    optional = tuple(c for c in OPTIONAL_COMMANDS[role] if _known(client, c))
    applied = rules(role, crawl, cluster=bool(everywhere), optional=optional)
    client.execute_command("ACL SETUSER", user, "reset", "on", f">{password}", *applied, **everywhere)
    return applied


def deluser(client: Any, user: str) -> None:
    """Delete ``user`` (on every node of a cluster)."""
    client.execute_command("ACL DELUSER", user, **_everywhere(client))


def denials(client: Any, user: str | None = None) -> list[dict[str, Any]]:
    """Entries of ACL LOG (of every node of a cluster), optionally only ``user``'s:
    what a role was refused, to check or tighten its rules."""
    raw = client.execute_command("ACL LOG", **_everywhere(client))
    if isinstance(raw, dict):  # one reply per node
        raw = [e for entries in raw.values() for e in entries]
    out = []
    for e in raw:
        entry = e if isinstance(e, dict) else dict(zip(e[::2], e[1::2], strict=True))
        entry = {_text(k): (_text(v) if isinstance(v, bytes) else v) for k, v in entry.items()}
        if user is None or entry.get("username") == user:
            out.append(entry)
    return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
