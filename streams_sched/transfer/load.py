"""``streams-sched load``: a dump (or url-frontier's own) into a crawl, each line once (:class:`Loader`).

Every request goes in through enqueue.lua, the one way into a crawl, with its 'load'
keys: the target's site policies route it (task type) and cap it (page cap), dedupe
records its fingerprint, computed on the path of frontier/entries.py (``stored_fingerprint``
for a dump's requests, whose payload is kept byte for byte; ``entry_for`` for
url-frontier's lines, which are only URLs). A dead letter goes into the dead letters
of its site; a URL url-frontier calls done (known, no refetch date) is a fingerprint only.
Due times count from the load: a request due 30 s after the dump is due 30 s after
its line is loaded.

Each line is taken once, whatever happens: the file has an id (a dump's ``dump_id``; a
hash of the file for url-frontier's), and each shard keeps a ledger of the file's lines it
took (``ss:{C/#n}:#loaded:<id>``, a bitmap), which enqueue.lua (and load_site.lua, for a
site's counters and filters) reads and writes in the same call as the request. So a
load killed halfway and run again adds what the first run did not, loading a file twice
adds nothing, and this holds for requests that dedupe would not catch (``dont_filter``,
dead letters). The ledgers live ``LEDGER_TTL_S`` (30 days) and are listed in
``ss:{C}:loads``.

A line that is no line of a dump is reported (``report``) with its number and the
reason, and nothing of it is written; the load goes on with the next. A site's
policy is applied when its line is read (it comes before the site's requests); its
counters and filters after the site's requests are in (its state line comes after them).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError
from scrapy import Request

from streams_sched.frontier.batches import CALL_LIMIT, enqueue_calls
from streams_sched.frontier.client import REVISITS_STOPPED, Frontier
from streams_sched.frontier.entries import entry_for, site_for, stored_fingerprint, url_facts
from streams_sched.frontier.keys import DEAD_LETTER, SEEN_ONLY, validate_site_name
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import Call, enqueue, load_site
from streams_sched.frontier.scripts.enqueue import EnqueueReply, LoadItem, dead_extra
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.politeness.policy import POLICY_FIELDS, validate_policy
from streams_sched.transfer.inputs import BadLine, decode_line
from streams_sched.transfer.jsonvalues import unpack
from streams_sched.transfer.records import (
    BadRecord,
    End,
    Header,
    Record,
    RequestLine,
    SiteLine,
    SiteState,
    parse_record,
)
from streams_sched.wire.codec import RequestCodec

__all__ = ["LEDGER_TTL_S", "LoadSummary", "Loader"]

logger = logging.getLogger(__name__)

#: how long a shard keeps the ledger of a file's lines it took
LEDGER_TTL_S = 30 * 86400
#: lines read before their requests go out (one round trip per server)
BATCH_LINES = 2000


@dataclass
class LoadSummary:
    """What a load did."""

    file_id: str = ""
    lines: int = 0
    added: int = 0
    duplicates: int = 0
    over_cap: int = 0
    #: lines an earlier load of the file took already
    taken_before: int = 0
    dead: int = 0
    #: fingerprints recorded for URLs url-frontier called done
    done: int = 0
    policies: int = 0
    sites_restored: int = 0
    #: lines of other crawls left out (--from-crawl)
    other_crawls: int = 0
    bad: int = 0
    end: End | None = None
    seconds: float = 0.0
    flags: dict[str, int] = field(default_factory=dict)


@dataclass(slots=True)
class _Pending:
    item: LoadItem
    dead: bool
    done: bool


class Loader:
    """Loads one file's lines into ``frontier``'s crawl.

    ``file_id``: what the ledgers record the file under; ``header``: the dump's header (None:
    url-frontier's lines); ``seen``: restore the seen filters of site_state lines;
    ``from_crawl``: the crawl of the file to load (lines of others are left out; None: the
    header's, or the first line's); ``report(BadLine)`` hears of each bad line."""

    def __init__(
        self,
        frontier: Frontier,
        *,
        file_id: str,
        header: Header | None,
        fingerprinter: Any = None,
        seen: bool = True,
        from_crawl: str | None = None,
        report: Callable[[BadLine], Any] = lambda bad: None,
        progress: Callable[[LoadSummary], Any] | None = None,
        batch_lines: int = BATCH_LINES,
    ) -> None:
        from scrapy.utils.request import RequestFingerprinter

        self.frontier = frontier
        self.file_id = file_id
        self.header = header
        self.fingerprinter = fingerprinter or RequestFingerprinter()
        self.seen = seen
        self.crawl = from_crawl or (header.crawl if header is not None else None)
        self.skip_other_crawls = from_crawl is not None
        self.report = report
        self.progress = progress
        self.batch_lines = batch_lines
        self.codec = RequestCodec(None)
        self.site_of = site_keyer(frontier.crawl_meta().get("site_key") or "host")
        self.summary = LoadSummary(file_id=file_id)
        self._now_ms = 0
        self._pending: list[_Pending] = []
        self._states: list[tuple[int, SiteState]] = []
        self._state_sites: set[str] = set()
        self._shards_used: set[int] = set()
        self._valid_sites: set[str] = set()

    # -- the run ---------------------------------------------------------------------------

    def run(self, lines: Iterable[tuple[int, bytes]]) -> LoadSummary:
        """Load ``(number, raw line)``; BadInput from ``lines`` (a file cut short) is raised
        after what came before it is loaded."""
        started = time.monotonic()
        try:
            for number, raw in lines:
                try:
                    record = self._parse(number, raw)
                except BadLine as bad:
                    self.summary.lines += 1
                    self.summary.bad += 1
                    self.report(bad)
                    continue
                self.take(number, record)
        finally:
            self.close()
        self.summary.seconds = time.monotonic() - started
        return self.summary

    def take(self, number: int, record: Record) -> None:
        """Load one record, line ``number`` of the file (its bit in the ledgers): a BadLine is
        reported and counted, the rest goes out a batch at a time. Call :meth:`close` at the
        end. (A Dumper's records go straight in here: a copy from one Redis to another.)"""
        if not self._now_ms:
            self._clock()
        self.summary.lines += 1
        try:
            self._record(number, record)
        except BadLine as bad:
            self.summary.bad += 1
            self.report(bad)
        if len(self._pending) >= self.batch_lines:
            self._flush()
            if self.progress is not None:
                self.progress(self.summary)

    def close(self) -> None:
        """Send what is left, and give the ledgers their lifetime."""
        self._flush()
        self._expire_ledgers()

    def _clock(self) -> None:
        now_s, now_us = self.frontier.client.time()
        self._now_ms = int(now_s) * 1000 + int(now_us) // 1000

    def _parse(self, number: int, raw: bytes) -> Record:
        obj = decode_line(number, raw)
        try:
            return parse_record(obj)
        except BadRecord as exc:
            raise BadLine(number, str(exc)) from None

    def _record(self, number: int, record: Record) -> None:
        if isinstance(record, Header):
            if number != 1:
                raise BadLine(number, "a second header: two dumps in one file? Load each on its own")
            return
        if isinstance(record, End):
            self.summary.end = record
            return
        if isinstance(record, SiteLine):
            self._policy(number, record)
        elif isinstance(record, SiteState):
            self._site_name(number, record.site)
            self._states.append((number, record))
            self._state_sites.add(record.site)
        else:
            self._request(number, record)

    # -- lines ---------------------------------------------------------------------------

    def _site_name(self, number: int, site: str) -> None:
        if site in self._valid_sites:
            return
        try:
            validate_site_name(site)
        except ValueError as exc:
            raise BadLine(number, str(exc)) from None
        if len(self._valid_sites) > 100_000:  # a cache, not the crawl's sites
            self._valid_sites.clear()
        self._valid_sites.add(site)

    def _policy(self, number: int, line: SiteLine) -> None:
        self._site_name(number, line.site)
        typed: dict[str, Any] = {}
        for name, value in line.policy.items():
            kind = POLICY_FIELDS.get(name)
            if kind is None:
                raise BadLine(number, f"site {line.site}: unknown policy field {name!r}; known: {sorted(POLICY_FIELDS)}")
            try:
                typed[name] = (value == "1") if kind is bool else kind(value)
            except ValueError:
                raise BadLine(number, f"site {line.site}: policy {name}={value!r} is no {kind.__name__}") from None
        try:
            fields = validate_policy(line.site, typed, setting="policy")
        except ValueError as exc:
            raise BadLine(number, str(exc)) from None
        if line.site in self._state_sites:
            self._flush()
        f = self.frontier
        pipe = f.client.pipeline(transaction=False)
        f.register_sites([line.site], pipe)
        if fields:
            pipe.hset(f.site(line.site).policy, mapping=dict(fields))  # type: ignore[arg-type]
        pipe.execute()
        self.summary.policies += 1

    def _check_crawl(self, number: int, crawl: str) -> bool:
        """False: a line of another crawl, left out (--from-crawl); BadLine without it."""
        if self.crawl is None:
            self.crawl = crawl
        if crawl and crawl != self.crawl:
            if self.skip_other_crawls:
                self.summary.other_crawls += 1
                return False
            raise BadLine(number, f"a line of crawl {crawl!r}, not of this file's crawl {self.crawl!r}"
                                  " (give --from-crawl to load one crawl of a file that holds several)")
        return True

    def _request(self, number: int, line: RequestLine) -> None:
        if not self._check_crawl(number, line.crawl):
            return
        if line.foreign is not None:
            pending = self._foreign(number, line)
        else:
            pending = self._ours(number, line)
        if pending.item.entry.site in self._state_sites:
            # the site's counters and filters go in after the requests before them, not after this one
            self._flush()
        self._pending.append(pending)

    def _ours(self, number: int, line: RequestLine) -> _Pending:
        try:
            fields = unpack(line.payload)
        except Exception:  # noqa: BLE001 - a dead letter may hold anything
            fields = None
        if not isinstance(fields, dict):
            fields = {}
        u = fields.get("u")
        url: str = u if isinstance(u, str) else line.url
        site = line.site
        if line.state == "dead":
            fp = self._fingerprint(url, fields, quiet=True) if url else b""
            if not site:
                raise BadLine(number, "a dead letter without its site (info.key)")
            self._site_name(number, site)
            d = line.dead
            assert d is not None
            extra = dead_extra(d.reason, d.deliveries, d.node, d.ts_ms, d.origin_id, d.origin)
            entry = Entry(fp, DEAD_LETTER + line.stream, 0, line.payload, site, b"", url or "")
            return _Pending(LoadItem(entry, number, extra), True, False)
        if not fields:
            raise BadLine(number, "the request's payload is no msgpack map with a URL")
        try:
            fp = self._fingerprint(url, fields)
            if not fp:
                url_facts(url)  # dont_filter: no fingerprint checked the URL
        except ValueError as exc:
            raise BadLine(number, f"invalid URL {url!r}: {exc}") from None
        if not site:
            site = site_for(Request(url), self.site_of)
        self._site_name(number, site)
        delay = max(0, line.due_in_ms) if line.state in ("delayed", "tracked") else 0
        entry = Entry(fp, line.stream, delay, line.payload, site, b"", url)
        return _Pending(LoadItem(entry, number, str(line.deliveries) if line.deliveries else ""), False, False)

    def _fingerprint(self, url: str, fields: Mapping[Any, Any], quiet: bool = False) -> bytes:
        headers, method, body = fields.get("h"), fields.get("m"), fields.get("b")
        try:
            return stored_fingerprint(
                url, self.fingerprinter, method=method if isinstance(method, str) else None,
                body=body if isinstance(body, bytes) else b"",
                headers=[(k, v) for k, v in headers] if isinstance(headers, list) else None,
                dont_filter=fields.get("df") is True,
            )
        except (ValueError, TypeError):
            if quiet:
                return b""
            raise

    def _foreign(self, number: int, line: RequestLine) -> _Pending:
        """A line of url-frontier's own dump: a URL, its queue key, its metadata."""
        meta: dict[str, Any] = {"url_frontier": line.foreign} if line.foreign else {}
        try:
            url_facts(line.url)
        except ValueError as exc:
            raise BadLine(number, f"invalid URL {line.url!r}: {exc}") from None
        host_site = site_for(Request(line.url), self.site_of)
        if line.site and line.site != host_site:
            try:
                validate_site_name(line.site)
                meta["site"] = line.site  # url-frontier's queue key is the site
            except ValueError:
                pass  # a key that is no site name (a URL as key): the URL's host then
        if line.refetch_s and not line.done:
            meta["not_before"] = float(line.refetch_s)
        try:
            request = Request(line.url, meta=meta or None)
            entry = entry_for(request, self.codec, self.fingerprinter, site_of=self.site_of,
                              now=lambda: self._now_ms / 1000.0)
        except (ValueError, TypeError) as exc:
            raise BadLine(number, f"{type(exc).__name__}: {exc}") from None
        if line.done:
            entry.stream = SEEN_ONLY
        return _Pending(LoadItem(entry, number), False, line.done)

    # -- writing ------------------------------------------------------------------------------

    def _flush(self) -> None:
        if self._pending:
            self._send(self._pending)
            self._pending = []
        if self._states:
            self._restore(self._states)
            self._states = []
            self._state_sites = set()

    def _send(self, pending: list[_Pending]) -> None:
        f = self.frontier
        kinds = {id(p.item): p for p in pending}
        calls = enqueue_calls([p.item for p in pending], f.shards, CALL_LIMIT, site_of=lambda it: it.entry.site)
        # a dump's requests whose sites get the dump's seen filters after them were each
        # accepted once: none is dropped as seen (a Bloom filter's false positive would)
        keep = self.seen and self.header is not None and self.header.seen
        built = [enqueue.load_call(f, parts, self.file_id, keep) for parts in calls]
        for parts in calls:
            self._shards_used.add(f.site(parts[0][0]).shard)
        replies = self._run(built)
        s = self.summary
        for parts, reply in zip(calls, replies, strict=True):
            for (_, items), part in zip(parts, reply, strict=True):
                for it, flag in zip(items, part.flags.decode(), strict=True):
                    s.flags[flag] = s.flags.get(flag, 0) + 1
                    p = kinds[id(it)]
                    if flag == "l":
                        s.taken_before += 1
                    elif flag == "c":
                        s.over_cap += 1
                    elif p.done:
                        s.done += flag == "s"
                        s.duplicates += flag == "0"
                    elif flag == "1":
                        if p.dead:
                            s.dead += 1
                        else:
                            s.added += 1
                    elif flag == "0":
                        s.duplicates += 1

    def _run(self, built: list[Call[list[EnqueueReply]]]) -> list[list[EnqueueReply]]:
        """The calls in one pipeline (a cluster client sends each server its own); a call the
        server refused for want of the script, or for a slot that moved, runs again on its
        own: its ledger makes that safe, whatever it did."""
        f = self.frontier
        pipe = f.client.pipeline(transaction=False)
        for call in built:
            call.queue(pipe)
        raw = pipe.execute(raise_on_error=False)
        out = []
        for call, reply in zip(built, raw, strict=True):
            if isinstance(reply, NoScriptError) or (isinstance(reply, Exception) and _moved(reply)):
                out.append(call.run())
            elif isinstance(reply, Exception):
                raise reply
            else:
                out.append(call.parse(reply))
        return out

    def _restore(self, states: list[tuple[int, SiteState]]) -> None:
        f = self.frontier
        for number, state in states:
            k = f.site(state.site)
            shard = k.index
            self._shards_used.add(k.shard)
            stats = {name: value for name, value in state.stats.items() if name in ("pages", "tracked", "tdemand", "stretch")}
            seen: list[tuple[str, str, int]] = []
            if self.seen:
                try:
                    self._fits(state)
                except BadLine as bad:
                    self.summary.bad += 1
                    self.report(BadLine(number, bad.reason))
                    continue
                for i, key in enumerate(state.seen):
                    scratch = shard.scratch(f"load:{self.file_id}:{number}:{i}")
                    self._write_scratch(scratch, key.kind, key.value)
                    seen.append((scratch, f"{k.base}:{key.suffix}", key.pttl_ms))
            if load_site.call(f, state.site, shard.ledger(self.file_id), number, stats, seen).run():
                self.summary.sites_restored += 1
            else:
                self.summary.taken_before += 1

    def _fits(self, state: SiteState) -> None:
        """BadLine unless the site's filters can go into this crawl: an exact set goes into any,
        a Bloom filter only into a crawl of the same back-end and sizing."""
        b = self.frontier.bloom
        theirs = self.header.dedupe if self.header is not None else {}
        for key in state.seen:
            if key.kind == "MBbloom--" and b.mode != "bf":
                kind = "a RedisBloom filter"
            elif key.kind == "hash" and "layers" in key.value and (
                b.mode != "bitmap" or theirs.get("bloom_error_rate") != repr(b.error_rate)
                or theirs.get("bloom_capacity") != str(b.capacity) or theirs.get("bloom_expansion") != str(b.expansion)
            ):
                kind = "a bitmap Bloom filter of other sizing" if b.mode == "bitmap" else "a bitmap Bloom filter"
            else:
                continue
            raise BadLine(0, (
                f"site {state.site}'s seen filter is {kind}, and crawl {self.frontier.crawl!r} dedupes with"
                f" {'RedisBloom' if b.mode == 'bf' else 'the bitmap filter'} (error rate {b.error_rate:g}, capacity"
                f" {b.capacity}): its requests are loaded, its filter and counters are not; load with --no-seen, or"
                " into a new crawl on a Redis with the dump's back-end"))

    def _write_scratch(self, key: str, kind: str, value: Any) -> None:
        client = self.frontier.client
        client.delete(key)
        if kind == "string":
            step = 1 << 20
            client.set(key, value[:step], px=3_600_000)
            for i in range(step, len(value), step):
                client.append(key, value[i : i + step])
        elif kind == "hash":
            if value:
                client.hset(key, mapping=value)
            client.pexpire(key, 3_600_000)
        else:
            for it, data in value:
                client.execute_command("BF.LOADCHUNK", key, it, data)  # type: ignore[no-untyped-call]
            client.pexpire(key, 3_600_000)

    def _expire_ledgers(self) -> None:
        f = self.frontier
        if not self._shards_used:
            return
        pipe = f.client.pipeline(transaction=False)
        for n in sorted(self._shards_used):
            pipe.expire(f.shard(n).ledger(self.file_id), LEDGER_TTL_S)
        pipe.execute()


def _moved(exc: Exception) -> bool:
    text = str(exc)
    return text.startswith(("MOVED", "ASK")) or type(exc).__name__ in ("MovedError", "AskError")


# -- setting the crawl up -------------------------------------------------------------------

class SeenConflict(ValueError):
    """The file's seen filters cannot go into this crawl (another dedupe back-end or sizing)."""


def prepare_crawl(frontier: Frontier, header: Header | None, *, seen: bool, has_bloom: bool, shards: int,
                  file_name: str, file_id: str) -> bool:
    """Make the crawl ready for the file: registered, its layout, its site key and default
    policy from the header, and, when the file's seen filters go in, the dump's dedupe
    back-end and sizing (they must agree with the crawl's: SeenConflict). Returns whether
    the filters go in."""
    client = frontier.client
    meta = frontier.keys.meta
    take_seen = bool(seen and header is not None and header.seen)
    if take_seen and header is not None:
        if not client.hexists(frontier.keys.loads, file_id) and any(
            int(n) for n in _pipe_scard(frontier)
        ):
            raise SeenConflict(
                f"crawl {frontier.crawl!r} has sites already, and the dump's seen filters would replace theirs (what"
                " the crawl saw would be forgotten): load with --no-seen (dedupe then takes the dump's requests as it"
                " takes any), or into a new crawl name"
            )
        theirs = dict(header.dedupe)
        if theirs.get("dedupe") == "bf" and not has_bloom:
            # exact sets (a site's first 1,024 fingerprints) go into any crawl; a site whose
            # filter is a RedisBloom one is refused line by line (Loader._restore)
            theirs.pop("dedupe")
        recorded = frontier.crawl_meta()
        if "dedupe" in recorded:
            windows = ("revisit_seconds", "revisit_buckets")
            differ = {k: (recorded.get(k), v) for k, v in theirs.items() if k in windows and recorded.get(k) not in (None, v)}
            if differ:
                raise SeenConflict(
                    f"crawl {frontier.crawl!r} keeps its seen filters by {', '.join(f'{k}={a}' for k, (a, _) in differ.items())},"
                    f" the dump's by {', '.join(f'{k}={b}' for k, (_, b) in differ.items())}: load with --no-seen (dedupe"
                    " then knows the loaded requests only), into a new crawl name, or purge the crawl first"
                )
        else:
            for k, v in theirs.items():
                client.hsetnx(meta, k, v)
    frontier.ensure_layout(shards)
    if header is not None:
        client.hsetnx(meta, "site_key", header.site_key)
        if header.defaults:
            client.hset(meta, mapping=dict(header.defaults))  # type: ignore[arg-type]
        if header.revisits_stopped:
            client.hset(meta, REVISITS_STOPPED, "1")
    frontier.register()
    client.hset(frontier.keys.loads, file_id, json.dumps(
        {"file": file_name, "crawl": header.crawl if header else "", "dump_id": header.dump_id if header else "",
         "ledger_ttl_s": LEDGER_TTL_S}, sort_keys=True))
    return take_seen


def _pipe_scard(frontier: Frontier) -> list[Any]:
    """The number of sites in each shard's registry, in one round trip."""
    pipe = frontier.client.pipeline(transaction=False)
    for shard in frontier.shard_keys():
        pipe.scard(shard.sites)
    return list(pipe.execute())
