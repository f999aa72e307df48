"""When a crawl is over: the one home of the drain decision.

A worker closes (STREAMS_CLOSE_ON_DRAIN) only when two things hold:

- **the crawl is drained in Redis**, decided by :class:`DrainDetector` from snapshots
  of every shard (read by the I/O thread, io/drain_check.py);
- **nothing of it is left in this worker**, decided by :func:`work_left` on the reactor
  thread: requests ready, arriving, leased or kept locally, operations the I/O thread
  has not had confirmed, and enqueues whose reply has not come back (a local request's
  follow-ups may undo "drained").

Pure logic: no Redis, no Scrapy, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streams_sched.worker.exchange import Exchange

__all__ = ["DrainDetector", "work_left"]

#: a shard's part of a snapshot: (it holds no backlog, lease or delayed request, its
#: enqueue counter)
ShardSnapshot = tuple[bool, int]


@dataclass
class DrainDetector:
    """Decides that a crawl is drained, from snapshots of every shard.

    A snapshot maps each shard to ``(empty, enqueued)``: whether it holds no backlog,
    no pending lease and no delayed request, and its enqueue counter. Reading many
    shards is not atomic (and cannot be on Redis Cluster), so one empty-looking
    snapshot proves nothing: a worker may enqueue a child in a shard already read and
    ack its parent in a shard read later. Two consecutive snapshots that are both
    entirely empty, over the same shards, with no enqueue in between, prove that every
    shard was empty at every moment between the end of the first and the start of the
    second: the crawl was fully drained then, and work only comes from work (or from
    outside).
    """

    last: dict[str, ShardSnapshot] | None = field(default=None)

    def observe(self, snapshot: Mapping[str, ShardSnapshot]) -> bool:
        """Record a snapshot; return True when the crawl is proven drained."""
        snap = dict(snapshot)
        all_empty = all(empty for empty, _ in snap.values())
        previous = self.last
        self.last = snap if all_empty else None
        return all_empty and previous is not None and previous == snap

    def reset(self) -> None:
        """Work was seen: the next proof starts from scratch."""
        self.last = None


def work_left(x: Exchange, *, held_here: bool, enqueued: int) -> bool:
    """Whether the crawl may still have work, seen from the reactor thread.

    ``held_here``: this worker holds requests (ready, leased, in progress or kept
    locally); ``enqueued``: the enqueues it has queued for the I/O thread so far.
    """
    if held_here or x.arrivals:
        return True
    if x.may_be_busy():
        return True  # operations the I/O thread has not had confirmed
    if x.enqueues_done < enqueued:
        return True  # in the pipeline now: a local request's follow-ups may undo "drained"
    return not x.drained
