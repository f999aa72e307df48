"""The public seeding API (streams_sched.Seeder / seed) and the CLI push built on it."""

from __future__ import annotations

import datetime as dt
import hashlib
import random
from typing import Any

import hiredis
import pytest
from click.testing import CliRunner
from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.request import fingerprint as scrapy_fingerprint

from streams_sched import Seeder, seed
from streams_sched.cli import main
from streams_sched.connect.clients import connect
from streams_sched.errors import SerializationError
from streams_sched.frontier.batches import enqueue_calls
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import entry_for, facts_agree, url_facts
from streams_sched.frontier.keys import STREAMS, shard_of
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import enqueue
from streams_sched.frontier.seeding.send import SeedKeys
from streams_sched.frontier.seeding.wire import Wire
from streams_sched.politeness.policy import set_policy
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD, legacy_fingerprint
from streams_sched.wire.codec import RequestCodec

from helpers import queued


class _Spider(Spider):
    name = "s"

    def parse_list(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass

    def _callback(self, response: Any) -> None:  # CrawlSpider names its callbacks so
        pass

    def _errback(self, failure: Any) -> None:
        pass


def _entries(client: Any, crawl: str, site: str, task: str, band: str = "default") -> list[bytes]:
    """Payloads queued for one stream of ``site`` (in the stream or its shard's inbox)."""
    return queued(Frontier(client, crawl), site, task, band)


@pytest.mark.cluster
def test_seed_reports_added_and_duplicates(redis_url: str, crawl: str) -> None:
    """seed() returns the URLs it added and the ones that were duplicates, on one Redis or a cluster."""
    urls = [f"http://site{i % 3}.test/p/{i}" for i in range(30)]
    first = seed(redis_url, crawl, urls + ["", "# a comment"])
    assert sorted(first.added) == sorted(urls) and first.duplicates == []
    second = seed(redis_url, crawl, urls[:10] + ["http://site0.test/new"])
    assert second.added == ["http://site0.test/new"]
    assert sorted(second.duplicates) == sorted(urls[:10])
    client = connect(redis_url)
    assert sum(len(_entries(client, crawl, f"site{i}.test", "http")) for i in range(3)) == 31
    assert Frontier.crawls(client) == [crawl]


def test_seeder_survives_a_lost_script_cache(plain_redis_url: str, crawl: str) -> None:
    """A long-lived Seeder reloads scripts the server lost (failover, restart, SCRIPT FLUSH) and sends again."""
    with Seeder(plain_redis_url, crawl) as seeder:
        assert seeder.seed(["http://a.test/1"]).added == ["http://a.test/1"]
        seeder.client.script_flush()
        result = seeder.seed(["http://a.test/1", "http://a.test/2", "http://b.test/1"])
    assert result.added == ["http://a.test/2", "http://b.test/1"] and result.duplicates == ["http://a.test/1"]


def test_seed_requests_priority_meta_callback(plain_redis_url: str, crawl: str) -> None:
    """Requests and URLs keep priority, meta, method and body; callbacks by name decode to the spider's methods."""
    with Seeder(plain_redis_url, crawl) as seeder:
        result = seeder.seed(
            [Request("http://a.test/form", method="POST", body=b"q=1"), "http://a.test/list"],
            priority=5, meta={"job": "j1"}, callback="parse_list", errback="on_error",
        )
        assert len(result.added) == 2
        with pytest.raises(ValueError):
            seeder.seed(["http://a.test/x"], callback="not a name")
    client = connect(plain_redis_url)
    payloads = _entries(client, crawl, "a.test", "http", "high")  # priority 5 -> high band
    spider = _Spider()
    codec = RequestCodec(spider)
    got = {r.url: r for r in map(codec.decode, payloads)}
    post = got["http://a.test/form"]
    assert post.method == "POST" and post.body == b"q=1" and post.priority == 5
    assert post.meta == {"job": "j1"} and post.callback == spider.parse_list and post.errback == spider.on_error
    assert got["http://a.test/list"].callback == spider.parse_list


def test_seed_fingerprints_like_the_worker(plain_redis_url: str, crawl: str) -> None:
    """A seed's fingerprint is Scrapy's own, so the worker's enqueue of the same request is a duplicate."""
    seed(plain_redis_url, crawl, ["http://a.test/p?b=2&a=1"])
    client = connect(plain_redis_url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    worker_fp = RequestFingerprinter().fingerprint(Request("http://a.test/p?a=1&b=2"))
    added, dups, *_ = f.enqueue("a.test", [Entry(worker_fp, 1, 0, b"x")])
    assert (added, dups) == (0, 1)


def test_seed_follows_site_policy_task_type(plain_redis_url: str, crawl: str) -> None:
    """Seeds of a site whose task_type is browser land in its browser streams; explicit meta task_type wins."""
    client = connect(plain_redis_url)
    set_policy(Frontier(client, crawl), "js.test", {"task_type": "browser"})
    result = seed(client, crawl, ["http://js.test/a", "http://plain.test/a"])
    assert len(result.added) == 2
    assert len(_entries(client, crawl, "js.test", "browser")) == 1
    assert _entries(client, crawl, "js.test", "http") == []
    assert len(_entries(client, crawl, "plain.test", "http")) == 1
    seed(client, crawl, ["http://js.test/b"], meta={"task_type": "http"})
    assert len(_entries(client, crawl, "js.test", "http")) == 1


def test_cli_push_follows_site_policy_task_type(plain_redis_url: str, crawl: str) -> None:
    """`streams-sched push` (built on Seeder) sends seeds of a browser site to its browser streams, not http."""
    client = connect(plain_redis_url)
    set_policy(Frontier(client, crawl), "js.test", {"task_type": "browser"})
    out = CliRunner().invoke(main, ["push", "--redis-url", plain_redis_url, "-c", crawl, "http://js.test/a", "http://js.test/b", "http://js.test/a"])
    assert out.exit_code == 0, out.output
    assert "pushed 2 request(s)" in out.output and "1 duplicate(s)" in out.output
    assert len(_entries(client, crawl, "js.test", "browser")) == 2
    assert _entries(client, crawl, "js.test", "http") == []


@pytest.mark.cluster
def test_seed_skips_what_a_migrated_scrapy_redis_crawl_saw(redis_url: str, crawl: str) -> None:
    """With a legacy scrapy-redis dupefilter recorded, seeds it already saw count as duplicates (on a cluster too)."""
    client = connect(redis_url)
    f = Frontier(client, crawl)
    client.sadd(f.keys.legacy_seen, legacy_fingerprint(Request("http://a.test/old")))
    client.hset(f.keys.meta, LEGACY_FIELD, f.keys.legacy_seen)
    result = seed(client, crawl, ["http://a.test/old", "http://a.test/new"])
    assert result.added == ["http://a.test/new"] and result.duplicates == ["http://a.test/old"]


# --- the plain-URL path: what it computes must be what Scrapy computes ------------------------

#: URLs of every shape the plain-URL path must treat as Scrapy does (the plain form and the
#: ones it hands to w3lib): queries, fragments, unicode, ports, case, IPs, users, dots, escapes
VARIED_URLS = [
    "http://s1.test/", "http://s1.test", "https://s1.test/a/b/c.html", "http://a-b.c-d.test/x_y~z/",
    "http://a.test/p/", "http://a.test/p//q", "http://a.test/a/./b/../c", "http://a.test/.hidden",
    "http://a.test/p?b=2&a=1", "http://a.test/p?a=1&a=", "http://a.test/p?q=a+b&r=%20", "http://a.test/?",
    "http://a.test/p#frag", "http://a.test/p?x=1#frag", "http://a.test/#", "http://a.test/p;params?x",
    "http://bücher.test/ü", "http://a.test/ü?q=ü#ü", "http://例え.テスト/パス", "http://xn--bcher-kva.test/",
    "http://a.test:8080/", "http://a.test:80/", "https://a.test:443/x", "http://a.test:0080/", "http://a.test:/",
    "HTTP://A.TEST/P", "http://Mixed.Case.Test/Path", "http://a.test/%7Euser", "http://a.test/%7euser",
    "http://a.test/a%2Fb", "http://a.test/sp ace", "http://a.test/\u00a0", "http://user:pw@a.test/",
    "http://user@a.test/", "http://127.0.0.1/", "http://127.0.0.1:8000/x", "http://[::1]/", "http://[::1]:81/a",
    "http://0x7f.1/", "http://1.2.3/", "http://a.1/", "http://a.test./", "http://a..test/", "http://-a.test/",
    "http://a--b.test/", "http://a.test/a?b=%zz", "http://a.test/%", "https://a.test/" + "x" * 300,
    "http://" + "l" * 70 + ".test/", "data:,hello", "about:blank", "ftp://a.test/f", "http://a.test/\\x",
    "http://a.test/tab\there", "http://a.test/~!$&'()*+,;=:@", "http://a.test/[x]", "http://a.test/{x}",
]


def _scrapy_facts(url: str) -> tuple[str, str | None, bytes]:
    request = Request(url)
    return request.url, urlparse_cached(request).hostname, RequestFingerprinter().fingerprint(request)


def _random_urls(n: int) -> list[str]:
    """URLs drawn from the characters that decide which path a URL takes, half of them near
    the plain form (seeded: the same every run)."""
    rng = random.Random(7)
    hosts = ["a.test", "s1.test", "A.Test", "x-y.test", "1.test", "b.c.d.test", "ü.test", "a.test:8080", "10.0.0.1",
             "a.b1", "a.1", "xn--bcher-kva.test", "a-.test", "a.test.", "0x1.a"]
    wide, plain = "aZ09-._~/%?#=&;:@+ !éü", "aZ09-._~/"
    urls = []
    for i in range(n):
        chars = plain if i % 2 else wide
        path = "".join(rng.choice(chars) for _ in range(rng.randint(0, 12)))
        urls.append(f"{rng.choice(['http', 'https', 'HTTP'])}://{rng.choice(hosts)}{rng.choice(['/', ''])}{path}")
    return urls


def test_plain_url_facts_match_scrapy() -> None:
    """The Request-free path gives each URL Scrapy's request.url, host and default fingerprint, byte for byte."""
    assert facts_agree()
    for url in VARIED_URLS + _random_urls(10_000):
        try:
            expected = _scrapy_facts(url)
        except ValueError:
            with pytest.raises(ValueError):
                url_facts(url)
            continue
        assert url_facts(url) == expected, url


def test_plain_url_facts_refuse_what_request_refuses() -> None:
    """A URL without a scheme is refused with Scrapy's own reason."""
    with pytest.raises(ValueError) as scrapy_says:
        Request("www.example.com/x")
    with pytest.raises(ValueError) as fast_says:
        url_facts("www.example.com/x")
    assert str(fast_says.value) == str(scrapy_says.value)


def test_url_encoder_gives_the_payload_of_encode() -> None:
    """url_encoder(...)(url) is byte for byte encode(Request(url, ...)) for every option, v2 meta and URL length."""
    spider = _Spider()
    codec = RequestCodec(spider)
    metas: list[dict[str, Any] | None] = [
        None, {}, {"job": "j1"}, {"when": dt.date(2024, 1, 2), "pair": (1, 2)}, {"download_latency": 0.5, "k": [1]},
    ]
    urls = ["http://a.test/", "http://a.test/" + "é" * 20, "http://a.test/" + "x" * 300, "http://a.test/" + "y" * 70_000]
    for meta in metas:
        for callback, errback in [(None, None), ("parse_list", None), (None, "on_error"), ("parse_list", "on_error")]:
            for priority, dont_filter in [(0, False), (7, True), (-3, False)]:
                encode = codec.url_encoder(callback=callback, errback=errback, meta=meta, priority=priority,
                                           dont_filter=dont_filter)
                for url in urls:
                    request = Request(
                        url, callback=getattr(spider, callback) if callback else None,
                        errback=getattr(spider, errback) if errback else None,
                        meta=meta, priority=priority, dont_filter=dont_filter,
                    )
                    assert encode(request.url) == codec.encode(request), (meta, callback, errback, priority, url[:30])


def test_url_encoder_refuses_meta_that_cannot_travel() -> None:
    """A meta value the queue cannot carry is refused when the encoder is made, naming the key."""
    with pytest.raises(SerializationError, match=r"meta\['o'\]"):
        RequestCodec(None).url_encoder(meta={"o": object()})


def _as_sent(seed_: Any, codec: RequestCodec) -> dict[str, Any]:
    """What a worker gets from a seed: its site, stream and fingerprint, and the decoded request's fields."""
    r = codec.decode(seed_.payload)
    return {
        "site": seed_.site, "stream": seed_.stream, "fp": seed_.fp, "url": seed_.url, "req_url": r.url,
        "callback": r.callback, "errback": r.errback, "meta": r.meta, "priority": r.priority,
        "dont_filter": r.dont_filter, "method": r.method, "body": r.body, "headers": dict(r.headers),
    }


def _request_takes(url: str) -> bool:
    try:
        Request(url)
    except ValueError:
        return False
    return True


def test_plain_url_seeds_equal_request_seeds(plain_redis_url: str, crawl: str) -> None:
    """URL strings give the Request path's entry byte for byte (site, stream, fingerprint, payload), whatever the options."""
    spider = _Spider()
    codec = RequestCodec(spider)
    # the Seeder strips lines; a URL this w3lib refuses (2.6 refuses "http://a.1/") raises on both paths
    urls = [u.strip() for u in VARIED_URLS if "://" in u and not u.startswith("ftp") and _request_takes(u.strip())]
    with Seeder(plain_redis_url, crawl) as seeder:
        options: list[dict[str, Any]] = [
            {}, {"priority": 5, "callback": "parse_list", "errback": "on_error"}, {"priority": -2, "dont_filter": True},
            {"callback": "_callback", "errback": "_errback"},
            {"meta": {"job": "j1", "task_type": "browser"}, "site": "one.test"}, {"meta": {"when": dt.date(2024, 1, 2)}},
        ]
        for option in options:
            fast = list(seeder.seeds(urls, **option))
            extra = {**option.get("meta", {}), **({"site": option["site"]} if "site" in option else {})}
            slow = [
                entry_for(
                    Request(u, priority=option.get("priority", 0), meta=extra or None, dont_filter=option.get("dont_filter", False)),
                    seeder.codec, RequestFingerprinter(), callback=option.get("callback"), errback=option.get("errback"),
                    site_of=seeder.site_of,
                )
                for u in urls
            ]
            assert fast == slow, option
            assert [_as_sent(s, codec) for s in fast] == [_as_sent(s, codec) for s in slow], option


def test_custom_fingerprinter_turns_the_plain_url_path_off(plain_redis_url: str, crawl: str) -> None:
    """With a fingerprinter of the project's own, every seed is fingerprinted by it (through a Request)."""

    class ByUrl:
        def fingerprint(self, request: Request) -> bytes:
            return hashlib.sha1(b"mine:" + request.url.encode()).digest()

    class Headers(RequestFingerprinter):
        def fingerprint(self, request: Request) -> bytes:
            return scrapy_fingerprint(request, include_headers=["X-Tenant"])

    for fingerprinter in (ByUrl(), Headers()):
        with Seeder(plain_redis_url, crawl, fingerprinter=fingerprinter) as seeder:
            (got,) = seeder.seeds(["http://a.test/x"])
        assert got.fp == fingerprinter.fingerprint(Request("http://a.test/x"))


def _enqueue_shard_bytes(frontier: Frontier, sites: list[tuple[str, list[Entry]]], seed: bool) -> bytes:
    """What redis-py sends for the enqueue.lua call of these sites."""

    class Capture:
        def execute_command(self, *args: Any) -> None:
            self.args = args

    pipe = Capture()
    (enqueue.seed_call if seed else enqueue.call)(frontier, sites).queue(pipe)  # type: ignore[operator]
    return bytes(hiredis.pack_command(pipe.args))


@pytest.mark.parametrize("revisit", [0.0, 3600.0])
@pytest.mark.parametrize("seed_keys", [True, False])
def test_packed_calls_are_what_enqueue_shard_sends(plain_redis_url: str, crawl: str, revisit: float, seed_keys: bool) -> None:
    """Pre-packed calls are byte for byte what redis-py sends for Frontier.enqueue_shard (revisits or not, 'seed' keys or all)."""
    client = connect(plain_redis_url)
    crawl_bloom(client, crawl, revisit_s=revisit)
    with Seeder(client, crawl, batch=10_000) as seeder:
        assert seeder.frontier.bloom.revisit_s == revisit
        seeds = list(seeder.seeds([f"http://s{i}.test/" for i in range(40)] + ["http://s1.test/b", "http://s1.test/c"]))
        seeds += list(seeder.seeds(["http://s2.test/low", "http://ü.test/"], priority=-5, dont_filter=True))
        wire = Wire(client)
        calls = seeder.sender.packer.pack(enqueue_calls(seeds, seeder.frontier.shards, None), wire.node_of, seed_keys)
        assert len(calls) > 1 and any(len(items) == 3 for c in calls for _, items in c.parts)
        for call in calls:
            assert call.seed is seed_keys
            assert call.command == _enqueue_shard_bytes(seeder.frontier, call.parts, seed_keys)


def test_seed_keys_leave_a_site_that_needs_more_untouched(plain_redis_url: str, crawl: str) -> None:
    """An enqueue.lua call with 'seed' keys adds new sites' few URLs and leaves, with an empty part and nothing written, a registered site and one with more than the inbox holds."""
    client = connect(plain_redis_url)
    f = Frontier(client, crawl)
    DEFAULT = STREAMS.index(("http", "default"))  # noqa: N806
    shard = shard_of("old.test", f.shards)
    big, new = (next(n for i in range(10_000) if shard_of(n := f"{kind}{i}.test", f.shards) == shard) for kind in ("big", "new"))
    f.enqueue("old.test", [Entry(b"f" * 16, DEFAULT, 0, b"old")])
    before = client.hgetall(f.site("old.test").stats)
    many = [Entry(b"%016d" % i, DEFAULT, 0, b"b%d" % i) for i in range(9)]
    parts = enqueue.seed_call(f, [("old.test", [Entry(b"g" * 16, DEFAULT, 0, b"again")]), (big, many),
                                  (new, [Entry(b"h" * 16, DEFAULT, 0, b"new")])]).run()
    assert parts[:2] == [None, None]
    assert parts[2] is not None and parts[2][:3] == (1, 0, 0)
    assert client.hgetall(f.site("old.test").stats) == before
    assert _entries(client, crawl, "old.test", "http") == [b"old"] and _entries(client, crawl, big, "http") == []
    assert not client.sismember(f.site(big).index.sites, big)
    assert _entries(client, crawl, new, "http") == [b"new"]


def test_seeding_sends_again_with_all_keys_what_seed_keys_left(plain_redis_url: str, crawl: str) -> None:
    """A batch of new sites, a registered one, one with more URLs than the inbox holds and a browser-routed one is seeded exactly, each URL where all keys put it."""
    client = connect(plain_redis_url)
    seed(client, crawl, ["http://old.test/1"])
    set_policy(Frontier(client, crawl), "js.test", {"task_type": "browser"})
    urls = [f"http://n{i}.test/" for i in range(20)] + ["http://old.test/1", "http://old.test/2", "http://js.test/"]
    urls += [f"http://big.test/{i}" for i in range(12)]
    with Seeder(client, crawl, batch=10_000) as seeder:
        result = seeder.seed(urls)
    assert result.duplicates == ["http://old.test/1"] and sorted(result.added) == sorted(u for u in urls if u != "http://old.test/1")
    assert len(_entries(client, crawl, "old.test", "http")) == 2 and len(_entries(client, crawl, "big.test", "http")) == 12
    assert len(_entries(client, crawl, "js.test", "browser")) == 1 and _entries(client, crawl, "js.test", "http") == []
    assert all(len(_entries(client, crawl, f"n{i}.test", "http")) == 1 for i in range(20))


def test_seed_keys_pause_while_most_sites_come_back() -> None:
    """Batches go with 'seed' keys while few of their sites come back; after one that mostly came back, with all keys for a pause that doubles with each try that comes back too, and is short again after one that does not."""
    keys = SeedKeys()

    def pause() -> int:
        n = 0
        while not keys.seed():
            n += 1
        return n

    assert keys.seed()
    keys.saw(100, 25)
    assert pause() == 0
    keys.saw(100, 26)
    assert pause() == SeedKeys.PAUSE
    keys.saw(100, 100)
    assert pause() == 2 * SeedKeys.PAUSE
    for _ in range(20):
        keys.saw(100, 100)
        pause()
    keys.saw(100, 100)
    assert pause() == SeedKeys.LONGEST
    keys.saw(0, 0)
    assert pause() == 0
    keys.saw(100, 1)
    keys.saw(100, 90)
    assert pause() == SeedKeys.PAUSE
# --- batches in flight: what is reported stays exact ---------------------------------------


@pytest.mark.cluster
def test_pipelined_batches_report_each_url_exactly(redis_url: str, crawl: str) -> None:
    """With batches in flight each URL is reported added or duplicate exactly, within and across batches."""
    urls = [f"http://s{i}.test/p{i % 4}" for i in range(60)]
    again = urls[5:9] + ["http://s5.test/new"]  # the first four are duplicates, the last one is new
    with Seeder(redis_url, crawl, batch=7) as seeder:
        parts = list(seeder.seed_batches(urls + again + urls[:3]))
    assert len(parts) == (len(urls) + len(again) + 3 + 6) // 7
    added = [u for p in parts for u in p.added]
    dups = [u for p in parts for u in p.duplicates]
    assert sorted(added) == sorted(urls + ["http://s5.test/new"])
    assert sorted(dups) == sorted(urls[5:9] + urls[:3])
    assert sum(len(_entries(connect(redis_url), crawl, f"s{i}.test", "http")) for i in range(60)) == 61


def test_a_bad_url_is_refused_after_what_went_before(plain_redis_url: str, crawl: str) -> None:
    """A URL Scrapy refuses raises its ValueError, after every batch sent before it is reported."""
    good = [f"http://g{i}.test/" for i in range(12)]
    with Seeder(plain_redis_url, crawl, batch=5) as seeder:
        parts = seeder.seed_batches([*good, "no-scheme.test/x", "http://never.test/"])
        reported = [next(parts), next(parts)]
        with pytest.raises(ValueError, match="Missing scheme in request url: no-scheme.test/x"):
            next(parts)
        assert sorted(u for p in reported for u in p.added) == sorted(good[:10])
        # the batch the bad URL was in was not sent: seeding again adds it
        assert seeder.seed(good).added == good[10:]


def test_pipelined_batches_survive_a_lost_script_cache(plain_redis_url: str, crawl: str) -> None:
    """Batches in flight when the server lost its scripts are sent again and reported exactly."""
    with Seeder(plain_redis_url, crawl, batch=3) as seeder:
        seeder.client.script_flush()
        urls = [f"http://n{i}.test/" for i in range(10)]
        result = seeder.seed(urls + urls[:2])
    assert sorted(result.added) == sorted(urls) and sorted(result.duplicates) == sorted(urls[:2])


def test_cli_push_counts_batches_and_refuses_a_bad_url(plain_redis_url: str, crawl: str, tmp_path: Any) -> None:
    """`push --batch` counts a file batch by batch; a bad line stops it with its reason and the count before it."""
    path = tmp_path / "urls.txt"
    path.write_text("".join(f"http://f{i}.test/\n" for i in range(9)) + "\n# comment\nhttp://f0.test/\n")
    args = ["push", "--redis-url", plain_redis_url, "-c", crawl, "--batch", "4", "--file", str(path)]
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    assert "pushed 9 request(s)" in out.output and "1 duplicate(s)" in out.output
    path.write_text("".join(f"http://h{i}.test/\n" for i in range(9)) + "h9.test/no-scheme\n")
    out = CliRunner().invoke(main, args)
    assert out.exit_code != 0
    assert "Missing scheme in request url: h9.test/no-scheme" in out.output and "pushed 8 request(s) before it" in out.output
