"""Whether a worker node is alive, dead or offline (pure).

Workers record themselves in the crawl's nodes hash (``last_seen``, ``state``,
``heartbeat_s``) at every heartbeat and publish the same on the crawl's events
channel. A node is

- ``offline`` when the freshest word from it is ``node_offline`` / state offline
  (it stopped cleanly);
- ``alive`` when it was heard from within ``dead_after_heartbeats`` of its own
  heartbeat intervals;
- ``dead`` otherwise (silent: killed, hung or cut off).

Two sources can say when a node was last heard from: the hash (``last_seen``, the
Redis ``TIME`` at which Redis received the record, heartbeat.lua; compared with Redis
``TIME``) and pub/sub messages (the observer's own monotonic clock). Neither reads the
worker's wall clock, so a worker whose clock is off by any amount is alive while its
heartbeats arrive and dead three heartbeats after they stop. The freshest source wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ALIVE",
    "DEAD",
    "DEFAULT_HEARTBEAT_S",
    "OFFLINE",
    "NodeState",
    "classify",
    "node_states",
]

ALIVE = "alive"
DEAD = "dead"
OFFLINE = "offline"
#: Heartbeat interval assumed for records that do not say (STREAMS_HEARTBEAT_SECONDS' default).
DEFAULT_HEARTBEAT_S = 5.0


@dataclass(frozen=True, slots=True)
class NodeState:
    node: str
    state: str
    #: seconds since the node was last heard from (by the freshest source)
    silent_s: float
    heartbeat_s: float
    info: Mapping[str, Any]


def _float(v: Any, default: float) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return default
    return f if f == f else default  # NaN


def classify(
    node: str,
    info: Mapping[str, Any] | None,
    now_s: float,
    heard: tuple[float, str] | tuple[float, str, float | None] | None = None,
    dead_after_heartbeats: float = 3.0,
) -> NodeState:
    """State of one node.

    ``info`` is its record from the nodes hash (or None), ``now_s`` the Redis
    time in epoch seconds (the clock of the record's ``last_seen``), ``heard`` (seconds since the last pub/sub message
    from it, that message's event name, optionally the heartbeat interval it
    gave) if the observer listens to events.
    """
    info = info or {}
    told = heard[2] if heard is not None and len(heard) > 2 else None
    hb = _float(info.get("heartbeat_s", told), DEFAULT_HEARTBEAT_S) or DEFAULT_HEARTBEAT_S
    silent = float("inf")
    offline = False
    if info:
        silent = max(0.0, now_s - _float(info.get("last_seen"), 0.0))
        offline = info.get("state") == OFFLINE
    if heard is not None and heard[0] < silent:
        silent = max(0.0, heard[0])
        offline = heard[1] == "node_offline"
    if offline:
        state = OFFLINE
    elif silent <= dead_after_heartbeats * hb:
        state = ALIVE
    else:
        state = DEAD
    return NodeState(node, state, silent, hb, info)


def node_states(
    records: Mapping[str, Mapping[str, Any]],
    now_s: float,
    heard: Mapping[str, tuple[float, str] | tuple[float, str, float | None]] | None = None,
    dead_after_heartbeats: float = 3.0,
) -> dict[str, NodeState]:
    """States of every node known from the hash or from events."""
    heard = heard or {}
    return {
        node: classify(node, records.get(node), now_s, heard.get(node), dead_after_heartbeats)
        for node in sorted(set(records) | set(heard))
    }
