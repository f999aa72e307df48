"""Decisions of the reclaimer over plain data (no Redis)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streams_sched.liveness import ALIVE, NodeState

__all__ = ["crawl_limits", "nodes_to_forget", "prune_candidates"]


def crawl_limits(
    nodes: Mapping[str, Mapping[str, Any]],
    lease_s: float | None,
    max_deliveries: int | None,
    default_lease_s: float,
    default_max_deliveries: int,
) -> tuple[float, int]:
    """The lease time and delivery limit to apply to one crawl.

    An explicit setting wins. Otherwise the longest lease and the largest
    limit any of the crawl's known workers advertise (alive or not: a dead
    worker's leases are the ones to requeue, and they last as long as *its*
    setting said), so the reclaimer never takes a lease a worker still holds
    legitimately, nor dead-letters what a worker would still retry.
    """
    leases = [_num(n.get("lease_s")) for n in nodes.values()]
    limits = [_num(n.get("max_deliveries")) for n in nodes.values()]
    lease = lease_s if lease_s is not None else max([v for v in leases if v > 0], default=default_lease_s)
    limit = (
        max_deliveries
        if max_deliveries is not None
        else int(max([v for v in limits if v >= 1], default=default_max_deliveries))
    )
    return lease, limit


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return 0.0


def prune_candidates(
    consumers: Iterable[tuple[int, str, int, int]],
    states: Mapping[str, NodeState],
    gone_after_ms: int,
    keep: Iterable[str] = (),
) -> list[tuple[int, str]]:
    """Consumers worth removing: (stream index, name) of those that own no pending
    entries, have been idle longer than ``gone_after_ms`` and are not a live node.

    ``consumers`` are (stream index, name, pending, idle ms) rows from XINFO
    CONSUMERS. The script that removes them checks again, atomically, that they
    own nothing; this only keeps live consumers from being removed and re-created.
    """
    keep = set(keep)
    out = []
    for stream, name, pending, idle_ms in consumers:
        if pending > 0 or idle_ms < gone_after_ms or name in keep:
            continue
        st = states.get(name)
        if st is not None and st.state == ALIVE:
            continue
        out.append((stream, name))
    return out


def nodes_to_forget(
    states: Mapping[str, NodeState],
    owners: Iterable[str],
    retention_s: float,
) -> list[str]:
    """Node records to delete: dead or offline for longer than ``retention_s``
    and owning no pending entries (``owners`` are the consumers that do)."""
    if retention_s <= 0:
        return []
    owners = set(owners)
    return sorted(
        node
        for node, st in states.items()
        if st.info and st.state != ALIVE and st.silent_s > retention_s and node not in owners
    )
