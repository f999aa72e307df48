"""One site's requests at one point in time, streamed: :class:`SiteReader`.

A dump reads each site once, while workers lease, ack and add to it. What it writes of a
site must be the site as it was at one moment: each request once, none lost because it
moved (a lease handed back goes to the end of its stream under a new id; a delayed
request is promoted into a stream; a dead letter is requeued), and the moment is where the
shard's journal stood (``SiteHead.journal_at``), so that the dump takes from the journal
exactly what came after it.

- A site of at most ``budget`` entries (streams, delayed, dead letters; most sites of a
  broad crawl) is read in one read_site.lua call: atomic, so it is that moment. Many
  such sites go in one round trip per server.
- A bigger site is read a chunk of ``budget`` entries at a time. The first chunk's call is
  the moment; each later call checks, atomically with its chunk, that nothing the reader
  has yet to read can have moved since (:func:`moved`): no stream was leased past the
  reader's cursor (undelivered entries do not move: only a leased one is handed back,
  failed, requeued or dead-lettered), and while delayed requests or dead letters are left
  to read, none was promoted, revisited, stopped or requeued. Entries a stream took after
  the moment are past its last id then, and delayed requests enqueued after it have a
  higher sequence number: neither is read (the journal has them). What a chunked read
  yields is spooled to a temporary file until its last chunk checked out.
- A site whose chunked read failed the check ``retries + 1`` times is copied whole in one
  call (freeze_site.lua: COPY, about 0.15 us per stream entry and 1 us per delayed member
  of Redis time), and the copies are read at leisure.

``move`` (and any other reader of a crawl) uses it as the dump does: ``for read in
reader.read(sites): read.head ...; for item in read.items: ...``, each site's items
iterated before the next site is asked for. Memory is one chunk and one round trip of
small sites, whatever the size of a site.
"""

from __future__ import annotations

import logging
import tempfile
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

import msgpack

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.scripts import freeze_site, read_site
from streams_sched.frontier.scripts.read_site import DONE, LOST, Checks, Chunk, Cursors, SiteHead

__all__ = ["DELAYED_MOVES", "DLQ_MOVES", "SiteItem", "SiteRead", "SiteReader", "inbox_items", "moved"]

logger = logging.getLogger(__name__)

#: counters that say a delayed request left its ZSET or one was put there outside enqueue:
#: promoted into a stream, rescheduled by an ack (revisits), stopped (tracked), dead-lettered
#: as malformed (dead)
DELAYED_MOVES = ("promoted", "revisits", "tracked", "dead")
#: a dead letter requeued into a stream
DLQ_MOVES = ("dlq_requeued",)


@dataclass(slots=True)
class SiteItem:
    """A request of the site as read: ``state`` queued (in its inbox or a stream, leased or
    not), delayed (``due_ms``, Redis time) or dead (``dead``: the letter's fields)."""

    state: str
    stream: int
    payload: bytes
    deliveries: int = 0
    #: (consumer, ms it had held it, deliveries) of a leased entry
    lease: tuple[str, int, int] | None = None
    due_ms: int = 0
    dead: dict[str, str] | None = None

    def packed(self) -> list[Any]:
        return [self.state, self.stream, self.payload, self.deliveries, self.lease, self.due_ms, self.dead]


@dataclass
class SiteRead:
    """A site as read at one moment: its head (that moment's state: where the journal stood,
    policy, counters, seen filters) and its requests, to iterate once."""

    site: str
    head: SiteHead
    items: Iterable[SiteItem]
    #: read from a frozen copy (freeze_site.lua), after the chunked read failed its checks
    frozen: bool = False
    #: chunked reads started over
    restarts: int = 0
    chunks: int = 1
    _close: list[Any] = field(default_factory=list, repr=False)


def _id(value: bytes) -> tuple[int, int]:
    ms, _, seq = value.partition(b"-")
    return int(ms or 0), int(seq or 0)


def moved(head: SiteHead, before: Cursors, checks: Checks, chunk: Chunk) -> str | None:
    """Why the chunk read from ``before`` cannot be taken as part of the site as ``head`` saw
    it, or None when it can (see the module docstring)."""
    for s, ((cursor, last), delivered) in enumerate(zip(before.streams, checks.delivered, strict=True)):
        if cursor == DONE or not last:
            continue
        if delivered and _id(delivered) > _id(cursor or b"0-0"):
            return f"stream {s} was leased past the reader ({delivered.decode()} > {(cursor or b'start').decode()})"
    if before.delayed != DONE:
        if chunk.delayed_next == LOST:
            return "the delayed request the reader stood at is gone"
        changed = [f for f in DELAYED_MOVES if checks.stats.get(f) != head.stats.get(f)]
        if changed:
            return f"delayed requests moved ({', '.join(changed)} changed)"
    if before.dead[0] != DONE:
        changed = [f for f in DLQ_MOVES if checks.stats.get(f) != head.stats.get(f)]
        if changed:
            return "dead letters were requeued"
    return None


def inbox_items(packed: bytes) -> list[SiteItem]:
    """The queued requests of a site's inbox value (cmsgpack: stream code, payload, ...)."""
    if not packed:
        return []
    unpacker = msgpack.Unpacker(raw=True, strict_map_key=False)
    unpacker.feed(packed)
    try:
        flat = next(unpacker)
    except (StopIteration, ValueError, msgpack.UnpackException):
        logger.warning("an inbox value that cmsgpack did not write: skipped")
        return []
    if not isinstance(flat, list):
        return []
    return [SiteItem("queued", int(flat[i]) - 1, bytes(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def chunk_items(chunk: Chunk, now_ms: int, delay_seq: int | None) -> Iterator[SiteItem]:
    """The requests of a chunk. A delayed member enqueued after the moment (sequence number
    above ``delay_seq``) is left out: the journal has it."""
    for s, part in enumerate(chunk.streams):
        for entry_id, fields in part.entries:
            payload = fields.get(b"r")
            if payload is None:
                continue  # no payload: nothing a worker could crawl (it dead-letters such an entry)
            try:
                d = int(fields.get(b"d", b"0"))
            except ValueError:
                d = 0
            held = part.pending.get(entry_id)
            yield SiteItem("queued", s, payload, d, held)
    for member, score in chunk.delayed:
        code, seq, payload = (member.split(b":", 2) + [b"", b""])[:3]
        try:
            stream = int(code) - 1
        except ValueError:
            continue
        if seq and delay_seq is not None and int(seq) > delay_seq:
            continue
        yield SiteItem("delayed", stream, payload, due_ms=int(score))
    for _, letter in chunk.dead:
        f = {_text(k): v for k, v in letter.items()}
        yield SiteItem("dead", -1, f.get("r", b""), dead={k: _text(v) for k, v in f.items() if k != "r"})


def _delay_seq(head: SiteHead) -> int | None:
    raw = head.stats.get("delay_seq")
    return int(raw) if raw else 0


class SiteReader:
    """Reads sites of one crawl, each at one point in time (see the module docstring).

    ``budget``: entries a call reads at most; ``seen``: read the seen filters with the
    head; ``spool_dir``: where a chunked read's spool goes (the system's temp dir).
    """

    def __init__(self, frontier: Frontier, *, budget: int = 1000, seen: bool = False, retries: int = 2,
                 spool_dir: str | None = None, tag: str | None = None,
                 on_chunk: Callable[[], Any] | None = None) -> None:
        if budget < 1:
            raise ValueError(f"budget must be at least 1, not {budget}")
        self.frontier = frontier
        self.budget = budget
        self.seen = seen
        self.retries = retries
        self.spool_dir = spool_dir
        #: names this reader's frozen copies (scratch keys)
        self.tag = tag or uuid.uuid4().hex[:12]
        self.restarts = 0
        self.frozen = 0
        #: called after each chunk of a long site (a dump renews its journals there)
        self.on_chunk = on_chunk or (lambda: None)

    def filters(self, site: str) -> list[str]:
        return self.frontier.filters(site) if self.seen else []

    def read(self, sites: Sequence[str]) -> Iterator[SiteRead]:
        """Each site of ``sites`` as read at one moment, in order (the small ones in one
        round trip per server). Iterate a read's items before asking for the next one."""
        f = self.frontier
        calls = {s: read_site.call(f, s, self.budget, filters=self.filters(s)) for s in dict.fromkeys(sites)}
        firsts = f.run_many(calls)
        for site in calls:
            head, chunk = firsts[site]
            assert isinstance(head, SiteHead)
            if chunk.done:
                yield SiteRead(site, head, self._whole(head, chunk))
            else:
                read = self._chunked(site, head, chunk)
                try:
                    yield read
                finally:
                    for close in read._close:
                        close()

    def _whole(self, head: SiteHead, chunk: Chunk) -> list[SiteItem]:
        return [*inbox_items(head.inbox), *chunk_items(chunk, head.now_ms, _delay_seq(head))]

    def _chunked(self, site: str, head: SiteHead, chunk: Chunk) -> SiteRead:
        f = self.frontier
        for attempt in range(self.retries + 1):
            if attempt:
                self.restarts += 1
                head_, chunk = read_site.call(f, site, self.budget, filters=self.filters(site)).run()
                assert isinstance(head_, SiteHead)
                head = head_
                if chunk.done:
                    return SiteRead(site, head, self._whole(head, chunk), restarts=attempt)
            spool = tempfile.TemporaryFile(dir=self.spool_dir)  # noqa: SIM115 - closed by the read
            count = self._spool(spool, self._whole(head, chunk))
            cursors = read_site.start_cursors(head).after(chunk)
            chunks, why = 1, None
            while not chunk.done:
                before = cursors
                checks, chunk = read_site.call(f, site, self.budget, cursors).run()
                assert isinstance(checks, Checks)
                why = moved(head, before, checks, chunk)
                if why is not None:
                    break
                count += self._spool(spool, chunk_items(chunk, head.now_ms, _delay_seq(head)))
                cursors = cursors.after(chunk)
                chunks += 1
                self.on_chunk()
            if why is None:
                logger.debug("site %s: %d requests in %d chunks", site, count, chunks)
                return SiteRead(site, head, self._unspool(spool), restarts=attempt, chunks=chunks,
                                _close=[spool.close])
            spool.close()
            logger.info("site %s moved while it was read (%s): reading it again", site, why)
        return self._frozen(site)

    def _frozen(self, site: str) -> SiteRead:
        f = self.frontier
        self.frozen += 1
        to = freeze_site.copies(f.site(site), f"{self.tag}:{site}")
        head = freeze_site.call(f, site, to, self.filters(site)).run()
        logger.info("site %s: read from a copy taken at once (it moved under every chunked read)", site)

        def items() -> Iterator[SiteItem]:
            yield from inbox_items(head.inbox)
            cursors = read_site.start_cursors(head)
            while True:
                _, chunk = read_site.call(f, site, self.budget, cursors, k=to).run()
                yield from chunk_items(chunk, head.now_ms, _delay_seq(head))
                self.on_chunk()
                if chunk.done:
                    return
                cursors = cursors.after(chunk)

        def drop() -> None:
            f.client.delete(to.delayed)
            f.client.delete(to.dlq)
            for key in to.streams:
                f.client.delete(key)

        return SiteRead(site, head, items(), frozen=True, _close=[drop])

    @staticmethod
    def _spool(spool: IO[bytes], items: Iterable[SiteItem]) -> int:
        n = 0
        pack = msgpack.Packer(use_bin_type=True).pack
        for item in items:
            spool.write(pack(item.packed()))
            n += 1
        return n

    @staticmethod
    def _unspool(spool: IO[bytes]) -> Iterator[SiteItem]:
        spool.seek(0)
        for state, stream, payload, deliveries, lease, due_ms, dead in msgpack.Unpacker(spool, raw=False):
            yield SiteItem(state, stream, payload, deliveries, tuple(lease) if lease else None, due_ms, dead)
