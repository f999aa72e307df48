"""The frontier as data: dump, load and url against real Redis, in-process (subprocess tests are in test_transfer_e2e.py)."""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import msgpack
import pytest
from scrapy import Request
from test_codec import VALUES, MySpider

from streams_sched.frontier.keys import DEAD_LETTER, SEEN_ONLY, STREAMS
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import enqueue, read_lua, read_site
from streams_sched.frontier.scripts.read_site import (
    DONE,
    SNAPSHOT_STATS,
    Checks,
    Chunk,
    Cursors,
    SiteHead,
    StreamPart,
)
from streams_sched.transfer import jsonvalues
from streams_sched.transfer.dump import Dumper
from streams_sched.transfer.records import BadRecord, RequestLine, parse_record, payload_of, request_fields
from streams_sched.transfer.sitereader import SiteReader, moved
from streams_sched.wire.codec import RequestCodec

from transfer_helpers import (
    build_crawl,
    cli,
    comparable,
    dues,
    dump_lines,
    fresh,
    frontier_of,
    records,
    write_dump,
)

# -- the format, without Redis ------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(VALUES))
def test_every_value_of_the_codec_is_written_as_json_and_read_back_byte_for_byte(key: str) -> None:
    """Each kind of meta and cb_kwargs value the codec carries (extension types, items, maps JSON cannot write) becomes JSON that packs back into the same payload bytes."""
    codec = RequestCodec(MySpider())
    payload = codec.encode(Request("http://a.test/", meta={"v": VALUES[key]}, cb_kwargs={"w": VALUES[key]}))
    fields, url = request_fields(payload)  # type: ignore[misc]
    text = json.dumps(fields)
    assert payload_of(url, json.loads(text)) == payload


def test_a_payload_the_json_cannot_carry_exactly_travels_as_it_is() -> None:
    """A payload packed otherwise than msgpack-python packs (a float32, a str body) is carried base64 and comes back exact."""
    odd = msgpack.packb({"u": "http://a.test/", "mt": {"f": 1.5}, "b": "text body"}, use_single_float=True)
    line = RequestLine("a.test", "", "queued", 1, odd).line("c", 0)
    back = parse_record(json.loads(line))
    assert isinstance(back, RequestLine) and back.payload == odd
    assert "ss.payload" in json.loads(line)["discovered"]["info"]["metadata"]


def test_json_values_refuse_what_a_dump_never_writes() -> None:
    """An unknown $tag, a $map of lists, bad base64 and a $float that is no float are refused by name, not evaluated."""
    for bad in ({"$eval": "1"}, {"$map": [[[1], 2]]}, {"$bytes": "!!"}, {"$float": "1e999"}, {"$class": 1, "x": 2}):
        with pytest.raises(jsonvalues.JsonValueError):
            jsonvalues.from_json(bad)


def test_a_request_line_is_a_url_frontier_urlitem() -> None:
    """Request lines hold only URLItem's fields (url, key, metadata of string lists, crawlID, refetchable_from_date), so url-frontier's PutURLs takes them."""
    payload = RequestCodec(None).encode(Request("http://a.test/x", meta={"k": (1, 2)}))
    for state, due in (("queued", 0), ("delayed", 5000), ("tracked", 60_000), ("dead", 0)):
        line = RequestLine("a.test", "", state, 1, payload, due_in_ms=due).line("shop", 1_700_000_000_000)
        obj = json.loads(line)
        assert set(obj) <= {"discovered", "known", "ID"}
        item = obj.get("discovered") or obj["known"]
        assert set(item) <= {"info", "refetchable_from_date"}
        info = item["info"]
        assert set(info) == {"url", "key", "metadata", "crawlID"}
        assert (info["url"], info["key"], info["crawlID"]) == ("http://a.test/x", "a.test", "shop")
        assert all(set(v) == {"values"} and all(isinstance(s, str) for s in v["values"]) for v in info["metadata"].values())
        if state in ("delayed", "tracked"):
            assert int(item["refetchable_from_date"]) == 1_700_000_000 + due // 1000
        else:
            assert "refetchable_from_date" not in item


def test_url_frontier_lines_are_read_with_their_json_names() -> None:
    """url-frontier's own dump (protobuf JSON: refetchableFromDate, ID, creationDate) reads as URLs: discovered, to refetch from a date, or done."""
    lines = [
        '{"discovered":{"info":{"url":"http://a.test/1","key":"a.test","metadata":{"depth":{"values":["2"]}},"crawlID":"DEFAULT"}},"ID":"x"}',
        '{"known":{"info":{"url":"http://a.test/2","key":"a.test","crawlID":"DEFAULT"},"refetchableFromDate":"1900000000"},"creationDate":"1"}',
        '{"known":{"info":{"url":"http://a.test/3","key":"a.test","crawlID":"DEFAULT"}}}',
    ]
    got = [parse_record(json.loads(line)) for line in lines]
    assert [(r.url, r.foreign, r.done, r.refetch_s) for r in got] == [  # type: ignore[union-attr]
        ("http://a.test/1", {"depth": ["2"]}, False, 0), ("http://a.test/2", {}, False, 1900000000),
        ("http://a.test/3", {}, True, 0)]


def test_a_header_of_another_format_is_refused_with_what_to_do() -> None:
    """A dump of a newer format is refused with its number and the advice to upgrade."""
    with pytest.raises(BadRecord, match=r"format 2: this streams-sched reads format 1; upgrade"):
        parse_record({"streams_sched_dump": {"format": 2, "crawl": "c", "time_ms": 1, "dump_id": "x"}})


def _head(**stats: str) -> SiteHead:
    base = dict.fromkeys(SNAPSHOT_STATS)
    base.update(stats)
    return SiteHead(0, b"", b"", {}, base, [(b"", b"")] * len(STREAMS), 0, b"", [])


def _chunk(delayed_next: bytes = DONE) -> Chunk:
    return Chunk([StreamPart([], {}, DONE)] * len(STREAMS), [], delayed_next, [], DONE)


def test_a_chunked_read_holds_while_the_reader_is_ahead_of_the_leases_and_nothing_it_has_to_read_moved() -> None:
    """moved(): a lease past the reader's cursor, a promotion or revisit while delayed requests are left, a requeued dead letter, or a lost cursor member each break the read; the same changes once those parts are read through do not."""
    head = _head(promoted="1", revisits="4", dlq_requeued=None)
    streams = [(b"5-0", b"9-0")] + [(DONE, b"")] * (len(STREAMS) - 1)
    before = Cursors(streams, b"m", (b"", b"3-0"))
    same = Checks(0, dict(head.stats), [b"4-0"] + [b""] * (len(STREAMS) - 1))
    assert moved(head, before, same, _chunk()) is None
    leased = Checks(0, dict(head.stats), [b"6-0"] + [b""] * (len(STREAMS) - 1))
    assert "leased past the reader" in (moved(head, before, leased, _chunk()) or "")
    promoted = Checks(0, {**head.stats, "promoted": "2"}, same.delivered)
    assert "promoted" in (moved(head, before, promoted, _chunk()) or "")
    assert "gone" in (moved(head, before, same, _chunk(delayed_next=b"?")) or "")
    requeued = Checks(0, {**head.stats, "dlq_requeued": "1"}, same.delivered)
    assert "requeued" in (moved(head, before, requeued, _chunk()) or "")
    done = Cursors([(DONE, b"9-0")] * len(STREAMS), DONE, (DONE, b"3-0"))
    assert moved(head, done, Checks(0, {**head.stats, "promoted": "9", "dlq_requeued": "2"}, [b"99-0"] * 6), _chunk()) is None


def test_the_snapshot_counters_are_the_scripts() -> None:
    """read_site.py names the counters lib/snapshot.lua reads, in its order."""
    lua = read_lua("lib/snapshot.lua")
    listed = re.search(r"local SNAPSHOT_STATS = \{([^}]*)\}", lua, re.S)
    assert listed and tuple(re.findall(r"'(\w+)'", listed[1])) == SNAPSHOT_STATS


# -- enqueue.lua's 'load' keys -------------------------------------------------------------


@pytest.mark.cluster
def test_load_keys_take_each_line_once_and_keep_dead_letters_deliveries_and_done_urls(
    redis_url: str, crawl: str
) -> None:
    """A load call adds requests (with earlier deliveries), dead letters and done URLs' fingerprints, and the same lines again add nothing, dont_filter ones included."""
    f = frontier_of(redis_url, crawl)
    items = [
        enqueue.LoadItem(Entry(b"a" * 20, 1, 0, b"p1", "a.test"), 1),
        enqueue.LoadItem(Entry(b"", 1, 0, b"retry", "a.test"), 2, "2"),
        enqueue.LoadItem(Entry(b"", 1, 0, b"retry", "a.test"), 3),  # dont_filter: a second copy, its own line
        enqueue.LoadItem(Entry(b"c" * 20, 1, 60_000, b"later", "a.test"), 4),
        enqueue.LoadItem(Entry(b"d" * 20, DEAD_LETTER + 1, 0, b"dead", "a.test"), 5,
                         enqueue.dead_extra("boom", 3, "w1", 123, "9-0")),
        enqueue.LoadItem(Entry(b"e" * 20, SEEN_ONLY, 0, b"", "a.test"), 6),
    ]
    first = enqueue.load_call(f, [("a.test", items)], "file1").run()[0]
    assert first.flags == b"1111" + b"1s" and first.added == 5 and first.delayed == 1
    again = enqueue.load_call(f, [("a.test", items)], "file1").run()[0]
    assert again.flags == b"l" * 6 and again.added == 0
    k = f.site("a.test")
    entries = f.client.xrange(k.streams[1])
    assert [(e[1][b"r"], e[1].get(b"d")) for e in entries] == [(b"p1", None), (b"retry", b"2"), (b"retry", None)]
    assert f.client.zcard(k.delayed) == 1
    (letter,) = f.client.xrange(k.dlq)
    assert letter[1][b"reason"] == b"boom" and letter[1][b"stream"] == k.streams[1].encode()
    fresh_call = enqueue.load_call(f, [("a.test", [enqueue.LoadItem(Entry(b"e" * 20, 1, 0, b"x", "a.test"), 1)])], "file2")
    assert fresh_call.run()[0].flags == b"0"  # the done URL's fingerprint was recorded


def test_an_enqueue_while_no_dump_runs_writes_no_journal(plain_redis_url: str, crawl: str) -> None:
    """Without a dump there is no journal key, and enqueue.lua adds none (it only checks that there is none)."""
    f = frontier_of(plain_redis_url, crawl)
    f.enqueue("a.test", [Entry(b"a" * 20, 1, 0, b"p")])
    assert not f.client.exists(f.site("a.test").index.journal)


# -- dump and load round trips -------------------------------------------------------------

ROUND_TRIPS = [("bitmap", "redisbloom"), ("redisbloom", "bitmap"), ("bitmap", "cluster"), ("cluster", "bitmap"),
               ("bitmap", "valkey"), ("valkey", "redisbloom")]


def _url(redis_source: Any, kind: str) -> str:
    return fresh(redis_source.cluster_url() if kind == "cluster" else redis_source.url(kind))


@pytest.mark.parametrize(("source", "into"), ROUND_TRIPS, ids=[f"{a}-to-{b}" for a, b in ROUND_TRIPS])
@pytest.mark.parametrize("seen", [False, True], ids=["requests", "with-seen"])
def test_dump_load_into_another_kind_of_server_and_dump_again_gives_the_same_lines(
    redis_source: Any, source: str, into: str, seen: bool, tmp_path: Path
) -> None:
    """Dump a crawl with every kind of request, load it into an empty server of another kind (single <-> cluster, Redis <-> Valkey, bitmap <-> RedisBloom), dump it again: the request lines, policies and site states are equal (due times counted from the load)."""
    src, dst = _url(redis_source, source), _url(redis_source, into)
    build_crawl(src, "moving")
    first = dump_lines(src, "moving", seen=seen)
    path = write_dump(tmp_path / "crawl.jsonl.gz", first)
    loaded = cli("load", "-c", "moved", str(path), url=dst)
    assert loaded.exit_code == 0, loaded.output
    second = dump_lines(dst, "moved", seen=seen)
    assert comparable(second) == comparable(first)
    before, after = dues(first), dues(second)
    assert before.keys() == after.keys() and before
    assert all(abs(before[k] - after[k]) < 5000 for k in before), (before, after)
    assert sum(1 for r in records(first) if isinstance(r, RequestLine) and r.lease) == 2
    assert not any(isinstance(r, RequestLine) and r.lease for r in records(second))  # queued after the load


@pytest.mark.cluster
def test_loading_a_file_twice_adds_nothing(redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A second load of the same file adds no request, dead letter or dont_filter copy: every line is in the ledger."""
    build_crawl(redis_url, "orig")
    path = write_dump(tmp_path / "d.jsonl", dump_lines(redis_url, "orig"))
    assert cli("load", "-c", crawl, str(path), url=redis_url).exit_code == 0
    once = comparable(dump_lines(redis_url, crawl))
    again = cli("load", "-c", crawl, str(path), url=redis_url)
    assert again.exit_code == 0, again.output
    assert "0 request(s) added" in again.output and "0 dead letter(s)" in again.output
    assert comparable(dump_lines(redis_url, crawl)) == once


def test_a_load_takes_the_site_policies_and_the_dedupe_of_the_crawl_it_goes_into(
    plain_redis_url: str, tmp_path: Path
) -> None:
    """Loaded requests go through enqueue.lua: a URL the crawl saw is a duplicate, a page cap drops what is over it, and the dump's policies and default policy are restored."""
    url = plain_redis_url
    build_crawl(url, "src")
    path = write_dump(tmp_path / "d.jsonl", dump_lines(url, "src"))
    dst = frontier_of(url, "dst")
    dst.enqueue("small0.test", [Entry(bytes.fromhex(_fp("http://small0.test/p0")), 1, 0, b"already")])
    result = cli("load", "-c", "dst", str(path), url=url)
    assert result.exit_code == 0, result.output
    assert "1 duplicate(s)" in result.output
    from streams_sched.politeness.policy import get_policy

    assert get_policy(dst, "big.test") == {"rate": "5.0", "max_pages": "1000", "weight": "2.0"}
    assert get_policy(dst, "*") == {"rate": "10.0"}


def _fp(url: str) -> str:
    from scrapy.utils.request import RequestFingerprinter

    return RequestFingerprinter().fingerprint(Request(url)).hex()


def test_due_times_count_from_the_load(plain_redis_url: str, tmp_path: Path) -> None:
    """A request due 1,234,567 ms after the dump is due that long after its line is loaded, whenever the load runs."""
    url = plain_redis_url
    build_crawl(url, "src")
    lines = []
    for line in dump_lines(url, "src"):
        if "http://rich.test/later" in line:
            obj = json.loads(line)
            obj["known"]["info"]["metadata"]["ss.due_in_ms"] = {"values": ["1234567"]}
            line = json.dumps(obj)
        lines.append(line)
    path = write_dump(tmp_path / "d.jsonl", lines)
    assert cli("load", "-c", "dst", str(path), url=url).exit_code == 0
    f = frontier_of(url, "dst")
    members = f.client.zrange(f.site("rich.test").delayed, 0, -1, withscores=True)
    (score,) = [score for member, score in members if b"rich.test/later" in member]
    assert abs(score - (f.clock.now() * 1000 + 1_234_567)) < 5000


# -- while workers run ---------------------------------------------------------------------


@pytest.mark.cluster
def test_a_dump_holds_what_is_added_after_its_site_was_read_and_not_what_was_there_before(
    redis_url: str, crawl: str
) -> None:
    """Requests added during the dump to a site already read, a site not read yet and a new site are each in it once, and a request acked after its site's read is in it (as queued)."""
    f = frontier_of(redis_url, crawl)
    sites = [f"s{i}.test" for i in range(12)]
    encode = RequestCodec(None).encode
    for s in sites:
        f.enqueue(s, [Entry(bytes([i]) * 20, 1, 0, encode(Request(f"http://{s}/{i}"))) for i in range(3)])
    read: list[str] = []
    added: list[tuple[str, str]] = []

    class Watching(Dumper):
        def _site(self, r: Any) -> None:  # type: ignore[override]
            super()._site(r)
            read.append(r.site)
            if len(read) == 1:
                lease = f.lease(r.site, "w9", 1, [1, 1, 1])
                for s in (r.site, sites[-1] if sites[-1] != r.site else sites[0], "brand-new.test"):
                    f.enqueue(s, [Entry(b"\x7f" * 20, 1, 0, encode(Request(f"http://{s}/added")))])
                    added.append((s, f"http://{s}/added"))
                f.ack(r.site, [(e.stream, e.id) for e in lease.entries])

    out: list[str] = []
    Watching(f, out.append).run()
    payloads = Counter(r.url for r in records(out) if isinstance(r, RequestLine))
    for s in sites:
        for i in range(3):
            assert payloads[f"http://{s}/{i}"] == 1, s
    for s, payload in added:
        assert payloads[payload] == 1, (s, payloads)
    assert not f.client.exists(*[f.shard(n).journal for n in range(f.shards)])


@pytest.mark.cluster
@pytest.mark.parametrize("per_chunk", [3, 25], ids=["reader-ahead", "leases-overtake"])
def test_a_long_site_read_in_chunks_while_it_is_leased_and_handed_back_holds_each_request_once(
    redis_url: str, crawl: str, per_chunk: int
) -> None:
    """A site longer than the read budget is read in chunks while it is leased, handed back and its delayed requests promoted: the reader reads again when something it had yet to read moved, copies the site when leases keep overtaking it, and every request is in the read once."""
    f = frontier_of(redis_url, crawl)
    n = 120
    f.enqueue("long.test", [Entry(b"%04d" % i + b"x" * 16, 1, 0, b"q%d" % i) for i in range(n)])
    f.enqueue("long.test", [Entry(b"d%03d" % i + b"y" * 16, 1, 1, b"d%d" % i) for i in range(30)])
    calls = {"n": 0}
    real = read_site.call

    def meddling(frontier: Any, site: str, budget: int, cursors: Any = None, *a: Any, **k: Any) -> Any:
        if cursors is not None and k.get("k") is None:
            calls["n"] += 1
            held = f.lease("long.test", f"w{calls['n']}", per_chunk, [1, 1, 1])  # promotes; may pass the cursor
            f.release("long.test", f"w{calls['n']}", [(e.stream, e.id) for e in held.entries])
        return real(frontier, site, budget, cursors, *a, **k)

    import streams_sched.transfer.sitereader as sr

    sr.read_site.call = meddling  # type: ignore[assignment]
    try:
        reader = SiteReader(f, budget=10, retries=1)
        (got,) = list(_consume(reader.read(["long.test"])))
    finally:
        sr.read_site.call = real  # type: ignore[assignment]
    assert reader.restarts >= 1 and reader.frozen == (per_chunk > 10)
    payloads = Counter(item.payload for item in got)
    assert payloads == Counter([b"q%d" % i for i in range(n)] + [b"d%d" % i for i in range(30)])
    if not f.cluster:
        assert list(f.client.scan_iter(match="*scratch*")) == []


def _consume(reads: Any) -> Any:
    for r in reads:
        yield list(r.items)


@pytest.mark.cluster
def test_a_long_site_read_in_chunks_without_moves_is_one_read(redis_url: str, crawl: str) -> None:
    """A site of many chunks that nothing moves under is read once, chunk by chunk, each request once, leased ones with their lease."""
    f = frontier_of(redis_url, crawl)
    f.enqueue("long.test", [Entry(b"%04d" % i + b"x" * 16, 1, 0, b"q%d" % i) for i in range(95)])
    f.lease("long.test", "w1", 7, [1, 1, 1])
    reader = SiteReader(f, budget=10)
    (items,) = list(_consume(reader.read(["long.test"])))
    assert reader.restarts == 0 and reader.frozen == 0
    assert [i.payload for i in items] == [b"q%d" % i for i in range(95)]
    assert sum(1 for i in items if i.lease) == 7


# -- bad input ----------------------------------------------------------------------------


def _dump_file(url: str, tmp_path: Path, name: str = "d.jsonl") -> tuple[Path, list[str]]:
    build_crawl(url, "src")
    lines = dump_lines(url, "src")
    return write_dump(tmp_path / name, lines), lines


def _queued(url: str, crawl: str) -> Counter[str]:
    return Counter(r.url for r in records(dump_lines(url, crawl)) if isinstance(r, RequestLine))


def test_a_truncated_plain_file_loads_what_is_whole_and_says_where_it_ends(plain_redis_url: str, tmp_path: Path) -> None:
    """A plain dump cut in the middle of a line: the whole lines are loaded, the cut one is not, and one line names it (exit 5)."""
    path, lines = _dump_file(plain_redis_url, tmp_path)
    data = path.read_bytes()
    cut_at = len("".join(line + "\n" for line in lines[:20])) + 30
    path.write_bytes(data[:cut_at])
    result = cli("load", "-c", "dst", str(path), url=plain_redis_url)
    assert result.exit_code == 5
    assert "error: line 21: the file ends in the middle of this line" in result.output
    assert "Traceback" not in result.output
    want = Counter(r.url for r in records(lines[:20]) if isinstance(r, RequestLine) and r.state != "dead")
    got = Counter(r.url for r in records(dump_lines(plain_redis_url, "dst")) if isinstance(r, RequestLine) and r.state != "dead")
    assert got == want


def test_a_truncated_gzip_file_is_named_and_what_came_before_is_loaded(plain_redis_url: str, tmp_path: Path) -> None:
    """A gzip dump cut short: exit 5 with one line saying the gzip stream ends early; the lines before are in."""
    path, lines = _dump_file(plain_redis_url, tmp_path, "d.jsonl.gz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])
    result = cli("load", "-c", "dst", str(path), url=plain_redis_url)
    assert result.exit_code == 5
    assert re.search(r"error: line \d+: the gzip stream ends early: the file was cut short", result.output)
    assert "Traceback" not in result.output
    assert sum(_queued(plain_redis_url, "dst").values()) > 0


def test_a_dump_without_its_last_line_is_cut_short(plain_redis_url: str, tmp_path: Path) -> None:
    """A dump whose lines are all whole but whose end line is missing loads and says it was cut short (exit 5)."""
    path, lines = _dump_file(plain_redis_url, tmp_path)
    write_dump(path, lines[:-1])
    result = cli("load", "-c", "dst", str(path), url=plain_redis_url)
    assert result.exit_code == 5 and "the file ends before the dump's last line" in result.output


def test_another_format_version_is_refused_before_anything_is_written(plain_redis_url: str, tmp_path: Path) -> None:
    """A dump of another format version: one line naming it and the fix, exit 5, and the crawl is not even made."""
    path, lines = _dump_file(plain_redis_url, tmp_path)
    write_dump(path, [lines[0].replace('"format":1', '"format":7'), *lines[1:]])
    result = cli("load", "-c", "dst", str(path), url=plain_redis_url)
    assert result.exit_code == 5
    assert result.output.strip().splitlines() == [
        "error: line 1: dump format 7: this streams-sched reads format 1; upgrade streams-sched to read it"]
    assert not frontier_of(plain_redis_url, "dst").client.sismember("ss:crawls", "dst")


@pytest.mark.parametrize("case", ["invalid-url", "other-crawl", "binary-junk", "bad-value", "unknown-policy"])
def test_a_bad_line_is_named_and_skipped_and_the_others_are_loaded(plain_redis_url: str, tmp_path: Path, case: str) -> None:
    """An invalid URL, a line of another crawl, binary junk, a value no dump writes and an unknown policy field: one line each with its number and reason, nothing of it written, the rest loaded, exit 5."""
    path, lines = _dump_file(plain_redis_url, tmp_path)
    at = next(i for i, line in enumerate(lines) if '"url":"http://big.test/page/7"' in line)
    bad_line = lines[at]
    expect = {
        "invalid-url": ("http://big.test/page/7", "no-scheme/page/7", r"invalid URL 'no-scheme/page/7'"),
        "other-crawl": ('"crawlID":"src"', '"crawlID":"other"', r"a line of crawl 'other', not of this file's crawl 'src'"),
        "bad-value": ('"ss.request":{"values":["{}"]}', '"ss.request":{"values":["{\\"meta\\":{\\"$pickle\\":1}}"]}',
                      r"unknown tag '\$pickle'"),
    }
    if case == "binary-junk":
        raw = "".join(line + "\n" for line in lines).encode()
        junk = b"\x89PNG\r\x1a\x00\xff\xfe garbage"
        raw = raw.replace(bad_line.encode(), junk)
        path.write_bytes(raw)
        message = r"not UTF-8 text"
    elif case == "unknown-policy":
        at = next(i for i, line in enumerate(lines) if line.startswith('{"site":{"name":"big.test"'))
        bad_line = lines[at]
        write_dump(path, [*lines[:at], bad_line.replace('"rate"', '"speed"'), *lines[at + 1:]])
        message = r"unknown policy field 'speed'"
    else:
        old, new, message = expect[case]
        write_dump(path, [*lines[:at], bad_line.replace(old, new), *lines[at + 1:]])
    result = cli("load", "-c", "dst", str(path), url=plain_redis_url)
    assert result.exit_code == 5, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and re.match(rf"error: line {at + 1}: .*{message}", errors[0]), errors
    assert "Traceback" not in result.output
    got = _queued(plain_redis_url, "dst")
    if case == "unknown-policy":
        assert got["http://big.test/page/7"] == 1
    else:
        assert got["http://big.test/page/7"] == 0 and got["http://big.test/page/8"] == 1


def test_a_file_that_is_no_dump_says_so(plain_redis_url: str, tmp_path: Path) -> None:
    """Binary junk, a gzip file of junk and a .gz name on a plain file: one line each, exit 5."""
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00\x01\x02\xff\n\x03")
    assert "not UTF-8 text" in cli("load", "-c", "dst", str(junk), url=plain_redis_url).output
    zipped = tmp_path / "junk.gz"
    zipped.write_bytes(gzip.compress(b"[1, 2]\n"))
    result = cli("load", "-c", "dst", str(zipped), url=plain_redis_url)
    assert result.exit_code == 5 and "the line is no JSON object" in result.output
    named = tmp_path / "plain.jsonl.gz"
    named.write_text('{"a": 1}\n')
    result = cli("load", "-c", "dst", str(named), url=plain_redis_url)
    assert result.exit_code == 5 and "is named .gz but is not gzip" in result.output


def test_url_frontier_s_own_dump_loads_as_urls_and_done_urls_as_seen(plain_redis_url: str, tmp_path: Path) -> None:
    """url-frontier's JSON Lines (camelCase, several crawls, metadata) load: discovered now, known with a date then, known without one as seen only; --from-crawl picks one crawl."""
    lines = [
        '{"discovered":{"info":{"url":"http://a.test/1","key":"a.test","metadata":{"depth":{"values":["2"]}},"crawlID":"one"}}}',
        '{"known":{"info":{"url":"http://a.test/2","key":"a.test","crawlID":"one"},"refetchableFromDate":"4000000000"}}',
        '{"known":{"info":{"url":"http://a.test/3","key":"a.test","crawlID":"one"}}}',
        '{"discovered":{"info":{"url":"http://b.test/1","key":"b.test","crawlID":"two"}}}',
    ]
    path = write_dump(tmp_path / "uf.jsonl", lines)
    result = cli("load", "-c", "dst", "--from-crawl", "one", str(path), url=plain_redis_url)
    assert result.exit_code == 0, result.output
    assert "2 request(s) added" in result.output and "1 URL(s) done" in result.output
    assert "1 line(s) of other crawls left out" in result.output
    f = frontier_of(plain_redis_url, "dst")
    from streams_sched.transfer.finding import find_url

    assert find_url(f, "http://a.test/3").verdict == "done"
    assert find_url(f, "http://a.test/2").places[0].state == "delayed"
    queued = find_url(f, "http://a.test/1")
    assert queued.places[0].state == "queued"
    again = cli("load", "-c", "dst", "--from-crawl", "one", str(path), url=plain_redis_url)
    assert "0 request(s) added" in again.output and "3 line(s) an earlier load took" in again.output
    mixed = cli("load", "-c", "dst2", str(path), url=plain_redis_url)
    assert mixed.exit_code == 5 and "error: line 4: a line of crawl 'two', not of this file's crawl 'one'" in mixed.output


# -- url -----------------------------------------------------------------------------------


@pytest.mark.cluster
def test_url_says_where_each_url_is_and_why(redis_url: str, crawl: str) -> None:
    """url names a queued URL's band and place, a leased one's node and delivery, a delayed retry, a tracked page, a dead letter, a done URL and a URL never seen."""
    build_crawl(redis_url, crawl)
    result = cli("url", "-c", crawl, "http://big.test/page/9", "http://big.test/page/3", "http://rich.test/later",
                 "http://rich.test/tracked", "http://big.test/page/1", "http://rich.test/never", url=redis_url)
    assert result.exit_code == 0, result.output
    out = result.output
    assert re.search(r"queued: http:default, 4 ahead of it in its stream", out)
    assert re.search(r"leased: by w1 for [\d.]+s, delivery 1", out)
    assert re.search(r"delayed: due in [\d.]+m: a retry \(retry_times=1\)", out)
    assert re.search(r"tracked: due in [\d.]+m: a revisit \(tracked page\); every 3600s, 1 failure", out)
    assert "dead letter: 'payload cannot be decoded', after 1 deliveries on w1" in out
    assert "seen: no (certain)" in out and "=> never seen" in out
    f = frontier_of(redis_url, crawl)
    leased = f.lease("small0.test", "w2", 1, [1, 1, 1]).entries
    f.ack("small0.test", [(e.stream, e.id) for e in leased])
    done_url = msgpack.unpackb(leased[0].payload)["u"]
    report = json.loads(cli("url", "-c", crawl, done_url, "--json", url=redis_url).output)
    assert report["verdict"] == "done" and report["seen"] is True and report["seen_by"] == "exact"


def test_url_with_a_bloom_filter_says_how_sure_it_is(redis_url: str, crawl: str, dedupe: str) -> None:
    """Past 1,024 fingerprints a site's filter is a Bloom filter: url says seen with its error rate, and never seen for certain."""
    f = frontier_of(redis_url, crawl)
    f.register()
    for i in range(0, 1100, 100):
        f.enqueue("many.test", [Entry(bytes.fromhex(_fp(f"http://many.test/{j}")), 1, 0, b"x") for j in range(i, i + 100)])
    result = cli("url", "-c", crawl, "http://many.test/5", "http://many.test/none", url=redis_url)
    assert "seen: yes (a Bloom filter: a URL never seen says yes at most 0.001 of the time)" in result.output
    assert "seen: no (certain)" in result.output


def test_a_dump_that_loses_a_journal_fails_rather_than_miss_requests_and_a_second_dump_waits(
    plain_redis_url: str, crawl: str
) -> None:
    """A journal gone mid-dump (the dump paused past its lifetime, a restart) fails the dump with what to do, and no journal stays; a dump while another runs is refused, naming it."""
    from streams_sched.errors import DumpBusy, JournalLost
    from streams_sched.transfer.journal import Journal

    f = frontier_of(plain_redis_url, crawl)
    for i in range(40):
        f.enqueue(f"s{i}.test", [Entry(bytes([i]) * 20, 1, 0, RequestCodec(None).encode(Request(f"http://s{i}.test/")))])

    class Losing(Dumper):
        def _site(self, r: Any) -> None:  # type: ignore[override]
            super()._site(r)
            f.client.delete(*[f.shard(n).journal for n in range(f.shards)])
            assert self._journal_ is not None
            self._journal_.keep_alive(force=True)

    with pytest.raises(JournalLost, match="run it again"):
        Losing(f, lambda line: None).run()
    assert not f.client.exists(f.keys.dump_lock, *[f.shard(n).journal for n in range(f.shards)])
    other = Journal(f, "someone-else")
    other.lock()
    with pytest.raises(DumpBusy, match="another dump of crawl .* is running \\(dump someone-else\\)"):
        Dumper(f, lambda line: None).run()
    other.unlock()
    assert Dumper(f, lambda line: None).run().requests == 40


@pytest.mark.cluster
def test_a_dumper_hands_its_records_to_a_loader_with_no_file_between(redis_url: str, redis_source: Any) -> None:
    """The parts `move` builds on: a Dumper's records go straight into a Loader on another server (no JSON between), prepared from the dump's header, and the copy dumps as the source does."""
    from itertools import count

    from streams_sched.frontier.bloom import server_has_bloom
    from streams_sched.transfer.load import Loader, prepare_crawl

    from transfer_helpers import connect_frontier

    source = fresh(redis_source.url("valkey"))
    build_crawl(source, "src")
    src = frontier_of(source, "src")
    loader: Loader | None = None
    numbers = count(1)
    dumper = Dumper(src, sink=lambda record: loader.take(next(numbers), record), seen=True)  # type: ignore[union-attr]
    header = dumper.header()
    dst = connect_frontier(redis_url, "copy")
    assert prepare_crawl(dst, header, seen=True, has_bloom=server_has_bloom(dst.client), shards=16, file_name="(copy)",
                         file_id=header.dump_id)
    dst = frontier_of(redis_url, "copy")
    loader = Loader(dst, file_id=header.dump_id, header=header)
    dumper.run()
    loader.close()
    assert loader.summary.bad == 0 and loader.summary.added > 0
    assert comparable(dump_lines(redis_url, "copy", seen=True)) == comparable(dump_lines(source, "src", seen=True))


def test_a_dump_loads_from_standard_input_with_the_lines_of_the_file(plain_redis_url: str, tmp_path: Path) -> None:
    """`load -` reads standard input with the same line numbers as the file (its ledger is the file's): loading the file after it adds nothing."""
    url = plain_redis_url
    build_crawl(url, "src")
    path = write_dump(tmp_path / "d.jsonl", dump_lines(url, "src"))
    piped = cli("load", "-c", "dst", "-", url=url, input=path.read_text())
    assert piped.exit_code == 0, piped.output
    again = cli("load", "-c", "dst", str(path), url=url)
    assert again.exit_code == 0 and "0 request(s) added" in again.output and "0 dead letter(s)" in again.output


@pytest.mark.cluster
def test_a_load_cut_off_in_the_middle_of_a_round_trip_and_run_again_takes_each_line_once(
    redis_url: str, tmp_path: Path
) -> None:
    """A load whose connection dies after some calls of a round trip were run and others not (a SIGKILL between them) is run again: every request, dont_filter copy and dead letter is in once."""
    from streams_sched.transfer import load as load_module

    build_crawl(redis_url, "src")
    lines = dump_lines(redis_url, "src")
    path = write_dump(tmp_path / "d.jsonl", lines)
    real = load_module.Loader._run

    def half(self: Any, built: list[Any]) -> Any:
        for call in built[: max(1, len(built) // 2)]:
            call.run()
        raise ConnectionError("killed mid round trip")

    load_module.Loader._run = half  # type: ignore[method-assign]
    try:
        with pytest.raises(ConnectionError):
            cli("load", "-c", "dst", str(path), url=redis_url)
    finally:
        load_module.Loader._run = real  # type: ignore[method-assign]
    assert cli("load", "-c", "dst", str(path), url=redis_url).exit_code == 0
    assert comparable(dump_lines(redis_url, "dst")) == comparable(lines)


def test_the_progress_bar_draws_only_on_a_terminal() -> None:
    """The bar goes to a terminal (over itself, with the share done and the rate), never to a pipe or a log."""
    import io

    from streams_sched.transfer.progress import Progress, bar_line

    assert bar_line(25, 100, "250 requests", 1234.5, width=8) == "[##------]  25.0%  250 requests  1,234/s"
    assert bar_line(5, None, "5 lines", 10.0) == "5 lines  10/s"
    piped = io.StringIO()
    p = Progress(piped)
    p.update(1, 2, 1, "requests", final=True)
    p.close()
    assert piped.getvalue() == ""
    tty = io.StringIO()
    p = Progress(tty, force=True)
    p.update(1, 2, 1, "requests", final=True)
    p.close()
    assert tty.getvalue().startswith("\r\x1b[K[") and "50.0%" in tty.getvalue() and tty.getvalue().endswith("\n")


def test_seen_filters_go_only_into_a_crawl_without_sites_and_their_requests_are_all_kept(
    plain_redis_url: str, tmp_path: Path
) -> None:
    """A dump's seen filters replace its sites' own, so a crawl that has sites refuses them (load --no-seen there); into a new crawl every request of the dump goes in, none taken for seen by a Bloom filter's false positive."""
    url = plain_redis_url
    f = frontier_of(url, "big")
    encode = RequestCodec(None).encode
    urls = [f"http://bloomy.test/{i}" for i in range(3000)]  # past 1,024: a Bloom filter
    for i in range(0, len(urls), 500):
        f.enqueue("bloomy.test", [Entry(bytes.fromhex(_fp(u)), 1, 0, encode(Request(u))) for u in urls[i:i + 500]])
    lines = dump_lines(url, "big", seen=True)
    # the same URL twice: a filter in front of the second would take it for seen, as a false
    # positive takes a URL it never had
    again = next(i for i, line in enumerate(lines) if '"http://bloomy.test/7"' in line)
    path = write_dump(tmp_path / "d.jsonl", [*lines[:again + 1], lines[again], *lines[again + 1:]])
    frontier_of(url, "busy").enqueue("other.test", [Entry(b"o" * 20, 1, 0, b"x")])
    refused = cli("load", "-c", "busy", str(path), url=url)
    assert refused.exit_code == 1 and "has sites already" in refused.output and "--no-seen" in refused.output
    loaded = cli("load", "-c", "moved", str(path), url=url)
    assert loaded.exit_code == 0, loaded.output
    assert f"{len(urls) + 1} request(s) added, 0 duplicate(s)" in loaded.output
    assert cli("load", "-c", "moved", str(path), url=url).exit_code == 0  # its own earlier load: allowed
