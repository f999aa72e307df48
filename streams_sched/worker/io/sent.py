"""What each command of the I/O thread's pipeline was, to apply its reply (cycle.py).

A cycle queues several commands in one pipeline and keeps one of these records per
command, in order; ``IOThread._apply`` zips them with the replies and reads each reply
with the parser of the script call that queued it (``parse``: frontier/scripts/), the
same parser a direct call uses. Pure data, no Redis.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streams_sched.frontier.records import Entry, ShardLease
from streams_sched.frontier.scripts.enqueue import EnqueueReply
from streams_sched.frontier.scripts.feedback import FeedbackReply
from streams_sched.frontier.scripts.heartbeat import RedisTime
from streams_sched.worker.ops import Ack, DeadLetter, Extend, Failed, LeaseOp, Release
from streams_sched.worker.selection import ShardPlan

__all__ = [
    "AFTER_STAT", "HEARTBEAT", "Enqueued", "FeedbackSent", "Heartbeat", "LeaseOpsSent", "Leased",
    "Sent", "Waited", "describe",
]

#: each kind of lease operation in log lines
AFTER_NAME: dict[type, str] = {
    Ack: "ack", DeadLetter: "dead-letter", Release: "release", Failed: "failed delivery", Extend: "lease extension",
}
#: the crawl stat each kind of lease operation counts
AFTER_STAT: dict[type, str] = {
    Ack: "streams/acked",
    DeadLetter: "streams/dead_lettered",
    Release: "streams/released",
    Failed: "streams/delivery_failed",
    Extend: "streams/extended",
}


@dataclass(slots=True, frozen=True)
class Enqueued:
    """One enqueue.lua call for sites of one shard: ``parts`` = (site, its enqueues) in
    call order, ``chunk`` all of them, ``site`` the first (its shard's primary took them)."""

    site: str
    chunk: list[Entry]
    parts: tuple[tuple[str, list[Entry]], ...]
    parse: Callable[[Any], list[EnqueueReply]]


@dataclass(slots=True, frozen=True)
class LeaseOpsSent:
    """One call for a group of lease operations of one kind: of one site, or for acks
    (ack.lua) of the sites of one shard."""

    kind: type
    group: list[LeaseOp]
    #: healthy answers per site that rode along with its acks (given back if it fails)
    answered: tuple[tuple[str, int], ...] = ()
    #: the script's reply parser (None: a plain command, XCLAIM for an extension)
    parse: Callable[[Any], Any] | None = None


@dataclass(slots=True, frozen=True)
class Leased:
    """One lease.lua call, as planned by selection.plan_shards."""

    plan: ShardPlan
    parse: Callable[[Any], ShardLease]


@dataclass(slots=True, frozen=True)
class FeedbackSent:
    """One feedback.lua call: the politeness answers of ``site``."""

    site: str
    parse: Callable[[Any], FeedbackReply]


@dataclass(slots=True, frozen=True)
class Waited:
    """WAIT for replicas (``part`` "wait") or INFO replication ("info") right after the
    cycle's writes, on their connection (a server that is not a cluster)."""

    part: str


@dataclass(slots=True, frozen=True)
class Heartbeat:
    """The node record (heartbeat.lua, whose reply is Redis TIME: ``sent_at`` is the
    monotonic time the pipeline went out, for the worker's clock) or its published
    heartbeat (``sent_at`` None)."""

    sent_at: float | None = None
    parse: Callable[[Any], RedisTime] | None = None


Sent = Enqueued | LeaseOpsSent | Leased | FeedbackSent | Waited | Heartbeat
HEARTBEAT = Heartbeat()


def describe(cmd: Sent) -> str:
    """What a pipeline command was, for a log line."""
    if isinstance(cmd, Enqueued):
        more = len(cmd.parts) - 1
        return f"enqueue to site {cmd.site}" + (f" and {more} more of its shard" if more > 0 else "")
    if isinstance(cmd, LeaseOpsSent):
        return f"{AFTER_NAME[cmd.kind]} of site {cmd.group[0].entry.site}"
    if isinstance(cmd, Leased):
        return f"lease from shard {cmd.plan.shard}"
    if isinstance(cmd, FeedbackSent):
        return f"politeness feedback of site {cmd.site}"
    if isinstance(cmd, Waited):
        return "wait for replicas"
    return "heartbeat"
