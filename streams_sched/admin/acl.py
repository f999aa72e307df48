"""Minimal Redis ACL rules for each role that talks to the frontier.

Redis checks ACLs on every command a Lua script runs too, so a role's rules
list the commands of its scripts (read from the shipped ``lua/``, see
:func:`script_commands`) as well as the ones it sends itself. Every
rule set is scoped to the keys and the event channel of one crawl (or of every
crawl when ``crawl`` is None)::

    worker     a Scrapy worker: enqueue, lease, ack, claim, dead-letter, release,
               node record and events (also enough for ``streams-sched push``)
    reclaimer  the reclaimer daemon: requeue expired leases, dead-letter, promote
               delayed requests, remove consumers that are gone, health key
    monitor    the monitor daemon: read-only (status via EVALSHA_RO), events

``tests/test_security.py`` runs a worker, the reclaimer and the monitor each as a
user with only its role's rules and checks that ACL LOG shows no denial.

``rules(role, crawl)`` gives the rules as ACL SETUSER arguments; ``setuser``
applies them to a user (on every node of a cluster), keeping only the optional
commands the server knows: RedisBloom's ``BF.*`` exist only where the module
is loaded, and ``CLIENT SETINFO`` (sent by redis-py on connect, refused
quietly) only from Redis 7.2.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from streams_sched.frontier.keys import ROOT, CrawlKeys, validate_crawl_name
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import read_lua
from streams_sched.frontier.scripts._source import includes

__all__ = [
    "ROLES",
    "channel_patterns",
    "denials",
    "deluser",
    "key_patterns",
    "optional_commands",
    "role_commands",
    "rules",
    "script_commands",
    "setuser",
]

#: Commands that take a subcommand, which ACL rules name as ``command|subcommand``.
_CONTAINERS = {"xgroup", "xinfo", "client", "script", "cluster", "config", "object", "memory"}

_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z.]+)'(?:\s*,\s*'([A-Za-z-]+)')?")


def _commands_in(text: str) -> set[str]:
    out = set()
    for command, sub in _CALL.findall(text):
        name = command.lower()
        out.add(f"{name}|{sub.lower()}" if name in _CONTAINERS and sub else name)
    return out


_FUNC = re.compile(r"^local function (\w+)\(", re.MULTILINE)
_CALLED = re.compile(r"\b(\w+)\(")


def _helpers(script: str) -> dict[str, str]:
    """The body of every helper function of the files ``lua/<script>.lua`` includes, by name."""
    lib = "\n".join(read_lua(f"lib/{name}.lua") for name in includes(script))
    starts = [(m.start(), m.group(1)) for m in _FUNC.finditer(lib)]
    return {
        name: lib[pos : (starts[i + 1][0] if i + 1 < len(starts) else len(lib))]
        for i, (pos, name) in enumerate(starts)
    }


def script_commands(script: str) -> set[str]:
    """The Redis commands ``lua/<script>.lua`` can run: its own, and those of the helpers
    it calls, directly or through other helpers (a helper it includes but never calls
    grants nothing). Read from the shipped scripts, so the rules follow the scripts when
    they change."""
    helpers = _helpers(script)
    body = read_lua(f"{script}.lua")
    commands = _commands_in(body)
    todo = set(_CALLED.findall(body)) & helpers.keys()
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        seen.add(name)
        commands |= _commands_in(helpers[name])
        todo |= (set(_CALLED.findall(helpers[name])) & helpers.keys()) - seen
    return commands


#: Module commands (RedisBloom): only in the rules where the server knows them.
_MODULE_PREFIXES = ("bf.",)

#: Scripting and connection commands every writing role sends itself.
_BASE = ("ping", "evalsha", "evalsha_ro", "eval_ro", "script|load")

#: Redis Cluster clients read the topology and the command table.
_CLUSTER = ("cluster|slots", "cluster|shards", "cluster|nodes", "command", "readonly")

#: A Sentinel client (redis+sentinel://) checks with ROLE that a new connection reached the
#: master (streams_sched/connect/sentinel.py).
_SENTINEL = ("role",)

#: The scripts each role runs (the monitor runs status.lua read-only: +@read covers it).
_ROLE_SCRIPTS: dict[str, tuple[str, ...]] = {
    "worker": ("enqueue", "lease", "claim", "ack", "dead", "release", "fail", "promote", "status", "feedback",
               "heartbeat"),
    "reclaimer": ("claim", "promote", "prune", "status"),
    "monitor": (),
}

#: The commands each role sends itself.
_ROLE_OWN: dict[str, tuple[str, ...]] = {
    # worker: extend a lease (XCLAIM), crawl meta (HSETNX/HMGET), registries (SADD,
    # SMEMBERS), node record (HSET), events (PUBLISH; SPUBLISH on a cluster), the
    # RedisBloom probe (BF.EXISTS), lost-reply recovery (XPENDING).
    # The scrapy-redis feed (feed.py): its length, a batch read without removing, the
    # removal, the mover lock (SET NX PX / GET / DEL), the _feed dead letters (XADD,
    # HINCRBY); a migrated scrapy-redis dupefilter (SMISMEMBER). The check of these rights
    # at start (MULTI, DISCARD: streams_sched/admin/rights.py). Acks that wait for replicas
    # (replicas.py): INFO replication, the sync key (SET PX), WAIT. Every role: the
    # eviction-policy check at start (INFO memory, streams_sched/connect/server_checks.py; CONFIG
    # is not allowed: CONFIG GET returns the server's passwords).
    "worker": (
        *_BASE, "multi", "discard", "xclaim", "xpending", "hsetnx", "hmget", "hset", "sadd", "smembers",
        "publish", "spublish", "bf.exists",
        "llen", "scard", "zcard", "lrange", "srandmember", "zrevrange", "lrem", "srem", "zrem",
        "set", "get", "del", "xadd", "hincrby", "smismember", "info", "wait",
    ),
    # reclaimer (reclaimer/core.py): crawl and site registries, the nodes hash (lease
    # settings of live workers; records of gone nodes deleted), consumers that are gone
    # (XINFO CONSUMERS, then prune.lua), its health key (SET ... EX, GET for --check,
    # DEL on a clean stop).
    "reclaimer": (
        *_BASE, "smembers", "hgetall", "hdel", "xinfo|consumers", "set", "get", "del", "info",
    ),
    # monitor: read-only. Status through EVALSHA_RO / EVAL_RO (no SCRIPT LOAD needed),
    # node records, events, RedisBloom's count of fingerprints, the servers' memory and
    # evictions (INFO memory stats).
    "monitor": (
        "@read", "-keys", "-scan", "ping", "time", "evalsha_ro", "eval_ro", "subscribe", "ssubscribe",
        "bf.info", "bf.card", "info",
    ),
}


def _role_commands(role: str) -> list[str]:
    from_scripts: set[str] = set()
    for script in _ROLE_SCRIPTS[role]:
        from_scripts |= script_commands(script)
    own = list(_ROLE_OWN[role])
    return own + sorted(from_scripts - set(own))


ROLES: tuple[str, ...] = tuple(_ROLE_SCRIPTS)


@functools.cache
def _tables() -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    """Each role's commands, and its optional ones, read from the shipped scripts on
    first use (a worker's rights check at start, the ACL tools), not at import."""
    every = {role: _role_commands(role) for role in _ROLE_SCRIPTS}
    needed = {role: tuple(c for c in cmds if not c.startswith(_MODULE_PREFIXES)) for role, cmds in every.items()}
    # Module commands, and CLIENT SETINFO (Redis 7.2+; redis-py sends it on connect
    # and ignores a refusal), go in the rules only where the server knows them.
    optional = {
        role: (*(c for c in cmds if c.startswith(_MODULE_PREFIXES)), "client|setinfo") for role, cmds in every.items()
    }
    return needed, optional


def optional_commands(role: str) -> tuple[str, ...]:
    """The commands of ``role`` that go in its rules only where the server knows them."""
    return _tables()[1][role]


def role_commands(role: str) -> tuple[str, ...]:
    """The commands ``role`` needs (module and optional commands left out)."""
    return _tables()[0][role]


def key_patterns(crawl: str | None = None) -> list[str]:
    """Key patterns of one crawl (its crawl-level keys, every site's keys and the
    global crawl registry), or of every crawl."""
    if crawl is None:
        return [f"~{ROOT}:*"]
    validate_crawl_name(crawl, "crawl")
    # ss:{C}:...  (crawl level)   ss:{C/#n}:...  (shards and their sites)   ss:crawls  (registry)
    # C:start_urls: the scrapy-redis feed of a crawl named like its spider (feed.py)
    return [f"~{ROOT}:{{{crawl}}}:*", f"~{ROOT}:{{{crawl}/*", f"~{CrawlKeys.registry()}", f"~{crawl}:start_urls"]


def channel_patterns(crawl: str | None = None) -> list[str]:
    if crawl is None:
        return [f"&{ROOT}:*"]
    return [f"&{CrawlKeys(crawl).events}"]


def rules(
    role: str,
    crawl: str | None = None,
    *,
    cluster: bool = False,
    sentinel: bool = False,
    optional: tuple[str, ...] | None = None,
) -> list[str]:
    """ACL SETUSER rules (after ``on`` and the password) for ``role``; ``cluster`` and
    ``sentinel`` add what a Redis Cluster or a Sentinel client needs.

    ``optional`` lists which of :func:`optional_commands` to include (default:
    all of them, as printed in docs/operations/security.md).
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {list(ROLES)}")
    commands = list(role_commands(role))
    commands += [c for c in optional_commands(role) if optional is None or c in optional]
    if cluster:
        commands += _CLUSTER
    if sentinel:
        commands += _SENTINEL
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
    from streams_sched.connect.clients import is_cluster_client

    return {"target_nodes": "all"} if is_cluster_client(client) else {}


def setuser(client: Any, user: str, password: str, role: str, crawl: str | None = None) -> list[str]:
    """Create or reset ``user`` with exactly the rules of ``role`` (on every node of a
    cluster); returns the rules applied.

    Through a Sentinel client the user is made on the master only: ACL SETUSER is not
    replicated, so give the replicas the same user too (an aclfile on every node), or
    the user is gone after a failover."""
    from streams_sched.connect.clients import is_sentinel_client

    everywhere = _everywhere(client)
    optional = tuple(c for c in optional_commands(role) if _known(client, c))
    applied = rules(role, crawl, cluster=bool(everywhere), sentinel=is_sentinel_client(client), optional=optional)
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
        entry = {text(k): (text(v) if isinstance(v, bytes) else v) for k, v in entry.items()}
        if user is None or entry.get("username") == user:
            out.append(entry)
    return out



def setuser_line(
    role: str, crawl: str | None = None, user: str | None = None, *, cluster: bool = False, sentinel: bool = False
) -> str:
    """The ACL SETUSER command for ``role`` as text (password left for you to fill in)."""
    name = user or (f"{role}-{crawl}" if crawl else role)
    applied = rules(role, crawl, cluster=cluster, sentinel=sentinel)
    return " ".join(["ACL SETUSER", name, "reset", "on", ">CHANGE-ME", *applied])


def main(argv: list[str] | None = None) -> int:
    """``python -m streams_sched.admin.acl ROLE [--crawl NAME] [--cluster] [--sentinel]``: print the rules."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m streams_sched.admin.acl", description=setuser_line.__doc__)
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--crawl", help="scope the rules to one crawl (default: every crawl)")
    parser.add_argument("--user", help="user name (default: the role, with the crawl)")
    parser.add_argument("--cluster", action="store_true", help="add what a Redis Cluster client needs")
    parser.add_argument("--sentinel", action="store_true", help="add what a Sentinel client needs (+role)")
    args = parser.parse_args(argv)
    print(setuser_line(args.role, args.crawl, args.user, cluster=args.cluster, sentinel=args.sentinel))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
