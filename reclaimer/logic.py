"""Decisions of the reclaimer over plain data (no Redis)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from streams_sched.service.liveness import ALIVE, NodeState

__all__ = ["crawl_limits", "nodes_to_forget", "prune_candidates"]


def crawl_limits(
    nodes: Mapping[str, Mapping[str, Any]],
    lease_s: float | None,
    max_deliveries: int | None,
    default_lease_s: float,
    default_max_deliveries: int,
    alive: Iterable[str] | None = None,
) -> tuple[float, int]:
    """The lease time and delivery limit to apply to one crawl.

    An explicit setting wins. Otherwise the longest lease and the largest
    limit that the crawl's live workers (``alive``) advertise in their node
    records, so the reclaimer never requeues a lease a live worker still holds
    by its own setting, nor dead-letters what it would still retry. With no
    live worker advertising one, every known record counts (the dead workers'
    own settings), then the defaults. Workers of one crawl should share
    STREAMS_LEASE_SECONDS; with mixed values the longest live one applies.
    """
    alive = set(nodes) if alive is None else set(alive)
    live = [n for name, n in nodes.items() if name in alive]

    def pick(key: str, floor: float) -> float | None:
        for group in (live, list(nodes.values())):
            values = [v for v in (_num(n.get(key)) for n in group) if v >= floor]
            if values:
                return max(values)
        return None

    lease = lease_s if lease_s is not None else (pick("lease_s", 1e-9) or default_lease_s)
    limit = max_deliveries if max_deliveries is not None else int(pick("max_deliveries", 1) or default_max_deliveries)
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
