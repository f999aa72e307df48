"""read_site.lua: one site as a dump reads it, its state and then its requests a chunk at a time.

The reply's records are plain (no I/O): :class:`SiteHead` is the state at the moment of the
read, :class:`Chunk` a chunk of its requests, :class:`Checks` what the reader checks with
each later chunk (transfer/sitereader.py decides from them whether the read still holds).
freeze_site.py returns a :class:`SiteHead` too.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from streams_sched.frontier.keys import STREAMS, SiteKeys
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = [
    "DONE", "LOST", "SNAPSHOT_STATS", "Checks", "Chunk", "Cursors", "FilterValue", "SiteHead", "StreamPart", "args",
    "call", "keys", "parse", "parse_chunk", "parse_head", "start_cursors",
]

#: the counters of lib/snapshot.lua's SNAPSHOT_STATS, in its order (tests/test_transfer.py
#: checks the two agree)
SNAPSHOT_STATS: tuple[str, ...] = (
    "pages", "tracked", "tdemand", "stretch", "delay_seq", "failed", "released", "reclaimed", "dead", "promoted",
    "revisits", "dlq_requeued",
)
#: a part's cursor once it is read through
DONE = b"!"
#: the delayed ZSET's cursor when its cursor member is gone (the read must start over)
LOST = b"?"


@dataclass(frozen=True, slots=True)
class FilterValue:
    """A seen key as it was read: its type ('none', 'string', 'hash' or RedisBloom's
    'MBbloom--'), its PTTL (ms, -1 none) and value (bytes; a hash as a flat list; a RedisBloom
    filter as its BF.SCANDUMP chunks, iterator and data, flat)."""

    kind: str
    pttl_ms: int = -1
    value: Any = None


@dataclass(slots=True)
class SiteHead:
    """A site's state at the moment of the read."""

    now_ms: int
    #: the last id of the shard's journal then (b"" none): what came after is the journal's
    journal_at: bytes
    #: the site's packed inbox value (b"" none)
    inbox: bytes
    policy: dict[str, str]
    #: SNAPSHOT_STATS -> value (None absent)
    stats: dict[str, str | None]
    #: per stream of STREAMS: (the group's last delivered id, the last entry's id), b"" none
    streams: list[tuple[bytes, bytes]]
    delayed: int
    #: the last dead letter's id (b"" none)
    dlq_last: bytes
    filters: list[FilterValue]


@dataclass(slots=True)
class StreamPart:
    #: (id, fields) in id order
    entries: list[tuple[bytes, dict[bytes, bytes]]]
    #: id -> (consumer, idle ms, deliveries) of the entries among them a consumer holds
    pending: dict[bytes, tuple[str, int, int]]
    next: bytes


@dataclass(slots=True)
class Chunk:
    streams: list[StreamPart]
    #: (member, score) in rank order
    delayed: list[tuple[bytes, float]]
    delayed_next: bytes
    dead: list[tuple[bytes, dict[bytes, bytes]]]
    dead_next: bytes

    @property
    def done(self) -> bool:
        return all(p.next == DONE for p in self.streams) and self.delayed_next == DONE and self.dead_next == DONE

    def size(self) -> int:
        return sum(len(p.entries) for p in self.streams) + len(self.delayed) + len(self.dead)


@dataclass(slots=True)
class Checks:
    """What a later chunk's call saw: Redis time, SNAPSHOT_STATS, each stream's last delivered id."""

    now_ms: int
    stats: dict[str, str | None]
    delivered: list[bytes]


@dataclass(slots=True)
class Cursors:
    """Where a chunked read is: per stream (cursor, last id at the snapshot), the delayed
    ZSET's cursor member, the dead letters' cursor and last id (b"" = from the start)."""

    streams: list[tuple[bytes, bytes]] = field(default_factory=list)
    delayed: bytes = b""
    dead: tuple[bytes, bytes] = (b"", b"")

    def argv(self) -> list[Arg]:
        out: list[Arg] = []
        for cur, last in self.streams:
            out += (cur, last)
        out += (self.delayed, *self.dead)
        return out

    def after(self, chunk: Chunk) -> Cursors:
        return Cursors([(p.next, last) for p, (_, last) in zip(chunk.streams, self.streams, strict=True)],
                       chunk.delayed_next, (chunk.dead_next, self.dead[1]))


def start_cursors(head: SiteHead) -> Cursors:
    """The cursors of a read from the start, up to where the head says each part ends."""
    return Cursors([(b"", last) for _, last in head.streams], b"", (b"", head.dlq_last))


def keys(k: SiteKeys, filters: Sequence[str] = ()) -> list[str]:
    """delayed, dlq, stats, policy, streams, the shard's inbox and journal, then the seen keys
    to read whole."""
    return [k.delayed, k.dlq, k.stats, k.policy, *k.streams, k.index.inbox, k.index.journal, *filters]


def args(group: str, site: str, budget: int, cursors: Cursors | None = None) -> list[Arg]:
    """'first' without cursors, else 'next' from them."""
    if cursors is None:
        return [group, site, "first", budget]
    return [group, site, "next", budget, *cursors.argv()]


def _flat(values: Sequence[Any]) -> dict[str, str]:
    return {text(k): text(v) for k, v in zip(values[::2], values[1::2], strict=True)}


def _fields(values: Sequence[Any]) -> dict[bytes, bytes]:
    return dict(zip(values[::2], values[1::2], strict=True))


def _stats(values: Sequence[Any]) -> dict[str, str | None]:
    return {name: None if v is None else text(v) for name, v in zip(SNAPSHOT_STATS, values, strict=True)}


def _filter(part: Sequence[Any]) -> FilterValue:
    kind = text(part[0])
    if kind == "none":
        return FilterValue(kind)
    return FilterValue(kind, int(part[1]), part[2])


def parse_head(reply: Sequence[Any]) -> SiteHead:
    return SiteHead(
        now_ms=int(reply[0]),
        journal_at=reply[1] or b"",
        inbox=reply[2] or b"",
        policy=_flat(reply[3]),
        stats=_stats(reply[4]),
        streams=[(ld or b"", last or b"") for ld, last in reply[5]],
        delayed=int(reply[6]),
        dlq_last=reply[7] or b"",
        filters=[_filter(f) for f in reply[8]],
    )


def parse_chunk(reply: Sequence[Any]) -> Chunk:
    parts = []
    for entries, pending, nxt in reply[: len(STREAMS)]:
        held = {p[0]: (text(p[1]), int(p[2]), int(p[3])) for p in pending}
        parts.append(StreamPart([(e[0], _fields(e[1])) for e in entries], held, nxt))
    members, d_next = reply[len(STREAMS)]
    dead, dead_next = reply[len(STREAMS) + 1]
    delayed = [(members[i], float(members[i + 1])) for i in range(0, len(members), 2)]
    return Chunk(parts, delayed, d_next, [(e[0], _fields(e[1])) for e in dead], dead_next)


def parse_checks(reply: Sequence[Any]) -> Checks:
    return Checks(int(reply[0]), _stats(reply[1]), [ld or b"" for ld in reply[2]])


def parse(reply: Sequence[Any], first: bool = True) -> tuple[SiteHead | Checks, Chunk]:
    """'first': (SiteHead, Chunk); 'next': (Checks, Chunk)."""
    return (parse_head(reply[0]) if first else parse_checks(reply[0])), parse_chunk(reply[1])


def call(f: Context, site: str, budget: int, cursors: Cursors | None = None, filters: Sequence[str] = (),
         k: SiteKeys | None = None) -> Call[tuple[SiteHead | Checks, Chunk]]:
    """Read-only (EVALSHA_RO). ``k``: the keys to read instead of the site's own (its frozen
    copies, freeze_site.py)."""
    built = keys(k or f.site(site), filters if cursors is None else ())
    return Call(f.scripts["read_site"], built, args(f.group, site, budget, cursors),
                functools.partial(parse, first=cursors is None), read_only=True)
