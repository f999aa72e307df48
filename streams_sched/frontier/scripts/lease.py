"""lease.lua: lease requests of several sites of one shard for one consumer, and name the
shard's next ready sites, in one call."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streams_sched.connect.server_checks import text
from streams_sched.frontier.keys import ShardKeys, SiteKeys, stream_of_code
from streams_sched.frontier.records import LeasedEntry, LeaseReply, ShardLease
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["DEFAULT_POLICY_FIELDS", "LeaseOptions", "args", "call", "keys", "leased_entries", "parse"]

#: ARGV[8..12]: the crawl's default policy ("*"), kept in the crawl meta hash as
#: ``default_<field>`` (policy.set_policy writes them).
DEFAULT_POLICY_FIELDS: tuple[str, ...] = ("rate", "burst", "paused", "weight", "max_browser")

#: values of a site's part before its entries
_HEAD = 12


def keys(shard: ShardKeys, sites: Sequence[SiteKeys]) -> list[str]:
    """The shard's ready indexes, leased index, inbox, lists of new sites and halt, then per
    site: delayed, dlq, stats, policy, streams."""
    out = [*shard.readies, shard.leased, shard.inbox, *shard.freshes, shard.halt]
    for k in sites:
        out += (k.delayed, k.dlq, k.stats, k.policy, *k.streams)
    return out


@dataclass(frozen=True, slots=True)
class LeaseOptions:
    """How a lease call leases and which ready sites it names (lease.lua's ARGV)."""

    #: ready sites of the shard to name per task type, for the next call (0: none)
    name: int = 0
    #: a random number: where among the oldest ready sites the named run starts
    spread: int = 0
    #: the task types the worker leases: 'h' http, 'b' browser
    tasks: str = "hb"
    #: ms a paused site waits before it is looked at again
    paused_wait_ms: int = 1000
    #: most due delayed requests to promote per site
    promote_limit: int = 100
    #: most entries that failed a delivery before to hand out in the call
    max_suspects: int = 1
    #: most entries the call leases in all (None: the plans' sum)
    budget: int | None = None


def args(
    group: str,
    consumer: str,
    weights: Sequence[int],
    plans: Sequence[tuple[str, int, int, int]],
    defaults: Sequence[str],
    politeness: str,
    options: LeaseOptions,
) -> list[Arg]:
    """``plans`` = (site, total, max http, max browser) each; ``defaults`` the crawl's
    policy in :data:`DEFAULT_POLICY_FIELDS` order; ``politeness`` the flags ('a' adaptive
    back-off, 'r' robots.txt obeyed). See lease.lua's header for the rest."""
    o = options
    budget = sum(p[1] for p in plans) if o.budget is None else o.budget
    out: list[Arg] = [group, consumer, *weights, o.promote_limit, o.max_suspects, *defaults, politeness, o.name,
                      o.spread, o.tasks, o.paused_wait_ms, budget]
    for site, total, max_http, max_browser in plans:
        out += (site, total, max_http, max_browser)
    return out


def leased_entries(site: str, flat: Sequence[Any], start: int, claimed: bool = False) -> list[LeasedEntry]:
    """The entries of a reply from ``start`` on: stream code, id, payload, prior deliveries
    each. An entry with prior deliveries (or any ``claimed`` one) is a suspect."""
    out = []
    for i in range(start, len(flat), 4):
        d = int(flat[i + 3])
        out.append(LeasedEntry(site, stream_of_code(int(flat[i])), flat[i + 1], flat[i + 2] or None, d, claimed or d > 0))
    return out


def parse(sites: Sequence[str], reply: Sequence[Any]) -> ShardLease:
    """The reply of a call for ``sites`` (in plan order): per site its part (None where the
    call's budget ran out before it), then the ready sites the shard named, when to ask
    it again, and the shard's halt (a move)."""
    n = len(sites)
    parts: list[LeaseReply | None] = []
    for site, part in zip(sites, reply[:n], strict=True):
        if not part:
            parts.append(None)
            continue
        head = [int(v) for v in part[:7]]
        r = LeaseReply(head[0], head[1], head[2], head[3], head[4], head[5], head[6])
        try:
            r.weight = float(part[7]) if part[7] else 1.0
        except ValueError:
            r.weight = 1.0
        r.max_browser = int(part[8])
        r.rate = float(part[9] or 0)
        r.revisit = text(part[10])
        r.mu = float(part[11]) if part[11] else None
        r.entries = leased_entries(site, part, _HEAD)
        parts.append(r)
    return ShardLease(parts, [text(v) for v in reply[n]], int(reply[n + 1]), text(reply[n + 2]))


def call(
    f: Context,
    shard: int,
    consumer: str,
    plans: Sequence[tuple[str, int, int, int]],
    weights: Sequence[int],
    options: LeaseOptions = LeaseOptions(),
) -> Call[ShardLease]:
    """Lease from several sites of ONE shard: ``plans`` = (site, total, max http, max
    browser) each, reading the bands in ``weights``; ``options`` says how many entries in
    all and which of the shard's ready sites to name for the next call."""
    built = args(f.group, consumer, weights, plans, f.default_policy, f.politeness, options)
    sites = [p[0] for p in plans]
    return Call(f.scripts["lease"], keys(f.shard(shard), [f.site(s) for s in sites]), built,
                functools.partial(parse, sites))
