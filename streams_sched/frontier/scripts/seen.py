"""seen.lua: whether a site's seen filters hold fingerprints (read-only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.records import BloomParams
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["FilterAnswer", "args", "call", "keys", "parse"]


class FilterAnswer(NamedTuple):
    """One filter's answer: its form ('exact': certain; 'bloom': a yes may be a false positive),
    and per fingerprint whether it holds it."""

    form: str
    seen: list[bool]


def keys(k: SiteKeys, filters: Sequence[str]) -> list[str]:
    """The site's filter pairs (filter, meta), current first (``Frontier.filters`` of ``k``'s site)."""
    return list(filters)


def args(bloom: BloomParams, fps: Sequence[bytes]) -> list[Arg]:
    return [bloom.mode, bloom.error_rate, bloom.capacity, bloom.expansion, *fps]


def parse(reply: Sequence[Any]) -> list[FilterAnswer]:
    return [FilterAnswer(text(part[0]), [bool(int(v)) for v in part[1:]]) for part in reply]


def call(f: Context, site: str, fps: Sequence[bytes]) -> Call[list[FilterAnswer]]:
    return Call(f.scripts["seen"], keys(f.site(site), f.filters(site)), args(f.bloom, fps), parse, read_only=True)
