"""What a component checks of its Redis server as it starts, and what an error reply means.

**The eviction policy.** A queued request exists only as a stream entry in Redis, so
what Redis does at ``maxmemory`` decides whether a crawl can lose pages:

- ``noeviction``: writes are refused with OOM. Workers keep what they could not send and
  retry it, so nothing is lost once memory is freed or maxmemory raised. Passes silently.
- ``volatile-*``: Redis evicts keys that carry a TTL. Of streams-sched's keys only
  those in :data:`TTL_KEYS` do; no queued request, lease, delayed request, seen filter
  (outside revisit buckets), counter or node record has one, so no page is lost. Once
  no key with a TTL is left, writes are refused with OOM as under noeviction. Starts,
  with one WARNING naming what can be evicted.
- ``allkeys-*``: Redis evicts any key, queued requests included, and tells no client:
  pages are lost silently (measured: 16,932 of 30,000 pages never crawled, every worker
  exiting 0). Every component refuses to start with :class:`EvictionPolicyError`,
  unless its allow-eviction option is set (then one WARNING).
- anything else (a policy this version does not know, or one that could not be read):
  one WARNING saying to check it.

The policy counts even while ``maxmemory`` is 0 (no limit): maxmemory can be set at run
time with CONFIG SET, and a 32-bit build has an implicit limit of 3 GB.

It is read once at start, on every master of a Redis Cluster, from ``INFO memory``
(field ``maxmemory_policy``), else from ``CONFIG GET maxmemory-policy`` where INFO is
refused or lacks the field. INFO comes first because every role's ACL rules allow it
(:mod:`streams_sched.admin.acl`) and none allows CONFIG, which cannot be allowed safely
(CONFIG GET returns ``requirepass`` and ``masterauth``): trying CONFIG first would leave
a NOPERM in ACL LOG and INFO errorstats at every start of every role user. Managed Redis
services that refuse CONFIG answer INFO.

:func:`eviction_verdict` decides (pure, over the policy string); :func:`read_policies`
reads; :func:`check_eviction` does both, logs the warning or raises. :func:`read_memory`
is the monitor's read of the same servers (memory, limit, policy, evictions),
:func:`hint_for` says what an error reply (OOM, MISCONF, READONLY, NOPERM, WRONGTYPE) asks
of an operator, and :func:`refuses_writes` whether it means the server takes no write at
all for now (OOM, MISCONF, READONLY), which a component waits out rather than fails on.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from redis.exceptions import ResponseError

from streams_sched.errors import EvictionPolicyError

__all__ = [
    "ALLOW_EVICTION_ENV",
    "OK",
    "REFUSE",
    "REFUSES_WRITES",
    "TTL_KEYS",
    "WARN",
    "ServerMemory",
    "ServerPolicy",
    "Verdict",
    "allowed_by_env",
    "check_eviction",
    "describe_client",
    "error_code",
    "eviction_verdict",
    "hint_for",
    "read_memory",
    "read_policies",
    "refuses_writes",
    "server_name",
]


def text(value: Any) -> str:
    """A reply value as ``str`` (connect/ sits below frontier/, whose replies.py has the same rule)."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

logger = logging.getLogger(__name__)

#: the environment variable every component reads for "run on an evicting Redis anyway"
ALLOW_EVICTION_ENV = "STREAMS_ALLOW_EVICTION"

OK = "ok"
WARN = "warn"
REFUSE = "refuse"

#: The keys of ours that carry a TTL (what a volatile-* policy can evict), and what
#: losing one means. From keys.py and the scripts' PEXPIRE / EXPIRE / SET PX / SET EX.
TTL_KEYS: tuple[tuple[str, str], ...] = (
    ("the sites' observed answer windows (ss:{C/S}:window)", "the adaptive politeness measures one second again"),
    ("the revisit buckets of the seen filters (ss:{C/S}:seen:<n>, with STREAMS_REVISIT_AFTER_SECONDS)", "their URLs count as new and are crawled again"),
    ("the scrapy-redis feed lock (ss:{C}:feed-lock)", "two workers may move the feed at once, which is safe"),
    ("the daemons' health keys (ss:health:*)", "`streams-reclaimer --check` fails until the next pass"),
)

_FIX = "set maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction and in redis.conf)"


@dataclass(frozen=True)
class Verdict:
    """What to do about one policy: ``level`` OK, WARN or REFUSE, and the line to log or raise."""

    level: str
    message: str = ""


def eviction_verdict(policy: str | None, where: str, *, allowed: bool, allow_hint: str, error: str = "") -> Verdict:
    """The verdict on ``policy`` (None: it could not be read, ``error`` says why) of the
    server ``where`` (e.g. "Redis at redis://host:6379/0"). ``allowed``: the component's
    allow-eviction option is set; ``allow_hint`` says how to set it (e.g. "set
    STREAMS_ALLOW_EVICTION = True")."""
    if policy is None:
        return Verdict(
            WARN,
            f"could not read the maxmemory-policy of {where} ({error or 'no answer'}): make sure it is"
            " noeviction, since an allkeys-* policy loses queued requests silently; give the ACL user"
            " +info so that it is checked at start",
        )
    policy = policy.strip().lower()
    if policy == "noeviction":
        return Verdict(OK)
    if policy.startswith("allkeys-"):
        if allowed:
            return Verdict(
                WARN,
                f"{where} has maxmemory-policy {policy}: it evicts any key, including queued requests,"
                f" so pages can be lost silently; running anyway, as {ALLOW_EVICTION_ENV} (or its option)"
                f" allows. To lose nothing, {_FIX}",
            )
        return Verdict(
            REFUSE,
            f"{where} has maxmemory-policy {policy}: it evicts any key, including queued requests, so"
            f" pages would be lost silently; {_FIX}, or {allow_hint} to run anyway",
        )
    if policy.startswith("volatile-"):
        keys = "; ".join(f"{what}: {effect}" for what, effect in TTL_KEYS)
        return Verdict(
            WARN,
            f"{where} has maxmemory-policy {policy}: at maxmemory it evicts keys that carry a TTL. Of"
            f" streams-sched's keys these do: {keys}. Queued requests, leases, seen filters and counters"
            " carry none, so no page is lost; once no key with a TTL is left, writes are refused with"
            f" OOM as under noeviction. To keep these keys too, {_FIX}",
        )
    return Verdict(
        WARN,
        f"{where} has maxmemory-policy {policy}, which this version of streams-sched does not know,"
        f" so it cannot tell what it evicts; {_FIX}",
    )


@dataclass(frozen=True)
class ServerPolicy:
    """The policy of one server (``server``: host:port of a cluster master, "" for a
    single Redis), or None with the ``error`` that kept it from being read."""

    server: str
    policy: str | None
    error: str = ""


def _targets(client: Any) -> list[tuple[str, dict[str, Any]]]:
    """(server, command options) for every master: the cluster's, or the one Redis."""
    from streams_sched.connect.clients import is_cluster_client

    if is_cluster_client(client):
        return [(node.name, {"target_nodes": node}) for node in client.get_primaries()]
    return [("", {})]


def _policy_of(client: Any, options: dict[str, Any]) -> tuple[str | None, str]:
    """(policy, "") from INFO memory, else from CONFIG GET; (None, why) if neither answers."""
    tried = []
    try:
        info = client.info("memory", **options)
        policy = info.get("maxmemory_policy")
        if policy:
            return text(policy), ""
        tried.append("INFO memory has no maxmemory_policy")
    except ResponseError as exc:
        tried.append(f"INFO: {exc}")
    try:
        reply = client.config_get("maxmemory-policy", **options)
        found = {text(k): v for k, v in reply.items()}.get("maxmemory-policy")
        if found:
            return text(found), ""
        tried.append("CONFIG GET maxmemory-policy answered nothing")
    except ResponseError as exc:
        tried.append(f"CONFIG GET: {exc}")
    return None, "; ".join(tried)


def read_policies(client: Any) -> list[ServerPolicy]:
    """The maxmemory-policy of the Redis behind ``client``, of every master on a cluster."""
    return [ServerPolicy(server, *_policy_of(client, options)) for server, options in _targets(client)]


def check_eviction(
    client: Any, where: str, *, allowed: bool, allow_hint: str, warn: Callable[[str], object] | None = None
) -> list[ServerPolicy]:
    """Read the policy of every master and act on it: nothing for noeviction, one warning
    per distinct verdict, :class:`EvictionPolicyError` for allkeys-* unless ``allowed``.
    ``where`` names the server in the messages (e.g. "Redis at redis://host:6379/0");
    ``warn`` logs a warning line (default: a WARNING of this module's logger)."""
    read = read_policies(client)
    groups: dict[tuple[str | None, str], list[str]] = {}
    for sp in read:
        groups.setdefault((sp.policy, sp.error), []).append(sp.server)
    refused: list[tuple[Verdict, str, list[str]]] = []
    for (policy, error), servers in groups.items():
        named = [s for s in servers if s]
        place = f"{where} (master{'s' if len(named) > 1 else ''} {', '.join(named)})" if named else where
        verdict = eviction_verdict(policy, place, allowed=allowed, allow_hint=allow_hint, error=error)
        if verdict.level == REFUSE:
            refused.append((verdict, policy or "", named))
        elif verdict.level == WARN:
            if warn is None:
                logger.warning("%s", verdict.message)
            else:
                warn(verdict.message)
    if refused:
        raise EvictionPolicyError(
            "; ".join(v.message for v, _, _ in refused), refused[0][1], tuple(s for _, _, n in refused for s in n)
        )
    return read


@dataclass(frozen=True)
class ServerMemory:
    """One server's memory, as INFO memory and INFO stats give it (for the monitor)."""

    server: str
    used_memory: int
    #: 0 = no limit
    maxmemory: int
    policy: str
    evicted_keys: int
    #: what Redis leaves out of used_memory when it compares it with maxmemory (replication
    #: and AOF buffers: ``mem_not_counted_for_evict``)
    not_counted: int = 0

    @property
    def refuses_writes(self) -> bool:
        """True if the server refuses writes with OOM now: over its maxmemory under a policy
        that evicts nothing (noeviction) or only keys with a TTL (volatile-*: still over it,
        none was left to evict)."""
        over = self.maxmemory > 0 and self.used_memory - self.not_counted > self.maxmemory
        return over and not self.policy.startswith("allkeys-")


def _num(info: dict[str, Any], field: str) -> int:
    try:
        return int(info.get(field) or 0)
    except (TypeError, ValueError):
        return 0


def read_memory(client: Any) -> list[ServerMemory]:
    """Memory, limit, policy and evictions of every master (one ``INFO memory stats``
    each), each named host:port."""
    out = []
    for server, options in _targets(client):
        info = client.info("memory", "stats", **options)
        out.append(ServerMemory(
            server or server_name(client), _num(info, "used_memory"), _num(info, "maxmemory"),
            text(info.get("maxmemory_policy") or ""), _num(info, "evicted_keys"), _num(info, "mem_not_counted_for_evict"),
        ))
    return out


#: what each error code of a refused command asks of an operator; {role} is who was
#: refused, {setting} where its Redis URL is set (REDIS_URL, --redis-url)
_HINTS: tuple[tuple[str, str], ...] = (
    (
        "OOM",
        "OOM means Redis reached its maxmemory (with maxmemory-policy noeviction, or a volatile-*"
        " policy with no key left to evict): raise maxmemory (CONFIG SET maxmemory, and in"
        " redis.conf), add a shard (Redis Cluster), or purge finished crawls (`streams-sched purge`)",
    ),
    (
        "MISCONF",
        "MISCONF means Redis could not save its RDB snapshot and, with stop-writes-on-bgsave-error yes,"
        " refuses every write until a save works: fix what the Redis log names (a full disk, a"
        " directory it may not write) and run BGSAVE, or CONFIG SET stop-writes-on-bgsave-error no"
        " to take writes that the failing snapshots do not keep",
    ),
    (
        "READONLY",
        "READONLY means {setting} names a read-only replica: point it at the primary, or use a"
        " Sentinel URL (redis+sentinel://HOST:26379/SERVICE), which always finds the primary",
    ),
    (
        "NOPERM",
        "a NOPERM needs a right for the {role}'s ACL user (`python -m streams_sched.admin.acl {role}` prints its rules)",
    ),
    ("WRONGTYPE", "a WRONGTYPE means a key of this crawl that something else wrote"),
)

#: the codes of a server that refuses every write, whatever the command and key, until an
#: operator acts (its memory, its disk, which server the URL names): a component that
#: meets one at start waits for it to clear, and logs it once for the whole server
REFUSES_WRITES = ("OOM", "MISCONF", "READONLY")


#: redis-py turns the OOM, NOPERM and READONLY replies into exceptions whose text lacks the
#: code, and a failed script quotes the reply as "-CODE ...": these phrases of Redis's
#: messages name them all the same
_PHRASES = (
    ("used memory > 'maxmemory'", "OOM"),
    ("no permissions to run", "NOPERM"),
    ("write against a read only replica", "READONLY"),
    ("unable to persist to disk", "MISCONF"),
)


def error_code(error_text: str) -> str:
    """The error code of a Redis error reply ("OOM", "MISCONF", "READONLY", "NOPERM",
    "WRONGTYPE"), also inside the message of a failed script, and also from the text of
    redis-py's exception, which drops the code of some; "" when it is none of those."""
    words = error_text.replace(".", " ").replace(":", " ").split()
    for code, _ in _HINTS:
        if code in words:
            return code
    for phrase, code in _PHRASES:
        if phrase in error_text:
            return code
    return ""


def refuses_writes(error: BaseException | str) -> str:
    """The code (one of :data:`REFUSES_WRITES`) if ``error`` says the server refuses every
    write for now; "" for any other error, and for anything that is not an error reply."""
    if isinstance(error, BaseException) and not isinstance(error, ResponseError):
        return ""
    code = error_code(str(error))
    return code if code in REFUSES_WRITES else ""


def hint_for(error_text: str, role: str = "worker", setting: str = "REDIS_URL") -> str:
    """What to do about a refused command, from its error text (pure): for OOM, maxmemory
    and the three fixes; for MISCONF, the failed snapshot and stop-writes-on-bgsave-error;
    for READONLY, that ``setting`` names a replica; for NOPERM, the role's ACL rules; for
    WRONGTYPE, a foreign key; "" for any other error."""
    code = error_code(error_text)
    for known, hint in _HINTS:
        if known == code:
            return hint.format(role=role, setting=setting)
    return ""


def server_name(client: Any) -> str:
    """host:port (or the socket path) of a single Redis's client, as a cluster names its nodes."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return str(kwargs["path"])
    return f"{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"


def describe_client(client: Any) -> str:
    """"Redis at redis://host:port/db" for a client (or "Redis Cluster at host:port")."""
    from streams_sched.connect.clients import is_cluster_client

    if is_cluster_client(client):
        node = client.get_default_node()
        return f"Redis Cluster at {node.name if node is not None else '?'}"
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kwargs:
        return f"Redis at unix://{kwargs['path']}"
    return f"Redis at redis://{server_name(client)}/{kwargs.get('db', 0)}"


def allowed_by_env(environ: Mapping[str, str] | None = None) -> bool:
    """True if the environment (``os.environ`` by default) sets STREAMS_ALLOW_EVICTION to
    1 / true / yes / on."""
    value = (os.environ if environ is None else environ).get(ALLOW_EVICTION_ENV, "")
    return value.strip().lower() in {"1", "true", "yes", "on"}
