"""ack.lua: acknowledge and delete finished entries of several sites of one shard, each
site's healthy answers riding along, and put each tracked page back in its site's
delayed ZSET for its next visit."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from streams_sched.frontier.keys import ShardKeys, SiteKeys, stream_code
from streams_sched.frontier.scripts import feedback
from streams_sched.frontier.scripts._call import Arg, Call, Context
from streams_sched.frontier.scripts.lease import DEFAULT_POLICY_FIELDS

__all__ = ["Revisit", "SiteAcks", "args", "call", "keys", "parse"]

_DEFAULT_RATE = DEFAULT_POLICY_FIELDS.index("rate")

#: A tracked page's ack: stream index, entry id, ms until its next visit (-1: no longer
#: tracked), flags ('n' first visit, 'e' first visit whose interval came from the
#: Last-Modified estimate, 'c' changed, 'u' unchanged, '' neither), the
#: payload to visit again, then optionally the page's interval after and before this
#: visit (ms, 0 = none), which its site's revisit demand counts (a caller that leaves
#: them out schedules the page without counting it in the demand).
Revisit = tuple[int, bytes, int, str, bytes] | tuple[int, bytes, int, str, bytes, int, int]

#: One site's part of a call: the site, its entries (stream index, id), its healthy
#: answers with the feedback params (as for feedback.lua) or None, and its tracked pages.
SiteAcks = tuple[str, Iterable[tuple[int, bytes]], tuple[int, Sequence[Any]] | None, Sequence[Revisit]]


def keys(shard: ShardKeys, sites: Sequence[SiteKeys], tracked: Collection[str] = ()) -> list[str]:
    """The shard's leased and ready indexes, then per site: stats, streams, policy, window,
    and its delayed ZSET and stopped URLs when it is in ``tracked`` (it has tracked pages in
    the call), so an untracked page's call passes no key it does not use."""
    out = [shard.leased, *shard.readies]
    for k in sites:
        out += (k.stats, *k.streams, k.policy, k.window)
        if k.site in tracked:
            out += (k.delayed, k.revisit_stops)
    return out


def args(
    group: str, sites: Sequence[SiteAcks], defaults: Sequence[str], budget_share: float = 0.9, rule: str = "freshness",
) -> list[Arg]:
    """``defaults``: the crawl's default policy, for the answers (feedback.args) and, with
    ``budget_share``, a site's revisit budget; ``rule``: how adaptive intervals move
    (STREAMS_REVISIT_RULE: 'freshness' keeps the site's multiplier)."""
    out: list[Arg] = [group]
    for site, entries, answers, revisits in sites:
        out.append(site)
        if answers is None:
            out.append(0)
        else:
            ok, params = answers
            extra = feedback.args((ok, 0, 0, 0), "", params, defaults)
            out += (len(extra), *extra)
        pairs: list[Arg] = []
        for stream, entry_id in entries:
            pairs += (stream_code(stream), entry_id)
        out += (len(pairs) // 2, *pairs, len(revisits))
        if revisits:
            out += (defaults[_DEFAULT_RATE], budget_share, "f" if rule == "freshness" else "n")
        for stream, entry_id, delay_ms, flags, payload, *intervals in revisits:
            interval_ms, prev_ms = intervals or (0, 0)
            out += (stream_code(stream), entry_id, delay_ms, flags, payload, interval_ms, prev_ms)
    return out


def parse(reply: Sequence[Any]) -> list[int]:
    """The entries acked and deleted per site, in order."""
    return [int(v) for v in reply]


def call(f: Context, sites: Sequence[SiteAcks]) -> Call[list[int]]:
    """Ack entries of several sites of ONE shard: (site, entries, answers, revisits) each;
    answers (healthy answers, feedback params) reports what feedback.lua would with outcome
    (n, 0, 0, 0); revisits are the site's tracked pages (:data:`Revisit`).

    A tracked page's request travels back with its ack, not read by the script from its
    entry (XRANGE before XDEL): its meta carries the page's interval and last signature,
    which this visit changed, and only the worker can re-encode the request; a payload
    upward per tracked page costs no round trip (it rides in this call) and nothing for
    an untracked page."""
    keyed = [f.site(s[0]) for s in sites]
    tracked = {s[0] for s in sites if s[3]}
    return Call(f.scripts["ack"], keys(keyed[0].index, keyed, tracked),
                args(f.group, sites, f.default_policy, f.revisit_budget_share, f.revisit_rule), parse)
