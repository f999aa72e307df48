"""What is added to a crawl while a dump reads it: the shards' journals (Redis I/O).

A request added to a site after the dump read the site (the follow-ups of a page acked
meanwhile, a seed) is in no site the dump reads. So while a dump reads a shard,
enqueue.lua appends every request it adds to the shard's journal stream
(``ss:{C/#n}:#journal``: site, stream index, due ms, payload), in the same script, and a
site's read says where the journal stood (``SiteHead.journal_at``): a journal entry
belongs in the dump if, and only if, it came after its site's read, or its site was not
read at all (it is new since the shard's registry was scanned).

:class:`Journal` starts a shard's journal just before the dump scans the shard (there is
nothing before that to leave out), reads it, trims what it has read, and stops it
atomically at the end (RENAME to a scratch key, which enqueue.lua no longer sees, read
whole). While no dump runs there is no journal, and enqueue.lua pays one EXISTS per call.

The journals expire ``TTL_MS`` after the dump's last sign of life, so a dump that dies
leaves nothing growing; the dump renews them (:meth:`keep_alive`) and fails, rather than
write a dump that misses requests, if one has gone (the dump was paused longer than that,
or the server lost it). One dump of a crawl runs at a time (``ss:{C}:dump-lock``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streams_sched.errors import DumpBusy, JournalLost
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.replies import text

__all__ = ["DumpBusy", "Journal", "JournalEntry", "JournalLost"]


@dataclass(frozen=True, slots=True)
class JournalEntry:
    """A request added while the dump read the shard: its site, stream index, due time (Redis
    ms, 0 = due at once) and payload."""

    id: bytes
    site: str
    stream: int
    due_ms: int
    payload: bytes


def _id(value: bytes) -> tuple[int, int]:
    ms, _, seq = value.partition(b"-")
    return int(ms or 0), int(seq or 0)


def after(entry_id: bytes, mark: bytes) -> bool:
    """Whether journal id ``entry_id`` comes after ``mark`` (b"": the start)."""
    return not mark or _id(entry_id) > _id(mark)


class Journal:
    """The journals of one dump (see the module docstring)."""

    #: how long a journal and the dump's lock outlive the dump's last sign of life
    TTL_MS = 60_000
    #: renew them this often
    RENEW_S = 10.0
    #: entries read per XRANGE
    CHUNK = 1000

    def __init__(self, frontier: Frontier, dump_id: str) -> None:
        self.frontier = frontier
        self.client = frontier.client
        self.dump_id = dump_id
        self.started: set[int] = set()
        self._renewed = 0.0

    def lock(self) -> None:
        """Take the crawl's dump lock, or raise DumpBusy."""
        key = self.frontier.keys.dump_lock
        if not self.client.set(key, self.dump_id, nx=True, px=self.TTL_MS):
            other = text(self.client.get(key) or b"")
            raise DumpBusy(
                f"another dump of crawl {self.frontier.crawl!r} is running (dump {other}); wait for it to end,"
                f" or, if it died, for its lock to expire within {self.TTL_MS // 1000} s"
            )
        self._renewed = time.monotonic()

    def unlock(self) -> None:
        key = self.frontier.keys.dump_lock
        if text(self.client.get(key) or b"") == self.dump_id:
            self.client.delete(key)

    def start(self, shard: int) -> None:
        """Start shard ``shard``'s journal: from now on enqueue.lua appends to it."""
        key = self.frontier.shard(shard).journal
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(key)  # a dead dump's, if its lock expired but the journal had not yet
        pipe.xadd(key, {"dump": self.dump_id})
        pipe.pexpire(key, self.TTL_MS)
        pipe.execute()
        self.started.add(shard)

    def keep_alive(self, force: bool = False) -> None:
        """Renew the lock and the journals (every RENEW_S); raise JournalLost if one is gone."""
        now = time.monotonic()
        if not force and now - self._renewed < self.RENEW_S:
            return
        pipe = self.client.pipeline(transaction=False)
        shards = sorted(self.started)
        for n in shards:
            pipe.pexpire(self.frontier.shard(n).journal, self.TTL_MS)
        replies = pipe.execute()
        gone = [n for n, ok in zip(shards, replies, strict=True) if not ok]
        if gone or not self.client.pexpire(self.frontier.keys.dump_lock, self.TTL_MS):
            raise JournalLost(
                f"the dump of crawl {self.frontier.crawl!r} lost its journal of shard(s) {gone or '(lock)'}: it was"
                f" paused longer than {self.TTL_MS // 1000} s, or Redis lost the keys (a failover, a restart)."
                " The dump would miss requests added meanwhile; run it again"
            )
        self._renewed = now

    def entries(self, shard: int, start: bytes = b"", key: str | None = None) -> Iterator[JournalEntry]:
        """The journal's entries after ``start`` (b"": all), oldest first, read in chunks."""
        key = key or self.frontier.shard(shard).journal
        cursor = b"(" + start if start else b"-"
        while True:
            rows: list[Any] = self.client.xrange(key, cursor, "+", count=self.CHUNK) or []
            for entry_id, fields in rows:
                if b"s" not in fields:
                    continue  # the start mark
                yield JournalEntry(entry_id, text(fields[b"s"]), int(fields[b"q"]) - 1, int(fields[b"t"]),
                                   fields[b"r"])
            if len(rows) < self.CHUNK:
                return
            cursor = b"(" + rows[-1][0]

    def trim(self, shard: int, upto: bytes) -> None:
        """Drop the entries up to ``upto`` (read and written): the journal stays small."""
        ms, seq = _id(upto)
        self.client.xtrim(self.frontier.shard(shard).journal, minid=f"{ms}-{seq + 1}", approximate=False)

    def stop(self, shard: int, start: bytes) -> Iterator[JournalEntry]:
        """Stop shard ``shard``'s journal at once (enqueue.lua stops appending) and yield what it
        holds after ``start``."""
        key = self.frontier.shard(shard).journal
        final = self.frontier.shard(shard).scratch(f"journal:{self.dump_id}")
        try:
            self.client.rename(key, final)
        except Exception as exc:  # no such key: it expired
            if "no such key" in str(exc).lower():
                raise JournalLost(f"the journal of shard {shard} of crawl {self.frontier.crawl!r} expired before"
                                  " the dump ended: run it again") from None
            raise
        self.started.discard(shard)
        try:
            yield from self.entries(shard, start, final)
        finally:
            self.client.delete(final)
