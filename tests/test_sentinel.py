"""Redis Sentinel: the redis+sentinel:// URL form (parsed, checked, masked), and clients,
the CLI, the seeding API and the daemons that follow a failover without a restart.

The tests with processes run a ``LocalSentinel`` (tests/redis_tools.py): a master, one
replica and three sentinels that fail over 1 s after the master stops answering.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import redis
from redis_tools import LocalSentinel

from streams_sched import acl
from streams_sched.config import StreamsConfig
from streams_sched.connection import TRANSIENT, SentinelMaster, connect, connect_ready, is_cluster_url
from streams_sched.errors import ConfigError, RedisUnavailable
from streams_sched.testing import free_port, redis_server_binary
from streams_sched.urls import parse_sentinel_url, redact, validate_redis_url

from helpers import missing

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
        ("redis://s1:26379,s2:26379/0", "several hosts: a list of sentinels takes a redis+sentinel:// URL"),
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


def _need_redis_server() -> None:
    if not redis_server_binary():
        missing("redis-server is not installed (redis-server --sentinel runs the sentinels)")


def test_local_sentinel_cleans_up_its_processes_and_files() -> None:
    """The fixture stops every process it started and removes its directory."""
    _need_redis_server()
    sentinel = LocalSentinel(replicas=1).start()
    procs = [n.proc for n in [*sentinel.nodes, *sentinel.sentinels]]
    where = sentinel.dir
    assert os.path.isdir(where) and len(procs) == 5 and all(p is not None and p.poll() is None for p in procs)
    sentinel.cleanup()
    assert not os.path.exists(where) and all(p is not None and p.poll() is not None for p in procs)
