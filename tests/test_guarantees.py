"""The README's Guarantees, Faults and Security claims that need a test of their own, each
checked as written, through a real Scrapy engine or a real `scrapy crawl` where it says so."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis_tools import make_tls_files

from streams_sched.admin import acl
from streams_sched.connect.clients import connect, connect_ready
from streams_sched.demo.web import SyntheticWeb
from streams_sched.errors import RedisUnavailable
from streams_sched.testing import RedisServer, TlsFiles

from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    frontier,
    missing,
    read_items,
    scrapy_crawl,
    scrapy_project,
    start_errors,
    subscribe_events,
    wait_for,
    wait_heartbeats,
    with_user,
)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scrapy_project(tmp_path_factory.mktemp("project"))


# -- TLS -----------------------------------------------------------------------


def start_tls_server(files: TlsFiles) -> RedisServer:
    """A started TLS-only redis-server (missing: skipped, or failed under CI)."""
    server = RedisServer(tls=files, tls_auth_clients="no")
    try:
        server.start()
    except RuntimeError as exc:
        missing(f"this redis-server has no TLS support (Debian's redis-server has it): {exc}")
    return server


@pytest.fixture(scope="module")
def tls_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, TlsFiles]]:
    """A TLS-only redis-server on 127.0.0.1 whose certificate (from a CA we trust) names
    another host only."""
    files = make_tls_files(str(tmp_path_factory.mktemp("tls-other-host")), server_names=("redis.elsewhere.test",))
    server = start_tls_server(files)
    try:
        yield server, files
    finally:
        server.cleanup()


@pytest.mark.e2e
def test_tls_host_name_is_verified(tls_elsewhere: tuple[RedisServer, TlsFiles]) -> None:
    """A certificate signed by the trusted CA but issued to another host name is refused at once."""
    server, files = tls_elsewhere
    url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={files.ca}"
    with pytest.raises(RedisUnavailable, match="TLS certificate verification failed") as info:
        connect_ready(url, 30)
    assert "not valid for '127.0.0.1'" in str(info.value)  # the name, not the chain, failed
    # the same server and CA with verification of the name turned off: the chain itself is fine
    assert connect_ready(url + "&ssl_check_hostname=false", 5).ping()


@pytest.mark.e2e
def test_scrapy_crawl_exits_1_on_an_untrusted_certificate(project: Path, tmp_path: Path) -> None:
    """`scrapy crawl` against a TLS server whose certificate does not verify exits 1 with one
    CRITICAL line, without waiting out STREAMS_CONNECT_TIMEOUT_SECONDS."""
    files = make_tls_files(str(tmp_path / "server-ca"))
    other = make_tls_files(str(tmp_path / "other-ca"))
    server = start_tls_server(files)
    try:
        url = f"rediss://127.0.0.1:{server.port}/0?ssl_ca_certs={other.ca}"
        done = scrapy_crawl(project, {"REDIS_URL": url, "STREAMS_CONNECT_TIMEOUT_SECONDS": 600}, timeout=120)
    finally:
        server.cleanup()
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    errors = start_errors(output)
    assert len(errors) == 1 and "TLS certificate verification failed" in errors[0], output[-3000:]
    assert "is not answering" not in output  # refused at once, not retried


# -- ACL -----------------------------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("right", ["evalsha", "xreadgroup", "xautoclaim", "publish", "multi"])
def test_missing_acl_right_fails_at_once_at_start(project: Path, right: str) -> None:
    """A worker whose ACL user lacks one command of its role (even one it would only use
    later, like XAUTOCLAIM) fails at start: exit 1, one CRITICAL line naming the command."""
    with RedisServer() as server:
        admin = connect(server.url)
        acl.setuser(admin, "worker", "w-secret", "worker", "synth")
        admin.execute_command("ACL SETUSER", "worker", f"-{right}")
        done = scrapy_crawl(
            project,
            {"REDIS_URL": with_user(server.url, "worker", "w-secret"), "STREAMS_PREFIX": "synth",
             "STREAMS_CONNECT_TIMEOUT_SECONDS": 600, "SYNTH_SEED": True, "SYNTH_SITES": 1, "SYNTH_PAGES": 5},
            timeout=60,
        )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output[-3000:]
    errors = start_errors(output)
    assert len(errors) == 1 and f"ACL user may not run {right} on crawl 'synth'" in errors[0], output[-3000:]
    assert "w-secret" not in output





# -- acks, through a real engine -------------------------------------------------


def _counts(url: str, crawl: str, site: str) -> tuple[int, int]:
    """(pending, acked) of one site, read from Redis."""
    st = frontier(url, crawl).status(site)
    return st.pending, int(st.stats.get("acked", 0))


@pytest.mark.e2e
def test_ack_comes_only_after_the_callback_and_the_item_pipelines(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Through a real engine: while the callback, and then an item pipeline, are still busy with
    a request, its lease stays pending in Redis (several I/O cycles later); the ack follows
    the pipeline."""
    gates = tmp_path / "gates"
    gates.mkdir()
    events = subscribe_events(plain_redis_url, crawl)
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl", SYNTH_SITES=1, GATE_DIR=str(gates),
        ITEM_PIPELINES={"spiders.GatedPipeline": 50, "streams_sched.demo.pipelines.RecordPipeline": 100},
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.GatedSpider")
    try:
        for gate in ("callback", "pipeline"):
            started = gates / f"{gate}-started"
            wait_for(started.exists, timeout=60, what=f"the {gate} to start")
            wait_heartbeats(events, 3, w)  # the I/O thread had every chance to ack
            assert _counts(plain_redis_url, crawl, "site0.test") == (1, 0), f"acked while the {gate} was busy"
            (gates / f"{gate}-go").touch()
        wait_for(lambda: _counts(plain_redis_url, crawl, "site0.test") == (0, 1), timeout=30, what="the ack")
        crawl_to_end(w)
    finally:
        w.close()
    assert [i["url"] for i in read_items(tmp_path / "items.jsonl")] == ["http://site0.test/p/0"]


@pytest.mark.e2e
def test_a_redirect_is_acked_only_after_its_new_request_is_in_redis(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Through a real engine: while the redirect target cannot be enqueued (its site's dedupe
    key is broken), the redirected request stays leased; once the target is in Redis, the
    redirect is acked and the target crawled."""
    from spiders import REDIRECT_SPECIAL

    client = connect(plain_redis_url)
    target_seen = frontier(plain_redis_url, crawl).site("site1.test").seen
    client.hset(target_seen, "x", "not a bloom filter")  # every enqueue to site1 fails
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl", SYNTH_SITES=2, SYNTH_SPECIAL=REDIRECT_SPECIAL,
    )
    refused = _refusals(client, "STREAMSDEDUPE")
    w = Worker(settings, tmp_path / "w.log", spider="spiders.RedirectSpider")
    try:
        wait_for(lambda: _refusals(client, "STREAMSDEDUPE") >= refused + 3, timeout=60, what="three failed enqueues of the target")
        assert _counts(plain_redis_url, crawl, "site0.test") == (1, 0), "acked before its follow-up was in Redis"
        assert w.log().count("Redis refused the enqueue to site site1.test") == 1  # logged once, not per try
        client.delete(target_seen)
        wait_for(lambda: _counts(plain_redis_url, crawl, "site0.test") == (0, 1), timeout=60, what="the redirect's ack")
        assert int(frontier(plain_redis_url, crawl).status("site1.test").stats.get("enqueued", 0)) == 1
        crawl_to_end(w)
    finally:
        w.close()
    assert set(crawled_urls(tmp_path / "items.jsonl")) == {"http://site1.test/landing"}


def _refusals(client: redis.Redis, code: str) -> int:
    """How many commands Redis refused with the error ``code`` (INFO errorstats, Redis 6.2+)."""
    return int(client.info("errorstats").get(f"errorstat_{code}", {}).get("count", 0))


# -- signals, request classes, what cannot travel ----------------------------------


@pytest.mark.e2e
def test_second_sigterm_stops_at_once_and_loses_nothing(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A second SIGTERM (Scrapy's forced stop) does not wait for downloads in progress: the
    worker exits and its leases stay in Redis, like a SIGKILL's; once they are taken over,
    another worker crawls every page."""
    from spiders import AnnounceMiddleware  # noqa: F401 (the worker loads it by path)

    announce = tmp_path / "announce.txt"
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20,
        CONCURRENT_REQUESTS=2, CONCURRENT_REQUESTS_PER_DOMAIN=2, STREAMS_LEASE_SECONDS=300,
    )
    stuck = Worker(
        {**settings, "SYNTH_DELAY_SECONDS": 600.0, "STREAMS_NODE_ID": "stuck",
         "STREAMS_SHUTDOWN_TIMEOUT_SECONDS": 600,  # a graceful stop would wait for the downloads
         "ANNOUNCE_FILE": str(announce), "DOWNLOADER_MIDDLEWARES": {"spiders.AnnounceMiddleware": 50}},
        tmp_path / "stuck.log",
    )
    f = frontier(plain_redis_url, crawl)
    try:
        wait_for(lambda: announce.exists() and len(announce.read_text().split()) >= 1, timeout=60, what="a download in progress")
        stuck.proc.send_signal(signal.SIGTERM)
        wait_for(lambda: "handed back" in stuck.log() or "Received SIGTERM" in stuck.log(), timeout=30, what="the first SIGTERM")
        stuck.proc.send_signal(signal.SIGTERM)
        stuck.wait(60)  # a graceful stop would take 600 s
    finally:
        stuck.close()
    held = f.status("site0.test").pending
    assert held >= 1  # the downloads in progress: neither acked nor dropped
    # their leases expire (a 300 s lease; expire them now, as the reclaimer would then)
    taken, dead, _ = f.claim("site0.test", "test-reclaimer", 0, 100, 100, mode="requeue")
    assert (taken, dead) == (held, 0)
    crawl_to_end(Worker({**settings, "SYNTH_SEED": False}, tmp_path / "next.log"))
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


@pytest.mark.e2e
def test_a_class_in_streams_request_classes_travels_end_to_end(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A Request subclass listed in STREAMS_REQUEST_CLASSES goes through Redis and comes back as
    that class: every page is crawled, every response's request is a TaggedRequest."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=20,
        STREAMS_REQUEST_CLASSES=["spiders.TaggedRequest"],
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.TaggedSpider")
    crawl_to_end(w)
    got = read_items(items)
    assert {i["url"] for i in got} == SyntheticWeb(sites=1, pages=20).all_urls()
    assert {i["class"] for i in got} == {"TaggedRequest"}
    assert "streams/unserializable" not in w.log()


@pytest.mark.e2e
def test_requests_that_cannot_travel_are_crawled_locally_and_named(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """By default, requests whose meta, cookies or cb_kwargs cannot travel are kept and crawled by
    their worker, not dropped: no request_dropped, one warning naming each field and key."""
    dropped = tmp_path / "dropped.jsonl"
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=20, DROPPED_FILE=str(dropped),
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.DroppedSpider")
    crawl_to_end(w)
    log = w.log_path.read_text(errors="replace")  # the whole log: the warnings come early
    b = "http://site0.test"
    signalled = [json.loads(line)["url"] for line in dropped.read_text().splitlines()] if dropped.exists() else []
    assert [u for u in signalled if "/obj-" in u] == []
    assert f"cannot enqueue <GET {b}/obj-meta>: meta['obj']" in log
    assert f"cannot enqueue <GET {b}/obj-cookie>: cookies['session']" in log
    assert f"cannot enqueue <GET {b}/obj-kwargs>: cb_kwargs['when']" in log
    assert "this worker keeps it in memory and crawls it itself" in log
    assert "'streams/unserializable_local': 3" in log
    for path in ("obj-meta", "obj-cookie", "obj-kwargs"):  # downloaded by this worker (a 404 or an error)
        assert any(f"{b}/{path}" in line and "cannot enqueue" not in line for line in log.splitlines()), path
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


@pytest.mark.e2e
def test_requests_that_cannot_travel_are_signalled_dropped_and_named_in_error_mode(
    plain_redis_url: str, crawl: str, tmp_path: Path
) -> None:
    """With STREAMS_UNSERIALIZABLE="error", such requests are refused with an error naming the field
    and key, Scrapy sends request_dropped for each, the crawl goes on, and it exits 1."""
    dropped = tmp_path / "dropped.jsonl"
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=20, DROPPED_FILE=str(dropped),
        STREAMS_UNSERIALIZABLE="error",
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.DroppedSpider")
    try:
        assert w.wait(120) == 1, w.log()
    finally:
        w.close()
    log = w.log()
    b = "http://site0.test"
    signalled = [json.loads(line)["url"] for line in dropped.read_text().splitlines()]
    assert sorted(u for u in signalled if "/obj-" in u) == [  # (duplicates are signalled too)
        f"{b}/obj-cookie", f"{b}/obj-kwargs", f"{b}/obj-meta",
    ]
    assert f"cannot enqueue <GET {b}/obj-meta>: meta['obj']" in log
    assert f"cannot enqueue <GET {b}/obj-cookie>: cookies['session']" in log
    assert f"cannot enqueue <GET {b}/obj-kwargs>: cb_kwargs['when']" in log
    assert "'streams/unserializable_refused': 3" in log
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


def test_the_rights_probe_covers_every_worker_command_and_runs_nothing(plain_redis_url: str, crawl: str) -> None:
    """Every command of the worker role has a probe, and probing as a user with all the
    rights reports nothing missing and leaves no key behind (the commands are only queued)."""
    from streams_sched.admin.rights import PROBES, missing_rights

    assert set(acl.role_commands("worker")) - {"multi", "discard"} <= set(PROBES)  # (the probe itself)
    admin = connect(plain_redis_url)
    acl.setuser(admin, "worker", "pw", "worker", crawl)
    try:
        assert missing_rights(connect(with_user(plain_redis_url, "worker", "pw")), crawl) == []
        assert admin.keys("*") == []
    finally:
        acl.deluser(admin, "worker")
