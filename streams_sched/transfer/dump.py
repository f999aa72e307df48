"""``streams-sched dump``: a crawl as JSON Lines, read while its workers run (:class:`Dumper`).

The dump goes shard by shard. For each shard it starts the shard's journal
(journal.py), reads every site of the shard's registry at one point in time each
(sitereader.py) and writes the site's lines: its policy, its requests (queued, leased
ones as queued, delayed, tracked, dead), its counters and, with ``seen``, its seen
filters. Then it writes the journal's entries that came after their site's read (or
whose site it never read: a site new since the registry was scanned), and from then on
all of that journal's entries, until it stops every journal at the end and writes the
last line. So the dump holds each request of a site as the site was at its read, and
every request added to the crawl after that read, until the dump's end: the follow-ups
of a page acked during the dump are in it, whichever site they went to.

Memory is one round trip of small sites (``site_batch`` sites), one chunk of a big one,
and the read positions of the sites of one shard (a site name and an id each), whatever
the crawl's size.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import shard_of
from streams_sched.frontier.replies import text
from streams_sched.politeness.policy import POLICY_FIELDS
from streams_sched.transfer.journal import Journal, JournalEntry, after
from streams_sched.transfer.records import (
    DeadInfo,
    End,
    Header,
    LeaseInfo,
    Record,
    RequestLine,
    SeenKey,
    SiteLine,
    SiteState,
    request_fields,
    tracked_state,
)
from streams_sched.transfer.sitereader import SiteItem, SiteRead, SiteReader

__all__ = ["DumpSummary", "Dumper", "KEPT_STATS"]

logger = logging.getLogger(__name__)

#: a site's counters a load restores: pages accepted under its page cap, and its tracked
#: pages, their demand and stretch (ack.lua keeps them; a load adds pages without them)
KEPT_STATS = ("pages", "tracked", "tdemand", "stretch")
#: the crawl meta fields the header carries
DEDUPE_FIELDS = ("dedupe", "bloom_error_rate", "bloom_capacity", "bloom_expansion", "revisit_seconds", "revisit_buckets")


@dataclass
class DumpSummary:
    """What a dump wrote."""

    sites: int = 0
    requests: int = 0
    states: dict[str, int] = field(default_factory=dict)
    #: requests leased when their site was read (written as queued: crawled again after a load)
    leased: int = 0
    #: requests written from the journals (added after their site's read)
    journal: int = 0
    restarts: int = 0
    frozen: int = 0
    seconds: float = 0.0
    dump_id: str = ""


class Dumper:
    """Writes one crawl's dump through ``write`` (one line at a time, without its newline),
    or hands its records to ``sink`` (Header, SiteLine, RequestLine, SiteState, End, in
    the order of the lines: a copy to another Redis needs no JSON between the two,
    ``Loader.take`` takes them).

    ``sites``: only these sites (None: every site); ``seen``: with the seen filters;
    ``budget``: entries a read call reads at most; ``progress(sites done, sites, requests)``
    is called as it goes; ``before_end()`` once every site is read, before the journals'
    last entries are taken and stopped (``streams-sched move`` seals the crawl there, so
    nothing added to it before the seal is missed)."""

    def __init__(
        self,
        frontier: Frontier,
        write: Callable[[str], Any] | None = None,
        *,
        sink: Callable[[Record], Any] | None = None,
        sites: Sequence[str] | None = None,
        seen: bool = False,
        budget: int = 1000,
        source: str = "",
        server: str = "",
        version: str = "",
        progress: Callable[[int, int, int], Any] | None = None,
        spool_dir: str | None = None,
        before_end: Callable[[], Any] | None = None,
    ) -> None:
        if (write is None) == (sink is None):
            raise ValueError("a Dumper writes lines (write) or hands on records (sink): give one of them")
        self.frontier = frontier
        self.write = write
        self.sink = sink
        self._header_record: Header | None = None
        self.sites = tuple(dict.fromkeys(sites)) if sites is not None else None
        self.seen = seen
        self.budget = budget
        self.source = source
        self.server = server
        self.version = version
        self.progress = progress
        self.before_end = before_end
        self.dump_id = uuid.uuid4().hex
        self.reader = SiteReader(frontier, budget=budget, seen=seen, spool_dir=spool_dir, tag=self.dump_id[:12],
                                 on_chunk=self._alive)
        #: small sites read per round trip: their first chunks are in memory together
        self.site_batch = max(1, 50_000 // budget)
        self.summary = DumpSummary(dump_id=self.dump_id)
        self._time_ms = 0
        self._lines = 0
        self._journal_: Journal | None = None

    # -- the run ---------------------------------------------------------------------------

    def run(self) -> DumpSummary:
        started = time.monotonic()
        f = self.frontier
        journal = Journal(f, self.dump_id)
        journal.lock()
        done: list[int] = []
        written_to: dict[int, bytes] = {}
        try:
            self._header()
            shards = self._shards()
            total = self._total(shards)
            self._journal_ = journal
            for n in shards:
                journal.start(n)
                positions: dict[str, bytes] = {}
                for batch in self._batches(n, positions):
                    for read in self.reader.read(batch):
                        positions[read.site] = read.head.journal_at
                        self._site(read)
                        self.summary.sites += 1
                    journal.keep_alive()
                    if self.progress is not None:
                        self.progress(self.summary.sites, total, self.summary.requests)
                last = b""
                for entry in journal.entries(n):
                    last = entry.id
                    mark = positions.get(entry.site)
                    if mark is None or after(entry.id, mark):
                        self._journal(entry)
                if last:
                    journal.trim(n, last)
                written_to[n] = last
                del positions
                for m in done:  # every entry of a shard read earlier belongs
                    written_to[m] = self._drain(journal, m, written_to[m])
                done.append(n)
                journal.keep_alive()
            if self.before_end is not None:
                # every site is read and every journal written so far: what the caller does now
                # (a move seals the crawl) comes before the journals' last entries are taken
                self.before_end()
            for n in done:
                for entry in journal.stop(n, written_to[n]):
                    self._journal(entry)
            now_s, now_us = f.client.time()
            self._emit(End(self.summary.requests, self.summary.sites, self.summary.journal, self._lines + 1,
                           int(now_s) * 1000 + int(now_us) // 1000))
        finally:
            self._abandon(journal)
            journal.unlock()
        self.summary.restarts, self.summary.frozen = self.reader.restarts, self.reader.frozen
        self.summary.seconds = time.monotonic() - started
        if self.progress is not None:
            self.progress(self.summary.sites, self.summary.sites, self.summary.requests)
        return self.summary

    def _alive(self) -> None:
        if self._journal_ is not None:
            self._journal_.keep_alive()

    def _abandon(self, journal: Journal) -> None:
        """Delete the journals a failed dump leaves (a finished one has stopped them all)."""
        for n in list(journal.started):
            try:
                self.frontier.client.delete(self.frontier.shard(n).journal)
            except Exception:  # noqa: BLE001 - they expire by themselves anyway
                logger.warning("could not delete the journal of shard %d (it expires within a minute)", n)

    def _drain(self, journal: Journal, shard: int, start: bytes) -> bytes:
        last = start
        for entry in journal.entries(shard, start):
            last = entry.id
            self._journal(entry)
        if last != start:
            journal.trim(shard, last)
        return last

    # -- what to read ------------------------------------------------------------------------

    def _shards(self) -> list[int]:
        shards = self.frontier.shards
        if self.sites is None:
            return list(range(shards))
        return sorted({shard_of(s, shards) for s in self.sites})

    def _total(self, shards: Iterable[int]) -> int:
        if self.sites is not None:
            return len(self.sites)
        pipe = self.frontier.client.pipeline(transaction=False)
        for n in shards:
            pipe.scard(self.frontier.shard(n).sites)
        return sum(int(v) for v in pipe.execute())

    def _batches(self, shard: int, read: dict[str, bytes]) -> Iterator[list[str]]:
        """The shard's sites, ``site_batch`` at a time; ``read``: the sites read so far (SSCAN
        may name a site twice while the set is rehashed: it is read once)."""
        if self.sites is not None:
            mine = [s for s in self.sites if shard_of(s, self.frontier.shards) == shard]
            for i in range(0, len(mine), self.site_batch):
                yield mine[i : i + self.site_batch]
            return
        batch: list[str] = []
        for member in self.frontier.client.sscan_iter(self.frontier.shard(shard).sites, count=1000):
            site = text(member)
            if site in read or site in batch:
                continue
            batch.append(site)
            if len(batch) >= self.site_batch:
                yield batch
                batch = []
        if batch:
            yield batch

    # -- the lines ---------------------------------------------------------------------------

    def _emit(self, record: Record) -> None:
        if self.sink is not None:
            self.sink(record)
        else:
            assert self.write is not None
            self.write(record.line(self.frontier.crawl, self._time_ms) if isinstance(record, RequestLine)
                       else record.line())
        self._lines += 1

    def header(self) -> Header:
        """The dump's header: the crawl, this moment (Redis TIME), its dedupe and defaults;
        taken once, the first time it is asked (a copy prepares its target crawl from it
        before ``run``)."""
        if self._header_record is None:
            self._header_record = self._make_header()
        return self._header_record

    def _header(self) -> None:
        self._emit(self.header())

    def _make_header(self) -> Header:
        f = self.frontier
        now_s, now_us = f.client.time()
        self._time_ms = int(now_s) * 1000 + int(now_us) // 1000
        meta = f.crawl_meta()
        return Header(
            crawl=f.crawl, time_ms=self._time_ms, dump_id=self.dump_id, source=self.source, server=self.server,
            shards=f.shards, site_key=meta.get("site_key") or "host",
            dedupe={k: meta[k] for k in DEDUPE_FIELDS if k in meta},
            defaults={k: v for k, v in meta.items() if k.startswith("default_")},
            revisits_stopped=meta.get("revisits_stopped") == "1", seen=self.seen, sites=self.sites, version=self.version,
        )

    def _site(self, read: SiteRead) -> None:
        head, site = read.head, read.site
        policy = {k: v for k, v in head.policy.items() if k in POLICY_FIELDS}
        if policy:
            self._emit(SiteLine(site, policy))
        streams = self.frontier.site(site).streams
        for item in read.items:
            self._request(site, item, streams)
        stats = {k: v for k in KEPT_STATS if (v := head.stats.get(k)) is not None}
        if "max_pages" in policy:
            # the cap counts from where the source's count is (0 when it was set after the
            # site's requests came), not from the requests the load adds
            stats.setdefault("pages", "0")
        seen: tuple[SeenKey, ...] = ()
        if self.seen:
            base = self.frontier.site(site).base + ":"
            keys = self.reader.filters(site)
            seen = tuple(SeenKey(key[len(base):], fv.kind, fv.pttl_ms, fv.value)
                         for key, fv in zip(keys, head.filters, strict=True) if fv.kind != "none")
        if stats or seen:
            self._emit(SiteState(site, stats, seen))

    def _request(self, site: str, item: SiteItem, streams: tuple[str, ...]) -> None:
        s = self.summary
        if item.state == "dead":
            d = item.dead or {}
            origin = d.get("stream", "")
            stream = streams.index(origin) if origin in streams else 1
            dead = DeadInfo(d.get("reason", ""), _int(d.get("deliveries")), d.get("node", ""), _int(d.get("ts")),
                            d.get("id", ""), "" if origin in streams else origin)
            line = RequestLine(site, "", "dead", stream, item.payload, dead=dead)
        elif item.state == "delayed":
            state = tracked_state("delayed", item.stream, item.payload)
            line = RequestLine(site, "", state, item.stream, item.payload, due_in_ms=item.due_ms - self._time_ms)
        else:
            lease = None
            if item.lease is not None:
                lease = LeaseInfo(*item.lease)
                s.leased += 1
            line = RequestLine(site, "", "queued", item.stream, item.payload, deliveries=item.deliveries, lease=lease)
        if self.sink is not None and not line.url:
            line.url = _url_of(line.payload)  # what its line would carry
        self._emit(line)
        s.requests += 1
        if s.requests % 1000 == 0 and self._journal_ is not None:
            self._journal_.keep_alive()  # a long site takes its time: the journals must not lapse meanwhile
        s.states[line.state] = s.states.get(line.state, 0) + 1

    def _journal(self, entry: JournalEntry) -> None:
        if self.sites is not None and entry.site not in self.sites:
            return
        if entry.due_ms:
            item = SiteItem("delayed", entry.stream, entry.payload, due_ms=entry.due_ms)
        else:
            item = SiteItem("queued", entry.stream, entry.payload)
        self._request(entry.site, item, self.frontier.site(entry.site).streams)
        self.summary.journal += 1


def _int(value: Any) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0


def _url_of(payload: bytes) -> str:
    fields = request_fields(payload)
    return fields[1] if fields is not None else ""
