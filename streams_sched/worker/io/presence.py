"""A worker's presence: its heartbeat in the node registry, and its goodbye.

Every ``STREAMS_HEARTBEAT_SECONDS`` the I/O thread writes the worker's node record (what
it holds, its browser cap and renders) and publishes it as a heartbeat event; the monitor
and the reclaimer tell live, dead and offline workers apart by it (service/liveness.py).
The record's ``last_seen`` is when Redis received it (heartbeat.lua), never the worker's own
clock, and the script's reply, Redis TIME, keeps the worker's clock (frontier/clock.py) fresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from streams_sched.config import StreamsConfig
from streams_sched.frontier import scripts as lua
from streams_sched.frontier.client import Frontier
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.sent import HEARTBEAT, Heartbeat
from streams_sched.worker.leasebook import LeaseBook

__all__ = ["Presence"]

logger = logging.getLogger(__name__)


class Presence:
    """The node record a worker writes and publishes."""

    def __init__(
        self, frontier: Frontier, config: StreamsConfig, x: Exchange, book: LeaseBook, node_id: str,
        node_info: dict[str, Any], browser_cap: int, *, acked: Callable[[], int] = lambda: 0,
    ) -> None:
        self.frontier = frontier
        self.heartbeat_s = config.heartbeat_seconds
        self.exchange = x
        self.book = book
        self.node_id = node_id
        self.node_info = node_info
        self.browser_cap = browser_cap
        #: the acks this worker has sent so far
        self.acked = acked
        self.next_heartbeat = time.monotonic()

    def queue(self, pipe: Any, now: float) -> tuple[Heartbeat, ...]:
        """Queue the heartbeat when it is due; return what its two commands were."""
        if now < self.next_heartbeat:
            return ()
        self.next_heartbeat = now + self.heartbeat_s
        info = self.record("online")
        call = lua.heartbeat.call(self.frontier, self.node_id, info)
        call.queue(pipe)
        self.frontier.publish(self.event("heartbeat", info), pipe)
        # heartbeat.lua's reply is Redis TIME, read between now and the reply
        return (Heartbeat(time.monotonic(), call.parse), HEARTBEAT)

    def record(self, state: str) -> dict[str, Any]:
        """The node record, but for its last_seen: heartbeat.lua sets that when Redis receives it."""
        return {
            **self.node_info,
            "node": self.node_id,
            "crawl": self.frontier.crawl,
            "state": state,
            "held": self.book.total,
            "local": self.exchange.local_count(),
            # browser leases held against this worker's cap, and its renders so far
            "browser": self.book.browser,
            "browser_max": self.browser_cap,
            "renders": self.exchange.renders,
            "render_s": round(self.exchange.render_s, 3),
            "heartbeat_s": self.heartbeat_s,
            "acked": self.acked(),
        }

    def event(self, name: str, info: dict[str, Any]) -> dict[str, Any]:
        """The published event: the record, last_seen as the worker's reading of Redis time.
        Listeners judge liveness by when they hear it (monitor/events.py), not by that."""
        return {"event": name, **info, "last_seen": round(self.frontier.clock.estimate(), 3)}

    def goodbye(self) -> None:
        try:
            info = self.record("offline")
            # not in a pipeline: called on its own, the script is reloaded if the server
            # has forgotten it (a restart, a failover)
            self.frontier.heartbeat(self.node_id, info)
            self.frontier.publish(self.event("node_offline", info))
        except Exception as exc:
            logger.warning("could not publish node_offline: %s", exc)
