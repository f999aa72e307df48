"""Why a Redis Cluster whose nodes answer is down: which slots have no master, which
master failed, and why Redis does not promote its replica.

A cluster goes down (``cluster_state:fail``, every command answered ``CLUSTERDOWN``)
when a slot has no live master. Its nodes still answer, so "unreachable" would send an
operator to check addresses that are right. What is wrong is one of:

- a master failed and has no replica, or its replicas failed too;
- its replica never finished its first full sync (``master_sync_in_progress:1``, or a
  link that never came up): Redis promotes no replica whose data is older than
  ``cluster-node-timeout`` x ``cluster-replica-validity-factor``, and one that never
  synced has no data at all. That is the first seconds of a new cluster or of a new
  replica (``repl-diskless-sync-delay`` is 5 s by default);
- its replica's link has been down longer than that bound;
- no majority of masters is left to vote the promotion.

One diagnosis, :func:`diagnose`, over what any live node says: ``CLUSTER NODES``
(parsed by :func:`parse_cluster_nodes`) and the ``INFO replication`` of each live replica
of a failed master. :func:`read_cluster_down` does that Redis I/O. The worker, the
reclaimer, the monitor and ``streams-sched status`` all say :func:`describe`'s text.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ClusterDown",
    "ClusterNode",
    "ReplicaState",
    "cluster_down_line",
    "describe",
    "diagnose",
    "parse_cluster_nodes",
    "read_cluster_down",
    "read_cluster_down_at",
    "slot_ranges",
]

logger = logging.getLogger(__name__)

SLOTS = 16384


@dataclass(frozen=True, slots=True)
class ClusterNode:
    """One line of ``CLUSTER NODES``."""

    node_id: str
    address: str
    flags: frozenset[str]
    master_id: str
    config_epoch: int
    connected: bool
    #: the slots it serves, as inclusive (first, last) ranges
    slots: tuple[tuple[int, int], ...] = ()

    @property
    def is_master(self) -> bool:
        return "master" in self.flags

    @property
    def failed(self) -> bool:
        """Flagged failing by the cluster (``fail``) or unreachable from the node asked
        (``fail?``), or its link is down."""
        return "fail" in self.flags or "fail?" in self.flags or "noaddr" in self.flags

    @property
    def myself(self) -> bool:
        return "myself" in self.flags


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def parse_cluster_nodes(reply: Any) -> list[ClusterNode]:
    """``CLUSTER NODES`` as text (or bytes) to :class:`ClusterNode` s; slots being
    imported or migrated (``[n->-id]``) are left out."""
    nodes = []
    for line in _text(reply).splitlines():
        parts = line.split()
        if len(parts) < 8:
            continue
        slots = []
        for part in parts[8:]:
            if part.startswith("["):
                continue
            first, _, last = part.partition("-")
            slots.append((int(first), int(last or first)))
        nodes.append(ClusterNode(
            node_id=parts[0],
            address=parts[1].split("@")[0],
            flags=frozenset(parts[2].split(",")),
            master_id="" if parts[3] == "-" else parts[3],
            config_epoch=int(parts[6]) if parts[6].isdigit() else 0,
            connected=parts[7] == "connected",
            slots=tuple(slots),
        ))
    return nodes


def slot_ranges(slots: list[int]) -> list[tuple[int, int]]:
    """Sorted slot numbers as inclusive ranges."""
    out: list[tuple[int, int]] = []
    for s in sorted(slots):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def _ranges_text(ranges: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> str:
    return ",".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges)


@dataclass(frozen=True, slots=True)
class ReplicaState:
    """A replica of a failed master, and why Redis does not promote it."""

    address: str
    why: str


@dataclass(frozen=True, slots=True)
class ClusterDown:
    """What keeps a cluster down."""

    #: slots no live master serves, as inclusive ranges
    uncovered: tuple[tuple[int, int], ...]
    #: failed masters (address) -> the slots they held, and their replicas' states
    failed: dict[str, tuple[tuple[tuple[int, int], ...], tuple[ReplicaState, ...]]] = field(default_factory=dict)
    #: masters left that can vote a promotion, of all that hold slots
    voters: tuple[int, int] = (0, 0)


def _why_not_promoted(replica: ClusterNode, info: dict[str, Any] | None) -> str:
    """Why Redis does not promote ``replica`` (its INFO replication, None if it did not answer)."""
    if replica.failed:
        return "it is down too"
    if info is None:
        return "it did not answer INFO replication"
    in_progress = str(info.get("master_sync_in_progress", "0")) == "1"
    link = str(info.get("master_link_status", ""))
    down_since = info.get("master_link_down_since_seconds")
    offset = info.get("slave_repl_offset", info.get("master_repl_offset"))
    if in_progress or str(offset) in ("0", "-1") or str(down_since) == "-1":
        return (
            "it never finished its first full sync from its master (master_link_status:"
            f"{link or '?'}, master_sync_in_progress:{int(in_progress)}, offset {offset}), so it has no"
            " data to serve, and Redis promotes no replica whose data is older than cluster-node-timeout"
            " x cluster-replica-validity-factor"
        )
    return (
        f"its link to its master has been down {down_since}s (master_link_status:{link or '?'}), longer than"
        " Redis allows for a promotion (cluster-node-timeout x cluster-replica-validity-factor), or no"
        " majority of masters is left to vote"
    )


def diagnose(nodes: list[ClusterNode], replication: dict[str, dict[str, Any] | None]) -> ClusterDown | None:
    """What keeps the cluster down, from one live node's ``CLUSTER NODES`` and the INFO
    replication of the replicas of failed masters (by address; None: no answer). None if
    every slot has a live master."""
    covered = [False] * SLOTS
    failed_masters = []
    for node in nodes:
        if not node.is_master:
            continue
        if node.failed:
            if node.slots:
                failed_masters.append(node)
            continue
        for a, b in node.slots:
            for s in range(a, b + 1):
                covered[s] = True
    uncovered = tuple(slot_ranges([s for s in range(SLOTS) if not covered[s]]))
    if not uncovered:
        return None
    failed = {}
    for master in failed_masters:
        replicas = tuple(
            ReplicaState(r.address, _why_not_promoted(r, replication.get(r.address)))
            for r in nodes if r.master_id == master.node_id and not r.is_master
        )
        failed[master.address] = (master.slots, replicas)
    holders = [n for n in nodes if n.is_master and n.slots]
    return ClusterDown(uncovered, failed, (sum(1 for n in holders if not n.failed), len(holders)))


def describe(down: ClusterDown) -> str:
    """One line: what is down, why, and what to do."""
    parts = [f"the Redis Cluster is down (cluster_state:fail): slots {_ranges_text(down.uncovered)} have no master"]
    for master, (slots, replicas) in down.failed.items():
        text = f"master {master} (slots {_ranges_text(slots)}) failed"
        if not replicas:
            text += " and has no replica"
        for r in replicas:
            text += f"; its replica {r.address} is not promoted: {r.why}"
        parts.append(text)
    alive, total = down.voters
    if total and alive * 2 <= total:
        parts.append(f"only {alive} of {total} masters are up, no majority to vote a promotion")
    parts.append(
        "The nodes answer; nothing a client does can bring the slots back. Start the failed master"
        " again with its data (it takes its slots back), or, if its data is gone, run CLUSTER FAILOVER"
        " TAKEOVER on its replica: the crawl's requests that were only on that master are then lost"
    )
    return ". ".join(parts)


def read_cluster_down(client: Any) -> ClusterDown | None:
    """Ask the live nodes of cluster client ``client``: None if the cluster is up or none
    answers (then it is unreachable, not down)."""
    from streams_sched.connect.clients import is_cluster_client

    if not is_cluster_client(client):
        return None
    seen: set[str] = set()
    for node in list(client.get_nodes()):
        if node.name in seen:
            continue
        seen.add(node.name)
        try:
            return _diagnose_from(_node_client(node))
        except Exception as exc:  # down or refusing: ask the next one
            logger.debug("CLUSTER NODES from %s: %s", node.name, exc)
    return None


def read_cluster_down_at(url: str) -> ClusterDown | None:
    """As :func:`read_cluster_down`, asking the nodes a cluster URL names one by one (for
    when no cluster client could be built: redis-py's asks a random node, maybe the
    failed one, as it starts)."""
    import redis

    from streams_sched.connect.clients import _strip_cluster, is_cluster_url
    from streams_sched.connect.urls import _split_hosts, cluster_nodes

    if not is_cluster_url(url):
        return None
    before, _, after = _split_hosts(url)
    for host, port in cluster_nodes(url)[1]:
        try:
            with redis.Redis.from_url(
                _strip_cluster(f"{before}{host}:{port}{after}"), socket_timeout=2, socket_connect_timeout=1,
            ) as one:
                return _diagnose_from(one)
        except Exception as exc:
            logger.debug("CLUSTER NODES from %s:%s: %s", host, port, exc)
    return None


def _diagnose_from(one: Any) -> ClusterDown | None:
    """:func:`diagnose` from what node client ``one`` says, asking each replica of a failed
    master for its INFO replication."""
    import redis

    nodes = parse_cluster_nodes(one.execute_command("CLUSTER", "NODES"))
    replication: dict[str, dict[str, Any] | None] = {}
    for master in (n for n in nodes if n.is_master and n.failed and n.slots):
        for r in (n for n in nodes if n.master_id == master.node_id and not n.failed):
            host, _, port = r.address.rpartition(":")
            try:
                with redis.Redis(
                    host=host, port=int(port), socket_timeout=2, socket_connect_timeout=1, decode_responses=True,
                    **_auth(one),
                ) as rc:
                    replication[r.address] = rc.info("replication")
            except Exception as exc:
                logger.debug("INFO replication from %s: %s", r.address, exc)
                replication[r.address] = None
    return diagnose(nodes, replication)


def _node_client(node: Any) -> Any:
    client = node.redis_connection
    if client is None:
        raise LookupError(node.name)
    return client


def _auth(client: Any) -> dict[str, Any]:
    """The credentials and TLS options of a node's own client, for a replica it names."""
    kwargs = client.connection_pool.connection_kwargs
    keep = ("username", "password", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
    out = {k: kwargs[k] for k in keep if k in kwargs}
    if client.connection_pool.connection_class.__name__ == "SSLConnection":
        out["ssl"] = True
    return out


def cluster_down_line(client: Any = None, url: str = "") -> str | None:
    """:func:`describe` of what keeps the cluster of client ``client`` (or, with none, of
    ``url``) down, or None (not a cluster, up, or no node answers)."""
    down = read_cluster_down(client) if client is not None else read_cluster_down_at(url)
    return describe(down) if down is not None else None
