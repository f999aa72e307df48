"""load_site.lua: a site's counters and seen filters, restored once by a load."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys, ledger: str = "", seen: Sequence[tuple[str, str]] = ()) -> list[str]:
    """stats, the shard's site registry, then the ledger and the (scratch key, seen key) pairs."""
    out = [k.stats, k.index.sites]
    if ledger:
        out.append(ledger)
        for scratch, target in seen:
            out += (scratch, target)
    return out


def args(site: str, line: int, stats: Mapping[str, str], ttls: Sequence[int]) -> list[Arg]:
    out: list[Arg] = [site, line, len(stats)]
    for field, value in stats.items():
        out += (field, value)
    out += list(ttls)
    return out


def parse(reply: Any) -> bool:
    """True: restored now; False: the ledger had the line."""
    return bool(int(reply))


def call(f: Context, site: str, ledger: str, line: int, stats: Mapping[str, str],
         seen: Sequence[tuple[str, str, int]] = ()) -> Call[bool]:
    """``seen``: (scratch key, seen key, its TTL in ms) each."""
    return Call(f.scripts["load_site"], keys(f.site(site), ledger, [(a, b) for a, b, _ in seen]),
                args(site, line, stats, [t for _, _, t in seen]), parse)
