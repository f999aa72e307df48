"""Hand back leases whose reply never reached the worker.

When a pipeline times out or the connection drops, Redis may still have run
its commands: a stalled server (``DEBUG SLEEP``, a paused process, a long
fork) executes the commands waiting in its socket buffer once it resumes, and
a server that dies after running a command but before answering keeps its
effect (with AOF). A lease (XREADGROUP) or a take-over (XAUTOCLAIM) whose
reply was lost leaves entries pending for this worker that it does not know
it holds. Nothing would crawl them until their lease expires (by default five
minutes), and a drained-looking crawl would wait for them.

After such an error the worker compares what Redis says it holds (XPENDING
for its consumer name) with the leases it knows, and hands back the rest at
once (``release.lua``: back to the end of their stream, delivery count
unchanged, only if this consumer still owns them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from streams_sched.frontier import scripts as lua
from streams_sched.frontier.keys import STREAMS

__all__ = ["LeaseKey", "find_orphans", "release_orphans"]

logger = logging.getLogger(__name__)

#: (site, stream index, entry id): one lease.
LeaseKey = tuple[str, int, bytes]

#: most pending entries read per stream in one XPENDING (a worker holds far fewer)
_MAX_PER_STREAM = 10_000


def find_orphans(frontier: Any, consumer: str, sites: Iterable[str], known: set[LeaseKey]) -> dict[str, list[tuple[int, bytes]]]:
    """Entries pending for ``consumer`` in ``sites`` that are not in ``known``, per site."""
    sites = list(sites)
    if not sites:
        return {}
    pipe = frontier.client.pipeline(transaction=False)
    asked: list[tuple[str, int]] = []
    for site in sites:
        keys = frontier.site(site)
        for index in range(len(STREAMS)):
            pipe.xpending_range(
                keys.streams[index], frontier.group, min="-", max="+", count=_MAX_PER_STREAM, consumername=consumer
            )
            asked.append((site, index))
    orphans: dict[str, list[tuple[int, bytes]]] = {}
    for (site, index), reply in zip(asked, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, Exception):  # no such stream or group yet: nothing pending
            if "NOGROUP" in str(reply) or "no such key" in str(reply):
                continue
            raise reply
        for entry in reply:
            entry_id = entry["message_id"]
            if isinstance(entry_id, str):
                entry_id = entry_id.encode()
            if (site, index, entry_id) not in known:
                orphans.setdefault(site, []).append((index, entry_id))
    return orphans


def release_orphans(
    frontier: Any,
    consumer: str,
    sites: Iterable[str],
    known: set[LeaseKey],
    why: str = "whose replies were lost to a Redis error",
) -> int:
    """Hand back every entry pending for ``consumer`` that is not in ``known``; return how many."""
    orphans = find_orphans(frontier, consumer, sites, known)
    if not orphans:
        return 0
    pipe = frontier.client.pipeline(transaction=False)
    calls = [lua.release.call(frontier, site, consumer, entries) for site, entries in orphans.items()]
    for call in calls:
        call.queue(pipe)
    released = sum(call.parse(reply) for call, reply in zip(calls, pipe.execute(), strict=True))
    logger.warning(
        "handed back %d leases of %d sites %s (so other workers get them now, not when they expire)",
        released, len(orphans), why,
    )
    return released
