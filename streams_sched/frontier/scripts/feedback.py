"""feedback.lua: a batch of one site's answers, and the politeness state it moves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context
from streams_sched.frontier.scripts.lease import DEFAULT_POLICY_FIELDS

__all__ = ["FeedbackReply", "args", "call", "keys", "parse"]

_DEFAULT_RATE = DEFAULT_POLICY_FIELDS.index("rate")


class FeedbackReply(NamedTuple):
    #: the site's adaptive rate (req/s), None when it has none
    adaptive_rate: float | None
    #: ms (Redis time) until which a Retry-After pauses the site, 0 none
    paused_until_ms: int
    #: the site's observed answer rate (req/s)
    observed_rate: float
    #: this report cut the rate
    cut: bool


def keys(k: SiteKeys) -> list[str]:
    """policy, stats, window."""
    return [k.policy, k.stats, k.window]


def args(outcome: Sequence[int], robots_delay: str, params: Sequence[Any], defaults: Sequence[str]) -> list[Arg]:
    """ARGV[1..11], also carried by ack.lua: ``outcome`` = (healthy, 429/503, timeouts,
    longest Retry-After in ms); ``robots_delay`` the Crawl-delay in s ('' not reported);
    ``params`` = (adaptive '1'/'0', decrease, increase, floor, forget ms); ``defaults``
    the crawl's default policy (lease.DEFAULT_POLICY_FIELDS), of which the rate."""
    return [*outcome, robots_delay, *params, defaults[_DEFAULT_RATE]]


def parse(reply: Sequence[Any]) -> FeedbackReply:
    return FeedbackReply(float(reply[0]) if reply[0] else None, int(reply[1]), float(reply[2]), bool(int(reply[3])))


def call(f: Context, site: str, outcome: Sequence[int], robots_delay: str, params: Sequence[Any]) -> Call[FeedbackReply]:
    """Report a batch of a site's answers (see :func:`args`)."""
    return Call(f.scripts["feedback"], keys(f.site(site)), args(outcome, robots_delay, params, f.default_policy), parse)
