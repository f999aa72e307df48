"""The writes of one I/O cycle, queued on its pipeline in the order Redis must see them.

Enqueues go first, one enqueue.lua call per shard for the sites of that shard (up to
``CALL_LIMIT`` requests a call; frontier/batches.py groups them, as for every producer); then, where a single server carries the whole
pipeline, the replica WAIT that covers them (barrier.py); then the lease operations
the AckGate let through (one ack.lua call per shard, each site's healthy answers riding
along; dead letters, releases, failed deliveries and extensions per site); then
politeness feedback that cannot wait for an ack.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Container, Iterable
from typing import Any

from streams_sched.config import StreamsConfig
from streams_sched.frontier.batches import queue_enqueues
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import shard_of
from streams_sched.frontier.records import Entry
from streams_sched.politeness.adaptive import FeedbackBatch
from streams_sched.worker.io.barrier import ReplicaStage
from streams_sched.worker.io.leasing import Leasing
from streams_sched.worker.io.sent import Enqueued, FeedbackSent, LeaseOpsSent, Sent
from streams_sched.worker.ops import Ack, DeadLetter, Failed, LeaseOp, Release

__all__ = ["Writes"]


class Writes:
    """Queues a cycle's enqueues, lease operations and feedback on its pipeline."""

    def __init__(
        self, frontier: Frontier, config: StreamsConfig, node_id: str, answers: FeedbackBatch,
        leasing: Leasing, replicas: ReplicaStage,
    ) -> None:
        self.frontier = frontier
        self.node_id = node_id
        self.max_deliveries = config.max_deliveries
        self.answers = answers
        self.leasing = leasing
        self.replicas = replicas
        #: feedback.lua's adaptive flag, decrease, increase, floor and forget ms (the config is frozen)
        self.feedback_params = (
            "1" if config.adaptive else "0",
            repr(config.adaptive_decrease),
            repr(config.adaptive_increase),
            repr(config.adaptive_min_rate),
            int(config.adaptive_forget_seconds * 1000),
        )

    def queue(self, pipe: Any, sent: list[Sent], enq: list[Entry], after: list[LeaseOp], now: float) -> None:
        if enq:
            self._queue_enqueues(pipe, sent, enq)
            self.replicas.queue_inline(pipe, sent, now)
        if not after:
            return
        groups: dict[tuple[type, str], list[LeaseOp]] = defaultdict(list)
        acks: dict[int, dict[str, list[LeaseOp]]] = defaultdict(lambda: defaultdict(list))
        shards = self.frontier.shards
        for lease_op in after:
            site = lease_op.entry.site
            if type(lease_op) is Ack:
                acks[shard_of(site, shards)][site].append(lease_op)
            else:
                groups[(type(lease_op), site)].append(lease_op)
        for by_site in acks.values():
            self._queue_acks(pipe, sent, by_site, now)
        for (kind, site), group in groups.items():
            self._queue_site_ops(pipe, kind, site, group)
            sent.append(LeaseOpsSent(kind, group))

    def _queue_site_ops(self, pipe: Any, kind: type, site: str, group: list[LeaseOp]) -> None:
        f = self.frontier
        if kind is DeadLetter:
            dead = [(d.entry.stream, d.entry.id, d.reason) for d in group if isinstance(d, DeadLetter)]
            f.dead_letter(site, self.node_id, dead, pipe)
        elif kind is Release:
            f.release(site, self.node_id, [(r.entry.stream, r.entry.id) for r in group], pipe)
        elif kind is Failed:
            failed = [(d.entry.stream, d.entry.id, d.reason) for d in group if isinstance(d, Failed)]
            f.fail(site, self.node_id, self.max_deliveries, failed, pipe)
        else:
            for extend in group:
                f.extend(site, self.node_id, extend.entry.stream, extend.entry.id, pipe)

    def _queue_enqueues(self, pipe: Any, sent: list[Sent], enq: list[Entry]) -> None:
        """One enqueue.lua call per shard for the sites of that shard (up to CALL_LIMIT
        requests a call): a round of children over many sites costs one call per shard."""
        for parts in queue_enqueues(self.frontier, pipe, enq):
            sent.append(Enqueued(parts[0][0], [e for _, chunk in parts for e in chunk], tuple(parts)))

    def _queue_acks(self, pipe: Any, sent: list[Sent], by_site: dict[str, list[LeaseOp]], now: float) -> None:
        """One ack.lua call for the acks of the sites of one shard, each site's healthy
        answers riding along."""
        calls = []
        answered = []
        group: list[LeaseOp] = []
        held = self.leasing.book.by_site
        for site, ops in by_site.items():
            last = site not in held
            ok = self.answers.take_healthy(site, now, last)
            if ok and last and self.leasing.finished(site):
                # healthy answers of a site with nothing left and no rate feed nothing but
                # its answer window, which expires unread: not worth three commands a page
                ok = 0
            calls.append((site, [(a.entry.stream, a.entry.id) for a in ops], (ok, self.feedback_params) if ok else None))
            if ok:
                answered.append((site, ok))
            group += ops
        self.frontier.ack_shard(calls, pipe)
        sent.append(LeaseOpsSent(Ack, group, tuple(answered)))

    def queue_feedback(self, pipe: Any, sent: list[Sent], now: float, waiting: Iterable[LeaseOp]) -> None:
        """One feedback.lua call per site with answers to report: at once after a 429, 503,
        timeout or robots.txt, otherwise every STREAMS_FEEDBACK_INTERVAL_SECONDS. Healthy
        answers of a site this worker holds leases of wait for its ack instead, and so do
        those of a site whose ack is ``waiting`` for a later cycle (the AckGate's held
        operations): its lease has ended here, but the ack that can carry them is coming."""
        if not self.answers.due(now):
            return
        held: Container[str] = self.leasing.book.by_site
        acking = {op.entry.site for op in waiting if type(op) is Ack}
        if acking:
            acking.update(self.leasing.book.by_site)
            held = acking
        for site, outcome, robots in self.answers.take(now, held):
            self.frontier.feedback(site, outcome, robots, self.feedback_params, pipe)
            sent.append(FeedbackSent(site))
