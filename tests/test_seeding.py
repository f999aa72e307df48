"""The public seeding API (streams_sched.Seeder / seed) and the CLI push built on it."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from click.testing import CliRunner
from scrapy import Request, Spider
from scrapy.utils.request import RequestFingerprinter

from streams_sched import Seeder, seed
from streams_sched.cli import main
from streams_sched.codec import RequestCodec
from streams_sched.connection import connect
from streams_sched.frontier import Frontier, Outgoing, crawl_bloom
from streams_sched.keys import STREAMS
from streams_sched.legacy import LEGACY_FIELD, legacy_fingerprint
from streams_sched.policy import set_policy


class _Spider(Spider):
    name = "s"

    def parse_list(self, response: Any) -> None:
        pass

    def on_error(self, failure: Any) -> None:
        pass


def _entries(client: Any, crawl: str, site: str, task: str, band: str = "default") -> list[bytes]:
    """The payloads queued for a site's (task, band) stream: in the stream, or in the shard's
    inbox while the site is small (a flat msgpack list of stream code, payload, ...)."""
    k = Frontier(client, crawl).site(site)
    out = [fields[b"r"] for _, fields in client.xrange(k.stream(task, band))]
    packed = client.hget(k.index.inbox, site)
    if packed:
        flat = msgpack.unpackb(packed, raw=True)
        code = STREAMS.index((task, band)) + 1
        out += [flat[i + 1] for i in range(0, len(flat), 2) if int(flat[i]) == code]
    return out


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
    """A long-lived Seeder keeps seeding after the server lost its scripts (a new master
    after a failover, a restart, SCRIPT FLUSH): it loads them again and sends once more."""
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
    added, dups, _, _ = f.enqueue("a.test", [Outgoing(worker_fp, 1, 0, b"x")])
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
