"""status.lua: a read-only snapshot of one site, which a read-only ACL user can take."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from streams_sched.connect.server_checks import text
from streams_sched.frontier.delayed import waiting_page
from streams_sched.frontier.keys import STREAMS, SiteKeys
from streams_sched.frontier.records import EffectiveRate, SiteStatus, StreamStatus
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, policy, streams, the shard's inbox."""
    return [k.delayed, k.dlq, k.stats, k.policy, *k.streams, k.index.inbox]


def args(group: str, site: str, defaults: Sequence[str]) -> list[Arg]:
    """``defaults``: the crawl's default policy (lease.DEFAULT_POLICY_FIELDS), for the rate."""
    return [group, site, *defaults]


def _fields(flat: Sequence[Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


def _is_number(v: str) -> bool:
    try:
        float(v)
    except ValueError:
        return False
    return True


def parse(site: str, reply: Sequence[Any]) -> SiteStatus:
    streams = {}
    for n, key in enumerate(STREAMS):
        base = 1 + 3 * n
        streams[key] = StreamStatus(int(reply[base]), int(reply[base + 1]), int(reply[base + 2]))
    tail = 1 + 3 * len(STREAMS)
    stats = {k: int(float(v)) for k, v in _fields(reply[tail + 3]).items() if _is_number(v)}
    return SiteStatus(
        site=site,
        now_ms=int(reply[0]),
        streams=streams,
        delayed=int(reply[tail]),
        next_due_ms=int(reply[tail + 1]),
        dead_letters=int(reply[tail + 2]),
        stats=stats,
        policy=_fields(reply[tail + 4]),
        rate=EffectiveRate(float(reply[tail + 5]), text(reply[tail + 6]), int(reply[tail + 7])),
        overdue=int(reply[tail + 8]),
        oldest_overdue_interval_s=_interval_of(reply[tail + 9]),
    )


def _interval_of(member: Any) -> float:
    page = waiting_page(member) if isinstance(member, bytes) and member else None
    return page.interval_s if page is not None else 0.0


def call(f: Context, site: str) -> Call[SiteStatus]:
    """Read-only: run with EVALSHA_RO, or EVAL_RO when the server does not have it. The
    site's rate counts in the crawl's defaults the frontier holds (``use_crawl_defaults``)."""
    return Call(f.scripts["status"], keys(f.site(site)), args(f.group, site, f.default_policy),
                functools.partial(parse, site), read_only=True)
