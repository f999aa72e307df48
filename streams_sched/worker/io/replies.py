"""Applying the replies of one I/O cycle's pipeline, command by command.

sent.py records what each command of the pipeline was; here each record meets its
reply. A confirmed enqueue counts and wakes its site's shard; an ack counts; a lease
reply goes to :class:`~streams_sched.worker.io.leasing.Leasing`; a WAIT reply to the
replica barrier; the heartbeat's Redis TIME to the worker's clock (frontier/clock.py). A
command that failed goes back to the AckGate to be sent again (an enqueue or lease
operation is never dropped), and a refusal is counted and logged once.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from redis.exceptions import NoScriptError

from streams_sched.connect.clients import TRANSIENT
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import Entry
from streams_sched.frontier.replies import over_cap_of, parse_enqueue
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.barrier import ReplicaStage
from streams_sched.worker.io.leasing import Leasing
from streams_sched.worker.io.sent import (
    AFTER_STAT,
    Enqueued,
    FeedbackSent,
    Heartbeat,
    Leased,
    LeaseOpsSent,
    Sent,
    Waited,
    describe,
)
from streams_sched.worker.io.trouble import Trouble
from streams_sched.worker.ops import Ack, AckGate, Extend, Failed

__all__ = ["FeedbackReply", "Replies"]


class FeedbackReply(NamedTuple):
    """feedback.lua's reply: the site's adaptive rate and until when, its observed rate,
    and whether this report cut the rate."""

    adaptive_rate: Any
    adaptive_until: Any
    observed: Any
    cut: Any


class Replies:
    """Applies a pipeline's replies to the worker's state."""

    def __init__(
        self, frontier: Frontier, x: Exchange, gate: AckGate, trouble: Trouble, leasing: Leasing,
        replicas: ReplicaStage,
    ) -> None:
        self.frontier = frontier
        self.exchange = x
        self.gate = gate
        self.trouble = trouble
        self.leasing = leasing
        self.replicas = replicas

    def apply(self, sent: list[Sent], replies: list[Any]) -> int:
        """Apply the replies of one pipeline; return how many requests arrived. Raises
        the first transient error once every reply is applied."""
        received = time.monotonic()
        arrived = 0
        confirmed = False
        noscript = False
        transient: BaseException | None = None
        for cmd, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                if isinstance(reply, NoScriptError):
                    noscript = True
                elif isinstance(reply, TRANSIENT):
                    transient = reply
                self._failed(cmd, reply)
                continue
            self.trouble.accepted(describe(cmd))
            if isinstance(cmd, Enqueued):
                for (site, chunk), part in zip(cmd.parts, reply, strict=True):
                    self._on_enqueued(site, chunk, part)
                self.replicas.confirmed.append(cmd)
                confirmed = True
            elif isinstance(cmd, Leased):
                arrived += self.leasing.on_leased(cmd.plan, reply)
            elif isinstance(cmd, Heartbeat):
                if cmd.sent_at is not None:
                    self.frontier.clock.observe(reply, cmd.sent_at, received)
            else:
                self._applied(cmd, reply)
        if noscript:
            self.frontier.load_scripts()
        if arrived:
            self.exchange.drained = False
        if arrived or confirmed:
            self.exchange.wake_if_starved()
        if transient is not None:
            raise transient
        return arrived

    def _failed(self, cmd: Sent, reply: Exception) -> None:
        """A command failed: what it carried goes back to be sent again."""
        if not isinstance(reply, (NoScriptError, *TRANSIENT)):
            self.trouble.refuse(describe(cmd), reply, back_off=isinstance(cmd, (Enqueued, LeaseOpsSent)))
            if isinstance(cmd, Leased):
                self.leasing.refused(cmd.plan)
        if isinstance(cmd, Enqueued):
            self.gate.enqueue_failed(cmd.chunk)
        elif isinstance(cmd, LeaseOpsSent):
            self.gate.after_failed(cmd.group)
            for site, ok in cmd.answered:
                self.exchange.feedback.append((site, "ok", ok))

    def _applied(self, cmd: Sent, reply: Any) -> None:
        stats = self.exchange.stats
        if isinstance(cmd, LeaseOpsSent):
            if cmd.kind is Ack:
                n = sum(int(v) for v in reply)
            elif cmd.kind is Failed:
                n = int(reply[0])
                if int(reply[1]):
                    stats.append(("streams/dead_lettered", int(reply[1])))
            else:
                n = len(cmd.group) if isinstance(reply, list) or cmd.kind is Extend else int(reply)
            stats.append((AFTER_STAT[cmd.kind], n))
        elif isinstance(cmd, Waited):
            self.replicas.inline_wait.append(reply)
        elif isinstance(cmd, FeedbackSent) and int(FeedbackReply(*reply).cut):
            stats.append(("streams/backoffs", 1))
            self.leasing.ask_again(cmd.site)

    def _on_enqueued(self, site: str, chunk: list[Entry], reply: Any) -> None:
        x = self.exchange
        x.enqueues_done += len(chunk)
        added, dups, delayed, _flags = parse_enqueue(reply)
        st = x.stats
        if added:
            st.append(("streams/enqueued", added))
            self.leasing.poke(site)
            x.drained = False
        if dups:
            st.append(("dupefilter/filtered", dups))
            st.append(("streams/duplicates_remote", dups))
        if delayed:
            st.append(("streams/delayed", delayed))
        over = over_cap_of(reply)
        if over:
            st.append(("streams/over_cap", over))
