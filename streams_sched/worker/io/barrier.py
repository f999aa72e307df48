"""The I/O thread's replica barrier: acks wait until the writes before them are on a replica.

replicas.py decides (pure :class:`~streams_sched.connect.replicas.ReplicaBook`) and
runs one barrier (:class:`~streams_sched.connect.replicas.ReplicaGuard`); this is the
part of each cycle that uses them. On one server, ``WAIT`` and ``INFO replication`` ride
the cycle's own pipeline right after its writes. On a cluster, each primary that
confirmed enqueues in the cycle gets a SET + WAIT barrier of its own. A barrier that
passes lets the acks behind those writes go out; one that holds keeps them; a primary
that was replaced gets the enqueues it confirmed sent again (dedupe makes that safe).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import refresh_topology
from streams_sched.connect.replicas import ReplicaBook, ReplicaGuard, Verdict, parse_replication
from streams_sched.frontier.client import Frontier
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.sent import Enqueued, Waited
from streams_sched.worker.ops import AckGate

__all__ = ["ReplicaBarrier"]

logger = logging.getLogger(__name__)


class ReplicaBarrier:
    """Holds the acks of each cycle until its confirmed enqueues are on a replica."""

    def __init__(self, frontier: Frontier, config: StreamsConfig, x: Exchange, gate: AckGate, node_id: str) -> None:
        self.frontier = frontier
        self.exchange = x
        self.gate = gate
        self.wait_ms = config.replica_wait_ms
        self.guard = ReplicaGuard(frontier.client, ReplicaBook(config.min_replicas), config.replica_wait_ms, node_id)
        self.cluster = self.guard.cluster
        #: primary -> the key its next barrier writes, and when it may be tried again
        self.sync_keys: dict[str, str] = {}
        self.next_barrier: dict[str, float] = {}
        #: enqueue calls Redis confirmed in this cycle (each registers its sites too)
        self.confirmed: list[Enqueued] = []
        #: this cycle's WAIT reply and INFO replication, sent right after its writes (not
        #: on a cluster, whose pipeline spans several servers)
        self.inline_wait: list[Any] = []
        self.next_topology = 0.0
        #: the book's lost_bytes already counted in the stats
        self.lost_bytes = 0

    def queue_inline(self, pipe: Any, now: float) -> tuple[Waited, ...]:
        """On one server: WAIT right after the cycle's writes covers them all; return what
        the commands queued were."""
        if self.cluster or not self.guard.checks_writes("", now):
            return ()
        pipe.execute_command("WAIT", self.guard.book.required("") or 0, self.wait_ms)
        pipe.info("replication")
        return (Waited("wait"), Waited("info"))

    def run(self, now: float) -> None:
        """Hold the acks until this cycle's confirmed writes are on a replica of each
        primary that took them; run the barriers that are due."""
        guard, gate = self.guard, self.gate
        if not guard.noted:  # the run ids a restart would change
            guard.note_primaries()
        confirmed, self.confirmed = self.confirmed, []
        inline, self.inline_wait = self.inline_wait, []
        if len(inline) == 2 and not isinstance(inline[1], Exception) and "" not in gate.awaiting:
            confirmed = self._judge_inline(inline, confirmed, now)
        try:
            for cmd in confirmed:
                key = self.frontier.site(cmd.site).sync
                primary = guard.primary_of(key)
                if primary in gate.awaiting or guard.checks_writes(primary, now):
                    gate.await_replicas(primary, cmd.chunk)
                    self.sync_keys.setdefault(primary, key)
        except Exception:
            # cannot tell where they went: send them again (dedupe makes that safe)
            self.send_again(confirmed)
            raise
        for primary in list(gate.awaiting):
            if now >= self.next_barrier.get(primary, 0.0):
                self._barrier(primary, now)
        for primary in guard.book.take_changed():
            # replaced since it confirmed them: they may be gone
            self._resend(primary)
        if guard.book.lost_bytes > self.lost_bytes:
            # a promotion dropped writes a replica had acknowledged (logged by the book)
            self.exchange.stats.append(("streams/rolled_back_bytes", guard.book.lost_bytes - self.lost_bytes))
            self.lost_bytes = guard.book.lost_bytes

    def _judge_inline(self, inline: list[Any], confirmed: list[Enqueued], now: float) -> list[Enqueued]:
        """WAIT and INFO came back on the connection that carried the writes: what is
        left to hold behind a barrier of its own."""
        acked = None if isinstance(inline[0], Exception) else int(inline[0])
        verdict = self.guard.book.judge("", acked, parse_replication(inline[1]), now)
        if verdict is Verdict.PASS:
            return []
        if verdict is Verdict.RESEND:
            self.send_again(confirmed)
            self._resent("", sum(len(c.chunk) for c in confirmed))
            return []
        self.next_barrier[""] = now + self.wait_ms / 1000.0
        return confirmed

    def _barrier(self, primary: str, now: float) -> None:
        verdict = self.guard.barrier(primary, self.sync_keys.get(primary, self.frontier.keys.sync), now)
        if verdict is Verdict.PASS:
            self.gate.replicated(primary)
            self.sync_keys.pop(primary, None)
            self.next_barrier.pop(primary, None)
        elif verdict is Verdict.HOLD:
            self.exchange.stats.append(("streams/replica_waits", 1))
            self.next_barrier[primary] = now + self.wait_ms / 1000.0
        else:
            self._resend(primary)

    def send_again(self, confirmed: list[Enqueued]) -> None:
        """This cycle's confirmed enqueues go out again next cycle."""
        for cmd in confirmed:
            self.gate.enqueue_failed(cmd.chunk)

    def _resend(self, primary: str) -> None:
        """What ``primary`` confirmed may be gone: send it again (enqueue.lua registers
        the sites again with it)."""
        skipped = self.gate.skipped
        chunk = self.gate.resend(primary)
        skipped = self.gate.skipped - skipped
        self.sync_keys.pop(primary, None)
        self.next_barrier.pop(primary, None)
        if skipped:
            # crawled since they were confirmed: sending them again would crawl them twice
            self.exchange.stats.append(("streams/replica_resends_skipped", skipped))
        self._resent(primary, len(chunk), skipped)

    def _resent(self, primary: str, n: int, skipped: int = 0) -> None:
        self.exchange.stats.append(("streams/replica_resends", n))
        if n or skipped:
            logger.warning(
                "Redis primary %s may not keep the %d requests it confirmed (it is gone, restarted"
                " or no longer the primary): sending them again%s", self.guard.shown(primary), n + skipped,
                f", but for {skipped} this worker has crawled since" if skipped else "",
            )
        # what this worker remembers sending may not have arrived either
        self.exchange.seen_epoch += 1
        self.refresh_topology()
        if self.guard.came_back_empty(primary):
            self._report_empty(primary)

    def after_outage(self) -> None:
        """Redis answers again after an outage: a primary may have restarted empty in the
        meantime with nothing of this worker's to send again (a crawl whose work is all
        revisits sends no enqueue), so ask every primary."""
        self.refresh_topology()
        for primary in self.guard.restarted_empty():
            # what this worker remembers sending is gone too: let Redis' dedupe decide again
            self.exchange.seen_epoch += 1
            self._report_empty(primary)

    def _report_empty(self, primary: str) -> None:
        logger.error(
            "Redis primary %s restarted empty (appendonly no, nothing loaded) and took writes without"
            " copying a replica first: the crawl's queued requests, tracked pages waiting for their"
            " next visit, leases and seen filters it held are gone. Pages seen before will be crawled again, and requests queued only there are"
            " lost unless another page links to them. Turn on appendonly, or keep it from restarting"
            " faster than the failover timeout",
            self.guard.shown(primary),
        )
        self.exchange.stats.append(("streams/primary_restarted_empty", 1))

    def refresh_topology(self) -> None:
        """On a cluster, read the slot map again from any node that answers (at most once
        a second): a failed-over master's slots move to its replica, and a command that
        bypasses the cluster client (a node's own pipeline) would otherwise retry the dead
        address for ever."""
        now = time.monotonic()
        if not self.cluster or now < self.next_topology:
            return
        self.next_topology = now + 1.0
        refresh_topology(self.frontier.client)
