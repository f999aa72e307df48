"""Redis Sentinel: the redis+sentinel:// URL form (parsed, checked, masked), and clients,
the CLI, the seeding API and the daemons that follow a failover without a restart.

The tests with processes run a ``LocalSentinel`` (tests/redis_tools.py): a master, one
replica and three sentinels that fail over 1 s after the master stops answering.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streams_sched.config import StreamsConfig
from streams_sched.errors import ConfigError
from streams_sched.urls import parse_sentinel_url, redact, validate_redis_url

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
