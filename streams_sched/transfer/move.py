"""``streams-sched move``: a running crawl from its Redis to another (:class:`Mover`).

A move is a dump streamed into a load (a :class:`~streams_sched.transfer.dump.Dumper`
handing its records to a :class:`~streams_sched.transfer.load.Loader`, no file between,
memory flat), with the crawl halted around it (frontier/moves.py):

1. **pause**: each source shard's halt says ``pause:<id>`` (SET NX, so a second move or a
   moved crawl is refused; it lives ``HALT_TTL_MS`` and the move renews it, so a move that
   is killed leaves a crawl that resumes by itself within a minute). lease.lua leases
   nothing and claim.lua takes nothing over; enqueues go on (the dump's journal takes them);
2. **wait** for the requests in flight: until no shard's leased index names a site, or one
   lease time has passed. Their acks and follow-ups land in the source before the copy
   reads their sites; a request still leased after the wait is copied as queued and is
   crawled again at the target;
3. **copy** every site (policies, counters, tracked pages, delayed requests, dead letters,
   seen filters) into the target crawl, which is halted too until the move is done, so a
   worker started there early waits instead of crawling half a copy;
4. **seal**, once every site is read and before the journals' last entries are taken: each
   source halt says ``moved:<url>``, so every request added before it is in the copy and
   every enqueue after it is refused (``CRAWLMOVED <url>``);
5. **done**: the source's meta says ``moved_to``, its halts no longer expire, the target's
   halts go and its workers lease.

A failure or Ctrl-C at any step before the end deletes the source's halts (the crawl
resumes where it was, with nothing lost: the copy only read it) and leaves the target
crawl halted, to be purged before the move is run again.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from streams_sched.config import default_of
from streams_sched.errors import StreamsSchedError
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.frontier.moves import MOVED, MOVED_TO, PAUSE
from streams_sched.transfer.dump import Dumper, DumpSummary
from streams_sched.transfer.inputs import BadLine
from streams_sched.transfer.load import Loader, LoadSummary, prepare_crawl
from streams_sched.transfer.records import Record

__all__ = ["HALT_TTL_MS", "MoveRefused", "MoveSummary", "Mover", "lease_time"]

#: how long a source halt outlives the move's last sign of life
HALT_TTL_MS = 60_000
#: how often the move renews its halts
RENEW_S = 10.0


class MoveRefused(StreamsSchedError):
    """The move cannot start: the crawl is moving or has moved, or the target holds it."""


@dataclass
class MoveSummary:
    """What a move did, and how long the crawl leased nothing."""

    move_id: str = ""
    #: leasing stopped: from the pause to the target's start
    paused_s: float = 0.0
    #: of that, waiting for the requests in flight
    wait_s: float = 0.0
    #: of that, the copy
    copy_s: float = 0.0
    #: sites with leased requests when leasing stopped, and after the wait
    leased_sites_at_pause: int = 0
    leased_sites_after_wait: int = 0
    dump: DumpSummary = field(default_factory=DumpSummary)
    load: LoadSummary = field(default_factory=LoadSummary)
    bad: list[str] = field(default_factory=list)


class Mover:
    """Moves ``source``'s crawl into the same crawl name on ``target`` (a client).

    ``to_url``: the target's URL without its password (the mark says it); ``lease_s``: the
    longest the move waits for the requests in flight; ``progress(stage, done, total, n)``
    hears how it goes. ``clock`` and ``poll_s`` are for tests."""

    def __init__(
        self,
        source: Frontier,
        target: Any,
        to_url: str,
        *,
        lease_s: float,
        has_bloom: bool,
        budget: int = 1000,
        source_label: str = "",
        server: str = "",
        version: str = "",
        progress: Callable[[str, int, int, int], Any] | None = None,
        poll_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.target = target
        self.to_url = to_url
        self.lease_s = lease_s
        self.has_bloom = has_bloom
        self.budget = budget
        self.source_label = source_label
        self.server = server
        self.version = version
        self.progress = progress
        self.poll_s = poll_s
        self.clock = clock
        self.move_id = uuid.uuid4().hex[:16]
        self.summary = MoveSummary(move_id=self.move_id)
        self._halt = PAUSE + self.move_id
        self._halted: list[str] = []
        self._sealed = False
        self._renewed = 0.0
        self._dst: Frontier | None = None

    # -- checks ------------------------------------------------------------------------------

    def check(self) -> None:
        """MoveRefused if the crawl is moving or has moved, or the target holds a crawl of its name."""
        src, crawl = self.source, self.source.crawl
        moved = src.client.hget(src.keys.meta, MOVED_TO)
        if moved:
            raise MoveRefused(f"crawl {crawl!r} has moved already, to {_text(moved)}")
        halts = [h for h in self._read_halts() if h]
        if halts:
            raise MoveRefused(f"crawl {crawl!r} is being moved now ({halts[0]}); wait for that move to end"
                              f" (a move that died lets go within {HALT_TTL_MS // 1000} s)")
        if self.target.sismember(CrawlKeys.registry(), crawl) or self.target.exists(CrawlKeys(crawl).meta):
            raise MoveRefused(f"the target already holds a crawl named {crawl!r}: purge it there first"
                              f" (streams-sched purge -c {crawl} --redis-url {self.to_url}), or move to another Redis")
        if src.bloom.mode == "bf" and not self.has_bloom:
            raise MoveRefused(f"crawl {crawl!r} dedupes with RedisBloom and the target has no RedisBloom module: its"
                              " seen filters cannot go there; load the RedisBloom module on the target")

    def _read_halts(self) -> list[str]:
        pipe = self.source.client.pipeline(transaction=False)
        for shard in self.source.shard_keys():
            pipe.get(shard.halt)
        return [_text(v) for v in pipe.execute()]

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> MoveSummary:
        """Pause, wait, copy, seal, start the target; on any failure (or Ctrl-C) the source
        resumes and the exception goes on."""
        self.check()
        s = self.summary
        self._pause()
        paused_at = self.clock()
        try:
            s.leased_sites_at_pause = self._leased_sites()
            self._wait_in_flight()
            s.wait_s = self.clock() - paused_at
            copy_at = self.clock()
            self._copy()
            s.copy_s = self.clock() - copy_at
            self._done()
        except BaseException:
            self.resume()
            raise
        s.paused_s = self.clock() - paused_at
        return s

    def _pause(self) -> None:
        src = self.source
        pipe = src.client.pipeline(transaction=False)
        shards = list(src.shard_keys())
        for shard in shards:
            pipe.set(shard.halt, self._halt, nx=True, px=HALT_TTL_MS)
        taken = pipe.execute()
        self._halted = [shard.halt for shard, ok in zip(shards, taken, strict=True) if ok]
        self._renewed = self.clock()
        if len(self._halted) != len(shards):
            self.resume()
            raise MoveRefused(f"crawl {src.crawl!r} is being moved now (another move halted it first)")

    def _renew(self) -> None:
        now = self.clock()
        if now - self._renewed < RENEW_S:
            return
        self._renewed = now
        pipe = self.source.client.pipeline(transaction=False)
        for key in self._halted:
            pipe.pexpire(key, HALT_TTL_MS)
        if not all(pipe.execute()):
            raise StreamsSchedError(
                f"the move of crawl {self.source.crawl!r} lost its halt in the source (paused past"
                f" {HALT_TTL_MS // 1000} s, or Redis lost the key): workers may have leased meanwhile")

    def resume(self) -> None:
        """Let the source crawl go on: its halts deleted (a sealed one too)."""
        if self._halted:
            pipe = self.source.client.pipeline(transaction=False)
            for key in self._halted:
                pipe.delete(key)
            pipe.execute()
            self._halted = []

    def _leased_sites(self) -> int:
        pipe = self.source.client.pipeline(transaction=False)
        for shard in self.source.shard_keys():
            pipe.zcard(shard.leased)
        return sum(int(n) for n in pipe.execute())

    def _wait_in_flight(self) -> None:
        """Until no site has a leased request, or one lease time has passed."""
        deadline = self.clock() + self.lease_s
        while True:
            left = self._leased_sites()
            self.summary.leased_sites_after_wait = left
            if self.progress is not None:
                self.progress("wait", self.summary.leased_sites_at_pause - left, self.summary.leased_sites_at_pause, left)
            if left == 0 or self.clock() >= deadline:
                return
            self._renew()
            time.sleep(min(self.poll_s, max(0.0, deadline - self.clock())))

    def _copy(self) -> None:
        numbers = count(1)
        loader: Loader | None = None
        s = self.summary

        def take(record: Record) -> None:
            assert loader is not None
            loader.take(next(numbers), record)
            self._renew()

        def report(bad: BadLine) -> None:
            s.bad.append(str(bad))

        dumper = Dumper(
            self.source, sink=take, seen=True, budget=self.budget, source=self.source_label, server=self.server,
            version=self.version, before_end=self._seal,
            progress=(lambda done, total, n: self.progress("copy", done, total, n)) if self.progress else None,
        )
        header = dumper.header()
        dst = Frontier(self.target, self.source.crawl)
        prepare_crawl(dst, header, seen=True, has_bloom=self.has_bloom, shards=header.shards,
                      file_name=f"(move {self.move_id})", file_id=header.dump_id)
        dst = Frontier(self.target, self.source.crawl, crawl_bloom(self.target, self.source.crawl))
        dst.use_crawl_defaults(dst.crawl_meta())
        dst.load_scripts()
        self._dst = dst
        self._halt_target()
        loader = Loader(dst, file_id=header.dump_id, header=header, report=report)
        s.dump = dumper.run()
        loader.close()
        s.load = loader.summary
        if s.bad:
            raise StreamsSchedError(
                f"{len(s.bad)} record(s) of the crawl could not be copied (the first: {s.bad[0]})")

    def _halt_target(self) -> None:
        """The target crawl leases nothing until the move is done (no TTL: a failed move's
        copy stays halted until it is purged)."""
        assert self._dst is not None
        pipe = self.target.pipeline(transaction=False)
        for shard in self._dst.shard_keys():
            pipe.set(shard.halt, self._halt)
        pipe.execute()

    def _seal(self) -> None:
        """Every site is read: from now on the source refuses enqueues (they would be lost),
        while the journals' last entries are taken into the copy."""
        pipe = self.source.client.pipeline(transaction=False)
        for key in self._halted:
            pipe.set(key, MOVED + self.to_url, px=HALT_TTL_MS)
        pipe.execute()
        self._renewed = self.clock()
        self._sealed = True

    def _done(self) -> None:
        src = self.source
        pipe = src.client.pipeline(transaction=False)
        pipe.hset(src.keys.meta, mapping={MOVED_TO: self.to_url, "moved_id": self.move_id})
        for key in self._halted:
            pipe.persist(key)
        pipe.execute()
        self._halted = []  # the marks stay: the crawl has moved
        assert self._dst is not None
        pipe = self.target.pipeline(transaction=False)
        for shard in self._dst.shard_keys():
            pipe.delete(shard.halt)
        pipe.execute()


def lease_time(nodes: Mapping[str, Mapping[str, Any]]) -> float:
    """The longest lease time the crawl's workers advertise in their node records
    (STREAMS_LEASE_SECONDS' default with none): a request in flight ends within it."""
    times = []
    for record in nodes.values():
        try:
            times.append(float(record.get("lease_s")))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
    return max((t for t in times if t > 0), default=default_of("lease_seconds"))


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else str(value)
