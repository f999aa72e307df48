"""Redis Sentinel: the redis+sentinel:// URL form (parsed, checked, masked), and clients,
the CLI, the seeding API and the daemons that follow a failover without a restart.

The tests with processes run a ``LocalSentinel`` (tests/redis_tools.py): a master, one
replica and three sentinels that fail over 1 s after the master stops answering.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from redis_tools import LocalSentinel, make_tls_files

from streams_sched import Seeder
from streams_sched.admin import acl
from streams_sched.cli import main
from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import TRANSIENT, connect, connect_ready, is_cluster_url
from streams_sched.connect.sentinel import SentinelMaster
from streams_sched.connect.urls import parse_sentinel_url, redact, validate_redis_url
from streams_sched.errors import ConfigError, RedisUnavailable
from streams_sched.frontier.keys import health_key
from streams_sched.testing import free_port, redis_server_binary

from daemons import Daemon, try_scrape, value
from helpers import missing, wait_for

THREE = "redis+sentinel://s1:26379,s2:26380,s3/mymaster/2"


# -- the URL form (no Redis) ---------------------------------------------------------


def test_sentinel_url_gives_sentinels_service_db_and_both_credentials() -> None:
    """A Sentinel URL yields every sentinel (26379 when the port is left out, IPv6 in
    brackets), the service, the db, the master's user and password (URL-decoded) and the
    sentinels' own from the query; the other options stay for the master's connections."""
    url = "redis+sentinel://worker:p%40ss%2Fword@s1:26380,s2,[::1]:26381/my%20master/3?sentinel_password=s3cret&sentinel_username=sen&socket_timeout=2"
    parsed = parse_sentinel_url(url)
    assert parsed.sentinels == (("s1", 26380), ("s2", 26379), ("::1", 26381))
    assert (parsed.service, parsed.db, parsed.tls) == ("my master", 3, False)
    assert (parsed.username, parsed.password) == ("worker", "p@ss/word")
    assert (parsed.sentinel_username, parsed.sentinel_password) == ("sen", "s3cret")
    assert parsed.options == (("socket_timeout", "2"),)
    assert parse_sentinel_url("redis+sentinel://s1/m").db == 0
    assert parse_sentinel_url("redis+sentinel://s1/m/1?db=4").db == 4  # ?db= wins, as in redis://
    assert parse_sentinel_url("redis+sentinel://:pw@s1/m").password == "pw"


def test_rediss_sentinel_is_tls_with_the_ssl_options_of_rediss(tmp_path: Path) -> None:
    """rediss+sentinel:// means TLS and takes the ssl_* options a rediss:// URL takes;
    redis+sentinel:// refuses them."""
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    parsed = parse_sentinel_url(f"rediss+sentinel://s1/m?ssl_ca_certs={ca}&ssl_check_hostname=false")
    assert parsed.tls and dict(parsed.options) == {"ssl_ca_certs": str(ca), "ssl_check_hostname": "false"}
    with pytest.raises(ConfigError, match=r"TLS options need a rediss\+sentinel:// URL"):
        validate_redis_url(f"redis+sentinel://s1/m?ssl_ca_certs={ca}")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis+sentinel://s1:26379", "no service name: the path names the master the sentinels monitor"),
        ("redis+sentinel://s1:26379/", "no service name"),
        ("redis+sentinel://s1:26379,s2:2637x,s3/m", "sentinel 's2:2637x': the port '2637x' is not a port number"),
        ("redis+sentinel://s1:70000/m", "sentinel 's1:70000': the port '70000' is not a port number"),
        ("redis+sentinel://s1,s2:0/m", "sentinel 's2:0': the port '0'"),
        ("redis+sentinel://s1,,s2/m", "a sentinel without a host"),
        ("redis+sentinel://::1:26379/m", "write an IPv6 address in brackets"),
        ("redis+sentinel://s1/m/zero", "database 'zero' is not a number (the path is /service[/db])"),
        ("redis+sentinel://s1/m?sentinel_pasword=x", "unknown option(s) ['sentinel_pasword']"),
        ("redis+sentinel://s1/m?cluster=1", "Redis Sentinel and Redis Cluster are two different set-ups"),
        ("rediss+sentinel://s1/m?ssl_ca_certs=/nonexistent/ca.pem", "ssl_ca_certs: no such file"),
        ("redis://s1:26379,s2:26379/0", "several hosts: nodes of a Redis Cluster take ?cluster=1"),
        ("redis://s1:6379/0?sentinel_password=x", "sentinel_* options take a redis+sentinel:// URL"),
    ],
)
def test_bad_sentinel_url_is_refused_naming_setting_and_fix(url: str, message: str) -> None:
    """Each Sentinel URL mistake fails when the settings are read, with the setting, the URL and what is wrong."""
    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_settings({"REDIS_URL": url}, "spider")
    text = str(info.value)
    assert text.startswith(f"REDIS_URL={redact(url)!r}: ") and message in text, text


def test_daemon_settings_name_their_option_for_a_bad_sentinel_url() -> None:
    """The daemons check the Sentinel form as they check the others, naming --redis-url."""
    from monitor.settings import MonitorSettings
    from reclaimer.settings import ReclaimerSettings

    for settings in (ReclaimerSettings, MonitorSettings):
        with pytest.raises(ConfigError, match=r"^--redis-url=.*no service name"):
            settings(redis_url="redis+sentinel://s1:26379")


def test_redis_cluster_variable_is_refused_with_a_sentinel_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """REDIS_CLUSTER=1 in the environment and a Sentinel URL contradict each other: refused, not guessed."""
    assert not is_cluster_url(THREE)
    monkeypatch.setenv("REDIS_CLUSTER", "1")
    assert not is_cluster_url(THREE)
    with pytest.raises(ConfigError, match="REDIS_CLUSTER is set in the environment, but a Sentinel URL is not a Redis Cluster"):
        validate_redis_url(THREE)


def test_redact_masks_the_password_and_the_sentinel_password() -> None:
    """redact masks user:password@ and the sentinel_password and ssl_password values, and nothing else."""
    url = "rediss+sentinel://w:s3cret@s1:26379,s2/m/0?sentinel_password=t0p&ssl_password=k3y&socket_timeout=2"
    shown = redact(url)
    assert shown == "rediss+sentinel://w:***@s1:26379,s2/m/0?sentinel_password=***&ssl_password=***&socket_timeout=2"
    assert redact("redis+sentinel://:p@ss/word@s1/m") == "redis+sentinel://:***@s1/m"  # unencoded @ and / too
    assert redact("redis://worker:s3cret@localhost:6379/0") == "redis://worker:***@localhost:6379/0"
    assert redact(THREE) == THREE
    with pytest.raises(ConfigError) as info:
        validate_redis_url("redis+sentinel://w:s3cret@s1:bad/m?sentinel_password=t0p")
    assert "s3cret" not in str(info.value) and "t0p" not in str(info.value) and "w:***@s1:bad" in str(info.value)


def test_connect_builds_a_master_client_with_the_usual_options(tmp_path: Path) -> None:
    """connect() on a Sentinel URL builds, without talking to Redis, a client of the
    service's master with connect()'s timeouts, decoding and no retries of its own (URL
    options win), and sentinel clients with the sentinels' password and TLS."""
    client = connect(THREE + "?sentinel_password=t0p&socket_timeout=2", socket_timeout=7, connect_timeout=3, decode_responses=True)
    pool = client.connection_pool
    assert isinstance(client, SentinelMaster) and isinstance(pool, redis.sentinel.SentinelConnectionPool)
    assert pool.service_name == "mymaster" and pool.is_master
    kwargs = pool.connection_kwargs
    assert (kwargs["socket_timeout"], kwargs["socket_connect_timeout"], kwargs["db"]) == (2.0, 3, 2)
    assert kwargs["decode_responses"] is True and kwargs["retry"].get_retries() == 0
    assert pool.connection_class is redis.sentinel.SentinelManagedConnection
    sentinels = pool.sentinel_manager.sentinels
    assert [(s.connection_pool.connection_kwargs["host"], s.connection_pool.connection_kwargs["port"]) for s in sentinels] == [
        ("s1", 26379), ("s2", 26380), ("s3", 26379)]
    first = sentinels[0].connection_pool.connection_kwargs
    assert first["password"] == "t0p" and first["socket_timeout"] == 2.0 and first["retry"].get_retries() == 0
    client.close()
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    tls = connect(f"rediss+sentinel://:pw@s1/m?ssl_ca_certs={ca}").connection_pool
    assert tls.connection_class is redis.sentinel.SentinelManagedSSLConnection
    assert tls.connection_kwargs["ssl_ca_certs"] == str(ca) and tls.connection_kwargs["password"] == "pw"
    assert tls.sentinel_manager.sentinels[0].connection_pool.connection_kwargs["ssl_ca_certs"] == str(ca)
    with pytest.raises(ConfigError, match=r"socket_timeout='soon' is not a valid value"):
        connect(THREE + "?socket_timeout=soon")


def test_no_master_is_transient_and_one_clear_line() -> None:
    """MasterNotFoundError is in TRANSIENT (the worker's I/O thread and the daemons retry it),
    and sentinels that never answer end connect_ready with one line naming each of them."""
    assert redis.sentinel.MasterNotFoundError in TRANSIENT and redis.sentinel.SlaveNotFoundError in TRANSIENT
    a, b = free_port(), free_port()
    started = time.monotonic()
    with pytest.raises(RedisUnavailable) as info:
        connect_ready(f"redis+sentinel://127.0.0.1:{a},127.0.0.1:{b}/mymaster", 0.5, quiet=True)
    text = str(info.value)
    assert time.monotonic() - started < 10
    assert "\n" not in text and "did not answer within 0.5s" in text, text
    assert f"sentinel 127.0.0.1:{a}:" in text and f"sentinel 127.0.0.1:{b}:" in text and "Connection refused" in text
    assert "check the sentinels and the service name in REDIS_URL" in text


def test_acl_rules_for_a_sentinel_client_allow_role() -> None:
    """A Sentinel client checks ROLE on each new connection, so the rules for one include +role."""
    for role in acl.ROLES:
        assert "+role" in acl.rules(role, "c", sentinel=True) and "+role" not in acl.rules(role, "c")
    assert acl.setuser_line("monitor", sentinel=True).endswith("+role")


# -- with processes ----------------------------------------------------------------------


def _need_redis_server() -> None:
    if not redis_server_binary():
        missing("redis-server is not installed (redis-server --sentinel runs the sentinels)")


@pytest.fixture(scope="module")
def shared() -> Iterator[LocalSentinel]:
    """One Sentinel set-up for the tests that do not fail it over."""
    _need_redis_server()
    with LocalSentinel() as sentinel:
        yield sentinel


@pytest.fixture
def sentinel(shared: LocalSentinel) -> LocalSentinel:
    """The shared set-up, flushed."""
    client = shared.node_client(shared.master())
    client.flushall()
    client.script_flush()
    client.close()
    return shared


@pytest.fixture
def fresh() -> Iterator[LocalSentinel]:
    """A Sentinel set-up of its own, for a test that fails it over."""
    _need_redis_server()
    with LocalSentinel() as sentinel:
        yield sentinel


def retrying(action: Callable[[], Any], timeout: float = 60.0) -> tuple[Any, int]:
    """``action()`` retried on the transient errors that callers retry; (result, errors seen)."""
    deadline = time.monotonic() + timeout
    errors = 0
    while True:
        try:
            return action(), errors
        except TRANSIENT:
            errors += 1
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.mark.e2e
def test_same_client_writes_to_the_new_master_after_a_failover(fresh: LocalSentinel, measured: Any) -> None:
    """A client from connect() writes, its master is SIGKILLed, and after the transient
    errors its callers retry, the same client object writes to the promoted replica."""
    client = connect(fresh.url, socket_timeout=2, connect_timeout=1, decode_responses=True)
    client.set("before", "1")
    assert client.wait(1, 5000) == 1  # replicated: it survives the failover
    old = fresh.kill_master()
    killed = time.monotonic()
    _, errors = retrying(lambda: client.set("after", "2"))
    followed_s = time.monotonic() - killed
    new_port = fresh.wait_failover(old.port)
    measured(f"the client wrote to the new master {followed_s:.2f}s after the master was SIGKILLed"
             f" (down-after {fresh.down_after_ms} ms; {errors} transient errors retried)")
    assert errors > 0 and new_port != old.port
    assert client.connection_pool.master_address == ("127.0.0.1", new_port)
    direct = fresh.node_client(fresh.node_on(new_port))
    assert direct.get("before") == "1" and direct.get("after") == "2"
    assert client.get("before") == "1"
    client.close()


@pytest.mark.slow
@pytest.mark.e2e
def test_restarted_old_master_takes_no_writes(fresh: LocalSentinel, measured: Any) -> None:
    """After a failover the old master comes back empty and says it is a master until the
    sentinels demote it: every write of a client that keeps writing meanwhile lands on the
    new master, and the old one ends as its replica."""
    client = connect(fresh.url, socket_timeout=2, connect_timeout=1, decode_responses=True)
    client.set("k0", "0")
    old = fresh.kill_master()
    new_port = fresh.wait_failover(old.port)
    retrying(lambda: client.set("k0", "0"))
    # The first failover needs a short down-after; once it is done, a loaded machine's stall
    # of the new master past that second is a failover to the restarted, empty old master,
    # which is not what this test is about (a CI run saw exactly that).
    for s in fresh.sentinels:
        fresh.sentinel_client(s).execute_command("SENTINEL", "SET", fresh.service, "down-after-milliseconds", "10000")
    fresh.restart(old)
    restarted = time.monotonic()
    roles = {fresh.role(old)}
    written = 0
    # Usually about 10 s (a sentinel's INFO period, then its check that the node has said
    # "master" for a while). The deadline is wider: a sentinel whose loop stalls on a loaded
    # machine enters TILT mode and takes no action for 30 s at a time.
    deadline = restarted + 150
    while fresh.role(old) != "slave":
        assert time.monotonic() < deadline, (
            f"the sentinels never demoted the restarted old master (port {old.port}; it answered ROLE with {roles}):\n"
            + "\n".join(line for s in fresh.sentinels for line in s.log().splitlines() if any(w in line.lower() for w in ("tilt", "convert", "sdown", "odown", "switch-master")))
            + "\nits log:\n" + "\n".join(old.log().splitlines()[-15:])
        )
        retrying(partial(client.set, f"k{written}", str(written)))
        written += 1
        roles.add(fresh.role(old))
    demoted_s = time.monotonic() - restarted
    measured(f"the restarted old master was demoted {demoted_s:.1f}s after it came back; {written} writes meanwhile")
    assert "master" in roles  # it did come back as an (empty) master: the window was real
    assert client.connection_pool.master_address == ("127.0.0.1", new_port)
    direct = fresh.node_client(fresh.node_on(new_port))
    assert [direct.get(f"k{i}") for i in range(written)] == [str(i) for i in range(written)]
    fresh.wait_replicas(1)
    replica = fresh.node_client(old)
    wait_for(lambda: replica.get(f"k{written - 1}") == str(written - 1), timeout=30, what="the old master to replicate")
    with pytest.raises(redis.ReadOnlyError):
        replica.set("x", "1")
    client.close()


@pytest.mark.e2e
def test_a_demoted_server_a_sentinel_still_names_is_refused(sentinel: LocalSentinel) -> None:
    """A sentinel that names a replica as the master (its view lags a failover) gets a
    ConnectionError from the ROLE check, not a client on a replica; the next connection
    asks again."""
    client = connect(sentinel.url, socket_timeout=2, connect_timeout=1)
    manager = client.connection_pool.sentinel_manager
    (replica,) = sentinel.replicas()
    real = manager.discover_master
    manager.discover_master = lambda service: ("127.0.0.1", replica.port)
    with pytest.raises(redis.ConnectionError, match=rf"127.0.0.1:{replica.port} is a slave, not the master of 'mymaster'"):
        client.get("k")
    manager.discover_master = real
    assert client.set("k", "v") and client.get("k") == b"v"
    client.close()


@pytest.mark.e2e
def test_acl_user_of_a_role_works_through_the_sentinels(sentinel: LocalSentinel) -> None:
    """setuser() through a Sentinel client adds +role to the role's rules, and its user
    connects; a user without it is told, at once, which right it lacks."""
    admin = connect(sentinel.url)
    acl.setuser(admin, "mon", "pw1", "monitor")
    admin.execute_command("ACL", "SETUSER", "norole", "reset", "on", ">pw2", "~*", "+@read", "+ping")
    ok = connect_ready(sentinel.url.replace("redis+sentinel://", "redis+sentinel://mon:pw1@"), 10)
    assert ok.ping()
    with pytest.raises(RedisUnavailable, match=r"may not run a command it needs \(.*'role'.*\)"):
        connect_ready(sentinel.url.replace("redis+sentinel://", "redis+sentinel://norole:pw2@"), 10)
    for user in ("mon", "norole"):
        acl.deluser(admin, user)
    ok.close()
    admin.close()


@pytest.mark.e2e
def test_wrong_service_name_says_what_the_sentinels_monitor(sentinel: LocalSentinel) -> None:
    """A service name the sentinels do not monitor ends the wait with a line saying what they do monitor."""
    with pytest.raises(RedisUnavailable) as info:
        connect_ready(sentinel.url.replace("/mymaster/", "/mymastr/"), 0.5, quiet=True)
    assert "monitors no 'mymastr' (it monitors ['mymaster'])" in str(info.value)


@pytest.mark.e2e
def test_cli_and_seeder_work_against_the_sentinel_url(sentinel: LocalSentinel, crawl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """streams-sched push, status and crawls and the Seeder API take a Sentinel URL like any other."""
    monkeypatch.setenv("REDIS_URL", sentinel.url)
    runner = CliRunner()
    pushed = runner.invoke(main, ["push", "-c", crawl, "http://a.test/1", "http://a.test/2"], catch_exceptions=False)
    assert pushed.exit_code == 0, pushed.output
    with Seeder(sentinel.url, crawl) as seeder:
        result = seeder.seed(["http://a.test/2", "http://b.test/1"])
    assert result.added == ["http://b.test/1"] and result.duplicates == ["http://a.test/2"]
    status = runner.invoke(main, ["status", "-c", crawl, "--json"], catch_exceptions=False)
    assert status.exit_code == 0, status.output
    assert json.loads(status.output)["totals"]["backlog"] == 3
    crawls = runner.invoke(main, ["crawls"], catch_exceptions=False)
    assert crawl in crawls.output


@pytest.mark.e2e
def test_worker_crawls_with_a_sentinel_redis_url(sentinel: LocalSentinel, crawl: str, tmp_path: Path) -> None:
    """A Scrapy worker whose REDIS_URL is a Sentinel URL starts (rights check, scripts,
    dedupe probe) and crawls a small synthetic web to the end."""
    from helpers import Worker, base_settings, crawled_urls

    items = tmp_path / "items.jsonl"
    settings = base_settings(sentinel.url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=8, SYNTH_SEED=True)
    worker = Worker(settings, tmp_path / "w.log")
    try:
        assert worker.wait(120) == 0, worker.log()
        assert len(crawled_urls(items)) == 8
        assert "redis+sentinel://127.0.0.1:" in worker.log()  # the opened line names the URL
    finally:
        worker.close()


@pytest.mark.e2e
def test_tls_sentinels_with_passwords(tmp_path: Path) -> None:
    """rediss+sentinel:// with the master's password and sentinel_password reaches the
    master over TLS; a wrong sentinel_password and a missing CA fail at once, saying so."""
    _need_redis_server()
    tls = make_tls_files(str(tmp_path / "tls"))
    with LocalSentinel(tls=tls, password="m-pw", sentinel_password="s-pw") as sentinel:
        assert sentinel.url.startswith("rediss+sentinel://:m-pw@") and "sentinel_password=s-pw" in sentinel.url
        client = connect_ready(sentinel.url, 10)
        assert client.set("k", "v") and client.get("k") == b"v"
        assert client.connection_pool.connection_class is redis.sentinel.SentinelManagedSSLConnection
        client.close()
        started = time.monotonic()
        with pytest.raises(RedisUnavailable) as info:
            connect_ready(sentinel.url.replace("sentinel_password=s-pw", "sentinel_password=nope"), 30)
        assert "refused the credentials" in str(info.value) and "check sentinel_username and sentinel_password in the URL" in str(info.value)
        assert "nope" not in str(info.value) and "s-pw" not in str(info.value)
        no_ca = sentinel.url.split("&ssl_ca_certs=")[0]
        with pytest.raises(RedisUnavailable, match="TLS certificate verification failed"):
            connect_ready(no_ca, 30)
        assert time.monotonic() - started < 20  # neither waited for its 30 s


@pytest.mark.e2e
def test_daemons_keep_working_across_a_failover(fresh: LocalSentinel, crawl: str, tmp_path: Path, measured: Any) -> None:
    """The monitor and the reclaimer run against the Sentinel URL; the master is SIGKILLed,
    and without a restart the monitor's /metrics reports the crawl's new figures from the
    new master and the reclaimer keeps its health key fresh there."""
    mport = free_port()
    env = {"REDIS_URL": fresh.url}
    mon = Daemon("monitor", ["--metrics-port", str(mport), "--cache-seconds", "0", "--interval", "0.5"], tmp_path / "m.log", env)
    rec = Daemon("reclaimer", ["--interval", "0.5", "--name", "r1"], tmp_path / "r.log", env)
    seeder = Seeder(fresh.url, crawl, connect_timeout_s=10, min_replicas=0)  # left with no replica: do not wait
    try:
        seeder.seed([f"http://a.test/{i}" for i in range(5)])

        def backlog(n: int) -> Callable[[], bool]:
            def check() -> bool:
                m = try_scrape(mport)
                return m is not None and value(m, "streams_sched_redis_up") == 1 and sum(
                    v for k, v in m.get("streams_sched_backlog", {}).items() if dict(k).get("crawl") == crawl) == n
            return check

        wait_for(backlog(5), timeout=60, what=f"the monitor to report 5 queued; log:\n{mon.log()}")
        wait_for(lambda: fresh.node_client(fresh.master()).get(health_key("reclaimer", "r1")), timeout=60,
                 what=f"the reclaimer's health key; log:\n{rec.log()}")
        old = fresh.kill_master()
        killed = time.time()
        new_port = fresh.wait_failover(old.port)
        failed_over_s = time.time() - killed
        retrying(lambda: seeder.seed([f"http://a.test/{i}" for i in range(5, 8)]))
        wait_for(backlog(8), timeout=60, what=f"the monitor to report 8 queued after the failover; log:\n{mon.log()}")
        monitor_s = time.time() - killed
        new_master = fresh.node_client(fresh.node_on(new_port))

        def fresh_health() -> bool:
            raw = new_master.get(health_key("reclaimer", "r1"))
            return raw is not None and json.loads(raw)["ts"] > killed + failed_over_s

        wait_for(fresh_health, timeout=60, what=f"a reclaimer pass recorded on the new master; log:\n{rec.log()}")
        reclaimer_s = time.time() - killed
        measured(f"sentinels agreed on the new master {failed_over_s:.1f}s after the SIGKILL; the monitor reported"
                 f" from it after {monitor_s:.1f}s, the reclaimer after {reclaimer_s:.1f}s")
        assert mon.proc.poll() is None and rec.proc.poll() is None  # the same processes
        assert mon.named("redis_reachable_again") or rec.named("redis_reachable_again")
    finally:
        seeder.close()
        mon.close()
        rec.close()


@pytest.mark.e2e
def test_local_sentinel_cleans_up_its_processes_and_files() -> None:
    """The fixture stops every process it started and removes its directory."""
    _need_redis_server()
    sentinel = LocalSentinel(replicas=1).start()
    procs = [n.proc for n in [*sentinel.nodes, *sentinel.sentinels]]
    where = sentinel.dir
    assert os.path.isdir(where) and len(procs) == 5 and all(p is not None and p.poll() is None for p in procs)
    sentinel.cleanup()
    assert not os.path.exists(where) and all(p is not None and p.poll() is not None for p in procs)


@pytest.mark.e2e
def test_a_dump_loads_through_a_sentinel_url_and_dumps_back_the_same(
    sentinel: LocalSentinel, redis_source: Any, tmp_path: Path
) -> None:
    """A crawl dumped from a single Redis loads into the master behind the sentinels through its redis+sentinel:// URL, and a dump taken there has the same request lines."""
    from transfer_helpers import build_crawl, cli, comparable, dump_lines, fresh, write_dump

    source = fresh(redis_source.url("bitmap"))
    build_crawl(source, "moving")
    first = dump_lines(source, "moving")
    path = write_dump(tmp_path / "crawl.jsonl.gz", first)
    loaded = cli("load", "-c", "moved", str(path), url=sentinel.url)
    assert loaded.exit_code == 0, loaded.output
    again = cli("dump", "-c", "moved", "-o", str(tmp_path / "again.jsonl"), url=sentinel.url)
    assert again.exit_code == 0, again.output
    assert comparable((tmp_path / "again.jsonl").read_text().splitlines()) == comparable(first)
