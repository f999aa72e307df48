"""Turning the scripts' replies into records, and reply values into Python text.

Each ``parse_*`` reads the reply of one script (or of one site's part of a script that
serves several sites) as the script's header describes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streams_sched.frontier.keys import STREAMS, stream_of_code
from streams_sched.frontier.records import LeasedEntry, LeaseReply, ShardLease, SiteStatus, StreamStatus

__all__ = ["over_cap_of", "parse_claim", "parse_enqueue", "parse_lease", "parse_shard_lease", "parse_status", "text"]


def text(value: Any) -> str:
    """``value`` as ``str``: bytes are decoded as UTF-8 (undecodable bytes replaced), anything else str()'d."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _int(v: Any) -> int:
    return int(v) if v is not None else 0


def _first_site(reply: Sequence[Any]) -> Sequence[Any]:
    """The first site's part of a reply of a script that serves several sites."""
    return reply[0] if reply and isinstance(reply[0], list) else reply


def parse_enqueue(reply: Sequence[Any]) -> tuple[int, int, int, bytes]:
    """-> (added, duplicates, delayed, flags) where flags[i] is ord('1') if request i was
    added, ord('0') a duplicate, ord('c') over the site's page cap (see over_cap_of).
    Takes one site's part of enqueue.lua's reply (or the reply of a one-site call)."""
    reply = _first_site(reply)
    return int(reply[0]), int(reply[1]), int(reply[2]), bytes(reply[3])


def over_cap_of(reply: Sequence[Any]) -> int:
    """Requests of an enqueue reply dropped over the site's page cap (max_pages)."""
    reply = _first_site(reply)
    return int(reply[4]) if len(reply) > 4 else 0


def _entries(site: str, flat: Sequence[Any], start: int, claimed: bool = False) -> list[LeasedEntry]:
    out = []
    for i in range(start, len(flat), 4):
        d = int(flat[i + 3])
        out.append(LeasedEntry(site, stream_of_code(int(flat[i])), flat[i + 1], flat[i + 2] or None, d, claimed or d > 0))
    return out


def parse_shard_lease(sites: Sequence[str], reply: Sequence[Any]) -> ShardLease:
    n = len(sites)
    return ShardLease(
        [parse_lease(site, part) if part else None for site, part in zip(sites, reply[:n], strict=True)],
        [text(s) for s in reply[n]],
        int(reply[n + 1]),
    )


def parse_lease(site: str, reply: Sequence[Any]) -> LeaseReply:
    reply = _first_site(reply)
    head = [int(v) for v in reply[:7]]
    r = LeaseReply(head[0], head[1], head[2], head[3], head[4], head[5], head[6])
    try:
        r.weight = float(reply[7]) if reply[7] else 1.0
    except ValueError:
        r.weight = 1.0
    r.max_browser = int(reply[8])
    r.rate = float(reply[9] or 0)
    r.entries = _entries(site, reply, 10)
    return r


def parse_claim(site: str, reply: Sequence[Any]) -> tuple[int, int, list[LeasedEntry]]:
    """-> (taken, dead-lettered, entries returned in claim mode)."""
    return int(reply[0]), int(reply[1]), _entries(site, reply, 2, claimed=True)


def _pairs(flat: Sequence[Any]) -> dict[str, str]:
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in zip(flat[::2], flat[1::2], strict=True)
    }


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def parse_status(site: str, reply: Sequence[Any]) -> SiteStatus:
    streams = {}
    for n, key in enumerate(STREAMS):
        base = 1 + 3 * n
        streams[key] = StreamStatus(int(reply[base]), int(reply[base + 1]), int(reply[base + 2]))
    tail = 1 + 3 * len(STREAMS)
    stats = {k: int(float(v)) for k, v in _pairs(reply[tail + 3]).items() if _is_number(v)}
    return SiteStatus(
        site=site,
        now_ms=int(reply[0]),
        streams=streams,
        delayed=int(reply[tail]),
        next_due_ms=int(reply[tail + 1]),
        dead_letters=int(reply[tail + 2]),
        stats=stats,
        policy=_pairs(reply[tail + 4]),
    )
