"""Sending the Seeder's batches: prepare, write, read the replies, wait for a replica.

:meth:`Sender.prepare` drops what a migrated scrapy-redis dupefilter saw and groups the
rest into enqueue.lua calls (frontier/batches.py, as every producer does), packed by
packing.py; :meth:`Sender.send` writes them on the run's links (wire.py), and
:meth:`Sender.finish` reads the replies, waits until a replica of each primary has the
batch, and says which URLs were added.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.connect.clients import TRANSIENT, refresh_topology
from streams_sched.connect.replicas import Verdict
from streams_sched.errors import CrawlMoved, RedisUnavailable
from streams_sched.frontier.batches import CallParts, drop_legacy_seen, enqueue_calls
from streams_sched.frontier.keys import CrawlKeys, ShardKeys
from streams_sched.frontier.moves import moved_in_error
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import Call, enqueue
from streams_sched.frontier.seeding.packing import Batch, Packed, Packer
from streams_sched.frontier.seeding.wire import Wire, bulk, is_moved, unpack

if TYPE_CHECKING:
    from streams_sched.frontier.seeding.seeder import Seeder

__all__ = ["SeedKeys", "SeedResult", "Sender"]


def _as_sent(reply: Any) -> Any:
    """A packed call's reply stays as Redis sent it, like those read off the wire."""
    return reply


class SeedKeys:
    """Whether the next batch goes with enqueue.lua's 'seed' keys (a site's stats and
    filters only), from what the last batches sent that way came back with.

    A new site in the common case needs no more, and Redis takes each key passed at a
    cost; a registered site comes back untouched and is sent again with all its keys.
    So while most sites are new (a broad crawl being seeded) batches go with 'seed'
    keys. When more than :attr:`MOST` of a batch comes back (seeding a crawl that has
    those sites already), the next :attr:`PAUSE` batches go with all keys and one tries
    again; each try that comes back too doubles the pause, up to :attr:`LONGEST`, so
    seeding known sites pays for a try in well under 1% of its batches."""

    #: the share of a batch's sites sent again above which 'seed' keys cost more than they save
    MOST = 0.25
    #: batches sent with all keys after a batch that mostly came back
    PAUSE = 64
    LONGEST = 4096

    def __init__(self) -> None:
        self._left = 0
        self._pause = self.PAUSE

    def seed(self) -> bool:
        """True: send the next batch with 'seed' keys."""
        if self._left:
            self._left -= 1
            return False
        return True

    def saw(self, sites: int, again: int) -> None:
        """A batch had ``sites`` sites in calls with 'seed' keys, and ``again`` of them came back."""
        if not sites:
            return
        if again > self.MOST * sites:
            self._left = self._pause
            self._pause = min(2 * self._pause, self.LONGEST)
        else:
            self._pause = self.PAUSE


@dataclass
class SeedResult:
    """What one :meth:`Seeder.seed` call did: URLs added, URLs that were duplicates."""

    added: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)

    def __iadd__(self, other: SeedResult) -> SeedResult:
        self.added += other.added
        self.duplicates += other.duplicates
        return self


class Sender:
    """Sends the batches of one :class:`Seeder` (reads its client, frontier and legacy SET)."""

    def __init__(self, seeder: Seeder) -> None:
        self.seeder = seeder
        self.packer = Packer(seeder.frontier)
        self.keys = SeedKeys()

    def prepare(self, entries: list[Entry], wire: Wire, register: bool) -> Batch:
        """A batch's enqueue.lua calls, one per shard, packed for the primaries of ``wire``
        (after dropping what a migrated scrapy-redis dupefilter saw)."""
        s = self.seeder
        entries, dropped = drop_legacy_seen(s.client, s.legacy, entries)
        calls = self.packer.pack(enqueue_calls(entries, s.frontier.shards, None), wire.node_of, self.keys.seed())
        return Batch(calls, [e.url for e in dropped], CrawlKeys.registry() if register else None)

    def send(self, wire: Wire, batch: Batch) -> None:
        """Write a batch's calls (after the crawl's registration, on the first) on the links
        of their primaries, one write per primary. :meth:`read` reads in the same order."""
        out: dict[str, list[bytes]] = defaultdict(list)
        if batch.register is not None:
            sadd = b"*3\r\n" + bulk(b"SADD") + bulk(batch.register.encode()) + bulk(self.seeder.crawl.encode())
            batch.register_node = wire.node_of(batch.register)
            out[batch.register_node].append(sadd)
        for call in batch.calls:
            out[call.node].append(call.command)
        try:
            for node, commands in out.items():
                wire.link(node).write(commands)
        except TRANSIENT:
            refresh_topology(self.seeder.client)
            raise

    def read(self, wire: Wire, batch: Batch) -> None:
        """Read a batch's replies; calls the server refused to run (scripts lost, slot moved)
        run again on their own."""
        redo: list[Packed] = []
        try:
            if batch.register is not None:
                reply = wire.link(batch.register_node).read()
                if isinstance(reply, Exception):
                    raise reply
            for call in batch.calls:
                call.reply = reply = wire.link(call.node).read()
                if isinstance(reply, NoScriptError) or (isinstance(reply, ResponseError) and is_moved(reply)):
                    redo.append(call)
                elif isinstance(reply, Exception):
                    to = moved_in_error(reply)
                    if to is not None:
                        raise CrawlMoved(self.seeder.crawl, to) from None
                    raise reply
        except TRANSIENT:
            refresh_topology(self.seeder.client)
            raise
        if redo:
            # Nothing of a call that got NOSCRIPT or MOVED ran (the whole call is one
            # script on one slot): load the scripts (a new master after a failover, a
            # restart, SCRIPT FLUSH), learn where the slots are, and run those calls again.
            if any(is_moved(c.reply) for c in redo):
                refresh_topology(self.seeder.client)
            self.seeder.frontier.load_scripts()
            for call in redo:
                call.reply = self.run(call)

    def _send_again(self, wire: Wire, batch: Batch) -> None:
        """Send the sites a call with 'seed' keys left untouched (registered ones, or ones that
        need more keys) again with all their keys, and put their replies in its reply.

        They go on links of their own, not on the run's: the next batch may be on its way
        there already. So a site sent again can land after that next batch's part of it;
        dedupe is not affected."""
        again: CallParts = []
        seeded = 0
        for call in batch.calls:
            if call.seed:
                seeded += len(call.parts)
                again += [part for part, reply in zip(call.parts, call.reply, strict=True) if not reply]
        self.keys.saw(seeded, len(again))
        if not again:
            return
        calls = enqueue_calls((e for _, items in again for e in items), self.seeder.frontier.shards, None)
        more = Batch(self.packer.pack(calls, wire.node_of))
        side = Wire(self.seeder.client)
        try:
            self.send(side, more)
            self.read(side, more)
        finally:
            side.close()
        batch.again = more.calls
        replies: dict[str, Any] = {}
        for call in more.calls:
            for (site, _), reply in zip(call.parts, call.reply, strict=True):
                replies[site] = reply
        for call in batch.calls:
            if call.seed:
                call.reply = [reply or replies[site] for (site, _), reply in zip(call.parts, call.reply, strict=True)]

    def run(self, call: Packed) -> Any:
        """Run one call through redis-py (it reloads a lost script, follows a moved slot)."""
        command = unpack(call.command)
        nkeys = int(command[2])
        keys, args = [k.decode() for k in command[3 : 3 + nkeys]], command[3 + nkeys :]
        return Call(self.seeder.frontier.scripts["enqueue"], keys, list(args), _as_sent).run()

    def finish(self, wire: Wire, batch: Batch) -> SeedResult:
        """Read a batch's replies, wait until a replica has it, and say what was added."""
        self.read(wire, batch)
        self._send_again(wire, batch)
        self.replicated(batch)
        result = SeedResult(duplicates=list(batch.duplicates))
        added, dups = result.added, result.duplicates
        one = ord("1")
        for call in batch.calls:
            for (_site, items), part in zip(call.parts, call.reply, strict=True):
                flags = enqueue.flags_of(part)
                if len(items) == 1 and len(flags) == 1:  # most sites of a broad seeding
                    (added if flags == b"1" else dups).append(items[0].url)
                    continue
                for e, flag in zip(items, flags, strict=True):
                    (added if flag == one else dups).append(e.url)
        return result

    def replicated(self, batch: Batch) -> None:
        """Return once what a batch wrote is on a replica of each primary that took it (where
        the primary has one), so that what :meth:`Seeder.send` reports as added survives a
        failover. A primary that is gone or replaced gets the batch again (dedupe makes
        that safe)."""
        s = self.seeder
        guard, f = s.replicas, s.frontier
        if not batch.calls and batch.register is None:
            return
        targets = {guard.primary_of(ShardKeys(s.crawl, c.shard).sync): ShardKeys(s.crawl, c.shard).sync for c in batch.calls}
        targets.setdefault(guard.primary_of(f.keys.sync), f.keys.sync)  # the crawl registry
        deadline = time.monotonic() + s.replica_timeout_s
        for primary, key in targets.items():
            while True:
                now = time.monotonic()
                if not guard.checks_writes(primary, now):
                    break
                verdict = guard.barrier(primary, key, now)
                if verdict is Verdict.PASS:
                    break
                if now > deadline:
                    raise RedisUnavailable(
                        f"seeds of crawl {s.crawl!r} are on Redis primary {primary or '(this server)'} but on"
                        f" none of its replicas after {s.replica_timeout_s:g}s: a failover would lose them."
                        " Seed again once the replica is back (seeding is idempotent), or pass min_replicas=0"
                    )
                if verdict is Verdict.RESEND:
                    self._resend(batch)
                time.sleep(0.05)

    def _resend(self, batch: Batch) -> None:
        """The primary was replaced: register and send the batch again (if it is there yet)."""
        s = self.seeder
        refresh_topology(s.client)
        try:
            s.client.sadd(CrawlKeys.registry(), s.crawl)
            for call in (*batch.calls, *batch.again):
                self.run(call)
        except TRANSIENT:
            pass  # the new primary is not there yet: try again
