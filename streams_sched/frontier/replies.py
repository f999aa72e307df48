"""Reply values as Python text, and the reply readers the worker's I/O thread still calls.

Each script's reply parser lives with the script (:mod:`streams_sched.frontier.scripts`).
The ``parse_*`` functions and :func:`over_cap_of` here are thin calls into them, kept
for the I/O thread until it reads its replies with the ``parse`` of the calls it queues.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streams_sched.connect.server_checks import text
from streams_sched.frontier.records import ShardLease
from streams_sched.frontier.scripts import enqueue, lease

__all__ = ["over_cap_of", "parse_enqueue", "parse_shard_lease", "text"]


def _first_site(reply: Sequence[Any]) -> Sequence[Any]:
    """The first site's part of a reply of a script that serves several sites."""
    return reply[0] if reply and isinstance(reply[0], list) else reply


def parse_enqueue(reply: Sequence[Any]) -> tuple[int, int, int, bytes]:
    """-> (added, duplicates, delayed, flags) of one site's part of enqueue.lua's reply (or
    of the reply of a one-site call). Kept for the I/O thread until it moves to
    ``scripts.enqueue.parse_site`` (an :class:`~streams_sched.frontier.scripts.enqueue.EnqueueReply`)."""
    r = enqueue.parse_site(_first_site(reply))
    return r.added, r.duplicates, r.delayed, r.flags


def over_cap_of(reply: Sequence[Any]) -> int:
    """Requests of an enqueue reply dropped over the site's page cap (max_pages). Kept for
    the I/O thread until it moves to ``scripts.enqueue.parse_site(part).over_cap``."""
    return enqueue.parse_site(_first_site(reply)).over_cap


def parse_shard_lease(sites: Sequence[str], reply: Sequence[Any]) -> ShardLease:
    """lease.lua's reply for ``sites``. Kept for the I/O thread until it moves to
    ``scripts.lease.call(...)``'s ``parse`` (or ``scripts.lease.parse``)."""
    return lease.parse(sites, reply)
