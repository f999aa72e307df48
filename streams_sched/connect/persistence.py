"""Whether a Redis primary keeps its data across a restart, and whether it just lost it.

A primary with replicas but no AOF is safe only while nothing restarts it faster than a
failover. If systemd, Kubernetes or a supervisor starts it
again within the failover timeout (``cluster-node-timeout``, Sentinel's
``down-after-milliseconds``), it comes back *as the primary*, with its slots or its
service name, holding only its last RDB snapshot if it takes any, else nothing, and its
replicas resync from it: they drop their copy and take that one. Every queued request, lease and seen filter of its keys is gone. Workers
resend what they had not seen on a replica yet, but what had been confirmed is gone:
pages seen before are crawled again, and requests that were queued only there are lost
unless another page links to them. Redis's own replication guide warns of the same set-up.
Nothing a client does can make up for that, so:

- at start, every primary with replicas and no AOF gets one WARNING naming the option
  and the fix (:func:`start_warning`, :func:`check_persistence`);
- when a worker finds that a primary it wrote to was replaced, or Redis answers again
  after an outage, it asks whether the primary lost its data (:func:`came_back_empty`),
  and if so says at ERROR that the crawl lost data there, instead of a routine warning.

A primary lost its data only if all of these hold, each a fact Redis gives:

- it is a primary (``role:master``) and has finished loading (``loading:0``);
- it keeps no AOF and loaded no key at its start (``aof_enabled:0``,
  ``rdb_last_load_keys_loaded:0``);
- it is a new process: its ``run_id`` is not the one this worker saw at that address
  (for an address never seen, it started after the worker began to watch);
- it did not copy a primary's data before it took writes: a promoted replica carries the
  history it copied in ``master_replid2`` / ``second_repl_offset``; a primary that
  restarted empty has neither;
- on a cluster, the cluster still gives it its slots (another node's ``CLUSTER NODES``):
  a master restarted after its replica was promoted answers as a master for a moment,
  then is demoted and copies the promoted replica; nothing was lost there.

Age alone says nothing: a cluster created a minute ago has primaries as young as one
that just restarted.

What is read: ``INFO server`` (uptime, run id), ``INFO persistence`` (``aof_enabled``,
``loading``, ``rdb_last_load_keys_loaded``) and ``INFO replication`` (role, replicas,
replication ids). Every role's
ACL rules allow INFO and none allows CONFIG (server_checks.py says why), so the RDB
``save`` schedule is not read: an RDB snapshot only narrows the loss to the writes since
the last one. Pure decisions over :class:`NodePersistence`; the reads are
:func:`read_persistence`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = [
    "NodePersistence",
    "came_back_empty",
    "check_persistence",
    "parse_persistence",
    "read_persistence",
    "start_warning",
    "sync_warning",
]

logger = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class NodePersistence:
    """What one server says of its persistence (None: it could not say)."""

    name: str
    role: str
    replicas: int
    aof: bool | None
    uptime_s: int | None
    #: keys loaded from an RDB file or AOF preamble at its last start (Redis 7+)
    keys_loaded: int | None
    #: the server process's run id (a restart gives a new one)
    run_id: str = ""
    #: still loading its data set (INFO persistence ``loading``)
    loading: bool = False
    #: the history it continued when it was promoted (master_replid2; "" if none) and
    #: the offset up to which it shares it (second_repl_offset; -1 if none)
    replid2: str = ""
    second_offset: int = -1
    #: its replicas that are attached but not in sync yet: (address, state)
    unsynced: tuple[tuple[str, str], ...] = ()

    @property
    def promoted(self) -> bool:
        """True if it copied another primary's data as its replica before it took writes."""
        return bool(self.replid2.strip("0")) and self.second_offset > 0


def _int(info: dict[str, Any], field: str) -> int | None:
    value = info.get(field)
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def parse_persistence(name: str, info: dict[str, Any]) -> NodePersistence:
    """``info``: the fields of INFO server, persistence and replication together."""
    aof = _int(info, "aof_enabled")
    return NodePersistence(
        name=name,
        role=str(info.get("role", "")),
        replicas=_int(info, "connected_slaves") or 0,
        aof=None if aof is None else aof == 1,
        uptime_s=_int(info, "uptime_in_seconds"),
        keys_loaded=_int(info, "rdb_last_load_keys_loaded"),
        run_id=str(info.get("run_id", "")),
        loading=_int(info, "loading") == 1,
        replid2=str(info.get("master_replid2", "")),
        second_offset=_int(info, "second_repl_offset") or -1,
        unsynced=tuple(
            (f"{v.get('ip')}:{v.get('port')}", str(v.get("state", "")))
            for k, v in sorted(info.items())
            if k.startswith("slave") and k[5:].isdigit() and isinstance(v, dict) and str(v.get("state", "")) != "online"
        ),
    )


def start_warning(node: NodePersistence) -> str | None:
    """The WARNING for a primary that would lose its data in a quick restart, or None."""
    if node.role != "master" or node.replicas == 0 or node.aof is not False:
        return None
    return (
        f"Redis primary {node.name} has {node.replicas} replica(s) but appendonly is no: if anything"
        " restarts it before its replica takes over (systemd, Kubernetes, a supervisor), it comes back"
        " as the primary with at most its last RDB snapshot and its replicas copy that, so this crawl's"
        " writes since (queued requests, acks, seen filters) are gone: pages are crawled again and"
        " requests queued only there are lost. Set appendonly yes on every primary, or make sure none"
        " restarts automatically faster than the failover timeout (docs/concepts/faults.md,"
        " 'A primary that rejoins empty')"
    )


def sync_warning(node: NodePersistence) -> str | None:
    """The WARNING for a primary whose replica is not in sync yet, or None: until it is,
    a failover of that primary has no replica with its data (a cluster refuses to promote
    it and stays down; Sentinel may promote it and lose the writes since)."""
    if node.role != "master" or not node.unsynced:
        return None
    replicas = ", ".join(f"{address} (state={state})" for address, state in node.unsynced)
    return (
        f"Redis primary {node.name}: replica {replicas} is not in sync yet (its first full sync has not"
        " ended). Until it is, a failover of this primary has no replica with its data: a cluster will"
        " not promote it (cluster-replica-validity-factor) and its slots stay down, and Sentinel may"
        " promote it and drop every write since (STREAMS_MIN_REPLICAS=auto counts only replicas in"
        " sync). Wait for the sync to end before relying on a failover; if it lasts, check the"
        " replica's master_link_status and the primary's repl-diskless-sync-delay"
    )


def came_back_empty(node: NodePersistence, seen_run_id: str | None, watched_s: float) -> bool:
    """True if ``node`` is a primary whose data is gone: a new process (its run id is not
    ``seen_run_id``, what this worker saw at that address; for an address never seen
    (None), it started less than ``watched_s`` ago, while the worker watched) that keeps no
    AOF, loaded no key and copied no primary's data before it took writes. Whether the
    cluster still gives it its slots is the caller's to ask (:class:`ReplicaGuard`)."""
    if node.role != "master" or node.loading or node.aof is not False or node.keys_loaded != 0:
        return False
    if node.promoted:  # a replica that synced and was promoted holds what it copied
        return False
    if seen_run_id is not None:
        return bool(node.run_id) and node.run_id != seen_run_id
    return node.uptime_s is not None and node.uptime_s < watched_s


def read_persistence(client: Any, node: Any = None) -> list[NodePersistence]:
    """Every primary of ``client`` (one for a standalone or Sentinel client), or only the
    cluster node ``node``; a server that does not answer INFO is left out."""
    from streams_sched.connect.clients import is_cluster_client, primary_address
    from streams_sched.connect.server_checks import text

    if is_cluster_client(client):
        nodes = [node] if node is not None else client.get_primaries()
        targets = [(n.name, {"target_nodes": n}) for n in nodes]
    else:
        targets = [(primary_address(client), {})]
    out = []
    for name, options in targets:
        try:
            # one round trip: INFO's default sections hold server, persistence and replication
            info = {text(k): v for k, v in client.info(**options).items()}
        except Exception as exc:  # refused or gone: nothing to say about it
            logger.debug("cannot read the persistence of %s: %s", name, exc)
            continue
        out.append(parse_persistence(name, info))
    return out


def check_persistence(client: Any) -> list[str]:
    """Log one WARNING per primary that would come back empty after a quick restart,
    and one per primary whose replica is not in sync yet; return the warnings."""
    warnings = []
    for node in read_persistence(client):
        for text in (start_warning(node), sync_warning(node)):
            if text:
                logger.warning(text)
                warnings.append(text)
    return warnings
