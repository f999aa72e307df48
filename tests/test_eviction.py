"""Redis eviction and out-of-memory never lose a crawl silently: every component checks the
eviction policy at start, a worker at maxmemory says so once and loses nothing, and the
monitor exports evictions and memory. Real redis-server processes, real workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streams_sched.admin import acl
from streams_sched.cli import main as cli
from streams_sched.connect.clients import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.errors import EvictionPolicyError
from streams_sched.frontier.seeding import Seeder
from streams_sched.testing import RedisServer, free_port

from daemons import Daemon, try_scrape, value
from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    read_items,
    start_errors,
    wait_for,
    with_user,
)

ALLKEYS = ["--maxmemory-policy", "allkeys-lru"]


@pytest.fixture
def allkeys() -> Iterator[RedisServer]:
    """A Redis with maxmemory-policy allkeys-lru (no maxmemory: the policy alone is refused)."""
    with RedisServer(extra_args=ALLKEYS) as server:
        yield server


def refusal_of(line: str, policy: str = "allkeys-lru") -> bool:
    """True if ``line`` is the refusal: it names the policy, what it does and the fix."""
    return (
        f"has maxmemory-policy {policy}: it evicts any key, including queued requests" in line
        and "CONFIG SET maxmemory-policy noeviction" in line
        and "to run anyway" in line
    )


def keys_in(server: RedisServer) -> int:
    client = connect(server.url)
    try:
        return int(client.dbsize())
    finally:
        client.close()


# -- the worker -------------------------------------------------------------------------


@pytest.mark.e2e
def test_worker_refuses_an_allkeys_redis_at_start(allkeys: RedisServer, crawl: str, tmp_path: Path) -> None:
    """A worker on an allkeys-lru Redis exits 1 at start with one CRITICAL line naming the policy and noeviction, and crawls nothing."""
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(allkeys.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20), tmp_path / "w.log")
    try:
        assert w.wait(60) == 1, w.log()
        errors = start_errors(w.log())
        assert len(errors) == 1 and refusal_of(errors[0]), w.log()
        assert f"Redis at {allkeys.url}" in errors[0] and "or set STREAMS_ALLOW_EVICTION = True to run anyway" in errors[0]
    finally:
        w.close()
    assert read_items(items) == [] and keys_in(allkeys) == 0


@pytest.mark.e2e
def test_worker_with_allow_eviction_starts_and_warns(allkeys: RedisServer, crawl: str, tmp_path: Path) -> None:
    """With STREAMS_ALLOW_EVICTION=True the same worker crawls everything, after one warning that pages can be lost."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(allkeys.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20, STREAMS_ALLOW_EVICTION=True)
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w)
    log = w.log()
    warnings = [line for line in log.splitlines() if "WARNING" in line and "maxmemory-policy allkeys-lru" in line]
    assert len(warnings) == 1 and "can be lost silently" in warnings[0] and "as STREAMS_ALLOW_EVICTION (or its option) allows" in warnings[0]
    assert not start_errors(log)
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


@pytest.mark.e2e
def test_worker_on_volatile_lru_starts_with_the_warning(crawl: str, tmp_path: Path) -> None:
    """A volatile-lru Redis is accepted: one warning names our keys with a TTL, and the crawl completes."""
    items = tmp_path / "items.jsonl"
    with RedisServer(extra_args=["--maxmemory-policy", "volatile-lru"]) as server:
        w = Worker(base_settings(server.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20), tmp_path / "w.log")
        crawl_to_end(w)
    warnings = [line for line in w.log().splitlines() if "maxmemory-policy volatile-lru" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], w.log()
    assert ":window" in warnings[0] and "revisit buckets" in warnings[0] and "no page is lost" in warnings[0]
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


@pytest.mark.e2e
def test_noeviction_logs_nothing_about_the_policy(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """On the default policy (noeviction) a worker logs no line about maxmemory-policy."""
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(plain_redis_url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=10), tmp_path / "w.log")
    crawl_to_end(w)
    assert "maxmemory-policy" not in w.log()


# -- the daemons, the CLI and the Seeder ------------------------------------------------


@pytest.mark.e2e
@pytest.mark.parametrize("daemon", ["reclaimer", "monitor"])
def test_daemon_refuses_an_allkeys_redis_at_start(allkeys: RedisServer, daemon: str, tmp_path: Path) -> None:
    """Each daemon exits 1 at start with one error line naming the policy and the fix; --allow-eviction runs it, with a warning."""
    d = Daemon(daemon, ["--redis-url", allkeys.url, "--burst", "--metrics-port", "0"], tmp_path / "refused.log")
    try:
        assert d.wait(30) == 1, d.log()
        lines = [line for line in d.log().splitlines() if line.strip() and not line.startswith("{")]  # not the JSON log
        assert len(lines) == 1 and lines[0].startswith(f"streams-{daemon}: error: Redis at {allkeys.url}"), d.log()
        assert refusal_of(lines[0]) and "start it with --allow-eviction (or STREAMS_ALLOW_EVICTION=1" in lines[0]
    finally:
        d.close()
    d = Daemon(daemon, ["--redis-url", allkeys.url, "--burst", "--metrics-port", "0"], tmp_path / "allowed.log",
               env={"STREAMS_ALLOW_EVICTION": "1"})
    try:
        assert d.wait(30) == 0, d.log()
        warnings = d.named("eviction_policy")
        assert len(warnings) == 1 and warnings[0]["level"] == "warning" and "can be lost silently" in warnings[0]["warning"]
    finally:
        d.close()
    assert keys_in(allkeys) == 0


@pytest.mark.e2e
def test_cli_push_refuses_an_allkeys_redis(allkeys: RedisServer, crawl: str) -> None:
    """streams-sched push exits 1 with one error line and pushes nothing; with --allow-eviction it pushes, after a warning."""
    res = CliRunner().invoke(cli, ["push", "--redis-url", allkeys.url, "-c", crawl, "https://a.test/"])
    assert res.exit_code == 1, res.output
    assert res.output.startswith(f"error: Redis at {allkeys.url} has maxmemory-policy allkeys-lru") and refusal_of(res.output)
    assert "add --allow-eviction (or set STREAMS_ALLOW_EVICTION=1) to run anyway" in res.output and keys_in(allkeys) == 0
    res = CliRunner().invoke(cli, ["push", "--redis-url", allkeys.url, "-c", crawl, "--allow-eviction", "https://a.test/"])
    assert res.exit_code == 0, res.output
    assert "warning: Redis at" in res.output and "pushed 1 request(s)" in res.output


@pytest.mark.e2e
def test_seeder_refuses_an_allkeys_redis(allkeys: RedisServer, crawl: str, caplog: pytest.LogCaptureFixture,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeder raises EvictionPolicyError naming the policy and writes nothing; allow_eviction=True seeds, with a warning."""
    monkeypatch.delenv("STREAMS_ALLOW_EVICTION", raising=False)
    with pytest.raises(EvictionPolicyError) as caught:
        Seeder(allkeys.url, crawl)
    assert refusal_of(str(caught.value)) and "pass Seeder(..., allow_eviction=True)" in str(caught.value)
    assert caught.value.policy == "allkeys-lru" and keys_in(allkeys) == 0
    with caplog.at_level("WARNING", logger="streams_sched.connect.server_checks"), Seeder(allkeys.url, crawl, allow_eviction=True) as seeder:
        assert seeder.seed(["https://a.test/"]).added == ["https://a.test/"]
    assert [r.levelname for r in caplog.records if "allkeys-lru" in r.getMessage()] == ["WARNING"]


# -- where CONFIG (or INFO) is refused ----------------------------------------------------


@pytest.mark.e2e
def test_a_role_user_without_config_is_checked_through_info(allkeys: RedisServer, crawl: str, tmp_path: Path) -> None:
    """A worker whose ACL user has only the worker rules (no CONFIG) is refused on an allkeys Redis
    all the same, through INFO, and ACL LOG shows no denial."""
    admin = connect(allkeys.url)
    acl.setuser(admin, "worker", "w-secret", "worker", crawl)
    admin.execute_command("ACL LOG", "RESET")
    with pytest.raises(redis_errors().NoPermissionError):
        connect(with_user(allkeys.url, "worker", "w-secret")).config_get("maxmemory-policy")
    admin.execute_command("ACL LOG", "RESET")
    items = tmp_path / "items.jsonl"
    url = with_user(allkeys.url, "worker", "w-secret")
    w = Worker(base_settings(url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=10), tmp_path / "w.log")
    try:
        assert w.wait(60) == 1, w.log()
        errors = start_errors(w.log())
        assert len(errors) == 1 and refusal_of(errors[0]), w.log()
    finally:
        w.close()
    assert acl.denials(admin, "worker") == []
    assert read_items(items) == []


@pytest.mark.e2e
def test_config_renamed_away_still_checks_through_info(crawl: str) -> None:
    """With CONFIG renamed away (as managed Redis services do) the policy is still read and an allkeys Redis refused."""
    with RedisServer(extra_args=[*ALLKEYS, "--rename-command", "CONFIG", ""]) as server:
        with pytest.raises(redis_errors().ResponseError, match="unknown command"):
            connect(server.url).config_get("maxmemory-policy")
        with pytest.raises(EvictionPolicyError, match="maxmemory-policy allkeys-lru"):
            Seeder(server.url, crawl, allow_eviction=False)


@pytest.mark.e2e
def test_a_user_without_info_is_checked_through_config(allkeys: RedisServer, crawl: str) -> None:
    """Where INFO is refused the policy comes from CONFIG GET maxmemory-policy."""
    admin = connect(allkeys.url)
    admin.execute_command("ACL SETUSER", "noinfo", "reset", "on", ">pw", "~*", "&*", "+@all", "-info")
    with pytest.raises(EvictionPolicyError, match="maxmemory-policy allkeys-lru"):
        Seeder(with_user(allkeys.url, "noinfo", "pw"), crawl, allow_eviction=False)


@pytest.mark.e2e
def test_neither_info_nor_config_warns_and_goes_on(allkeys: RedisServer, crawl: str, caplog: pytest.LogCaptureFixture) -> None:
    """A user that may run neither INFO nor CONFIG gets one warning that the policy could not be read, and seeds."""
    admin = connect(allkeys.url)
    admin.execute_command("ACL SETUSER", "blind", "reset", "on", ">pw", "~*", "&*", "+@all", "-info", "-config")
    with caplog.at_level("WARNING", logger="streams_sched.connect.server_checks"), \
            Seeder(with_user(allkeys.url, "blind", "pw"), crawl, allow_eviction=False) as seeder:
        seeder.seed(["https://a.test/"])
    messages = [r.getMessage() for r in caplog.records if "could not read the maxmemory-policy" in r.getMessage()]
    assert len(messages) == 1 and "INFO:" in messages[0] and "CONFIG GET:" in messages[0]


def redis_errors() -> Any:
    import redis.exceptions

    return redis.exceptions


# -- out of memory ---------------------------------------------------------------------

OOM_LINE = "Redis refused the"


def oom_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "ERROR" in line and OOM_LINE in line and "OOM" in line]


@pytest.mark.e2e
def test_worker_at_maxmemory_says_so_once_and_loses_nothing(crawl: str, tmp_path: Path, measured: Any) -> None:
    """A noeviction Redis whose maxmemory is reached mid-crawl: the worker logs one ERROR naming
    maxmemory and the fixes, retries, and once maxmemory is raised crawls every page and exits 0."""
    sites, pages = 3, 200
    items = tmp_path / "items.jsonl"
    with RedisServer(extra_args=["--maxmemory-policy", "noeviction"]) as server:
        admin = connect(server.url)
        settings = base_settings(
            server.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=sites, SYNTH_PAGES=pages,
            SYNTH_DELAY_SECONDS=0.02, STREAMS_LEASE_SECONDS=60,
        )
        w = Worker(settings, tmp_path / "w.log")
        try:
            wait_for(lambda: len(read_items(items)) >= 100, timeout=90, what="100 pages")
            # the data outgrows maxmemory: set it just below what Redis uses now
            admin.config_set("maxmemory", max(1, int(admin.info("memory")["used_memory"]) - 64 * 1024))
            full_at = len(read_items(items))
            wait_for(lambda: oom_errors(w.log()), timeout=60, what="the OOM error line")
            stalled = len(read_items(items))
            wait_for(lambda: admin.info("errorstats").get("errorstat_OOM", {}).get("count", 0) >= 20, timeout=60,
                     what="twenty OOM refusals")
            admin.config_set("maxmemory", 0)
            raised_at = len(read_items(items))
            crawl_to_end(w)
        finally:
            w.close()
        refused = admin.info("errorstats").get("errorstat_OOM", {}).get("count", 0)
        admin.close()
    log = w.log()
    seen = crawled_urls(items)
    missing = SyntheticWeb(sites=sites, pages=pages).all_urls() - set(seen)
    measured(
        f"maxmemory reached at {full_at} pages, {stalled} when the ERROR came, {raised_at} when raised;"
        f" {refused} commands refused with OOM; crawled {len(seen)}/{sites * pages}, never crawled {len(missing)}"
    )
    errors = oom_errors(log)
    assert len(errors) == 1, errors
    assert "maxmemory" in errors[0] and "raise maxmemory" in errors[0] and "add a shard" in errors[0]
    assert "streams-sched purge" in errors[0]
    assert not missing, sorted(missing)[:10]


# -- Redis Cluster ------------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.targets("cluster")
def test_every_master_of_a_cluster_is_checked(redis_url: str, crawl: str) -> None:
    """On Redis Cluster one master with allkeys-lru is enough to refuse, and the refusal names that master."""
    client = connect(redis_url)
    masters = client.get_primaries()
    odd = masters[-1]
    client.config_set("maxmemory-policy", "allkeys-lru", target_nodes=odd)
    try:
        with pytest.raises(EvictionPolicyError) as caught:
            Seeder(redis_url, crawl, allow_eviction=False)
        assert caught.value.servers == (odd.name,) and f"master {odd.name})" in str(caught.value)
        assert "masters" not in str(caught.value)  # only that one is named as a master
    finally:
        client.config_set("maxmemory-policy", "noeviction", target_nodes=odd)


# -- the monitor's metrics ----------------------------------------------------------------


def redis_metric(metrics: dict[str, Any], name: str, server: str) -> float | None:
    return value(metrics, name, server=server)


@pytest.mark.e2e
def test_monitor_exports_used_memory_and_maxmemory(crawl: str, tmp_path: Path) -> None:
    """The monitor exports the server's used_memory, maxmemory and policy as INFO gives them."""
    with RedisServer(extra_args=["--maxmemory", "64mb"]) as server:
        name = f"127.0.0.1:{server.port}"
        port = free_port()
        d = Daemon("monitor", ["--redis-url", server.url, "--metrics-port", str(port), "--cache-seconds", "0"], tmp_path / "m.log")
        try:
            m = wait_for(lambda: try_scrape(port), timeout=20, what="the monitor's /metrics")
            used = connect(server.url).info("memory")["used_memory"]
            assert redis_metric(m, "streams_sched_redis_maxmemory_bytes", name) == 64 * 1024 * 1024
            assert 0.5 * used < redis_metric(m, "streams_sched_redis_used_memory_bytes", name) < 2 * used
            assert value(m, "streams_sched_redis_maxmemory_policy", server=name, policy="noeviction") == 1
            assert redis_metric(m, "streams_sched_redis_evicted_keys_total", name) == 0
            assert d.terminate() == 0
        finally:
            d.close()


@pytest.mark.e2e
@pytest.mark.slow
def test_policy_changed_to_allkeys_mid_crawl_shows_in_evicted_keys(crawl: str, tmp_path: Path, measured: Any) -> None:
    """A policy switched to allkeys-lru mid-crawl, and junk that pushes Redis past maxmemory: the monitor
    exports the evictions and the new policy, and alerts (redis_evicting) while the worker runs."""
    items = tmp_path / "items.jsonl"
    with RedisServer() as server:
        name = f"127.0.0.1:{server.port}"
        admin = connect(server.url)
        port = free_port()
        mon = Daemon("monitor", ["--redis-url", server.url, "--metrics-port", str(port), "--cache-seconds", "0",
                                 "--interval", "0.3"], tmp_path / "m.log")
        settings = base_settings(server.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=400,
                                 SYNTH_DELAY_SECONDS=0.05)
        w = Worker(settings, tmp_path / "w.log")
        try:
            wait_for(lambda: len(read_items(items)) >= 20, timeout=90, what="20 pages")
            m = wait_for(lambda: (got := try_scrape(port)) and value(got, "streams_sched_nodes", crawl=crawl, state="alive") == 1 and got,
                         timeout=20, what="the monitor to see the worker")
            assert redis_metric(m, "streams_sched_redis_evicted_keys_total", name) == 0
            # the alert pass (not only a scrape) must have seen the worker and taken its baseline
            # of evicted_keys before the junk: its first look at a server is a baseline, so
            # evictions made before it are not evictions "while a crawl runs"
            wait_for(lambda: any(p.get("nodes_alive", 0) >= 1 for p in mon.named("pass")), timeout=20,
                     what=f"an alert pass that saw the worker; log:\n{mon.log()}")
            admin.config_set("maxmemory-policy", "allkeys-lru")
            admin.config_set("maxmemory", int(admin.info("memory")["used_memory"]) + 2 * 1024 * 1024)
            junk = b"x" * 10_000
            for i in range(600):  # 6 MB of junk past a limit 2 MB away
                admin.set(f"junk:{i}", junk)
            evicted = int(admin.info("stats")["evicted_keys"])
            assert evicted > 0
            m = wait_for(
                lambda: (got := try_scrape(port)) and (redis_metric(got, "streams_sched_redis_evicted_keys_total", name) or 0) > 0 and got,
                timeout=20, what="the evictions in /metrics",
            )
            assert value(m, "streams_sched_redis_maxmemory_policy", server=name, policy="allkeys-lru") == 1
            assert redis_metric(m, "streams_sched_redis_evicted_keys_total", name) >= evicted
            wait_for(lambda: any(a["kind"] == "redis_evicting" and a["subject"] == name for a in mon.named("alert")),
                     timeout=20, what=f"the redis_evicting alert; log:\n{mon.log()}")
            registered = admin.sismember("ss:crawls", crawl)
            measured(f"{evicted} keys evicted after the switch to allkeys-lru, at {len(read_items(items))} pages;"
                     f" crawl registry entry {'kept' if registered else 'evicted'}")
        finally:
            w.close()
            mon.close()
            admin.close()
